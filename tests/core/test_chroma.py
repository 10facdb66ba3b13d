"""What only Chroma (Flux-shaped, T5 as its only text encoder, real CFG) does, on a tiny pipeline
built in code: its transformer file in Black Forest Labs' layout, told apart from Flux.1's by
its keys, with a T5 file and Flux's VAE file beside it, and an overflow found in a model loaded
from it. A diffusers folder, the health check with planted overflows in the T5 feed-forward, a
double and a single block and the VAE, and generation repairing a single block are every
family's contract: test_families.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from app.core import models
from app.core.families import family_of
from app.core.families.chroma import ChromaFamily
from tests.support.family_helpers import (
    check,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.model_files import save_split_files
from tests.support.tiny_models import build_tiny_chroma_pipeline

COMPONENTS = ("text_encoder", "transformer", "vae")
SINGLE_LAYER = "single_transformer_blocks.1.proj_out"


# --- its transformer file, as ComfyUI users keep it ----------------------------------------


def test_its_transformer_file_keeps_the_approximator_and_is_named_chroma(tmp_path):
    pipeline = build_tiny_chroma_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "chroma-tiny")
    assert set(written) == {"transformer", "text_encoder", "vae"}
    header = models.read_safetensors_header(written["transformer"]).shapes()
    # Black Forest Labs' blocks, and the approximator where Flux has its modulation.
    assert "double_blocks.0.img_attn.qkv.weight" in header
    assert "distilled_guidance_layer.layers.0.in_layer.weight" in header
    assert not any(k.startswith(("vector_in.", "time_in.", "guidance_in.")) for k in header)
    assert not any(".img_mod." in k or ".modulation." in k for k in header)

    model = models.load_model(str(written["transformer"]))  # companions found beside it

    assert (model.architecture, model.format, model.prediction_type) == (
        "chroma",
        "split_files",
        "flow",
    )
    assert model.detected_because.startswith("Chroma: a Flux-shaped transformer")
    assert "distilled_guidance_layer" in model.detected_because
    assert "T5 features only" in model.detected_because
    assert isinstance(family_of(model.pipeline), ChromaFamily)


@pytest.mark.slow  # about 9 s here: a fresh interpreter imports torch and diffusers
def test_cli_missing_companion_is_exit_2_with_one_line(tmp_path):
    written = save_split_files(build_tiny_chroma_pipeline(), tmp_path / "models")
    written["text_encoder"].unlink()

    done = subprocess.run(
        [sys.executable, "-m", "app", "check", str(written["transformer"]), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert str(written["transformer"]) in lines[0]
    assert "this Chroma transformer file needs its T5 text encoder (t5xxl), which is" in lines[0]
    assert "--text-encoder PATH" in lines[0] and "--vae" not in lines[0]
    assert "Traceback" not in done.stderr


def test_overflow_in_a_loaded_split_file_model_is_found_with_its_layer(tmp_path):
    written = save_split_files(build_tiny_chroma_pipeline(), tmp_path / "models")
    model = models.load_model(str(written["transformer"]))
    with torch.no_grad():
        model.pipeline.transformer.get_submodule(SINGLE_LAYER).weight.mul_(1e6)

    report = check(model)

    assert report.verdict == "fixable"
    failed = {n for n, c in report.components.items() if c.status in ("overflow", "nan")}
    assert failed == {"transformer"}
    assert report.components["transformer"].first_bad_module == SINGLE_LAYER
    assert report.fix.verified is True


def test_library_tells_chroma_from_flux_by_its_keys_and_lists_its_companions(tmp_path):
    from app.core.library import scan_library
    from tests.support.tiny_models import build_tiny_flux_pipeline

    root = tmp_path / "models"
    save_split_files(build_tiny_flux_pipeline(), root, "flux1-dev")
    # Saved second, so the shared t5xxl and ae files beside both are Chroma's own.
    written = save_split_files(build_tiny_chroma_pipeline(), root, "chroma")
    folder = str(root / "diffusion_models")

    entries = scan_library([folder], include_defaults=False, use_cache=False)

    by_name = {e.path.rsplit("/", 1)[-1]: e for e in entries}
    assert by_name["flux1-dev.safetensors"].architecture == "flux-dev"
    chroma = by_name["chroma.safetensors"]
    assert (chroma.architecture, chroma.format, chroma.supported) == (
        "chroma",
        "split_files",
        True,
    )
    assert chroma.detected_because and chroma.detected_because.startswith("Chroma:")
    assert chroma.companions == {
        "text_encoder": str(written["text_encoder"]),
        "vae": str(written["vae"]),
    }
    assert chroma.missing is None

    written["vae"].unlink()
    entries = scan_library([folder], include_defaults=False, use_cache=False)

    chroma = next(e for e in entries if e.path.endswith("chroma.safetensors"))
    assert chroma.supported is False and chroma.companions == {
        "text_encoder": str(written["text_encoder"]),
        "vae": None,
    }
    assert chroma.missing and "this Chroma transformer file needs its 16-channel VAE (ae)" in (
        chroma.missing
    )
