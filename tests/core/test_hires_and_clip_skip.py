"""Clip skip and the hires fix: the prompt read at A1111's "Clip skip" (checked against the
layer diffusers' own pipelines take for their `clip_skip`), a second pass at the final size
drawn under the NaN watch, written to the PNG in A1111's words, and read back by `explain` from
A1111's infotext and ComfyUI's graphs so the check runs at the size the second pass ran."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from app.core import explain, hires
from app.core.encoders.prompts import PromptError, encode_sd, encode_sdxl
from app.core.errors import HalfSafeError
from app.core.families import FAMILIES, family_of
from app.core.generation import GenerationRequest, generate
from app.core.generation.stages import _passes
from app.core.health.request import CheckRequest, CheckRun
from app.core.hires import Hires
from app.core.settings import PrecisionSettings
from app.core.words import infotext
from tests.support.generation_models import PROMPT, tiny_model
from tests.support.image_files import a1111_parameters, comfy_prompt, png_text
from tests.support.tiny_models import build_tiny_sd_pipeline, build_tiny_sdxl_pipeline

# -- Clip skip ---------------------------------------------------------------------------------


def _deep_sd():
    """The tiny SD pipeline with a 4-layer text encoder, so that skipping 2 or 3 layers is not
    the same as taking the embeddings."""
    pipe = build_tiny_sd_pipeline()
    config = pipe.text_encoder.config
    config.num_hidden_layers = 4
    torch.manual_seed(3)
    pipe.text_encoder = type(pipe.text_encoder)(config).eval()
    return pipe


@pytest.mark.parametrize("skip", [2, 3])
def test_sd_clip_skip_is_a_hidden_state_from_the_end_through_the_final_norm(skip):
    """A1111's "Clip skip: N" on SD: hidden state N from the end, then the final norm
    (computed here by hand: diffusers' own `clip_skip` reaches the norm through
    `text_model`, which transformers 5's CLIPTextModel no longer has); it differs from 1."""
    pipe = _deep_sd()
    ids = pipe.tokenizer(
        PROMPT, padding="max_length", max_length=77, truncation=True, return_tensors="pt"
    ).input_ids
    with torch.no_grad():
        ours = encode_sd(pipe, PROMPT, "", "cpu", False, clip_skip=skip)["prompt_embeds"]
        states = pipe.text_encoder(ids, output_hidden_states=True).hidden_states
        by_hand = pipe.text_encoder.final_layer_norm(states[-skip])
        plain = encode_sd(pipe, PROMPT, "", "cpu", False)["prompt_embeds"]
    torch.testing.assert_close(ours, by_hand)
    assert not torch.allclose(ours, plain)


def test_sd_clip_skip_one_is_the_pipelines_own_prompt():
    pipe = _deep_sd()
    with torch.no_grad():
        ours = encode_sd(pipe, PROMPT, "", "cpu", False, clip_skip=1)["prompt_embeds"]
        theirs, _ = pipe.encode_prompt(PROMPT, "cpu", 1, False)
    torch.testing.assert_close(ours, theirs)


def test_sdxl_clip_skip_two_is_its_default_and_three_one_layer_earlier():
    """SDXL always takes the penultimate layer: Clip skip 2 (what A1111 images record) is that
    layer; 3 is diffusers' `clip_skip=1` for SDXL (hidden state 3 from the end)."""
    pipe = build_tiny_sdxl_pipeline()
    for name in ("text_encoder", "text_encoder_2"):  # 4 layers: 3 from the end is a layer
        encoder = getattr(pipe, name)
        encoder.config.num_hidden_layers = 4
        torch.manual_seed(4)
        setattr(pipe, name, type(encoder)(encoder.config).eval())
    with torch.no_grad():
        default = encode_sdxl(pipe, PROMPT, "", "cpu", False)["prompt_embeds"]
        two = encode_sdxl(pipe, PROMPT, "", "cpu", False, clip_skip=2)["prompt_embeds"]
        three = encode_sdxl(pipe, PROMPT, "", "cpu", False, clip_skip=3)
        theirs = pipe.encode_prompt(
            PROMPT, device=torch.device("cpu"), do_classifier_free_guidance=False, clip_skip=1
        )
    torch.testing.assert_close(two, default)
    torch.testing.assert_close(three["prompt_embeds"], theirs[0])
    torch.testing.assert_close(three["pooled_prompt_embeds"], theirs[2])


def test_a_clip_skip_past_the_encoders_layers_is_one_sentence():
    pipe = build_tiny_sd_pipeline()
    layers = pipe.text_encoder.config.num_hidden_layers
    with pytest.raises(PromptError, match=f"Clip skip {layers + 1} is more layers than"):
        encode_sd(pipe, PROMPT, "", "cpu", False, clip_skip=layers + 1)


def test_a_clip_skip_never_runs_the_layers_after_the_one_it_reads(tmp_path):
    """An overflow in the last CLIP layer, which Clip skip 2 never reads: the check at clip
    skip 2 (with its attribution, as `halfsafe check --clip-skip 2` runs it) is healthy and
    never runs that layer, and the generation at that setting is clean; at clip skip 1, which
    reads it, the same model is flagged at that layer."""
    from app.core import causes
    from tests.support.planted_sd import loaded

    pipe = build_tiny_sd_pipeline()
    last = f"encoder.layers.{pipe.text_encoder.config.num_hidden_layers - 1}"
    with torch.no_grad():
        pipe.text_encoder.get_submodule(f"{last}.mlp.fc1").weight.mul_(1e5)
    ran: list[str] = []
    pipe.text_encoder.get_submodule(f"{last}.mlp").register_forward_hook(
        lambda *_: ran.append("mlp")
    )
    fp16 = PrecisionSettings(precision="fp16")

    def check(skip: int):
        return causes.check_and_attribute(
            loaded(pipe, f"last-layer-{skip}"),
            CheckRequest(precision=fp16, device="cpu", size=64, clip_skip=skip),
            run=CheckRun(remember=False, measure_cost=False),
        )

    skipped = check(2)
    assert skipped.verdict == "healthy", (skipped.headline, skipped.cause)
    assert skipped.cause is None and skipped.components["text_encoder"].status == "ok"
    assert ran == []  # the unread layer was never computed
    assert "forward" not in pipe.text_encoder.get_submodule(last).__dict__  # and is as it was
    request = GenerationRequest(
        prompt=PROMPT, steps=2, seed=1, width=64, height=64, clip_skip=2, output_dir=str(tmp_path)
    )
    off = dataclasses.replace(fp16, auto_fix="off")
    (image,) = generate(loaded(pipe, "last-layer-gen"), request, precision=off, device="cpu").images
    assert image.status == "ok" and ran == []

    read = check(1)
    assert read.verdict != "healthy" and ran
    assert read.components["text_encoder"].first_bad_module == f"{last}.mlp.fc1"


def test_only_the_clip_families_take_a_clip_skip():
    takes = {type(f).__name__ for f in FAMILIES if f.takes_clip_skip}
    assert takes == {"StableDiffusionFamily", "SDXLFamily"}
    for family in FAMILIES:
        assert family.clip_skip_problem(1) is None
        problem = family.clip_skip_problem(2)
        assert (problem is None) == family.takes_clip_skip
        if problem is not None:
            assert family.title in problem and "set Clip skip to 1" in problem


# -- the hires fix as a record -----------------------------------------------------------------


def test_a_hires_fix_runs_a1111s_step_count_at_its_size():
    two = Hires(scale=2.0, steps=10, denoise=0.7)
    assert two.final_size(512, 768) == (1024, 1536)
    assert Hires(scale=1.5).final_size(500, 300) == (744, 448)  # down to multiples of 8
    assert (two.call_steps(25), two.steps_run(25)) == (15, 10)  # its own 10 steps run
    same = Hires(scale=2.0, steps=0, denoise=0.7)
    assert (same.call_steps(25), same.steps_run(25)) == (25, 17)  # 0: denoise of the first's
    for steps, denoise in [(3, 0.3), (7, 0.45), (20, 1.0), (1, 0.01)]:
        assert Hires(2.0, steps, denoise).steps_run(30) == steps
    assert not Hires().on and Hires().checked() == Hires()


@pytest.mark.parametrize(
    ("hires_fix", "words"),
    [
        (Hires(scale=4.5), "Hires upscale: 4.5 is not between 1 (off) and 4"),
        (Hires(scale=0.5), "Hires upscale: 0.5 is not between 1"),
        (Hires(scale=2.0, steps=151), "Hires steps: 151 is not between 0"),
        (Hires(scale=2.0, denoise=0.0), "Hires denoising strength: 0.0 is not between 0 and 1"),
        (Hires(scale=2.0, upscaler="ESRGAN_4x"), "upscaler ESRGAN_4x (a model file of its own"),
    ],
)
def test_a_hires_fix_out_of_range_is_one_sentence(hires_fix, words):
    with pytest.raises(HalfSafeError, match=words.replace("(", r"\(").replace(")", r"\)")):
        hires_fix.checked()


def test_upscalers_are_read_in_each_tools_words():
    assert hires.key_for("Latent") == "latent"
    assert hires.key_for("latent (nearest-exact)") == "latent_nearest_exact"
    assert hires.key_for("bicubic") == "latent_bicubic"  # ComfyUI's LatentUpscale method
    assert hires.key_for("latent_area") == "latent_area"
    assert hires.key_for("4x-UltraSharp") is None
    assert hires.refusal("4x-UltraSharp").endswith("; the closest it runs is Lanczos.")
    assert "closest it runs is Latent" in hires.refusal("bislerp")


def test_latents_are_enlarged_to_the_final_sizes_latents():
    latents = torch.arange(2 * 4 * 8 * 6, dtype=torch.float16).reshape(2, 4, 8, 6)
    for upscaler in (key for key in hires.KEYS if not hires.enlarges_pixels(key)):
        out = hires.upscale(latents, (96, 128), upscaler, 8)
        assert out.shape == (2, 4, 16, 12) and out.dtype == torch.float16
    nearest = hires.upscale(latents.float(), (96, 128), "latent_nearest", 8)
    torch.testing.assert_close(nearest[..., ::2, ::2], latents.float())


def test_the_watch_counts_a_second_pass_step_after_the_first_pass():
    """Per image: the first pass's flag wins; a step of the second pass is counted after the
    first pass's steps; no watch, nothing."""
    first, second = object(), object()
    # batch 2, two watches: [bad0, bad1, step0, step1] per watch
    flags = [0, 1, -1, 4] + [1, 1, 2, 0]
    found = _passes(flags, [first, second], 2, first_steps=6)
    assert found == [(True, 8, second), (True, 4, first)]
    assert _passes([], [None, None], 2, 6) == [(False, -1, None), (False, -1, None)]


# -- a generation with a second pass -----------------------------------------------------------


def test_a_hires_fix_draws_a_second_pass_at_the_final_size(tmp_path, home):
    seen: list[tuple[str, int, int]] = []
    request = GenerationRequest(
        prompt=PROMPT,
        steps=4,
        seed=7,
        width=64,
        height=96,
        output_dir=str(tmp_path),
        clip_skip=2,
        hires=Hires(scale=2.0, steps=3, denoise=0.5, upscaler="latent_nearest_exact"),
    )
    result = generate(
        tiny_model(),
        request,
        precision=PrecisionSettings(),
        device="cpu",
        on_progress=lambda stage, done, total: seen.append((stage, done, total)),
    )
    (image,) = result.images
    assert image.image.size == (128, 192) and image.status == "ok"
    assert ("Generating", 4, 4) in seen and ("Hires fix", 3, 3) in seen
    assert not [s for s in seen if s[0] == "Hires fix" and s[2] != 3]
    parsed = infotext.parse(image.parameters)
    assert parsed.get(infotext.SIZE) == (64, 96)
    assert parsed.get(infotext.HIRES_UPSCALER) == "Latent (nearest-exact)"
    document = json.loads(json.dumps(result.to_json()))
    assert document["hires"]["size"] == [128, 192] and document["clip_skip"] == 2


def test_a_hires_fix_differs_from_the_first_pass_alone(home):
    model = tiny_model()
    base = GenerationRequest(prompt=PROMPT, steps=3, seed=5, width=64, height=64)
    once = generate(model, base, precision=PrecisionSettings(), device="cpu").images[0]
    twice = generate(
        model,
        dataclasses.replace(base, hires=Hires(scale=1.5, denoise=0.6)),
        precision=PrecisionSettings(),
        device="cpu",
    ).images[0]
    assert once.image.size == (64, 64) and twice.image.size == (96, 96)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"images": ["x.png"]}, "Hires fix is a second pass after text-to-image"),
        ({"hires": Hires(scale=2.0, steps=0, denoise=0.1)}, "runs no step"),
        ({"clip_skip": 13}, "Clip skip"),
    ],
)
def test_a_second_pass_that_cannot_run_is_one_sentence(tmp_path, home, change, words):
    picture = tmp_path / "x.png"
    from PIL import Image

    Image.new("RGB", (64, 64)).save(picture)
    if "images" in change:
        change = {"images": [str(picture)], "hires": Hires(scale=2.0)}
    request = dataclasses.replace(
        GenerationRequest(prompt=PROMPT, steps=4, width=64, height=64), **change
    )
    with pytest.raises(HalfSafeError, match=words):
        generate(tiny_model(), request, precision=PrecisionSettings(), device="cpu")


