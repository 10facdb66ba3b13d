"""A cost model of the UNet's step, fitted from timed steps, and its projection for the consumer
cards HalfSafe's users run (RTX 2060 and RTX 3060 class).

Measured: SD1.5's and SDXL's UNet (random weights at their published shapes, built in memory),
one call on the CFG batch in half precision, placed as a generation places it, at several
picture sizes. Each call's work is counted once on a real call: its matmul and convolution
operations (torch's `FlopCounterMode`), the bytes its operators read and write, and how many
operators it runs (a dispatch mode; views move nothing and are not counted). Then it is timed
(a warm-up, the median of `--rounds`), and the point is written to the JSON at once.

The model: step = calls x per_call + operations / arithmetic_rate + bytes / memory_rate, fitted by
non-negative least squares on the relative error. Its error on each point is the error of a fit
made without that point (leave one out): what it would say of a size it never saw.

The projection: the fitted rates, as fractions of the measured card's published peaks (fp16
tensor throughput, memory bandwidth; `PUBLISHED`), applied to each target card's published
peaks; the per-call cost (the host launching kernels) kept as measured. A device with no
published figure (a CPU, in the dry run) has its peaks measured here (one large matmul, one
large copy) instead, and says so.

`--docs FILE` replaces the section of FILE between the `DOCS_BEGIN` and `DOCS_END` markers with
the table (docs/benchmarks.md holds them); a file without them is refused with one sentence.

Usage: python benchmarks/cost_model.py [--device cpu|cuda] [--models sd1,sdxl]
       [--sizes sd1=256/384/512/768,sdxl=512/768/1024] [--tiny] [--rounds R] [--dtype fp16]
       [--json FILE] [--docs FILE]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import bench_model, machine, machine_line, names, status, timed, write_json

DEFAULT_SIZES = {"sd1": (256, 384, 512, 768), "sdxl": (512, 768, 1024)}
TINY_SIZES = (32, 48, 64, 96)
TARGET_ERROR = 0.15
DOCS_BEGIN = "<!-- cost-model: the round writes this section (benchmarks/cost_model.py) -->"
DOCS_END = "<!-- cost-model: end -->"


@dataclass(frozen=True)
class Card:
    """A card's published peaks: dense fp16 tensor throughput with fp32 accumulation (what
    PyTorch's fp16 matmuls use), memory bandwidth, memory; and where the figures come from."""

    name: str
    tflops: float
    gb_per_s: float
    memory_gib: float
    source: str


# Published figures. The GeForce cards' fp16 tensor rate with fp32 accumulation is half their
# fp16-accumulate rate (the whitepapers' tables for the 2080 Ti and 3090 show the halving): SMs x
# tensor FMAs per SM per clock x 2 x boost clock / 2.
PUBLISHED = {
    "rtx 2060": Card(
        "RTX 2060",
        25.8,  # 30 SMs x 512 FMA/clock (8 Turing tensor cores x 64) x 2 x 1.68 GHz / 2
        336.0,  # 14 Gbps GDDR6 x 192 bit
        6.0,
        "NVIDIA Turing GPU Architecture whitepaper (tensor core rates, Appendix A); GeForce "
        "RTX 2060 specifications (30 SMs, 1680 MHz boost, 14 Gbps, 192-bit, 6 GB)",
    ),
    "rtx 3060": Card(
        "RTX 3060",
        25.5,  # 28 SMs x 512 FMA/clock (4 GA10x tensor cores, dense) x 2 x 1.777 GHz / 2
        360.0,  # 15 Gbps GDDR6 x 192 bit
        12.0,
        "NVIDIA Ampere GA102 GPU Architecture whitepaper (GA10x SM tensor rates, Table 9 for "
        "the 3090's halving); GeForce RTX 3060 specifications (28 SMs, 1777 MHz boost, 15 Gbps, "
        "192-bit, 12 GB)",
    ),
    "h100 pcie": Card(
        "H100 PCIe", 756.0, 2039.0, 80.0, "NVIDIA H100 Tensor Core GPU datasheet (PCIe)"
    ),
    "h100 nvl": Card("H100 NVL", 835.0, 3900.0, 94.0, "NVIDIA H100 Tensor Core GPU datasheet"),
    "h100": Card("H100 SXM", 989.4, 3350.0, 80.0, "NVIDIA H100 Tensor Core GPU datasheet (SXM)"),
    "h200": Card("H200 SXM", 989.4, 4800.0, 141.0, "NVIDIA H200 Tensor Core GPU datasheet"),
}
TARGETS = ("rtx 2060", "rtx 3060")


