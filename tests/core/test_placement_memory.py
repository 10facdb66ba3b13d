"""One copy at a time: a job holds the copies of the stage that runs and no other, a copy is
made tensor by tensor, and a copy in the loaded model's own dtype and place shares its tensors
(an island then costs only its own layers). `PlacedPipeline.peak_bytes` counts what the copies
held at once, the bytes a GPU would hold of them, so a CPU run can check the budget."""

from __future__ import annotations

import itertools

import pytest
import torch

from app.core import generation, health
from app.core.health.request import CheckRequest, CheckRun
from app.core.precision import PrecisionPlan, placement
from app.core.settings import PrecisionSettings
from tests.support.family_helpers import in_memory
from tests.support.planted_sd import FF_LAYER, loaded, plant
from tests.support.tiny_models import build_tiny_flux_pipeline, build_tiny_sd_pipeline

FP16 = PrecisionSettings(precision="fp16")
FLUX_LAYER = "single_transformer_blocks.1.proj_out"
PARTS = ("text_encoder", "unet", "vae")


def _bytes_in(pipeline, name: str, size: int) -> int:
    """Bytes of a component with its floating tensors `size` bytes each."""
    module = getattr(pipeline, name)
    return sum(p.numel() * size for p in module.parameters()) + sum(
        b.numel() * (size if b.is_floating_point() else b.element_size()) for b in module.buffers()
    )


@pytest.fixture
def placements(monkeypatch):
    """Every PlacedPipeline the test makes."""
    made: list[placement.PlacedPipeline] = []
    init = placement.PlacedPipeline.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(placement.PlacedPipeline, "__init__", recording)
    return made


@pytest.mark.parametrize("planted", [None, "unet_ff", "vae"], ids=["healthy", "unet", "vae"])
def test_a_check_holds_one_stages_copies_at_a_time(placements, planted):
    pipeline = build_tiny_sd_pipeline()
    if planted:
        pipeline = plant(pipeline, planted)
    sizes = {name: _bytes_in(pipeline, name, 4) for name in PARTS}
    report = health.check_loaded(
        loaded(pipeline, "one-copy"),
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False),
    )
    assert report.verdict == ("healthy" if planted is None else "fixable")
    assert placements
    peak = max(p.peak_bytes for p in placements)
    # One component in fp32 (the reference) at most: the other stages' components, and the
    # copy tested before a candidate, never stand beside it. The whole pipeline in fp32, as
    # each plan used to be placed, is about twice this.
    assert peak <= max(sizes.values()), (peak, sizes)
    assert peak < sum(sizes.values()) * 0.6


def test_a_generation_holds_one_stages_copies_at_a_time(placements, tmp_path):
    pipeline = plant(build_tiny_sd_pipeline(), "vae")
    sizes = {name: _bytes_in(pipeline, name, 4) for name in PARTS}
    request = generation.GenerationRequest(
        prompt="a red cube", steps=2, width=64, height=64, seed=1, output_dir=str(tmp_path)
    )
    result = generation.generate(
        loaded(pipeline, "one-copy"), request, precision=FP16, device="cpu"
    )
    assert result.images[0].status == "fixed"
    peak = max(p.peak_bytes for p in placements)
    assert peak <= max(sizes.values()), (peak, sizes)


def test_a_copy_in_the_loaded_dtype_shares_its_tensors_and_an_island_costs_its_layers():
    pipeline = build_tiny_sd_pipeline()  # stored in fp32
    vae = pipeline.vae
    layer = "decoder.up_blocks.0.resnets.0.conv1"
    before = {n: p.clone() for n, p in vae.named_parameters()}
    plan = PrecisionPlan(
        device="cpu",
        dtypes={"text_encoder": "fp32", "unet": "fp32", "vae": "fp32"},
        modules={"vae": {layer: "bf16"}},
    )
    placed = placement.PlacedPipeline(pipeline, plan, components=["vae"])
    copy = placed["vae"]
    assert copy is not vae
    island = copy.get_submodule(layer)
    assert island.weight.dtype == torch.bfloat16
    # On the device, the whole VAE; of it, the island's bf16 weights alone are the copy's own.
    assert placed.placed_bytes == placement.tensor_bytes(copy)
    assert placement.tensor_bytes(copy, shared_with=vae) == sum(
        p.numel() * 2 for p in island.parameters()
    )
    shared = copy.get_submodule("decoder.conv_in").weight
    assert (
        shared.untyped_storage().data_ptr()
        == vae.decoder.conv_in.weight.untyped_storage().data_ptr()
    )
    # The loaded model is as it was: dtypes and values.
    for name, parameter in vae.named_parameters():
        assert parameter.dtype == torch.float32
        assert torch.equal(parameter, before[name])
    placed.release()
    assert placed.placed_bytes == 0


