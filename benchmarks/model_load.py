"""Model loading: HalfSafe's loader vs plain diffusers on the same files, a full-size single
file and the same model as a diffusers folder.

Builds a random-weight pipeline (SD1.5 by default; `--config sdxl`) in the stored dtype and writes
it twice into a temporary folder: one `.safetensors` in the original (LDM / A1111) layout and a
diffusers folder (`save_pretrained`). Then, alternating run by run, it times per layout:
  - HalfSafe's `load_model` (header checks, NaN/Inf scan of every tensor, assembly);
  - diffusers: `from_single_file(path, config=<the shipped config folder>, local_files_only=True,
    torch_dtype=...)` for the file, `from_pretrained(folder, local_files_only=True,
    torch_dtype=...)` for the folder;
  - the same diffusers call followed by `scan_weights(pipeline)`, so both end with the same
    guarantee (diffusers maps files lazily and checks no value);
plus the standalone weight scan in MB/s, alone and with the content digest that identifies the
model for remembered fixes (`scan_weights(path, identify=True)`, sha256 of every tensor; a
load computes it once per file, then takes it from the cache). The files are read once before timing, so every run
finds them in the OS cache ("warm"); then each loader runs a few more times, alternating, each
time after the files were dropped from the OS cache ("cold": read from disk). HalfSafe's first
load of the single file also computes its sha256 (the A1111 hash) and the content digest, both
cached afterwards; it is reported on its own. `--identity-rounds N` times first loads of the
single file against loads with the hash, the digest or both already cached.

Usage: python benchmarks/model_load.py [--config sd1|sdxl] [--dtype fp16|fp32] [--runs 3]
       [--cold-runs 3] [--layouts single,folder] [--identity-rounds 0] [--keep DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import emit, machine, names, spread, status

LAYOUTS = ("single", "folder")


def _evict(path: Path) -> None:
    """Drop these files from the OS cache (nothing else is touched)."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _read_all(path: Path) -> int:
    """Read every file once (into the OS cache); returns the bytes read."""
    total = 0
    for file in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
        with open(file, "rb") as handle:
            while chunk := handle.read(64 << 20):
                total += len(chunk)
    return total


def _hash_speeds(path: Path, size: int = 384 << 20) -> dict[str, int]:
    """MB/s of the hashes Python ships that could key a model, over the file's first bytes
    (in memory, one thread, best of 3): what the content digest's choice of sha256 rests on."""
    import hashlib

    with open(path, "rb") as handle:
        data = memoryview(handle.read(size))
    speeds = {}
    for name in ("sha256", "blake2b", "sha512", "sha1", "md5"):
        best = float("inf")
        for _ in range(3):
            begun = time.perf_counter()
            hashlib.new(name, data)
            best = min(best, time.perf_counter() - begun)
        speeds[name] = round(len(data) / 1e6 / best)
    return speeds


def _first_loads(path: Path, rounds: int, load_model) -> dict[str, dict]:
    """`load_model` of the single file with each of its cached values present or not: what the
    A1111 hash and the content digest each cost on a file's first load (alternating, median).

    Each load gets a new cache folder; where a value counts as cached, an untimed load fills
    the folder first and the other value is then dropped from it.
    """
    import json

    from app.core import paths

    base = os.environ["HALFSAFE_CACHE_DIR"]
    cases = {
        "first_load": (),
        "hash_cached": ("sha256",),
        "digest_cached": ("content",),
        "repeat_load": ("sha256", "content"),
    }
    runs: dict[str, list[float]] = {case: [] for case in cases}
    for _ in range(rounds):
        for case, kept in cases.items():
            os.environ["HALFSAFE_CACHE_DIR"] = tempfile.mkdtemp(dir=base)
            if kept:
                load_model(str(path))
                cache_file = paths.cache_dir() / "model_hashes.json"
                entries = json.loads(cache_file.read_text(encoding="utf-8"))
                kept_entries = {k: e for k, e in entries.items() if any(v in e for v in kept)}
                cache_file.write_text(json.dumps(kept_entries), encoding="utf-8")
            begun = time.perf_counter()
            load_model(str(path))
            runs[case].append(time.perf_counter() - begun)
    os.environ["HALFSAFE_CACHE_DIR"] = base
    return {case: spread(seconds, 2) for case, seconds in runs.items()}