def published(device_name: str) -> Card | None:
    """The published card whose key `device_name` holds (the longest key first)."""
    lowered = device_name.lower()
    for key in sorted(PUBLISHED, key=len, reverse=True):
        if key in lowered:
            return PUBLISHED[key]
    return None


# --- the work of one call -------------------------------------------------------------------


def _traffic_mode():
    """A dispatch mode counting the operators run (views aside) and the bytes of every tensor
    each reads and writes."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Traffic(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not getattr(func, "is_view", False):
                self.calls += 1
                self.bytes += sum(
                    t.numel() * t.element_size()
                    for t in tree_leaves((args, kwargs or {}, out))
                    if isinstance(t, torch.Tensor)
                )
            return out

    return Traffic()


def work_of(call) -> dict[str, float]:
    """The operations (matmul and convolution), bytes moved and operators of one `call()`."""
    from torch.utils.flop_counter import FlopCounterMode

    traffic = _traffic_mode()
    with FlopCounterMode(display=False) as flops, traffic:
        call()
    return {
        "flops": float(flops.get_total_flops()),
        "bytes": float(traffic.bytes),
        "calls": traffic.calls,
    }


# --- measuring ----------------------------------------------------------------------------


def measure(args) -> dict:
    from app.core import hardware

    device = hardware.pick_device(args.device)
    described = machine(str(device))
    document: dict = {
        "benchmark": "cost_model",
        "machine": described,
        "dtype": args.dtype,
        "tiny": args.tiny,
        "rounds": args.rounds,
        "peaks": device_peaks(device, args.dtype, described),
        "points": [],
    }
    for name in args.models:
        sizes = TINY_SIZES if args.tiny else args.sizes[name]
        for point in measure_model(name, sizes, device, args):
            document["points"].append(point)
            if args.json:  # each point as soon as it is timed
                write_json(args.json, document)
    return document


def measure_model(name: str, sizes, device, args):
    """Build `name`, place its UNet as a generation places it, and yield one point per size:
    the work of a call on the CFG batch and its time."""
    import torch
    from islands import _inputs

    from app.core.precision import PlacedPipeline, backend_flags, resolve_plan
    from app.core.settings import PrecisionSettings

    with status(f"building {name}"):
        model = bench_model(name, "fp16", tiny=args.tiny)
    plan = resolve_plan(PrecisionSettings(precision=args.dtype), device=device, components=["unet"])
    placed = PlacedPipeline(model.pipeline, plan, ["unet"])
    unet = placed["unet"]
    dtype = next(unet.parameters()).dtype
    weights = sum(p.numel() * p.element_size() for p in unet.parameters())
    for size in sizes:
        inputs: dict[str, Any] = _inputs(model, size, device, torch.Generator().manual_seed(0))
        cast = {k: v.to(dtype) if k != "added_cond_kwargs" else v for k, v in inputs.items()}

        def call(cast=cast):
            return unet(**cast, return_dict=False)[0]

        def step(call=call):
            with backend_flags(plan), torch.inference_mode():
                return call()

        with status(f"{name} at {size} px"):
            step()  # warm-up: kernel selection, allocator
            with backend_flags(plan), torch.no_grad():
                counted = work_of(call)
            samples = [timed(step, device) * 1000 for _ in range(args.rounds)]
        yield {
            "model": name,
            "size": size,
            **counted,
            "weights_bytes": weights,
            "step_ms": round(statistics.median(samples), 4),
            "step_ms_range": [round(min(samples), 4), round(max(samples), 4)],
        }
    placed.release()


def device_peaks(device, dtype: str, described: dict) -> dict:
    """The measured device's peaks: published where its name is in `PUBLISHED`, else measured
    here (one large matmul in `dtype`, one large copy)."""
    gpu = described.get("gpu")
    card = published(gpu["name"]) if gpu else None
    if card is not None:
        return {"tflops": card.tflops, "gb_per_s": card.gb_per_s, "source": card.source}
    import torch

    from app.core.precision.plan import torch_dtype

    side = 1024 if device.type == "cpu" else 8192
    a = torch.randn(side, side, device=device).to(torch_dtype(dtype))
    matmul_s = timed(lambda: a @ a, device, repeats=3)
    block = torch.empty(2**26 if device.type == "cpu" else 2**28, dtype=torch.uint8, device=device)
    copy_s = timed(block.clone, device, repeats=3)
    return {
        "tflops": round(2 * side**3 / matmul_s / 1e12, 4),
        "gb_per_s": round(2 * block.numel() / copy_s / 1e9, 2),
        "source": f"measured here: one {side}x{side} {dtype} matmul, one {block.numel() >> 20} MiB copy",
    }


# --- fitting and projecting ---------------------------------------------------------------


def fit(points: list[dict]) -> dict[str, float]:
    """Seconds per operator call, per operation and per byte (each at least 0) that make
    `calls * c + flops * f + bytes * b` nearest each point's step, relative to it."""
    import numpy as np
    from scipy.optimize import nnls

    rows = np.array([[p["calls"], p["flops"], p["bytes"]] for p in points], dtype=float)
    seconds = np.array([p["step_ms"] / 1000 for p in points])
    scale = rows.max(axis=0)
    scale[scale == 0] = 1.0
    solution, _ = nnls(rows / scale / seconds[:, None], np.ones(len(points)))
    per_call, per_flop, per_byte = (solution / scale).tolist()
    return {"per_call_s": per_call, "per_flop_s": per_flop, "per_byte_s": per_byte}


