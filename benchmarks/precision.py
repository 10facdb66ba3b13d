"""What each precision choice costs: time per denoising step, VAE decode time and peak memory,
each set beside fp32 (no-half) measured in the same run.

Choices: fp16; bf16; fp16 + upcast attention; fp16 + fp32 VAE (no-half-VAE); fp32 (no-half).
On a GPU also the accumulation settings: fp32 with TF32 off, fp16 with fp16 accumulation, and
fp16 with reduced-precision reduction off (these flags do nothing on a CPU, so they are skipped
there).

Each choice is resolved to a precision plan as the app resolves the user's settings, and runs
HalfSafe's own generation loop (`app.core.generation`: placed components, boundary casts, the
attention processor, the NaN watch), encoded once per choice. Choices with the same dtypes share
one placed copy of the model, so only the flags differ between them. After a warm-up, one
unmeasured-for-time run per choice measures peak working memory (benchmarks.common.PeakMemory);
the peak reported is that plus the choice's weights. Then rounds time every choice, in an order
rotated each round; ratios to no-half are taken within a round, then the median is reported.

Usage: python benchmarks/precision.py [--device cpu|cuda] [--models demo] [--size PX]
       [--steps N] [--rounds R] [--choices fp16,bf16,...] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from common import (
    MODEL_WORDS,
    NATIVE_SIZE,
    PeakMemory,
    bench_model,
    emit,
    generation_job,
    machine,
    names,
    release_device_memory,
    status,
    timed,
)

BASELINE = "fp32"


@dataclass(frozen=True)
class Choice:
    key: str
    words: str
    settings: dict
    gpu_only: bool = False


CHOICES = (
    Choice("fp16", "fp16", {"precision": "fp16"}),
    Choice("bf16", "bf16", {"precision": "bf16"}),
    # GPU only: on a CPU PyTorch's autocast keeps norms in fp16, so it would time plain fp16.
    Choice("autocast", "fp16 under autocast (A1111's default)", {"precision": "autocast"}, True),
    Choice(
        "fp16_upcast", "fp16 + upcast attention", {"precision": "fp16", "upcast_attention": True}
    ),
    Choice(
        "fp16_vae32", "fp16 + fp32 VAE (no-half-VAE)", {"precision": "fp16", "no_half_vae": True}
    ),
    Choice(BASELINE, "fp32 (no-half)", {"no_half": True}),
    Choice(
        "fp32_no_tf32", "fp32 (no-half), TF32 off", {"no_half": True, "allow_tf32": False}, True
    ),
    Choice(
        "fp16_accumulation",
        "fp16 + fp16 accumulation",
        {"precision": "fp16", "fp16_accumulation": True},
        True,
    ),
    Choice(
        "fp16_full_reduction",
        "fp16, reduced-precision reduction off",
        {"precision": "fp16", "fp16_reduced_precision_reduction": False},
        True,
    ),
)
DEFAULTS = {
    "cpu": {"models": ("demo",), "steps": 10, "rounds": 5},
    "cuda": {"models": ("sd1", "sdxl"), "steps": 10, "rounds": 3},
}


def _plan(choice: Choice, model, device, info):
    from app.core.precision import pipeline_components, resolve_plan
    from app.core.settings import PrecisionSettings

    settings = PrecisionSettings(auto_fix="off", **choice.settings)
    return resolve_plan(
        settings,
        device=device,
        components=pipeline_components(model.pipeline),
        device_info=info,
        vae_needs_fp32=False,  # "fp16" means every part in fp16 here, SDXL's VAE included
    )


def bench_model_choices(name: str, args) -> dict:
    from app.core import generation, hardware
    from app.core.precision import parameter_counts

    device = hardware.pick_device(args.device)
    info = hardware.describe_device(device)
    size = args.size or NATIVE_SIZE[name]
    chosen = [
        c for c in CHOICES if c.key in args.choices and (device.type == "cuda" or not c.gpu_only)
    ]
    if BASELINE not in [c.key for c in chosen]:
        raise SystemExit(f"The choices must include {BASELINE}, the baseline every ratio uses.")
    with status(f"building {name}"):
        model = bench_model(name, "fp32")
    counts = parameter_counts(model.pipeline)
    jobs: dict[tuple, object] = {}  # one placed model per set of dtypes
    runs: dict[str, dict] = {}
    for choice in chosen:
        plan = _plan(choice, model, device, info)
        dtypes = tuple(sorted(plan.dtypes.items()))
        if dtypes not in jobs:
            jobs[dtypes] = generation_job(
                model,
                plan,
                device=device,
                info=info,
                size=size,
                steps=args.steps,
                scheduler="dpmpp_2m_karras",
            )
        runs[choice.key] = {"choice": choice, "plan": plan, "job": jobs[dtypes]}
    request = runs[BASELINE]["job"].request
    seeds = [request.seed]

    def encode(run) -> object:
        return run["job"].encode(run["plan"])

    def denoise(run):
        latents, watch = run["job"].denoise(run["plan"], run["conditioning"], seeds)
        run["latents"] = latents
        run["watch"] = watch

    def decode(run) -> None:
        run["job"].decoded(run["plan"], run["latents"])

    with status(f"{name}: warm-up and peak memory of {len(runs)} choices at {size} px"):
        for run in runs.values():
            run["conditioning"] = encode(run)
            denoise(run)
            decode(run)
            with PeakMemory(device) as meter:
                run["conditioning"] = encode(run)
                denoise(run)
                decode(run)
            run["working_mib"] = meter.mib
            flags = generation.read_flags(run["watch"].flags())
            run["finite"] = not any(flags[: len(seeds)])
            release_device_memory()

    keys = list(runs)
    rounds: list[dict[str, dict[str, float]]] = []
    with status(f"{name}: {args.rounds} rounds of {args.steps} steps per choice"):
        for index in range(args.rounds):
            shift = index % len(keys)
            measured = {}
            for key in keys[shift:] + keys[:shift]:
                run = runs[key]
                measured[key] = {
                    "encode_s": timed(lambda run=run: encode(run), device),
                    "denoise_s": timed(lambda run=run: denoise(run), device),
                    "decode_s": timed(lambda run=run: decode(run), device),
                }
            rounds.append(measured)

    rows = []
    base_weights = runs[BASELINE]["plan"].weights_mb(counts)
    base_peak = _peak(runs[BASELINE], counts)
    for key, run in runs.items():
        plan = run["plan"]
        step_ratios = [r[key]["denoise_s"] / r[BASELINE]["denoise_s"] for r in rounds]
        peak = _peak(run, counts)
        rows.append(
            {
                "choice": key,
                "words": run["choice"].words,
                "dtypes": dict(plan.dtypes),
                "flags": {
                    "upcast_attention": plan.upcast_attention,
                    "attention_backend": plan.attention_backend,
                    "allow_tf32": plan.allow_tf32,
                    "fp16_accumulation": plan.fp16_accumulation,
                    "fp16_reduced_precision_reduction": plan.fp16_reduced_precision_reduction,
                },
                "step_ms": _median_ms([r[key]["denoise_s"] / args.steps for r in rounds]),
                "decode_ms": _median_ms([r[key]["decode_s"] for r in rounds]),
                "encode_ms": _median_ms([r[key]["encode_s"] for r in rounds]),
                "step_vs_no_half": round(statistics.median(step_ratios), 3),
                "weights_mib": round(plan.weights_mb(counts), 1),
                "working_peak_mib": None
                if run["working_mib"] is None
                else round(run["working_mib"], 1),
                "peak_mib": None if peak is None else round(peak, 1),
                "peak_vs_no_half": None
                if peak is None or not base_peak
                else round(peak / base_peak, 3),
                "weights_vs_no_half": round(plan.weights_mb(counts) / base_weights, 3),
                "finite": run["finite"],
            }
        )
    for job in jobs.values():
        job.placed.release()
    release_device_memory()
    return {
        "model": name,
        "model_words": MODEL_WORDS[name],
        "size": size,
        "steps": args.steps,
        "cfg": request.cfg,
        "scheduler": request.scheduler,
        "rounds": args.rounds,
        "choices": rows,
        "raw_rounds": [
            {k: {m: round(v, 5) for m, v in times.items()} for k, times in r.items()}
            for r in rounds
        ],
    }


def _peak(run: dict, counts) -> float | None:
    if run["working_mib"] is None:
        return None
    return run["plan"].weights_mb(counts) + run["working_mib"]


def _median_ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1000, 2)


def table(document: dict) -> str:
    head = (
        f"{'model':<6}{'size':>6}  {'choice':<38}{'step ms':>9}{'vs no-half':>11}"
        f"{'decode ms':>11}{'peak MiB':>10}{'vs no-half':>11}{'weights MiB':>13}  finite"
    )
    lines = [head, "-" * len(head)]
    for result in document["results"]:
        for r in result["choices"]:
            peak = "n/a" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
            peak_ratio = "n/a" if r["peak_vs_no_half"] is None else f"{r['peak_vs_no_half']:.2f}x"
            lines.append(
                f"{result['model']:<6}{result['size']:>6}  {r['words']:<38}{r['step_ms']:>9.1f}"
                f"{r['step_vs_no_half']:>10.2f}x{r['decode_ms']:>11.1f}{peak:>10}{peak_ratio:>11}"
                f"{r['weights_mib']:>13.0f}  {'yes' if r['finite'] else 'NO'}"
            )
    return "\n".join(lines)


def measure(args) -> dict:
    kind = args.device.split(":")[0]
    results = []
    for name in args.models:
        results.append(bench_model_choices(name, args))
    return {
        "benchmark": "precision",
        "machine": machine(args.device),
        "device": args.device,
        "results": results,
        "skipped": [] if kind == "cuda" else [c.key for c in CHOICES if c.gpu_only],
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--models", help="comma-separated: demo, sd1, sdxl")
    p.add_argument("--size", type=int, help="image side in px (default: each model's native)")
    p.add_argument("--steps", type=int)
    p.add_argument("--rounds", type=int)
    p.add_argument("--choices", help="comma-separated keys: " + ", ".join(c.key for c in CHOICES))
    p.add_argument("--json", help="write the results here as JSON")
    return p


def resolve_args(args) -> argparse.Namespace:
    defaults = DEFAULTS["cuda" if args.device.startswith("cuda") else "cpu"]
    args.models = names(args.models, defaults["models"])
    args.steps = args.steps or defaults["steps"]
    args.rounds = args.rounds or defaults["rounds"]
    args.choices = names(args.choices, [c.key for c in CHOICES])
    return args


def main() -> None:
    args = resolve_args(parser().parse_args())
    document = measure(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