def test_a_family_without_clip_refuses_a_clip_skip():
    flux = next(f for f in FAMILIES if not f.takes_clip_skip)
    sd = family_of(build_tiny_sd_pipeline())
    assert sd.clip_skip_problem(2) is None
    assert "does not read its prompt from them" in (flux.clip_skip_problem(2) or "")


# -- explain reads both --------------------------------------------------------------------------


def test_an_a1111_hires_image_records_its_second_pass_and_clip_skip(tmp_path):
    text = a1111_parameters(
        "anime", "0123456789", **{"Clip skip": 2, "Hires upscale": 2, "Hires upscaler": "Latent"}
    )
    record, _status, _ = explain.read_image(png_text(tmp_path / "a.png", {"parameters": text}))
    assert (record.width, record.hires_size, record.clip_skip) == (64, (128, 128), 2)
    assert record.hires_upscaler == "Latent"
    resized = a1111_parameters("anime", "0123456789", **{"Hires resize": "96x80"})
    record, _status, _ = explain.read_image(png_text(tmp_path / "b.png", {"parameters": resized}))
    assert record.hires_size == (96, 80)
    absurd = a1111_parameters("anime", "0123456789", **{"Hires upscale": "1e9"})
    record, _status, _ = explain.read_image(png_text(tmp_path / "c.png", {"parameters": absurd}))
    assert record.hires_size is None