def predicted_ms(model: dict[str, float], point: dict) -> float:
    return 1000 * (
        point["calls"] * model["per_call_s"]
        + point["flops"] * model["per_flop_s"]
        + point["bytes"] * model["per_byte_s"]
    )


def left_out_errors(points: list[dict]) -> list[float | None]:
    """Each point's relative error under a fit of the other points (None with too few)."""
    errors: list[float | None] = []
    for i, point in enumerate(points):
        others = points[:i] + points[i + 1 :]
        if len(others) < 3:
            errors.append(None)
            continue
        errors.append(predicted_ms(fit(others), point) / point["step_ms"] - 1)
    return errors


def project(model: dict[str, float], peaks: dict, card: Card) -> dict[str, float]:
    """`model` on `card`: its arithmetic and memory rates as the same fractions of `card`'s
    published peaks as they are of the measured device's (`peaks`); the per-call cost kept."""
    return {
        "per_call_s": model["per_call_s"],
        "per_flop_s": model["per_flop_s"] * peaks["tflops"] / card.tflops,
        "per_byte_s": model["per_byte_s"] * peaks["gb_per_s"] / card.gb_per_s,
    }


def streams_on(card: Card, weights_bytes: float) -> bool:
    """Whether a UNet of `weights_bytes` is over `card`'s budget for one part (it then streams
    block by block, which this model does not price)."""
    from app.core.advice import sizes

    return weights_bytes > sizes.card_budget(int(card.memory_gib * 2**30))


def analyse(document: dict) -> dict:
    """The fit over every point, each point's error in and out of it, and the projections."""
    points = document["points"]
    model = fit(points)
    peaks = document["peaks"]
    out = left_out_errors(points)
    rows = []
    for point, left_out in zip(points, out, strict=True):
        row = {
            "model": point["model"],
            "size": point["size"],
            "gflop": round(point["flops"] / 1e9, 3),
            "mb_moved": round(point["bytes"] / 1e6, 1),
            "calls": point["calls"],
            "step_ms": point["step_ms"],
            "model_ms": round(predicted_ms(model, point), 4),
            "error_left_out": None if left_out is None else round(left_out, 4),
            "projected_ms": {},
        }
        for key in TARGETS:
            card = PUBLISHED[key]
            row["projected_ms"][card.name] = {
                "ms": round(predicted_ms(project(model, peaks, card), point), 3),
                "streams": streams_on(card, point["weights_bytes"]),
            }
        rows.append(row)
    judged = [abs(e) for e in out if e is not None]
    worst = max(judged) if judged else None
    return {
        "fit": model,
        "arithmetic_tflops": _rate(model["per_flop_s"], 1e12),
        "memory_gb_per_s": _rate(model["per_byte_s"], 1e9),
        "per_call_us": round(model["per_call_s"] * 1e6, 3),
        "worst_error_left_out": None if worst is None else round(worst, 4),
        "within_target": None if worst is None else worst <= TARGET_ERROR,
        "rows": rows,
    }


def _rate(per_unit_s: float, unit: float) -> float | None:
    return None if per_unit_s <= 0 else round(1 / per_unit_s / unit, 3)


# --- the table ------------------------------------------------------------------------------


