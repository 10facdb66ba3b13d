"""What the user waits for in a health check: the whole path, not the probe alone, broken down
by phase, next to one 20-step generation at the same size.

Two ways in, as the user meets them:
  cli   a fresh `python -m app.cli check MODEL` process (and `generate MODEL --steps 20`):
        wall time from spawn to exit, the time its first stderr line about the check's finding
        arrived, and the seconds the tool itself reports.
  warm  the app's engine with the model already loaded: the engine's own job handlers
        (`app.engine.jobs.check`, `.generate`) called in a worker process, every event
        timestamped. The check's phases come from its progress stages (start-up and imports,
        load, device self-test, weight scan, probe, fp32 reference, each fix candidate and its
        verification, measuring the fixes, the fix's cost, the report); its first line is the
        headline warning (what failed, where) or, for a healthy model, the result.

Budgets (DESIGN.md): the first line within 10% and the proved fix within 25% of one 20-step
generation at the same size on the same device. The warm way runs a one-step generation first,
as a user's first job after a load, which pays what only a first job pays (`first_job_s`);
every job, the check and the generation alike, then places its parts as it runs (a copy cast
into the job's precision where the stored weights are in another: `check_split.py` times it).

`--baseline REV` measures the same cases on a checkout of REV (a temporary git worktree) too,
alternating case by case, so a change's before and after come from one run.

MODEL `sd1+plant` (or `sdxl+plant`) is the random-weight model with one UNet layer planted
past fp16's range (`common.PLANTS`); its generation runs under the fix the check remembered.

Usage: python benchmarks/user_wait.py [--cases demo-overflow:fp16,demo:fp32,sd1+plant:fp16]
       [--sizes sd1=128,sdxl=128] [--ways cli,warm] [--repeats 1] [--baseline REV]
       [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from common import ROOT, emit, load_average, machine, machine_line

DEFAULT_CASES = "demo:fp32,demo-overflow:fp32,demo-overflow:fp16"
STEPS = 20
FIRST_LINE_BUDGET = 0.10
PROVED_FIX_BUDGET = 0.25
PROMPT = "a yellow triangle on a purple background"
TIMEOUT_S = 1800

# Progress stages (their start) -> the phase they belong to, first match wins. The stage names
# are the ones app/core/models, app/core/health/check.py and fix.py report.
PHASES = (
    ("Starting the image library", "imports (diffusers)"),
    ("Building the demo model", "load"),
    ("Loading", "load"),
    ("Reading", "load"),
    ("Self-test", "device self-test"),
    ("Scanning", "weight scan"),
    ("Checking the weights", "weight scan"),
    ("Checking the ", "probe"),
    ("Running the fp32 reference", "fp32 reference"),
    ("Trying a fix: ", "fix: "),
    ("Measuring the fixes", "measuring the fixes"),
    ("Fix proved", "the table"),
    ("Completing the table, trying ", "the table: "),
    ("Completing the table, timing", "the table: timing"),
    ("Measuring the cost of the fix", "the fix's cost"),
    ("Done", "report"),
)


def phase_of(stage: str) -> str:
    for start, phase in PHASES:
        if stage.startswith(start):
            return phase + stage[len(start) :] if phase.endswith(": ") else phase
    return stage


def phases(marks: list[tuple[float, str]], end: float) -> list[dict]:
    """Seconds per phase from timestamped stages (`marks`, in order) up to `end`; a phase
    entered twice adds up."""
    spans: dict[str, float] = {}
    for (at, stage), following in zip(marks, [*marks[1:], (end, "")][: len(marks)], strict=True):
        name = phase_of(stage)
        spans[name] = spans.get(name, 0.0) + following[0] - at
    return [{"phase": name, "s": round(s, 3)} for name, s in spans.items()]


# --- warm: the engine's handlers, in a worker process -------------------------------------


def worker(case: dict) -> dict:
    """One warm case in this process: load through the engine's load handler, check through its
    check handler, generate 20 steps through its generate handler."""
    started = time.perf_counter()
    from app.core.requests.records import CheckRequest, GenerateRequest, LoadRequest
    from app.core.settings import PrecisionSettings
    from app.engine import jobs
    from app.engine.events import EventState, JobRequest
    from app.engine.server import JobContext, Session

    imported = time.perf_counter() - started
    session = Session()
    marks: list[tuple[float, str]] = []
    first_line: list[float] = []

    def send(event) -> None:
        now = time.perf_counter()
        if event.state is EventState.PROGRESS and (not marks or marks[-1][1] != event.stage):
            marks.append((now, event.stage))
        elif event.state is EventState.WARNING:
            first_line.append(now)

    def run(handler, request, job_id: int):
        from app.core.jobs import CancelToken

        context = JobContext(JobRequest(job_id, request), session, send, CancelToken())
        began = time.perf_counter()
        return handler(context, request), began, time.perf_counter()

    model, size = case["model"], case["size"]
    began = time.perf_counter()
    base, _, planted = model.partition("+")
    if base in ("sd1", "sdxl"):
        from common import bench_model, plant

        session.model = bench_model(base, "fp32")
        if planted:  # "sd1+plant": an fp16 overflow in one UNet layer (common.PLANTS)
            plant(session.model, base)
    else:
        run(jobs.load, LoadRequest(source=model), 1)
    load_s = time.perf_counter() - began
    load_phases = phases(marks, time.perf_counter())
    marks.clear()
    settings = PrecisionSettings(precision=case["precision"])
    # A one-step generation first, as a user's first job after the load: what only a first job
    # pays is paid there. The check and the generation after it each place their parts.
    warm_up = GenerateRequest(generation=_generation(size, case["output"], 1), precision=settings)
    _, placed_began, placed_ended = run(jobs.generate, warm_up, 5)
    from app.core.fixing import profiles

    for stored in profiles.stored_fixes().fixes:  # a fix its NaN watch proved and remembered:
        # the check below would run with it; this run's home is its own, the user's untouched
        profiles.forget_fix(stored.profile_key, stored.device, stored.torch_version)
    marks.clear()
    first_line.clear()
    result, began, ended = run(jobs.check, CheckRequest(precision=settings, size=size), 2)
    report = result.report
    check_marks = [(at - began, stage) for at, stage in marks]
    found = (first_line[0] - began) if first_line else None
    generation = GenerateRequest(generation=_generation(size, case["output"]), precision=settings)
    _, gen_began, gen_ended = run(jobs.generate, generation, 3)
    return {
        "imports_s": round(imported, 3),
        "first_job_s": round(placed_ended - placed_began, 3),
        "load_s": round(load_s, 3),
        "load_phases": load_phases,
        "check_s": round(ended - began, 3),
        "reported_s": round(report.seconds, 3),
        "first_line_s": round(found if found is not None else ended - began, 3),
        "headline": found is not None,
        "phases": phases([(began + at, s) for at, s in check_marks], ended),
        "verdict": str(
            report.verdict.value if hasattr(report.verdict, "value") else report.verdict
        ),
        "fix": report.fix.summary if report.fix else None,
        # What the check's own record says it reached and when (a baseline without it: {}).
        "milestones": milestones(report),
        "generation_s": round(gen_ended - gen_began, 3),
    }


def milestones(report) -> dict:
    """Each milestone the check reached (first finding, proved fix, verdict, done): its seconds
    from the check's start and the work done by then (`work.milestones`)."""
    done = getattr(report, "work", None)
    reached = getattr(done, "milestones", None) or {}
    return {
        name: {
            "s": at["seconds"],
            "calls": sum(n for d in at["calls"].values() for n in d.values()),
            "placements": at["placements"],
            "timed_calls": at["timed_calls"],
        }
        for name, at in reached.items()
    }