def test_a_copy_in_another_dtype_is_made_tensor_by_tensor(monkeypatch):
    # No whole-module deepcopy in the stored dtype on the way to the cast.
    pipeline = build_tiny_sd_pipeline()
    copied: list[int] = []
    real = torch.Tensor.__deepcopy__

    def counting(self, memo):
        copied.append(self.numel())
        return real(self, memo)

    monkeypatch.setattr(torch.Tensor, "__deepcopy__", counting)
    plan = PrecisionPlan(
        device="cpu", dtypes={"text_encoder": "fp16", "unet": "fp16", "vae": "fp16"}
    )
    placed = placement.PlacedPipeline(pipeline, plan, components=["unet"])
    assert placed["unet"].dtype == torch.float16
    assert sum(copied) == 0
    assert placed.placed_bytes == _bytes_in(pipeline, "unet", 2)
    assert "vae" not in placed and "text_encoder" not in placed


@pytest.mark.parametrize("fault", ["unet_ff", "vae"])
def test_the_fp32_reference_computes_from_the_stored_weights_without_a_copy(monkeypatch, fault):
    """A model stored in fp16 fails; its check's fp32 reference holds the failing component's
    stored bytes (each layer widened as it runs), not an fp32 copy twice their size, budget or
    no budget: the copy bought a few runs' speed for 10 bytes per weight on the device."""
    pipeline = plant(build_tiny_sd_pipeline(), fault).to(torch.float16)
    component = "unet" if fault == "unet_ff" else "vae"
    stored = _bytes_in(pipeline, component, 2)
    held_by_reference: list[int] = []
    apply = placement.PlacedPipeline.apply

    def recording(self, plan, components=None):
        apply(self, plan, components)
        if plan.reference and component in self._bytes:
            held_by_reference.append(self._bytes[component])

    monkeypatch.setattr(placement.PlacedPipeline, "apply", recording)
    report = health.check_loaded(
        loaded(pipeline, f"reference-{fault}"),
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.verdict == "fixable"
    assert report.fix is not None and report.fix.verified
    assert held_by_reference, "the check ran no fp32 reference of the failing component"
    assert max(held_by_reference) <= stored * 1.01, (held_by_reference, stored)


def test_a_generations_fix_search_holds_the_stored_weights_and_its_fix_runs_as_a_copy(tmp_path):
    """A generation whose UNet fails searches for a fix holding the model's stored fp16 bytes
    (its reference and its candidates compute from them layer by layer); the fix it chose then
    makes the image as a copy where the memory has room, as any job runs (faster than in place)."""
    pipeline = plant(build_tiny_sd_pipeline(), "unet_ff").to(torch.float16)
    stored = _bytes_in(pipeline, "unet", 2)
    held: list[tuple[bool, int, str]] = []
    apply = placement.PlacedPipeline.apply

    def recording(self, plan, components=None):
        apply(self, plan, components)
        if "unet" in self._bytes:
            searching = plan.compute_in_place or plan.reference
            held.append((searching, self._bytes["unet"], plan.dtypes["unet"]))

    request = generation.GenerationRequest(
        prompt="a red cube", steps=2, width=64, height=64, seed=1, output_dir=str(tmp_path)
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(placement.PlacedPipeline, "apply", recording)
        result = generation.generate(
            loaded(pipeline, "search-in-place"), request, precision=FP16, device="cpu"
        )
    assert result.images[0].status == "fixed"
    searched = [b for searching, b, _ in held if searching]
    assert searched, "no fix search ran"
    # The stored bytes, and a candidate's islands in their own wider copies (where bf16 is
    # emulated the fixes are fp32: the planted feed-forward is a large share of this tiny UNet).
    assert max(searched) <= stored * 1.25, (searched, stored)
    # The run that made the image with the fix is placed as any job is, not the search's way.
    assert held[-1][0] is False, held


def _fp16_copy(unet, island: str, clamped: str):
    """The part as a GPU job places it from weights loaded in the RAM: a copy in fp16, its
    island copied in fp32 from the stored weights, guarded, and its clamps (what
    `PlacedPipeline.apply` does where the part is not loaded on the job's device)."""
    module = placement.PlacedPipeline._place(
        unet, torch.device("cpu"), torch.float16, copy_always=True, islands={island: "fp32"}
    )
    placement._make_islands(module, {island: "fp32"}, guard=True)
    placement._make_clamps(module, (clamped,))
    return module


def test_an_island_in_a_part_computing_from_its_stored_weights_holds_its_layer_alone():
    """A transformer stored in bf16, checked in fp16: a candidate's fp32 island and fp16
    clamps compute beside the stored weights, as a whole fp16 copy would (the same numbers,
    bit for bit), holding the island's fp32 weights and nothing else of their own: a copy held
    the part twice (a Flux-width bf16 transformer's failing check took 8.4 GiB for a 3.6 GiB
    file). On the device it is loaded on, a generation's placement computes so too: an fp16
    copy of bf16 weights would hold the part twice for nothing (a Flux-width bf16 transformer's
    generation in fp16 took 8.44 GiB on a CPU for 5.38 GiB of files)."""
    pipeline = build_tiny_sd_pipeline().to(torch.bfloat16)
    unet = pipeline.unet
    island, clamped = FF_LAYER, "up_blocks.0.resnets.0"
    stored = _bytes_in(pipeline, "unet", 2)
    inputs = (
        torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(1)),
        torch.tensor(10),
        torch.randn(1, 77, unet.config.cross_attention_dim, generator=torch.Generator()),
    )
    outputs, held = {}, {}
    for in_place in (False, True):  # a generation's placement, a search's
        plan = PrecisionPlan(
            device="cpu",
            dtypes={"text_encoder": "fp16", "unet": "fp16", "vae": "fp16"},
            modules={"unet": {island: "fp32"}},
            clamps={"unet": (clamped,)},
            compute_in_place=in_place,
        )
        placed = placement.PlacedPipeline(pipeline, plan, components=["unet"])
        with torch.no_grad():
            outputs[in_place] = placed["unet"](*inputs).sample
        held[in_place] = placement.tensor_bytes(placed["unet"], shared_with=unet)
        assert placed["unet"].get_submodule(island).weight.dtype == torch.float32
    copy = _fp16_copy(unet, island, clamped)
    with torch.no_grad():
        copied = copy(*inputs).sample
    island_bytes = sum(p.numel() * 4 for p in unet.get_submodule(island).parameters())
    assert outputs[True].dtype == outputs[False].dtype == copied.dtype == torch.float16
    assert torch.equal(outputs[True], copied) and torch.equal(outputs[False], copied)
    assert held[True] == held[False] == island_bytes
    assert placement.tensor_bytes(copy, shared_with=unet) > stored  # the copy: it all again
    for parameter in unet.parameters():  # the loaded model is as it was
        assert parameter.dtype == torch.bfloat16


def test_a_repaired_generation_frees_each_copy_before_it_makes_the_next(tmp_path, monkeypatch):
    """A Flux transformer stored in bf16 generated in fp16 fails; its repair searches in place,
    then makes the image again as an fp16 copy with the fix. The first run's fp16 copy is gone by then:
    the search's generator held it, and, a placed copy sitting in reference cycles, it waited
    for Python's collector: a bf16 Flux-width transformer's repaired generation held two fp16
    copies at once on a CPU (10.98 GiB for a 5.38 GiB set of files). Python's own collector is
    off here, so only the job's own collection frees what it drops (at any size, here)."""
    import gc
    import weakref

    pipeline = build_tiny_flux_pipeline()
    with torch.no_grad():
        pipeline.transformer.get_submodule(FLUX_LAYER).weight.mul_(1e6)
    pipeline = pipeline.to(torch.bfloat16)
    unet = pipeline.transformer
    stored = _bytes_in(pipeline, "transformer", 2)
    copies: list[weakref.ref] = []
    held_beside: list[int] = []
    real = placement._copy_as

    def watched(source, device, dtype, islands=None):
        if source is unet:
            alive = [c for r in copies if (c := r()) is not None]
            held_beside.append(sum(placement.tensor_bytes(c, shared_with=unet) for c in alive))
        made = real(source, device, dtype, islands)
        if source is unet:
            copies.append(weakref.ref(made))
        return made

    monkeypatch.setattr(placement, "_copy_as", watched)
    monkeypatch.setattr(placement, "COLLECT_AFTER_DROPPING_BYTES", 0)
    request = generation.GenerationRequest(
        prompt="a red cube", steps=2, width=64, height=64, seed=1, output_dir=str(tmp_path)
    )
    gc.collect()
    gc.disable()
    try:
        result = generation.generate(
            in_memory(pipeline, "frees-copies", "flux-dev", "flow"),
            request,
            precision=FP16,
            device="cpu",
        )
    finally:
        gc.enable()
    assert result.images[0].status == "fixed"
    assert len(held_beside) >= 3, held_beside  # the run, the search, the image made again
    # Beside each new copy: at most a search's islands, never a whole earlier copy.
    assert max(held_beside) <= stored * 0.25, (held_beside, stored)


def test_a_checks_plans_on_another_device_move_the_stored_weights_there_once():
    """On a GPU the loaded model stays in the RAM: each plan of a check that computes from the
    stored weights (the reference, each candidate, each timed run) placed the part from there
    again, a whole UNet across the bus every run. The stored weights now move once and every
    such plan shares them (an island copies its own layers alone); a plan that copies lets
    them go. "meta" stands in for the GPU here: it runs the same placements, without values."""
    from torch.overrides import TorchFunctionMode

    class Crossings(TorchFunctionMode):
        """How many `Tensor.to` calls moved a tensor from the CPU (the RAM)."""

        count = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.Tensor.to and args[0].device.type == "cpu":
                self.count += out.device.type == "meta"
            return out

    pipeline = build_tiny_sd_pipeline().to(torch.float16)
    unet = pipeline.unet
    tensors = len({id(t) for t in itertools.chain(unet.parameters(), unet.buffers())})

    def plan(**values):
        dtypes = {"text_encoder": "fp16", "unet": values.pop("unet", "fp16"), "vae": "fp16"}
        return PrecisionPlan(device="meta", dtypes=dtypes, compute_in_place=True, **values)

    plans = [
        plan(unet="bf16"),
        plan(modules={"unet": {FF_LAYER: "fp32"}}),
        plan(unet="fp32"),
        plan(unet="bf16"),
        plan(modules={"unet": {FF_LAYER: "fp32"}}),
    ]
    placed = placement.PlacedPipeline(pipeline, plans[0], components=())
    with Crossings() as crossed:
        for each in plans:
            placed.apply(each, ["unet"])
            module = placed["unet"]
            assert next(module.parameters()).device.type == "meta"
    assert crossed.count == tensors  # each tensor once, not once a plan
    island = placed["unet"].get_submodule(FF_LAYER).weight
    assert island.dtype == torch.float32
    assert placed.placements == len(plans) + 1  # the move, and each plan's own module
    # A generation's plan copies: the moved weights go first, and it places from the RAM.
    placed.apply(PrecisionPlan(device="meta", dtypes={"unet": "bf16"}), ["unet"])
    assert not placed._resident
    placed.release()
