"""NaN watch benchmark: HalfSafe's denoising loop with the watch vs the same diffusers pipeline
without it, side by side in one run.

For each case the components are placed once under one precision plan and the prompt is
encoded once; then, alternating run by run with identical latents, embeddings and scheduler:
  - plain:   the diffusers pipeline call (`output_type="latent"`, no step callback);
  - watched: the loop `generate` runs (`callback_on_step_end` with progress, cancel and the NaN
             watch: UNet-output and latent flags kept on the device);
  - callback only: the same loop with the watch off (progress and cancel only).
Each round runs plain, watched, callback only, plain; the overhead is the median over rounds of
watched / (mean of the two plain runs around it) - 1, so a machine whose load changes during the
run (a shared CI box) still compares like with like. The watch's own work per step is also
timed alone, on tensors of the case's shapes. One full `generate()` (encode, loop, decode,
diagnosis, PNG) is timed for reference.

CPU (default): the demo model at 128 px and a random-weight SD1.5-shaped pipeline at 128 px,
fp32, a few steps. CUDA (`--device cuda`): random-weight SD1.5 at 512 px and SDXL at 1024 px,
fp16, 20 steps; and a sync check: the loop runs under `torch.cuda.set_sync_debug_mode("warn")`
and the synchronising calls between the end of the first step and the end of the last are
counted, for the plain pipeline and for the watched loop.

`--tiny` runs the CUDA cases (sd1, sdxl) on the tests' tiny pipelines at 64 px, on whichever
device is named: a dry run of the GPU's cases.

Usage: python benchmarks/generation.py [--device cpu|cuda] [--cases demo,sd1] [--steps N]
       [--runs R] [--tiny] [--json PATH]
Prints a table; `--json` also writes the figures as JSON.
docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from common import (
    TINY_SIZE,
    bench_model,
    emit,
    generation_job,
    machine,
    names,
    status,
    write_json,
)
from common import sync as _sync

# name -> (model, size px, precision) per device kind
CASES = {
    "cpu": {"demo": ("demo", 128, "fp32"), "sd1": ("sd1", 128, "fp32")},
    "cuda": {"sd1": ("sd1", 512, "fp16"), "sdxl": ("sdxl", 1024, "fp16")},
}
DEFAULT_STEPS = {"cpu": 6, "cuda": 20}
SYNC_WARNING = "synchronizing"


def run_case(name: str, key: str, size: int, dtype: str, args) -> dict:

    from app.core import generation, hardware
    from app.core.precision import pipeline_components, resolve_plan
    from app.core.settings import PrecisionSettings

    built = time.perf_counter()
    model = bench_model(key, dtype, tiny=args.tiny)
    build_s = time.perf_counter() - built
    device = hardware.pick_device(args.device)
    info = hardware.describe_device(device)
    precision = PrecisionSettings(precision=dtype, auto_fix="off")
    plan = resolve_plan(
        precision,
        device=device,
        components=pipeline_components(model.pipeline),
        device_info=info,
    )
    job = generation_job(
        model,
        plan,
        device=device,
        info=info,
        size=size,
        steps=args.steps,
        scheduler=args.scheduler,
    )
    request = job.request
    seeds = [request.seed]
    conditioning = job.encode(plan)

    def plain() -> float:
        # The same setup `_Job.denoise` does (pipeline object, scheduler, initial noise) is
        # inside the timing on both sides.
        _sync(device)
        begun = time.perf_counter()
        with job.running_stage(plan, [job.family.denoiser]) as stage:
            latents, generators = job.noise(seeds)
            stage.pipe(
                **conditioning.embeds,
                height=size,
                width=size,
                num_inference_steps=args.steps,
                guidance_scale=request.cfg,
                latents=latents,
                generator=generators,
                output_type="latent",
            )
        _sync(device)
        return time.perf_counter() - begun

    def ours(watch: bool) -> float:
        job.watch = watch
        _sync(device)
        begun = time.perf_counter()
        latents, nan_watch = job.denoise(plan, conditioning, seeds)
        _sync(device)
        seconds = time.perf_counter() - begun
        if nan_watch is not None:  # what generate does next: one read of every flag
            generation.read_flags(nan_watch.flags())
        return seconds

    plain()  # warm-up: kernels, allocator, scheduler tables
    ours(True)
    rounds = []
    for _ in range(args.runs):
        before = plain()
        watched = ours(True)
        callback_only = ours(False)
        after = plain()
        rounds.append(
            {
                "plain_before": before,
                "watched": watched,
                "callback_only": callback_only,
                "plain_after": after,
            }
        )

    ops_us = _watch_ops_us(job, size, device)
    sync_check = None
    if device.type == "cuda":
        sync_check = _sync_check(job, plan, conditioning, seeds, size, args)

    job.placed.release()
    with tempfile.TemporaryDirectory() as folder:
        request.output_dir = folder
        begun = time.perf_counter()
        result = generation.generate(model, request, precision=precision, device=args.device)
        generate_s = time.perf_counter() - begun

    plains = [r[k] for r in rounds for k in ("plain_before", "plain_after")]
    plain_s = statistics.median(plains)

    def overhead(key: str) -> float:
        ratios = [r[key] / ((r["plain_before"] + r["plain_after"]) / 2) - 1 for r in rounds]
        return statistics.median(ratios) * 100

    return {
        "case": name,
        "model": key,
        "size": size,
        "dtype": dtype,
        "steps": args.steps,
        "scheduler": args.scheduler,
        "build_s": round(build_s, 1),
        "rounds": [{k: round(v, 4) for k, v in r.items()} for r in rounds],
        "plain_s": round(plain_s, 4),
        "watched_s": round(statistics.median(r["watched"] for r in rounds), 4),
        "callback_only_s": round(statistics.median(r["callback_only"] for r in rounds), 4),
        "watch_overhead_pct": round(overhead("watched"), 2),
        "callback_only_overhead_pct": round(overhead("callback_only"), 2),
        "step_ms": round(plain_s / args.steps * 1000, 2),
        "watch_ops_us_per_step": round(ops_us, 1),
        "watch_ops_pct_of_step": round(ops_us / (plain_s / args.steps * 1e6) * 100, 3),
        "generate_s": round(generate_s, 3),
        "generate_status": [image.status for image in result.images],
        "sync_check": sync_check,
    }


def _watch_ops_us(job, size: int, device) -> float:
    """Time of the watch's own work in one step, alone: the UNet-output check (with the kept
    failing input) and the latent check, on tensors of this case's shapes. Noise-free where
    whole-loop timings on a busy machine are not."""
    import torch

    from app.core.generation import NanWatch

    unet = job.placed["unet"]
    dtype = next(unet.parameters()).dtype
    side = size // 8
    sample = torch.randn(2, 4, side, side, device=device, dtype=dtype)
    latents = torch.randn(1, 4, side, side, device=device)
    timestep = torch.tensor(500.0, device=device)
    context = torch.randn(2, 77, 8, device=device, dtype=dtype)

    class Stub(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones((), device=device))

        def forward(self, x, t, encoder_hidden_states=None, return_dict=False):
            return (x,)

    stub = Stub()
    watch = NanWatch(stub, 1)
    with torch.inference_mode():
        stub(sample, timestep, encoder_hidden_states=context)  # warm-up
        stub_only = Stub()
        _sync(device)
        count = 200
        begun = time.perf_counter()
        for step in range(count):
            stub(sample, timestep, encoder_hidden_states=context)
            watch.after_step(step, latents)
        _sync(device)
        watched = time.perf_counter() - begun
        begun = time.perf_counter()
        for _ in range(count):
            stub_only(sample, timestep, encoder_hidden_states=context)
        _sync(device)
        bare = time.perf_counter() - begun
    watch.remove()
    return max(0.0, (watched - bare) / count * 1e6)


def _sync_check(job, plan, conditioning, seeds, size, args) -> dict:
    """Count synchronising CUDA calls inside the denoising loop (from the end of the first step
    to the end of the last; the first step holds the scheduler's one-time index lookup), for
    the plain pipeline and for the watched loop."""
    import torch

    from app.core.jobs import no_progress

    def measure(run) -> dict:
        marks: list[int] = []
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")

            def mark() -> None:
                marks.append(sum(1 for r in records if SYNC_WARNING in str(r.message)))

            torch.cuda.set_sync_debug_mode("warn")
            try:
                run(mark)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            syncs = [r for r in records if SYNC_WARNING in str(r.message)]
        inside = syncs[marks[0] : marks[-1]] if len(marks) > 1 else []
        return {
            "whole_call": len(syncs),
            "inside_loop": len(inside),
            "where": sorted({f"{Path(r.filename).name}:{r.lineno}" for r in inside}),
        }

    def plain_run(mark) -> None:
        def step_end(_pipe, _index, _timestep, _tensors):
            mark()  # counts only: no tensor is touched
            return {}

        with job.running_stage(plan, [job.family.denoiser]) as stage:
            latents, generators = job.noise(seeds)
            stage.pipe(
                **conditioning.embeds,
                height=size,
                width=size,
                num_inference_steps=args.steps,
                guidance_scale=job.request.cfg,
                latents=latents,
                generator=generators,
                output_type="latent",
                callback_on_step_end=step_end,
            )

    def watched_run(mark) -> None:
        job.watch = True
        job.progress = lambda stage, step, total: mark()
        try:
            job.denoise(plan, conditioning, seeds)
        finally:
            job.progress = no_progress

    results = {"plain": measure(plain_run), "watched": measure(watched_run)}
    results["added_by_watch_inside_loop"] = (
        results["watched"]["inside_loop"] - results["plain"]["inside_loop"]
    )
    return results


def table(document: dict) -> str:
    rows = document["cases"]
    head = (
        f"{'case':<6}{'size':>6}{'dtype':>6}{'steps':>6}{'step ms':>10}{'plain s':>10}"
        f"{'watched s':>11}{'cb-only s':>11}{'overhead':>10}{'cb-only':>9}{'watch ops':>11}"
        f"{'generate s':>12}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['case']:<6}{r['size']:>6}{r['dtype']:>6}{r['steps']:>6}{r['step_ms']:>10.1f}"
            f"{r['plain_s']:>10.3f}{r['watched_s']:>11.3f}{r['callback_only_s']:>11.3f}"
            f"{r['watch_overhead_pct']:>9.2f}%{r['callback_only_overhead_pct']:>8.2f}%"
            f"{r['watch_ops_pct_of_step']:>10.3f}%"
            f"{r['generate_s']:>12.2f}"
        )
        if r["sync_check"]:
            s = r["sync_check"]
            lines.append(
                f"      syncs inside the loop: plain {s['plain']['inside_loop']}, watched "
                f"{s['watched']['inside_loop']} (added by the watch: "
                f"{s['added_by_watch_inside_loop']})"
            )
    return "\n".join(lines)


def measure(args) -> dict:
    import torch

    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    cases = CASES[kind]
    if args.tiny:  # the GPU's cases, tiny, in their precision
        cases = {n: (key, TINY_SIZE, dtype) for n, (key, _, dtype) in CASES["cuda"].items()}
    args.steps = args.steps or DEFAULT_STEPS[kind]
    rows = []
    document = {
        "benchmark": "generation",
        "machine": machine(args.device),
        "device": args.device,
        "tiny": args.tiny,
        "cases": rows,
    }
    for name in names(args.cases, list(cases)):
        if name not in cases:
            sys.exit(f"Unknown case {name!r} for {kind}: choose from {', '.join(cases)}.")
        key, size, dtype = cases[name]
        with status(f"generation: {name} ({key}, {size} px, {dtype}, {args.steps} steps)"):
            rows.append(run_case(name, key, size, dtype, args))
        if kind == "cuda":
            torch.cuda.empty_cache()
        if args.json:  # each case's figures as soon as they are known
            write_json(args.json, document)
    return document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--cases", help="comma-separated: demo,sd1 (cpu) or sd1,sdxl (cuda)")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scheduler", default="dpmpp_2m_karras")
    parser.add_argument("--tiny", action="store_true", help="the CUDA cases, tiny")
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args()
    document = measure(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
