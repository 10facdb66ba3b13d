"""Run by ComfyUI's Python (not HalfSafe's): loads a single-file checkpoint with ComfyUI's own
checkpoint loader and runs HalfSafe Check on it, printing its report and its work counted
(the diffusion model's calls by dtype, the layers copied) as one JSON object on the last line.

    python drive_work.py COMFYUI_FOLDER NODE_PACKAGE_FOLDER CHECKPOINT"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from drive import load_package, start_comfy  # noqa: E402

SIZE = 64


def main() -> None:
    comfy_folder, package_folder, checkpoint = (Path(a) for a in sys.argv[1:4])
    start_comfy(comfy_folder)
    import comfy.sd

    model = comfy.sd.load_checkpoint_guess_config(
        str(checkpoint), output_vae=False, output_clip=False
    )[0]
    nodes = load_package(package_folder).NODE_CLASS_MAPPINGS
    checking = importlib.import_module("comfyui_halfsafe.checking")
    outcome = checking.check(model, SIZE, SIZE, 4, 0)  # what HalfSafe Check runs
    text = nodes["HalfSafeCheck"]().check(model, SIZE, SIZE, 4, 0)["result"][0]
    found = {"verdict": outcome.verdict, "work": outcome.work.to_json(), "text": text}
    print(json.dumps(found))


if __name__ == "__main__":
    main()
