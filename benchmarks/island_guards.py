"""What an island's guards cost the user's generation per UNet step: the layer-level fix of one
planted overflow, its guards on every layer of the UNet (as they were placed before) against its
guards only where the islands' wider values arrive (`placement.Guards`), beside half precision
without islands (the floor).

Half precision is fp16 on CUDA and bf16 on a CPU (see `islands.py` for why); the islands are fp32.
The islands are those the check draws for the planted layer (its `norm2` with it), named here
rather than probed, to keep the run short. Each placed UNet runs one warm-up call first (which
also settles its guards), then rounds alternate between the plans; median and range. Guard calls
are counted per step (`Guards.calls`): counts do not depend on the machine. The outputs of the two
island rows are compared bit for bit.

`--tiny` runs the tests' tiny pipeline of the model's architecture instead (a dry run).

Usage: python benchmarks/island_guards.py [--device cpu|cuda] [--model sd1|sdxl|demo]
       [--size PX] [--rounds R] [--half fp16|bf16] [--tiny] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics

from common import NATIVE_SIZE, bench_model, emit, machine, model_size, status, timed
from islands import FACTOR, PLANTED, _inputs

PLANS = {
    "half": "half precision everywhere (no islands: the floor)",
    "everywhere": "islands, every layer guarded (before)",
    "downstream": "islands, guards where wider values arrive",
}


def run(args) -> dict:
    import torch

    from app.core import hardware
    from app.core.precision import PlacedPipeline, backend_flags, resolve_plan
    from app.core.settings import PrecisionSettings

    device = hardware.pick_device(args.device)
    half = args.half or ("fp16" if device.type == "cuda" else "bf16")
    size = model_size(args.model, args.size, args.tiny)
    with status(f"building {args.model}"):
        model = bench_model(args.model, "fp32", tiny=args.tiny)
    pipeline = model.pipeline
    with torch.no_grad():
        pipeline.unet.get_submodule(PLANTED).weight.mul_(FACTOR)
    inputs = _inputs(model, size, device, torch.Generator().manual_seed(0))
    islands = (f"unet:{PLANTED}", f"unet:{PLANTED.replace('conv1', 'norm2')}")
    plans = {
        "half": resolve_plan(PrecisionSettings(precision=half), device=device, components=["unet"]),
        "everywhere": resolve_plan(
            PrecisionSettings(precision=half, fp32_modules=islands),
            device=device,
            components=["unet"],
        ),
    }
    plans["downstream"] = plans["everywhere"]
    placed, guards, first = {}, {}, {}
    for key, plan in plans.items():
        placed[key] = PlacedPipeline(pipeline, plan, ["unet"])
        guards[key] = getattr(placed[key]["unet"], "_halfsafe_guards", None)
    # Before: no guard was ever dropped, every layer's was kept.
    guards["everywhere"]._settle = lambda: None

    def step(key):
        with backend_flags(plans[key]), torch.inference_mode():
            return placed[key]["unet"](**inputs, return_dict=False)[0]

    for key in plans:
        with status(f"warm-up: {PLANS[key]}"):
            first[key] = step(key)
    calls_before = {k: g.calls if g else 0 for k, g in guards.items()}
    samples: dict[str, list[float]] = {k: [] for k in plans}
    for round_ in range(args.rounds):
        with status(f"round {round_ + 1} of {args.rounds}"):
            for key in plans:
                samples[key].append(timed(lambda key=key: step(key), device) * 1000)
    floor = statistics.median(samples["half"])
    rows = {}
    for key in plans:
        calls = (guards[key].calls - calls_before[key]) if guards[key] else 0
        median = statistics.median(samples[key])
        rows[key] = {
            "words": PLANS[key],
            "step_ms": round(median, 1),
            "step_ms_range": [round(min(samples[key]), 1), round(max(samples[key]), 1)],
            "over_half": round(median / floor - 1, 4),
            "guard_calls_per_step": calls // args.rounds,
            "guarded_layers": guards[key].attached if guards[key] else 0,
        }
    return {
        "machine": machine(str(device)),
        "model": args.model,
        "tiny": args.tiny,
        "size": size,
        "half": half,
        "islands": list(islands),
        "layers_with_weights": len(guards["everywhere"].layers) + len(islands),
        "rounds": args.rounds,
        "same_output_bit_for_bit": bool(torch.equal(first["everywhere"], first["downstream"])),
        "guard_us_per_call": round(hook_cost_us(), 2),
        "rows": rows,
    }


def hook_cost_us(calls: int = 20000) -> float:
    """What one guard costs a layer call whose inputs already match, in microseconds: a small
    linear layer called with and without a guard, alternating blocks of calls (the layer's own
    work cancels out)."""
    import time

    import torch

    from app.core.precision import placement

    layer = torch.nn.Linear(8, 8)
    bare = torch.nn.Linear(8, 8)
    guards = placement.Guards(torch.nn.Sequential(layer), [layer])
    layer._halfsafe_dtype = torch.float32
    x = torch.randn(1, 8)
    spent = {"guarded": 0.0, "bare": 0.0}
    with torch.inference_mode():
        for _ in range(10):
            for name, module in (("guarded", layer), ("bare", bare)):
                began = time.perf_counter()
                for _ in range(calls // 10):
                    module(x)
                spent[name] += time.perf_counter() - began
    assert guards.calls == calls
    return (spent["guarded"] - spent["bare"]) / calls * 1e6


def table(document: dict) -> str:
    lines = [
        f"{document['model']} at {document['size']} px, UNet step on the CFG batch, "
        f"{document['rounds']} rounds; half = {document['half']}; islands: "
        f"{', '.join(document['islands'])}; {document['layers_with_weights']} layers with "
        f"weights; island rows equal bit for bit: {document['same_output_bit_for_bit']}; "
        f"one guard: {document['guard_us_per_call']} us a call",
        f"{'plan':<46}{'ms per step (range)':>26}{'vs half':>9}{'guard calls/step':>18}",
    ]
    for row in document["rows"].values():
        low, high = row["step_ms_range"]
        spread = f"{row['step_ms']:.1f} ({low:.1f}-{high:.1f})"
        lines.append(
            f"{row['words']:<46}{spread:>26}{row['over_half']:>+9.1%}"
            f"{row['guard_calls_per_step']:>18}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="sd1", choices=tuple(NATIVE_SIZE))
    parser.add_argument("--size", type=int)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--half", choices=("fp16", "bf16"))
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny pipeline")
    parser.add_argument("--json")
    args = parser.parse_args()
    document = run(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
