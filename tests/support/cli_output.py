"""What a test reads of the CLI's stderr (the lines past its progress), and the command run in a
subprocess under a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def without_progress(stderr: str) -> str:
    """`stderr` without the progress lines a command prints every few seconds once it has run
    a while ("halfsafe: Checking the VAE: 2 of 3, 7 s so far"): how many appear depends on the
    machine's speed and load, never on what the command did."""
    return "".join(line for line in stderr.splitlines(keepends=True) if " so far" not in line)


def run_halfsafe(
    *argv: str, timeout: float = 120, memory_gib: int = 4
) -> subprocess.CompletedProcess[str]:
    """`halfsafe ARGV` in a subprocess of its own (the folders the test points HalfSafe at are
    inherited) with at most `memory_gib` of address space where the system can say so, killed
    after `timeout` seconds: a command that hangs (on a FIFO, in a regular expression) or
    reads gigabytes fails the test instead of stopping the suite or filling the machine."""

    def limited() -> None:
        import resource

        limit = memory_gib << 30
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "app", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limited if os.name == "posix" else None,
    )
