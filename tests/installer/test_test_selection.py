"""Which tests run: a developer's plain `pytest` leaves the slow ones out, the CI command
(`installer/run-tests.sh`, which `.ci/run` ends in) runs every test."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Light to collect (no torch at import), and each holds slow tests.
FILES = (
    "tests/benchmarks/test_suite.py",
    "tests/installer/test_launcher_end_to_end.py",
    "tests/ui/test_end_to_end.py",
)


def collected(*options: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + [*options, *FILES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


def ci_marker_expression() -> str:
    script = (ROOT / "installer" / "run-tests.sh").read_text(encoding="utf-8")
    found = re.search(r'-m pytest -m "([^"]+)" [^\n]*"\$@"', script)
    assert found, "run-tests.sh no longer chooses which tests run"
    return found.group(1)


def test_plain_run_leaves_slow_tests_out_and_ci_runs_every_test():
    everything = collected("-m", "")  # an empty expression selects every test
    plain = collected()
    ci = collected("-m", ci_marker_expression())

    assert ci == everything
    left_out = everything - plain
    assert (
        "tests/benchmarks/test_suite.py::test_smoke_profile_prints_a_summary_and_writes_json"
        in (left_out)
    )
    assert {t for t in everything if "end_to_end" in t} <= left_out
    assert "tests/benchmarks/test_suite.py::test_unknown_section_is_one_sentence" in plain
