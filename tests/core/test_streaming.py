"""A component streamed block by block (`precision.streaming`): its blocks are placeholders on
the meta device except while their forward runs, the rest stays placed, and it computes what a
resident copy computes, islands included. A budget makes the same plan on a CPU as on a GPU,
and a streamed tensor read outside its block fails here as it would there."""

from __future__ import annotations

import pytest
import torch

from app.core import health
from app.core.health.request import CheckRequest, CheckRun
from app.core.jobs import Headline
from app.core.memory import plan_words
from app.core.precision import PrecisionPlan, placement, streaming
from app.core.settings import PrecisionSettings
from tests.support.planted_sd import half_stored, loaded, unet_inputs
from tests.support.tiny_models import build_tiny_sd_pipeline

STREAM_MB = 0.1  # less than any tiny component as stored
UNET_ISLAND = "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.2"


def _placed(pipeline, budget_mb, dtype="fp16", islands=None):
    plan = PrecisionPlan(device="cpu", dtypes={"unet": dtype}, memory_budget_mb=budget_mb)
    if islands:
        plan = plan.with_modules("unet", islands)
    return placement.PlacedPipeline(pipeline, plan, components=["unet"])


def test_the_blocks_are_the_children_of_each_outermost_list_of_weighted_blocks():
    pipeline = build_tiny_sd_pipeline()
    unet_blocks = streaming.block_paths(pipeline.unet)
    assert unet_blocks[:6] == [
        "down_blocks.0",
        "down_blocks.1",
        "down_blocks.2",
        "up_blocks.0",
        "up_blocks.1",
        "up_blocks.2",
    ]
    assert "mid_block.resnets.0" in unet_blocks  # a list inside a part that is not one
    assert streaming.block_paths(pipeline.text_encoder) == ["encoder.layers.0", "encoder.layers.1"]
    vae_blocks = streaming.block_paths(pipeline.vae)
    assert "decoder.up_blocks.0" in vae_blocks and "encoder.down_blocks.3" in vae_blocks
    assert streaming.block_paths(torch.nn.Linear(4, 4)) == []  # nothing to stream


def test_a_streamed_component_computes_as_a_resident_copy_and_holds_one_block_at_a_time():
    pipeline = half_stored()
    inputs = unet_inputs(pipeline)
    resident, streamed = _placed(pipeline, None), _placed(pipeline, STREAM_MB)
    twin = streamed["unet"]
    held = streamed.streamed["unet"]
    sizes = streaming.sizes(pipeline.unet, torch.float16)

    # Outside its forward every block tensor is a meta placeholder, in the dtype it computes in.
    weight = twin.get_submodule(UNET_ISLAND).weight
    assert weight.device.type == "meta" and weight.dtype == torch.float16
    assert twin.conv_in.weight.device.type == "cpu"  # the rest is placed
    seen: list[str] = []
    block = twin.get_submodule("down_blocks.0")
    block.register_forward_pre_hook(
        lambda module, args: seen.append(module.resnets[0].conv1.weight.device.type)
    )
    with torch.inference_mode():
        got = twin(**inputs).sample
        expected = resident["unet"](**inputs).sample
    assert seen == ["cpu"]  # brought in for its own forward
    assert torch.equal(got, expected)
    assert twin.get_submodule(UNET_ISLAND).weight.device.type == "meta"  # let go after
    # What it held: the placed rest and the largest block, as counted before placing it.
    assert held == sizes
    assert streamed.placed_bytes == sizes.resident + sizes.block < sizes.whole
    assert all(p.device.type == "cpu" for p in pipeline.unet.parameters())  # loaded: untouched


def test_a_streamed_tensor_read_outside_its_blocks_forward_fails_and_a_failed_block_lets_go():
    twin = _placed(half_stored(), STREAM_MB)["unet"]
    layer = twin.get_submodule(UNET_ISLAND)
    with pytest.raises((RuntimeError, NotImplementedError)):
        layer(torch.ones(1, layer.in_features, dtype=torch.float16)).sum().item()

    block = twin.get_submodule("down_blocks.0")
    block.register_forward_hook(lambda *_: (_ for _ in ()).throw(ValueError("planted")))
    with pytest.raises(ValueError, match="planted"), torch.inference_mode():
        twin(**unet_inputs(half_stored()))
    assert block.resnets[0].conv1.weight.device.type == "meta"


