"""Qwen-Image 2.1 editing: the one QwenImage21Pipeline edits up to 10 condition pictures given
alone (its text encoder reads them as vision tokens beside the prompt, and their latents lead
the transformer's sequence). Generation hands the pipeline the prompt its watched stage
encoded, with the mask of which tokens are the pictures' (the pipeline's call takes no such
mask, so its `encode_prompt` is handed the stage's), and the pipeline encodes the pictures
itself under the watch's hook on the VAE's encoder; the check runs the same path.

Planted overflows (a layer's weights scaled past fp16, finite in fp32) in the transformer and
the VAE's encoder of an edit must be found at their layer, fixed in the check with a fix proved
against fp32 that touches only the part at fault, and repaired in generation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from app.core import generation
from app.core.families import FamilyId, family, family_of
from app.core.images.pictures import Mode, mode_of, read_pictures
from tests.support import tiny_models
from tests.support.edit_checks import (
    changed,
    edit_check,
    edit_request,
    first_transformer_call,
    plant,
    smaller_qwenimage21_pictures,  # noqa: F401 - a fixture, used by every test here
)
from tests.support.family_helpers import (
    FP16,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
)

QWEN21 = family(FamilyId("qwenimage21"))
BLOCK = "transformer_blocks.0.img_mlp.out"  # a block's feed-forward output
ENCODER_LAYER = "encoder.down_blocks.0.resnets.0.conv1"  # the VAE encoder's first block's conv


# Each picture read at 256 px square's area, not a megapixel (`QWENIMAGE21_EDIT_SIZE`).
pytestmark = pytest.mark.usefixtures("smaller_qwenimage21_pictures")


@pytest.fixture
def references(tmp_path):
    """Two pictures of seeded colours, one wider than high."""
    rng = np.random.RandomState(0)
    paths = []
    for index, (height, width) in enumerate([(64, 64), (48, 96)]):
        path = tmp_path / f"ref{index}.png"
        Image.fromarray((rng.rand(height, width, 3) * 255).astype(np.uint8)).save(path)
        paths.append(str(path))
    return paths


def _model():
    pipeline = tiny_models.build_tiny_qwenimage21_pipeline()
    return in_memory(pipeline, "qwen21", "qwenimage21")


def test_a_qwen_image_21_model_edits_up_to_ten_pictures_given_alone_and_still_draws_from_text():
    pipeline = tiny_models.build_tiny_qwenimage21_pipeline()
    assert family_of(pipeline) is QWEN21
    assert QWEN21.max_references(pipeline) == 10
    assert mode_of(["a.png"], None, 10) is Mode.EDIT
    assert QWEN21.picture_problem(pipeline, Mode.IMAGE) is None
    assert QWEN21.picture_problem(pipeline, Mode.TEXT) is None
    assert "it takes no mask" in (QWEN21.picture_problem(pipeline, Mode.INPAINT) or "")


def test_the_probe_reads_the_pictures_as_the_pipeline_hands_them_to_the_transformer(references):
    """The first transformer call of the pipeline's edit and of the check's probe, on the same
    noise at the same timestep: the same sequence (each picture's normalised latents, then the
    noise), the same grids, the same prompt with the pictures' vision tokens, the same mask of
    the joint sequence's picture slots."""
    pipeline = tiny_models.build_tiny_qwenimage21_pipeline()
    pictures = read_pictures(references, None, 64, 64, references=2)
    assert pictures is not None
    with torch.inference_mode():
        conditioning = QWEN21.encode_edit(
            pipeline, "make it red", "", "cpu", False, pictures.references
        )
        latents = [
            QWEN21.encode_pixels(pipeline.vae, pixels)
            for pixels in QWEN21.edit_pixels(pipeline, pictures)
        ]
    noise, _ = QWEN21.noise(pipeline, [0], 64, 64)
    twin = __import__("copy").copy(pipeline)
    theirs = first_transformer_call(
        pipeline.transformer,
        lambda: twin(
            **QWEN21.edit_call(twin, conditioning, 1, None, pictures, (64, 64)),
            height=64,
            width=64,
            num_inference_steps=2,
            latents=noise,
            output_type="latent",
            use_kv_cache=False,
        ),
    )
    first = float(pipeline.scheduler.timesteps[0])
    conditioning["negative_prompt_embeds"] = conditioning["prompt_embeds"]
    conditioning["negative_image_pad_mask"] = conditioning["image_pad_mask"]
    mine = first_transformer_call(
        pipeline.transformer,
        lambda: QWEN21._probe(pipeline, conditioning, 64, "cpu", [first], latents),
    )

    pictures_cells = sum(r.shape[-2] * r.shape[-1] for r in latents)
    assert theirs["hidden_states"].shape[1] == pictures_cells + 4 * 4
    torch.testing.assert_close(mine["encoder_hidden_states"], theirs["encoder_hidden_states"])
    assert torch.equal(mine["img_mask"], theirs["img_mask"])
    assert bool(theirs["img_mask"][0, : conditioning["prompt_embeds"].shape[1]].any())
    # The noise differs (the probe draws its own); the pictures' part of the sequence does not.
    torch.testing.assert_close(
        mine["hidden_states"][:, :pictures_cells], theirs["hidden_states"][:, :pictures_cells]
    )
    torch.testing.assert_close(mine["timestep"], theirs["timestep"])
    # The stand-in encoding belongs to that job's copy of the pipeline, not to the pipeline.
    assert "encode_prompt" not in vars(pipeline) and "encode_prompt" in vars(twin)


