"""The hostile-file corpus: files that would hang, exhaust memory or crash a naive loader.

Every case is a file built in code (tests/support/hostile_files.py). Each must end in one plain
sentence that names the file, in bounded time: in-process cases run on a watched thread, and the
riskiest run through the `halfsafe` command in a subprocess under a memory limit and a timeout,
which must exit 2 with one line on stderr and no traceback.
"""

from __future__ import annotations

import json
import os
import struct
import time
import warnings
from pathlib import Path

import pytest
import torch
from PIL import Image

from app.core import library, limits
from app.core.checkpoint import (
    Checkpoint,
    load_pickle_state_dict,
    read_safetensors_header,
    write_safetensors,
)
from app.core.errors import BadFileError
from app.core.library import LibraryEntry, scan_library
from app.core.models import load_model
from tests.support.checkpoint_files import shapes_file
from tests.support.cli_output import without_progress
from tests.support.hostile_files import (
    FIFO_NAMES,
    FOLDERS,
    SINGLE_FILES,
    TEXT,
    UNET,
    empty_tensor,
    hostile_folder,
    nested_json,
    odd_tensor_ckpt,
    pickle_named_safetensors,
    replace_with_fifo,
    self_referencing_ckpt,
    stride_zero_ckpt,
    tiny_folder,
    tiny_sd1_tensors,
    two_step_cycle_ckpt,
    write_single_file,
)
from tests.support.refusals import (
    SECONDS,
    assert_cannot_run,
    assert_sentence,
    bounded,
    refused,
    run_cli,
)

# Running the command under limits ----------------------------------------------------------


# Cases that, should a bound ever regress, would allocate gigabytes or loop: they run only in
# a subprocess under a memory limit, never in the test process on a shared machine.
RISKY_SINGLE_FILES = ("text encoder of 1e8 layers", "VAE of 1e6 layers per block")
RISKY_FOLDERS = (
    "layers_per_block 100000",
    "vocab_size 20M",
    "num_train_timesteps 2e8",
    "text encoder of 1e6 layers",
    "VAE block_out_channels 1e9",
)
RISKY_PICKLES = {
    "self-referencing state_dict": (self_referencing_ckpt, "loop"),
    "two-step state_dict cycle": (two_step_cycle_ckpt, "loop"),
    "1e6 x 1e6 stride-0 tensor": (stride_zero_ckpt, "1e+12 elements"),
}


# Single files whose names and shapes describe huge or impossible models --------------------


@pytest.mark.parametrize("case", sorted(set(SINGLE_FILES) - {*RISKY_SINGLE_FILES}))
def test_single_file_corpus_gets_one_sentence(tmp_path, case):
    path = write_single_file(tmp_path / "model.safetensors", case)
    error = refused(load_model, str(path))
    assert_sentence(error, path, SINGLE_FILES[case][1])


@pytest.mark.parametrize(
    ("key", "shape", "words"),
    [
        # Each stays under the per-tensor bounds, so the config bound must catch it.
        (TEXT + "embeddings.position_embedding.weight", (10_000_000, 0), "max_position_embeddings"),
        (UNET + "input_blocks.1.0.out_layers.3.weight", (10**6, 0, 3, 3), "block_out_channels"),
        (TEXT + "encoder.layers.0.mlp.fc1.weight", (10**7, 0), "intermediate_size"),
    ],
)
def test_sizes_named_by_empty_tensors_are_bounded_before_building(tmp_path, key, shape, words):
    tensors = tiny_sd1_tensors()
    tensors[key] = empty_tensor(*shape)
    path = write_safetensors(tmp_path / "model.safetensors", tensors)
    assert_sentence(refused(load_model, str(path)), path, words)


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ([0] * 9, "9 dimensions"),
        ([0, 2**40], "dimension larger"),
        ([2**17, 2**17, 2], "elements"),  # 3.4e10 elements, no dimension over 2**31
    ],
)
def test_tensor_shapes_beyond_any_model_are_refused_in_the_header(tmp_path, shape, words):
    from tests.support.checkpoint_files import raw_safetensors

    header = {"w": {"dtype": "F16", "shape": shape, "data_offsets": [0, 0]}}
    path = raw_safetensors(tmp_path / "model.safetensors", header)
    assert_sentence(refused(read_safetensors_header, path), path, words)


