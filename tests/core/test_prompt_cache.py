"""The prompt cache (Qwen-Image 2.1's keys and values of the text, kept by the pipeline at the
first step and reused by every later one) and the cause it can be: an image that goes NaN with
the cache on is made again without it before any precision repair is believed; a NaN the cache
held is named as the cache's, and a true fp16 overflow in the same model is still repaired as
an overflow. Faults are planted in diffusers' own cache object, never in a stand-in."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from diffusers.models.transformers import transformer_qwenimage21

from app.cli import main
from app.core import generation
from app.core.errors import HalfSafeError
from app.core.images.finished import read_parameters
from app.core.settings import PrecisionSettings
from app.core.words import infotext
from app.core.words.causes import cause_words
from tests.support.family_helpers import in_memory
from tests.support.family_rows import QWENIMAGE21_BLOCK
from tests.support.tiny_models import build_tiny_flux_pipeline, build_tiny_qwenimage21_pipeline

FP16 = PrecisionSettings(precision="fp16")
FP32 = PrecisionSettings(precision="fp32")


def _request(tmp_path, **values):
    values.setdefault("prompt_cache", True)
    return generation.GenerationRequest(
        prompt="a red cat",
        steps=3,
        cfg=1.0,
        seed=5,
        width=64,
        height=64,
        output_dir=str(tmp_path),
        **values,
    )


def _model(name: str):
    pipeline = build_tiny_qwenimage21_pipeline()
    assert pipeline.transformer.config.causal_condition  # the pipeline caches only then
    return in_memory(pipeline, name, "qwenimage21")


@pytest.fixture
def cache_use(monkeypatch):
    """Counts what diffusers' own per-layer cache stored (the first step) and gave back (every
    later step)."""
    counted = {"stored": 0, "read": 0}
    layer = transformer_qwenimage21.QwenImage21KVLayerCache
    store, get = layer.store, layer.get

    def counting_store(self, k, v):
        counted["stored"] += 1
        return store(self, k, v)

    def counting_get(self):
        counted["read"] += 1
        return get(self)

    monkeypatch.setattr(layer, "store", counting_store)
    monkeypatch.setattr(layer, "get", counting_get)
    return counted


@pytest.fixture
def poisoned_cache(monkeypatch):
    """A cache that holds NaN: the first step computes with the text's true keys and values,
    but what diffusers' cache keeps of them is NaN (a corrupted cache), so every later step
    reads NaN while a run without the cache is right."""
    layer = transformer_qwenimage21.QwenImage21KVLayerCache
    store = layer.store
    poisoned = {"stores": 0}

    def poisoning(self, k, v):
        poisoned["stores"] += 1
        store(self, torch.full_like(k, float("nan")), torch.full_like(v, float("nan")))

    monkeypatch.setattr(layer, "store", poisoning)
    return poisoned


def _text(path: str) -> str:
    text = read_parameters(path)
    assert text is not None
    return text


def _pixels(image) -> np.ndarray:
    return np.asarray(image.image if hasattr(image, "image") else image, dtype=np.float32)


def test_the_cache_runs_and_gives_the_image_made_without_it(tmp_path, cache_use):
    model = _model("qwen21-cache")
    (cached,) = generation.generate(
        model, _request(tmp_path / "on"), precision=FP32, device="cpu"
    ).images
    assert cache_use["stored"] > 0 and cache_use["read"] > 0  # kept once, then reused
    assert cached.status == "ok" and cached.prompt_cache is True
    stored, read = cache_use["stored"], cache_use["read"]
    result = generation.generate(
        model, _request(tmp_path / "off", prompt_cache=False), precision=FP32, device="cpu"
    )
    (plain,) = result.images
    assert (cache_use["stored"], cache_use["read"]) == (stored, read)  # off: never touched
    assert plain.status == "ok" and plain.prompt_cache is False
    assert result.to_json()["prompt_cache"] is False and plain.to_json()["prompt_cache"] is False
    on, off = _pixels(cached), _pixels(plain)
    assert np.isfinite(on).all()
    assert np.abs(on - off).max() <= 2.0  # 8-bit levels: the same image within rounding


def test_a_nan_the_cache_held_is_named_as_the_caches(tmp_path, poisoned_cache):
    model = _model("qwen21-cache-nan")
    result = generation.generate(model, _request(tmp_path), precision=FP16, device="cpu")
    (image,) = result.images
    assert poisoned_cache["stores"] > 0
    assert (image.status, image.cause, image.component) == ("fixed", "cache", "transformer")
    assert image.fixes_applied == ["made again without the prompt cache"]
    assert image.fix == {} and image.non_finite == 0.0
    assert "prompt cache" in image.message and "No precision fix" in image.message
    assert "Prompt cache off" in image.message and cause_words("cache") in image.message
    assert np.isfinite(_pixels(image)).all()
    # Its record says what made it: no prompt cache, so taking it back cannot bring the fault.
    assert image.prompt_cache is False and image.to_json()["prompt_cache"] is False
    assert result.to_json()["prompt_cache"] is True  # what was asked
    _, _, parameters = infotext.split_text(_text(image.path))
    assert infotext.PROMPT_CACHE.name not in parameters


def test_the_cache_stays_off_for_the_rest_of_the_job(tmp_path, poisoned_cache):
    model = _model("qwen21-cache-batch")
    images = generation.generate(
        model, _request(tmp_path, batch=2), precision=FP16, device="cpu"
    ).images
    assert [i.status for i in images] == ["fixed", "fixed"]
    assert all(i.cause == "cache" and not i.prompt_cache for i in images)


def test_a_true_overflow_with_the_cache_on_is_still_an_overflow(tmp_path, cache_use):
    pipeline = build_tiny_qwenimage21_pipeline()
    with torch.no_grad():
        pipeline.transformer.get_submodule(QWENIMAGE21_BLOCK).weight.mul_(1e6)
    model = in_memory(pipeline, "qwen21-cache-overflow", "qwenimage21")
    (image,) = generation.generate(model, _request(tmp_path), precision=FP16, device="cpu").images
    assert cache_use["read"] > 0  # the failing run had the cache on
    assert image.status == "fixed" and image.cause == "precision", image.message
    assert image.component == "transformer" and image.fix
    assert "made again without the prompt cache" not in image.fixes_applied
    assert np.isfinite(_pixels(image)).all()


def test_asked_first_the_cache_is_what_to_rule_out(tmp_path, poisoned_cache):
    model = _model("qwen21-cache-ask")
    precision = PrecisionSettings(precision="fp16", auto_fix="ask")
    (image,) = generation.generate(
        model, _request(tmp_path), precision=precision, device="cpu"
    ).images
    assert image.status == "nan" and image.cause is None and image.fix is None
    assert "with the prompt cache on" in image.message
    assert "make the image again with Prompt cache off" in image.message


def test_the_png_names_the_cache_and_explain_reads_it(tmp_path):
    from app.core.explain import read_image
    from app.ui.image_entry import GalleryEntry

    model = _model("qwen21-cache-png")
    (image,) = generation.generate(model, _request(tmp_path), precision=FP16, device="cpu").images
    assert image.status == "ok" and image.prompt_cache is True
    _, _, parameters = infotext.split_text(_text(image.path))
    assert parameters[infotext.PROMPT_CACHE.name] == "on"
    entry = GalleryEntry.from_parameters(_text(image.path), image.path, "HalfSafe")
    assert entry.generate_values()["prompt_cache"] is True  # "Reuse" sets the form's box
    record, _, _ = read_image(image.path)
    assert json.loads(json.dumps(record.to_json()))["step_caches"] == [{"node": "Prompt cache"}]


def test_another_family_refuses_the_cache_in_one_sentence(tmp_path):
    model = in_memory(build_tiny_flux_pipeline(), "flux-prompt-cache", "flux-dev")
    with pytest.raises(HalfSafeError) as caught:
        generation.generate(model, _request(tmp_path), precision=FP16, device="cpu")
    message = str(caught.value)
    assert message.endswith("turn Prompt cache off.") and "Qwen-Image 2.1" in message
    assert message.count(". ") == 0 and "\n" not in message


def test_cli_refuses_the_cache_for_another_family_with_exit_2(tmp_path, capsys):
    status = main(["generate", "demo", "--prompt-cache", "on", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "turn Prompt cache off" in err
    fast = ["--steps", "2", "--width", "64", "--height", "64", "--json"]
    off = ["generate", "demo", *fast, "--prompt-cache", "off", "--out", str(tmp_path)]
    assert main(off) == 0
    assert json.loads(capsys.readouterr().out)["prompt_cache"] is False


def test_cli_prompt_cache_takes_on_or_off(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "demo", "--prompt-cache", "maybe"])
    assert exit_info.value.code == 2
    assert "neither on nor off" in capsys.readouterr().err


def _rows():
    from tests.support.family_rows import ROWS

    return ROWS


@pytest.mark.parametrize("name", sorted(_rows()))
def test_every_family_says_truly_whether_it_takes_the_prompt_cache(tmp_path, name, cache_use):
    """A family that says it takes the prompt cache runs a generation with it (the cache kept
    and read, the image finite); one that says not refuses it in one sentence, before anything
    runs."""
    from app.core.families import family_of

    row = _rows()[name]
    pipeline = row.build()
    family = family_of(pipeline)
    model = in_memory(pipeline, f"{name}-prompt-cache", row.architecture, row.prediction)
    if not family.takes_prompt_cache:
        with pytest.raises(HalfSafeError, match="turn Prompt cache off"):
            generation.generate(model, _request(tmp_path), precision=FP16, device="cpu")
        assert cache_use == {"stored": 0, "read": 0}
        return
    (image,) = generation.generate(model, _request(tmp_path), precision=FP16, device="cpu").images
    assert image.status == "ok" and cache_use["read"] > 0


def test_the_watch_keeps_a_failing_call_that_runs_again_without_the_cache(poisoned_cache):
    """A call that read NaN from the cache is kept without the cache's arguments: run again
    alone, it computes the text's keys and values itself, and comes out finite."""
    from app.core.families import family_of
    from app.core.generation.watch import NanWatch

    pipeline = build_tiny_qwenimage21_pipeline()
    family = family_of(pipeline)
    transformer = pipeline.transformer
    watch = NanWatch(
        transformer,
        1,
        sample_argument=family.sample_argument,
        timestep_argument=family.timestep_argument,
    )
    try:
        with torch.inference_mode():
            pipeline(
                prompt="a red cat",
                height=64,
                width=64,
                num_inference_steps=3,
                output_type="latent",
                **family.prompt_cache_arguments(True),
            )
    finally:
        watch.remove()
    assert poisoned_cache["stores"] > 0 and bool(watch.bad[0])
    kept = watch.failing_input(0)
    assert kept is not None and "kv_cache" not in kept and "kv_cache_mode" not in kept
    with torch.inference_mode():
        output = transformer(**{**kept, "return_dict": False})[0]
    assert torch.isfinite(output).all()


def test_an_edit_with_real_cfg_keeps_the_pictures_in_the_cache_and_is_ruled_out_the_same(
    tmp_path, poisoned_cache
):
    """An edit caches the reference pictures' keys and values beside the text's, for the
    prompt and the negative prompt (real CFG): a NaN held there is the cache's too."""
    from PIL import Image

    from tests.support.edit_checks import edit_request

    path = tmp_path / "ref.png"
    rng = np.random.RandomState(0)
    Image.fromarray((rng.rand(64, 64, 3) * 255).astype(np.uint8)).save(path)
    model = _model("qwen21-cache-edit")
    request = edit_request(tmp_path, [str(path)], prompt_cache=True)
    (image,) = generation.generate(model, request, precision=FP16, device="cpu").images
    assert poisoned_cache["stores"] >= 2 * len(model.pipeline.transformer.transformer_blocks)
    assert (image.status, image.cause) == ("fixed", "cache"), image.message
    assert image.fixes_applied == ["made again without the prompt cache"]
    assert np.isfinite(_pixels(image)).all()
