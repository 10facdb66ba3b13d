"""The `parameters` text's one key table: what generation writes, every reader reads back."""

from __future__ import annotations

import dataclasses
import hashlib
import types

import pytest

from app import __version__
from app.core import generation
from app.core.checkpoint import WeightScan
from app.core.families import FAMILIES
from app.core.fixing.job_fix import JobFix
from app.core.generation import GenerationRequest, generate
from app.core.hires import Hires
from app.core.images.finished import read_parameters
from app.core.memory import MemoryRecord
from app.core.models import LoadedModel
from app.core.settings import FIELDS, SCHEDULERS, PrecisionSettings
from app.core.words import infotext
from tests.support.tiny_models import build_tiny_sd_pipeline

# The keys HalfSafe writes only for some models (a family's own guidance).
_FAMILY_KEYS = {infotext.DISTILLED_CFG_SCALE}
# Keys written only for a job that starts from pictures (image-to-image, inpainting, editing).
_PICTURE_KEYS = {
    infotext.DENOISING_STRENGTH,
    infotext.MASK_BLUR,
    infotext.INPAINT_AREA,
    infotext.MASKED_AREA_PADDING,
    infotext.MODE,
    infotext.INPUT_PICTURE,
    infotext.MASK,
    infotext.CANVAS_EXTENDED,
}
# Written only when the job set them (`test_clip_skip_and_a_hires_fix_are_written_as_a1111`).
_SECOND_PASS_KEYS = {
    infotext.CLIP_SKIP,
    infotext.HIRES_UPSCALE,
    infotext.HIRES_STEPS,
    infotext.HIRES_UPSCALER,
    # Written for a transformer model run with the step cache (tests/core/test_step_cache.py).
    infotext.STEP_CACHE,
    # Written for a Qwen-Image 2.1 model run with the prompt cache (test_prompt_cache.py).
    infotext.PROMPT_CACHE,
}
# Keys other tools write, read to tell which tool made an image or what it ran.
_READ_ONLY = {
    infotext.HIRES_RESIZE,
    infotext.SCHEDULE_TYPE,
    infotext.VERSION,
    infotext.APP,
    infotext.PIPELINE,
    infotext.OPERATIONS,
}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A real generation (the tiny SD pipeline, CPU, two steps) with a separate VAE file, and
    its image record with every optional field filled the way a repaired image fills them."""
    folder = tmp_path_factory.mktemp("infotext")
    vae_file = folder / "vae-ft-mse-840000-ema-pruned.safetensors"
    vae_file.write_bytes(b"stand-in bytes: the hash is of the file, whatever it holds")
    model = LoadedModel(
        pipeline=build_tiny_sd_pipeline(),
        source="<tiny>",
        name="dreamy-v2",
        format="demo",
        architecture="sd1",
        prediction_type="epsilon",
        native_size=64,
        stored_dtype="fp32",
        model_hash="abcdef1234",
        profile_key="tiny",
        weights=WeightScan([], 0, 0, 0.0),
        detected_because="built in a test",
    )
    model.vae = str(vae_file)
    request = GenerationRequest(
        prompt="a lighthouse, at dusk: (storm:1.2)",
        negative_prompt="fog, text",
        steps=2,
        cfg=6.5,
        seed=4242,
        width=64,
        height=72,
        scheduler="euler_a",
        output_dir=str(folder / "out"),
    )
    result = generate(model, request, precision=PrecisionSettings(), device="cpu")
    (entry,) = result.images
    settings = {
        **entry.settings,
        "fp32_modules": ["vae:decoder.up_blocks.0.resnets.0.conv1", "vae:decoder.conv_out"],
        "bf16_modules": ["unet:mid_block.attentions.0"],
        "clamp_modules": ["text_encoder:encoder.layers.0.mlp.fc1"],
    }
    lora = types.SimpleNamespace(
        name="ink", weight=0.8, file=types.SimpleNamespace(short_hash="0123456789")
    )
    repaired = dataclasses.replace(
        entry,
        status="fixed",
        component="vae",
        step=2,
        fixes_applied=["VAE decoded again in fp32", "attention upcast"],
        non_finite=0.25,
        non_finite_box=(0, 8, 64, 40),
        settings=settings,
        loras=[lora],
    )
    return model, request, entry, repaired, vae_file


def test_the_table_lists_each_key_once_with_a_kind_and_a_real_setting():
    names = [key.name for key in infotext.KEYS]
    assert len(names) == len(set(names))
    assert set(infotext.BY_NAME) == set(names)
    for key in infotext.KEYS:
        assert key.kind in infotext.KINDS, key
        assert key.meaning, key
        assert (key.setting is not None) == (key.kind in ("setting", "modules")), key
        assert key.setting is None or key.setting in FIELDS, key


def test_a_real_generation_record_round_trips_through_the_table(made):
    model, request, _entry, repaired, vae_file = made
    memory = MemoryRecord(4198.4, ("unet",), ("vae",))
    job_fix = JobFix({"vae_precision": "fp32"}, {"vae_precision": "fp16"})
    text = generation._parameters(
        repaired, request, model, "NVIDIA GeForce GTX 1660", memory, job_fix
    )
    parsed = infotext.parse(text)
    expected = {
        infotext.STEPS: 2,
        infotext.SAMPLER: "Euler a",
        infotext.CFG_SCALE: 6.5,
        infotext.SEED: 4242,
        infotext.SIZE: (64, 72),
        infotext.MODEL_HASH: "abcdef1234",
        infotext.MODEL: "dreamy-v2",
        infotext.LORA_HASHES: "ink: 0123456789",
        infotext.VAE_HASH: hashlib.sha256(vae_file.read_bytes()).hexdigest()[:10],
        infotext.VAE: vae_file.name,
        infotext.RNG: "CPU",
        infotext.ARCHITECTURE: "sd1",  # which model of its family ran
        **{key: repaired.settings[key.setting] for key in infotext.SETTING_KEYS},
        infotext.DEVICE_NAME: "NVIDIA GeForce GTX 1660",
        infotext.MEMORY_BUDGET: "4.1 GB",
        infotext.STREAMED: ["unet"],
        infotext.COMPUTED_IN_PLACE: ["vae"],
        infotext.NAN_WATCH: "fixed",
        infotext.NAN_COMPONENT: "vae",
        infotext.NAN_STEP: 2,
        infotext.FIXES_APPLIED: ["VAE decoded again in fp32", "attention upcast"],
        infotext.FIX_FOR_JOB: ["VAE precision fp32 (over fp16)"],
        infotext.NON_FINITE_PIXELS: "25.0%",
        infotext.NON_FINITE_REGION: "x 0-63, y 8-39",
        infotext.HALFSAFE: __version__,
    }
    # Every key HalfSafe writes for this model is written, and reads back as it was given.
    assert (
        set(expected)
        == set(infotext.KEYS) - _FAMILY_KEYS - _READ_ONLY - _PICTURE_KEYS - _SECOND_PASS_KEYS
    )
    assert [name for name in parsed.pairs] == [key.name for key in expected]
    assert {key: parsed.get(key) for key in expected} == expected
    assert parsed.prompt == "a lighthouse, at dusk: (storm:1.2) <lora:ink:0.8>"
    assert parsed.negative_prompt == request.negative_prompt
    assert parsed.scheduler() == "euler_a"
    # Writing what was read gives the same text back.
    again = infotext.write(
        parsed.prompt, parsed.negative_prompt, [(key, parsed.get(key)) for key in expected]
    )
    assert again == text


def test_clip_skip_and_a_hires_fix_are_written_as_a1111(made):
    """A1111's own keys and values: "Clip skip: 2", the second pass's "Denoising strength",
    "Hires upscale: 2" (no ".0"), "Hires steps" only when set, the upscaler's A1111 name; the
    Size stays the first pass's. None of them without a clip skip or a second pass."""
    model, request, entry, _repaired, _vae = made
    plain = infotext.parse(generation._parameters(entry, request, model))
    assert not {key.name for key in _SECOND_PASS_KEYS} & set(plain.pairs)
    assert infotext.DENOISING_STRENGTH.name not in plain.pairs
    second = dataclasses.replace(
        request,
        clip_skip=2,
        hires=Hires(scale=2.0, steps=12, denoise=0.45, upscaler="latent_nearest_exact"),
    )
    text = generation._parameters(entry, second, model)
    assert "Clip skip: 2, Denoising strength: 0.45, Hires upscale: 2, Hires steps: 12, " in text
    assert "Hires upscaler: Latent (nearest-exact)" in text
    parsed = infotext.parse(text)
    assert parsed.get(infotext.SIZE) == (64, 72)
    assert parsed.get(infotext.CLIP_SKIP) == 2 and parsed.get(infotext.HIRES_UPSCALE) == 2.0
    same_steps = generation._parameters(entry, dataclasses.replace(second, hires=Hires(1.5)), model)
    assert "Hires upscale: 1.5" in same_steps and "Hires steps" not in same_steps


