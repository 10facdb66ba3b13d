"""Editing models: Flux.1 Kontext and Qwen-Image-Edit (Edit-Plus) recognised as variants of their
families, their reference pictures edited under the NaN watch, and the check running the edit
path (the text encoder with the pictures where it reads them, the VAE's encoder on them, the
transformer with their latents in its sequence, the VAE's decoder).

Planted overflows (a layer's weights scaled past fp16, finite in fp32) in an editing model's
transformer and VAE encoder must be found at their layer, fixed in the check with a fix proved
against fp32, and repaired in generation.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from app.cli import main
from app.core import generation, models
from app.core.errors import HalfSafeError
from app.core.families import FamilyId, architecture_title, detect_from_configs, family, family_of
from app.core.images.pictures import Mode, mode_of, read_pictures
from app.core.library import scan_library
from app.core.settings import PrecisionSettings
from tests.support import tiny_models
from tests.support.cli_output import without_progress
from tests.support.edit_checks import changed, edit_check, edit_request, plant
from tests.support.family_helpers import (
    FP16,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
    same_weights,
)
from tests.support.model_files import save_split_files

FLUX_SINGLE = "single_transformer_blocks.1.proj_out"  # as the Flux.1 conformance row plants
QWEN_BLOCK = "transformer_blocks.0.img_mlp.net.2"  # as the Qwen-Image row plants
ENCODER_LAYER = "encoder.down_blocks.0.resnets.0.conv1"  # the 2D VAE's first encoder conv


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


def _kontext(key="kontext"):
    return in_memory(tiny_models.build_tiny_flux_kontext_pipeline(), key, "flux-kontext")


def _qwen_edit(key="qwen-edit", plus=True):
    pipeline = tiny_models.build_tiny_qwenimage_edit_pipeline(plus=plus)
    return in_memory(pipeline, key, "qwenimage-edit-plus" if plus else "qwenimage-edit")


# --- the mode --------------------------------------------------------------------------------


def test_an_editing_model_given_pictures_edits_them():
    assert mode_of(["a.png"], None, references=1) is Mode.EDIT
    assert mode_of(["a.png", "b.png", "c.png"], None, references=3) is Mode.EDIT
    assert mode_of([], None, references=3) is Mode.TEXT
    assert mode_of(["a.png"], None) is Mode.IMAGE  # a model that does not edit
    assert (Mode.EDIT.value, Mode.EDIT.words) == ("edit", "editing")
    with pytest.raises(HalfSafeError, match="2 pictures were given; this editing model takes one"):
        mode_of(["a.png", "b.png"], None, references=1)
    with pytest.raises(HalfSafeError, match="takes at most 3 pictures"):
        mode_of(["a.png"] * 4, None, references=3)
    # A picture and a mask inpaint: whether an editing model does is its family's to say.
    assert mode_of(["a.png"], "m.png", references=1) is Mode.INPAINT
    with pytest.raises(HalfSafeError, match="2 input pictures were given with a mask"):
        mode_of(["a.png", "b.png"], "m.png", references=3)


def test_an_edit_reads_every_reference_at_the_jobs_size(references):
    pictures = read_pictures(references, None, 96, 64, references=3)
    assert pictures is not None and pictures.mode is Mode.EDIT
    assert pictures.pixels.shape == (3, 3, 64, 96)
    assert [p.size for p in pictures.references] == [(96, 64)] * 3
    assert pictures.sources == tuple(references)


# --- detection -------------------------------------------------------------------------------


def test_editing_folders_are_told_from_their_families_text_to_image_ones():
    flux = {"num_layers": 19, "num_single_layers": 38, "in_channels": 64, "guidance_embeds": True}
    flux.update(num_attention_heads=24, attention_head_dim=128)
    kontext = detect_from_configs(
        {"_class_name": "FluxKontextPipeline", "transformer": ["diffusers", "x"]}, flux, {}
    )
    assert (kontext.architecture, kontext.supported) == ("flux-kontext", True)
    assert kontext.because.startswith("Flux.1 Kontext: its FluxKontextPipeline")
    qwen = {"num_layers": 60, "in_channels": 64, "num_attention_heads": 24}
    qwen["attention_head_dim"] = 128
    for class_name, architecture, title in (
        ("QwenImageEditPipeline", "qwenimage-edit", "Qwen-Image-Edit"),
        ("QwenImageEditPlusPipeline", "qwenimage-edit-plus", "Qwen-Image-Edit-Plus"),
    ):
        index = {
            "_class_name": class_name,
            "transformer": ["diffusers", "QwenImageTransformer2DModel"],
            "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
        }
        found = detect_from_configs(index, qwen, {})
        assert (found.architecture, found.supported) == (architecture, True)
        assert found.because.startswith(f"{title}: its {class_name}")
        assert architecture_title(architecture) == title
    assert architecture_title("flux-kontext") == "Flux.1 Kontext"


def test_a_kontext_folder_loads_back_offline_as_an_editing_flux_model(tmp_path):
    pipeline = tiny_models.build_tiny_flux_kontext_pipeline()
    pipeline.save_pretrained(tmp_path / "kontext")

    model = models.load_model(str(tmp_path / "kontext"))

    assert (model.architecture, model.format) == ("flux-kontext", "diffusers")
    assert type(model.pipeline).__name__ == "FluxKontextPipeline"
    assert family_of(model.pipeline) is family(FamilyId("flux"))
    assert family_of(model.pipeline).max_references(model.pipeline) == 1
    same_weights(pipeline, model.pipeline, ("text_encoder", "text_encoder_2", "transformer"))


def test_a_kontext_transformer_file_is_told_from_dev_by_its_name_and_edits(tmp_path, references):
    # Kontext's transformer is shaped as Flux.1 dev's: as ComfyUI users keep it
    # (diffusion_models/flux1-kontext-dev.safetensors), only its name tells it.
    pipeline = tiny_models.build_tiny_flux_kontext_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "flux1-kontext-dev")

    model = models.load_model(str(written["transformer"]))

    assert (model.architecture, model.format) == ("flux-kontext", "split_files")
    assert type(model.pipeline).__name__ == "FluxKontextPipeline"
    assert model.detected_because.startswith("Flux.1 Kontext, as the file's name says")
    same_weights(pipeline, model.pipeline, ("text_encoder", "text_encoder_2", "transformer", "vae"))
    (entry,) = scan_library(
        [str(written["transformer"].parent)], include_defaults=False, use_cache=False
    )
    assert (entry.architecture, entry.supported) == ("flux-kontext", True)
    result = generation.generate(
        model, edit_request(tmp_path, references[:1]), precision=FP16, device="cpu"
    )
    assert result.mode is Mode.EDIT and result.images[0].status == "ok"

    # The same weights under dev's name are dev: the name decides, as the README says.
    renamed = written["transformer"].with_name("flux1-dev.safetensors")
    written["transformer"].rename(renamed)
    assert models.load_model(str(renamed)).architecture == "flux-dev"


def test_a_gguf_kontext_transformer_is_told_by_its_name_too(tmp_path, references):
    from gguf import GGMLQuantizationType

    from tests.support.quantized_files import gguf_split_set

    pipeline = tiny_models.build_tiny_flux_kontext_pipeline()
    _, _, path = gguf_split_set(
        tmp_path, pipeline, GGMLQuantizationType.Q8_0, name="flux1-kontext-dev-Q8_0"
    )
    model = models.load_model(str(path))
    assert (model.architecture, type(model.pipeline).__name__) == (
        "flux-kontext",
        "FluxKontextPipeline",
    )
    assert model.quantization is not None and model.quantization.format == "gguf"
    result = generation.generate(
        model, edit_request(tmp_path, references[:1], steps=2), precision=FP16, device="cpu"
    )
    assert result.mode is Mode.EDIT and result.images[0].status == "ok"


@pytest.mark.slow  # about 15 s here: a 151,669-token embedding saved and read back
def test_a_qwen_image_edit_plus_folder_loads_back_offline_with_its_processor(tmp_path, references):
    pipeline = tiny_models.build_tiny_qwenimage_edit_pipeline(plus=True)
    pipeline.save_pretrained(tmp_path / "edit")

    model = models.load_model(str(tmp_path / "edit"))

    assert (model.architecture, model.format) == ("qwenimage-edit-plus", "diffusers")
    assert family_of(model.pipeline) is family(FamilyId("qwenimage"))
    assert family_of(model.pipeline).max_references(model.pipeline) == 3
    same_weights(pipeline, model.pipeline, ("text_encoder", "transformer", "vae"))
    # The processor read back turns a prompt with a picture into the same tokens and patches.
    picture = Image.open(references[0]).convert("RGB")
    text = ["Picture 1: <|vision_start|><|image_pad|><|vision_end|>a red cube"]
    mine = pipeline.processor(text=text, images=[picture], return_tensors="pt")
    theirs = model.pipeline.processor(text=text, images=[picture], return_tensors="pt")
    assert torch.equal(mine["input_ids"], theirs["input_ids"])
    assert torch.equal(mine["pixel_values"], theirs["pixel_values"])


# --- generation ------------------------------------------------------------------------------


def test_kontext_edits_a_reference_into_a_finite_picture_that_says_so(tmp_path, references):
    result = generation.generate(
        _kontext(), edit_request(tmp_path, references[:1]), precision=FP16, device="cpu"
    )
    image = result.images[0]
    assert image.status == "ok"
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()
    assert "Mode: edit" in image.parameters and "Input picture: ref0.png" in image.parameters
    assert "Denoising strength" not in image.parameters  # an edit has no strength


def test_the_reference_changes_what_kontext_draws(tmp_path, references):
    model = _kontext()
    first = generation.generate(
        model, edit_request(tmp_path, references[:1]), precision=FP16, device="cpu"
    ).images[0]
    other = generation.generate(
        model, edit_request(tmp_path, references[1:2]), precision=FP16, device="cpu"
    ).images[0]
    assert not np.array_equal(np.asarray(first.image), np.asarray(other.image))


def test_kontext_without_a_picture_draws_from_the_prompt(tmp_path):
    # diffusers' Kontext pipeline makes text-to-image without a reference: so does HalfSafe.
    result = generation.generate(
        _kontext(), edit_request(tmp_path, []), precision=FP16, device="cpu"
    )
    assert [image.status for image in result.images] == ["ok"]
    assert "Mode:" not in result.images[0].parameters


def test_the_refusals_of_an_editing_model_are_one_sentence(tmp_path, references):
    qwen = _qwen_edit()
    with pytest.raises(
        HalfSafeError, match="this is an editing model: give it the picture to edit"
    ) as caught:
        generation.generate(qwen, edit_request(tmp_path, []), precision=FP16, device="cpu")
    assert "\n" not in str(caught.value)
    with pytest.raises(HalfSafeError, match="give it the picture to edit"):
        edit_check(qwen, [])
    kontext = _kontext()
    with pytest.raises(HalfSafeError, match="2 pictures were given; this editing model takes one"):
        generation.generate(kontext, edit_request(tmp_path, references[:2]), precision=FP16)
    with pytest.raises(HalfSafeError, match="it takes no mask"):
        generation.generate(
            kontext, edit_request(tmp_path, references[:1], mask=references[1]), precision=FP16
        )
    with pytest.raises(HalfSafeError, match="4 pictures were given; this editing model takes at"):
        generation.generate(
            qwen, edit_request(tmp_path, [*references, references[0]]), precision=FP16
        )


def test_generation_repairs_a_planted_overflow_in_kontexts_transformer(tmp_path, references):
    model = _kontext()
    plant(model.pipeline, "transformer", FLUX_SINGLE, 1e6)
    image = generation.generate(
        model, edit_request(tmp_path, references[:1]), precision=FP16, device="cpu"
    ).images[0]
    assert image.status == "fixed" and image.component == "transformer"
    assert image.first_bad_module is not None and image.first_bad_module.startswith(
        "single_transformer_blocks.1"
    )
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()


def test_generation_repairs_a_planted_overflow_in_kontexts_vae_encoder(tmp_path, references):
    model = _kontext()
    plant(model.pipeline, "vae", ENCODER_LAYER, 1e6)
    image = generation.generate(
        model, edit_request(tmp_path, references[:1]), precision=FP16, device="cpu"
    ).images[0]
    assert image.status == "fixed" and image.component == "vae_encoder"
    assert image.first_bad_module == ENCODER_LAYER
    assert image.fixes_applied and "VAE" in image.fixes_applied[0]
    assert "NaN component: vae_encoder" in image.parameters


def test_generation_repairs_a_planted_overflow_in_qwen_edits_own_encoding(
    tmp_path, references, monkeypatch
):
    """Qwen-Image-Edit-Plus encodes its references itself: the watch's hook on the VAE's
    encoder must see that encoding go non-finite, and the repair must fix the VAE alone.
    The pipeline's encoding area (a megapixel, minutes in fp16 on a CPU) is made 64x64 here,
    for the pipeline and for HalfSafe alike."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

    monkeypatch.setattr(plus, "VAE_IMAGE_SIZE", 64 * 64)
    model = _qwen_edit("qwen-edit-hooked")
    vae = model.pipeline.vae
    layer = next(n for n, m in vae.named_modules() if m is vae.encoder.conv_in)
    with torch.no_grad():
        vae.encoder.conv_in.weight.mul_(1e6)
    result = generation.generate(
        model, edit_request(tmp_path, references[:1], steps=2), precision=FP16, device="cpu"
    )
    image = result.images[0]
    assert image.status == "fixed" and image.component == "vae_encoder", image.message
    assert image.first_bad_module == layer
    assert image.fixes_applied and "VAE" in image.fixes_applied[0]
    assert set(image.fix) <= {"vae_precision", "fp32_modules", "bf16_modules", "clamp_modules"}
    layers = [m for key in ("fp32_modules", "bf16_modules") for m in image.fix.get(key, [])]
    assert all(m.startswith("vae:") for m in layers)
    assert np.isfinite(np.asarray(image.image, dtype=np.float32)).all()


