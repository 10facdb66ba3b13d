"""A NaN that does not come back on an identical re-run is an intermittent kernel or device
fault, not the model: proved with a planted attention kernel that returns NaN on one call in
10,000 (a deterministic counter, installed the way a user's patched kernel is: in place of
torch.nn.functional.scaled_dot_product_attention), while a true fp16 overflow (a layer's weights
scaled past 65504) is still named `precision`."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from PIL import Image

from app.core import causes
from app.core.components import Verdict
from app.core.fixing import profiles
from app.core.generation import GenerationRequest, generate
from app.core.health.request import CheckRequest, CheckRun
from app.core.settings import PrecisionSettings
from app.core.words.causes import CAUSE_WORDS, cause_words
from tests.support.generation_models import variant
from tests.support.tiny_models import build_tiny_sd_pipeline

FF_LAYER = "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.0.proj"
EVERY = 10_000


class RareNaN:
    """Attention that returns NaN on calls `first`, `first + every`, ... counted from when it is
    installed, and is right on every other call."""

    def __init__(self, first: int, every: int = EVERY):
        self.real = F.scaled_dot_product_attention
        self.first, self.every, self.calls, self.struck = first, every, 0, 0

    def __call__(self, *args, **kwargs):
        out = self.real(*args, **kwargs)
        self.calls += 1
        if self.calls >= self.first and (self.calls - self.first) % self.every == 0:
            self.struck += 1
            return torch.full_like(out, math.nan)
        return out


@pytest.fixture(scope="module")
def base():
    return build_tiny_sd_pipeline()


def request(tmp_path, **kwargs) -> GenerationRequest:
    values = {
        "prompt": "a lighthouse at dusk",
        "steps": 3,
        "width": 64,
        "height": 64,
        "seed": 1234,
        "output_dir": str(tmp_path / "out"),
    }
    values.update(kwargs)
    return GenerationRequest(**values)


def first_call_in(module, run) -> int:
    """The number of the first attention call made inside `module` during `run()`, counted
    as RareNaN counts (a clean counting kernel installed the same way)."""
    counter = RareNaN(first=10**12)
    seen: list[int] = []
    hook = module.register_forward_pre_hook(lambda *_: seen.append(counter.calls))
    F.scaled_dot_product_attention = counter
    try:
        run()
    finally:
        F.scaled_dot_product_attention = counter.real
        hook.remove()
    assert seen, "the module never ran"
    return seen[0] + 1


def test_a_nan_that_does_not_recur_in_generation_is_intermittent(base, tmp_path, monkeypatch):
    model = variant(base, "flaky-unet")
    precision = PrecisionSettings(precision="fp32", auto_fix="auto")

    def make():
        return generate(model, request(tmp_path), precision=precision, device="cpu")

    clean = make().images[0]
    strike = first_call_in(model.pipeline.unet, make)
    kernel = RareNaN(first=strike)
    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel)
    result = make()
    (entry,) = result.images
    assert kernel.struck == 1  # the first run failed; nothing after it did
    assert (entry.status, entry.cause, entry.component) == ("fixed", "intermittent", "unet")
    assert entry.step == 1 and entry.fix == {}
    assert "did not come back on an identical re-run" in entry.message
    assert "not the model" in entry.message
    assert entry.settings == clean.settings  # made again unchanged, no precision moved
    with Image.open(entry.path) as image, Image.open(clean.path) as reference:
        assert np.array_equal(np.asarray(image), np.asarray(reference))
    assert profiles.remembered_fix("flaky-unet", result.device.name) is None
    assert entry.to_json()["cause"] == "intermittent"


def test_a_nan_in_the_vae_that_does_not_recur_keeps_the_latents(base, tmp_path, monkeypatch):
    model = variant(base, "flaky-vae")
    precision = PrecisionSettings(precision="fp32", auto_fix="auto")

    def make():
        return generate(model, request(tmp_path), precision=precision, device="cpu")

    try:
        strike = first_call_in(model.pipeline.vae.decoder, make)
    except AssertionError:
        pytest.skip("the tiny VAE's decoder has no attention")
    kernel = RareNaN(first=strike)
    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel)
    unet_calls = []
    hook = model.pipeline.unet.register_forward_hook(lambda *_: unet_calls.append(1))
    try:
        (entry,) = make().images
    finally:
        hook.remove()
    if kernel.struck == 0:
        pytest.skip("no attention call in the decoder reached the planted fault")
    assert (entry.status, entry.cause, entry.component) == ("fixed", "intermittent", "vae")
    assert len(unet_calls) == 3  # decoded again from the same latents, no new denoising


def test_a_true_fp16_overflow_is_still_precision(base, tmp_path, monkeypatch):
    unet = copy.deepcopy(base.unet)
    with torch.no_grad():
        unet.get_submodule(FF_LAYER).weight.mul_(1e5)
    model = variant(base, "overflow-unet", unet=unet)
    # The rare fault is installed too, striking far beyond this test's calls.
    kernel = RareNaN(first=EVERY)
    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel)
    result = generate(
        model,
        request(tmp_path),
        precision=PrecisionSettings(precision="fp16", auto_fix="auto"),
        device="cpu",
    )
    (entry,) = result.images
    assert kernel.struck == 0
    assert (entry.status, entry.cause, entry.component) == ("fixed", "precision", "unet")
    assert entry.fix
    assert profiles.remembered_fix("overflow-unet", result.device.name) is not None


def test_asked_repairs_offer_no_precision_fix_for_an_intermittent_nan(base, tmp_path, monkeypatch):
    """With repairs asked for (`auto_fix="ask"`), the image stays as it came out; the quick
    test reruns the failing part unchanged, and a NaN that does not come back gets no
    precision fix offered, only the advice to make the image again."""
    model = variant(base, "flaky-ask")
    precision = PrecisionSettings(precision="fp32", auto_fix="ask")

    def make():
        return generate(model, request(tmp_path), precision=precision, device="cpu")

    strike = first_call_in(model.pipeline.unet, make)
    kernel = RareNaN(first=strike)
    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel)
    result = make()
    (entry,) = result.images
    assert kernel.struck == 1
    assert (entry.status, entry.cause, entry.component) == ("nan", "intermittent", "unet")
    assert entry.fix is None or entry.fix == {}
    assert "not the model" in entry.message and "same seed" in entry.message
    assert "fp32" not in entry.message and "bf16" not in entry.message
    assert profiles.remembered_fix("flaky-ask", result.device.name) is None


def test_asked_repairs_still_offer_the_fix_for_a_true_overflow(base, tmp_path, monkeypatch):
    unet = copy.deepcopy(base.unet)
    with torch.no_grad():
        unet.get_submodule(FF_LAYER).weight.mul_(1e5)
    model = variant(base, "overflow-ask", unet=unet)
    monkeypatch.setattr(F, "scaled_dot_product_attention", RareNaN(first=EVERY))
    result = generate(
        model,
        request(tmp_path),
        precision=PrecisionSettings(precision="fp16", auto_fix="ask"),
        device="cpu",
    )
    (entry,) = result.images
    assert (entry.status, entry.component) == ("nan", "unet")
    assert entry.cause is None
    assert entry.fix and "passed a quick test" in entry.message


def test_the_check_names_an_intermittent_fault_and_keeps_no_fix(base, monkeypatch):
    model = variant(base, "flaky-check")
    precision = PrecisionSettings(precision="fp32")

    def check():
        return causes.check_and_attribute(
            model,
            CheckRequest(precision=precision, device="cpu", size=64, steps=3),
            run=CheckRun(measure_cost=False),
        )

    assert check().verdict is Verdict.HEALTHY
    strike = first_call_in(model.pipeline.unet, check)
    kernel = RareNaN(first=strike)
    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel)
    report = check()
    assert kernel.struck == 1
    cause = report.cause
    assert cause is not None and cause.kind == "intermittent"
    assert (cause.component, cause.action, cause.verified) == ("unet", "rerun", True)
    assert cause.settings == {} and cause.quality is not None and cause.quality.passed
    assert "not the model" in cause.summary and "halfsafe gpu" in cause.summary
    assert report.verdict is Verdict.HEALTHY and report.fix is None
    assert "intermittent" in report.headline.lower()
    assert profiles.remembered_fix("flaky-check", report.device.name) is None
    document = report.to_json()
    assert document["cause"]["kind"] == "intermittent"
    assert document["cause"]["repair"]["action"] == "rerun"


def test_every_cause_kind_has_its_words():
    assert set(causes.CAUSES) <= set(CAUSE_WORDS)
    assert cause_words("intermittent").startswith("the NaN did not come back")
    assert cause_words("something-new") == "something-new"
