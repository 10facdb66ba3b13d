"""Loading models: round trips through single files and folders, VAE files, pickles, bad input.

Every pipeline here is built in code; every file is written into tmp_path; the HF cache is an
empty temporary folder and the network is cut, so each load is proven offline.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from app.core import architecture as arch
from app.core.checkpoint import write_safetensors
from app.core.errors import BadFileError, CancelledError, PickleRefusedError, UnsupportedModelError
from app.core.families import architecture_title
from app.core.families.sdxl import SDXL_TEXT_1
from app.core.jobs import CancelToken
from app.core.models import LoadedModel, load_model
from tests.support.checkpoint_files import (
    shapes_file,
    state_dicts_equal,
    tiny_sd1_inpaint,
    tiny_sd1_matching_rules,
    tiny_sd2,
)
from tests.support.model_files import ldm_state_dict, save_single_file
from tests.support.tiny_models import build_tiny_sd_pipeline, build_tiny_sdxl_pipeline

ROOT = Path(__file__).resolve().parents[2]
TORCH = {"fp16": torch.float16, "fp32": torch.float32}


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(autouse=True)
def empty_hf_cache(isolated_dirs):
    """The HF cache starts empty and stays empty: nothing is fetched or cached."""
    hf_home = Path(os.environ["HF_HOME"])
    assert not hf_home.exists() or not any(hf_home.rglob("*"))
    yield
    assert not hf_home.exists() or not [p for p in hf_home.rglob("*") if p.is_file()]


def components_of(pipeline) -> dict:
    return {
        name: module
        for name, module in pipeline.components.items()
        if hasattr(module, "state_dict") and module is not None
    }


def assert_same_weights(original, loaded, dtype) -> None:
    for name, module in components_of(original).items():
        differing = state_dicts_equal(module, getattr(loaded, name), dtype)
        assert differing == [], (name, differing[:5])
        for tensor in getattr(loaded, name).state_dict().values():
            if tensor.is_floating_point():
                assert tensor.dtype == dtype, (name, tensor.dtype)


BUILDERS = {
    "sd1": (build_tiny_sd_pipeline, "sd1", "StableDiffusionPipeline"),
    "sd2": (tiny_sd2, "sd2", "StableDiffusionPipeline"),
    "sdxl": (build_tiny_sdxl_pipeline, "sdxl", "StableDiffusionXLPipeline"),
}


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_single_file_round_trip_keeps_every_weight(tmp_path, kind, dtype):
    build, architecture, pipeline_class = BUILDERS[kind]
    original = build()
    path = save_single_file(
        original, tmp_path / f"tiny-{kind}.safetensors", dtype=dtype, architecture=architecture
    )
    model = load_model(str(path))
    assert isinstance(model, LoadedModel)
    assert type(model.pipeline).__name__ == pipeline_class
    assert (model.format, model.architecture, model.stored_dtype) == (
        "single_file",
        architecture,
        dtype,
    )
    assert model.name == f"tiny-{kind}" and model.source == str(path)
    assert model.model_hash == hashlib.sha256(path.read_bytes()).hexdigest()[:10]
    assert model.weights.content is not None  # the first load digests what it read
    assert model.weights.non_finite == [] and model.weights.tensors > 100
    assert (
        model.detected_because.endswith(".")
        and architecture_title(architecture) in model.detected_because
    )
    assert_same_weights(original, model.pipeline, TORCH[dtype])


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_diffusers_folder_and_its_single_file_load_the_same_weights(tmp_path, dtype):
    original = build_tiny_sd_pipeline(seed=5).to(TORCH[dtype])
    folder = tmp_path / "tiny-folder"
    original.save_pretrained(folder, safe_serialization=True)

    from_folder = load_model(str(folder))
    assert (from_folder.format, from_folder.architecture) == ("diffusers", "sd1")
    assert from_folder.stored_dtype == dtype and from_folder.model_hash is None
    assert_same_weights(original, from_folder.pipeline, TORCH[dtype])

    single = save_single_file(from_folder.pipeline, tmp_path / "from-folder.safetensors")
    from_file = load_model(str(single))
    assert_same_weights(original, from_file.pipeline, TORCH[dtype])
    assert from_folder.profile_key != from_file.profile_key


def test_round_trip_reproduces_outputs_exactly(tmp_path):
    original = tiny_sd1_matching_rules()
    path = save_single_file(original, tmp_path / "exact.safetensors")
    loaded = load_model(str(path)).pipeline
    torch.manual_seed(0)
    latents = torch.randn(1, 4, 8, 8)
    ids = original.tokenizer(
        "a photo of a cat", padding="max_length", max_length=77, return_tensors="pt"
    ).input_ids
    with torch.no_grad():
        text_a = original.text_encoder(ids)[0]
        text_b = loaded.text_encoder(ids)[0]
        assert torch.equal(text_a, text_b)
        unet_a = original.unet(latents, 10, encoder_hidden_states=text_a).sample
        unet_b = loaded.unet(latents, 10, encoder_hidden_states=text_b).sample
        assert torch.equal(unet_a, unet_b)
        assert torch.equal(original.vae.decode(latents).sample, loaded.vae.decode(latents).sample)


def test_prompts_tokenize_as_the_original_clip():
    from transformers import CLIPTokenizer

    from app.core.models import config_folder

    tokenizer = CLIPTokenizer.from_pretrained(
        config_folder("sd1") / "tokenizer", local_files_only=True
    )
    assert tokenizer("a photo of a cat").input_ids == [49406, 320, 1125, 539, 320, 2368, 49407]
    assert tokenizer.pad_token == "<|endoftext|>"
    second = CLIPTokenizer.from_pretrained(
        config_folder("sdxl") / "tokenizer_2", local_files_only=True
    )
    assert second.pad_token == "!" and second.pad_token_id == 0


def test_sd2_round_trip_reads_v_prediction_from_the_name(tmp_path):
    original = tiny_sd2()
    path = save_single_file(original, tmp_path / "tiny-sd2-768-v.safetensors", architecture="sd2")
    model = load_model(str(path))
    assert (model.prediction_type, model.native_size) == ("v_prediction", 768)
    assert model.pipeline.scheduler.config.prediction_type == "v_prediction"
    assert model.pipeline.unet.config.use_linear_projection is True
    epsilon = save_single_file(original, tmp_path / "tiny-sd2-512.safetensors", architecture="sd2")
    assert load_model(str(epsilon)).prediction_type == "epsilon"


def test_inpainting_checkpoint_loads_as_inpainting_pipeline(tmp_path):
    original = tiny_sd1_inpaint()
    path = save_single_file(original, tmp_path / "inpaint.safetensors")
    model = load_model(str(path))
    assert model.architecture == "sd1-inpaint"
    assert type(model.pipeline).__name__ == "StableDiffusionInpaintPipeline"
    assert model.pipeline.unet.config.in_channels == 9
    assert_same_weights(original, model.pipeline, torch.float32)


def test_real_world_extras_are_ignored(tmp_path):
    original = build_tiny_sd_pipeline()
    tensors = ldm_state_dict(original)
    tensors = {k: v.half() for k, v in tensors.items()}
    tensors.update(
        {  # what real A1111/LDM files also carry
            "alphas_cumprod": torch.linspace(1, 0, 1000),
            "model_ema.decay": torch.tensor(0.9999),
            "model_ema.num_updates": torch.tensor(1000, dtype=torch.int32),
            "cond_stage_model.transformer.text_model.embeddings.position_ids": torch.arange(77)[
                None
            ],
        }
    )
    path = write_safetensors(tmp_path / "extras.safetensors", tensors)
    model = load_model(str(path))
    assert model.stored_dtype == "fp16"
    assert_same_weights(original, model.pipeline, torch.float16)


def test_non_finite_weights_are_listed_by_file_name(tmp_path):
    tensors = ldm_state_dict(build_tiny_sd_pipeline())
    bad = "model.diffusion_model.out.2.weight"
    tensors[bad] = tensors[bad].clone()
    tensors[bad][0, 0, 0, 0] = float("nan")
    path = write_safetensors(tmp_path / "nan.safetensors", tensors)
    model = load_model(str(path))
    assert model.weights.non_finite == [bad]


def test_missing_weights_are_refused_whole(tmp_path):
    tensors = ldm_state_dict(build_tiny_sd_pipeline())
    del tensors["model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight"]
    path = write_safetensors(tmp_path / "incomplete.safetensors", tensors)
    with pytest.raises(BadFileError, match="UNet is incomplete.*attn1.to_q") as caught:
        load_model(str(path))
    _assert_sentence(caught.value, path)
    tensors = ldm_state_dict(build_tiny_sd_pipeline())
    del tensors["model.diffusion_model.out.2.weight"]
    path = write_safetensors(tmp_path / "no-output.safetensors", tensors)
    with pytest.raises(UnsupportedModelError, match="no out.2.weight") as caught:
        load_model(str(path))
    _assert_sentence(caught.value, path)


# A separate VAE ---------------------------------------------------------------------------


def _vae_variants(tmp_path, vae):
    # Same shapes as the model's VAE, other weights: written in each layout users meet.
    from tests.support.model_files import _ldm_vae

    ldm = {
        k.removeprefix(arch.VAE): v
        for k, v in _ldm_vae(vae.state_dict(), len(vae.config.block_out_channels)).items()
    }
    folder = tmp_path / "vae-folder"
    vae.save_pretrained(folder, safe_serialization=True)
    return {
        "ldm file": write_safetensors(tmp_path / "vae-ldm.safetensors", ldm),
        "prefixed ldm file": write_safetensors(
            tmp_path / "vae-prefixed.safetensors", {arch.VAE + k: v for k, v in ldm.items()}
        ),
        "diffusers file": write_safetensors(
            tmp_path / "vae-diffusers.safetensors", vae.state_dict()
        ),
        "diffusers folder": folder,
    }


def test_separate_vae_replaces_the_models_vae_in_every_layout(tmp_path):
    from tests.support.tiny_models import tiny_vae

    model_path = save_single_file(
        build_tiny_sd_pipeline(), tmp_path / "model.safetensors", dtype="fp16"
    )
    other = tiny_vae(seed=99)
    for layout, vae_path in _vae_variants(tmp_path, other).items():
        model = load_model(str(model_path), vae=str(vae_path))
        assert state_dicts_equal(other, model.pipeline.vae) == [], layout
        assert model.pipeline.vae.config.scaling_factor == 0.18215
        assert model.stored_dtype == "mixed", layout  # fp16 model, fp32 VAE

    folder = tmp_path / "pipeline-folder"
    build_tiny_sd_pipeline().save_pretrained(folder)
    model = load_model(str(folder), vae=str(_vae_variants(tmp_path, other)["ldm file"]))
    assert state_dicts_equal(other, model.pipeline.vae) == []


def test_checkpoint_without_vae_needs_one(tmp_path):
    from tests.support.tiny_models import tiny_vae

    tensors = {
        k: v
        for k, v in ldm_state_dict(build_tiny_sd_pipeline()).items()
        if not k.startswith(arch.VAE)
    }
    path = write_safetensors(tmp_path / "no-vae.safetensors", tensors)
    with pytest.raises(UnsupportedModelError, match="no VAE.*--vae"):
        load_model(str(path))
    vae = tiny_vae(seed=3)
    vae_path = write_safetensors(tmp_path / "vae.safetensors", vae.state_dict())
    assert state_dicts_equal(vae, load_model(str(path), vae=str(vae_path)).pipeline.vae) == []


def test_bad_vae_files(tmp_path):
    from diffusers import AutoencoderKL

    model_path = save_single_file(build_tiny_sd_pipeline(), tmp_path / "model.safetensors")
    with pytest.raises(BadFileError, match="does not exist"):
        load_model(str(model_path), vae=str(tmp_path / "nope.safetensors"))
    not_vae = shapes_file(tmp_path / "not-vae.safetensors", {"foo.weight": (2, 2)})
    with pytest.raises(BadFileError, match="holds no VAE"):
        load_model(str(model_path), vae=str(not_vae))
    wide = AutoencoderKL(
        latent_channels=16,
        block_out_channels=(32,),
        norm_num_groups=32,
        down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",),
    )
    wide_path = write_safetensors(tmp_path / "flux-like-vae.safetensors", wide.state_dict())
    with pytest.raises(UnsupportedModelError, match="this is a 16-channel VAE .*needs a 4-"):
        load_model(str(model_path), vae=str(wide_path))
    with pytest.raises(BadFileError, match="demo"):
        load_model("demo", vae=str(wide_path))


# Pickles ----------------------------------------------------------------------------------


def test_pickle_checkpoint_needs_permission_then_loads_with_weights_only(tmp_path):
    original = build_tiny_sd_pipeline()
    path = tmp_path / "old.ckpt"
    torch.save(
        {
            "state_dict": {k: v.clone() for k, v in ldm_state_dict(original).items()},
            "global_step": 1,
        },
        str(path),
    )
    with pytest.raises(PickleRefusedError) as caught:
        load_model(str(path))
    assert str(path) in str(caught.value) and "--allow-pickle" in str(caught.value)
    model = load_model(str(path), allow_pickle=True)
    assert model.architecture == "sd1" and model.model_hash is not None
    assert_same_weights(original, model.pipeline, torch.float32)


def test_pickle_payload_in_a_model_never_runs(tmp_path):
    from tests.support.checkpoint_files import pickle_with_payload, torch_zip_with_payload

    marker = tmp_path / "payload-ran"
    for builder in (pickle_with_payload, torch_zip_with_payload):
        path = builder(tmp_path / f"{builder.__name__}.ckpt", marker)
        with pytest.raises(PickleRefusedError):
            load_model(str(path))
        with pytest.raises(BadFileError, match="weights-only"):
            load_model(str(path), allow_pickle=True)
        with pytest.raises(BadFileError):
            load_model(
                str(save_single_file(build_tiny_sd_pipeline(), tmp_path / "m.safetensors")),
                vae=str(path),
                allow_pickle=True,
            )
    assert not marker.exists()


# Bad input --------------------------------------------------------------------------------


def _assert_sentence(error, path) -> None:
    text = str(error)
    assert str(path) in text and "\n" not in text and text.endswith("."), text


def test_missing_empty_and_truncated_models(tmp_path):
    with pytest.raises(BadFileError, match="does not exist") as caught:
        load_model(str(tmp_path / "missing.safetensors"))
    _assert_sentence(caught.value, tmp_path / "missing.safetensors")
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(BadFileError, match="empty"):
        load_model(str(empty))
    good = save_single_file(build_tiny_sd_pipeline(), tmp_path / "good.safetensors")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(BadFileError, match="truncated") as caught:
        load_model(str(truncated))
    _assert_sentence(caught.value, truncated)
    assert load_model(str(good)).architecture == "sd1"  # and the process keeps working


@pytest.mark.parametrize(
    ("shapes", "words"),
    [
        (
            {
                "lora_unet_mid_block_attentions_0_proj_in.lora_down.weight": (4, 8),
                "lora_unet_mid_block_attentions_0_proj_in.lora_up.weight": (8, 4),
            },
            "a LoRA",
        ),
        ({"double_blocks.0.img_attn.qkv.weight": (3, 3)}, "a Flux model"),
        (
            {
                "encoder.conv_in.weight": (8, 3, 3, 3),
                "encoder.down.0.block.0.conv1.weight": (8, 8, 3, 3),
                "decoder.up.0.block.0.conv1.weight": (8, 8, 3, 3),
            },
            "a standalone VAE",
        ),
        ({"something.else": (2,)}, "not a Stable Diffusion checkpoint"),
    ],
)
def test_unsupported_models_name_what_they_look_like(tmp_path, shapes, words):
    path = shapes_file(tmp_path / "other.safetensors", shapes)
    with pytest.raises(UnsupportedModelError) as caught:
        load_model(str(path))
    assert words in str(caught.value)
    _assert_sentence(caught.value, path)


def test_sdxl_refiner_is_named(tmp_path):
    pipeline = build_tiny_sdxl_pipeline()
    tensors = {}
    for key, tensor in ldm_state_dict(pipeline).items():
        if key.startswith(SDXL_TEXT_1):
            continue
        tensors[key.replace("conditioner.embedders.1.", "conditioner.embedders.0.")] = tensor
    path = write_safetensors(tmp_path / "refiner.safetensors", tensors)
    with pytest.raises(UnsupportedModelError, match="SDXL refiner"):
        load_model(str(path))


def _folder(tmp_path) -> Path:
    folder = tmp_path / "pipeline"
    build_tiny_sd_pipeline().save_pretrained(folder, safe_serialization=True)
    return folder


def test_folder_without_model_index(tmp_path):
    folder = _folder(tmp_path)
    (folder / "model_index.json").unlink()
    with pytest.raises(BadFileError, match="no model_index.json") as caught:
        load_model(str(folder))
    _assert_sentence(caught.value, folder)


def test_folder_missing_a_component(tmp_path):
    import shutil

    folder = _folder(tmp_path)
    shutil.rmtree(folder / "text_encoder")
    with pytest.raises(BadFileError, match="'text_encoder'") as caught:
        load_model(str(folder))
    _assert_sentence(caught.value, folder)


def test_folder_component_without_weights_or_with_bad_weights(tmp_path):
    folder = _folder(tmp_path)
    weights = folder / "unet" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(BadFileError) as caught:
        load_model(str(folder))
    _assert_sentence(caught.value, weights)
    weights.unlink()
    with pytest.raises(BadFileError, match="no weights file"):
        load_model(str(folder))


def test_folder_with_pickled_weights_needs_permission(tmp_path):
    folder = tmp_path / "pickled"
    original = build_tiny_sd_pipeline()
    original.save_pretrained(folder, safe_serialization=False)
    with pytest.raises(PickleRefusedError):
        load_model(str(folder))
    model = load_model(str(folder), allow_pickle=True)
    assert_same_weights(original, model.pipeline, torch.float32)
    assert model.stored_dtype == "fp32"


def test_folder_with_broken_model_index(tmp_path):
    folder = _folder(tmp_path)
    (folder / "model_index.json").write_text("{not json")
    with pytest.raises(BadFileError, match="not valid JSON"):
        load_model(str(folder))
    (folder / "model_index.json").write_text(
        json.dumps(
            {
                "_class_name": "HiDreamImagePipeline",
                "transformer": ["diffusers", "HiDreamImageTransformer2DModel"],
            }
        )
    )
    (folder / "transformer").mkdir()
    (folder / "transformer" / "config.json").write_text("{}")
    with pytest.raises(UnsupportedModelError, match="HiDreamImagePipeline"):
        load_model(str(folder))
    (folder / "model_index.json").write_text(
        json.dumps(
            {"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]}
        )
    )
    (folder / "transformer" / "config.json").unlink()
    with pytest.raises(BadFileError, match="transformer: config.json is missing"):
        load_model(str(folder))


# The demo, progress, cancel, import cost -------------------------------------------------


def test_demo_model():
    model = load_model("demo")
    assert (model.format, model.name, model.source, model.architecture) == (
        "demo",
        "demo",
        "demo",
        "sd1",
    )
    assert model.profile_key.startswith("demo-") and model.model_hash is None
    assert model.weights.non_finite == [] and model.weights.tensors > 0
    assert "draws coloured shapes" in model.detected_because
    from app.core.demo import DEMO_SIZE

    assert model.native_size == DEMO_SIZE


def test_progress_and_cancel(tmp_path):
    path = save_single_file(build_tiny_sd_pipeline(), tmp_path / "model.safetensors")
    stages = []
    load_model(str(path), on_progress=lambda stage, done, total: stages.append(stage))
    assert "Loading the UNet" in stages and any("NaN" in s for s in stages)
    token = CancelToken()
    token.cancel()
    with pytest.raises(CancelledError):
        load_model(str(path), cancel=token)


def test_importing_the_loader_stays_cheap():
    code = (
        "import sys, app.core.models, app.core.checkpoint, app.core.architecture, "
        "app.core.library; print(' '.join(sorted(m for m in ('torch', 'diffusers', "
        "'transformers', 'safetensors') if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""


# Full size -------------------------------------------------------------------------------


def _available_memory_gib() -> float:
    import psutil

    return psutil.virtual_memory().available / 2**30


@pytest.mark.slow
def test_full_size_sd15_single_file_loads_offline_through_shipped_configs(tmp_path):
    import diffusers

    from app.core.models import config_folder
    from tests.support.model_files import build_random_pipeline

    original = build_random_pipeline("sd1", dtype="fp16", seed=1)
    path = save_single_file(original, tmp_path / "random-sd15.safetensors")
    assert path.stat().st_size > 2_000_000_000
    model = load_model(str(path))
    assert (model.architecture, model.native_size, model.stored_dtype) == ("sd1", 512, "fp16")
    assert model.weights.non_finite == [] and model.weights.bytes > 2_000_000_000
    assert_same_weights(original, model.pipeline, torch.float16)
    # The shipped config folder is exactly what diffusers' own single-file loader needs.
    theirs = diffusers.StableDiffusionPipeline.from_single_file(
        str(path),
        config=str(config_folder("sd1")),
        local_files_only=True,
        torch_dtype=torch.float16,
    )
    assert_same_weights(theirs, model.pipeline, torch.float16)


@pytest.mark.slow
@pytest.mark.skipif(_available_memory_gib() < 16, reason="an SDXL-size test needs 16 GiB free")
def test_full_size_sdxl_single_file_loads_offline_through_shipped_configs(tmp_path):
    import gc

    from tests.support.model_files import build_random_pipeline

    original = build_random_pipeline("sdxl", dtype="fp16", seed=2)
    path = save_single_file(original, tmp_path / "random-sdxl.safetensors")
    reference = {
        name: {k: v[:2].clone() for k, v in module.state_dict().items()}
        for name, module in components_of(original).items()
    }
    del original
    gc.collect()
    model = load_model(str(path))
    assert (model.architecture, model.native_size, model.stored_dtype) == ("sdxl", 1024, "fp16")
    assert model.weights.non_finite == []
    assert model.pipeline.unet.config.transformer_layers_per_block == [1, 2, 10]
    for name, expected in reference.items():
        loaded = getattr(model.pipeline, name).state_dict()
        assert set(loaded) == set(expected), name
        assert all(torch.equal(loaded[k][:2], v) for k, v in expected.items()), name


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_loaded_single_file_pipelines_generate(tmp_path, kind):
    build, architecture, _ = BUILDERS[kind]
    path = save_single_file(build(), tmp_path / f"{kind}.safetensors", architecture=architecture)
    pipeline = load_model(str(path)).pipeline
    image = pipeline(
        "a photo of a cat",
        num_inference_steps=2,
        height=64,
        width=64,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).images[0]
    assert image.shape == (64, 64, 3)
    assert not (image != image).any()  # no NaN from an untrained but complete pipeline


def test_first_load_reports_the_hash_and_can_be_cancelled_there(tmp_path, monkeypatch):
    import threading

    from app.core import checkpoint
    from app.core.checkpoint import hashing

    path = save_single_file(build_tiny_sd_pipeline(), tmp_path / "model.safetensors")
    real = hashing.sha256_file
    waited = threading.Event()

    def held_sha256(*args, cancel=None, **kwargs):
        # The hash is held until the loader says it waits for it, so the load always finishes
        # first, however busy the machine; a cancelled load releases it through `cancel`.
        while not waited.wait(0.01):
            if cancel is not None:
                cancel.raise_if_cancelled()
        return real(*args, cancel=cancel, **kwargs)

    def release_at_hash(stage, done, total):
        stages.append(stage)
        if stage.startswith("Computing the model hash"):
            waited.set()

    monkeypatch.setattr(hashing, "sha256_file", held_sha256)
    stages: list[str] = []
    model = load_model(str(path), on_progress=release_at_hash)
    assert any(stage.startswith("Computing the model hash") for stage in stages)
    assert model.model_hash == hashlib.sha256(path.read_bytes()).hexdigest()[:10]

    waited.clear()
    other = save_single_file(build_tiny_sd_pipeline(seed=1), tmp_path / "other.safetensors")
    token = CancelToken()

    def cancel_at_hash(stage, done, total):
        if stage.startswith("Computing the model hash"):
            token.cancel()

    with pytest.raises(CancelledError):
        load_model(str(other), on_progress=cancel_at_hash, cancel=token)
    assert not waited.is_set()  # cancelled while the hash was still held
    assert checkpoint.cached_model_hash(other) is None
