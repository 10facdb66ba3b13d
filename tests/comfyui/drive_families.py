"""Run by ComfyUI's Python (not HalfSafe's): drives the real ComfyUI in process on a CPU with two
transformer files of one family that ComfyUI loads only at (some of) its released widths (one
planted, one healthy, written by the test), loaded by ComfyUI's own loader, and prints what the
nodes did as one JSON object on the last line, with what ComfyUI's loader said of the file's
keys and how long each part took.

    python drive_families.py COMFYUI_FOLDER NODE_PACKAGE_FOLDER PLANTED HEALTHY [--fp16-unet]

`--fp16-unet` is ComfyUI's own option, for the families whose supported dtypes leave fp16 out
(Qwen-Image): a user runs them in fp16 with it. No CLIP is connected."""

from __future__ import annotations

import json
import logging
import resource
import sys
import time
from pathlib import Path

import drive  # beside this file: ComfyUI's start on a CPU, the package loader
import drive_dit  # the planted model's check and fix, measured against fp32

SIZE = drive_dit.SIZE


class KeyWords(logging.Handler):
    """What ComfyUI's loader logs of keys it found missing or left unused."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "missing" in text or "unexpected" in text or "left over" in text:
            self.said.append(text[:300])


def main() -> None:
    comfy_folder, package_folder, planted, healthy = (Path(a) for a in sys.argv[1:5])
    fp16_unet = "--fp16-unet" in sys.argv
    drive.start_comfy(comfy_folder)  # sets ComfyUI's own arguments in sys.argv
    import comfy.cli_args
    import comfy.sd

    comfy.cli_args.args.fp16_unet = fp16_unet
    keys = KeyWords()
    logging.getLogger().addHandler(keys)
    logging.getLogger().setLevel(logging.INFO)  # ComfyUI logs keys left over at INFO
    package = drive.load_package(package_folder)
    nodes = package.NODE_CLASS_MAPPINGS
    host = sys.modules["comfyui_halfsafe.host"]

    seconds: dict[str, float] = {}
    start = time.perf_counter()
    model = comfy.sd.load_diffusion_model(str(planted))
    seconds["load"] = time.perf_counter() - start
    found = {
        "model": type(model.model).__name__,
        "config": type(model.model.model_config).__name__,
        **drive_dit.planted_model(nodes, host, model),
    }
    seconds["check_and_fix"] = time.perf_counter() - start - seconds["load"]
    del model
    start = time.perf_counter()
    sound = comfy.sd.load_diffusion_model(str(healthy))
    text, _, fix = nodes["HalfSafeCheck"]().check(sound, SIZE, SIZE, 4, 0)["result"]
    seconds["healthy"] = time.perf_counter() - start
    found["healthy"] = {"text": text, "fix": fix, "model": type(sound.model).__name__}
    found["keys_said"] = keys.said
    found["seconds"] = {k: round(v, 1) for k, v in seconds.items()}
    found["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(json.dumps(found))


if __name__ == "__main__":
    main()
