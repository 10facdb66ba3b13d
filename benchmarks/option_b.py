"""Option B: does a provisional proof on the first failing timestep agree with the full proof?

For every check of the planted corpus whose denoiser goes non-finite, the provisional proof
(`provisional.py`: each candidate on the first failing timestep alone, against the
fp32 denoiser on that timestep) runs on the check's own runner right after the full proof named
its fix, from the plan the full proof started from, its calls counted apart. Printed side by side
per case: the full proof's fix, each candidate's verdict in both (finite, quality against the
20 dB threshold, passes), whether they agree, and the denoiser calls: the full proof's (to the fix
named, and with the candidates' table finished), the provisional proof's alone (every candidate,
and only those that could still win), and provisional-then-full (the provisional choice proved in
full: the three-step reference and the choice's three steps; the full search as well where the
provisional choice is not the full proof's).

The corpus is the pruned-search test's (`tests/core/test_pruned_search.py`): the tiny SD model
healthy and with each plant of `tests/core/test_lean_recorder.PLANTS`, checked in fp16, bf16 and
fp32; the built-in demo and demo-overflow; the other families' tiny denoisers with their planted
blocks (`tests/core/test_families.py`), in fp16. `--model sd1` adds an SD1.5-size UNet with
random weights and the layer `benchmarks/fix_cost_truth.py` plants, stored in fp16, checked in
fp16 at `--size` (`--tiny`: the tests' tiny SD1.x pipeline with the same plant, a dry run). No
cost is measured (`measure_cost=False`): counts, not times, are compared. `--device cuda` checks
on a GPU, where fp16 runs natively; the JSON is written again after each check.

Usage: python benchmarks/option_b.py [--device cpu|cuda] [--model sd1] [--size PX] [--tiny]
       [--only NAME,...] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

# The suite's pinned CPU bf16 class and one intra-op thread (`tests/conftest.py`): the fix a
# check finds depends on the class, and the tiny models run faster on one thread.
os.environ.setdefault("HALFSAFE_CPU_BF16", "native")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from common import bench_model, emit, machine, status, write_json  # noqa: E402

PRECISIONS = ("fp16", "bf16", "fp32")


@contextlib.contextmanager
def provisional_beside_full() -> Iterator[list[dict[str, Any]]]:
    """Inside the block every check whose denoiser's first probe went non-finite also runs the
    provisional proof, right after the full proof named its fix; the list yielded receives one
    entry per such denoiser: the proof, and the denoiser calls the check's full proof made to
    name its fix (`full_calls`) and before it (`before`, the first probe's)."""
    from provisional import provisional_proof

    from app.core import work
    from app.core.health import check

    found: list[dict[str, Any]] = []
    settle = check._Check.settle

    def settled(self, stage_fn, names, first, as_tested=None):
        denoiser = self.runner.family.denoiser
        probe = first.probes.get(denoiser)
        if names != [denoiser] or probe is None or not probe.non_finite or denoiser in self.broken:
            return settle(self, stage_fn, names, first, as_tested)
        tested, counted = self.search.plan, work.counted()
        before = counted.calls_of(denoiser) if counted is not None else 0
        good = settle(self, stage_fn, names, first, as_tested)
        after = counted.calls_of(denoiser) if counted is not None else 0
        proof = provisional_proof(
            self.runner, denoiser, self.conditioning, probe, tested, self.bf16_native
        )
        found.append({"proof": proof, "before": before, "full_calls": after - before})
        return good

    check._Check.settle = settled
    try:
        yield found
    finally:
        check._Check.settle = settle


def compare_case(report, entry: dict[str, Any], steps: int) -> dict[str, Any]:
    """One failing denoiser's provisional proof beside the check's full proof."""
    proof = entry["proof"]
    full_rows = {r.kind: r for r in report.tried if r.component == proof.component}
    rows = []
    for row in proof.rows:
        full = full_rows.get(row.kind)
        rows.append(
            {
                "kind": row.kind,
                "provisional": _verdict(row),
                "full": _verdict(full) if full is not None else None,
                "same_candidate": full is not None and full.settings == row.settings,
                "agrees": full is not None and full.verified == row.verified,
            }
        )
    for kind in full_rows.keys() - {r.kind for r in proof.rows}:
        rows.append(
            {
                "kind": kind,
                "provisional": None,
                "full": _verdict(full_rows[kind]),
                "same_candidate": False,
                "agrees": False,
            }
        )
    chosen_full = next((r for r in full_rows.values() if r.chosen), None)
    chosen = proof.chosen
    same_pick = (chosen is None and chosen_full is None) or (
        chosen is not None
        and chosen_full is not None
        and (chosen.kind, chosen.settings) == (chosen_full.kind, chosen_full.settings)
    )
    done = report.work.calls_of(proof.component) - entry["before"]
    alone = proof.calls_to_choose()
    # The provisional choice proved in full: the three-step reference, then the choice's own
    # three steps; where it is not the full proof's choice, the full search besides.
    then_full = alone + proof.reference_calls * steps * (2 if chosen is not None else 1)
    if not same_pick:
        then_full += entry["full_calls"]
    return {
        "component": proof.component,
        "first_failing_call": proof.call,
        "timestep": proof.timestep,
        "full_fix": chosen_full.words if chosen_full is not None else None,
        "provisional_fix": chosen.words if chosen is not None else None,
        "same_fix": same_pick,
        "candidates": rows,
        "agrees": same_pick and all(r["agrees"] for r in rows),
        "calls": {
            "full_to_fix": entry["full_calls"],
            "full_with_table": done,
            "provisional_every_candidate": proof.calls,
            "provisional_to_choice": alone,
            "provisional_then_full": then_full,
        },
    }


def _verdict(row) -> dict[str, Any]:
    return {
        "finite": row.finite,
        "quality_db": round(row.quality.value, 2) if row.quality is not None else None,
        "passes": row.verified,
        "words": row.words,
    }


def run_case(name: str, model, precision: str, size: int, device: str = "cpu") -> dict[str, Any]:
    """One check of `model` at `precision` with the provisional proof beside the full one."""
    from app.core import health
    from app.core.health.request import CheckRequest, CheckRun
    from app.core.settings import PrecisionSettings

    with status(f"{name}, {precision}"), provisional_beside_full() as found:
        report = health.check_loaded(
            model,
            CheckRequest(
                precision=PrecisionSettings(precision=precision), device=device, size=size
            ),
            run=CheckRun(remember=False, measure_cost=False, use_remembered=False),
        )
    steps = len(report.timesteps) if report.timesteps else 3
    failed = [n for n, c in report.components.items() if c.status.value != "ok"]
    return {
        "case": name,
        "precision": precision,
        "verdict": report.verdict.value,
        "failed": failed,
        "fix": report.fix.summary if report.fix is not None else None,
        "denoiser": [compare_case(report, entry, steps) for entry in found],
    }


def corpus(size: int) -> list[tuple[str, Callable[[], Any], tuple[str, ...], int]]:
    """(name, model builder, precisions, size) for every case of the corpus."""
    from app.core.models import load_model
    from tests.core.test_health import loaded
    from tests.core.test_lean_recorder import PLANTS
    from tests.support.tiny_models import build_tiny_sd_pipeline

    cases: list[tuple[str, Callable[[], Any], tuple[str, ...], int]] = [
        ("demo", lambda: load_model("demo"), ("fp16",), 64),
        ("demo-overflow", lambda: load_model("demo-overflow"), ("fp16",), 64),
    ]
    for planted, plant in PLANTS.items():
        cases.append(
            (
                f"sd-{planted}",
                lambda p=plant, k=planted: loaded(p(build_tiny_sd_pipeline()), k),
                PRECISIONS,
                64,
            )
        )
    cases += _family_cases()
    return cases


def _family_cases() -> list[tuple[str, Callable[[], Any], tuple[str, ...], int]]:
    """Each other family's tiny model with each planted denoiser block, in fp16."""
    from tests.core import test_families as families
    from tests.support.family_helpers import in_memory, plant_scaled

    cases = []
    for family, row in families.ROWS.items():
        if family == "sd":
            continue
        for planted, plant in row.plants.items():
            if plant.component not in ("unet", "transformer"):
                continue

            def build(row=row, plant=plant, key=f"{family}-{planted}"):
                pipeline = plant_scaled(
                    row.build(), {"p": (plant.component, plant.layer, plant.factor)}, "p"
                )
                return in_memory(pipeline, key, row.architecture, row.prediction)

            cases.append((f"{family}-{planted}", build, ("fp16",), 64))
    return cases


def sd1_case(size: int, tiny: bool = False) -> tuple[str, Callable[[], Any], tuple[str, ...], int]:
    """An SD1.5-size UNet with random weights stored in fp16 (`tiny`: the tests' tiny one), its
    planted layer scaled past fp16 (`fix_cost_truth.py`'s)."""
    from fix_cost_truth import FACTOR
    from islands import PLANTED

    def build():
        import torch

        model = bench_model("sd1", "fp16", tiny=tiny)
        with torch.no_grad():
            model.pipeline.unet.get_submodule(PLANTED).weight.mul_(FACTOR)
        return model

    return (f"sd1-{'tiny' if tiny else 'size'}-{size}px", build, ("fp16",), size)


def summary(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """How often the provisional proof agreed, and the denoiser calls summed over the cases
    it ran in."""
    proofs = [d for c in cases for d in c["denoiser"]]
    rows = [r for d in proofs for r in d["candidates"]]
    keys = ("full_to_fix", "full_with_table", "provisional_to_choice", "provisional_then_full")
    return {
        "checks": len(cases),
        "denoiser_proofs": len(proofs),
        "same_fix": sum(d["same_fix"] for d in proofs),
        "agree": sum(d["agrees"] for d in proofs),
        "candidates": len(rows),
        "candidates_agree": sum(r["agrees"] for r in rows),
        "agrees_everywhere": all(d["agrees"] for d in proofs),
        "calls": {k: sum(d["calls"][k] for d in proofs) for k in keys},
    }


def table(document: dict[str, Any]) -> str:
    lines = [
        f"{'case':<26}{'prec':<6}{'verdict':<9}{'full fix':<34}{'provisional fix':<34}"
        f"{'agree':<6}{'full':>5}{'+tbl':>5}{'prov':>5}{'p+f':>5}"
    ]
    for case in document["cases"]:
        head = f"{case['case']:<26}{case['precision']:<6}{case['verdict']:<9}"
        if not case["denoiser"]:
            failed = ", ".join(case["failed"]) or "nothing"
            lines.append(f"{head}(denoiser finite; failed: {failed})")
        for d in case["denoiser"]:
            calls = d["calls"]
            lines.append(
                f"{head}{_cut(d['full_fix']):<34}{_cut(d['provisional_fix']):<34}"
                f"{'yes' if d['agrees'] else 'NO':<6}{calls['full_to_fix']:>5}"
                f"{calls['full_with_table']:>5}{calls['provisional_to_choice']:>5}"
                f"{calls['provisional_then_full']:>5}"
            )
            for r in d["candidates"]:
                lines.append(
                    f"{'':<41}{r['kind']:<16}full {_said(r['full']):<22}"
                    f"provisional {_said(r['provisional']):<22}{'' if r['agrees'] else 'DIFFERS'}"
                )
    s = document["summary"]
    lines.append(
        f"\nDenoiser proofs: {s['denoiser_proofs']} in {s['checks']} checks; agreeing on every "
        f"candidate and the fix {s['agree']}/{s['denoiser_proofs']}; same fix "
        f"{s['same_fix']}/{s['denoiser_proofs']}; candidates agreeing "
        f"{s['candidates_agree']}/{s['candidates']}; denoiser calls: full to the fix "
        f"{s['calls']['full_to_fix']}, with the table {s['calls']['full_with_table']}, "
        f"provisional to its choice {s['calls']['provisional_to_choice']}, provisional then "
        f"full {s['calls']['provisional_then_full']}."
    )
    return "\n".join(lines)


def _cut(words: str | None, width: int = 32) -> str:
    words = words or "none"
    return words if len(words) <= width else words[: width - 1] + "~"


def _said(verdict: dict[str, Any] | None) -> str:
    if verdict is None:
        return "not a candidate"
    if not verdict["finite"]:
        return "non-finite"
    mark = "pass" if verdict["passes"] else "fail"
    return f"{verdict['quality_db']:.1f} dB {mark}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", choices=("sd1",), help="add an SD1.5-size case")
    parser.add_argument("--size", type=int, default=128, help="the SD1.5-size case's px")
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--tiny", action="store_true", help="the SD1.5 case on the tiny model")
    parser.add_argument("--json")
    args = parser.parse_args()
    # A remembered fix or settings of this machine's own would change what the check runs.
    for var in ("HALFSAFE_CONFIG_DIR", "HALFSAFE_DATA_DIR", "HALFSAFE_CACHE_DIR", "HF_HOME"):
        os.environ[var] = tempfile.mkdtemp(prefix=var.lower())
    cases = corpus(args.size)
    if args.model == "sd1":  # first: a run cut short keeps the case it was run for
        cases.insert(0, sd1_case(args.size, args.tiny))
    if args.only:
        wanted = set(args.only.split(","))
        cases = [c for c in cases if c[0] in wanted]
    results: list[dict[str, Any]] = []
    document = {"machine": machine(args.device), "device": args.device, "cases": results}
    for name, build, precisions, size in cases:
        for precision in precisions:
            results.append(run_case(name, build(), precision, size, args.device))
            if args.json:  # each check's figures as soon as they are known
                write_json(args.json, {**document, "summary": summary(results)})
    document["summary"] = summary(results)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    sys.exit(main())
