"""Flux.1 Fill, recognised as a diffusers folder (FluxFillPipeline) and as a transformer file
in Black Forest Labs' layout (384 input channels: the noise's 64, and beside them the masked
picture's latents, 64, and the mask, 256). It inpaints a picture with a mask from noise with
every step, so no strength applies; its pipeline encodes the masked picture itself, watched by
hooks on the VAE's encoder; and the check runs that path, reading the masked picture and the
mask in the transformer's channels as the pipeline does. Planted overflows in its transformer
and VAE encoder are found at their layer and fixed. (Depth and Canny, which read a control
picture there: test_flux_control.py.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from diffusers.pipelines.flux import pipeline_flux_fill
from PIL import Image

from app.cli import main
from app.core import generation, models
from app.core.errors import HalfSafeError
from app.core.families import architecture_title, family_of
from app.core.families.flux import FluxFamily
from app.core.health.check import WITHOUT_PICTURE
from app.core.images.pictures import Mode, read_pictures
from app.core.library import scan_library
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


@pytest.fixture
def picture(tmp_path):
    """A 64 px picture of seeded colours."""
    path = tmp_path / "picture.png"
    rng = np.random.RandomState(0)
    Image.fromarray((rng.rand(64, 64, 3) * 255).astype(np.uint8)).save(path)
    return str(path)


@pytest.fixture
def mask(tmp_path):
    """A 64 px mask whose middle is white (painted again)."""
    values = np.zeros((64, 64), np.uint8)
    values[16:48, 16:40] = 255
    path = tmp_path / "mask.png"
    Image.fromarray(values).save(path)
    return str(path)


def _fill(key="fill"):
    return in_memory(tiny_models.build_tiny_flux_fill_pipeline(), key, "flux-fill")


def _request(tmp_path, picture, mask, **extra):
    return edit_request(tmp_path, [picture], **{"steps": 3, "mask": mask, **extra})


def _listed(transformer):
    """The library's entries for the folder a transformer file is in."""
    return scan_library([str(transformer.parent)], include_defaults=False, use_cache=False)


# --- what it is ------------------------------------------------------------------------------


def test_a_fill_folder_loads_back_offline_as_flux_fill(tmp_path):
    pipeline = tiny_models.build_tiny_flux_fill_pipeline()
    pipeline.save_pretrained(tmp_path / "fill")

    model = models.load_model(str(tmp_path / "fill"))

    assert (model.architecture, model.format) == ("flux-fill", "diffusers")
    assert type(model.pipeline).__name__ == "FluxFillPipeline"
    assert isinstance(family_of(model.pipeline), FluxFamily)
    assert model.detected_because.startswith("Flux.1 Fill: its FluxFillPipeline")
    assert "384 input channels" in model.detected_because
    assert architecture_title("flux-fill") == "Flux.1 Fill"
    same_weights(pipeline, model.pipeline, ("text_encoder", "text_encoder_2", "transformer", "vae"))


def test_a_fill_transformer_file_in_black_forest_labs_layout_loads_with_its_companions(tmp_path):
    pipeline = tiny_models.build_tiny_flux_fill_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "flux1-fill-dev")
    shapes = models.read_safetensors_header(written["transformer"]).shapes()
    assert tuple(shapes["img_in.weight"]) == (64, 384)

    model = models.load_model(str(written["transformer"]))

    assert (model.architecture, model.format) == ("flux-fill", "split_files")
    assert type(model.pipeline).__name__ == "FluxFillPipeline"
    assert "Black Forest Labs' layout" in model.detected_because
    same_weights(pipeline, model.pipeline, ("text_encoder", "text_encoder_2", "transformer", "vae"))
    (entry,) = _listed(written["transformer"])
    assert (entry.architecture, entry.supported) == ("flux-fill", True)


