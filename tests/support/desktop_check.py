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


# The CPU's dtype table the checks in these processes predict their candidates' steps from: one
# machine's (this project's 2-core Xeon with AVX-512 FP16 and AMX bf16, torch 2.13.0, measured
# 2026-11-28), fixed, so that a desktop check ranks and prunes its candidates alike on every
# machine and under any load, as the suite's own checks do with theirs (tests/conftest.py).
CPU_TABLE = {
    "fp16": {"matmul": 43.1, "matmul_weights": 0.414, "conv": 8.92, "conv_weights": 0.172},
    "bf16": {
        "matmul": 712.0,
        "matmul_weights": 0.252,
        "conv": 9.44,
        "conv_weights": 0.194,
        "cast": 0.137,
    },
    "fp32": {
        "matmul": 33.2,
        "matmul_weights": 0.209,
        "conv": 9.73,
        "conv_weights": 0.084,
        "cast": 0.128,
    },
}


def fixed_cpu_table(home: Path) -> Path:
    """`CPU_TABLE` cached in `home`'s cache folder under this machine's CPU key, where a check
    run with that folder reads it instead of measuring one (`selftest_cache.dtype_speed`)."""
    import torch

    from app.core import hardware
    from app.core.hardware import dtype_speed
    from app.core.hardware.selftest_cache import self_test_key

    key = self_test_key(hardware.describe_device(torch.device("cpu")))
    path = home / "cache" / "selftest" / dtype_speed.cache_path(key).name
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"key": key, "gflops": CPU_TABLE, "seconds_measuring": 0.0}
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def environment(home: Path) -> dict[str, str]:
    """HalfSafe's folders in `home` (the store is one file there) with the fixed CPU table in
    its cache (`fixed_cpu_table`), one thread, the CPU's bf16 class as the suite pins it."""
    fixed_cpu_table(home)
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


def assert_same_layer_and_fix(report: dict, node_check: dict, node_layer: str, names) -> None:
    """The desktop's `report` and the check node's result (`node_check`: its text and fix) on
    one planted transformer file: both say the diffusion model alone is fixable; the desktop's
    first bad layer, mapped into the file's layout by `names` (the layout's
    `app.core.formats.layer_names.LayerNames`), is `node_layer`; and what the desktop keeps
    wider or clamps lies inside the node's one island, which maps back over all of it."""
    assert report["verdict"] == "fixable" and report["fix"]["verified"]
    assert [n for n, c in report["components"].items() if c.get("first_bad_module")] == [
        "transformer"
    ]
    text, fix = node_check["text"], node_check["fix"]
    assert "Checked: diffusion model fixable." in text and fix["component"] is None
    desktop_layer = report["components"]["transformer"]["first_bad_module"]
    mapped = names.to_original(desktop_layer)
    assert mapped is not None and mapped.paths == (node_layer,), (desktop_layer, node_layer)
    (island,) = fix["islands"]
    settings = report["fix"]["settings"]
    kept = [
        e.removeprefix("transformer:")
        for key in ("fp32_modules", "bf16_modules", "clamp_modules")
        for e in settings.get(key, [])
    ]
    assert kept, settings
    for path in kept:
        there = names.to_original(path)
        assert there is not None
        assert all(p == island or p.startswith(island + ".") for p in there.paths), (path, island)
    back = names.to_diffusers(island)
    assert back is not None
    assert all(any(p == b or p.startswith(b + ".") for b in back.paths) for p in kept), back