@pytest.mark.parametrize("budget_mb", [None, STREAM_MB], ids=["resident", "streamed"])
def test_an_island_is_made_from_the_loaded_values_not_the_narrower_copy(budget_mb):
    # A weight past fp16's range in an fp32 file: an fp32 island keeps it (it would be inf in
    # an island made from the fp16 copy), resident and streamed alike.
    pipeline = build_tiny_sd_pipeline()
    with torch.no_grad():
        pipeline.unet.get_submodule(UNET_ISLAND).weight[0, 0] = 1e6
    placed = _placed(pipeline, budget_mb, islands={UNET_ISLAND: "fp32"})
    layer = placed["unet"].get_submodule(UNET_ISLAND)
    with torch.inference_mode():
        if budget_mb is not None:  # read inside its block's forward
            kept: list[torch.Tensor] = []
            layer.register_forward_hook(lambda m, a, o: kept.append(m.weight.clone()))
            placed["unet"](**unet_inputs(pipeline))
            weight = kept[0]
        else:
            weight = layer.weight
    assert weight.dtype == torch.float32 and weight[0, 0].item() == 1e6


def test_the_memory_plan_is_said_before_the_job_where_a_part_streams():
    pipeline = half_stored()
    plan = PrecisionPlan(
        device="cpu",
        dtypes={"text_encoder": "fp16", "unet": "fp32", "vae": "fp16"},
        memory_budget_mb=4.0,
    )
    parts = {p.component: p for p in placement.memory_plan(pipeline, plan)}
    # The UNet's fp32 copy (5.6 MB) would not fit: it computes from its fp16 weights (2.8 MB)
    # whole; nothing streams.
    assert parts["unet"].stored_dtype == "fp16" and not parts["unet"].streams
    assert plan_words(list(parts.values()), None) is None  # no budget: nothing to say
    assert plan_words([], 4096.0, vae_tiled=True) == (
        "Memory budget 4.0 GB: the VAE decodes in tiles."
    )
    words = plan_words(list(parts.values()), 4.0)
    assert words == (
        "Memory budget 0.0 GB: the UNet computes in fp32 from its fp16 weights layer by layer."
    )

    stages: list[str] = []
    health.check_loaded(
        loaded(half_stored(), "said-plan"),
        CheckRequest(
            precision=PrecisionSettings(precision="fp16", max_vram_gb=STREAM_MB / 1024),
            device="cpu",
            size=64,
        ),
        run=CheckRun(remember=False, measure_cost=False),
        on_progress=lambda stage, done, total: stages.append(stage),
    )
    (said,) = [s for s in stages if isinstance(s, Headline)]
    assert said.startswith("Memory budget 0.0 GB: the text encoder streams block by block (")
    assert "the UNet streams block by block" in said and "one of 2 blocks" in said


def test_without_a_budget_a_cuda_gpu_budgets_its_free_memory_less_a_reserve(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gib = 2**30
    # An 8 GB card with 7.5 GB free keeps 1.6 GB (a fifth) for activations.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (int(7.5 * gib), 8 * gib))
    budget, source = streaming.device_budget("cuda:0")
    assert budget == pytest.approx(7.5 * 1024 - 0.2 * 8 * 1024) and source == "free memory"
    # A 6 GB card keeps at least 1.5 GB; a full one still gets a working minimum. What the
    # model holds in the computer's memory is no concern of a GPU's budget.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (int(5.6 * gib), 6 * gib))
    assert streaming.device_budget("cuda", held_bytes=4 * gib)[0] == pytest.approx(
        5.6 * 1024 - 1536
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (gib // 2, 6 * gib))
    assert streaming.device_budget("cuda")[0] == streaming.BUDGET_MIN_MB
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert streaming.device_budget("cuda") == (None, None)
    assert streaming.device_budget("xpu") == (None, None)


def test_a_cuda_budget_counts_what_torch_holds_cached_as_free(monkeypatch):
    """Blocks torch's allocator keeps after freeing tensors are this process's to reuse: the
    driver calls them taken (after SDXL's check on an H200: 13.8 GiB reserved, 5.3 in use)."""
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2 * gib, 8 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 5 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1 * gib)
    budget, _ = streaming.device_budget("cuda:0")
    assert budget == pytest.approx((2 + 4) * 1024 - 0.2 * 8 * 1024)


def _ram(monkeypatch, available_gib: float, total_gib: float):
    import psutil

    gib = 2**30
    memory = psutil.virtual_memory()._replace(
        available=int(available_gib * gib), total=int(total_gib * gib)
    )
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory)


def test_without_a_budget_a_cpu_budgets_the_computers_free_ram_beside_the_model(monkeypatch):
    gib = 2**30
    # 16 GB of RAM with 12 GB available, 6.5 GB of it the page cache of an SDXL file the job
    # holds: 5.5 GB left, less a fifth of the RAM (3.2 GB) for activations and the system.
    _ram(monkeypatch, 12, 16)
    budget, source = streaming.device_budget("cpu", held_bytes=int(6.5 * gib))
    assert budget == pytest.approx((12 - 6.5 - 0.2 * 16) * 1024) and source == "free RAM"
    # 6 GB of RAM keeps at least 1.5 GB; a model as big as what is free leaves the minimum.
    _ram(monkeypatch, 5, 6)
    assert streaming.device_budget("cpu")[0] == pytest.approx((5 - 1.5) * 1024)
    assert streaming.device_budget("cpu", held_bytes=5 * gib)[0] == streaming.BUDGET_MIN_MB


def test_an_apple_gpu_budgets_the_computers_free_ram_within_metals_working_set(monkeypatch):
    gib = 2**30
    _ram(monkeypatch, 12, 16)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 10 * gib, raising=False)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 2 * gib, raising=False)
    # RAM says 12 - 2 held = 10 GB; Metal's working set has 8 GB left: the smaller, less 3.2.
    budget, source = streaming.device_budget("mps", held_bytes=2 * gib)
    assert budget == pytest.approx((8 - 0.2 * 16) * 1024) and source == "free RAM"
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 0, raising=False)
    assert streaming.device_budget("mps", held_bytes=2 * gib)[0] == pytest.approx(
        (10 - 0.2 * 16) * 1024
    )