def _share(rate: float | None, peak: float) -> str:
    return "none fitted" if rate is None else f"{rate:g} ({rate / peak:.0%} of its peak)"


def docs_table(document: dict) -> str:
    """The section docs/benchmarks.md holds between the markers (markers excluded)."""
    fitted, peaks = document["fitted"], document["peaks"]
    worst = fitted["worst_error_left_out"]
    judged = (
        "not judged (too few points)"
        if worst is None
        else f"at most {worst:.1%} left out (target {TARGET_ERROR:.0%}): "
        + ("met" if fitted["within_target"] else "missed")
    )
    kind = "tiny models, a dry run: not a projection" if document["tiny"] else "full size"
    heads = [f"{PUBLISHED[k].name} ms" for k in TARGETS]
    lines = [
        f"Measured {document['measured_on']} on {machine_line(document['machine'])} "
        f"({kind}); the UNet's call on the CFG batch in {document['dtype']}, median of "
        f"{document['rounds']}. Fitted: {fitted['per_call_us']:g} us an operator, arithmetic "
        f"{_share(fitted['arithmetic_tflops'], peaks['tflops'])} TFLOP/s, memory "
        f"{_share(fitted['memory_gb_per_s'], peaks['gb_per_s'])} GB/s; the device's peaks: "
        f"{peaks['tflops']:g} TFLOP/s, {peaks['gb_per_s']:g} GB/s ({peaks['source']}). "
        f"Error: {judged}.",
        "",
        "| model | px | GFLOP | MB moved | operators | measured ms | model ms | error left out | "
        + " | ".join(heads)
        + " |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(heads),
    ]
    for row in fitted["rows"]:
        error = row["error_left_out"]
        cards = []
        for head in heads:
            projected = row["projected_ms"][head.removesuffix(" ms")]
            cards.append(f"{projected['ms']:.4g}" + (" (streams)" if projected["streams"] else ""))
        lines.append(
            f"| {row['model']} | {row['size']} | {row['gflop']:g} | {row['mb_moved']:g} | "
            f"{row['calls']} | {row['step_ms']:.4g} | {row['model_ms']:.4g} | "
            f"{'n/a' if error is None else format(error, '+.1%')} | " + " | ".join(cards) + " |"
        )
    lines += [
        "",
        "Peaks projected to (fp16 tensor throughput with fp32 accumulation, memory bandwidth): "
        + "; ".join(
            f"{c.name} {c.tflops:g} TFLOP/s, {c.gb_per_s:g} GB/s, {c.memory_gib:g} GB ({c.source})"
            for c in (PUBLISHED[k] for k in TARGETS)
        )
        + ". The per-operator cost is kept as measured (the host launching kernels). "
        '"(streams)": the UNet is over the card\'s budget for one part and streams block by '
        "block, which the model does not price.",
    ]
    return "\n".join(lines)


def write_docs(path: Path, section: str) -> None:
    """Replace what lies between the markers in `path` with `section`."""
    text = path.read_text(encoding="utf-8")
    begin, end = text.find(DOCS_BEGIN), text.find(DOCS_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"{path} has no cost-model section to replace (its markers are missing).")
    head = text[: begin + len(DOCS_BEGIN)]
    path.write_text(f"{head}\n{section}\n{text[end:]}", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="sd1,sdxl")
    parser.add_argument("--sizes", help="MODEL=PX/PX/...,... (default: sd1 256-768, sdxl 512-1024)")
    parser.add_argument(
        "--tiny", action="store_true", help=f"the tests' tiny models at {TINY_SIZES} px"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    parser.add_argument("--json")
    parser.add_argument("--docs", help="the file whose cost-model section is replaced")
    args = parser.parse_args()
    args.models = names(args.models, ["sd1", "sdxl"])
    asked, args.sizes = args.sizes, dict(DEFAULT_SIZES)
    for item in (asked or "").split(","):
        model, _, px = item.partition("=")
        if px:
            args.sizes[model.strip()] = tuple(int(p) for p in px.split("/"))
    if args.docs and not Path(args.docs).is_file():
        sys.exit(f"{args.docs} is not a file.")
    document = measure(args)
    document["measured_on"] = datetime.date.today().isoformat()
    document["fitted"] = analyse(document)
    if args.json:
        write_json(args.json, document)
    section = docs_table(document)
    print(section)
    if args.docs:
        write_docs(Path(args.docs), section)


if __name__ == "__main__":
    main()