@pytest.mark.slow  # each picture read at a reduced area (see pytestmark), in fp32 too
def test_a_healthy_model_is_checked_on_the_edit_path_in_fp16(references):
    report = edit_check(_model(), references)
    assert list(report.components) == ["text_encoder", "vae_encoder", "transformer", "vae"]
    assert report.verdict == "healthy"
    assert report.plan.dtypes["transformer"] == "fp16"


@pytest.mark.slow  # each picture read at a reduced area (see pytestmark), in fp32 too
def test_a_planted_transformer_overflow_in_an_edit_is_found_at_its_layer_and_fixed_there(
    references,
):
    model = _model()
    plant(model.pipeline, "transformer", BLOCK)

    report = edit_check(model, references)

    assert report.verdict == "fixable"
    assert {n for n, c in report.components.items() if c.status.failed} == {"transformer"}
    assert report.components["transformer"].first_bad_module == BLOCK
    fix = report.fix
    assert fix is not None and fix.verified and fix.quality is not None and fix.quality.passed
    assert changed(report) == {"transformer"}


@pytest.mark.slow  # each picture read at a reduced area (see pytestmark), in fp32 too
def test_a_planted_encoder_overflow_in_an_edit_is_found_as_the_vae_encoder_and_fixed(references):
    model = _model()
    plant(model.pipeline, "vae", ENCODER_LAYER)

    report = edit_check(model, references)

    encoder = report.components["vae_encoder"]
    assert encoder.status.failed and encoder.first_bad_module == ENCODER_LAYER
    assert not report.components["transformer"].status.failed  # fed the fixed latents
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    assert changed(report) == {"vae"}


def test_an_edit_of_two_pictures_is_a_finite_picture_that_says_so(tmp_path, references):
    image = generation.generate(
        _model(), edit_request(tmp_path, references, steps=2, cfg=1.0), precision=FP16, device="cpu"
    ).images[0]
    assert image.status == "ok", image.message
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()
    assert "Mode: edit" in image.parameters


def test_the_pictures_change_what_is_drawn(tmp_path, references):
    model = _model()
    made = [
        np.asarray(
            generation.generate(
                model,
                edit_request(tmp_path / str(i), [path], steps=2, cfg=1.0),
                precision=FP16,
                device="cpu",
            )
            .images[0]
            .image,
            dtype=np.float32,
        )
        for i, path in enumerate(references)
    ]
    assert np.abs(made[0] - made[1]).max() > 0


@pytest.mark.slow  # a generation and its repair, each picture read as above
@pytest.mark.parametrize(
    ("component", "layer", "status_of"),
    [("transformer", BLOCK, "transformer"), ("vae", ENCODER_LAYER, "vae_encoder")],
    ids=["transformer", "vae-encoder"],
)
def test_generation_repairs_a_planted_overflow_in_an_edit(
    tmp_path, references, component, layer, status_of
):
    """The pipeline encodes its pictures itself: the watch's hook on the VAE's encoder must
    see that encoding go non-finite; the transformer's overflow is watched as any denoiser's.
    Each repair fixes the part at fault alone."""
    model = _model()
    plant(model.pipeline, component, layer)

    image = generation.generate(
        model, edit_request(tmp_path, references, steps=2, cfg=4.0), precision=FP16, device="cpu"
    ).images[0]

    assert image.status == "fixed" and image.component == status_of, image.message
    layers = [m for key in ("fp32_modules", "bf16_modules") for m in image.fix.get(key, [])]
    prefix = "vae:" if component == "vae" else "transformer:"
    assert all(m.startswith(prefix) for m in layers)
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()
