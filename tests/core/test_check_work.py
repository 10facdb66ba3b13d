"""The work a health check does, counted (`work` in `check --json`): budgets on the calls, the
copies, the timing runs, the collector's passes and the host syncs of a healthy check and of a
planted UNet fault. Counts do not depend on the machine, so these hold on every one."""

from __future__ import annotations

import gc
import json
import weakref

import pytest

from app.core import health, work
from app.core.health import stages
from app.core.health.request import CheckRequest, CheckRun
from app.core.jobs import Headline
from app.core.precision import placement
from app.core.settings import PrecisionSettings
from tests.support.planted_sd import FF_LAYER, FP16, check, loaded, plant, stored_in_fp16
from tests.support.tiny_models import build_tiny_sd_pipeline

COMPONENTS = ("text_encoder", "unet", "vae")


@pytest.fixture(scope="module")
def healthy():
    """A healthy model checked in fp16, every dropped copy collected (as a real-size one is:
    the threshold is 64 MiB, which no tiny copy reaches)."""
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(placement, "COLLECT_AFTER_DROPPING_BYTES", 0)
        return check(loaded(build_tiny_sd_pipeline()), measure_cost=True)


def test_a_healthy_check_runs_each_probe_call_once_and_times_nothing(healthy):
    assert healthy.verdict == "healthy"
    done = healthy.work
    assert done is not None
    # The text encoder once (prompt and empty prompt in one batch), the UNet once per probed
    # timestep, the VAE's decoder once, each in fp16 as the user's plan runs them.
    assert done.calls == {
        "text_encoder": {"fp16": 1},
        "unet": {"fp16": len(healthy.timesteps)},
        "vae": {"fp16": 1},
    }
    assert done.timed_calls == 0 and done.timed_runs == 0
    # Every call watched by the lean recorder (outputs only), none by the full one.
    assert done.lean_calls == 1 + len(healthy.timesteps) + 1
    assert done.recorded_calls == 0
    # Each component placed at most once.
    assert done.placements <= len(COMPONENTS)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_healthy_check_wider_than_fp16_records_every_call_lean(precision):
    """In bf16 and fp32 as in fp16: no call recorded in full, and one reduction a module call
    (its outputs', fused), counted by the recorders themselves."""
    report = check(loaded(build_tiny_sd_pipeline()), PrecisionSettings(precision=precision))
    assert report.verdict == "healthy"
    done = report.work
    assert done.calls == {
        "text_encoder": {precision: 1},
        "unet": {precision: len(report.timesteps)},
        "vae": {precision: 1},
    }
    assert done.recorded_calls == 0
    assert done.lean_calls == 1 + len(report.timesteps) + 1
    assert done.module_calls > 0 and done.reductions == done.module_calls


def test_a_wider_first_probe_past_fp16s_range_is_recorded_again_in_full():
    """An fp32 check of a model whose UNet passes 65504: fp16's first layer past it and its
    islands are read from every layer's inputs, so the UNet's stage runs once more in full; the
    other stages stay lean."""
    report = check(
        loaded(plant(build_tiny_sd_pipeline(), "unet_ff")), PrecisionSettings(precision="fp32")
    )
    unet = report.components["unet"]
    assert report.verdict == "healthy" and unet.predicted_first_bad_module == FF_LAYER
    done = report.work
    assert done.calls_of("unet") == 2 * len(report.timesteps)
    assert done.recorded_calls == len(report.timesteps)
    assert done.lean_calls == 1 + len(report.timesteps) + 1


def test_a_healthy_check_never_walks_the_loaded_world_with_the_collector(healthy):
    """Each dropped copy is collected (three passes: the text encoder's, the UNet's, the VAE's
    at the end), each over the objects the check made alone, never over the loaded model and the
    libraries (0.3-0.6 s a pass at real size)."""
    done = healthy.work
    assert done.gc_passes >= len(COMPONENTS)
    assert done.full_gc_passes == 0
    assert gc.get_freeze_count() == 0  # the world is given back after the check


def test_a_healthy_check_waits_for_the_device_once_a_stage(healthy):
    """The recorder's read and the timer's, per stage, the finiteness of what a stage hands on,
    and the denoiser's output after each of its calls but the last (a call that went
    non-finite ends the probe there: `test_the_first_finding_comes_right_after_the_first_
    failing_call`): never a sync per module."""
    denoiser_reads = len(healthy.timesteps) - 1
    assert healthy.work.host_syncs <= 3 * len(COMPONENTS) + denoiser_reads


# What the planted UNet fix costs per CPU bf16 class (the layers a fix keeps wider are bf16 where
# it is native, fp32 elsewhere, and so are the candidates): by the time the fix is proved
# (`proved`: the candidates that could win, in the order the prediction and what each holds give
# them, each stopped at its first non-finite call; nothing timed) and by the end of the check
# (`done`: the table finished, the fix's cost measured beside no-half, the table's rows that are
# the same call taking those figures). Held so that they only go down.
BUDGETS = {
    "proved": {"unet": 14, "unet_fp32": 3, "placements": 7, "timed_runs": 0, "timed_placed": 0},
    "done": {"unet": 24, "unet_fp32": 10, "placements": 12, "timed_runs": 7, "timed_placed": 3},
}
CPU_CLASSES = ("native", "emulated")


