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
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NATIVE = {"demo": 128, "sd1": 512, "sdxl": 1024}


def build(name: str, dtype: str):
    from app.core.checkpoint import scan_weights
    from app.core.models import LoadedModel, build_random_pipeline, load_model

    if name == "demo":
        return load_model("demo")
    pipeline = build_random_pipeline(name, dtype=dtype, seed=0)
    return LoadedModel(
        pipeline=pipeline,
        source=f"random-{name}",
        name=f"random-{name}",
        format="demo",
        architecture=name,
        prediction_type="epsilon",
        native_size=NATIVE[name],
        stored_dtype=dtype,
        model_hash=None,
        profile_key=f"bench-random-{name}",
        weights=scan_weights(pipeline),
        detected_because="random weights for a benchmark",
    )


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int = 1) -> float:
    """Median wall seconds of `repeats` calls, synchronised at both ends."""
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_model(name: str, args) -> dict:
    import torch

    from app.core import health
    from app.core.precision import PlacedPipeline, backend_flags
    from app.core.settings import PrecisionSettings

    device = torch.device(args.device)
    model = build(name, args.dtype)
    size = args.size or NATIVE[name]
    settings = PrecisionSettings(precision=args.dtype)
    check = lambda: health.check_loaded(  # noqa: E731
        model, precision=settings, device=args.device, size=size, remember=False
    )

    report = check()  # warm-up: kernel selection, allocator, first-call costs
    check_seconds = timed(check, device, args.repeats)

    # One 20-step generation with plain diffusers under the same plan, same size.
    runner = health._Runner(model, report.plan, size, health.DEFAULT_PROMPT)
    placed: PlacedPipeline = runner.placed
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

    generate()
    generation_seconds = timed(generate, device, args.repeats)

    # Hook overhead: the UNet stage with and without the activation recorders.
    conditioning = runner.encode(report.plan, record=False).output
    bare = timed(
        lambda: runner.denoise(report.plan, conditioning, record=False), device, args.repeats
    )
    hooked = timed(
        lambda: runner.denoise(report.plan, conditioning, record=True), device, args.repeats
    )
    placed.release()
    return {
        "model": name,
        "size": size,
        "dtype": args.dtype,
        "verdict": report.verdict,
        "check_s": round(check_seconds, 3),
        "generation_s": round(generation_seconds, 3),
        "steps": args.steps,
        "check_vs_generation": round(check_seconds / generation_seconds, 3),
        "unet_stage_bare_s": round(bare, 3),
        "unet_stage_hooked_s": round(hooked, 3),
        "hook_overhead": round(hooked / bare - 1, 3),
    }


def machine(device: str) -> dict:
    import diffusers
    import torch

    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else None
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "gpu": gpu,
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="demo")
    parser.add_argument("--dtype", default="fp32", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--size", type=int)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args()

    rows = [bench_model(name, args) for name in args.models.split(",")]
    header = (
        f"{'model':<6}{'size':>6}{'dtype':>6}{'check s':>10}{'20-step s':>11}"
        f"{'ratio':>8}{'hooks':>8}  verdict"
    )
    print(header)
    for r in rows:
        print(
            f"{r['model']:<6}{r['size']:>6}{r['dtype']:>6}{r['check_s']:>10.3f}"
            f"{r['generation_s']:>11.3f}{r['check_vs_generation']:>8.1%}"
            f"{r['hook_overhead']:>+8.1%}  {r['verdict']}"
        )
    document = {"benchmark": "health_check", "machine": machine(args.device), "results": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=2))
    print(json.dumps(document["machine"]))


if __name__ == "__main__":
    main()
