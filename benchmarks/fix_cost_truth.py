"""Is the cost a check states for its fix what the user's generation pays under it?

One planted UNet overflow (`islands.PLANTED` x1e5) in a random-weight model stored in fp16, as
users download them; the check runs in fp16 with the fix's cost measured (`check_loaded` with
`CheckRun(measure_cost=True)`), and states one UNet step (the CFG batch) under the fix and
under no-half. Then the app's own generation runs under the fix the check found (the fix's
settings over fp16, `generate`), and its denoising steps are timed from its progress calls
(each step after the first; the first holds the warm-up). Printed side by side: the stated
step, the generation's median step (and range), their ratio, and the weights stated beside those
the generation's placement holds. With `--pairs N` the check and the generation alternate N
times, and each check's stated step is read beside the generations before and after it (the
median of those ratios): on a shared machine the step drifts with what else runs, by more than
the 10% asked, between a check and the generation that follows it.

Per CPU bf16 class (`HALFSAFE_CPU_BF16`, one a run): where bf16 is native the fix's wider layers
are bf16, where it is emulated they are fp32. A GPU runs the same script with `--device cuda`.

`--tiny` runs the tests' tiny pipeline of the model's architecture instead (a dry run).

Usage: python benchmarks/fix_cost_truth.py [--device cpu|cuda] [--model sd1|sdxl|demo]
       [--size PX] [--steps N] [--bf16 native|emulated] [--pairs N] [--tiny] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from common import bench_model, emit, load_average, machine, status
from islands import PLANTED

# The planted layer's weights scaled so that its output passes 65504 while the weights
# themselves stay within fp16's range (x1e6, as `islands.py` plants in fp32, would store inf).
FACTOR = 1e5


def run_case(args, bf16: str) -> dict:
    import torch

    from app.core.settings import PrecisionSettings

    os.environ["HALFSAFE_CPU_BF16"] = bf16
    with status(f"building {args.model} (stored in fp16)"):
        model = bench_model(args.model, "fp16", tiny=args.tiny)
    with torch.no_grad():
        model.pipeline.unet.get_submodule(PLANTED).weight.mul_(FACTOR)
    fp16 = PrecisionSettings(precision="fp16")
    loads = {"check": load_average()}
    report, check_s = _check(args, model, fp16, bf16)
    fix = report.fix
    if fix is None or fix.cost is None:
        failed = {n: c.status.value for n, c in report.components.items()}
        return {"bf16": bf16, "verdict": report.verdict.value, "fix": None, "status": failed}
    loads["generation"] = load_average()
    steps_ms = _generation(args, model, fix)
    # Check and generation alternate: the step the machine gives drifts with what else runs on
    # it, so each check's stated step is read beside the generations before and after it.
    stated_all, generated_all = [fix.cost.fix.step_ms], [statistics.median(steps_ms)]
    for _ in range(args.pairs - 1):
        again, _ = _check(args, model, fp16, bf16)
        if again.fix is None or again.fix.cost is None or again.fix.settings != fix.settings:
            break
        stated_all.append(again.fix.cost.fix.step_ms)
        generated_all.append(statistics.median(_generation(args, model, fix)))
    beside = [s / g for i, s in enumerate(stated_all) for g in generated_all[max(0, i - 1) : i + 1]]
    stated = fix.cost.fix
    measured = statistics.median(steps_ms)
    predicted, table = _predicted(args, model, fix, size=args.size)
    proved = report.work.at("proved_fix") if report.work is not None else None
    return {
        "bf16": bf16,
        "fix": fix.settings,
        "check_s": round(check_s, 1),
        "stated_step_ms": stated.step_ms,
        "stated_step_ms_range": list(stated.step_ms_range),
        "stated_component": stated.component,
        "generation_step_ms": round(measured, 1),
        "generation_step_ms_range": [round(min(steps_ms), 1), round(max(steps_ms), 1)],
        "stated_over_generation": round(stated.step_ms / measured, 3),
        "stated_step_ms_each_check": stated_all,
        "generation_step_ms_each_run": [round(g, 1) for g in generated_all],
        "stated_over_generation_alternating": round(statistics.median(beside), 3),
        "no_half_step_ms": fix.cost.no_half.step_ms,
        "predicted_step_ms": None if predicted is None else round(predicted, 1),
        "dtype_table_gflops": table,
        "stated_weights_mb": stated.weights_mb,
        "load_average": {**loads, "end": load_average()},
        "candidates": [
            {"kind": c.kind, "chosen": c.chosen, **(c.cost.to_json() if c.cost else {})}
            for c in report.tried
            if c.verified
        ],
        "work_at_proved_fix": {
            "timed_runs": proved.timed_runs if proved else None,
            "predicted_costs": proved.predicted_costs if proved else None,
        },
        "work": {
            "timed_runs": report.work.timed_runs if report.work else None,
            "predicted_costs": report.work.predicted_costs if report.work else None,
        },
    }


def _check(args, model, precision, bf16: str):
    """The check with the fix's cost measured, and its seconds."""
    from app.core import health
    from app.core.health.request import CheckRequest, CheckRun

    with status(f"check, fp16, bf16 {bf16}, fix's cost measured"):
        began = time.perf_counter()
        report = health.check_loaded(
            model,
            CheckRequest(precision=precision, device=args.device, size=args.size),
            run=CheckRun(remember=False),
        )
        return report, time.perf_counter() - began


