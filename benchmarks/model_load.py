"""Model loading benchmark: a full-size SD1.5 single file, HalfSafe's loader vs diffusers'.

Builds a random-weight SD1.5 checkpoint (original layout, fp16 by default) in a temporary folder,
then in one run times, alternating, several loads of each:
  - `app.core.models.load_model` (header checks, NaN/Inf scan of every tensor, assembly);
  - `StableDiffusionPipeline.from_single_file(path, config=<the same local config folder>,
    local_files_only=True, torch_dtype=<stored dtype>)`;
the same followed by `scan_weights(pipeline)` (so both give the NaN/Inf guarantee; diffusers'
loader maps the file lazily and reads no weight until first use); and the standalone weight
scan (`scan_weights(path)`) in MB/s. The file is read once before timing, so every run sees it
in the OS cache; then each is timed once more with this file dropped from the OS cache (cold:
read from disk). HalfSafe's first load also computes the file's sha256 (the A1111 hash), which
is cached for later loads; it is reported on its own.

Usage: python benchmarks/model_load.py [--dtype fp16|fp32] [--runs 3] [--keep DIR]
Prints a JSON object; docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A fresh cache folder, so the first load really computes the file hash.
os.environ.setdefault("HALFSAFE_CACHE_DIR", tempfile.mkdtemp(prefix="halfsafe-bench-cache-"))
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "fp32"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--config", default="sd1", help="shipped config to build (sd1, sdxl)")
    parser.add_argument("--keep", help="folder to write the checkpoint to (kept afterwards)")
    args = parser.parse_args()

    import diffusers
    import torch

    diffusers.utils.logging.disable_progress_bar()
    from app.core.checkpoint import scan_weights
    from app.core.models import build_random_pipeline, config_folder, load_model, save_single_file

    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="halfsafe-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"random-{args.config}-{args.dtype}.safetensors"
    started = time.perf_counter()
    if not path.exists():
        pipeline = build_random_pipeline(args.config, dtype=args.dtype, seed=0)
        save_single_file(pipeline, path)
        del pipeline
    build_seconds = time.perf_counter() - started
    size = path.stat().st_size
    with open(path, "rb") as handle:  # warm the OS cache so both loaders read from memory
        while handle.read(64 << 20):
            pass

    pipeline_class = (
        diffusers.StableDiffusionXLPipeline
        if args.config == "sdxl"
        else diffusers.StableDiffusionPipeline
    )
    config = str(config_folder(args.config))
    dtype = torch.float16 if args.dtype == "fp16" else torch.float32

    def ours() -> tuple[float, float]:
        begun = time.perf_counter()
        model = load_model(str(path))
        seconds = time.perf_counter() - begun
        assert not model.weights.non_finite
        return seconds, model.weights.seconds

    def theirs(scan: bool) -> float:
        begun = time.perf_counter()
        pipe = pipeline_class.from_single_file(
            str(path), config=config, local_files_only=True, torch_dtype=dtype
        )
        if scan:  # the same NaN/Inf guarantee HalfSafe's loader gives
            assert not scan_weights(pipe).non_finite
        seconds = time.perf_counter() - begun
        del pipe
        return seconds

    def evict() -> None:
        """Drop this one file from the OS cache (no other file is touched)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    first_load, _ = ours()  # pays imports and the file's sha256 (cached afterwards)
    theirs(False)
    ours_runs, scan_in_load, theirs_runs, theirs_scan_runs, scans = [], [], [], [], []
    for _ in range(args.runs):
        seconds, scanned = ours()
        ours_runs.append(seconds)
        scan_in_load.append(scanned)
        theirs_runs.append(theirs(False))
        theirs_scan_runs.append(theirs(True))
        scans.append(scan_weights(str(path)))
    cold = {}
    if hasattr(os, "posix_fadvise"):
        evict()
        cold["halfsafe_load_model_s"] = round(ours()[0], 2)
        evict()
        cold["diffusers_from_single_file_plus_scan_s"] = round(theirs(True), 2)
        evict()
        cold_scan = scan_weights(str(path))
        cold["weight_scan_mb_per_s"] = round(cold_scan.mb_per_s)
    result = {
        "checkpoint": {
            "config": args.config,
            "dtype": args.dtype,
            "bytes": size,
            "build_seconds": round(build_seconds, 1),
        },
        "halfsafe_first_load_s": round(first_load, 2),
        "halfsafe_load_model_s": _summary(ours_runs),
        "halfsafe_scan_inside_load_s": round(statistics.median(scan_in_load), 2),
        "diffusers_from_single_file_s": _summary(theirs_runs),
        "diffusers_from_single_file_plus_scan_s": _summary(theirs_scan_runs),
        "cold_file_not_in_os_cache": cold,
        "weight_scan_mb_per_s": round(statistics.median(s.mb_per_s for s in scans)),
        "weight_scan_s": round(statistics.median(s.seconds for s in scans), 3),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(result, indent=2))
    if not args.keep:
        path.unlink()


def _summary(runs: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(runs), 2),
        "min": round(min(runs), 2),
        "max": round(max(runs), 2),
        "runs": len(runs),
    }


if __name__ == "__main__":
    main()
