"""A memory budget (`max_vram_gb`): a component that would not fit in a dtype wider than it is
stored in keeps its stored weights and computes in the wider dtype layer by layer; one that
would not fit even as stored streams block by block. The answers are those of a resident copy
in the wider dtype, exactly (a cast from fp16 to fp32 is exact), so a check under a budget gives
the same verdict, layer and fix, while holding the stored bytes or one block at a time.

The budget makes the same plan on a CPU as on a GPU, so these run here."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from app.core import health
from app.core.health.request import CheckRequest, CheckRun
from app.core.precision import PrecisionPlan, placement
from app.core.settings import PrecisionSettings
from tests.support.planted_sd import half_stored, loaded, unet_inputs
from tests.support.tiny_models import build_tiny_sd_pipeline

PARTS = ("text_encoder", "unet", "vae")
TINY_BUDGET_GB = 0.001  # 1 MiB: less than any tiny component in fp32
STREAM_BUDGET_GB = 0.0001  # 0.1 MiB: less than any tiny component as stored: all stream
# MiB between the failing part's stored fp16 bytes and its fp32 copy's (UNet 2.8 / 5.6, VAE
# 0.6 / 1.2): it computes wider in place, whole.
IN_PLACE_MB = {"unet": 4.0, "vae": 1.0}


def _plan(budget_mb: float | None, **dtypes: str) -> PrecisionPlan:
    return PrecisionPlan(
        device="cpu",
        dtypes={"text_encoder": "fp32", "unet": "fp32", "vae": "fp32", **dtypes},
        memory_budget_mb=budget_mb,
    )


def test_a_part_over_the_budget_computes_wider_from_its_stored_weights_exactly():
    pipeline = half_stored()
    inputs = unet_inputs(pipeline)
    resident = placement.PlacedPipeline(pipeline, _plan(None), components=["unet"])
    budgeted = placement.PlacedPipeline(pipeline, _plan(IN_PLACE_MB["unet"]), components=["unet"])
    wide, narrow = resident["unet"], budgeted["unet"]
    assert wide.conv_in.weight.dtype == torch.float32
    assert narrow.conv_in.weight.dtype == torch.float16  # stored as it was
    assert narrow.dtype == torch.float32  # and says what it computes in
    with torch.inference_mode():
        expected = wide(**inputs).sample
        got = narrow(**inputs).sample
    assert got.dtype == torch.float32
    assert torch.equal(got, expected)
    # It holds the stored bytes, half of the resident fp32 copy's; the loaded model is as it was.
    assert budgeted.placed_bytes * 2 == resident.placed_bytes
    assert narrow.conv_in.weight.dtype == torch.float16  # put back after the forward
    assert all(p.dtype == torch.float16 for p in pipeline.unet.parameters())


def test_a_part_within_the_budget_or_stored_as_wide_is_placed_as_before():
    pipeline = half_stored()
    roomy = placement.PlacedPipeline(pipeline, _plan(10_000.0), components=["unet"])
    assert roomy["unet"].conv_in.weight.dtype == torch.float32
    fp32_stored = build_tiny_sd_pipeline()
    tight = placement.PlacedPipeline(fp32_stored, _plan(6.0), components=["unet"])
    assert tight["unet"].conv_in.weight.dtype == torch.float32


@pytest.mark.parametrize("streamed", [False, True], ids=["in-place", "streamed"])
@pytest.mark.parametrize(("fault", "component"), [("unet_ff", "unet"), ("vae", "vae")])
def test_a_check_under_a_budget_finds_the_same_layer_and_fix_holding_less(
    fault, component, streamed, monkeypatch
):
    most: dict[str, int] = {}  # the most each component's copy held on the device
    apply = placement.PlacedPipeline.apply

    def recording(self, plan, components=None):
        apply(self, plan, components)
        for name, held in self._bytes.items():
            most[name] = max(most.get(name, 0), held)

    monkeypatch.setattr(placement.PlacedPipeline, "apply", recording)

    def check(budget_gb: float):
        most.clear()
        report = health.check_loaded(
            loaded(half_stored(fault), f"budget-{fault}"),
            CheckRequest(
                precision=PrecisionSettings(precision="fp16", max_vram_gb=budget_gb),
                device="cpu",
                size=64,
            ),
            run=CheckRun(remember=False, measure_cost=False),
        )
        return report, dict(most)

    budget_gb = STREAM_BUDGET_GB if streamed else IN_PLACE_MB[component] / 1024
    free, free_held = check(0.0)
    tight, tight_held = check(budget_gb)
    assert free.verdict == tight.verdict == "fixable"
    for name in PARTS:
        assert free.components[name].status == tight.components[name].status
        assert free.components[name].first_bad_module == tight.components[name].first_bad_module
    assert free.fix is not None and tight.fix is not None
    assert tight.fix.settings == free.fix.settings
    assert tight.fix.verified
    # No budget of the user's own: on a CPU, the (test-fixed) computer's free RAM, ample.
    assert free.plan.memory_budget_from == "free RAM"
    assert tight.plan.memory_budget_mb == pytest.approx(budget_gb * 1024)
    assert tight.plan.memory_budget_from == "setting"
    free_memory, tight_memory = free.to_json()["memory"], tight.to_json()["memory"]
    assert free_memory["budget_mb"] > 32 * 1024 and free_memory["computed_in_place"] == []
    assert free_memory["streamed"] == {}
    assert tight_memory["budget_mb"] == pytest.approx(budget_gb * 1024)
    assert tight_memory["computed_in_place"] == [component]
    if not streamed:
        # A check is a fix search: budget or not, the failing part's fp32 reference and its
        # wider candidates held its stored fp16 bytes, never a copy twice as big (a candidate
        # with fp32 layers holds a little more: those layers' own copies, a large share of
        # this tiny model where the fixes are fp32).
        stored = sum(t.numel() * 2 for t in getattr(half_stored(), component).parameters())
        assert free_held[component] <= stored * 1.25
        assert tight_held[component] <= stored * 1.25
        return
    # Streamed: every part held its resident layers and one block, less than the whole (the
    # tiny text encoder is mostly its token embedding, which stays).
    assert sorted(tight_memory["streamed"]) == list(PARTS)
    for name in PARTS:
        said = tight_memory["streamed"][name]
        assert said["blocks"] >= 2 and said["block_mb"] > 0
        # The record is its last streaming; the most it held is at least that.
        held_mb = said["resident_mb"] + said["block_mb"]
        assert held_mb <= tight_held[name] / 2**20 + 0.01, name
        assert tight_held[name] < free_held[name] / (1 if name == "text_encoder" else 2), name
    assert tight_memory["peak_placed_mb"] < free_memory["peak_placed_mb"]


def test_the_budget_is_a_setting_and_a_flag():
    from app.cli.arguments import build_parser
    from app.core.settings import FIELDS

    field = FIELDS["max_vram_gb"]
    assert (field.default, field.group, field.flag_name) == (0.0, "Device", "max-vram")
    args = build_parser().parse_args(["check", "demo", "--max-vram", "6"])
    assert args.max_vram_gb == 6.0
    assert replace(PrecisionSettings(), max_vram_gb=6.0).max_vram_gb == 6.0


def test_a_generation_under_a_budget_makes_the_same_image(tmp_path):
    import numpy as np

    from app.core import generation

    request = generation.GenerationRequest(
        prompt="a lake", steps=2, width=64, height=64, seed=4, output_dir=str(tmp_path)
    )
    model = loaded(half_stored(), "budget-generation")
    images = [
        generation.generate(
            model,
            request,
            precision=PrecisionSettings(no_half=True, max_vram_gb=budget),
            device="cpu",
        ).images[0]
        for budget in (0.0, TINY_BUDGET_GB, STREAM_BUDGET_GB)
    ]
    assert [i.status for i in images] == ["ok", "ok", "ok"]
    for image in images[1:]:  # computed wider in place, then streamed block by block
        assert np.array_equal(np.asarray(images[0].image), np.asarray(image.image))


def test_a_generation_records_how_its_parts_were_held_in_its_json_and_png(tmp_path):
    """Computed in place under one budget, streamed under a smaller one, held whole under the
    computer's ample free RAM: the result's `memory` and the PNG's Memory budget, Streamed and
    Computed in place keys say so."""
    from app.core import generation
    from app.core.words import infotext
    from app.core.words.infotext import parse

    request = generation.GenerationRequest(
        prompt="a lake", steps=2, width=64, height=64, seed=4, output_dir=str(tmp_path)
    )
    model = loaded(half_stored(), "budget-record")
    made = {
        budget: generation.generate(
            model,
            request,
            precision=PrecisionSettings(no_half=True, max_vram_gb=budget),
            device="cpu",
        )
        for budget in (0.0, TINY_BUDGET_GB, STREAM_BUDGET_GB)
    }
    ample = made[0.0].memory
    assert ample is not None and ample.budget_mb > 32 * 1024
    assert not ample.streamed and not ample.computed_in_place
    assert made[0.0].to_json()["memory"]["budget_from"] == "free RAM"
    assert "Memory budget: 5" in made[0.0].images[0].parameters  # of the tests' fixed 64 GB
    in_place, streamed = made[TINY_BUDGET_GB].memory, made[STREAM_BUDGET_GB].memory
    assert in_place is not None and streamed is not None
    assert set(in_place.computed_in_place) == set(PARTS)  # every part fp16 -> fp32
    assert set(streamed.streamed) == set(PARTS)
    assert made[TINY_BUDGET_GB].to_json()["memory"] == {
        "budget_mb": 1,
        "budget_from": "setting",
        "streamed": list(in_place.streamed),
        "computed_in_place": list(in_place.computed_in_place),
    }
    record = parse(made[STREAM_BUDGET_GB].images[0].parameters)
    assert record.raw(infotext.MEMORY_BUDGET) == "0.0 GB"
    assert set(record.get(infotext.STREAMED)) == set(PARTS)
    record = parse(made[TINY_BUDGET_GB].images[0].parameters)
    assert record.get(infotext.COMPUTED_IN_PLACE) == list(in_place.computed_in_place)


def test_the_check_says_what_its_copies_held_under_a_budget():
    from app.cli.text import health_text

    report = health.check_loaded(
        loaded(half_stored("vae"), "budget-words"),
        CheckRequest(
            precision=PrecisionSettings(precision="fp16", max_vram_gb=TINY_BUDGET_GB),
            device="cpu",
            size=64,
        ),
        run=CheckRun(remember=False, measure_cost=False),
    )
    (line,) = [line for line in health_text(report).splitlines() if line.startswith("Memory:")]
    assert line.startswith("Memory:  budget 1 MB; the check's copies held at most ")
    assert "the VAE computed wider layer by layer from the stored weights" in line
    # The tiny text encoder's and UNet's fp16 weights (3 MB) stream, a block at a time.
    assert "streamed block by block: the text encoder (2 blocks" in line
    # The tiny text encoder's token embedding alone (2 MB) stays on the device.
    assert "(over the budget: the layers kept on the device and the largest block" in line
