"""Flux.1 Depth and Canny: control models, recognised as a diffusers folder
(FluxControlPipeline) and as a transformer file in Black Forest Labs' layout (128 input
channels: the noise's 64 and, beside them, a control picture's latents). Given a picture (a
depth map or an edge picture, which the user makes), the job draws from noise with every step
after it (`Mode.CONTROL`, no strength); the picture goes through HalfSafe's watched VAE-encoder
stage and its latents are handed to the pipeline; the check runs that path, reading them in the
transformer's channels as the pipeline does. Planted overflows in the transformer and the VAE
encoder are found at their layer and fixed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
from PIL import Image

from app.cli import main
from app.core import generation, models
from app.core.errors import HalfSafeError
from app.core.families import architecture_title, detect_from_configs, family_of
from app.core.families.flux import FluxFamily
from app.core.health.check import WITHOUT_PICTURE
from app.core.images.pictures import Mode, mode_of, read_pictures
from tests.support import tiny_models
from tests.support.cli_output import without_progress
from tests.support.edit_checks import (
    changed,
    edit_check,
    edit_request,
    first_transformer_call,
    plant,
)
from tests.support.family_helpers import (
    FP16,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
    same_weights,
)
from tests.support.model_files import save_split_files

SINGLE_BLOCK = "single_transformer_blocks.1.proj_out"  # as the Flux.1 conformance row plants
ENCODER_LAYER = "encoder.down_blocks.0.resnets.0.conv1"  # the VAE encoder's first conv
PARTS = ("text_encoder", "text_encoder_2", "transformer", "vae")


def _depth_map(path, direction: str = "down") -> str:
    """A 64 px grey ramp, as a depth map looks."""
    down = np.repeat(np.linspace(0, 255, 64, dtype=np.float32)[:, None], 64, axis=1)
    values = down if direction == "down" else down.T
    Image.fromarray(values.astype(np.uint8)).convert("RGB").save(path)
    return str(path)


@pytest.fixture
def depth(tmp_path):
    return _depth_map(tmp_path / "depth.png")


def _control(key="control"):
    return in_memory(tiny_models.build_tiny_flux_control_pipeline(), key, "flux-control")


def _request(tmp_path, picture, **extra):
    return edit_request(tmp_path, [picture] if picture else [], **{"steps": 3, **extra})


# --- what it is ------------------------------------------------------------------------------


def test_a_control_folder_loads_back_offline_and_a_picture_alone_is_its_control(tmp_path):
    pipeline = tiny_models.build_tiny_flux_control_pipeline()
    pipeline.save_pretrained(tmp_path / "depth")
    index = {"_class_name": "FluxControlPipeline", "transformer": ["diffusers", "x"]}
    found = detect_from_configs(index, dict(pipeline.transformer.config), {})
    assert (found.architecture, found.supported) == ("flux-control", True)

    model = models.load_model(str(tmp_path / "depth"))

    assert (model.architecture, model.format) == ("flux-control", "diffusers")
    assert type(model.pipeline).__name__ == "FluxControlPipeline"
    family = family_of(model.pipeline)
    assert isinstance(family, FluxFamily) and family.takes_control(model.pipeline)
    assert model.detected_because.startswith("Flux.1 Depth or Canny: its FluxControlPipeline")
    assert architecture_title("flux-control") == "Flux.1 Depth or Canny"
    same_weights(pipeline, model.pipeline, PARTS)
    assert mode_of(["d.png"], None, control=True) is Mode.CONTROL
    assert mode_of(["d.png"], None) is Mode.IMAGE  # for any other model


def test_a_control_transformer_file_in_black_forest_labs_layout_loads_with_its_companions(
    tmp_path,
):
    pipeline = tiny_models.build_tiny_flux_control_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "flux1-depth-dev")
    shapes = models.read_safetensors_header(written["transformer"]).shapes()
    assert tuple(shapes["img_in.weight"]) == (64, 128)

    model = models.load_model(str(written["transformer"]))

    assert (model.architecture, model.format) == ("flux-control", "split_files")
    assert type(model.pipeline).__name__ == "FluxControlPipeline"
    assert "a control picture's latents" in model.detected_because
    same_weights(pipeline, model.pipeline, PARTS)


def test_what_a_control_model_cannot_take_is_one_sentence(tmp_path, depth):
    model = _control()
    with pytest.raises(HalfSafeError, match="give it the control picture it follows") as caught:
        generation.generate(model, _request(tmp_path, None), precision=FP16)
    assert str(caught.value).startswith("control: this is Flux.1 Depth or Canny, a control model")
    with pytest.raises(HalfSafeError, match="it takes no mask"):
        generation.generate(model, _request(tmp_path, depth, mask=depth), precision=FP16)
    with pytest.raises(HalfSafeError, match="2 pictures were given; a control model follows one"):
        generation.generate(model, edit_request(tmp_path, [depth, depth], steps=2), precision=FP16)


# --- the check reads what the pipeline reads --------------------------------------------------


def test_the_probe_reads_the_control_picture_as_the_pipeline_does(depth, monkeypatch):
    """The first transformer call of FluxControlPipeline, given the picture's pixels to encode
    itself, and of the check's probe: the same control latents in the same 64 channels. The
    pipeline samples the VAE's distribution where HalfSafe takes its mode: it is made to take
    the mode too, so that the layouts compare exactly."""
    monkeypatch.setattr(
        DiagonalGaussianDistribution, "sample", lambda self, generator=None: self.mode()
    )
    pipeline = tiny_models.build_tiny_flux_control_pipeline()
    family = family_of(pipeline)
    pictures = read_pictures([depth], None, 64, 64, control=True)
    assert pictures is not None and pictures.mode is Mode.CONTROL
    with torch.inference_mode():
        conditioning = family.encode(pipeline, "a room", "", "cpu", True)
        noise, _ = family.noise(pipeline, [0], 64, 64)
        latents = family.encode_pixels(pipeline.vae, pictures.pixels).float()
    theirs = first_transformer_call(
        pipeline.transformer,
        lambda: pipeline(
            **family.pipeline_embeds(conditioning, 1),
            control_image=pictures.pixels,
            height=64,
            width=64,
            latents=noise,
            num_inference_steps=2,
            output_type="latent",
        ),
    )
    # And as the generation hands it over: HalfSafe's latents, packed.
    handed = first_transformer_call(
        pipeline.transformer,
        lambda: pipeline(
            **family.pipeline_embeds(conditioning, 1),
            **family.control_call(pipeline, latents),
            height=64,
            width=64,
            latents=noise,
            num_inference_steps=2,
            output_type="latent",
        ),
    )
    beside = family.sequence_latents(pipeline, Mode.CONTROL, latents)
    assert beside is not None
    first = float(pipeline.scheduler.timesteps[0])
    mine = first_transformer_call(
        pipeline.transformer,
        lambda: family.probe_edit(pipeline, conditioning, 64, "cpu", [first], beside),
    )

    assert theirs["hidden_states"].shape == (1, 16, 128)
    torch.testing.assert_close(handed["hidden_states"], theirs["hidden_states"], rtol=0, atol=1e-5)
    torch.testing.assert_close(
        mine["hidden_states"][..., 64:], theirs["hidden_states"][..., 64:], rtol=0, atol=1e-5
    )
    assert torch.equal(mine["img_ids"], theirs["img_ids"])


def test_a_healthy_control_model_is_checked_on_its_control_path_in_fp16(depth):
    report = edit_check(_control(), [depth])
    assert list(report.components) == [
        "text_encoder",
        "text_encoder_2",
        "vae_encoder",
        "transformer",
        "vae",
    ]
    assert report.verdict == "healthy"


def test_a_check_without_the_control_picture_says_what_it_did_not_check(depth):
    """A control model cannot draw from text alone: its check without a picture probes the
    transformer on zeros where the picture goes, and the report says so (a check with the
    picture does not)."""
    without = edit_check(_control(), [])
    assert "vae_encoder" not in without.components
    assert WITHOUT_PICTURE[Mode.CONTROL] in without.notes
    assert not set(WITHOUT_PICTURE.values()) & set(edit_check(_control(), [depth]).notes)


def test_a_planted_transformer_overflow_is_found_at_its_layer_and_fixed_there(depth):
    model = _control()
    plant(model.pipeline, "transformer", SINGLE_BLOCK)

    report = edit_check(model, [depth])

    assert report.verdict == "fixable"
    assert {n for n, c in report.components.items() if c.status.failed} == {"transformer"}
    assert report.components["transformer"].first_bad_module == SINGLE_BLOCK
    assert report.fix is not None and report.fix.verified
    assert changed(report) == {"transformer"}


def test_a_planted_encoder_overflow_is_found_as_the_vae_encoder_and_fixed(depth):
    model = _control()
    plant(model.pipeline, "vae", ENCODER_LAYER)

    report = edit_check(model, [depth])

    encoder = report.components["vae_encoder"]
    assert encoder.status.failed and encoder.first_bad_module == ENCODER_LAYER
    assert not report.components["transformer"].status.failed  # fed the fixed latents
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    assert changed(report) == {"vae"}


# --- generation ------------------------------------------------------------------------------


def test_a_control_picture_is_followed_from_noise_and_the_image_says_so(tmp_path, depth):
    steps: list[int] = []
    result = generation.generate(
        _control(),
        _request(tmp_path, depth),
        precision=FP16,
        device="cpu",
        on_progress=lambda stage, step, total: steps.append(total),
    )
    image = result.images[0]
    assert image.status == "ok"
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()
    assert "Mode: control" in image.parameters and "Input picture: depth.png" in image.parameters
    assert "Denoising strength" not in image.parameters  # it has none
    assert 3 in steps  # every step ran


def test_the_control_picture_decides_what_is_drawn(tmp_path, depth):
    model = _control()
    first = generation.generate(model, _request(tmp_path, depth), precision=FP16).images[0]
    across = _depth_map(tmp_path / "across.png", "across")
    other = generation.generate(model, _request(tmp_path, across), precision=FP16).images[0]
    assert not np.array_equal(np.asarray(first.image), np.asarray(other.image))


def test_generation_repairs_a_planted_encoder_overflow(tmp_path, depth):
    model = _control()
    plant(model.pipeline, "vae", ENCODER_LAYER)

    image = generation.generate(
        model, _request(tmp_path, depth), precision=FP16, device="cpu"
    ).images[0]

    assert image.status == "fixed" and image.component == "vae_encoder", image.message
    assert image.first_bad_module == ENCODER_LAYER
    assert set(image.fix) <= {"vae_precision", "fp32_modules", "bf16_modules"}
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()


def test_generation_repairs_a_planted_transformer_overflow(tmp_path, depth):
    model = _control()
    plant(model.pipeline, "transformer", SINGLE_BLOCK)

    image = generation.generate(
        model, _request(tmp_path, depth), precision=FP16, device="cpu"
    ).images[0]

    assert image.status == "fixed" and image.component == "transformer", image.message
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()


def test_the_command_follows_a_control_picture_and_refuses_none(tmp_path, depth, capsys):
    tiny_models.build_tiny_flux_control_pipeline().save_pretrained(tmp_path / "depth-model")
    argv = ["generate", str(tmp_path / "depth-model"), "--steps", "2", "--width", "64"]
    argv += ["--height", "64", "--out", str(tmp_path / "out"), "--json", "--device", "cpu"]
    argv += ["--precision", "fp16"]
    assert main([*argv, "--image", depth]) == 0
    images = json.loads(capsys.readouterr().out)["images"]
    assert [image["status"] for image in images] == ["ok"]

    assert main(argv) == 2
    err = without_progress(capsys.readouterr().err)
    said = [line for line in err.splitlines() if line.startswith("halfsafe: ")]
    assert said == [
        "halfsafe: depth-model: this is Flux.1 Depth or Canny, a control model: give it the "
        "control picture it follows (a depth map or an edge picture)."
    ]
    assert "Traceback" not in err


def test_the_summary_tells_the_window_it_takes_a_control_picture():
    from app.core.models.summary import summarise

    summary = summarise(_control(), device="cpu")
    assert summary.control and summary.references == 0
    assert Mode.CONTROL in summary.draws_from_noise
    assert "it takes no mask" in summary.picture_modes[Mode.INPAINT]
    assert summary.picture_modes[Mode.IMAGE] == ""  # a picture alone is its control picture


def test_a_side_its_patches_do_not_tile_is_one_sentence_not_a_crash(tmp_path, depth):
    # 72 px is nine latent cells: the control latents cannot be packed in 2x2 patches.
    with pytest.raises(HalfSafeError, match="sides are multiples of 16 px, not 72x64"):
        generation.generate(_control(), _request(tmp_path, depth, width=72), precision=FP16)


def test_a_strength_asked_of_a_control_model_is_said_not_to_apply(tmp_path, depth):
    result = generation.generate(
        _control(), _request(tmp_path, depth, strength=0.4), precision=FP16, device="cpu"
    )
    assert [warning for warning in result.warnings if "strength" in warning] == [
        "A control model draws from noise with every step, after the picture, so the strength "
        "0.4 does not apply to it."
    ]
    assert "Denoising strength" not in result.images[0].parameters


def test_a_mask_is_what_a_control_model_is_refused_for_however_many_pictures(tmp_path, depth):
    for pictures in ([depth], [depth, depth]):
        request = edit_request(tmp_path, pictures, steps=2, mask=depth, strength=7.0)
        with pytest.raises(HalfSafeError, match="it takes no mask"):
            generation.generate(_control(), request, precision=FP16)