def test_host_bytes_count_each_tensor_once_at_its_stored_bytes():
    pipeline = half_stored()
    unet = sum(t.numel() * 2 for t in pipeline.unet.parameters())
    unet += sum(t.numel() * t.element_size() for t in pipeline.unet.buffers())
    assert streaming.host_bytes([pipeline.unet, pipeline.unet]) == unet


def test_a_cpu_job_whose_wider_copy_would_not_fit_the_free_ram_computes_in_place(monkeypatch):
    """With no budget set, a wider copy of an fp16 UNet on a CPU (a fix candidate's fp32 UNet;
    the fp32 reference never makes one) is made only where the computer has the RAM for it
    beside the model; else the UNet computes in fp32 from its fp16 weights, and the check finds
    the same as with the copy. A copy is made where it fits because computing in place costs
    time on a CPU (`docs/benchmarks.md`: 1.8x a UNet call at 256 px)."""
    pipeline = half_stored()
    held = streaming.host_bytes([pipeline.text_encoder, pipeline.unet, pipeline.vae])
    wide = sum(t.numel() * 4 for t in pipeline.unet.parameters())
    # No reserve and no minimum, so the tiny model meets the budget as a real one would.
    monkeypatch.setattr(streaming, "RESERVE_MIN_MB", 0.0)
    monkeypatch.setattr(streaming, "RESERVE_SHARE", 0.0)
    monkeypatch.setattr(streaming, "BUDGET_MIN_MB", 0.0)
    gib = 2**30
    reports = {}
    for room in ("ample", "short"):
        extra = 100 * wide if room == "ample" else wide // 2
        _ram(monkeypatch, (held + extra) / gib, 16)
        stages: list[object] = []
        reports[room] = health.check_loaded(
            loaded(half_stored("unet_ff"), f"ram-{room}"),
            CheckRequest(precision=PrecisionSettings(precision="fp16"), device="cpu", size=64),
            run=CheckRun(remember=False, measure_cost=False),
            on_progress=lambda stage, done, total, said=stages: said.append(stage),
        )
        memory = reports[room].memory
        assert memory is not None and memory.budget_from == "free RAM"
        assert memory.budget_mb == pytest.approx(extra / 2**20, abs=0.01)
        said = [s for s in stages if isinstance(s, Headline) and s.startswith("Memory budget")]
        if room == "short":
            assert "unet" in memory.computed_in_place
            assert memory.peak_placed_mb < wide / 2**20
        else:
            assert not memory.computed_in_place and not said
    short, ample = reports["short"].to_json(), reports["ample"].to_json()
    assert short["verdict"] == ample["verdict"] == "fixable"
    bad = [
        c["first_bad_module"] for c in (short["components"]["unet"], ample["components"]["unet"])
    ]
    assert bad[0] == bad[1] is not None
    assert short["fix"]["summary"] == ample["fix"]["summary"]


def test_a_dropped_streamed_copy_frees_what_it_placed_at_once():
    import weakref

    pipeline = half_stored()
    placed = _placed(pipeline, STREAM_MB)
    resident = weakref.ref(placed["unet"].conv_in.weight)
    assert resident() is not None
    placed.apply(placed.plan, components=())  # the next stage places nothing of it
    # No reference cycle keeps the placed layers alive until a garbage collection.
    assert resident() is None
    assert placed.streamed["unet"].blocks > 0  # the record of how it was held stays
