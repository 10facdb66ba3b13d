"""Z-Image as ComfyUI users keep it: the transformer in its original layout in
diffusion_models/ (fused qkv, final_layer, x_embedder), the Qwen3 text encoder as
text_encoders/qwen_3_4b.safetensors, Flux's VAE as vae/ae.safetensors. Loaded offline with
identical weights and outputs, companions given by flag or found beside it, a missing or wrong
one named in one sentence, and a file that sets absurd sizes refused before anything is built.
"""

from __future__ import annotations

import pytest
import torch

from app.core import models
from app.core.checkpoint import write_safetensors
from app.core.errors import HalfSafeError, UnsupportedModelError
from app.core.formats import layouts
from app.core.models import split
from tests.support.family_helpers import offline  # noqa: F401 - an autouse fixture: no network
from tests.support.model_files import save_split_files
from tests.support.tiny_models import (
    ZIMAGE_SCHEDULER_CONFIG,
    build_tiny_flux_pipeline,
    build_tiny_zimage_pipeline,
)

COMPONENTS = ("text_encoder", "transformer", "vae")


def same_weights(mine, theirs) -> None:
    for component in COMPONENTS:
        a = getattr(mine, component).state_dict()
        b = getattr(theirs, component).state_dict()
        assert set(a) == set(b), component
        assert all(torch.equal(v, b[k]) for k, v in a.items()), component


def original_state(transformer) -> dict:
    """The transformer's weights under its original names, by its layout's table."""
    rows = split.layout_of("zimage").table(dict(transformer.config))
    return layouts.to_original(rows, transformer.state_dict())


def test_original_layout_maps_both_ways_with_identical_weights():
    transformer = build_tiny_zimage_pipeline().transformer
    state = transformer.state_dict()

    original = original_state(transformer)

    assert "layers.0.attention.qkv.weight" in original
    assert "final_layer.adaLN_modulation.1.weight" in original
    assert "x_embedder.weight" in original and "layers.1.attention.out.weight" in original
    assert "noise_refiner.0.attention.q_norm.weight" in original
    assert not any("to_q" in k or "all_" in k for k in original)
    # The file is told apart and its config read from its own shapes, as the loader does.
    model = split.read_model({k: tuple(v.shape) for k, v in original.items()})
    assert model is not None and (model.layout, model.architecture) == ("zimage", "zimage-turbo")
    for key, value in transformer.config.items():
        if key in model.config:
            assert model.config[key] == (list(value) if isinstance(value, tuple) else value), key
    expected = {k: tuple(v.shape) for k, v in state.items()}
    back = layouts.to_diffusers(model.rows(), original, expected)
    assert set(back) == set(state)
    assert all(torch.equal(v, state[k]) for k, v in back.items())


def test_its_files_are_read_in_z_images_layout(tmp_path):
    pipeline = build_tiny_zimage_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "z_image_turbo")

    model = models.load_model(str(written["transformer"]))  # companions found beside it

    assert (model.format, model.architecture, model.prediction_type) == (
        "split_files",
        "zimage-turbo",
        "flow",
    )
    assert model.detected_because.startswith(
        "Z-Image Turbo, as the file's name says (nothing in the file tells Turbo from Base"
    )
    assert "2 main and 1+1 refiner blocks, 64 wide" in model.detected_because
    # Sampled with Turbo's schedule, as a diffusers folder of it is.
    scheduler = model.pipeline.scheduler.config
    assert all(scheduler[k] == v for k, v in ZIMAGE_SCHEDULER_CONFIG.items())


def test_split_files_given_by_flag_load_from_anywhere(tmp_path):
    pipeline = build_tiny_zimage_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "z_image_turbo")
    lone = tmp_path / "elsewhere" / "z_image.safetensors"
    lone.parent.mkdir()
    written["transformer"].rename(lone)

    model = models.load_model(
        str(lone), text_encoders=[str(written["text_encoder"])], vae=str(written["vae"])
    )

    same_weights(pipeline, model.pipeline)


def test_a_missing_companion_is_named_in_one_sentence(tmp_path):
    written = save_split_files(build_tiny_zimage_pipeline(), tmp_path / "models", "z_image")
    written["text_encoder"].unlink()

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]))

    message = str(caught.value)
    assert str(written["transformer"]) in message
    assert "needs its Qwen3 text encoder (qwen_3_4b)" in message
    assert "--text-encoder PATH" in message and "--vae" not in message
    assert "text_encoders" in message
    assert message.count(". ") == 0 and message.endswith(".")


def test_a_t5_given_as_its_text_encoder_is_refused(tmp_path):
    written = save_split_files(build_tiny_zimage_pipeline(), tmp_path / "models", "z_image")
    t5 = tmp_path / "t5xxl.safetensors"
    write_safetensors(t5, build_tiny_flux_pipeline().text_encoder_2.state_dict())

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]), text_encoders=[str(t5)])

    assert str(t5) in str(caught.value)
    assert (
        "T5 text encoder (Flux.1's, Chroma's or Stable Diffusion 3.x's), but the Z-Image "
        "transformer z_image.safetensors needs its Qwen3 text encoder (qwen_3_4b)."
    ) in str(caught.value)


def test_absurd_block_count_is_refused_before_anything_is_built(tmp_path):
    state = original_state(build_tiny_zimage_pipeline().transformer)
    state["layers.100000.attention.qkv.weight"] = state["layers.0.attention.qkv.weight"]
    hostile = tmp_path / "diffusion_models" / "z.safetensors"
    hostile.parent.mkdir()
    write_safetensors(hostile, {k: v.contiguous() for k, v in state.items()})

    with pytest.raises(HalfSafeError) as caught:
        models.load_model(str(hostile))

    assert "number of blocks (100001) is outside 1 to 128" in str(caught.value)


def test_cli_check_of_a_split_file_missing_its_vae_is_exit_2_with_one_line(tmp_path):
    import subprocess
    import sys

    written = save_split_files(build_tiny_zimage_pipeline(), tmp_path / "models", "z_image")
    written["vae"].unlink()

    done = subprocess.run(
        [sys.executable, "-m", "app", "check", str(written["transformer"]), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "needs its 16-channel VAE (Flux's ae)" in lines[0]
    assert "--vae PATH" in lines[0] and "--text-encoder" not in lines[0]


def test_library_lists_a_zimage_file_with_its_companions_or_the_missing_one(tmp_path):
    from app.core.library import scan_library

    root = tmp_path / "models"
    written = save_split_files(build_tiny_zimage_pipeline(), root, "z_image_turbo")
    folder = str(root / "diffusion_models")

    entries = scan_library([folder], include_defaults=False, use_cache=False)

    (entry,) = entries
    assert (entry.architecture, entry.format, entry.supported) == (
        "zimage-turbo",
        "split_files",
        True,
    )
    assert entry.detected_because and entry.detected_because.startswith("Z-Image Turbo,")
    assert entry.companions == {
        "text_encoder": str(written["text_encoder"]),
        "vae": str(written["vae"]),
    }
    assert entry.missing is None

    written["text_encoder"].unlink()
    (entry,) = scan_library([folder], include_defaults=False, use_cache=False)

    assert entry.architecture == "zimage-turbo" and entry.supported is False
    assert entry.companions == {"text_encoder": None, "vae": str(written["vae"])}
    assert entry.missing and "this Z-Image transformer file needs its Qwen3 text encoder" in (
        entry.missing
    )