def measure(args) -> dict:
    import diffusers
    import torch

    diffusers.utils.logging.disable_progress_bar()
    from app.core.checkpoint import scan_weights
    from app.core.models import config_folder, load_model
    from tests.support.model_files import build_random_pipeline, save_single_file

    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="halfsafe-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    paths = {
        "single": folder / f"random-{args.config}-{args.dtype}.safetensors",
        "folder": folder / f"random-{args.config}-{args.dtype}",
    }
    begun = time.perf_counter()
    if not all(paths[layout].exists() for layout in args.layouts):
        with status(f"building and writing a random-weight {args.config} model ({args.dtype})"):
            pipeline = build_random_pipeline(args.config, dtype=args.dtype, seed=0)
            if "single" in args.layouts and not paths["single"].exists():
                save_single_file(pipeline, paths["single"])
            if "folder" in args.layouts and not paths["folder"].exists():
                pipeline.save_pretrained(paths["folder"], safe_serialization=True)
            del pipeline
    build_seconds = time.perf_counter() - begun

    pipeline_class = (
        diffusers.StableDiffusionXLPipeline
        if args.config == "sdxl"
        else diffusers.StableDiffusionPipeline
    )
    config = str(config_folder(args.config))
    dtype = torch.float16 if args.dtype == "fp16" else torch.float32

    def ours(layout: str) -> float:
        begun = time.perf_counter()
        model = load_model(str(paths[layout]))
        seconds = time.perf_counter() - begun
        assert not model.weights.non_finite
        return seconds

    def theirs(layout: str, scan: bool) -> float:
        begun = time.perf_counter()
        if layout == "single":
            pipe = pipeline_class.from_single_file(
                str(paths[layout]), config=config, local_files_only=True, torch_dtype=dtype
            )
        else:
            pipe = pipeline_class.from_pretrained(
                str(paths[layout]), local_files_only=True, torch_dtype=dtype
            )
        if scan:
            assert not scan_weights(pipe).non_finite
        seconds = time.perf_counter() - begun
        del pipe
        return seconds

    results = []
    for layout in args.layouts:
        path = paths[layout]
        size = _read_all(path)  # warm the OS cache, so both loaders read from memory
        with status(f"loading the {layout} layout, {args.runs} runs per loader"):
            first = ours(layout)  # imports, and for a single file its sha256 (then cached)
            theirs(layout, False)
            runs: dict[str, list[float]] = {"ours": [], "theirs": [], "theirs_scan": []}
            scans = []
            identified = []
            for _ in range(args.runs):
                runs["ours"].append(ours(layout))
                runs["theirs"].append(theirs(layout, False))
                runs["theirs_scan"].append(theirs(layout, True))
                if layout == "single":
                    scans.append(scan_weights(str(path)))
                    identified.append(scan_weights(str(path), identify=True))
            cold = {}
            if hasattr(os, "posix_fadvise"):
                cold_runs: dict[str, list[float]] = {"ours": [], "theirs_scan": []}
                for _ in range(args.cold_runs):  # alternating: the disk's speed drifts
                    _evict(path)
                    cold_runs["ours"].append(ours(layout))
                    _evict(path)
                    cold_runs["theirs_scan"].append(theirs(layout, True))
                cold = {
                    "ours_s": round(statistics.median(cold_runs["ours"]), 2),
                    "theirs_scan_s": round(statistics.median(cold_runs["theirs_scan"]), 2),
                    "runs": args.cold_runs,
                }
        ratios = [o / t for o, t in zip(runs["ours"], runs["theirs_scan"], strict=True)]
        results.append(
            {
                "layout": layout,
                "bytes": size,
                "first_load_s": round(first, 2),
                "ours_s": spread(runs["ours"], 3),
                "diffusers_s": spread(runs["theirs"], 3),
                "diffusers_plus_scan_s": spread(runs["theirs_scan"], 3),
                "ours_vs_diffusers_plus_scan": round(statistics.median(ratios), 3),
                "cold": cold,
                "weight_scan_mb_per_s": round(statistics.median(s.mb_per_s for s in scans))
                if scans
                else None,
                "weight_scan_identify_mb_per_s": round(
                    statistics.median(s.mb_per_s for s in identified)
                )
                if identified
                else None,
                "hash_mb_per_s": _hash_speeds(path) if layout == "single" else None,
                "first_loads_s": _first_loads(path, args.identity_rounds, load_model)
                if layout == "single" and args.identity_rounds
                else None,
            }
        )
    if not args.keep:
        shutil.rmtree(folder)
    return {
        "benchmark": "model_load",
        "machine": machine("cpu"),
        "model": {"config": args.config, "dtype": args.dtype, "build_s": round(build_seconds, 1)},
        "results": results,
        "date": time.strftime("%Y-%m-%d"),
    }


