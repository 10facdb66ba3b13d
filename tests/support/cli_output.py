"""What a test reads of the CLI's stderr: the lines past its progress."""

from __future__ import annotations


def without_progress(stderr: str) -> str:
    """`stderr` without the progress lines a command prints every few seconds once it has run
    a while ("halfsafe: Checking the VAE: 2 of 3, 7 s so far"): how many appear depends on the
    machine's speed and load, never on what the command did."""
    return "".join(line for line in stderr.splitlines(keepends=True) if " so far" not in line)