def test_real_tensor_shapes_pass_the_bounds():
    assert limits.check_tensor_shape([49408, 768]) is None  # CLIP's token embedding
    assert limits.check_tensor_shape([262_144, 3840]) is None  # Gemma 3's, the largest
    assert limits.check_tensor_shape([1280, 1280, 3, 3]) is None


# Pickle checkpoints (--allow-pickle) -------------------------------------------------------


def test_a_stride_zero_tensor_is_refused_before_any_scan(tmp_path, monkeypatch):
    from app.core.checkpoint import scan

    scanned = []  # the scan is faked: were the bound to regress, it must not run for hours
    monkeypatch.setattr(scan, "tensor_is_finite", lambda t: scanned.append(t.numel()) or 1)
    path = stride_zero_ckpt(tmp_path / "huge.ckpt")  # 1e12 elements in 4 bytes
    assert_sentence(refused(load_model, str(path), allow_pickle=True), path, "1e+12 elements")
    assert scanned == []


def test_a_view_claiming_more_elements_than_its_bytes_is_refused(tmp_path):
    path = tmp_path / "repeat.ckpt"
    # 1e8 elements (under the element bound) from one stored value.
    torch.save({"w": torch.zeros(1).expand(10_000, 10_000)}, str(path))
    error = refused(load_pickle_state_dict, path)
    assert_sentence(error, path, "stores only 4 bytes")


def test_many_names_for_one_storage_are_refused(tmp_path):
    path = tmp_path / "aliases.ckpt"
    storage = torch.zeros(1 << 18)  # 1 MiB
    torch.save({f"w{n}": storage[:] for n in range(64)}, str(path))
    assert_sentence(refused(load_pickle_state_dict, path), path, "over and over")
    tied = tmp_path / "tied.ckpt"
    torch.save({"embed": storage, "lm_head": storage}, str(tied))  # tied weights are fine
    assert set(load_pickle_state_dict(tied)) == {"embed", "lm_head"}


@pytest.mark.parametrize(
    ("kind", "words"),
    [("sparse", "sparse_coo tensor"), ("quantized", "quantized"), ("meta", "meta tensor")],
)
def test_sparse_quantized_and_meta_tensors_are_refused(tmp_path, kind, words):
    path = odd_tensor_ckpt(tmp_path / f"{kind}.ckpt", kind)
    assert_sentence(refused(load_model, str(path), allow_pickle=True), path, words)