def _two_pass_prompt(upscale: dict) -> str:
    graph = json.loads(comfy_prompt("dreamy-v2.safetensors"))
    graph["8"] = upscale
    graph["9"] = {"class_type": "CLIPSetLastLayer", "inputs": {"stop_at_clip_layer": -2}}
    return json.dumps(graph)


@pytest.mark.parametrize(
    ("upscale", "size", "words"),
    [
        (
            {
                "class_type": "LatentUpscaleBy",
                "inputs": {"upscale_method": "bislerp", "scale_by": 1.5},
            },
            (96, 96),
            "bislerp",
        ),
        (
            {
                "class_type": "LatentUpscale",
                "inputs": {
                    "upscale_method": "nearest-exact",
                    "width": 128,
                    "height": 96,
                    "crop": "disabled",
                },
            },
            (128, 96),
            "nearest-exact",
        ),
        (
            {
                "class_type": "ImageScaleBy",
                "inputs": {"upscale_method": "lanczos", "scale_by": 2.0},
            },
            (128, 128),
            "lanczos (pixels)",
        ),
    ],
)
def test_a_comfyui_two_pass_graph_records_the_larger_pass(tmp_path, upscale, size, words):
    image = png_text(tmp_path / "ComfyUI_00001_.png", {"prompt": _two_pass_prompt(upscale)})
    record, _status, _ = explain.read_image(image)
    assert (record.width, record.hires_size, record.hires_upscaler) == (64, size, words)
    assert record.clip_skip == 2