@pytest.mark.parametrize("stored", ["gguf-q8_0", "fp8-scaled"])
def test_a_quantized_fill_transformer_loads_and_inpaints(tmp_path, stored, picture, mask):
    """Fill as the ecosystem ships it quantized (city96's GGUF, ComfyUI's scaled fp8): read
    through the same layout, told Fill by its 384 input channels, and it inpaints."""
    from gguf import GGMLQuantizationType

    from app.core.checkpoint import Checkpoint, write_safetensors
    from tests.support.quantized_files import fp8_scaled, gguf_split_set

    pipeline = tiny_models.build_tiny_flux_fill_pipeline()
    if stored == "gguf-q8_0":
        _, _, path = gguf_split_set(
            tmp_path, pipeline, GGMLQuantizationType.Q8_0, name="flux1-fill-dev"
        )
    else:
        written = save_split_files(pipeline, tmp_path / "models", "flux1-fill-dev")
        with Checkpoint(written["transformer"]) as checkpoint:
            original = {k: checkpoint.get(k).clone() for k in checkpoint.shapes}
        quantized, _ = fp8_scaled(original, style="weight_scale", per_row=True)
        path = write_safetensors(written["transformer"], quantized)

    model = models.load_model(str(path))

    assert (model.architecture, type(model.pipeline).__name__) == ("flux-fill", "FluxFillPipeline")
    assert model.quantization is not None
    assert model.quantization.to_json()["format"] == (
        "gguf" if stored == "gguf-q8_0" else "fp8_scaled"
    )
    assert model.weights.non_finite == [] and model.weights.bad_quantized == []
    image = generation.generate(
        model, _request(tmp_path, picture, mask, steps=2), precision=FP16, device="cpu"
    ).images[0]
    assert image.status == "ok"


def test_fill_inpaints_only_and_says_so_for_other_jobs(tmp_path, picture):
    model = _fill()
    family = family_of(model.pipeline)
    assert family.picture_problem(model.pipeline, Mode.INPAINT) is None
    assert family.redraws_from_noise(model.pipeline, Mode.INPAINT)
    # A regular Flux.1 inpaints from the picture's latents, at the strength.
    dev = tiny_models.build_tiny_flux_pipeline()
    assert not family.redraws_from_noise(dev, Mode.INPAINT)
    with pytest.raises(HalfSafeError, match="give it a mask with the picture") as caught:
        generation.generate(model, edit_request(tmp_path, [picture]), precision=FP16)
    assert str(caught.value).startswith("fill: this is Flux.1 Fill, an inpainting model")
    with pytest.raises(HalfSafeError, match="give it a picture and a mask"):
        generation.generate(model, edit_request(tmp_path, []), precision=FP16)


def test_the_summary_tells_the_window_which_jobs_draw_from_noise_and_how_many_pictures_edit():
    from app.core.models.summary import summarise

    fill = summarise(_fill(), device="cpu")
    assert (fill.references, fill.draws_from_noise) == (0, (Mode.INPAINT,))
    assert fill.picture_modes[Mode.INPAINT] == ""
    assert "give it a mask" in fill.picture_modes[Mode.IMAGE]
    kontext = in_memory(tiny_models.build_tiny_flux_kontext_pipeline(), "k", "flux-kontext")
    summary = summarise(kontext, device="cpu")
    assert (summary.references, summary.draws_from_noise) == (1, (Mode.EDIT,))


# --- the check reads what the pipeline reads --------------------------------------------------