def test_pytorch_warnings_about_a_pickle_stay_quiet(tmp_path):
    path = tmp_path / "protocol3.ckpt"  # any protocol but 2 makes PyTorch warn
    torch.save({"w": torch.ones(2)}, str(path), pickle_protocol=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert set(load_pickle_state_dict(path)) == {"w"}
    assert [str(w.message) for w in caught] == []


# Diffusers folders --------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(set(FOLDERS) - {*RISKY_FOLDERS}))
def test_folder_corpus_gets_one_sentence_naming_the_file(tmp_path, case):
    folder = hostile_folder(tmp_path / "pipeline", case)
    _change, file, words = FOLDERS[case]
    error = refused(load_model, str(folder))
    text = assert_sentence(error, folder, words)
    assert str(folder / file) in text or (file in text and str(folder) in text), text


def test_a_good_folder_still_loads_after_the_corpus(tmp_path):
    for case in ("sample_size 512", "nested unet config"):
        refused(load_model, str(hostile_folder(tmp_path / case.replace(" ", "-"), case)))
    model = load_model(str(tiny_folder(tmp_path / "good")))
    assert model.architecture == "sd1"


def test_deep_nesting_is_measured_without_recursion():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    assert limits.json_depth(deep) > limits.MAX_JSON_DEPTH
    with pytest.raises(ValueError, match="nested"):
        limits.parse_json(nested_json(100_000).encode())
    with pytest.raises(ValueError, match="nested"):
        limits.parse_json(nested_json(limits.MAX_JSON_DEPTH + 5).encode())
    assert limits.parse_json(b'{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}


# FIFOs and other files that are not regular files ----------------------------------------


def _unblock(fifo: Path) -> None:
    """Give a reader stuck on `fifo` its end of file (only a broken reader is stuck)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    os.close(fd)


needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")


@needs_fifo
@pytest.mark.parametrize("name", FIFO_NAMES)
def test_a_fifo_in_a_model_folder_never_blocks(tmp_path, name):
    folder = tiny_folder(tmp_path / "pipeline")
    fifo = replace_with_fifo(folder / name)
    try:
        error = refused(load_model, str(folder), seconds=SECONDS)
    finally:
        _unblock(fifo)
    assert_sentence(error, fifo, "named pipe")


@needs_fifo
@pytest.mark.parametrize("suffix", [".safetensors", ".ckpt"])
def test_a_fifo_given_as_the_model_never_blocks(tmp_path, suffix):
    fifo = replace_with_fifo(tmp_path / f"model{suffix}")
    try:
        error = refused(load_model, str(fifo), allow_pickle=True)
    finally:
        _unblock(fifo)
    assert_sentence(error, fifo, "not a regular file")


@needs_fifo
def test_a_fifo_beside_a_checkpoint_is_not_read(tmp_path):
    path = _good_single_file(tmp_path)
    fifo = replace_with_fifo(tmp_path / "model.yaml")
    try:
        kind, model = bounded(load_model, str(path))
    finally:
        _unblock(fifo)
    assert kind == "ok" and model.architecture == "sd1"


def test_open_regular_refuses_devices_and_folders(tmp_path):
    with pytest.raises(limits.NotRegularFileError, match="a folder"):
        limits.open_regular(tmp_path)
    if os.path.exists("/dev/zero"):
        with pytest.raises(limits.NotRegularFileError, match="a device"):
            limits.read_regular("/dev/zero", 1 << 20)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(limits.FileTooLargeError, match="more than"):
        limits.read_regular(big, 1024)


# A checkpoint that changes while it loads ----------------------------------------------------

_TRUNCATE_ON_READ = """
import os, sys
from app.core import checkpoint
_real_get = checkpoint.Checkpoint.get
_calls = [0]
def _get(self, name):
    _calls[0] += 1
    if _calls[0] == {after}:
        os.truncate(self.path, self.file_size // 3)
    return _real_get(self, name)
checkpoint.Checkpoint.get = _get
"""


def _good_single_file(tmp_path) -> Path:
    return write_safetensors(tmp_path / "model.safetensors", tiny_sd1_tensors())


@pytest.mark.parametrize("after", [1, 40])
def test_a_file_truncated_while_it_loads_gets_a_sentence_not_sigbus(tmp_path, after):
    """The file shrinks after its header was validated and tensors have been mapped: touching
    the lost pages would kill the process with SIGBUS and an empty stderr."""
    path = _good_single_file(tmp_path)
    result = run_cli(
        "check", str(path), "--size", "64", prelude=_TRUNCATE_ON_READ.replace("{after}", str(after))
    )
    assert result.returncode != -7, "killed by SIGBUS"
    assert_cannot_run(result, path, "the file changed while it was read")


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGBUS"), reason="no SIGBUS here")
def test_the_gui_names_a_changed_file_when_the_engine_dies_of_a_bus_error():
    """The one window left: a file cut short in the very moment a tensor is read, or while a
    loaded model's weights are in use, still ends the engine with SIGBUS."""
    import signal

    from app.engine.failures import describe_exit

    message = describe_exit(-signal.SIGBUS).message
    assert "model file" in message and "\n" not in message and message.endswith(".")


def test_a_file_rewritten_in_place_while_it_loads_gets_a_sentence(tmp_path):
    path = _good_single_file(tmp_path)
    checkpoint = Checkpoint(path)
    checkpoint.get(checkpoint.keys()[0])
    os.utime(path, ns=(1, 1))  # same size, new contents as far as anyone can tell
    error = refused(checkpoint.get, checkpoint.keys()[-1])
    assert_sentence(error, path, "changed while it was read")
    checkpoint.close()


def test_a_pickle_cut_short_after_loading_gets_a_sentence(tmp_path):
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": {"a": torch.ones(1000), "b": torch.ones(1000)}}, str(path))
    checkpoint = Checkpoint(path, allow_pickle=True)
    assert torch.equal(checkpoint.get("a"), torch.ones(1000))
    os.truncate(path, path.stat().st_size // 2)  # its storages are mapped: never touch them now
    assert_sentence(refused(checkpoint.get, "b"), path, "changed while it was read")


def test_a_file_that_shrinks_right_after_its_header_is_read(tmp_path, monkeypatch):
    from app.core.checkpoint import reader

    path = _good_single_file(tmp_path)

    def read_then_truncate(target):
        header = read_safetensors_header(target)
        os.truncate(target, header.file_size // 2)
        return header

    monkeypatch.setattr(reader, "read_safetensors_header", read_then_truncate)
    assert_sentence(refused(Checkpoint, path), path, "changed while it was read")


# The command, under a memory limit -----------------------------------------------------------


def _risky_case(tmp_path: Path, case: str) -> tuple[list[str], Path, str]:
    if case in RISKY_SINGLE_FILES:
        path = write_single_file(tmp_path / "model.safetensors", case)
        return [str(path)], path, SINGLE_FILES[case][1]
    if case in RISKY_FOLDERS:
        folder = hostile_folder(tmp_path / "pipeline", case)
        _change, file, words = FOLDERS[case]
        return [str(folder)], folder / file, words
    builder, words = RISKY_PICKLES[case]
    path = builder(tmp_path / "model.ckpt")
    return [str(path), "--allow-pickle"], path, words


@pytest.mark.parametrize("case", [*RISKY_SINGLE_FILES, *RISKY_FOLDERS, *RISKY_PICKLES])
def test_the_command_refuses_the_riskiest_files_within_memory_and_time(tmp_path, case):
    argv, path, words = _risky_case(tmp_path, case)
    result = run_cli("check", *argv, "--size", "64", memory_gib=4, timeout=180)
    assert_cannot_run(result, path, words)


@needs_fifo
def test_the_command_refuses_a_fifo_model_index(tmp_path):
    folder = tiny_folder(tmp_path / "pipeline")
    fifo = replace_with_fifo(folder / "model_index.json")
    try:
        result = run_cli("check", str(folder), timeout=120)
    finally:
        _unblock(fifo)
    assert_cannot_run(result, fifo, "named pipe")


def test_a_pickle_named_safetensors_loads_quietly_when_pickles_are_allowed(tmp_path):
    path = pickle_named_safetensors(tmp_path / "model.safetensors")
    refused_run = run_cli("check", str(path), "--size", "64")
    assert_cannot_run(refused_run, path, "pickle")
    allowed = run_cli("check", str(path), "--size", "64", "--allow-pickle")
    assert allowed.returncode in (0, 1), allowed.stderr[-2000:]
    # No PyTorch pickle warning and no traceback: only the check's own progress lines, which
    # a slow or busy machine prints every few seconds.
    assert without_progress(allowed.stderr) == "", allowed.stderr[-2000:]


# The library: one bad item costs one row -------------------------------------------------------


@pytest.fixture
def mixed_folder(tmp_path) -> Path:
    """A good model beside one of every kind of bad item."""
    from tests.support.model_files import save_single_file
    from tests.support.tiny_models import build_tiny_sd_pipeline

    folder = tmp_path / "models"
    folder.mkdir()
    save_single_file(build_tiny_sd_pipeline(), folder / "good.safetensors", dtype="fp16")
    write_single_file(folder / "scalar.safetensors", "scalar token embedding")
    write_single_file(folder / "one-d.safetensors", "1-D UNet input convolution")
    write_single_file(folder / "no-proj-in.safetensors", "attention without proj_in")
    write_single_file(folder / "deep.safetensors", "text encoder of 1e8 layers")
    shapes_file(folder / "other.safetensors", {"something.else": (2,)})
    hostile_folder(folder / "bad-config", "sample_size big")
    hostile_folder(folder / "nested", "nested model_index.json")
    hostile_folder(folder / "huge", "layers_per_block 100000")
    hostile_folder(folder / "bad-merges", "merges.txt of one-token lines")
    if hasattr(os, "mkfifo"):
        replace_with_fifo(tiny_folder(folder / "fifo") / "model_index.json")
        replace_with_fifo(folder / "pipe.safetensors")
    return folder


def _rows(folder: Path) -> dict[str, LibraryEntry]:
    kind, entries = bounded(scan_library, [str(folder)], include_defaults=False)
    assert kind == "ok", entries
    return {Path(e.path).name: e for e in entries}


def test_one_bad_item_costs_only_its_own_row(mixed_folder):
    rows = _rows(mixed_folder)
    good = rows["good.safetensors"]
    assert (good.architecture, good.supported, good.error) == ("sd1", True, None)
    expected = {
        "scalar.safetensors": "token_embedding",
        "one-d.safetensors": "input_blocks.0.0.weight",
        "no-proj-in.safetensors": "proj_in",
        "deep.safetensors": "num_hidden_layers",
        "bad-config": "sample_size",
        "nested": "nested",
        "huge": "layers_per_block",
        "bad-merges": "merges.txt: line 2",
    }
    if hasattr(os, "mkfifo"):
        expected.update({"fifo": "named pipe", "pipe.safetensors": "not a regular file"})
    for name, words in expected.items():
        row = rows[name]
        assert row.error is not None and words in row.error, (name, row)
        assert str(mixed_folder / name) in row.error and "\n" not in row.error
        assert row.supported is False
    assert rows["other.safetensors"].architecture == "unknown"  # unsupported, not broken
    assert rows["other.safetensors"].error is None


def test_an_unforeseen_fault_in_one_file_costs_only_its_row(mixed_folder, monkeypatch):
    real = library.inspection.families.detect_architecture

    def faulty(shapes, **kwargs):
        if kwargs.get("name") == "scalar.safetensors":
            raise IndexError("tuple index out of range")
        return real(shapes, **kwargs)

    monkeypatch.setattr(library.inspection.families, "detect_architecture", faulty)
    rows = _rows(mixed_folder)
    assert "IndexError" in rows["scalar.safetensors"].error
    assert rows["good.safetensors"].error is None


@pytest.mark.parametrize(
    "damage",
    [
        nested_json(100_000),
        nested_json(200),
        "[1, 2]",
        '{"version": 1, "entries": {"%s": {"stamp": %s}}}',
        '{"version": 1, "entries": {"%s": {"stamp": %s, "entry": {"path": 5}}}}',
        '{"version": 1, "entries": {"%s": {"stamp": %s, "entry": [1]}}}',
    ],
)
def test_a_damaged_library_cache_costs_only_a_rescan(mixed_folder, damage):
    good = mixed_folder / "good.safetensors"
    stamp = json.dumps(library.index._stamp(good, "single_file"))
    text = damage % (str(good), stamp) if "%s" in damage else damage
    library.index._index_path().parent.mkdir(parents=True, exist_ok=True)
    library.index._index_path().write_text(text)
    rows = _rows(mixed_folder)
    assert rows["good.safetensors"].architecture == "sd1"
    assert rows["good.safetensors"].error is None


def test_a_cached_row_of_the_wrong_types_is_read_again(mixed_folder):
    first = _rows(mixed_folder)
    index = json.loads(library.index._index_path().read_text())
    key = str(mixed_folder / "good.safetensors")
    index["entries"][key]["entry"]["size_bytes"] = "huge"
    library.index._index_path().write_text(json.dumps(index))
    again = _rows(mixed_folder)
    assert again["good.safetensors"] == first["good.safetensors"]
    assert isinstance(again["good.safetensors"].size_bytes, int)


def test_the_cache_row_types_cover_every_field():
    from dataclasses import fields

    assert set(library.index._ENTRY_TYPES) == {f.name for f in fields(LibraryEntry)}


def test_a_damaged_hash_cache_costs_only_a_rehash(tmp_path):
    from app.core import paths
    from app.core.checkpoint import model_hash

    path = _good_single_file(tmp_path)
    cache = paths.cache_dir() / "model_hashes.json"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(nested_json(100_000))
    kind, short = bounded(model_hash, path)
    assert kind == "ok" and len(short) == 10
    assert json.loads(cache.read_text())[str(path.resolve())]["sha256"].startswith(short)


# GGUF headers ------------------------------------------------------------------------------
# A GGUF header is a chain of counts and lengths (tensors, metadata entries, strings, arrays,
# dimensions, offsets); each is checked against the file and real files' sizes before use.


def _gguf_string(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def _gguf(
    tensors: list[tuple[str, list[int], int, int]],
    *,
    count: int | None = None,
    metadata: bytes = b"",
    keys: int = 0,
    data: int = 0,
) -> bytes:
    """A GGUF v3 file: (name, dims in GGUF order, type, offset) per tensor, raw metadata entries,
    then `data` zero bytes after the aligned header."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if count is None else count, keys)
    head += metadata
    for name, dims, kind, offset in tensors:
        head += _gguf_string(name) + struct.pack("<I", len(dims))
        head += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", kind, offset)
    head += b"\0" * (-len(head) % 32)
    return head + b"\0" * data


F32 = 0
GGUF_CASES = {
    # case: (file bytes, words in the sentence)
    "tensor count 2**40": (_gguf([], count=1 << 40), "claims 1,099,511,627,776 tensors"),
    "metadata count 2**40": (_gguf([("w", [4], F32, 0)], keys=1 << 40, data=16), "metadata"),
    "key length 2**60": (_gguf([], keys=1, metadata=_gguf_string("", 1 << 60)), "length"),
    "array of 2**50 items": (
        _gguf([], keys=1, metadata=_gguf_string("a") + struct.pack("<IIQ", 9, 0, 1 << 50)),
        "array items",
    ),
    "array running past the end": (
        _gguf([], keys=1, metadata=_gguf_string("a") + struct.pack("<IIQ", 9, 0, 1 << 20)),
        "truncated",
    ),
    "tensor offset past the end": (_gguf([("w", [4], F32, 1 << 40)], data=16), "truncated"),
    "tensor of 2**60 elements": (_gguf([("w", [1 << 30, 1 << 30], F32, 0)], data=16), "elements"),
    "unknown tensor type": (_gguf([("w", [4], 999, 0)], data=16), "unknown GGUF type 999"),
    "Q8_0 rows not in blocks": (_gguf([("w", [30], 8, 0)], data=64), "blocks of 32"),
    "overlapping tensors": (
        _gguf([("a", [4], F32, 0), ("b", [4], F32, 0)], data=32),
        "overlaps",
    ),
    "tensor named twice": (_gguf([("a", [4], F32, 0), ("a", [4], F32, 32)], data=64), "twice"),
    "header cut short": (_gguf([("w", [4], F32, 0)], data=16)[:30], "truncated"),
    "version 1": (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
}
RISKY_GGUF = ("tensor count 2**40", "key length 2**60", "array of 2**50 items")


def _strings_array(count: int) -> bytes:
    """A metadata array of `count` one-letter strings, as a vocabulary is stored."""
    head = _gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, count)
    return head + _gguf_string("a") * count


def _many_tensors(count: int) -> bytes:
    """`count` one-element F32 tensors named like Flux blocks, each stored (as `_gguf` writes
    them, joined once: adding to the header tensor by tensor is quadratic)."""
    head = [b"GGUF" + struct.pack("<IQQ", 3, count, 0)]
    for i in range(count):
        head.append(_gguf_string(f"double_blocks.{i}.img_attn.norm.key_norm.scale"))
        head.append(struct.pack("<IQIQ", 1, 1, F32, 32 * i))
    raw = b"".join(head)
    return raw + b"\0" * (-len(raw) % 32) + b"\0" * (32 * count)


# Files that real sizes of every count make: each was accepted by the header walk and then
# took the gguf package's eager reader minutes and gigabytes (or a folder of them a load).
HEAVY_GGUF = {
    "4 million strings in one array": (
        lambda: _gguf([("w", [4], F32, 0)], keys=1, metadata=_strings_array(4_000_000), data=16),
        "strings in arrays",
    ),
    "65,534 tensors": (lambda: _many_tensors(65_534), "claims 65,534 tensors"),
}
ORIGINAL_SHAPE = "comfy.gguf.orig_shape.w"
GGUF_CASES.update(
    {
        "negative recorded shape": (
            _gguf(
                [("w", [4], F32, 0)],
                keys=1,
                metadata=_gguf_string(ORIGINAL_SHAPE) + struct.pack("<IIQii", 9, 5, 2, -2, -2),
                data=16,
            ),
            "negative dimension",
        ),
        "a block type gguf cannot decode": (
            _gguf([("w", [256], 15, 0)], data=320),  # Q8_K: 256 values in 292 bytes
            "Q8_K, which the gguf package cannot decode",
        ),
    }
)


@pytest.mark.parametrize("case", sorted(GGUF_CASES))
def test_hostile_gguf_headers_get_one_sentence(tmp_path, case):
    raw, words = GGUF_CASES[case]
    path = tmp_path / "flux1-dev-Q8_0.gguf"
    path.write_bytes(raw)
    assert_sentence(refused(Checkpoint, path), path, words)


def test_a_good_gguf_header_passes_the_bounds(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(_gguf([("a", [4], F32, 0), ("b", [2, 4], F32, 32)], data=64))
    with Checkpoint(path) as checkpoint:
        assert checkpoint.shapes == {"a": (4,), "b": (4, 2)}
        assert checkpoint.get("b").abs().sum() == 0


@pytest.mark.parametrize("case", RISKY_GGUF)
def test_the_command_refuses_hostile_gguf_files_within_memory_and_time(tmp_path, case):
    raw, words = GGUF_CASES[case]
    path = tmp_path / "models" / "diffusion_models" / "flux1-dev-Q8_0.gguf"
    path.parent.mkdir(parents=True)
    path.write_bytes(raw)
    result = run_cli("check", str(path), "--size", "64", memory_gib=4, timeout=180)
    assert_cannot_run(result, path, words)


# Configuration files of other tools --------------------------------------------------------


def yaml_alias_bomb(levels: int = 9) -> str:
    """About 600 bytes of YAML whose merge keys copy a mapping 9**levels times when built."""
    lines = ["l0: &l0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8, i: 9}"]
    for n in range(1, levels):
        lines.append(f"l{n}: &l{n} {{<<: [{', '.join([f'*l{n - 1}'] * 9)}]}}")
    lines.append(f"comfyui:\n  checkpoints: more\n  extra: *l{levels - 1}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text, words",
    [
        (yaml_alias_bomb(), "aliases"),
        ("a:\n  checkpoints: x\n  b: " + "[" * 40 + "]" * 40 + "\n", "nested too deeply"),
    ],
    ids=["merge-key alias bomb", "deep nesting"],
)
def test_a_hostile_extra_model_paths_yaml_costs_only_its_row(tmp_path, monkeypatch, text, words):
    home = tmp_path / "home"
    checkpoints = home / "ComfyUI" / "models" / "checkpoints"
    checkpoints.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    yaml_file = home / "ComfyUI" / "extra_model_paths.yaml"
    yaml_file.write_text(text)
    assert len(text) < 1024
    kind, value = bounded(library.default_folders)
    assert kind == "ok", value
    folders, problems = value  # type: ignore[misc]
    assert checkpoints in [f.path for f in folders]  # the rest of the install still counts
    assert [p.path for p in problems] == [str(yaml_file)]
    error = problems[0].error or ""
    assert error.startswith(f"{yaml_file}: it ") and words in error and error.endswith(".")


def test_explain_names_the_unread_extra_model_paths_yaml(tmp_path, monkeypatch):
    from app.core import explain

    home = tmp_path / "home"
    (home / "ComfyUI" / "models" / "checkpoints").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    yaml_file = home / "ComfyUI" / "extra_model_paths.yaml"
    yaml_file.write_text(yaml_alias_bomb())
    image = tmp_path / "black.png"
    Image.new("RGB", (64, 64)).save(
        image,
        pnginfo=_parameters("a cat\nSteps: 20, Sampler: Euler, Seed: 1, Size: 64x64, Model: gone"),
    )
    kind, value = bounded(lambda: explain.explain_image(image))
    assert kind == "ok", value
    assert not value.model.found  # type: ignore[union-attr]
    (note,) = [n for n in value.notes if str(yaml_file) in n]  # type: ignore[union-attr]
    assert "aliases" in note and note.endswith(".")


def _parameters(text: str):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("parameters", text)
    return info


def test_a_plain_extra_model_paths_yaml_is_still_read(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "ComfyUI" / "models" / "checkpoints").mkdir(parents=True)
    shared = tmp_path / "shared"
    (shared / "sd").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    (home / "ComfyUI" / "extra_model_paths.yaml").write_text(
        f"mine:\n  base_path: {shared}\n  checkpoints: |\n    sd\n  vae: sd\n"
    )
    folders, problems = library.default_folders()
    assert problems == [] and (shared / "sd").resolve() in [f.path for f in folders]


@pytest.mark.parametrize("case", sorted(HEAVY_GGUF))
def test_gguf_files_with_real_sized_hostile_counts_are_refused_before_any_reader(tmp_path, case):
    make, words = HEAVY_GGUF[case]
    path = tmp_path / "flux1-dev-Q8_0.gguf"
    path.write_bytes(make())
    assert_sentence(refused(Checkpoint, path), path, words)


def test_a_gguf_tensor_is_read_without_the_gguf_packages_reader(tmp_path, monkeypatch):
    """Tensors are read at the offsets the bounded walk checked; the package's GGUFReader,
    which parses every metadata array into numpy objects, is never built."""
    import gguf

    def no_reader(*args, **kwargs):
        raise AssertionError("GGUFReader parsed the file")

    monkeypatch.setattr(gguf, "GGUFReader", no_reader)
    path = tmp_path / "tiny.gguf"
    path.write_bytes(_gguf([("a", [4], F32, 0)], keys=1, metadata=_strings_array(1000), data=32))
    with Checkpoint(path) as checkpoint:
        assert checkpoint.get("a").tolist() == [0.0] * 4


def test_a_folder_of_hostile_gguf_files_beside_a_flux_model_costs_seconds(tmp_path):
    from gguf import GGMLQuantizationType

    from tests.support.quantized_files import flux_gguf

    _, _, path = flux_gguf(tmp_path, GGMLQuantizationType.Q8_0)
    hostile = _many_tensors(65_534)
    for number in range(8):
        (tmp_path / "models" / "text_encoders" / f"t5xxl_{number}.gguf").write_bytes(hostile)
    kind, model = bounded(load_model, str(path))
    assert kind == "ok", model


@pytest.mark.parametrize("name", ["drawing.png", "drawing.eps"])
def test_a_postscript_file_is_refused_by_its_format_and_never_handed_to_ghostscript(
    tmp_path, monkeypatch, name
):
    """Pillow identifies PostScript by its first bytes, whatever the name, and hands its pixels
    to Ghostscript, an outside program that runs the file (this one loops for ever). Pictures,
    masks and images to explain are opened only as PNG, JPEG or WebP: Ghostscript is faked as
    installed here, so the test says the same on a machine with or without it."""
    from PIL import EpsImagePlugin

    from app.core.explain import pixel_status, read_exif
    from app.core.explain.explanation import read_image
    from app.core.images.pictures import (
        check_picture_files,
        picture_header,
        picture_size,
        read_pictures,
    )
    from tests.support.image_files import pixels, postscript

    ran: list[object] = []

    def ghostscript(*args, **kwargs):
        ran.append(args)
        raise OSError("Ghostscript ran")

    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", ghostscript)
    monkeypatch.setattr(EpsImagePlugin, "has_ghostscript", lambda: True)
    path = postscript(tmp_path / name)
    picture = tmp_path / "picture.png"
    pixels("noise").save(picture)
    reads = {
        "picture_header": lambda: picture_header(path),
        "picture_size": lambda: picture_size(path, 512),
        "read_pictures": lambda: read_pictures([str(path)], None, 64, 64),
        "the mask": lambda: read_pictures([str(picture)], str(path), 64, 64),
        "check_picture_files": lambda: check_picture_files([str(path)], None),
        "pixel_status": lambda: pixel_status(path),
        "read_exif": lambda: read_exif(path),
        "read_image": lambda: read_image(path),
    }
    started = time.monotonic()
    for what, read in reads.items():
        with pytest.raises(BadFileError) as caught:
            read()
        message = str(caught.value)
        assert message.startswith(f"{path}: ") and "\n" not in message, what
        if what != "read_exif":  # read only once the first bytes say JPEG or WebP
            assert "PNG, JPEG or WebP" in message, what
    assert ran == []
    assert time.monotonic() - started < 10
