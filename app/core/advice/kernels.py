"""Whether the self-test tried the int8 kernels other tools run on a GPU (comfy-kitchen's:
ComfyUI and Forge Neo compute int8 and int8 ConvRot files through them), and how to have them
tried where it did not, in one sentence: `halfsafe gpu`, `halfsafe advise` and the Devices page
say it alike.

comfy-kitchen is no dependency of HalfSafe (a 68 MB wheel, and the user's ComfyUI may carry
another version than the one HalfSafe is tested with), so a fresh install has none and the
self-test's low-bit section (`precision.lowbit`) does not run. Imports nothing: detection is
`importlib.util.find_spec`, as `precision.fused.installed` does it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from app.core.hardware.records import DeviceInfo

# The comfy-kitchen release the tests run against (pyproject's `kernels` and `dev` extras pin
# it; a test holds the two equal).
KITCHEN_TESTED = "0.2.40"
# The device kinds comfy-kitchen has GPU kernels for (its `cuda`, `triton` and `hip` backends).
KERNEL_KINDS = ("cuda", "rocm")


def install_command(python: str | None = None) -> str:
    """The command that installs the tested comfy-kitchen into HalfSafe's own Python (the one
    running now: the launcher's environment), quoted for a shell where its path has spaces."""
    path = Path(python or sys.executable)
    if path.name.lower() == "pythonw.exe":  # the Windows GUI's Python shows no pip output
        path = path.with_name("python.exe")
    shown = f'"{path}"' if " " in str(path) else str(path)
    return f'{shown} -m pip install "comfy-kitchen=={KITCHEN_TESTED}"'


def untried_words(device: DeviceInfo, installed: str | None = "?") -> str:
    """One sentence saying that the int8 kernels were not tried on `device` and how to have
    them tried; "" where they were (the self-test holds their calls) or where no tool runs such
    kernels on the device (a CPU, an Apple GPU). `installed`: comfy-kitchen's version here
    (None: not installed; "?": look)."""
    if device.kind not in KERNEL_KINDS:
        return ""
    test = device.self_test
    low_bit = test.low_bit if test is not None else None
    if low_bit is not None and low_bit.calls:
        return ""
    if installed == "?":
        from app.core.precision.fused import installed as kitchen_installed

        installed = kitchen_installed()
    retest = "then `halfsafe gpu --retest` (or Run the self-test again on the Devices page)"
    if installed is None:
        return (
            "The int8 kernels ComfyUI and Forge Neo run (comfy-kitchen's) were not tried on "
            "this GPU, since comfy-kitchen is not installed beside HalfSafe: to try them, run "
            f"`{install_command()}` (the version HalfSafe is tested with; your ComfyUI may "
            f"carry another), {retest}."
        )
    version = f"comfy-kitchen {installed}" if installed else "comfy-kitchen"
    tested = (
        "" if installed in ("", KITCHEN_TESTED) else f" (HalfSafe is tested with {KITCHEN_TESTED})"
    )
    return (
        f"The int8 kernels ComfyUI and Forge Neo run ({version}'s, installed here{tested}) "
        f"were not tried on this GPU yet: run `halfsafe gpu --retest` (or Run the self-test "
        "again on the Devices page) to try them."
    )
