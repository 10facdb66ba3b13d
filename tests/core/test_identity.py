"""A model's identity comes from its weights: remembered fixes follow the tensors, not the file.

Two fine-tunes of one base saved in the same layout have byte-identical safetensors headers; a
key read from the header let the fix verified for one silently run on the other, which was then
reported healthy. Every model here is built in code and written into tmp_path.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest
import torch

from app.core import checkpoint, health
from app.core.checkpoint import read_safetensors_header
from app.core.fixing import profiles
from app.core.hardware import describe_device
from app.core.health.request import CheckRequest, CheckRun
from app.core.models import load_model
from app.core.settings import PrecisionSettings
from tests.support.model_files import save_single_file
from tests.support.tiny_models import build_tiny_sd_pipeline

VAE_LAYER = "decoder.up_blocks.0.resnets.0.conv1"
FP16 = PrecisionSettings(precision="fp16")


def overflowing_vae(scale: float):
    """The tiny SD1 pipeline with its VAE scaled past fp16's range: same layout whatever the
    scale, so every file written from it has the same header."""
    pipeline = build_tiny_sd_pipeline()
    with torch.no_grad():
        pipeline.vae.get_submodule(VAE_LAYER).weight.mul_(scale)
    return pipeline


def check(model):
    report = health.check_loaded(
        model, CheckRequest(precision=FP16, device="cpu", size=64), run=CheckRun(measure_cost=False)
    )
    return report.to_json()


def cpu_name() -> str:
    return describe_device("cpu").name


def old_header_key(path) -> str:
    """The key remembered fixes used before: sha256 of the header and the file size."""
    header = read_safetensors_header(path)
    return hashlib.sha256(header.raw + str(header.file_size).encode()).hexdigest()


@pytest.fixture
def twins(tmp_path):
    """Two single files of identical layout (same header, same size) and different weights,
    both with a VAE that overflows in fp16."""
    first = save_single_file(overflowing_vae(1e6), tmp_path / "first.safetensors")
    second = save_single_file(overflowing_vae(3e6), tmp_path / "second.safetensors")
    assert read_safetensors_header(first).raw == read_safetensors_header(second).raw
    assert first.stat().st_size == second.stat().st_size
    assert first.read_bytes() != second.read_bytes()
    return first, second


@pytest.fixture
def digests(monkeypatch):
    """Counts the tensors hashed into a content digest."""
    hashed: list[str] = []
    real = checkpoint.TensorDigest.add

    def counting(self, name, tensor):
        hashed.append(name)
        real(self, name, tensor)

    monkeypatch.setattr(checkpoint.TensorDigest, "add", counting)
    return hashed


def test_a_fix_remembered_for_one_model_is_not_applied_to_its_twin(twins):
    first, second = twins
    first_report = check(load_model(str(first)))
    assert first_report["verdict"] == "fixable"
    fix = first_report["fix"]  # the VAE wider, or only its overflowing layers
    assert fix["vae"] in ("fp32", "bf16") or fix["modules"].get("vae")
    first_key = load_model(str(first)).profile_key
    assert profiles.remembered_fix(first_key, cpu_name()) is not None

    model = load_model(str(second))
    assert model.profile_key != first_key
    assert profiles.remembered_fix(model.profile_key, cpu_name()) is None
    report = check(model)
    # Its own VAE ran in fp16 and overflowed: it is not reported healthy on the other's fix.
    assert report["tested"]["vae"] == "fp16"
    assert report["components"]["vae"]["status"] in ("overflow", "nan")
    assert report["verdict"] == "fixable"
    assert not any("remembered" in note for note in report["notes"])


def test_fixes_remembered_under_the_old_header_key_no_longer_match(twins):
    first, _ = twins
    profiles.remember_fix(
        old_header_key(first), cpu_name(), {"vae_precision": "fp32"}, "old key", "health check"
    )
    model = load_model(str(first))
    assert model.profile_key != old_header_key(first)
    assert profiles.remembered_fix(model.profile_key, cpu_name()) is None
    assert check(model)["tested"]["vae"] == "fp16"


def test_a_moved_or_touched_file_keeps_its_identity_and_its_fix(twins, tmp_path):
    first, _ = twins
    key = load_model(str(first)).profile_key
    profiles.remember_fix(key, cpu_name(), {"vae_precision": "fp32"}, "kept", "health check")
    moved = tmp_path / "library" / "renamed.safetensors"
    moved.parent.mkdir()
    shutil.move(first, moved)
    os.utime(moved, ns=(10**18, 10**18))
    again = load_model(str(moved))
    assert again.profile_key == key
    assert profiles.remembered_fix(again.profile_key, cpu_name()) is not None


def test_one_byte_of_one_used_tensor_changes_the_identity(tmp_path, digests):
    path = save_single_file(build_tiny_sd_pipeline(), tmp_path / "model.safetensors")
    key = load_model(str(path)).profile_key
    assert digests, "the first load hashes the weights"

    digests.clear()
    repeat = load_model(str(path))
    assert repeat.profile_key == key and digests == []  # cached under the unchanged stamp
    assert repeat.weights.tensors > 100  # the NaN/Inf scan still read every tensor

    header = read_safetensors_header(path)
    info = header.tensors["first_stage_model.decoder.conv_out.bias"]
    data = bytearray(path.read_bytes())
    data[header.data_start + info.start] ^= 0x01
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    changed = load_model(str(path))
    assert digests, "a changed file is hashed again"
    assert changed.profile_key != key


def test_a_separate_vae_is_part_of_the_identity(tmp_path):
    model = save_single_file(build_tiny_sd_pipeline(), tmp_path / "model.safetensors")
    vae_one = tmp_path / "vae-one"
    vae_two = tmp_path / "vae-two"
    build_tiny_sd_pipeline().vae.save_pretrained(vae_one)
    overflowing_vae(1e6).vae.save_pretrained(vae_two)

    alone = load_model(str(model)).profile_key
    with_one = load_model(str(model), vae=str(vae_one))
    with_two = load_model(str(model), vae=str(vae_two))
    assert len({alone, with_one.profile_key, with_two.profile_key}) == 3
    # The VAE override's own tensors are digested, not its file's name or place.
    renamed = tmp_path / "elsewhere-vae"
    shutil.copytree(vae_one, renamed)
    assert load_model(str(model), vae=str(renamed)).profile_key == with_one.profile_key
    # A separate VAE file in the original layout: its file name labels a bad tensor only.
    vae_file = save_single_file(overflowing_vae(1e6), tmp_path / "vae-two.safetensors")
    from_file = load_model(str(model), vae=str(vae_file))
    assert from_file.profile_key not in (alone, with_one.profile_key)


@pytest.mark.parametrize("layout", ["safetensors", "fp16 variant", "pickle"])
def test_diffusers_folders_of_one_layout_with_different_weights_differ(tmp_path, layout):
    def save(pipeline, folder):
        if layout == "fp16 variant":
            pipeline.to(torch.float16).save_pretrained(folder, variant="fp16")
        else:
            pipeline.save_pretrained(folder, safe_serialization=layout == "safetensors")
        return str(folder)

    allow_pickle = layout == "pickle"
    first = save(overflowing_vae(1e6), tmp_path / "first")
    second = save(overflowing_vae(3e6), tmp_path / "second")
    copy = shutil.copytree(first, tmp_path / "moved" / "copy-of-first")
    keys = [
        load_model(str(folder), allow_pickle=allow_pickle).profile_key
        for folder in (first, second, copy)
    ]
    assert keys[0] != keys[1]
    assert keys[0] == keys[2]


def test_a_fix_remembered_for_one_folder_is_not_applied_to_its_twin(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    overflowing_vae(1e6).save_pretrained(first)
    overflowing_vae(3e6).save_pretrained(second)
    assert check(load_model(str(first)))["verdict"] == "fixable"

    report = check(load_model(str(second)))
    assert report["tested"]["vae"] == "fp16"
    assert report["verdict"] == "fixable"


def test_the_demo_keeps_its_fixed_key():
    from app.core import demo

    model = load_model("demo")
    assert model.profile_key == f"demo-{demo.DEMO_VERSION}"


def test_another_models_bytes_under_the_old_size_and_mtime_are_a_new_identity(twins, tmp_path):
    """Copied over a file with its modification time restored (`touch -r`, `cp -p`), another
    model keeps the size and mtime that caches used to trust: the digest, the A1111 hash and
    the remembered fix must all follow the new bytes."""
    from app.core.explain import Record, find_model

    first, second = twins
    library = first.parent
    model_a = load_model(str(first))
    hash_a = checkpoint.model_hash(first)
    assert model_a.model_hash in (None, hash_a)
    profiles.remember_fix(
        model_a.profile_key, cpu_name(), {"vae_precision": "fp32"}, "A's fix", "health check"
    )
    # Explain finds A by its hash from the cache, as it would for one of its images.
    record = Record(model="renamed since", model_hash=hash_a)
    assert find_model(record, [str(library)]).path == str(first)

    before = first.stat()
    first.write_bytes(second.read_bytes())  # in place: same inode, same size
    os.utime(first, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = first.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )

    hash_b = hashlib.sha256(second.read_bytes()).hexdigest()[:10]
    assert hash_b != hash_a
    forged = load_model(str(first))
    assert forged.profile_key != model_a.profile_key
    assert forged.profile_key == load_model(str(second)).profile_key
    assert forged.model_hash == hash_b  # the PNG's "Model hash"
    assert checkpoint.model_hash(first) == hash_b
    assert profiles.remembered_fix(forged.profile_key, cpu_name()) is None
    report = check(forged)
    assert report["tested"]["vae"] == "fp16"
    assert not any("remembered" in note for note in report["notes"])
    # Explain no longer takes the file for A, whose hash neither file now has.
    assert find_model(record, [str(library)]).found is False