@pytest.fixture(scope="module", params=CPU_CLASSES)
def unet_fault(request):
    """A planted UNet feed-forward overflow, stored in fp16, checked in fp16 with the fix's cost
    measured, as on a CPU of each bf16 class. Each progress event is kept with the denoiser's
    calls made by then."""
    events = EVENTS.setdefault(request.param, [])

    def progress(stage, done, total):
        events.append((stage, (work.counted() or work.Work()).calls_of("unet")))

    with pytest.MonkeyPatch.context() as patched:
        patched.setenv("HALFSAFE_CPU_BF16", request.param)
        report = check(
            stored_in_fp16(plant(build_tiny_sd_pipeline(), "unet_ff")),
            measure_cost=True,
            remember=False,
            on_progress=progress,
        )
    return request.param, report


# Per CPU bf16 class, the planted fault's check as it was said: each progress stage with the
# denoiser's calls made by then.
EVENTS: dict[str, list[tuple[str, int]]] = {}


@pytest.mark.parametrize("milestone", ["proved", "done"])
def test_a_planted_unet_fault_reaches_its_fix_within_its_budget(unet_fault, milestone):
    """The denoiser's calls (and those in fp32), the copies placed and the timed runs, by the
    time the fix is proved (nothing timed: the candidates are ordered by their predictions and
    what each holds) and by the end."""
    _, report = unet_fault
    budget = BUDGETS[milestone]
    assert report.verdict == "fixable" and report.fix.verified
    done = report.work.at("proved_fix") if milestone == "proved" else report.work
    assert done is not None
    assert done.calls_of("unet") <= budget["unet"]
    assert done.calls_of("unet", "fp32") <= budget["unet_fp32"]
    assert done.placements <= budget["placements"]
    assert done.timed_runs <= budget["timed_runs"]
    assert done.timed_calls == done.timed_runs  # a timed denoiser run is one step
    # Each plan timed is placed for its first run, and a copy holding little of its own is kept
    # beside the others for the runs after it.
    assert done.timed_placements <= budget["timed_placed"]
    assert done.full_gc_passes == 0


@pytest.mark.parametrize("cpu_class", CPU_CLASSES)
def test_a_planted_vae_fault_is_proved_with_nothing_timed(monkeypatch, cpu_class):
    """A planted VAE overflow: the denoiser runs its probe alone, and the fix is proved with a
    handful of copies placed and no timed run (the candidates alike in memory are ordered by
    what each holds, never raced)."""
    monkeypatch.setenv("HALFSAFE_CPU_BF16", cpu_class)
    report = check(
        stored_in_fp16(plant(build_tiny_sd_pipeline(), "vae")), measure_cost=True, remember=False
    )
    assert report.verdict == "fixable" and report.fix.verified
    proved = report.work.at("proved_fix")
    assert proved is not None
    assert proved.calls_of("unet") <= 3
    assert proved.placements <= 6
    assert proved.timed_runs == 0 and proved.timed_calls == 0


def test_the_first_finding_comes_right_after_the_first_failing_call(unet_fault):
    """The planted layer overflows in the denoiser's first call: the probe stops there, runs
    that call again under the full recorder and says what failed and where, two calls in,
    before the probe's other timesteps, the fp32 reference and the candidates."""
    kind, report = unet_fault
    headlines = [(stage, calls) for stage, calls in EVENTS[kind] if isinstance(stage, Headline)]
    assert len(headlines) == 1
    stage, calls = headlines[0]
    assert FF_LAYER in stage and calls == 2
    first = report.work.at("first_finding")
    assert first is not None and first.calls == {"text_encoder": {"fp16": 1}, "unet": {"fp16": 2}}
    assert (first.lean_calls, first.recorded_calls) == (2, 1)  # the text encoder's, the UNet's


def test_the_fix_is_reported_before_its_table_is_finished(unet_fault):
    """The proved fix is said, and counted as a milestone, before the candidates that could no
    longer win run for the table and before its cost is measured."""
    kind, report = unet_fault
    stages_said = [stage for stage, _ in EVENTS[kind]]
    reported = next(i for i, s in enumerate(stages_said) if s.startswith("Fix proved: "))
    assert report.fix.steps[0] in stages_said[reported]
    table = [i for i, s in enumerate(stages_said) if s.startswith("Completing the table")]
    assert table and min(table) > reported
    assert stages_said.index("Measuring the cost of the fix") > reported
    milestones = report.work.milestones
    assert list(milestones) == ["first_finding", "proved_fix", "verdict", "done"]
    seconds = [m["seconds"] for m in milestones.values()]
    assert seconds == sorted(seconds)
    proved = report.work.at("proved_fix")
    assert proved is not None and proved.calls_of("unet") < report.work.calls_of("unet")
    # The table holds every candidate, the fp32 one that could not win included.
    assert {c.kind for c in report.tried} >= {"islands", "clamp", "component_fp32"}