def test_the_probe_reads_the_masked_picture_and_the_mask_as_the_pipeline_does(
    picture, mask, monkeypatch
):
    """The first transformer call of FluxFillPipeline and of the check's probe on the same
    noise: the same 384 channels per token. The pipeline samples the masked picture's latents
    from the VAE's distribution where HalfSafe takes its mode (the same latents every run):
    the pipeline is made to take the mode too, so that the layouts can be compared exactly."""
    monkeypatch.setattr(
        pipeline_flux_fill,
        "retrieve_latents",
        lambda output, generator=None: output.latent_dist.mode(),
    )
    pipeline = tiny_models.build_tiny_flux_fill_pipeline()
    family = family_of(pipeline)
    pictures = read_pictures([picture], mask, 64, 64)
    assert pictures is not None and pictures.mode is Mode.INPAINT
    with torch.inference_mode():
        conditioning = family.encode(pipeline, "a red cube", "", "cpu", True)
        noise, _ = family.noise(pipeline, [0], 64, 64)
        masked = family.encode_pixels(pipeline.vae, pictures.masked_pixels()).float()
    theirs = first_transformer_call(
        pipeline.transformer,
        lambda: pipeline(
            **family.pipeline_embeds(conditioning, 1),
            **family.own_encoding_call(pipeline, pictures),
            height=64,
            width=64,
            latents=noise,
            num_inference_steps=2,
            output_type="latent",
        ),
    )
    beside = family.sequence_latents(pipeline, Mode.INPAINT, [None, masked], pictures.mask)
    assert beside is not None
    first = float(pipeline.scheduler.timesteps[0])
    mine = first_transformer_call(
        pipeline.transformer,
        lambda: family.probe_edit(pipeline, conditioning, 64, "cpu", [first], beside),
    )

    tokens = 4 * 4
    assert theirs["hidden_states"].shape == (1, tokens, 384)
    # The noise differs (the probe's own seed); what is read beside it must not.
    torch.testing.assert_close(
        mine["hidden_states"][..., 64:], theirs["hidden_states"][..., 64:], rtol=0, atol=1e-5
    )
    mask_part = theirs["hidden_states"][0, :, 128:]
    assert set(mask_part.unique().tolist()) == {0.0, 1.0}  # the hard mask, 8x8 per latent cell
    assert torch.equal(mine["img_ids"], theirs["img_ids"])


def test_a_healthy_fill_is_checked_on_its_inpainting_path_in_fp16(picture, mask):
    report = edit_check(_fill(), [picture], mask=mask)
    assert list(report.components) == ["text_encoder", "text_encoder_2", "vae_encoder"] + [
        "transformer",
        "vae",
    ]
    assert report.verdict == "healthy"
    assert not set(WITHOUT_PICTURE.values()) & set(report.notes)
    # Checked without its picture, the report says which path it did not check.
    without = edit_check(_fill(), [])
    assert "vae_encoder" not in without.components
    assert WITHOUT_PICTURE[Mode.INPAINT] in without.notes


def test_a_planted_transformer_overflow_in_fill_is_found_at_its_layer_and_fixed_there(
    picture, mask
):
    model = _fill()
    plant(model.pipeline, "transformer", SINGLE_BLOCK)

    report = edit_check(model, [picture], mask=mask)

    assert report.verdict == "fixable"
    assert {n for n, c in report.components.items() if c.status.failed} == {"transformer"}
    assert report.components["transformer"].first_bad_module == SINGLE_BLOCK
    assert report.fix is not None and report.fix.verified
    assert changed(report) == {"transformer"}


def test_a_planted_encoder_overflow_in_fill_is_found_as_the_vae_encoder_and_fixed(picture, mask):
    model = _fill()
    plant(model.pipeline, "vae", ENCODER_LAYER)

    report = edit_check(model, [picture], mask=mask)

    encoder = report.components["vae_encoder"]
    assert encoder.status.failed and encoder.first_bad_module == ENCODER_LAYER
    assert not report.components["transformer"].status.failed  # fed the fixed latents
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    assert changed(report) == {"vae"}


# --- generation ------------------------------------------------------------------------------