@pytest.mark.slow  # about 25 s here: its pipeline encodes each reference at a megapixel
def test_qwen_image_edit_plus_edits_several_references_into_a_finite_picture(tmp_path, references):
    # The VAE in fp32: an fp16 convolution at a megapixel takes minutes on a CPU.
    precision = PrecisionSettings(precision="fp16", vae_precision="fp32")
    result = generation.generate(
        _qwen_edit(), edit_request(tmp_path, references[:2], steps=2), precision=precision
    )
    image = result.images[0]
    assert image.status == "ok"
    from app.core.words import infotext

    parsed = infotext.parse(image.parameters)
    assert parsed.get(infotext.MODE) == "edit"
    assert parsed.get(infotext.INPUT_PICTURE) == "ref0.png, ref1.png"  # quoted: it has a comma


# --- the health check ------------------------------------------------------------------------


def test_the_check_of_an_edit_runs_the_edit_path(references):
    report = edit_check(_kontext(), references[:1])
    assert list(report.components) == [
        "text_encoder",
        "text_encoder_2",
        "vae_encoder",
        "transformer",
        "vae",
    ]
    assert report.verdict == "healthy"


def test_the_references_latents_are_in_the_transformers_sequence(references):
    # The check's transformer reads the reference: another picture, another probe result.
    from app.core.health.stages import Runner
    from app.core.precision import PrecisionPlan

    model = _kontext()
    parts = ("text_encoder", "text_encoder_2", "transformer", "vae")
    plan = PrecisionPlan("cpu", dict.fromkeys(parts, "fp32"))
    outputs = []
    for reference in references[:2]:
        pictures = read_pictures([reference], None, 64, 64, references=1)
        runner = Runner(model, plan, 64, "a cube", 2, "euler", pictures)
        encoded = runner.encode(plan)
        runner.references = runner.encode_picture(plan).output
        outputs.append(runner.denoise(plan, encoded.output).output)
        runner.placed.release()
    assert not torch.allclose(outputs[0], outputs[1])