def table(document: dict) -> str:
    model = document["model"]
    head = (
        f"{model['config']} {model['dtype']:<10}{'HalfSafe s':>12}{'diffusers s':>13}"
        f"{'+ scan s':>10}{'ratio':>8}{'cold: ours':>12}{'theirs+scan':>13}"
    )
    lines = [head, "-" * len(head)]
    scans = []
    for r in document["results"]:
        cold = r["cold"]
        label = f"{r['layout']} {r['bytes'] / 1e9:.2f} GB"
        lines.append(
            f"{label:<15}{r['ours_s']['median']:>12.2f}"
            f"{r['diffusers_s']['median']:>13.2f}{r['diffusers_plus_scan_s']['median']:>10.2f}"
            f"{r['ours_vs_diffusers_plus_scan']:>7.2f}x"
            f"{cold.get('ours_s', float('nan')):>12.2f}{cold.get('theirs_scan_s', float('nan')):>13.2f}"
        )
        if r.get("weight_scan_mb_per_s"):
            scans.append(
                f"weight scan ({r['layout']}, warm): {r['weight_scan_mb_per_s']} MB/s; with the "
                f"content digest: {r['weight_scan_identify_mb_per_s']} MB/s; "
                f"first load {r['first_load_s']:.2f} s"
            )
        for case, seconds in (r.get("first_loads_s") or {}).items():
            scans.append(f"{case.replace('_', ' ')}: {seconds['median']:.2f} s")
        if r.get("hash_mb_per_s"):
            scans.append(
                "hashes in memory, MB/s: "
                + ", ".join(f"{k} {v}" for k, v in r["hash_mb_per_s"].items())
            )
    return "\n".join(lines + scans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="sd1", choices=("sd1", "sdxl"))
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "fp32"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument("--layouts", help="comma-separated: single, folder (default both)")
    parser.add_argument(
        "--identity-rounds",
        type=int,
        default=0,
        help="rounds of first loads with and without the cached hash and content digest",
    )
    parser.add_argument("--keep", help="folder to write the model to (kept afterwards)")
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args()
    args.layouts = names(args.layouts, LAYOUTS)
    unknown = set(args.layouts) - set(LAYOUTS)
    if unknown:
        sys.exit(f"Unknown layout {sorted(unknown)[0]!r}: choose from single, folder.")
    # A fresh cache folder, so the first load really computes the file hash.
    with tempfile.TemporaryDirectory(prefix="halfsafe-bench-cache-") as cache:
        os.environ["HALFSAFE_CACHE_DIR"] = cache
        document = measure(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
