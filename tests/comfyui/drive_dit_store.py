"""Run by ComfyUI's Python (not HalfSafe's): loads a transformer file with ComfyUI's own
diffusion-model loader (the UNETLoader's path), then runs HalfSafe Fix with no fix connected
(`fix`: the fixed and the unfixed call measured against an fp32 reference of the same call) or
HalfSafe Check (`check`) on it, and prints what the node did as one JSON object on the last
line.

    python drive_dit_store.py COMFYUI_FOLDER NODE_PACKAGE_FOLDER TRANSFORMER_FILE fix|check

The store the nodes read and write is HalfSafe's (`HALFSAFE_DATA_DIR`), which the desktop's
`halfsafe check` of the same file, with its companions beside it, reads and writes in the test
that runs this."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import drive  # beside this file: ComfyUI's start on a CPU, the package loader

SIZE = 64


def main() -> None:
    comfy_folder, package_folder, transformer = (Path(a) for a in sys.argv[1:4])
    action = sys.argv[4]
    drive.start_comfy(comfy_folder)  # sets ComfyUI's own arguments in sys.argv
    import comfy.sd

    model = comfy.sd.load_diffusion_model(str(transformer))
    nodes = drive.load_package(package_folder).NODE_CLASS_MAPPINGS
    host = sys.modules["comfyui_halfsafe.host"]
    found: dict = {"precision": host.precision(model)}
    if action == "check":
        text, _, fix = nodes["HalfSafeCheck"]().check(model, SIZE, SIZE, 4, 0)["result"]
        found["check"] = {"text": text, "fix": fix}
    else:
        from app.core.fixing.module_check import reference_call
        from app.core.fixing.quality import compare

        patched, said = nodes["HalfSafeFix"]().fix(model, None)[:2]
        call = host.one_call(model.clone(), SIZE, SIZE, 4, 0)
        reference = reference_call(host.diffusion_model(model), call.args, call.kwargs).output
        fixed, original = host.run_call(patched, call), host.run_call(model, call)
        cast = patched.object_patches.get("manual_cast_dtype")
        found["fix"] = {
            "said": said,
            "islands": sorted(k for k in patched.object_patches if k != "manual_cast_dtype"),
            "compute": None if cast is None else str(cast).removeprefix("torch."),
            "fixed_finite": drive.finite(fixed),
            "fixed_db": compare(fixed, reference).value,
            "original_finite": drive.finite(original),
            "original_db": compare(original, reference).value,
            "original_patches": len(model.object_patches),
        }
    print(json.dumps(found))


if __name__ == "__main__":
    main()
