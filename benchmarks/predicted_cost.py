"""How well the work and the device's dtype table predict what a candidate fix's UNet step costs
beside another's: the plans a fix search weighs against each other (half precision with two
layers kept wider, the part in bf16, the part in fp32) placed as a generation places them, each
timed (a warm-up, then rounds alternating), and each predicted from its work
(`step_work.module_flops`, `plan_seconds`) at the device's rates (`hardware.dtype_speed`).
Printed per plan: the timed step, the predicted one, and the ratio of each to the first plan's
(timed against predicted): the ranking compares candidates by such ratios, so their error is
the prediction's error that matters.

Usage: python benchmarks/predicted_cost.py [--device cpu|cuda] [--model sd1|sdxl|demo|tiny]
       [--size PX] [--rounds R] [--stored fp16|fp32] [--placed check|generation] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from common import NATIVE_SIZE, bench_model, emit, machine, status, timed
from islands import PLANTED, _inputs

# The plans weighed, as a fix search on a half-precision UNet weighs them: (label, settings).
LAYERS = (f"unet:{PLANTED}", f"unet:{PLANTED.replace('conv1', 'norm2')}")
PLANS = {
    "fp16": {"precision": "fp16"},
    "fp16+fp32 layers": {"precision": "fp16", "fp32_modules": LAYERS},
    "fp16+bf16 layers": {"precision": "fp16", "bf16_modules": LAYERS},
    "bf16": {"precision": "bf16"},
    "fp32": {"precision": "fp32"},
}


def _model(args):
    if args.model != "tiny":
        return bench_model(args.model, args.stored)
    import torch

    from app.core.models import LoadedModel
    from tests.support.tiny_models import build_tiny_sd_pipeline

    pipeline = build_tiny_sd_pipeline()
    if args.stored == "fp16":
        pipeline = pipeline.to(torch.float16)
    return LoadedModel(
        pipeline=pipeline,
        source="tiny",
        name="tiny",
        format="demo",
        architecture="sd1",
        prediction_type="epsilon",
        native_size=64,
        stored_dtype=args.stored,
        model_hash=None,
        profile_key="bench-tiny",
        weights=None,
        detected_because="the tests' tiny model",
    )


def run(args) -> dict:
    import torch

    from app.core import hardware
    from app.core.hardware import dtype_speed
    from app.core.health.step_work import module_flops, plan_seconds
    from app.core.precision import PlacedPipeline, backend_flags, resolve_plan
    from app.core.settings import PrecisionSettings

    device = hardware.pick_device(args.device)
    size = args.size or NATIVE_SIZE.get(args.model, 64)
    with status(f"building {args.model} (stored in {args.stored})"):
        model = _model(args)
    pipeline = model.pipeline
    inputs = _inputs(model, size, device, torch.Generator().manual_seed(0))
    # Measured afresh each run: the table's own noise is part of the prediction's error.
    speed = dtype_speed.measure(device, "bench")
    placed, plans = {}, {}
    for label, settings in PLANS.items():
        plan = resolve_plan(PrecisionSettings(**settings), device=device, components=["unet"])
        # As the check times its candidates (from the stored weights), or as a generation
        # places them (a copy where the dtype's width differs).
        plans[label] = replace(plan, compute_in_place=args.placed == "check")
        placed[label] = PlacedPipeline(pipeline, plans[label], ["unet"])

    def step_on(unet):
        dtype = next(unet.parameters()).dtype
        cast = {k: v.to(dtype) if k != "added_cond_kwargs" else v for k, v in inputs.items()}
        return unet(**cast, return_dict=False)[0]

    def step(label):
        with backend_flags(plans[label]), torch.inference_mode():
            return step_on(placed[label]["unet"])

    with status("counting the work on fake tensors"):
        began = time.perf_counter()
        flops = module_flops(placed[first := next(iter(plans))]["unet"], lambda m: step_on(m))
        counting_s = time.perf_counter() - began
    for label in plans:
        with status(f"warm-up: {label}"):
            step(label)
    samples: dict[str, list[float]] = {k: [] for k in plans}
    for round_ in range(args.rounds):
        with status(f"round {round_ + 1} of {args.rounds}"):
            for label in plans:
                samples[label].append(timed(lambda label=label: step(label), device) * 1000)
    rows = {}
    for label, plan in plans.items():
        rows[label] = {
            "step_ms": round(statistics.median(samples[label]), 2),
            "step_ms_range": [round(min(samples[label]), 2), round(max(samples[label]), 2)],
            "predicted_ms": _ms(plan_seconds(speed, flops, pipeline, plan, "unet")),
        }
    for row in rows.values():
        row["timed_ratio"] = round(row["step_ms"] / rows[first]["step_ms"], 4)
        p, p0 = row["predicted_ms"], rows[first]["predicted_ms"]
        row["predicted_ratio"] = round(p / p0, 4) if p and p0 else None
        if row["predicted_ratio"]:
            row["ratio_error"] = round(row["predicted_ratio"] / row["timed_ratio"] - 1, 4)
    return {
        "machine": machine(str(device)),
        "model": args.model,
        "stored": args.stored,
        "size": size,
        "placed": args.placed,
        "rounds": args.rounds,
        "counting_work_s": round(counting_s, 2),
        "dtype_table_gflops": speed.to_json()["gflops"],
        "gflop_per_step": round(sum(flops.get("", {}).values()) / 1e9, 3),
        "rows": rows,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def table(document: dict) -> str:
    lines = [
        f"{document['model']} at {document['size']} px, stored in {document['stored']}, placed as "
        f"the {document['placed']} places it, a UNet step on the CFG batch "
        f"({document['gflop_per_step']} GFLOP, counted in {document['counting_work_s']} s), "
        f"{document['rounds']} rounds; ratios to the first plan's",
        f"{'plan':<20}{'timed ms (range)':>26}{'predicted ms':>14}{'timed ratio':>13}"
        f"{'predicted ratio':>17}{'error':>8}",
    ]
    for label, row in document["rows"].items():
        low, high = row["step_ms_range"]
        spread = f"{row['step_ms']:.1f} ({low:.1f}-{high:.1f})"
        predicted = row["predicted_ms"] or float("nan")
        error = row.get("ratio_error")
        lines.append(
            f"{label:<20}{spread:>26}{predicted:>14.1f}{row['timed_ratio']:>13.3f}"
            f"{row['predicted_ratio'] or float('nan'):>17.3f}"
            f"{'' if error is None else format(error, '+.1%'):>8}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="sd1", choices=("demo", "sd1", "sdxl", "tiny"))
    parser.add_argument("--size", type=int)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stored", default="fp16", choices=("fp16", "fp32"))
    parser.add_argument("--placed", default="check", choices=("check", "generation"))
    parser.add_argument("--json")
    args = parser.parse_args()
    document = run(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
