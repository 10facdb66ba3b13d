"""Flux.2 editing and Klein's inpainting: dev and Klein, still detected as they were, edit the
reference pictures they are given with their own pipelines (which encode them, watched by a
hook on the VAE's encoder), and the check runs that path: the references through the VAE's
encoder, then normalised by its batch-norm statistics and read in the transformer's sequence
with the position ids the pipeline gives them. Klein inpaints a picture with a mask through
Flux2KleinInpaintPipeline, handed the picture's latents from HalfSafe's watched encoder.

Planted overflows (a layer's weights scaled past fp16, finite in fp32) in the transformer and
the VAE's encoder of an edit must be found at their layer, fixed in the check with a fix proved
against fp32 that touches only the part at fault, and repaired in generation.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from app.cli import main
from app.core import generation
from app.core.errors import HalfSafeError
from app.core.families import FamilyId, detect_from_configs, family, family_of
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
)

DEV, KLEIN = family(FamilyId("flux2")), family(FamilyId("flux2klein"))
SINGLE_BLOCK = "single_transformer_blocks.1.attn.to_out"  # as the Flux.2 conformance rows plant
ENCODER_LAYER = "encoder.down_blocks.0.resnets.0.conv1"  # the VAE encoder's first conv


@pytest.fixture
def references(tmp_path):
    """Three 64 px pictures of seeded colours."""
    rng = np.random.RandomState(0)
    paths = []
    for index in range(3):
        path = tmp_path / f"ref{index}.png"
        Image.fromarray((rng.rand(64, 64, 3) * 255).astype(np.uint8)).save(path)
        paths.append(str(path))
    return paths


@pytest.fixture
def mask(tmp_path):
    """A 64 px mask whose middle is white (painted again)."""
    values = np.zeros((64, 64), np.uint8)
    values[16:48, 16:48] = 255
    path = tmp_path / "mask.png"
    Image.fromarray(values).save(path)
    return str(path)


def _dev():
    return in_memory(tiny_models.build_tiny_flux2_pipeline(), "flux2-dev", "flux2-dev")


def _klein():
    return in_memory(tiny_models.build_tiny_flux2_klein_pipeline(), "klein", "flux2-klein")


def _request(tmp_path, images, **extra):
    """An edit job as test_edit makes one, in two steps."""
    return edit_request(tmp_path, images, **{"steps": 2, **extra})


def _check(model, images, mask=None):
    return edit_check(model, images, mask=mask)


# --- what each variant is and takes ----------------------------------------------------------


def test_detection_is_unchanged_and_both_variants_edit_their_own_number_of_pictures():
    transformer = dict(tiny_models.tiny_flux2_transformer(0, guidance=True, text=96).config)
    for class_name, encoder, architecture in (
        ("Flux2Pipeline", "Mistral3ForConditionalGeneration", "flux2-dev"),
        ("Flux2KleinPipeline", "Qwen3ForCausalLM", "flux2-klein"),
    ):
        index = {
            "_class_name": class_name,
            "transformer": ["diffusers", "Flux2Transformer2DModel"],
            "text_encoder": ["transformers", encoder],
        }
        found = detect_from_configs(index, transformer, {})
        assert (found.architecture, found.supported) == (architecture, True)
        assert found.pipeline_class == class_name
    dev, klein = (
        tiny_models.build_tiny_flux2_pipeline(),
        tiny_models.build_tiny_flux2_klein_pipeline(),
    )
    assert (family_of(dev), family_of(klein)) == (DEV, KLEIN)
    # No limit in diffusers' pipelines: Black Forest Labs' own counts (6 for dev, 4 for Klein).
    assert (DEV.max_references(dev), KLEIN.max_references(klein)) == (6, 4)
    assert mode_of(["a.png"] * 6, None, DEV.max_references(dev)) is Mode.EDIT
    assert mode_of(["a.png"], "m.png", KLEIN.max_references(klein)) is Mode.INPAINT
    # A picture alone is edited by both; only Klein takes a mask.
    assert DEV.picture_problem(dev, Mode.IMAGE) is None
    assert KLEIN.picture_problem(klein, Mode.INPAINT) is None
    assert "it takes no mask" in (DEV.picture_problem(dev, Mode.INPAINT) or "")


# --- the check's edit path -------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["dev", "klein"])
def test_the_probe_reads_the_references_as_the_pipeline_hands_them_to_the_transformer(
    variant, references
):
    """The first transformer call of the editing pipeline and of the check's probe, on the
    same noise at the same timestep: the same sequence (the noise, then each reference's
    latents normalised by the VAE's batch-norm statistics) and the same position ids."""
    pipeline = (
        tiny_models.build_tiny_flux2_pipeline()
        if variant == "dev"
        else tiny_models.build_tiny_flux2_klein_pipeline()
    )
    expected = family_of(pipeline)
    pictures = read_pictures(references[:2], None, 64, 64, references=2)
    assert pictures is not None
    with torch.inference_mode():
        conditioning = expected.encode(pipeline, "make it red", "", "cpu", True)
        noise = torch.randn((1, 128, 4, 4), generator=torch.Generator().manual_seed(0))
        latents = [
            expected.encode_pixels(pipeline.vae, pixels)
            for pixels in expected.edit_pixels(pipeline, pictures)
        ]
    scheduler = pipeline.scheduler
    theirs = first_transformer_call(
        pipeline.transformer,
        lambda: pipeline(
            **expected.edit_call(pipeline, conditioning, 1, None, pictures, (64, 64)),
            height=64,
            width=64,
            num_inference_steps=2,
            latents=noise,
            output_type="latent",
        ),
    )
    first = float(scheduler.timesteps[0])
    mine = first_transformer_call(
        pipeline.transformer,
        lambda: expected.probe_edit(pipeline, conditioning, 64, "cpu", [first], latents),
    )

    tokens = 4 * 4
    assert theirs["hidden_states"].shape == (1, tokens + 2 * tokens, 128)
    torch.testing.assert_close(mine["hidden_states"], theirs["hidden_states"], rtol=0, atol=1e-6)
    assert torch.equal(mine["img_ids"].long(), theirs["img_ids"].long())
    assert set(theirs["img_ids"][0, tokens:, 0].tolist()) == {10, 20}  # one time per reference
    torch.testing.assert_close(mine["timestep"], theirs["timestep"])


def test_a_healthy_model_is_checked_on_the_edit_path_in_fp16(references):
    report = _check(_klein(), references[:2])
    assert list(report.components) == ["text_encoder", "vae_encoder", "transformer", "vae"]
    assert report.verdict == "healthy"
    assert report.plan.dtypes["transformer"] == "fp16"


@pytest.mark.parametrize("build", [_dev, _klein], ids=["dev", "klein"])
def test_a_planted_transformer_overflow_in_an_edit_is_found_at_its_layer_and_fixed_there(
    build, references
):
    model = build()
    plant(model.pipeline, "transformer", SINGLE_BLOCK)

    report = _check(model, references[:2])

    assert report.verdict == "fixable"
    assert {n for n, c in report.components.items() if c.status.failed} == {"transformer"}
    assert report.components["transformer"].first_bad_module == SINGLE_BLOCK
    fix = report.fix
    assert fix is not None and fix.verified and fix.quality is not None and fix.quality.passed
    assert changed(report) == {"transformer"}
    fixed = fix.plan
    assert fixed.dtypes["transformer"] in ("bf16", "fp32") or any(
        island == SINGLE_BLOCK or SINGLE_BLOCK.startswith(island + ".")
        for island in fixed.islands("transformer")
    )


def test_a_planted_encoder_overflow_in_an_edit_is_found_as_the_vae_encoder_and_fixed(references):
    model = _klein()
    plant(model.pipeline, "vae", ENCODER_LAYER)

    report = _check(model, references[:2])

    encoder = report.components["vae_encoder"]
    assert encoder.status.failed and encoder.first_bad_module == ENCODER_LAYER
    assert not report.components["transformer"].status.failed  # fed the fixed latents
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    assert changed(report) == {"vae"}


# --- generation ------------------------------------------------------------------------------


def test_dev_edits_several_references_into_a_finite_picture_that_says_so(tmp_path, references):
    image = generation.generate(
        _dev(), _request(tmp_path, references[:2]), precision=FP16, device="cpu"
    ).images[0]
    assert image.status == "ok"
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()
    assert "Mode: edit" in image.parameters
    assert "Denoising strength" not in image.parameters  # an edit has no strength


def test_generation_repairs_a_planted_overflow_in_the_pipelines_own_encoding(tmp_path, references):
    """Flux.2's pipelines encode their references themselves: the watch's hook on the VAE's
    encoder must see that encoding go non-finite, and the repair must fix the VAE alone."""
    model = _klein()
    plant(model.pipeline, "vae", ENCODER_LAYER)

    image = generation.generate(
        model, _request(tmp_path, references[:2]), precision=FP16, device="cpu"
    ).images[0]

    assert image.status == "fixed" and image.component == "vae_encoder", image.message
    assert image.first_bad_module == ENCODER_LAYER
    assert image.fixes_applied and "VAE" in image.fixes_applied[0]
    layers = [m for key in ("fp32_modules", "bf16_modules") for m in image.fix.get(key, [])]
    assert all(m.startswith("vae:") for m in layers)
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()


# --- Klein's inpainting ----------------------------------------------------------------------


def test_klein_inpaints_a_picture_with_a_mask_and_says_so(tmp_path, references, mask):
    result = generation.generate(
        _klein(),
        _request(tmp_path, references[:1], mask=mask, strength=0.75, steps=4),
        precision=FP16,
        device="cpu",
    )
    image = result.images[0]
    assert image.status == "ok"
    assert "Mode: inpaint" in image.parameters and "Mask: mask.png" in image.parameters
    assert "Denoising strength: 0.75" in image.parameters


def test_the_check_of_klein_inpainting_reads_the_picture_in_the_sequence_as_its_pipeline_does(
    references, mask
):
    pipeline = tiny_models.build_tiny_flux2_klein_pipeline()
    pictures = read_pictures(references[:1], mask, 64, 64, references=4)
    assert pictures is not None and pictures.mode is Mode.INPAINT
    with torch.inference_mode():
        conditioning = KLEIN.encode(pipeline, "a red cube", "", "cpu", True)
        latents = KLEIN.encode_pixels(pipeline.vae, pictures.pixels).float()
    inpainting = KLEIN.picture_pipeline(pipeline, Mode.INPAINT, latents.shape[1])
    theirs = first_transformer_call(
        pipeline.transformer,
        lambda: inpainting(
            **KLEIN.pipeline_embeds(conditioning, 1),
            image=latents,
            mask_image=pictures.mask_image,
            strength=1.0,
            num_inference_steps=2,
            generator=torch.Generator().manual_seed(0),
            output_type="latent",
        ),
    )
    in_sequence = KLEIN.sequence_latents(
        pipeline, Mode.INPAINT, [latents, torch.zeros_like(latents)]
    )
    assert in_sequence is not None
    mine = first_transformer_call(
        pipeline.transformer,
        lambda: KLEIN.probe_edit(pipeline, conditioning, 64, "cpu", [1000.0], in_sequence),
    )

    tokens = 4 * 4  # the noise's, then the picture's: the same latents, the same positions
    torch.testing.assert_close(
        mine["hidden_states"][:, tokens:], theirs["hidden_states"][:, tokens:], rtol=0, atol=1e-6
    )
    assert torch.equal(mine["img_ids"].long(), theirs["img_ids"].long())


def test_klein_inpainting_repairs_a_planted_encoder_overflow(tmp_path, references, mask):
    model = _klein()
    plant(model.pipeline, "vae", ENCODER_LAYER)
    image = generation.generate(
        model, _request(tmp_path, references[:1], mask=mask), precision=FP16, device="cpu"
    ).images[0]
    assert image.status == "fixed" and image.component == "vae_encoder", image.message
    assert image.first_bad_module == ENCODER_LAYER
    assert "NaN component: vae_encoder" in image.parameters


# --- refusals --------------------------------------------------------------------------------


def test_what_flux2_cannot_take_is_one_sentence(tmp_path, references, mask):
    dev = _dev()
    with pytest.raises(HalfSafeError, match="it takes no mask") as caught:
        generation.generate(dev, _request(tmp_path, references[:1], mask=mask), precision=FP16)
    assert "\n" not in str(caught.value)
    with pytest.raises(HalfSafeError, match="2 input pictures were given with a mask"):
        generation.generate(_klein(), _request(tmp_path, references[:2], mask=mask), precision=FP16)
    # Its pipeline refuses a reference whose long side is over 8 times its short one.
    with pytest.raises(HalfSafeError, match="at most 8 times the short one, not 576x64"):
        generation.generate(
            dev, _request(tmp_path, references[:1], width=576, height=64), precision=FP16
        )


def test_the_command_refuses_more_references_than_dev_takes_in_one_line(
    tmp_path, references, capsys
):
    tiny_models.build_tiny_flux2_pipeline().save_pretrained(tmp_path / "dev")
    argv = ["generate", str(tmp_path / "dev"), "--steps", "2", "--width", "64", "--height", "64"]
    argv += ["--out", str(tmp_path / "out"), "--json", "--device", "cpu", "--precision", "fp16"]
    for picture in references[:2]:
        argv += ["--image", picture]
    assert main(argv) == 0
    images = json.loads(capsys.readouterr().out)["images"]
    assert [image["status"] for image in images] == ["ok"]

    seven = argv + [
        arg for picture in references[:3] + references[:2] for arg in ("--image", picture)
    ]
    assert main(seven) == 2
    err = without_progress(capsys.readouterr().err)
    said = [line for line in err.splitlines() if line.startswith("halfsafe: ")]
    # Told from the folder's configs before it loads.
    assert said == [
        "halfsafe: 7 pictures were given; dev is a Flux.2 model, which takes at most 6."
    ]
    assert "Traceback" not in err
