"""Run by ComfyUI's Python (not HalfSafe's): ComfyUI's real server, its own main.py, with the
import-only stand-ins (see stand_ins.py), computing the diffusion model in fp16 on the CPU as it
does on a GPU, and an SD1 and an SDXL UNet (drive.py) with a planted fp16 overflow in the base
directory's models, beside the files the test put there.

    python serve.py COMFYUI_FOLDER BASE_DIRECTORY PORT [COMFYUI_OPTION ...]

COMFYUI_OPTION: ComfyUI's own options, passed on (`--fp16-unet`: every diffusion model in fp16,
as a user on a card without bf16 runs the families whose supported dtypes leave fp16 out).

Everything ComfyUI writes (its user folder, outputs, temp files) goes under BASE_DIRECTORY, its
database is in memory, and it listens on 127.0.0.1 only: the ComfyUI folder is not changed."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

UNET = "tiny_sd1_unet.safetensors"
SDXL = "sdxl_planted.safetensors"


def main() -> None:
    folder, base, port = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    options = sys.argv[4:]
    import stand_ins

    stand_ins.install()
    sys.path.insert(0, str(folder))
    front_end = base / "front_end"  # its web page is not needed: an empty folder stands in
    front_end.mkdir(parents=True, exist_ok=True)
    sys.argv = [str(folder / "main.py"), "--cpu", "--listen", "127.0.0.1", "--port", port]
    sys.argv += ["--disable-auto-launch", "--base-directory", str(base)]
    sys.argv += ["--front-end-root", str(front_end), "--database-url", "sqlite:///:memory:"]
    sys.argv += options
    import comfy.options

    comfy.options.enable_args_parsing()
    import comfy.cli_args  # noqa: F401
    import comfy.model_management as mm

    mm.should_use_fp16 = lambda *args, **kwargs: True  # compute in fp16 as on a GPU
    import drive

    unet = base / "models" / "diffusion_models" / UNET
    unet.parent.mkdir(parents=True, exist_ok=True)
    drive.write_tiny_unet(unet)
    drive.write_tiny_unet(unet.with_name(SDXL), drive.TINY_SDXL, drive.PLANTED_SDXL)
    runpy.run_path(str(folder / "main.py"), run_name="__main__")


if __name__ == "__main__":
    main()