def _generation(size: int, output: str, steps: int = STEPS):
    from app.core.generation import GenerationRequest

    return GenerationRequest(
        prompt=PROMPT, steps=steps, seed=7, width=size, height=size, output_dir=output
    )


# --- running a tree -----------------------------------------------------------------------


@contextlib.contextmanager
def scratch_home() -> Iterator[tuple[dict[str, str], str]]:
    """A process environment with its own settings, data and cache folders (no fix remembered
    from an earlier run changes what the check tests), and a folder for the images."""
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ)
        for var in ("HALFSAFE_CONFIG_DIR", "HALFSAFE_DATA_DIR", "HALFSAFE_CACHE_DIR"):
            env[var] = str(Path(home) / var.lower())
        yield env, str(Path(home) / "images")


def warm(tree: Path, case: dict) -> dict:
    with scratch_home() as (env, images):
        case = {**case, "output": images}
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            json.dumps(case),
            "--app-root",
            str(tree),
        ]
        done = subprocess.run(
            command, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    if done.returncode != 0:
        raise SystemExit(f"The warm worker failed on {tree}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli(tree: Path, arguments: list[str], finding: str | None = None) -> dict:
    """A fresh `python -m app.cli` process in `tree`: wall time, when a stderr line holding
    `finding` arrived, and the JSON it printed."""
    with scratch_home() as (env, images):
        env["PYTHONPATH"] = str(tree)
        if arguments[0] == "generate":
            arguments = [*arguments, "--out", images]
        began = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", *arguments, "--json"],
            cwd=tree,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen: list[float] = []

        def read_stderr() -> None:
            assert process.stderr is not None
            for line in process.stderr:
                if finding and finding in line and not seen:
                    seen.append(time.perf_counter() - began)

        # stderr is read line by line as it comes (communicate() would take it in one piece).
        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        assert process.stdout is not None
        out = process.stdout.read()
        process.wait(timeout=TIMEOUT_S)
        wall = time.perf_counter() - began
        reader.join()
    document = json.loads(out)
    return {
        "wall_s": round(wall, 3),
        "reported_s": round(document["seconds"], 3),
        "first_line_s": round(seen[0] if seen else wall, 3),
        "headline": bool(seen),
        "verdict": document.get("verdict"),
    }


def cli_case(tree: Path, case: dict) -> dict:
    model, precision, size = case["model"], case["precision"], case["size"]
    flags = ["--precision", precision]
    check = cli(tree, ["check", model, *flags], finding="went NaN/Inf")
    generate = cli(
        tree,
        ["generate", model, *flags, "--steps", str(STEPS), "--prompt", PROMPT]
        + ["--width", str(size), "--height", str(size)],
    )
    return {"check": check, "generate": generate}


# --- the measurement ----------------------------------------------------------------------


def parse_cases(text: str, sizes: dict[str, int]) -> list[dict]:
    cases = []
    for item in text.split(","):
        model, _, precision = item.strip().partition(":")
        size = sizes.get(model.partition("+")[0], 128)
        cases.append({"model": model, "precision": precision or "fp32", "size": size})
    return cases


@contextlib.contextmanager
def checkout(revision: str | None) -> Iterator[Path | None]:
    """A temporary git worktree of `revision` (None: nothing to compare with)."""
    if revision is None:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="halfsafe-baseline-"))
    tree = folder / "tree"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(tree), revision],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True
        )
        shutil.rmtree(folder, ignore_errors=True)