def test_the_saved_png_carries_the_text_the_table_reads(made):
    _model, request, entry, _repaired, _vae = made
    parsed = infotext.parse(read_parameters(entry.path) or "")
    assert set(parsed.pairs) <= set(infotext.BY_NAME)
    assert (parsed.prompt, parsed.negative_prompt) == (request.prompt, request.negative_prompt)
    assert parsed.get(infotext.SIZE) == (64, 72) and parsed.get(infotext.SEED) == 4242
    assert parsed.get(infotext.NAN_WATCH) == entry.status
    assert (
        parsed.settings(infotext.SETTING_KEYS)["unet_precision"] == entry.settings["unet_precision"]
    )


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: type(family).__name__)
def test_every_key_the_writer_emits_is_known_to_the_parser(made, family, monkeypatch):
    model, request, _entry, repaired, _vae = made
    monkeypatch.setattr("app.core.generation.parameters.family_of", lambda pipeline: family)
    for scheduler in SCHEDULERS:
        text = generation._parameters(
            repaired, dataclasses.replace(request, scheduler=scheduler), model
        )
        parsed = infotext.parse(text)
        unknown = set(parsed.pairs) - set(infotext.BY_NAME)
        assert not unknown, f"{type(family).__name__} writes keys no reader knows: {unknown}"
        for name, value in family.guidance_parameters(request.cfg):
            assert parsed.get(infotext.BY_NAME[name]) == float(value)
        assert parsed.scheduler() is not None  # every sampler written reads back as one we run