@pytest.mark.parametrize("build", [_kontext, _qwen_edit], ids=["kontext", "qwen-edit-plus"])
def test_a_planted_transformer_overflow_in_an_edit_is_found_at_its_layer_and_fixed_there(
    build, references
):
    model = build()
    layer = FLUX_SINGLE if type(model.pipeline).__name__.startswith("Flux") else QWEN_BLOCK
    plant(model.pipeline, "transformer", layer, 1e6)

    report = edit_check(model, references[:1])

    assert report.verdict == "fixable"
    failed = {n for n, c in report.components.items() if c.status.failed}
    assert failed == {"transformer"}
    assert report.components["transformer"].first_bad_module == layer
    fix = report.fix
    assert fix is not None and fix.verified and fix.quality is not None and fix.quality.passed
    assert changed(report) == {"transformer"}
    # The transformer wider, or some of its layers, the overflowing one among them.
    fixed = fix.plan
    assert fixed.dtypes["transformer"] in ("bf16", "fp32") or any(
        layer == island or layer.startswith(island + ".") for island in fixed.islands("transformer")
    )


@pytest.mark.parametrize("build", [_kontext, _qwen_edit], ids=["kontext", "qwen-edit-plus"])
def test_a_planted_encoder_overflow_in_an_edit_is_found_as_the_vae_encoder(build, references):
    model = build()
    vae = model.pipeline.vae
    first = vae.encoder.down_blocks[0]
    layer_module = first.resnets[0].conv1 if hasattr(first, "resnets") else vae.encoder.conv_in
    layer = next(n for n, m in vae.named_modules() if m is layer_module)
    with torch.no_grad():
        layer_module.weight.mul_(1e6)

    report = edit_check(model, references[:1])

    encoder = report.components["vae_encoder"]
    assert encoder.status.failed and encoder.first_bad_module == layer
    assert not report.components["transformer"].status.failed  # fed the fixed latents
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    assert changed(report) == {"vae"}


