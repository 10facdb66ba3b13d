"""What only Flux.2 does: dev and Klein told apart from each other and from Flux.1, the
32-channel latent in normalised 2x2 patches (our latents decode to the pipeline's own pixels),
Klein base and distilled, and its files as ComfyUI users keep them: the transformer in Black
Forest Labs' layout (diffusion_models/), qwen_3_4b in text_encoders/, flux2-vae in vae/, loaded
offline with identical weights and outputs; a missing or wrong companion, and a dev file (whose
Mistral tokenizer HalfSafe does not ship), refused in one sentence naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from app.core import architecture, families, models
from app.core.checkpoint import write_safetensors
from app.core.errors import UnsupportedModelError
from app.core.families import FamilyId, family, family_of
from app.core.formats import layouts
from app.core.models import split
from tests.support.family_helpers import offline  # noqa: F401 - an autouse fixture: no network
from tests.support.model_files import _ldm_vae, save_split_files
from tests.support.tiny_models import (
    build_tiny_flux2_klein_pipeline,
    build_tiny_flux2_pipeline,
    build_tiny_flux_pipeline,
    tiny_flux_vae,
    tiny_qwen3,
)

DEV, KLEIN = family(FamilyId("flux2")), family(FamilyId("flux2klein"))


@pytest.fixture(scope="module")
def klein():
    return build_tiny_flux2_klein_pipeline()


@pytest.fixture(scope="module")
def dev():
    return build_tiny_flux2_pipeline()


def shapes_of(state) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items()}


def original_state(transformer) -> dict:
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    return layouts.to_original(split.layout_of(KLEIN.id).table(config), transformer.state_dict())


# --- told apart ----------------------------------------------------------------------------


def test_dev_and_klein_are_told_apart_and_neither_is_flux1(dev, klein):
    flux1 = build_tiny_flux_pipeline()

    assert family_of(dev) is DEV and family_of(klein) is KLEIN
    assert family_of(flux1).id == "flux"
    assert not DEV.owns(flux1) and not KLEIN.owns(flux1)
    # The same transformer class in both: the pipeline (its text encoder) decides.
    assert not DEV.owns(klein) and not KLEIN.owns(dev)


def test_a_flux2_transformer_file_is_not_read_as_flux1_nor_a_flux1_file_as_flux2(dev, klein):
    """Flux.2's files carry Flux.1's markers (double_blocks, img_in): Flux.2 is asked first,
    and only a Flux.2 file has the shared modulation."""
    flux1 = build_tiny_flux_pipeline().transformer
    flux1_config = {**flux1.config, "_class_name": "FluxTransformer2DModel"}
    flux1_file = layouts.to_original(
        split.layout_of("flux").table(flux1_config), flux1.state_dict()
    )

    read = split.read_model(shapes_of(flux1_file))
    assert read is not None and read.architecture == "flux-dev"
    for pipeline, name in ((dev, "flux2-dev"), (klein, "flux2-klein")):
        model = split.read_model(shapes_of(original_state(pipeline.transformer)))
        assert model is not None and model.architecture == name
        assert model.because.startswith(("Flux.2 dev:", "Flux.2 Klein:"))


def test_klein_base_and_distilled_folders_are_named_for_how_they_sample(klein):
    index = {
        "_class_name": "Flux2KleinPipeline",
        "text_encoder": ["transformers", "Qwen3ForCausalLM"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"],
    }
    config = dict(klein.transformer.config)

    base = families.detect_from_configs({**index, "is_distilled": False}, config, {})
    distilled = families.detect_from_configs({**index, "is_distilled": True}, config, {})

    assert base.architecture == distilled.architecture == "flux2-klein"
    assert "real CFG" in base.because and "without CFG" in distilled.because


def test_a_distilled_klein_is_checked_as_it_samples_one_call_on_the_prompt():
    pipeline = build_tiny_flux2_klein_pipeline(distilled=True)
    calls = []
    pipeline.transformer.register_forward_hook(lambda *_: calls.append(1))

    with torch.inference_mode():
        tensors = KLEIN.encode(pipeline, "a red cat", "", "cpu", guidance=True)
        KLEIN.probe_denoise(pipeline, tensors, 64, "cpu", [1000.0, 500.0])

    assert set(tensors) == {"prompt_embeds"}  # no negative prompt: no CFG to feed
    assert len(calls) == 2  # one call a step


# --- the latent -----------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["dev", "klein"])
def test_the_pipelines_latents_decode_to_its_own_pixels_through_the_32_channel_latent(
    variant, dev, klein
):
    """Noise in the pipeline's 2x2 patches (128 channels), the latents it leaves (packed and
    normalised for dev, already the VAE's for Klein) made the VAE's 32-channel latents by
    undoing the batch-norm statistics and the patches, decoded: the pipeline's own picture."""
    pipeline = dev if variant == "dev" else klein
    expected = family_of(pipeline)
    with torch.inference_mode():
        embeds = expected.pipeline_embeds(
            expected.encode(pipeline, "a red cat", "", "cpu", False), 1
        )
        noise, generators = expected.noise(pipeline, [7], 64, 96)
        arguments = dict(
            **embeds,
            height=64,
            width=96,
            num_inference_steps=2,
            guidance_scale=1.0,
            latents=noise,
        )
        theirs = pipeline(**arguments, output_type="pt", generator=generators).images
        left = pipeline(**arguments, output_type="latent", generator=generators).images
        latents = expected.image_latents(pipeline, left, 64, 96)
        mine = expected.decode(pipeline.vae, latents)

    assert noise.shape == (1, 128, 64 // 16, 96 // 16)
    assert latents.shape == (1, 32, 64 // 8, 96 // 8) and expected.latent.channels == 32
    torch.testing.assert_close((mine / 2 + 0.5).clamp(0, 1), theirs, rtol=0, atol=1e-5)


def test_sizes_off_the_16_px_grid_are_refused_in_a_sentence(klein):
    assert KLEIN.size_problem(klein, 64, 96) is None
    assert "multiples of 16 px" in (KLEIN.size_problem(klein, 72, 64) or "")


# --- split files ------------------------------------------------------------------------------


def original_vae(state) -> dict:
    """A four-level VAE's weights under the original names a VAE file holds."""
    return {k.removeprefix(architecture.VAE): v for k, v in _ldm_vae(state, 4).items()}


def save_klein_files(pipeline, root: Path, stem: str = "flux-2-klein-4b") -> dict[str, Path]:
    """Klein as ComfyUI keeps it: the transformer in BFL's names, the Qwen3 causal LM in
    transformers' names (qwen_3_4b), the VAE in the original layout with its batch-norm
    statistics (flux2-vae)."""
    return save_split_files(pipeline, root, stem)


@pytest.mark.slow  # writing and reading a 151,669-token embedding, and the check's outputs
def test_klein_files_are_read_as_klein_with_its_blocks(tmp_path, klein):
    written = save_klein_files(klein, tmp_path / "models")

    model = models.load_model(str(written["transformer"]))  # companions found beside it

    assert (model.format, model.architecture, model.prediction_type) == (
        "split_files",
        "flux2-klein",
        "flow",
    )
    assert model.detected_because.startswith("Flux.2 Klein: a transformer in Black Forest")
    assert "1 double and 2 single blocks, 64 wide, on 32-channel latents" in (
        model.detected_because
    )
    assert family_of(model.pipeline) is KLEIN


def test_a_dev_transformer_file_is_refused_in_one_sentence_naming_it_and_the_tokenizer(
    tmp_path, dev
):
    path = tmp_path / "models" / "diffusion_models" / "flux2-dev.safetensors"
    path.parent.mkdir(parents=True)
    write_safetensors(path, original_state(dev.transformer))

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(path))

    message = str(caught.value)
    assert str(path) in message and "Tekken tokenizer" in message
    assert "diffusers folder" in message and message.count(". ") == 0
    assert "\n" not in message


def test_a_missing_text_encoder_is_named_in_one_sentence(tmp_path, klein):
    written = save_klein_files(klein, tmp_path / "models")
    written["text_encoder"].unlink()

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]))

    message = str(caught.value)
    assert str(written["transformer"]) in message
    # Named as ComfyUI names the released widths' files; the tiny one's is 32 wide.
    assert "needs its Qwen3 text encoder (qwen_3)" in message and "\n" not in message