def test_a_key_outside_the_table_is_refused_when_written():
    with pytest.raises(KeyError, match="Guidance rescale"):
        infotext.keyed([("CFG scale", "7"), ("Guidance rescale", "0.7")])


def test_other_tools_pairs_read_through_the_same_keys():
    a1111 = infotext.parse(
        "a cat\nNegative prompt: dog\nSteps: 30, Sampler: DPM++ 2M, Schedule type: Karras, "
        "CFG scale: 7, Seed: 1, Size: 832x1216, Model hash: 31e35c80fc, Model: sd_xl_base_1.0, "
        'Lora hashes: "ink: 0123456789, moss: 9876543210", Version: v1.10.1'
    )
    assert a1111.scheduler() == "dpmpp_2m_karras"
    assert a1111.get(infotext.SIZE) == (832, 1216)
    assert a1111.get(infotext.CFG_SCALE) == 7.0
    assert a1111.get(infotext.LORA_HASHES) == "ink: 0123456789, moss: 9876543210"
    assert a1111.get(infotext.VERSION) == "v1.10.1"
    assert a1111.settings(infotext.SETTING_KEYS) == {}  # no HalfSafe keys, no settings
    # Values a hostile file may hold read as missing, never as something else.
    odd = infotext.parse("x\nSteps: many, Seed: 1e400, Size: 1x2x3, CFG scale: nan, NaN step: -")
    for key in (
        infotext.STEPS,
        infotext.SEED,
        infotext.SIZE,
        infotext.CFG_SCALE,
        infotext.NAN_STEP,
    ):
        assert odd.get(key) is None, key