def test_the_check_of_a_second_pass_runs_at_its_size_up_to_twice_native():
    record = explain.Record(width=512, height=512, hires_size=(1024, 1024))
    assert explain._probe_size(record, 512) == 1024
    assert explain._probe_size(dataclasses.replace(record, hires_size=(2048, 1536)), 512) == 1024
    assert explain._probe_size(explain.Record(width=512, height=512), 512) == 512


def test_explain_checks_a_hires_image_at_the_second_pass_with_its_clip_skip_and_sampler(
    tmp_path, home, monkeypatch
):
    """The A1111 story: "DPM++ 2M SDE" with "Schedule type: Karras", "Clip skip: 2" and a 2x
    hires fix; the check runs at the final size with those settings (the check itself is
    stood in for: what it is asked is the point here)."""
    from app.core import causes
    from app.core.explain import explanation as module
    from app.core.explain.matching import ModelMatch

    model = tiny_model()
    model.source = str(tmp_path / "anime.safetensors")
    (tmp_path / "anime.safetensors").write_bytes(b"0")
    asked: dict = {}

    def check(_model, request, **_how):
        asked.update(vars(request))  # what the check is asked, field by field
        raise HalfSafeError("stopped here")

    monkeypatch.setattr(causes, "check_and_attribute", check)
    text = a1111_parameters(
        "anime",
        "0123456789",
        **{
            "Sampler": "DPM++ 2M SDE",
            "Schedule type": "Karras",
            "Clip skip": 2,
            "Hires upscale": 2,
            "Size": "32x32",
        },
    )
    image = png_text(tmp_path / "00001-1.png", {"parameters": text})
    record, status, figures = explain.read_image(image)
    match = ModelMatch(True, model.source, [str(tmp_path)], matched_by="name")
    found = module.Explanation(str(image), "a1111", status, record, figures, match)
    with pytest.raises(HalfSafeError, match="stopped here"):
        module._run_check(found, "cpu", model, False, lambda *_: None, None)
    assert asked["size"] == 64 and asked["clip_skip"] == 2
    assert asked["scheduler"] == "dpmpp_2m_sde_karras"
    assert any("drawn again at 64x64" in note for note in found.notes)