def test_a_16_channel_vae_is_passed_over_and_the_32_channel_one_named_as_missing(tmp_path, klein):
    written = save_klein_files(klein, tmp_path / "models")
    written["vae"].unlink()
    flux1_vae = tiny_flux_vae(1).state_dict()  # Flux.1's ae: 16 channels, no statistics
    write_safetensors(
        tmp_path / "models" / "vae" / "ae.safetensors",
        {k: v.contiguous() for k, v in original_vae(flux1_vae).items()},
    )

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]))

    message = str(caught.value)
    assert "needs its 32-channel Flux.2 VAE (flux2-vae)" in message and "\n" not in message


def test_a_wrong_width_text_encoder_given_by_flag_is_refused_naming_it(tmp_path, klein):
    written = save_klein_files(klein, tmp_path / "models")
    wide_path = tmp_path / "qwen3-wide.safetensors"
    wide = tiny_qwen3(5, hidden=64)  # the transformer reads three 32-wide hidden states
    write_safetensors(
        wide_path, {"model." + k: v.contiguous() for k, v in wide.state_dict().items()}
    )

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]), text_encoders=[str(wide_path)])

    message = str(caught.value)
    assert str(wide_path) in message and "\n" not in message
    assert "but the Flux.2 Klein transformer" in message and "needs its Qwen3" in message
