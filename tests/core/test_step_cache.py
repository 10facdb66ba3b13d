"""The step cache (diffusers' first-block cache) and the cause it can be: an image that goes NaN
with the cache on is made again without it before any precision repair is believed; a NaN the
cache held and replayed is named as the cache's, and a true fp16 overflow in the same model is
still repaired as an overflow."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers.hooks import first_block_cache

from app.cli import main
from app.core import generation
from app.core.errors import HalfSafeError
from app.core.images.finished import read_parameters
from app.core.settings import PrecisionSettings
from app.core.words import infotext
from tests.support.family_helpers import in_memory
from tests.support.tiny_models import build_tiny_flux_pipeline, build_tiny_sd_pipeline

FP16 = PrecisionSettings(precision="fp16")
FLUX_FF = "transformer_blocks.0.ff.net.2"
# The cache replays a step's tail when the first block's output moved by less than this share:
# this high, every step after the first is replayed on the tiny model.
THRESHOLD = 0.99


def _request(tmp_path, **values):
    values.setdefault("step_cache", THRESHOLD)
    return generation.GenerationRequest(
        prompt="a red cat",
        steps=4,
        cfg=3.5,
        seed=5,
        width=64,
        height=64,
        output_dir=str(tmp_path),
        **values,
    )


@pytest.fixture
def replays(monkeypatch):
    """Counts the steps the cache replayed instead of computing (the tail blocks skipped)."""
    counted = {"replayed": 0}
    original = first_block_cache.FBCBlockHook.new_forward

    def counting(self, module, *args, **kwargs):
        if self.is_tail and not self.state_manager.get_state().should_compute:
            counted["replayed"] += 1
        return original(self, module, *args, **kwargs)

    monkeypatch.setattr(first_block_cache.FBCBlockHook, "new_forward", counting)
    return counted


@pytest.fixture
def poisoned_cache(monkeypatch):
    """A cache that holds NaN: what the tail blocks computed is cached as NaN (a stale or
    corrupted cache), so every replayed step adds NaN while every computed step is right."""
    original = first_block_cache.FBCBlockHook.new_forward

    def poisoning(self, module, *args, **kwargs):
        output = original(self, module, *args, **kwargs)
        state = self.state_manager.get_state()
        if self.is_tail and state.should_compute and state.tail_block_residuals is not None:
            state.tail_block_residuals = tuple(
                None if r is None else torch.full_like(r, float("nan"))
                for r in state.tail_block_residuals
            )
        return output

    monkeypatch.setattr(first_block_cache.FBCBlockHook, "new_forward", poisoning)


def test_the_cache_runs_and_leaves_no_hook_behind(tmp_path, replays):
    model = in_memory(build_tiny_flux_pipeline(), "flux-cache", "flux-dev")
    result = generation.generate(model, _request(tmp_path), precision=FP16, device="cpu")
    (image,) = result.images
    assert image.status == "ok" and replays["replayed"] > 0  # steps were skipped
    assert image.step_cache == THRESHOLD
    _, _, parameters = infotext.split_text(read_parameters(image.path))
    assert parameters["First block cache"] == "0.99"
    assert result.to_json()["step_cache"] == THRESHOLD
    # The cache is the job's: no layer of the loaded transformer keeps a hook.
    registries = [getattr(m, "_diffusers_hook", None) for m in model.pipeline.transformer.modules()]
    assert all(r is None or not r.hooks for r in registries)


def test_a_nan_the_cache_replayed_is_named_as_the_caches(tmp_path, poisoned_cache):
    model = in_memory(build_tiny_flux_pipeline(), "flux-cache-nan", "flux-dev")
    result = generation.generate(model, _request(tmp_path), precision=FP16, device="cpu")
    (image,) = result.images
    assert (image.status, image.cause, image.component) == ("fixed", "cache", "transformer")
    assert image.fixes_applied == ["made again without the step cache"]
    assert image.fix == {} and image.non_finite == 0.0
    assert "step cache" in image.message and "No precision fix" in image.message
    # Its record says what made it: no step cache, so taking it back cannot bring the fault.
    assert image.step_cache == 0.0 and image.to_json()["step_cache"] == 0.0
    _, _, parameters = infotext.split_text(read_parameters(image.path))
    assert "First block cache" not in parameters


def test_a_true_overflow_with_the_cache_on_is_still_an_overflow(tmp_path, replays):
    pipeline = build_tiny_flux_pipeline()
    with torch.no_grad():
        pipeline.transformer.get_submodule(FLUX_FF).weight.mul_(1e6)
    model = in_memory(pipeline, "flux-cache-overflow", "flux-dev")
    result = generation.generate(model, _request(tmp_path), precision=FP16, device="cpu")
    (image,) = result.images
    assert image.status == "fixed" and image.cause == "precision"
    assert image.component == "transformer" and image.fix
    assert "made again without the step cache" not in image.fixes_applied


def test_asked_first_the_cache_is_what_to_rule_out_not_an_intermittent_fault(
    tmp_path, poisoned_cache
):
    model = in_memory(build_tiny_flux_pipeline(), "flux-cache-ask", "flux-dev")
    precision = PrecisionSettings(precision="fp16", auto_fix="ask")
    (image,) = generation.generate(model, _request(tmp_path), precision=precision).images
    assert image.status == "nan" and image.cause is None and image.fix is None
    assert "Step cache 0" in image.message


def test_a_unet_model_refuses_the_cache_in_one_sentence(tmp_path):
    model = in_memory(build_tiny_sd_pipeline(), "sd-cache", "sd1", "epsilon")
    with pytest.raises(HalfSafeError, match="set Step cache to 0"):
        generation.generate(model, _request(tmp_path), precision=FP16, device="cpu")


def test_cli_step_cache_out_of_range_is_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "demo", "--step-cache", "2"])
    assert exit_info.value.code == 2
    assert "--step-cache: 2 is above the maximum 1" in capsys.readouterr().err


def test_explain_reads_halfsafes_own_step_cache(tmp_path):
    """HalfSafe's PNG names its step cache as the step-cache extensions do, so that explain
    reads it as a recorded cache."""
    from app.core.explain import read_image

    model = in_memory(build_tiny_flux_pipeline(), "flux-cache-png", "flux-dev")
    (image,) = generation.generate(model, _request(tmp_path), precision=FP16).images
    record, _, _ = read_image(image.path)
    assert json.loads(json.dumps(record.to_json()))["step_caches"] == [
        {"node": "First block cache"}
    ]


def _rows():
    from tests.support.family_rows import ROWS

    return ROWS


@pytest.mark.parametrize("name", sorted(_rows()))
def test_every_family_says_truly_whether_it_takes_the_step_cache(tmp_path, name, replays):
    """A family that says it takes the step cache runs a generation with it (steps replayed,
    the image finite); one that says not refuses it in one sentence, before anything runs."""
    from app.core.families import family_of

    row = _rows()[name]
    pipeline = row.build()
    family = family_of(pipeline)
    model = in_memory(pipeline, f"{name}-cache", row.architecture, row.prediction)
    if not family.takes_step_cache:
        with pytest.raises(HalfSafeError, match="set Step cache to 0"):
            generation.generate(model, _request(tmp_path), precision=FP16, device="cpu")
        return
    (image,) = generation.generate(model, _request(tmp_path), precision=FP16, device="cpu").images
    assert image.status == "ok" and replays["replayed"] > 0
