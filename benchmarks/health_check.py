"""Health check benchmark: the check's time after load next to one 20-step generation at the
same size, and what the activation hooks cost, measured side by side in one run.

Models: `demo` (the built-in tiny model), `sd1` and `sdxl` (full-size random-weight pipelines
built from the shipped configs; `--tiny`: the tests' tiny pipelines of the same architectures).
On a CPU use `--size` to keep sd1 affordable; on a GPU the default is each model's native size.
`--plant` scales one UNet layer past fp16's range (`common.PLANTS`): the check then finds it,
proves a fix, and its milestones (first finding, proved fix, verdict) are reported with the
work done by each.

The generation beside the check: `--generation diffusers` (default) calls the diffusers
pipeline with every part placed under the check's plan beforehand; `--generation app` is the
app's own generation of 20 steps, as its engine runs it (`requested.generate`: placing, encoding,
the watched loop, decoding, the diagnosis, the PNG written), the model already loaded.

Usage: python benchmarks/health_check.py [--device cpu|cuda] [--models demo,sd1,sdxl]
       [--dtype fp16|bf16|fp32] [--size PX] [--tiny] [--plant] [--generation diffusers|app]
       [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile

from common import (
    bench_model,
    emit,
    machine,
    model_size,
    names,
    plant,
    status,
    timed,
    write_json,
)


def bench_check(name: str, args) -> dict:
    import torch

    from app.core import health
    from app.core.health.request import CheckRequest, CheckRun
    from app.core.precision import PlacedPipeline, backend_flags
    from app.core.settings import PrecisionSettings

    device = torch.device(args.device)
    model = bench_model(name, args.dtype, tiny=args.tiny)
    planted = plant(model, name) if args.plant else None
    size = model_size(name, args.size, args.tiny)
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

    # One 20-step generation at the same size: plain diffusers under the same plan, or the
    # app's own.
    runner = health._Runner(
        model,
        report.plan,
        size,
        health.DEFAULT_PROMPT,
        health.DEFAULT_STEPS,
        health.DEFAULT_SCHEDULER,
    )
    placed: PlacedPipeline = runner.placed
    applied: list[bool] = []

    def diffusers_generation():
        if not applied:  # every component at once, as a plain pipeline holds them
            placed.apply(report.plan)
            applied.append(True)
        pipe = placed.pipeline()
        pipe.set_progress_bar_config(disable=True)
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

    images = tempfile.mkdtemp(prefix="halfsafe-health-bench-")

    def app_generation():
        from app.core.generation import GenerationRequest
        from app.core.requests.records import GenerateRequest
        from app.core.requests.requested import generate as requested_generate

        request = GenerationRequest(
            prompt=health.DEFAULT_PROMPT,
            steps=args.steps,
            width=size,
            height=size,
            seed=0,
            output_dir=images,
        )
        precision = PrecisionSettings(precision=args.dtype, auto_fix="off")
        fix = report.fix.settings if report.fix is not None else {}
        requested_generate(
            model,
            GenerateRequest(generation=request, precision=precision, device=args.device, fix=fix),
        )

    generate = app_generation if args.generation == "app" else diffusers_generation
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
    shutil.rmtree(images, ignore_errors=True)
    return {
        "model": name,
        "tiny": args.tiny,
        "size": size,
        "dtype": args.dtype,
        "planted": planted,
        "generation": args.generation,
        "verdict": report.verdict,
        "first_bad_module": {
            n: c.first_bad_module for n, c in reports[-1].components.items() if c.first_bad_module
        },
        "fix": reports[-1].fix.summary if reports[-1].fix is not None else None,
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
    document = {"benchmark": "health_check", "machine": machine(args.device), "results": rows}
    for name in args.models:
        with status(f"health check: {name} ({args.dtype})"):
            rows.append(bench_check(name, args))
        if args.json:  # each model's figures as soon as they are known
            write_json(args.json, document)
    return document


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
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny pipelines")
    parser.add_argument("--plant", action="store_true", help="an fp16 overflow in the UNet")
    parser.add_argument("--generation", default="diffusers", choices=("diffusers", "app"))
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args()
    args.models = names(args.models, ["demo"])
    document = measure(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