def judged(row: dict, generation_s: float) -> dict:
    """The budgets: the first line within 10%, the proved fix (the whole check) within 25%
    of the 20-step generation."""
    first = row["first_line_s"] / generation_s
    whole = row["check_s"] / generation_s
    return {
        "first_line_vs_generation": round(first, 3),
        "first_line_met": first <= FIRST_LINE_BUDGET,
        "check_vs_generation": round(whole, 3),
        "check_met": whole <= PROVED_FIX_BUDGET,
    }


def measure(args) -> dict:
    trees = {"ours": ROOT}
    results = []
    with checkout(args.baseline) as baseline:
        if baseline is not None:
            trees["baseline"] = baseline
        for case in parse_cases(args.cases, args.sizes):
            entry: dict = {**case, "warm": {}, "cli": {}}
            demo = case["model"].startswith("demo")
            for _ in range(args.repeats):  # alternating trees, so the load hits both alike
                for label, tree in trees.items():
                    print(f"{label}: {case}", file=sys.stderr, flush=True)
                    if "warm" in args.ways:
                        row = warm(tree, case)
                        row.update(judged(row, row["generation_s"]))
                        entry["warm"].setdefault(label, []).append(row)
                    if "cli" in args.ways and demo:
                        entry["cli"].setdefault(label, []).append(cli_case(tree, case))
            results.append(entry)
    return {
        "benchmark": "user_wait",
        "machine": machine("cpu"),
        "baseline": args.baseline,
        "steps": STEPS,
        "results": results,
        "load_average_after": load_average(),
    }


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def table(document: dict) -> str:
    lines = [f"on {machine_line(document['machine'])}, load {document['machine']['load_average']}"]
    header = (
        f"{'case':<26}{'tree':<9}{'first line':>11}{'check':>9}{'20-step':>9}"
        f"{'first/gen':>10}{'check/gen':>10}  verdict"
    )
    lines += ["warm (model loaded, the engine's handlers):", header, "-" * len(header)]
    for r in document["results"]:
        case = f"{r['model']} {r['size']} px {r['precision']}"
        for label, rows in r["warm"].items():
            lines.append(
                f"{case:<26}{label:<9}{_median(rows, 'first_line_s'):>10.2f}s"
                f"{_median(rows, 'check_s'):>8.2f}s{_median(rows, 'generation_s'):>8.2f}s"
                f"{_median(rows, 'first_line_vs_generation'):>10.1%}"
                f"{_median(rows, 'check_vs_generation'):>10.1%}  {rows[0]['verdict']}"
            )
    lines += ["", "phases of the warm check (s, first repeat):"]
    for r in document["results"]:
        for label, rows in r["warm"].items():
            spans = ", ".join(f"{p['phase']} {p['s']:.2f}" for p in rows[0]["phases"])
            lines.append(f"  {r['model']} {r['precision']} {label}: {spans}")
    lines += ["", "milestones of the warm check (s from its start / calls / placements / timed):"]
    for r in document["results"]:
        for label, rows in r["warm"].items():
            reached = rows[0].get("milestones") or {}
            spans = ", ".join(
                f"{name} {m['s']:.2f}/{m['calls']}/{m['placements']}/{m['timed_calls']}"
                for name, m in reached.items()
            )
            lines.append(f"  {r['model']} {r['precision']} {label}: {spans or 'not recorded'}")
    cli_rows = [r for r in document["results"] if r["cli"]]
    if cli_rows:
        head = f"{'case':<26}{'tree':<9}{'check wall':>11}{'reported':>10}{'first line':>11}{'gen wall':>10}{'gen reported':>13}"
        lines += ["", "cli (a fresh process each):", head, "-" * len(head)]
        for r in cli_rows:
            case = f"{r['model']} {r['size']} px {r['precision']}"
            for label, rows in r["cli"].items():
                checks = [x["check"] for x in rows]
                gens = [x["generate"] for x in rows]
                lines.append(
                    f"{case:<26}{label:<9}{_median(checks, 'wall_s'):>10.2f}s"
                    f"{_median(checks, 'reported_s'):>9.2f}s{_median(checks, 'first_line_s'):>10.2f}s"
                    f"{_median(gens, 'wall_s'):>9.2f}s{_median(gens, 'reported_s'):>12.2f}s"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help="MODEL:PRECISION, comma-separated")
    parser.add_argument("--sizes", default="sd1=128,sdxl=128", help="MODEL=PX for sd1 and sdxl")
    parser.add_argument("--ways", default="cli,warm")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--baseline", help="a git revision to measure side by side")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--app-root", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the results here as JSON")
    args = parser.parse_args()
    if args.worker:
        sys.path.insert(0, args.app_root)  # the tree measured, ahead of this one
        print(json.dumps(worker(json.loads(args.worker))))
        return
    args.sizes = {k: int(v) for k, _, v in (s.partition("=") for s in args.sizes.split(","))}
    args.ways = [w.strip() for w in args.ways.split(",")]
    document = measure(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