# --- the command -----------------------------------------------------------------------------


def test_generate_edits_the_pictures_given_with_image(tmp_path, references, capsys):
    tiny_models.build_tiny_flux_kontext_pipeline().save_pretrained(tmp_path / "kontext")
    argv = ["generate", str(tmp_path / "kontext"), "--image", references[0], "--steps", "2"]
    argv += ["--width", "64", "--height", "64", "--out", str(tmp_path / "out"), "--json"]
    argv += ["--device", "cpu", "--precision", "fp16"]
    assert main(argv) == 0
    images = json.loads(capsys.readouterr().out)["images"]
    assert [image["status"] for image in images] == ["ok"]
    two = [*argv, "--image", references[1]]
    assert main(two) == 2
    err = without_progress(capsys.readouterr().err)
    said = [line for line in err.splitlines() if line.startswith("halfsafe: ")]
    # Told from the folder's configs before it loads.
    assert said == [
        "halfsafe: 2 pictures were given; kontext is a Flux.1 model, which takes one picture."
    ]
    assert "Traceback" not in err


def test_several_pictures_for_a_model_that_does_not_edit_are_one_line(references, capsys):
    argv = ["generate", "demo", "--image", references[0], "--image", references[1]]
    assert main(argv) == 2
    err = without_progress(capsys.readouterr().err)
    assert err.count("\n") == 1 and "2 input pictures were given" in err
