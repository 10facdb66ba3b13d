"""Loading transformer files as ComfyUI users keep them against the same model as a diffusers
folder, for the test suite's tiny Flux.1 dev, Chroma, SD3.5 Large- and Medium-shaped, Z-Image
and Qwen-Image pipelines (and SD3.5 Large as Stability AI's all-in-one file).

Each pipeline is written twice into a temporary folder: its split files (`save_split_files`:
the transformer in its layout (Black Forest Labs', Stability AI's, Z-Image's, Qwen-Image's),
text encoders and VAE beside it) and a diffusers folder (`save_pretrained`). Then, alternating run by run with the files in
the OS cache, it times HalfSafe's `load_model` on each: for the split files that is finding the
companions by their headers, reading the config from the shapes, mapping every key through the
layout's table and the NaN/Inf scan; for the folder, diffusers' `from_pretrained` and the same
scan. The tiny models make per-file and per-module overheads the whole cost: the figures say
what the layout mapping adds, not what a 12 GB file costs to read.

Usage: python benchmarks/split_load.py
       [--models flux-dev,chroma,sd3.5-large,sd3.5-medium,sd3.5-single,zimage,qwenimage]
       [--runs 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from common import emit, machine, names, spread, status

MODELS = (
    "flux-dev",
    "chroma",
    "sd3.5-large",
    "sd3.5-medium",
    "sd3.5-single",
    "zimage",
    "qwenimage",
)


def _pipeline(model: str):
    from tests.support.tiny_models import (
        build_tiny_chroma_pipeline,
        build_tiny_flux_pipeline,
        build_tiny_qwenimage_pipeline,
        build_tiny_sd3_pipeline,
        build_tiny_zimage_pipeline,
    )

    if model == "flux-dev":
        return build_tiny_flux_pipeline()
    if model == "chroma":
        return build_tiny_chroma_pipeline()
    if model == "zimage":
        return build_tiny_zimage_pipeline()
    if model == "qwenimage":  # Qwen2.5-VL's heads are 128 wide: the file does not record them
        return build_tiny_qwenimage_pipeline(text_width=128)
    return build_tiny_sd3_pipeline(medium=model == "sd3.5-medium")


def bench(model: str, runs: int, root: Path) -> dict:
    from app.core import models
    from tests.support.model_files import save_split_files

    pipeline = _pipeline(model)
    written = save_split_files(
        pipeline, root / model / "models", model, single_file=model == "sd3.5-single"
    )
    folder = root / model / "folder"
    pipeline.save_pretrained(folder)
    sources = {"files": str(written["transformer"]), "folder": str(folder)}
    for source in sources.values():  # warm the OS cache and every cache HalfSafe keeps
        models.load_model(source)
    times: dict[str, list[float]] = {"files": [], "folder": []}
    for _ in range(runs):
        for kind, source in sources.items():
            begun = time.perf_counter()
            models.load_model(source)
            times[kind].append(time.perf_counter() - begun)
    files, folder_times = spread(times["files"]), spread(times["folder"])
    return {
        "model": model,
        "files": files,
        "folder": folder_times,
        "files_over_folder": round(
            statistics.median(times["files"]) / statistics.median(times["folder"]), 3
        ),
        "bytes": sum(p.stat().st_size for p in written.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="halfsafe-split-") as temporary:
        for model in names(args.models, MODELS):
            with status(f"Loading tiny {model}"):
                rows.append(bench(model, args.runs, Path(temporary)))
    table = "\n".join(
        f"| tiny {r['model']} | {r['bytes'] / 1e6:.1f} MB | {r['files']['median']:.3f} s "
        f"({r['files']['min']:.3f}-{r['files']['max']:.3f}) | {r['folder']['median']:.3f} s "
        f"({r['folder']['min']:.3f}-{r['folder']['max']:.3f}) | {r['files_over_folder']:.2f} |"
        for r in rows
    )
    emit({"machine": machine("cpu"), "split_load": rows}, table, args.json)


if __name__ == "__main__":
    main()
