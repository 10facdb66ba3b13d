"""Golden check reports: what a check of a planted model answered when its record was written,
held against what it answers now.

A record is the check's own JSON (`HealthReport.to_json`, the `check --json` contract) less what
depends on the machine or the moment: times, memory, work counts, versions, the device's name.
What is left is every answer: the verdict, each component's status, first bad layer, magnitudes,
blocks and precisions, the fix (its settings, layers, quality, words, cost under the injected
oracle) and the whole table of candidates, the notes and the headline.

Records live in `tests/golden/<case>.json`, one file per case, keyed by the CPU's bf16 class
(`HALFSAFE_CPU_BF16`: the fix kept in bf16 or in fp32 differs; "emulated" keeps only what
differs from "native"'s record, as a `delta`) and the precision checked, and
`tests/golden/machine.json` names the machine that wrote them. They are written only on
request, native first:

    HALFSAFE_WRITE_GOLDEN=1 .venv/bin/python -m pytest -m "slow or not slow" -n 2 \
        tests/core/test_golden_reports.py tests/core/test_families.py -k "golden or planted"
    HALFSAFE_WRITE_GOLDEN=1 HALFSAFE_CPU_BF16=emulated .venv/bin/python -m pytest ... (the same)

(the family rows' planted layers in fp16 are test_families.py's first check: its planted test
holds them to their records, and writes them).

and a change in them is a change in what HalfSafe tells its users, to be read in the diff.

Everything that is not a measured figure is compared exactly: verdicts, statuses, layers,
settings, whether each candidate was finite, verified and chosen, counts, and every sentence
with its figures taken out. On the machine that wrote the records the measured figures
(magnitudes, qualities, and the ones a sentence prints) are compared bit for bit too. On another
machine they are compared within `ANOTHER_MACHINE` of each other: its kernels round differently
(the same corpus with torch's kernels held to AVX2 moved magnitudes by up to 5.4% and qualities
by up to 1.9 dB, and changed no other answer).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
from pathlib import Path
from typing import Any

# Family rows (tests/support/family_rows.py) with no records: SD's row is the `sd1-` corpus's
# model with the same plants; Anima 2.9B is Anima's with 40 blocks.
ROWS_WITHOUT_RECORDS = frozenset({"sd", "anima-2.9b"})

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"
WRITE_ENV = "HALFSAFE_WRITE_GOLDEN"
NATIVE = "native"
ABSENT = "<absent>"  # in a delta: the key is not in this class's record

# Measured figures may differ by this much, relative, on another machine than the records'.
ANOTHER_MACHINE = 0.12
MACHINE_FILE = "machine.json"

# Keys whose values depend on the machine or the moment, at any depth of the record.
VOLATILE = {"seconds", "halfsafe", "versions", "device", "memory", "work", "remembered"}
# A figure inside a sentence: 402,000x, 35.9 dB, 2.68e+05, 31 (commas separate thousands), not
# a part of a name (fp16, blocks.0.attn1). Measured: a ratio, a quality, one with decimals or an
# exponent; a bare whole number is a count.
FIGURE = re.compile(r"(?<![\w.])(-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?)(x\b| dB)?")


def record(report) -> dict[str, Any]:
    """The answers of `report` as a JSON document, without what depends on the machine."""
    return _strip(report.to_json())


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def cpu_bf16_class() -> str:
    """The bf16 class the check runs under: the one pinned as HalfSafe reads it, else native."""
    from app.core.hardware.probe import CPU_BF16_ENV

    return os.environ.get(CPU_BF16_ENV, "").strip().lower() or NATIVE


def path_of(case: str) -> Path:
    return GOLDEN_DIR / f"{case}.json"


def check_against_golden(report, case: str, precision: str) -> None:
    """Fail, listing the differences, unless `report` answers as the record of `case` at
    `precision` does (with `HALFSAFE_WRITE_GOLDEN=1`, write that record instead)."""
    bf16 = cpu_bf16_class()
    now = record(report)
    if os.environ.get(WRITE_ENV) == "1":
        _write(case, bf16, precision, now)
        return
    path = path_of(case)
    assert path.is_file(), f"{path.name}: no golden record (write it with {WRITE_ENV}=1)"
    recorded = recorded_for(json.loads(path.read_text(encoding="utf-8")), bf16, precision)
    assert recorded is not None, f"{path.name} has no record for {precision}"
    found = differences(recorded, now, relative=tolerance())
    assert not found, f"{path.name} ({bf16} bf16, {precision}):\n" + "\n".join(found[:20])


def recorded_for(records: dict[str, Any], bf16: str, precision: str) -> dict[str, Any] | None:
    """The record for the bf16 class and precision. Another class than native keeps only what
    differs from native's record (`delta`): a CPU's bf16 class changes the fixes, rarely more."""
    native = records.get(NATIVE, {}).get(precision)
    if bf16 == NATIVE or native is None:
        return native
    return patched(native, records.get(bf16, {}).get(precision, {}))


def delta(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """What turns `base` into `new`: keys whose values differ (a dict by its own delta, anything
    else whole), and `ABSENT` for a key `new` lacks."""
    out: dict[str, Any] = {k: ABSENT for k in base if k not in new}
    for key, value in new.items():
        if key not in base:
            out[key] = value
        elif base[key] != value:
            both = isinstance(value, dict) and isinstance(base[key], dict)
            out[key] = delta(base[key], value) if both else value
    return out


def patched(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """`base` with `change` (a `delta`) applied; `base` is left as it was."""
    out = dict(base)
    for key, value in change.items():
        if value == ABSENT:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = patched(out[key], value)
        else:
            out[key] = value
    return out


def _write(case: str, bf16: str, precision: str, document: dict[str, Any]) -> None:
    """Merge one record into the case's file, under a lock (a precision per test); another
    class than native's is written as its `delta` from native's record, written first."""
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    (GOLDEN_DIR / MACHINE_FILE).write_text(dumps(machine()) + "\n", encoding="utf-8")
    path = path_of(case)
    with path.open("a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        text = handle.read()
        records = json.loads(text) if text.strip() else {}
        if bf16 == NATIVE:
            records.setdefault(NATIVE, {})[precision] = document
        else:
            native = records.get(NATIVE, {}).get(precision)
            assert native is not None, f"{path.name}: write the native records first"
            records.setdefault(bf16, {})[precision] = delta(native, document)
        records = {k: dict(sorted(v.items())) for k, v in sorted(records.items())}
        handle.seek(0)
        handle.truncate()
        handle.write(dumps(records) + "\n")


def dumps(value: Any, depth: int = 0) -> str:
    """JSON with a line per key down to the objects that hold only plain values, which take one
    line each (a block's peak, a candidate's cost): short files whose diffs read by the item."""
    if (
        not isinstance(value, (dict, list))
        or not value
        or not any(
            isinstance(v, (dict, list))
            for v in (value.values() if isinstance(value, dict) else value)
        )
    ):
        return json.dumps(value)
    pad, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {dumps(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    items = [f"{inner}{dumps(v, depth + 1)}" for v in value]
    return "[\n" + ",\n".join(items) + f"\n{pad}]"


def differences(expected: Any, actual: Any, where: str = "", relative: float = 0.0) -> list[str]:
    """Every place where `actual` does not answer as `expected`, as `path: expected != actual`;
    measured figures within `relative` of each other."""
    here = where or "."
    if isinstance(expected, dict) and isinstance(actual, dict):
        found = []
        for key in [*expected, *(k for k in actual if k not in expected)]:
            if key not in actual or key not in expected:
                found.append(f"{where}.{key}: {expected.get(key)!r} != {actual.get(key)!r}")
            else:
                found += differences(expected[key], actual[key], f"{where}.{key}", relative)
        return found
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{here}: {len(expected)} items != {len(actual)}"]
        return [
            d
            for i, (e, a) in enumerate(zip(expected, actual, strict=True))
            for d in differences(e, a, f"{where}[{i}]", relative)
        ]
    same = expected == actual
    if isinstance(expected, str) and isinstance(actual, str):
        same = _same_sentence(expected, actual, relative)
    elif isinstance(expected, float) and isinstance(actual, float):
        same = _close(expected, actual, relative)
    return [] if same else [f"{here}: {expected!r} != {actual!r}"]


def _close(a: float, b: float, relative: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=relative)


def _same_sentence(a: str, b: str, relative: float) -> bool:
    """The same words and counts, and each measured figure within `relative`."""
    if FIGURE.sub(r"#\2", a) != FIGURE.sub(r"#\2", b):
        return False
    for (x, unit), (y, _) in zip(FIGURE.findall(a), FIGURE.findall(b), strict=True):
        measured = bool(unit) or "." in x or "e" in x
        if x != y and not (measured and _close(_value(x), _value(y), relative)):
            return False
    return True


def _value(figure: str) -> float:
    return float(figure.replace(",", ""))


def machine() -> dict[str, Any]:
    """What decides a check's last bits here: the processor, its features and caches that
    torch's and oneDNN's kernels choose by (and any limit set on them), the cores and threads,
    torch's version. Any of them different, the figures are compared within the tolerance."""
    import platform

    import torch

    cpu: dict[str, str] = {}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "flags", "cache size"):
                cpu.setdefault(key.strip(), value.strip())
    return {
        "processor": platform.processor() or platform.machine(),
        "cpu": cpu,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "limits": {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")},
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
    }


def tolerance() -> float:
    """0 on the machine that wrote the records (bit for bit), `ANOTHER_MACHINE` elsewhere."""
    path = GOLDEN_DIR / MACHINE_FILE
    recorded = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    return 0.0 if recorded == machine() else ANOTHER_MACHINE
