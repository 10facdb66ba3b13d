"""One record of an image (`GalleryEntry`): a fresh result and the same image read back from its
PNG say the same, line for line, except what only a live run knows; other tools' records, and
files that cannot be read, become entries too."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from PIL import Image

from app.core.families import FAMILIES
from app.core.generation import _parameters
from app.core.generation.records import GenerationRequest, GenerationResult, ImageResult
from app.core.identities import DeviceIdentity, ModelIdentity
from app.core.images.finished import save_png
from app.core.images.pictures import Mode
from app.ui.image_entry import (
    GalleryEntry,
    item_text,
    live_lines,
    parameter_text,
    read_image_file,
    recorded_lines,
    tooltip,
)
from tests.support.image_files import (
    a1111_parameters,
    chunk,
    comfy_prompt,
    png_text,
    png_with,
    text_chunk,
)

WARNING = "The UNet runs in fp16 as you asked; on a CPU fp16 is slow."
SETTINGS = {
    "precision": "fp16",
    "unet_precision": "fp16",
    "vae_precision": "fp32",
    "text_encoder_precision": "fp16",
    "text_encoder_2_precision": "auto",
    "upcast_attention": True,
    "attention_backend": "auto",
    "fp32_modules": ["vae:decoder.up_blocks.0.resnets.0.conv1"],
    "bf16_modules": [],
    "nan_check": True,
    "auto_fix": "auto",
    "device": "cuda:0",
}
SD = next(family for family in FAMILIES if type(family).__name__ == "StableDiffusionFamily")


def _fresh(tmp_path, monkeypatch, loras=()) -> tuple[ImageResult, GenerationResult]:
    """A repaired image as the engine sends it: its `parameters` text written by core's own
    writer, the PNG saved with it."""
    monkeypatch.setattr("app.core.generation.parameters.family_of", lambda _pipeline: SD)
    request = GenerationRequest(
        prompt="a red circle on a blue background",
        negative_prompt="blurry",
        steps=12,
        cfg=6.5,
        seed=4242,
        width=128,
        height=96,
        scheduler="euler_a",
    )
    image = ImageResult(
        seed=4242,
        status="fixed",
        component="vae",
        step=12,
        fixes_applied=["VAE decoded again in fp32"],
        message="The VAE overflowed fp16 while decoding; decoded again in fp32.",
        settings=dict(SETTINGS),
    )
    model = SimpleNamespace(
        pipeline=None, model_hash="0123456789", name="demo", loras=list(loras), vae=None
    )
    image.parameters = _parameters(image, request, model)
    picture = Image.new("RGB", (128, 96), (40, 40, 200))
    image.path = str(save_png(picture, tmp_path, image.seed, image.parameters))
    result = GenerationResult(
        images=[image],
        settings=dict(SETTINGS),
        seconds=1.0,
        request=request,
        model=ModelIdentity(source="demo", name="demo", architecture="sd1"),
        device=DeviceIdentity(kind="cpu", name="a CPU"),
        warnings=[WARNING],
    )
    return image, result


def test_a_fresh_image_and_its_png_read_back_render_the_same_caption(tmp_path, monkeypatch):
    ink = SimpleNamespace(name="ink", weight=0.8, file=SimpleNamespace(short_hash="abcdef0123"))
    image, result = _fresh(tmp_path, monkeypatch, loras=[ink])
    fresh = GalleryEntry.from_result(image, result)
    back = read_image_file(image.path)

    assert back.problem == ""
    # Only the live run knows the job's warnings: they are the caption's last lines.
    assert live_lines(fresh) == [f"Note: {WARNING}"] and live_lines(back) == []
    # The job's notes come first: a caption box of a few lines never hides them below its fold.
    assert parameter_text(fresh) == f"Note: {WARNING}\n" + parameter_text(back)
    caption = parameter_text(back).splitlines()
    assert caption[0] == "a red circle on a blue background <lora:ink:0.8>"
    assert caption[1] == "Negative prompt: blurry"
    assert caption[2] == (
        "Steps: 12, Sampler: Euler a, CFG scale: 6.5, Seed: 4242, Size: 128x96, "
        "Model hash: 0123456789, Model: demo"
    )
    # (the VAE runs in fp32 whole: its layer kept in fp32 is nothing more)
    assert caption[3] == "Precision: fp16, VAE in fp32, attention upcast to fp32"
    assert caption[4] == f"Saved to {image.path}"
    # The gallery's item and tooltip, and the banner's facts, read the same record both ways.
    assert item_text(fresh) == item_text(back) == "a red circle on a…\nfixed · seed 4242"
    for name in ("status", "component", "step", "fixes_applied", "seed", "settings"):
        assert getattr(fresh, name) == getattr(back, name), name
    # The NaN watch's sentence is the live run's alone, and the tooltip says it when known.
    assert back.message == "" and fresh.message in tooltip(fresh)
    assert fresh.generate_values() == back.generate_values()


@pytest.mark.parametrize(
    ("entry", "label"),
    [
        (GalleryEntry(prompt="a cat", seed=7), "a cat\nseed 7"),
        # A long prompt is cut at a word; a LoRA's tag and line breaks are no words to show.
        (
            GalleryEntry(prompt="<lora:ink:0.8> portrait of an\nold fisherman, dramatic", seed=1),
            "portrait of an old…\nseed 1",
        ),
        (
            GalleryEntry(prompt="supercalifragilisticexpialidocious", seed=1),
            "supercalifragilisti…\nseed 1",
        ),
        (
            GalleryEntry(prompt="a cat", seed=7, input_picture="a.png", mask="m.png"),
            "a cat\ninpaint · seed 7",
        ),
        (GalleryEntry(prompt="a cat", seed=7, status="black"), "a cat\ndark · seed 7"),
        # No room for a long seed beside the mode: the mode stays, the tooltip has the seed.
        (GalleryEntry(prompt="a cat", seed=3141592653, input_picture="a.png"), "a cat\nimg2img"),
        (GalleryEntry(prompt="a cat", seed=3141592653), "a cat\nseed 3141592653"),
        (GalleryEntry(path="/out/00001-7.png"), "no prompt recorded"),
        (GalleryEntry(path="/out/00001-7.png", problem="/out/00001-7.png: damaged."), "unreadable"),
        # Listed, its record not read yet: no label until it is (never the file's name).
        (GalleryEntry(path="/out/00001-7.png", listed_only=True), ""),
    ],
    ids=[
        "short",
        "long",
        "one long word",
        "inpainting",
        "dark",
        "long seed with a mode",
        "long seed",
        "no record",
        "unreadable",
        "listed",
    ],
)
def test_the_gallery_label_is_the_prompts_start_and_the_seed(entry, label):
    assert item_text(entry) == label
    if entry.path:
        assert entry.path in tooltip(entry)


def test_a_result_without_its_text_is_described_from_the_typed_request(tmp_path, monkeypatch):
    image, result = _fresh(tmp_path, monkeypatch)
    described = recorded_lines(GalleryEntry.from_result(replace(image, parameters=""), result))
    back = recorded_lines(read_image_file(image.path))
    # The typed request does not know the model's hash, which the text records; nothing else
    # differs.
    assert described == [*back[:2], back[2].replace("Model hash: 0123456789, ", ""), *back[3:]]


@pytest.mark.parametrize(
    ("mode", "strength"), [(Mode.EDIT, None), (Mode.CONTROL, None), (Mode.IMAGE, 0.75)]
)
def test_a_picture_job_without_its_text_is_described_in_the_mode_it_ran(
    tmp_path, monkeypatch, mode, strength
):
    image, result = _fresh(tmp_path, monkeypatch)
    request = replace(result.request, images=[str(tmp_path / "a.png")], strength=0.75)
    entry = GalleryEntry.from_result(
        replace(image, parameters=""), replace(result, request=request, mode=mode)
    )
    assert (entry.mode, entry.strength, entry.input_picture) == (mode, strength, "a.png")


def test_another_tools_record_becomes_an_entry(tmp_path):
    a1111 = read_image_file(
        str(png_text(tmp_path / "a.png", {"parameters": a1111_parameters("sdxl", "0123456789")}))
    )
    assert (a1111.made_by, a1111.model, a1111.negative_prompt) == ("a1111", "sdxl", "blurry")
    assert a1111.generate_values()["scheduler"] == "euler_a"
    comfy = read_image_file(str(png_text(tmp_path / "c.png", {"prompt": comfy_prompt("flux.st")})))
    assert (comfy.made_by, comfy.model, comfy.seed, comfy.size) == (
        "comfyui",
        "flux.st",
        42,
        (64, 64),
    )
    # ComfyUI records no negative prompt: sending it to Generate leaves the form's own.
    assert "negative_prompt" not in comfy.generate_values()


def _truncated(path):
    whole = png_text(path, {"parameters": a1111_parameters("sdxl", "0123456789")})
    whole.write_bytes(whole.read_bytes()[:300])


def _zip_bomb(path):
    png_with(path, [text_chunk("parameters", "a" * (17 << 20), "zTXt")])


@pytest.mark.parametrize(
    ("write", "words"),
    [
        (_truncated, "truncated"),
        (_zip_bomb, "inflates past 16 MB"),
        (lambda path: png_with(path, [chunk(b"tEXt", b"x" * 64, length=40 << 20)]), "claims"),
        (lambda path: path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40), "damaged"),
        (lambda path: path.write_text("not an image at all"), "not a PNG, JPEG or WebP"),
    ],
    ids=["truncated", "huge text chunk", "lying chunk length", "zeros", "not an image"],
)
def test_a_file_that_cannot_be_read_is_one_sentence_naming_it(tmp_path, write, words):
    path = tmp_path / "bad.png"
    write(path)
    entry = read_image_file(str(path))
    assert entry.problem.startswith(f"{path}: ") and words in entry.problem
    assert entry.problem.count(". ") == 0  # one sentence
    assert parameter_text(entry).splitlines()[0] == entry.problem
