"""What a layer-level fix costs beside the fixes it replaces: one planted overflow in the UNet,
and side by side in one run

- no-half: everything in fp32;
- component fp32: the UNet (the component that overflows) in fp32, the rest in half precision;
- islands: the UNet in half precision with only the layers the check would keep wider in fp32
  (drawn as the health check draws them: `layer_islands.overflow_islands` over an fp32 probe's
  per-layer peaks);
- half: everything in half precision, the overflow left in (a floor: the fix cannot be cheaper).

Half precision is fp16 on CUDA. On a CPU it is bf16: PyTorch's fp16 convolutions on a CPU are
many times slower than fp32 (no fp16 kernels), so fp16 timings there say nothing about the GPUs
this fix is for; bf16 has the same 2 bytes per weight and native kernels on CPUs with
AVX512-BF16/AMX. bf16 does not overflow at 65504, so on a CPU the "half" row is finite and the
figures measure what the islands cost (their casts, their fp32 layers and the fp32 values they
hand on), not whether they fix anything; the tests prove that.

Measured: one UNet call on the CFG batch (2 latents) at the model's native size, after a
warm-up per plan (which also measures peak working memory, benchmarks.common.PeakMemory), then
rounds alternating between the plans; median and range. Weights are the whole model's under
each plan, islands counted (`precision.plan_weights_mb`). Agreement: each plan's UNet output
against no-half's, SNR in dB (`quality.snr_db`).

Usage: python benchmarks/islands.py [--device cpu|cuda] [--model sd1|sdxl|demo] [--size PX]
       [--rounds R] [--half fp16|bf16] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from common import (
    NATIVE_SIZE,
    PeakMemory,
    bench_model,
    emit,
    machine,
    release_device_memory,
    status,
    timed,
)

PLANTED = "down_blocks.0.resnets.0.conv1"  # scaled so that its output passes 65504
FACTOR = 1e6


def _inputs(model, size: int, device, generator):
    import torch

    unet = model.pipeline.unet
    latent = size // 8
    sample = torch.randn(2, unet.config.in_channels, latent, latent, generator=generator)
    context = torch.randn(2, 77, unet.config.cross_attention_dim, generator=generator)
    inputs = {"sample": sample, "timestep": torch.tensor(500.0), "encoder_hidden_states": context}
    if unet.config.addition_embed_type == "text_time":  # SDXL
        pooled = model.pipeline.text_encoder_2.config.projection_dim
        inputs["added_cond_kwargs"] = {
            "text_embeds": torch.randn(2, pooled, generator=generator),
            "time_ids": torch.tensor([[size, size, 0, 0, size, size]] * 2, dtype=torch.float32),
        }
    return {k: _to(v, device) for k, v in inputs.items()}


def _to(value, device):
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value.to(device)


def run(args) -> dict:
    import torch

    from app.core import hardware
    from app.core.fixing import layer_islands
    from app.core.fixing.quality import snr_db
    from app.core.precision import (
        PlacedPipeline,
        backend_flags,
        pipeline_components,
        plan_weights_mb,
        resolve_plan,
    )
    from app.core.run.probe import ActivationRecorder
    from app.core.settings import PrecisionSettings

    device = hardware.pick_device(args.device)
    half = args.half or ("fp16" if device.type == "cuda" else "bf16")
    size = args.size or NATIVE_SIZE[args.model]
    with status(f"building {args.model}"):
        model = bench_model(args.model, "fp32")
    pipeline = model.pipeline
    with torch.no_grad():
        pipeline.unet.get_submodule(PLANTED).weight.mul_(FACTOR)
    inputs = _inputs(model, size, device, torch.Generator().manual_seed(0))
    components = pipeline_components(pipeline)

    def plan(**settings):
        return resolve_plan(PrecisionSettings(**settings), device=device, components=components)

    reference_plan = plan(no_half=True)
    with status("probing the UNet in fp32 (per-layer peaks)"):
        placed = PlacedPipeline(pipeline, replace(reference_plan, dtypes={"unet": "fp32"}))
        recorder = ActivationRecorder(placed["unet"])
        with backend_flags(reference_plan), torch.inference_mode():
            reference = placed["unet"](**inputs, return_dict=False)[0].float().cpu()
        recorder.remove()
        probe = recorder.read(reference)
        islands = layer_islands.overflow_islands(probe, placed["unet"]) or []
        placed.release()
        del placed
    fp32_layers = [f"unet:{p}" for p in islands]
    plans = {
        "no_half": reference_plan,
        "component_fp32": plan(precision=half, unet_precision="fp32"),
        "islands": plan(precision=half, fp32_modules=tuple(fp32_layers)),
        "half": plan(precision=half),
    }
    words = {
        "no_half": "no-half (everything fp32)",
        "component_fp32": f"UNet fp32, rest {half}",
        "islands": f"{half}, with {len(islands)} UNet layers in fp32",
        "half": f"{half} everywhere (overflow left in)",
    }
    weights = {k: plan_weights_mb(p, pipeline) for k, p in plans.items()}
    # Only the UNet is placed: it is what a step runs.
    unet_plans = {k: replace(p, dtypes={"unet": p.dtypes["unet"]}) for k, p in plans.items()}
    placed = {k: PlacedPipeline(pipeline, p) for k, p in unet_plans.items()}

    def step(key):
        unet = placed[key]["unet"]
        with backend_flags(unet_plans[key]), torch.inference_mode():
            return unet(**inputs, return_dict=False)[0]

    peaks, snr, finite = {}, {}, {}
    for key in plans:
        with status(f"warm-up: {words[key]}"):
            with PeakMemory(device) as peak:
                out = step(key)
            peaks[key] = peak.mib
            finite[key] = bool(torch.isfinite(out).all())
            snr[key] = snr_db(out.float().cpu(), reference)
    samples: dict[str, list[float]] = {k: [] for k in plans}
    for round_ in range(args.rounds):
        with status(f"round {round_ + 1} of {args.rounds}"):
            for key in plans:
                samples[key].append(timed(lambda key=key: step(key), device) * 1000)
    for p in placed.values():
        p.release()
    release_device_memory()
    rows = {
        key: {
            "words": words[key],
            "step_ms": round(statistics.median(samples[key]), 1),
            "step_ms_range": [round(min(samples[key]), 1), round(max(samples[key]), 1)],
            "working_memory_mb": None if peaks[key] is None else round(peaks[key], 1),
            "weights_mb": round(weights[key], 1),
            "finite": finite[key],
            "snr_db_vs_no_half": round(snr[key], 1),
        }
        for key in plans
    }
    return {
        "machine": machine(str(device)),
        "model": args.model,
        "size": size,
        "half": half,
        "planted": f"unet:{PLANTED} x{FACTOR:g}",
        "islands": fp32_layers,
        "rounds": args.rounds,
        "rows": rows,
    }


def table(document: dict) -> str:
    lines = [
        f"{document['model']} at {document['size']} px, UNet step on the CFG batch, "
        f"{document['rounds']} rounds; half precision = {document['half']}; planted "
        f"{document['planted']}; islands: {', '.join(document['islands']) or 'none'}",
        f"{'plan':<36}{'ms per step (range)':>26}{'working MB':>12}{'weights MB':>12}"
        f"{'finite':>8}{'SNR dB':>8}",
    ]
    for row in document["rows"].values():
        spread = (
            f"{row['step_ms']:.0f} ({row['step_ms_range'][0]:.0f}-{row['step_ms_range'][1]:.0f})"
        )
        memory = "-" if row["working_memory_mb"] is None else f"{row['working_memory_mb']:.0f}"
        lines.append(
            f"{row['words']:<36}{spread:>26}{memory:>12}{row['weights_mb']:>12.0f}"
            f"{'yes' if row['finite'] else 'no':>8}{row['snr_db_vs_no_half']:>8.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="sd1", choices=tuple(NATIVE_SIZE))
    parser.add_argument("--size", type=int)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--half",
        choices=("fp16", "bf16"),
        help="the half precision (default: fp16 on CUDA, bf16 on a CPU)",
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    document = run(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
