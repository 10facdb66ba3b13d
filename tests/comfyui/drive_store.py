"""Run by ComfyUI's Python (not HalfSafe's): loads a single-file checkpoint with ComfyUI's own
checkpoint loader, then runs HalfSafe Fix with no fix connected (`fix`) or HalfSafe Check
(`check`) on it, and prints what the node did as one JSON object on the last line.

    python drive_store.py COMFYUI_FOLDER NODE_PACKAGE_FOLDER CHECKPOINT fix|check[+clip]

With `+clip` the checkpoint's CLIP is loaded too (a checkpoint whose text encoder has
ComfyUI's full-size config) and connected to the node.

The store the nodes read and write is HalfSafe's (`HALFSAFE_DATA_DIR`), which the desktop's
`halfsafe check` of the same file reads and writes in the test that runs this."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from drive import finite, load_package, start_comfy  # noqa: E402

SIZE = 64


def main() -> None:
    comfy_folder, package_folder, checkpoint = (Path(a) for a in sys.argv[1:4])
    action, _, plus = sys.argv[4].partition("+")
    start_comfy(comfy_folder)
    import comfy.sd

    # ComfyUI's own checkpoint loader (CheckpointLoaderSimple's), the denoiser alone unless
    # asked: its text encoders have fixed full-size configs that a tiny file's do not match.
    model, clip = comfy.sd.load_checkpoint_guess_config(
        str(checkpoint), output_vae=False, output_clip=plus == "clip"
    )[:2]
    nodes = load_package(package_folder).NODE_CLASS_MAPPINGS
    host = sys.modules["comfyui_halfsafe.host"]
    found: dict = {"precision": host.precision(model)}
    if action == "check":
        text, _, fix = nodes["HalfSafeCheck"]().check(model, SIZE, SIZE, 4, 0, clip)["result"]
        found["check"] = {"text": text, "fix": fix}
    else:
        patched, said, _, fixed_clip = nodes["HalfSafeFix"]().fix(model, None, None, clip)
        cast = patched.object_patches.get("manual_cast_dtype")
        # Through ComfyUI's apply_model, which casts the input to the compute dtype a
        # whole-component fix sets, as its sampler calls the model.
        host.load(patched)
        fixed = host.one_call(patched, SIZE, SIZE, 4, 0).output
        host.load(model)
        original = host.one_call(model, SIZE, SIZE, 4, 0).output
        found["fix"] = {
            "said": said,
            "islands": sorted(k for k in patched.object_patches if k != "manual_cast_dtype"),
            "compute": None if cast is None else str(cast).removeprefix("torch."),
            "fixed_finite": finite(fixed),
            "original_finite": finite(original),
            "original_patches": len(model.object_patches),
        }
        if clip is not None:
            added = set(fixed_clip.patcher.object_patches) - set(clip.patcher.object_patches)
            found["fix"]["clip_patches_added"] = sorted(added)
            found["fix"]["clip_passed_on"] = fixed_clip is not clip
    print(json.dumps(found))


if __name__ == "__main__":
    main()
