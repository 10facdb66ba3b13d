"""`halfsafe check` run as a user runs it, in HalfSafe's own Python, as a separate process with
HalfSafe's folders in a test's own home: for the tests that hold the ComfyUI nodes to the
desktop's verdicts, its store and its work on the same file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def environment(home: Path) -> dict[str, str]:
    """HalfSafe's folders in `home` (the store is one file there), one thread, the CPU's bf16
    class as the suite pins it."""
    return {
        **os.environ,
        "HALFSAFE_DATA_DIR": str(home / "data"),
        "HALFSAFE_CACHE_DIR": str(home / "cache"),
        "HALFSAFE_CONFIG_DIR": str(home / "config"),
        "OMP_NUM_THREADS": "1",
        "HALFSAFE_CPU_BF16": os.environ.get("HALFSAFE_CPU_BF16", "native"),
    }


def desktop_check(checkpoint: Path, home: Path, size: int = 64, quick: bool = True) -> dict:
    """`halfsafe check FILE --json` on the CPU in fp16, as ComfyUI computes on a GPU; `quick`
    stops at the proved fix (`--quick`), as the node's check does: the fix is the whole
    check's, remembered alike, without the table's other rows and the fix's timed cost."""
    done = subprocess.run(
        [sys.executable, "-m", "app", "check", str(checkpoint), "--json", "--size", str(size)]
        + ["--device", "cpu", "--precision", "fp16"]
        + (["--quick"] if quick else []),
        capture_output=True,
        text=True,
        timeout=540,
        env=environment(home),
        cwd=ROOT,
    )
    assert done.returncode in (0, 1), done.stderr[-4000:]
    try:  # exit 1 is a fixable verdict, and also Python's own exit on a traceback
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no report on stdout: {done.stderr[-4000:]}") from None