def test_a_final_picture_past_80_million_pixels_is_refused_in_one_sentence():
    """4096x4096 upscaled 4x is 268 million pixels: refused where every generation request is
    checked (the CLI's, the window's and the engine's), the hires fix's upscale included."""
    from app.core.generation.entry import _checked_request
    from app.core.images.pictures import Mode

    big = GenerationRequest(prompt=PROMPT, width=4096, height=4096, hires=Hires(scale=4.0))
    with pytest.raises(HalfSafeError) as caught:
        _checked_request(big, Mode.TEXT)
    assert str(caught.value) == (
        "4096x4096 upscaled 4x by the hires fix is a 16384x16384 picture (268 million "
        "pixels), past the 80 million HalfSafe draws: lower the size or the upscale."
    )
    # 2048x2048 upscaled 4x (67 million) and 4096x4096 alone are within the bound.
    _checked_request(dataclasses.replace(big, width=2048, height=2048), Mode.TEXT)
    _checked_request(dataclasses.replace(big, hires=Hires()), Mode.TEXT)


def test_the_command_refuses_a_picture_past_the_bound_before_the_model_loads(monkeypatch, capsys):
    from app.cli import main
    from app.core import models
    from tests.support.cli_output import without_progress

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(models, "load_model", no_load)
    argv = ["generate", "demo", "--width", "4096", "--height", "4096", "--hires-scale", "4"]
    assert main(argv) == 2
    err = without_progress(capsys.readouterr().err)
    assert err.count("\n") == 1 and "268 million pixels" in err
