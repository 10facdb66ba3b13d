"""Placed copies kept from one job to the next (`precision.kept`): the generation after a check
runs the check's copies instead of casting the parts again, makes the same image as on a fresh
load, and makes new copies as soon as the loaded weights change; nothing is kept past the
job's memory budget, and running out of memory frees every kept copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from app.core import memory, work
from app.core.errors import OutOfMemoryError
from app.core.generation import GenerationRequest, generate
from app.core.precision import kept as kept_copies
from app.core.settings import PrecisionSettings
from tests.support.planted_sd import check, loaded
from tests.support.tiny_models import build_tiny_sd_pipeline

BF16 = PrecisionSettings(precision="bf16")


def request(tmp_path, name: str) -> GenerationRequest:
    return GenerationRequest(
        prompt="a lighthouse at dusk",
        steps=2,
        width=64,
        height=64,
        seed=1234,
        output_dir=str(tmp_path / name),
    )


def pixels(result) -> np.ndarray:
    with Image.open(result.images[0].path) as image:
        return np.asarray(image.convert("RGB")).copy()


def generated(model, tmp_path, name: str, precision=BF16):
    """A generation on `model` and the parts it placed (copies made, not taken back)."""
    with work.counting() as counted:
        result = generate(model, request(tmp_path, name), precision=precision, device="cpu")
    return result, counted.placements


def test_the_generation_after_a_check_takes_its_copies_and_makes_the_same_image(tmp_path):
    model = loaded(build_tiny_sd_pipeline())
    report = check(model, BF16)
    assert report.verdict == "healthy"
    assert model.kept.names() == ["text_encoder", "unet", "vae"]
    result, placed = generated(model, tmp_path, "after")
    assert placed == 0 and model.kept.taken == 3
    # The same image as a model loaded afresh, whose parts were cast for this job.
    fresh, placed_fresh = generated(loaded(build_tiny_sd_pipeline()), tmp_path, "fresh")
    assert placed_fresh == 3
    assert np.array_equal(pixels(result), pixels(fresh))
    # The next check takes the generation's copies in turn.
    with work.counting() as counted:
        assert check(model, BF16).verdict == "healthy"
    assert counted.placements == 0


def test_weights_changed_in_place_make_new_copies(tmp_path):
    model = loaded(build_tiny_sd_pipeline())
    generated(model, tmp_path, "first")
    with torch.no_grad():
        model.pipeline.unet.conv_in.weight.mul_(1.5)  # a new version of the same tensor
    changed, placed = generated(model, tmp_path, "changed")
    assert placed == 1  # the UNet; the text encoder and the VAE are as they were
    fresh_pipeline = build_tiny_sd_pipeline()
    with torch.no_grad():
        fresh_pipeline.unet.conv_in.weight.mul_(1.5)
    fresh, _ = generated(loaded(fresh_pipeline), tmp_path, "fresh")
    assert np.array_equal(pixels(changed), pixels(fresh))


def test_a_part_swapped_for_another_makes_a_new_copy(tmp_path):
    model = loaded(build_tiny_sd_pipeline())
    generated(model, tmp_path, "first")
    other = build_tiny_sd_pipeline()
    with torch.no_grad():
        other.vae.decoder.conv_out.bias.add_(0.25)
    object.__setattr__(model.pipeline, "vae", other.vae)  # as a separate VAE file loads
    swapped, placed = generated(model, tmp_path, "swapped")
    assert placed == 1
    fresh = build_tiny_sd_pipeline()
    object.__setattr__(fresh, "vae", other.vae)
    expected, _ = generated(loaded(fresh), tmp_path, "fresh")
    assert np.array_equal(pixels(swapped), pixels(expected))


def test_a_lora_strength_changed_between_jobs_makes_a_new_copy():
    """A peft layer's strength lives beside its tensors: it is part of what a copy was made
    from."""
    layer = torch.nn.Linear(4, 4)
    layer.scaling = {"lora0": 1.0}
    layer.active_adapters = ["lora0"]
    made = kept_copies.signature(layer)
    assert made.matches(kept_copies.signature(layer))
    layer.scaling["lora0"] = 0.5
    assert not made.matches(kept_copies.signature(layer))
    layer.scaling["lora0"] = 1.0
    layer.weight = torch.nn.Parameter(layer.weight.detach().clone())  # the same values, anew
    assert not made.matches(kept_copies.signature(layer))


def test_nothing_is_kept_past_the_memory_budget(tmp_path):
    """A budget that holds one part's copy at a time (the user's Memory budget): a part let go
    for another's stage is freed, as it always was."""
    model = loaded(build_tiny_sd_pipeline())
    unet_bytes = sum(p.numel() * 2 for p in model.pipeline.unet.parameters())
    budget_gb = unet_bytes * 1.2 / 2**30
    tight = PrecisionSettings(precision="bf16", max_vram_gb=budget_gb)
    _, placed = generated(model, tmp_path, "tight", precision=tight)
    assert placed == 3
    held = model.kept.bytes
    assert held <= budget_gb * 2**30 and "unet" not in model.kept.names()
    # Without a budget to price them by, nothing is kept.
    unpriced = loaded(build_tiny_sd_pipeline())
    from app.core.precision.placement import PlacedPipeline

    plan = _plan(unpriced)
    placed_pipeline = PlacedPipeline(unpriced.pipeline, plan, kept=unpriced.kept)
    placed_pipeline.release()
    assert unpriced.kept.bytes == 0


def _plan(model):
    from app.core.hardware import describe_device
    from app.core.precision.resolve import resolve_plan

    return resolve_plan(
        BF16,
        device="cpu",
        components=("text_encoder", "unet", "vae"),
        device_info=describe_device("cpu"),
        ask_device=False,
    )


def test_running_out_of_memory_frees_every_kept_copy(tmp_path):
    model = loaded(build_tiny_sd_pipeline())
    generated(model, tmp_path, "first")
    assert model.kept.bytes > 0
    with pytest.raises(OutOfMemoryError), memory.said_as_sentence("generating"):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert model.kept.bytes == 0 and model.kept.names() == []


def test_a_budget_from_free_memory_counts_kept_copies_as_free(tmp_path, monkeypatch):
    """The next job's budget is what it was before anything was kept: the copies it does not
    take give way to the copies it makes."""
    import psutil

    from app.core.fixing import job_plans

    model = loaded(build_tiny_sd_pipeline())
    generated(model, tmp_path, "first")
    held = model.kept.bytes
    assert held > 0 and job_plans.kept_on(model, "cpu") == held
    assert job_plans.kept_on(model, "cuda") == 0

    class Memory:
        available = 8 << 30
        total = 16 << 30

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory)
    from app.core.precision.streaming import device_budget

    without, _ = device_budget("cpu", held_bytes=1 << 30)
    with_kept, _ = device_budget("cpu", held_bytes=1 << 30, kept_bytes=held)
    assert with_kept == pytest.approx(without + held / 2**20)