def test_the_work_is_in_the_reports_json(unet_fault):
    _, unet_fault = unet_fault
    document = json.loads(json.dumps(unet_fault.to_json()))
    assert document["work"] == unet_fault.work.to_json()
    assert document["work"]["calls"]["unet"]["fp16"] == unet_fault.work.calls_of("unet", "fp16")
    assert document["work"]["timed_runs"] == unet_fault.work.timed_runs > 0


def test_the_timed_runs_are_counted_as_timed(unet_fault):
    done = unet_fault[1].work
    assert done.timed_calls >= done.timed_runs
    assert done.recorded_calls + done.lean_calls + done.timed_calls <= sum(
        done.calls_of(name) for name in done.calls
    )


class _Cycle:
    """Garbage only the collector frees: an object that refers to itself."""

    def __init__(self) -> None:
        self.me = self


def test_the_frozen_world_is_left_alone_and_given_back():
    """Inside `frozen_world` a pass collects what the block made, not what was there before it;
    after the block the older garbage is collected again."""
    older = weakref.ref(_Cycle())
    assert older() is not None  # garbage, held by its own cycle
    with work.counting() as counted, work.frozen_world():
        younger = weakref.ref(_Cycle())
        work.collect_garbage()
        assert younger() is None and older() is not None
        with work.frozen_world():  # an inner block is the outer one's
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() > 0
    assert (counted.gc_passes, counted.full_gc_passes) == (1, 0)
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert older() is None


def test_a_pass_outside_a_frozen_world_is_a_full_one():
    with work.counting() as counted:
        work.collect_garbage()
    assert (counted.gc_passes, counted.full_gc_passes) == (1, 1)


def test_counts_outside_a_job_are_not_kept():
    work.add("placements")  # nothing to count into: ignored
    with work.counting() as outer:
        work.add("placements")
        with work.counting() as inner:
            work.add("placements", 2)
    assert (outer.placements, inner.placements) == (1, 2)


def test_every_count_is_in_the_json():
    report = health.check_loaded(
        loaded(build_tiny_sd_pipeline()),
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(measure_cost=False),
    )
    assert set(report.to_json()["work"]) == {
        "calls",
        "recorded_calls",
        "lean_calls",
        "module_calls",
        "reductions",
        "timed_calls",
        "stage_runs",
        "timed_runs",
        "predicted_costs",
        "placements",
        "timed_placements",
        "gc_passes",
        "full_gc_passes",
        "host_syncs",
        "milestones",
    }
    assert list(report.to_json()["work"]["milestones"]) == ["verdict", "done"]


def test_a_freeze_made_elsewhere_does_not_stop_the_check_setting_the_world_aside():
    """A library that froze objects of its own (the H200's torch did: 375 of them) leaves the
    freeze count above 0; the check still sets everything aside, and gives back only its own."""
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        garbage = weakref.ref(_Cycle())
        with work.counting() as counted, work.frozen_world():
            assert gc.get_freeze_count() > before  # the check's own freeze
            work.collect_garbage()
            assert garbage() is not None  # older than the check: left alone
        assert counted.full_gc_passes == 0
    finally:
        gc.unfreeze()
    gc.collect()
    assert garbage() is None


def test_a_generation_never_walks_the_loaded_world_with_the_collector(tmp_path, monkeypatch):
    """A generation (and its repair) frees the copies it drops with passes over its own
    objects, as the check does."""
    from app.core import generation

    monkeypatch.setattr(placement, "COLLECT_AFTER_DROPPING_BYTES", 0)
    request = generation.GenerationRequest(
        prompt="a red cube", steps=2, width=64, height=64, seed=1, output_dir=str(tmp_path)
    )
    model = loaded(plant(build_tiny_sd_pipeline(), "vae"), "generation-gc")
    with work.counting() as counted:
        result = generation.generate(model, request, precision=FP16, device="cpu")
    assert result.images[0].status == "fixed"
    assert counted.gc_passes >= 1 and counted.full_gc_passes == 0
    assert gc.get_freeze_count() == 0


def test_a_probe_recorded_in_full_says_its_finding_after_the_failing_call(monkeypatch):
    """A probe recorded in full (every probe where the lean recorder does not run) says what
    failed and where right after the call that went non-finite, and runs on to the stage's end:
    its record is the whole stage's."""
    monkeypatch.setattr(stages, "LEAN_RECORDER", False)
    said: list[tuple[str, int]] = []

    def progress(stage, done, total):
        said.append((stage, (work.counted() or work.Work()).calls_of("unet")))

    report = check(loaded(plant(build_tiny_sd_pipeline(), "unet_ff")), on_progress=progress)
    headlines = [(stage, calls) for stage, calls in said if isinstance(stage, Headline)]
    assert len(headlines) == 1 and FF_LAYER in headlines[0][0]
    assert headlines[0][1] == 1  # the first call, recorded in full
    first = report.work.at("first_finding")
    assert first is not None and first.calls_of("unet") == 1
    assert report.components["unet"].first_bad_module == FF_LAYER
    ran = [calls for stage, calls in said if stage == "Running the fp32 reference"]
    assert ran == [len(report.timesteps)]  # the probe went on to its last timestep
