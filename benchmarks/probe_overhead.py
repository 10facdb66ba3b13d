"""What the health check's activation recorder adds to a denoiser step, by the reduction it
makes of each tensor: the UNet's forward pass bare, hooked with the full recorder's own
reduction (`probe.extremes`: on a CPU each tensor's smallest and largest value in one pass, on
CUDA the infinity norm), hooked with the infinity norm accumulated in fp32 instead, and hooked
with the lean recorder (outputs only, one reduction a module call), alternating in one run.

The full runs use the recorder as it is (each call's tensors combined once, at `read()`); only
the per-tensor reduction differs. On a GPU the recorder is launch-bound (SD1.5's UNet
runs about 700 modules a step), so one kernel a tensor may pay there; on a CPU the norm's
kernel is the slower one. The figures decide which the recorder uses on each device.

Usage: python benchmarks/probe_overhead.py [--device cpu|cuda] [--models demo,sd1]
       [--dtype fp32|fp16|bf16] [--size PX] [--rounds N] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics

from common import NATIVE_SIZE, bench_model, emit, machine, names, status, timed


def _norm_extremes(tensor):
    """The infinity norm of a tensor, accumulated in fp32."""
    import torch

    return [torch.linalg.vector_norm(tensor.detach(), float("inf"), dtype=torch.float32)]


def bench(name: str, args) -> dict:
    import torch

    from app.core.precision.plan import torch_dtype
    from app.core.run import probe
    from app.core.run.probe import ActivationRecorder

    device = torch.device(args.device)
    dtype = torch_dtype(args.dtype)
    model = bench_model(name, args.dtype)
    unet = model.pipeline.unet.to(device=device, dtype=dtype).eval()
    size = args.size or NATIVE_SIZE[name]
    latent = size // 8
    generator = torch.Generator().manual_seed(0)
    sample = torch.randn(2, unet.config.in_channels, latent, latent, generator=generator)
    width = unet.config.cross_attention_dim
    context = torch.randn(2, 77, width, generator=generator)
    inputs = (sample.to(device, dtype), torch.tensor(500, device=device), context.to(device, dtype))
    own = probe.extremes

    def step(hooked: str | None):
        def run():
            with torch.inference_mode():
                if hooked is None:
                    unet(*inputs)
                    return
                probe.extremes = _norm_extremes if hooked == "norm" else own
                try:
                    with ActivationRecorder(unet, lean=hooked == "lean") as recorder:
                        out = unet(*inputs).sample
                    recorder.read(out)
                finally:
                    probe.extremes = own

        return run

    cases = {"bare": step(None), "own": step("own"), "norm": step("norm"), "lean": step("lean")}
    for run in cases.values():  # warm-up: kernel selection, allocator, first-call costs
        run()
    samples: dict[str, list[float]] = {key: [] for key in cases}
    for _ in range(args.rounds):  # alternating, so a change in the machine's load hits each
        for key, run in cases.items():
            samples[key].append(timed(run, device))
    medians = {key: statistics.median(values) for key, values in samples.items()}
    bare = medians["bare"]
    modules = sum(1 for _ in unet.modules())
    return {
        "model": name,
        "size": size,
        "dtype": args.dtype,
        "modules": modules,
        "rounds": args.rounds,
        "bare_s": round(bare, 4),
        "own_s": round(medians["own"], 4),
        "norm_s": round(medians["norm"], 4),
        "lean_s": round(medians["lean"], 4),
        "own_overhead": round(medians["own"] / bare - 1, 3),
        "norm_overhead": round(medians["norm"] / bare - 1, 3),
        "lean_overhead": round(medians["lean"] / bare - 1, 3),
        "spread_s": {k: [round(min(v), 4), round(max(v), 4)] for k, v in samples.items()},
    }


def table(document: dict) -> str:
    lines = [
        f"{'model':<6} {'size':>5} {'dtype':<5} {'modules':>7} {'bare s':>8} {'own s':>9} "
        f"{'norm s':>8} {'lean s':>8} {'own':>8} {'norm':>8} {'lean':>8}",
        "-" * 96,
    ]
    for r in document["results"]:
        lines.append(
            f"{r['model']:<6} {r['size']:>5} {r['dtype']:<5} {r['modules']:>7} "
            f"{r['bare_s']:>8.3f} {r['own_s']:>9.3f} {r['norm_s']:>8.3f} {r['lean_s']:>8.3f} "
            f"{r['own_overhead']:>+8.1%} {r['norm_overhead']:>+8.1%} {r['lean_overhead']:>+8.1%}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="demo,sd1")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "bf16"))
    parser.add_argument("--size", type=int, help="px (default: each model's native size)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    for name in names(args.models, tuple(NATIVE_SIZE)):
        with status(f"recorder overhead: {name} ({args.dtype})"):
            rows.append(bench(name, args))
    document = {"benchmark": "probe_overhead", "machine": machine(args.device), "results": rows}
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
