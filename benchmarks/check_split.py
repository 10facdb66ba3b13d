"""Where a healthy check's time goes beside the 20-step generation it serves, and the floor the
check's own work puts under their ratio.

In one process, as `user_wait.py --ways warm` runs them: the model loaded in the app's engine
(SD1.5 at full size with random weights, `common.bench_model`), a one-step generation first (a
first job's one-off costs), then, `--rounds` times, the healthy check and the app's 20-step
generation, alternating, each under cProfile. Each job's time is split into what both do:
placing the parts (`PlacedPipeline.apply`), the text encoders, the denoiser stage (the
check's three probed steps; the generation's twenty), the UNet's own calls in it, the VAE's
decode, and, in the check, the recorder's reductions. The floor is the check's work at the generation's own speed: three of its steps,
its decode and its text encoding, with and without the placing both jobs do.

Usage: python benchmarks/check_split.py [--precision bf16] [--size 256] [--rounds 2]
       [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

STEPS = 20
PROBED_STEPS = 3
# (file suffix, function name) of each share a job's time is split into.
SHARES = {
    "placing": ("precision/placement.py", "apply"),
    "text": ("run/stages.py", "encode"),
    "check_denoiser": ("families/sd.py", "probe_denoise"),
    "generation_denoiser": ("run/stages.py", "denoise_loop"),
    "decode": ("families/base.py", "decode"),
    "recorder": ("run/probe.py", "_output_only"),
    "unet_calls": ("unet_2d_condition.py", "forward"),
}


def shares(stats: pstats.Stats) -> dict[str, float]:
    """Each share's cumulative seconds in a job's profile, and how many UNet calls it made."""
    found = dict.fromkeys(SHARES, 0.0)
    calls = 0
    for (path, _, function), row in stats.stats.items():  # type: ignore[attr-defined]
        for share, (suffix, name) in SHARES.items():
            if path.endswith(suffix) and function == name:
                found[share] += row[3]
                calls += row[1] if share == "unet_calls" else 0
    return {**{share: round(seconds, 3) for share, seconds in found.items()}, "unet_n": calls}


def measure(precision: str, size: int, rounds: int) -> dict:
    import cProfile

    from common import bench_model

    from app.core.generation import GenerationRequest
    from app.core.jobs import CancelToken
    from app.core.requests.records import CheckRequest, GenerateRequest
    from app.core.settings import PrecisionSettings
    from app.engine import jobs
    from app.engine.events import JobRequest
    from app.engine.server import JobContext, Session

    session = Session()
    session.model = bench_model("sd1", "fp32")
    settings = PrecisionSettings(precision=precision)
    output = tempfile.mkdtemp()

    def generation(steps: int) -> GenerateRequest:
        job = GenerationRequest(
            prompt="a lighthouse on a cliff",
            steps=steps,
            seed=7,
            width=size,
            height=size,
            output_dir=output,
        )
        return GenerateRequest(generation=job, precision=settings)

    def profiled(handler, request, job_id: int) -> tuple[float, dict[str, float], object]:
        context = JobContext(JobRequest(job_id, request), session, lambda _: None, CancelToken())
        profile = cProfile.Profile()
        began = time.perf_counter()
        profile.enable()
        result = handler(context, request)
        profile.disable()
        return time.perf_counter() - began, shares(pstats.Stats(profile)), result

    first_s, _, _ = profiled(jobs.generate, generation(1), 1)
    rows = []
    for index in range(rounds):
        check_s, check, result = profiled(
            jobs.check, CheckRequest(precision=settings, size=size), 10 + index
        )
        verdict = result.report.verdict  # type: ignore[attr-defined]
        generation_s, generated, _ = profiled(jobs.generate, generation(STEPS), 20 + index)
        # A step: one UNet call with the CFG batch, as each job made it.
        step = generated["unet_calls"] / generated["unet_n"]
        floor = PROBED_STEPS * step + generated["decode"] + generated["text"]
        rows.append(
            {
                "check_s": round(check_s, 3),
                "generation_s": round(generation_s, 3),
                "ratio": round(check_s / generation_s, 4),
                "verdict": getattr(verdict, "value", str(verdict)),
                "check": check,
                "generation": generated,
                "generation_step_s": round(step, 3),
                "check_step_s": round(check["unet_calls"] / max(check["unet_n"], 1), 3),
                "floor_placing": round((floor + generated["placing"]) / generation_s, 4),
                "floor_unplaced": round(floor / (generation_s - generated["placing"]), 4),
            }
        )
    return {
        "precision": precision,
        "size": size,
        "first_job_s": round(first_s, 3),
        "rounds": rows,
        "load_average": os.getloadavg(),
        "threads": __import__("torch").get_num_threads(),
    }


def table(document: dict) -> str:
    lines = [
        "| round | check | generation | check / generation | probed step / generation's step "
        "| floor, placing both | floor, placing neither |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, row in enumerate(document["rounds"], start=1):
        lines.append(
            f"| {index} | {row['check_s']:.2f} s | {row['generation_s']:.2f} s | "
            f"{row['ratio']:.1%} | {row['check_step_s']:.2f} s / {row['generation_step_s']:.2f} s "
            f"| {row['floor_placing']:.1%} | {row['floor_unplaced']:.1%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        for var in ("HALFSAFE_CONFIG_DIR", "HALFSAFE_DATA_DIR", "HALFSAFE_CACHE_DIR"):
            os.environ[var] = str(Path(home) / var.lower())
        document = measure(args.precision, args.size, args.rounds)
    print(table(document))
    for row in document["rounds"]:
        print(json.dumps({"check": row["check"], "generation": row["generation"]}))
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
