"""Health check benchmark: the check's time after load next to one 20-step generation at the
same size, and what the activation hooks cost, measured side by side in one run.

Models: `demo` (the built-in tiny model), `sd1` and `sdxl` (full-size random-weight pipelines
built from the shipped configs). On a CPU use `--size` to keep sd1 affordable; on a GPU the
default is each model's native size.

Usage: python benchmarks/health_check.py [--device cpu|cuda] [--models demo,sd1,sdxl]
       [--dtype fp16|bf16|fp32] [--size PX] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics

from common import NATIVE_SIZE, bench_model, emit, machine, names, status, timed


def bench_check(name: str, args) -> dict:
    import torch

    from app.core import health
    from app.core.health.request import CheckRequest, CheckRun
    from app.core.precision import PlacedPipeline, backend_flags
    from app.core.settings import PrecisionSettings

    device = torch.device(args.device)
    model = bench_model(name, args.dtype)
    size = args.size or NATIVE_SIZE[name]
    settings = PrecisionSettings(precision=args.dtype)
    reports = []

    def check():
        reports.append(
            health.check_loaded(
                model,
                CheckRequest(precision=settings, device=args.device, size=size),
                run=CheckRun(remember=False),
            )
        )
        return reports[-1]

    report = check()  # warm-up: kernel selection, allocator, first-call costs

    # One 20-step generation with plain diffusers under the same plan, same size.
    runner = health._Runner(
        model,
        report.plan,
        size,
        health.DEFAULT_PROMPT,
        health.DEFAULT_STEPS,
        health.DEFAULT_SCHEDULER,
    )
    placed: PlacedPipeline = runner.placed
    placed.apply(report.plan)  # every component at once, as a plain pipeline holds them
    pipe = placed.pipeline()
    pipe.set_progress_bar_config(disable=True)

    def generate():
        with backend_flags(report.plan), torch.inference_mode():
            pipe(
                health.DEFAULT_PROMPT,
                num_inference_steps=args.steps,
                height=size,
                width=size,
                generator=torch.Generator().manual_seed(0),
                output_type="latent",
            )
            latents = torch.randn(1, 4, size // 8, size // 8, device=device)
            pipe.vae.decode(latents.to(pipe.vae.dtype) / pipe.vae.config.scaling_factor)

    # The UNet stage of the check with and without the activation recorders.
    conditioning = runner.encode(report.plan, record=False).output

    def unet_stage(record: bool):
        return lambda: runner.denoise(report.plan, conditioning, record=record)

    for warm_up in (generate, unet_stage(False), unet_stage(True)):
        warm_up()
    pairs = []
    for _ in range(args.repeats):  # alternating, so a change in the machine's load hits both
        pairs.append({"check": timed(check, device), "generation": timed(generate, device)})
    # The hooks' cost is a few percent of a stage: it takes more pairs to see it.
    hook_pairs = [
        {"bare": timed(unet_stage(False), device), "hooked": timed(unet_stage(True), device)}
        for _ in range(max(args.repeats, args.hook_repeats))
    ]
    check_seconds = statistics.median(p["check"] for p in pairs)
    generation_seconds = statistics.median(p["generation"] for p in pairs)
    bare = statistics.median(p["bare"] for p in hook_pairs)
    hooked = statistics.median(p["hooked"] for p in hook_pairs)
    ratio = statistics.median(p["check"] / p["generation"] for p in pairs)
    hooks = statistics.median(p["hooked"] / p["bare"] - 1 for p in hook_pairs)
    placed.release()
    return {
        "model": name,
        "size": size,
        "dtype": args.dtype,
        "verdict": report.verdict,
        "check_s": round(check_seconds, 3),
        "generation_s": round(generation_seconds, 3),
        "steps": args.steps,
        "check_vs_generation": round(ratio, 3),
        "unet_stage_bare_s": round(bare, 3),
        "unet_stage_hooked_s": round(hooked, 3),
        "hook_overhead": round(hooks, 3),
        "repeats": args.repeats,
        "hook_repeats": len(hook_pairs),
        # The work of the last timed check, and by each milestone it reached (the first
        # finding, the proved fix, the verdict, the end) with its seconds.
        "work": reports[-1].work.to_json() if reports[-1].work is not None else None,
    }


def measure(args) -> dict:
    rows = []
    for name in args.models:
        with status(f"health check: {name} ({args.dtype})"):
            rows.append(bench_check(name, args))
    return {"benchmark": "health_check", "machine": machine(args.device), "results": rows}


def table(document: dict) -> str:
    header = (
        f"{'model':<6}{'size':>6}{'dtype':>6}{'check s':>10}{'20-step s':>11}"
        f"{'ratio':>8}{'hooks':>8}  verdict"
    )
    lines = [header, "-" * len(header)]
    for r in document["results"]:
        lines.append(
            f"{r['model']:<6}{r['size']:>6}{r['dtype']:>6}{r['check_s']:>10.3f}"
            f"{r['generation_s']:>11.3f}{r['check_vs_generation']:>8.1%}"
            f"{r['hook_overhead']:>+8.1%}  {r['verdict']}"
        )
    for r in document["results"]:  # the check's work, counted
        if r.get("work"):
            counts = {k: v for k, v in r["work"].items() if k != "milestones"}
            lines.append(f"{r['model']} work: {json.dumps(counts)}")
    lines.extend(milestone_lines(document["results"]))
    return "\n".join(lines)


def milestone_lines(results: list[dict]) -> list[str]:
    """Per model, each milestone its check reached: when, and the work done by then."""
    header = (
        f"{'model':<6}{'milestone':<15}{'s':>8}{'calls':>7}{'denoiser':>10}"
        f"{'placed':>8}{'timed':>7}"
    )
    lines = ["", header, "-" * len(header)]
    for r in results:
        for name, reached in ((r.get("work") or {}).get("milestones") or {}).items():
            calls = {part: sum(d.values()) for part, d in reached["calls"].items()}
            denoiser = calls.get("unet", calls.get("transformer", 0))
            lines.append(
                f"{r['model']:<6}{name:<15}{reached['seconds']:>8.3f}{sum(calls.values()):>7}"
                f"{denoiser:>10}{reached['placements']:>8}{reached['timed_calls']:>7}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="demo")
    parser.add_argument("--dtype", default="fp32", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--size", type=int)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hook-repeats", type=int, default=3, help="pairs for the hook cost")
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args()
    args.models = names(args.models, ["demo"])
    document = measure(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