def test_fill_inpaints_from_noise_with_every_step_and_its_record_says_strength_1(
    tmp_path, picture, mask
):
    steps: list[int] = []
    result = generation.generate(
        _fill(),
        _request(tmp_path, picture, mask),
        precision=FP16,
        device="cpu",
        on_progress=lambda stage, step, total: steps.append(total),
    )
    image = result.images[0]
    assert image.status == "ok"
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()
    assert "Mode: inpaint" in image.parameters and "Mask: mask.png" in image.parameters
    assert "Denoising strength: 1.0," in image.parameters
    assert result.request.strength == 1.0
    assert 3 in steps  # every step ran, not 0.75 of them
    assert not any("strength" in warning for warning in result.warnings)  # unasked: no word


def test_a_strength_asked_of_fill_is_said_not_to_apply(tmp_path, picture, mask):
    result = generation.generate(
        _fill(), _request(tmp_path, picture, mask, strength=0.4), precision=FP16, device="cpu"
    )
    assert result.request.strength == 1.0
    assert [warning for warning in result.warnings if "strength" in warning] == [
        "This model draws the masked area from noise with every step, so the strength 0.4 "
        "does not apply to it: it ran at 1."
    ]


def test_the_mask_decides_what_fill_draws(tmp_path, picture, mask):
    """Beside the same noise, another mask makes another picture: the mask reaches the
    transformer."""
    model = _fill()
    first = generation.generate(model, _request(tmp_path, picture, mask), precision=FP16).images[0]
    other_mask = tmp_path / "other.png"
    values = np.zeros((64, 64), np.uint8)
    values[:, :32] = 255
    Image.fromarray(values).save(other_mask)
    other = generation.generate(
        model, _request(tmp_path, picture, str(other_mask)), precision=FP16
    ).images[0]
    assert not np.array_equal(np.asarray(first.image), np.asarray(other.image))


def test_generation_repairs_a_planted_overflow_in_fills_own_encoding(tmp_path, picture, mask):
    """FluxFillPipeline encodes the masked picture itself: the hook on the VAE's encoder must
    see that go non-finite, and the repair must fix the VAE alone."""
    model = _fill()
    plant(model.pipeline, "vae", ENCODER_LAYER)

    image = generation.generate(
        model, _request(tmp_path, picture, mask), precision=FP16, device="cpu"
    ).images[0]

    assert image.status == "fixed" and image.component == "vae_encoder", image.message
    assert image.first_bad_module == ENCODER_LAYER
    assert image.fixes_applied and "VAE" in image.fixes_applied[0]
    assert set(image.fix) <= {"vae_precision", "fp32_modules", "bf16_modules"}
    layers = [m for key in ("fp32_modules", "bf16_modules") for m in image.fix.get(key, [])]
    assert all(m.startswith("vae:") for m in layers)
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()


def test_generation_repairs_a_planted_transformer_overflow_in_fill(tmp_path, picture, mask):
    model = _fill()
    plant(model.pipeline, "transformer", SINGLE_BLOCK)

    image = generation.generate(
        model, _request(tmp_path, picture, mask), precision=FP16, device="cpu"
    ).images[0]

    assert image.status == "fixed" and image.component == "transformer", image.message
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()


def test_the_command_inpaints_with_a_fill_folder_and_refuses_it_a_picture_alone(
    tmp_path, picture, mask, capsys
):
    tiny_models.build_tiny_flux_fill_pipeline().save_pretrained(tmp_path / "fill")
    argv = ["generate", str(tmp_path / "fill"), "--steps", "2", "--width", "64", "--height", "64"]
    argv += ["--out", str(tmp_path / "out"), "--json", "--device", "cpu", "--precision", "fp16"]
    argv += ["--image", picture]
    assert main([*argv, "--mask", mask]) == 0
    images = json.loads(capsys.readouterr().out)["images"]
    assert [image["status"] for image in images] == ["ok"]

    assert main(argv) == 2
    err = without_progress(capsys.readouterr().err)
    said = [line for line in err.splitlines() if line.startswith("halfsafe: ")]
    assert said == [
        "halfsafe: fill: this is Flux.1 Fill, an inpainting model: give it a mask with the "
        "picture (white where it paints)."
    ]
    assert "Traceback" not in err