def _generation(args, model, fix) -> list[float]:
    """The app's generation under the fix: each denoising step after the first, in ms, from its
    progress calls (the first holds the warm-up)."""
    from app.core.generation import GenerationRequest, generate
    from app.core.settings import PrecisionSettings

    stamps: list[float] = []

    def progress(stage, done, total) -> None:
        if total == args.steps and done:
            stamps.append(time.perf_counter())

    request = GenerationRequest(
        prompt="a lighthouse on a cliff at dusk",
        steps=args.steps,
        width=args.size,
        height=args.size,
        seed=1,
        output_dir=tempfile.mkdtemp(),
    )
    with status(f"generation under the fix, {args.steps} steps"):
        generate(
            model,
            request,
            precision=PrecisionSettings(precision="fp16", auto_fix="off"),
            device=args.device,
            on_progress=progress,
            fix=fix.settings,
        )
    return [(b - a) * 1000 for a, b in zip(stamps, stamps[1:], strict=False)]


def _predicted(args, model, fix, size: int) -> tuple[float | None, dict]:
    """The fix's UNet step predicted from its work at this device's dtype table, placed as a
    generation places it (`step_work.plan_seconds`): the work alone, no step measured."""
    import torch

    from app.core import hardware
    from app.core.hardware.selftest_cache import dtype_speed
    from app.core.health.step_work import module_flops, plan_seconds
    from app.core.precision.placement import as_generated

    unet = model.pipeline.unet
    latent, context = size // 8, unet.config.cross_attention_dim
    device = hardware.pick_device(args.device)
    speed = dtype_speed(hardware.describe_device(device), device)

    def call(module):
        sample = torch.randn(2, unet.config.in_channels, latent, latent)
        return module(sample, torch.tensor(500.0), torch.randn(2, 77, context))

    if fix.cost.fix.component != "unet":
        return None, speed.to_json()["gflops"]
    flops = module_flops(unet, call)
    seconds = plan_seconds(speed, flops, model.pipeline, as_generated(fix.plan), "unet")
    return (None if seconds is None else seconds * 1000), speed.to_json()["gflops"]


def table(document: dict) -> str:
    lines = [
        f"{document['model']} at {document['size']} px, stored in fp16, checked in fp16; a "
        f"generation of {document['steps']} steps under the fix",
        f"{'bf16':<10}{'fix':<44}{'stated ms (range)':>24}{'generation ms (range)':>26}"
        f"{'ratio':>7}{'alternating':>13}{'no-half ms':>12}{'predicted ms':>14}",
    ]
    for case in document["cases"]:
        if case.get("fix") is None:
            lines.append(f"{case['bf16']:<10}no fix: {case.get('verdict')}")
            continue
        fix = " ".join(f"{k}={v}" for k, v in case["fix"].items())
        fix = fix if len(fix) <= 42 else fix[:39] + "..."
        low, high = case["stated_step_ms_range"]
        stated = f"{case['stated_step_ms']:.0f} ({low:.0f}-{high:.0f})"
        low, high = case["generation_step_ms_range"]
        measured = f"{case['generation_step_ms']:.0f} ({low:.0f}-{high:.0f})"
        lines.append(
            f"{case['bf16']:<10}{fix:<44}{stated:>24}{measured:>26}"
            f"{case['stated_over_generation']:>7.2f}"
            f"{case['stated_over_generation_alternating']:>13.2f}{case['no_half_step_ms']:>12.0f}"
            f"{case['predicted_step_ms'] or float('nan'):>14.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="sd1", choices=("demo", "sd1", "sdxl"))
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--bf16", default="native", choices=("native", "emulated"))
    parser.add_argument(
        "--pairs", type=int, default=1, help="checks and generations, alternating (default 1)"
    )
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny pipeline")
    parser.add_argument("--json")
    args = parser.parse_args()
    # A remembered fix or settings of this machine's own would change what the check and the
    # generation run: both start from nothing.
    for var in ("HALFSAFE_CONFIG_DIR", "HALFSAFE_DATA_DIR", "HALFSAFE_CACHE_DIR"):
        os.environ[var] = tempfile.mkdtemp(prefix=var.lower())
    cases = [run_case(args, args.bf16)]  # one class a process: the device is described once
    document = {
        "machine": machine(args.device),
        "model": args.model,
        "tiny": args.tiny,
        "size": args.size,
        "steps": args.steps,
        "cases": cases,
    }
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
