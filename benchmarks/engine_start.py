"""Engine start to ready: how long after the app asks for its engine process each step of
readiness arrives, several fresh processes, median.

Each run starts `python -m app.engine` exactly as the desktop app does (`EngineProcess`), then
sends, one after another: `ping` (the process is up and answering), `hardware` (torch imported,
devices described; the self-test verdict comes from the cache, filled by one unmeasured run
first, as on every start after the first) and `load` of the demo model (ready to generate).
Times are from just before the process is spawned to each result.

Usage: python benchmarks/engine_start.py [--runs 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import tempfile
import time
from pathlib import Path

from common import emit, machine

STEPS = (
    ("ping", "first reply"),
    ("hardware", "devices described"),
    ("load", "demo model loaded"),
)
TIMEOUT_S = 300


def one_run() -> dict[str, float]:
    from app.core.requests.records import HardwareRequest, LoadRequest, PingRequest
    from app.engine.events import EngineEvent, EventState, JobRequest
    from app.engine.process import EngineProcess

    requests = (PingRequest(), HardwareRequest(self_test=True), LoadRequest(source="demo"))

    events: queue.Queue[EngineEvent | str] = queue.Queue()
    engine = EngineProcess()
    spawned = time.perf_counter()
    engine.start(events.put, lambda failure: events.put(failure.message))
    marks = {}
    try:
        for job_id, request in enumerate(requests, start=1):
            kind = request.kind
            engine.send(JobRequest(job_id, request))
            while True:
                event = events.get(timeout=TIMEOUT_S)
                if isinstance(event, str):
                    raise SystemExit(f"The engine stopped: {event}")
                if event.job_id == job_id and event.state.final:
                    if event.state is not EventState.RESULT:
                        raise SystemExit(f"The engine's {kind} job failed: {event.message}")
                    marks[kind] = time.perf_counter() - spawned
                    break
    finally:
        engine.stop()
    return marks


def measure(runs: int) -> dict:
    with tempfile.TemporaryDirectory() as home:
        for var in ("HALFSAFE_CONFIG_DIR", "HALFSAFE_DATA_DIR", "HALFSAFE_CACHE_DIR"):
            os.environ[var] = str(Path(home) / var.lower())
        first = one_run()  # fills the self-test cache and warms the OS file cache
        measured = [one_run() for _ in range(runs)]
    return {
        "benchmark": "engine_start",
        "machine": machine("cpu"),
        "first_start_s": {k: round(v, 3) for k, v in first.items()},
        "steps": [
            {
                "kind": kind,
                "words": words,
                "median_s": round(statistics.median(m[kind] for m in measured), 3),
                "min_s": round(min(m[kind] for m in measured), 3),
                "max_s": round(max(m[kind] for m in measured), 3),
                "runs": runs,
            }
            for kind, words in STEPS
        ],
    }


def table(document: dict) -> str:
    lines = [f"{'engine start to':<24}{'median s':>10}{'min-max s':>16}"]
    for step in document["steps"]:
        lines.append(
            f"{step['words']:<24}{step['median_s']:>10.3f}{step['min_s']:>8.3f}-{step['max_s']:.3f}"
        )
    first = document["first_start_s"]
    lines.append(f"first start (self-test not cached yet): {first['hardware']:.3f} s to devices")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args()
    document = measure(args.runs)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
