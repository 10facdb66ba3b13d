"""A transformer streamed block by block under a memory budget against placed whole, at
Flux.1's width: what the check's copies hold on the device, what one call costs in time, and
whether the answers are the same, side by side in one run.

The transformer is the one `stored_memory.py` measures (Flux.1 dev's width at 2 double and 4
single blocks of its 19 and 38, random weights), written as bf16 and as GGUF Q4_0 and read by
HalfSafe's own transformer loader. Per file, two ways:
- "whole": no budget, each placement holds the whole transformer;
- "streamed": a budget under the transformer's stored size (`--budget-share` of it), so each
  placement keeps the non-block layers on the device and brings one block at a time.

Figures per way: the device peak of the check's placements for a failing transformer (the fp16
probe, the fp32 reference, two layers in fp32, the transformer in bf16 and in fp32:
`PlacedPipeline.peak_bytes`, what a GPU would hold of the weights, counted the same way on a
CPU); one fp32 transformer call at `--size` px (its time, and whether both ways give the same
output); and, from the measured blocks, what the whole Flux.1 dev (19 + 38 blocks) needs on the
device each way. On a CPU the blocks are "brought" within the same memory, so the time is the
cost of the hooks and the per-block conversion alone; on a GPU the copy over PCIe adds to it.

Usage: python benchmarks/streamed_memory.py [--forms bf16,gguf_Q4_0] [--size 256]
       [--budget-share 0.3] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
from pathlib import Path

from common import emit, machine, machine_line, names, status
from stored_memory import (
    DOUBLE,
    FULL_DOUBLE,
    FULL_SINGLE,
    SINGLE,
    call,
    load,
    placement_lines,
    placements,
    written_forms,
)

FORMS = ("bf16", "gguf_Q4_0")
GIB = 2**30


def whole_model(sizes) -> dict[str, int]:
    """Flux.1 dev's device need each way, from the measured transformer: whole, the non-block
    layers and every block; streamed, the non-block layers and its largest block."""
    block = sizes.block  # a double block: the largest
    blocks_bytes = sizes.whole - sizes.resident
    single = (blocks_bytes - DOUBLE * block) // SINGLE
    return {
        "whole": sizes.resident + FULL_DOUBLE * block + FULL_SINGLE * single,
        "streamed": sizes.resident + block,
    }


def measure(path: Path, size: int, share: float) -> dict:
    import torch

    from app.core.precision import streaming

    transformer = load(path)
    stored = streaming.sizes(transformer, torch.float16)
    budget_mb = stored.whole * share / 2**20
    results, outputs = {}, {}
    for way, budget in (("whole", None), ("streamed", budget_mb)):
        gc.collect()
        with status(f"{path.name}: {way}"):
            peak, steps, streamed = placements(transformer, budget)
            _, seconds, outputs[way] = call(transformer, size, budget)
        results[way] = {
            "budget_mb": budget,
            "device_peak": peak,
            "steps": steps,
            "blocks_streamed": streamed.blocks if streamed else 0,
            "call_seconds": round(seconds, 2),
        }
    same = bool(torch.equal(outputs["whole"], outputs["streamed"]))
    return {
        "file_bytes": path.stat().st_size,
        "held_fp16": stored.whole,
        "ways": results,
        "identical": same,
        "flux1_dev": whole_model(stored),
    }


def run(args) -> dict:
    forms = names(args.forms, FORMS)
    document = {
        "machine": machine("cpu"),
        "size": args.size,
        "budget_share": args.budget_share,
        "forms": {},
    }
    with tempfile.TemporaryDirectory(prefix="halfsafe-streamed-bench-") as scratch:
        files, document["parameters"] = written_forms(Path(scratch), forms)
        for form in forms:
            document["forms"][form] = measure(files[form], args.size, args.budget_share)
    return document


def table(document: dict) -> str:
    lines = [
        machine_line(document["machine"]),
        f"Flux.1-width transformer, {DOUBLE} double + {SINGLE} single blocks "
        f"({document['parameters'] / 1e9:.2f}B parameters); budget {document['budget_share']:.0%} "
        f"of its fp16 placement; one fp32 call at {document['size']} px",
        "",
        "| file | way | budget | check's device peak | blocks streamed | fp32 call | "
        "Flux.1 dev on the device (projected) |",
        "|---|---|---|---|---|---|---|",
    ]
    for form, result in document["forms"].items():
        for way, figures in result["ways"].items():
            budget = figures["budget_mb"]
            lines.append(
                f"| {form} ({result['file_bytes'] / GIB:.2f} GiB) | {way} | "
                f"{'none' if budget is None else f'{budget / 1024:.2f} GiB'} | "
                f"{figures['device_peak'] / GIB:.2f} GiB | {figures['blocks_streamed']} | "
                f"{figures['call_seconds']} s | {result['flux1_dev'][way] / GIB:.1f} GiB |"
            )
        outcome = "identical" if result["identical"] else "DIFFERENT"
        lines.append(f"| | outputs of the two ways: {outcome} | | | | | |")
    lines.append("")
    lines.append("Device GiB held after each of the check's placements:")
    for form, result in document["forms"].items():
        lines.extend(placement_lines(result, form, 12))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forms", help=f"comma-separated, of {', '.join(FORMS)}")
    parser.add_argument("--size", type=int, default=256, help="the fp32 call's size in px")
    parser.add_argument(
        "--budget-share",
        type=float,
        default=0.3,
        help="the budget as a share of the transformer's fp16 placement (default 0.3)",
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    document = run(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
