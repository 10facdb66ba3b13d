"""What a check whose UNet overflows holds in memory while it places its copies, at real size:
the whole pipeline placed for every plan (as HalfSafe placed it before) against one stage's
components at a time (as it places them now), side by side in one run.

The model is SD1.5 or SDXL with random weights at the published shapes, stored in fp16 as most
files are (memory does not depend on the values). The check's placements are replayed in the
order it makes them when the UNet fails: the first probe at fp16 stage by stage (text encoders,
UNet, VAE), the fp32 reference of the UNet's stage, then its candidates (two layers of the UNet
kept in fp32, the UNet in bf16, the UNet in fp32), then the VAE's stage. Nothing runs: these
are the weights' bytes, not activations.

A third strategy adds a memory budget of 2 GiB (`--max-vram 2`): the UNet in fp32 would not fit,
so it keeps its fp16 weights and computes in fp32 layer by layer. One UNet call (CFG batch, at
`--size`) is timed resident in fp32 and computed in place, and their outputs compared.

Two figures per strategy:
- device: the most the placed components held at once (`PlacedPipeline.peak_bytes`), shared
  tensors included: what a GPU would hold of them, counted the same way on a CPU;
- RAM: the process's resident peak over the replay (`common.PeakMemory`): on a CPU, the copies
  made beside the loaded model (a component in its stored dtype is shared, not copied).

Usage: python benchmarks/placement_memory.py [--model sd1|sdxl] [--json FILE]
"""

from __future__ import annotations

import argparse

from common import (
    PeakMemory,
    bench_model,
    emit,
    machine,
    machine_line,
    release_device_memory,
    status,
)

ISLANDS = ("down_blocks.0.resnets.0.conv1", "down_blocks.0.resnets.0.conv2")
GIB = 2**30


def replay(model, whole_pipeline: bool, budget_mb: float | None = None) -> dict:
    """The check's placements in order; (peak device bytes, peak RAM MiB, the steps)."""
    from app.core.precision import PrecisionPlan, placement

    fp16 = PrecisionPlan(
        device="cpu",
        dtypes={n: "fp16" for n in ("text_encoder", *_second(model), "unet", "vae")},
        memory_budget_mb=budget_mb,
    )
    encoders = ["text_encoder", *_second(model)]
    steps = [
        ("first probe: text encoders", fp16, encoders),
        ("first probe: UNet", fp16, ["unet"]),
        ("fp32 reference of the UNet", fp16.with_dtypes(unet="fp32"), ["unet"]),
        (
            "candidate: 2 UNet layers in fp32",
            fp16.with_modules("unet", {layer: "fp32" for layer in ISLANDS}),
            ["unet"],
        ),
        ("candidate: UNet in bf16", fp16.with_dtypes(unet="bf16"), ["unet"]),
        ("candidate: UNet in fp32", fp16.with_dtypes(unet="fp32"), ["unet"]),
        ("VAE", fp16.with_dtypes(unet="fp32"), ["vae"]),
    ]
    held = []
    with PeakMemory("cpu") as ram:
        placed = placement.PlacedPipeline(model.pipeline, fp16, components=())
        for words, plan, components in steps:
            placed.apply(plan, None if whole_pipeline else components)
            held.append({"step": words, "device_gib": round(placed.placed_bytes / GIB, 2)})
        peak = placed.peak_bytes
        placed.release()
    release_device_memory()
    return {"device_gib": round(peak / GIB, 2), "ram_mib": ram.mib, "steps": held}


def _second(model) -> list[str]:
    return ["text_encoder_2"] if getattr(model.pipeline, "text_encoder_2", None) else []


def run(args) -> dict:
    from app.core.precision.placement import tensor_bytes

    with status(f"Building the {args.model} model with random weights, stored in fp16"):
        model = bench_model(args.model, dtype="fp16")
    stored = {
        name: round(tensor_bytes(getattr(model.pipeline, name)) / GIB, 2)
        for name in ("text_encoder", *_second(model), "unet", "vae")
    }
    results = {}
    strategies = (
        ("whole pipeline per plan", True, None),
        ("one stage at a time", False, None),
        ("one stage, 2 GiB budget", False, 2048.0),
    )
    for label, whole, budget in strategies:
        with status(f"Replaying the check's placements: {label}"):
            results[label] = replay(model, whole, budget)
    with status(f"Timing one UNet call at {args.size} px, resident fp32 and computed in place"):
        call = unet_call(model, args.size)
    return {
        "machine": machine("cpu"),
        "model": args.model,
        "stored_gib": stored,
        "results": results,
        "unet_call": call,
    }


def unet_call(model, size: int) -> dict:
    """One UNet call (CFG batch) in fp32: resident, and from the fp16 weights in place."""
    import time

    import torch

    from app.core.fixing.quality import snr_db
    from app.core.precision import PrecisionPlan, placement

    unet = model.pipeline.unet
    generator = torch.Generator().manual_seed(0)
    latent = size // 8
    inputs = {
        "sample": torch.randn(2, unet.config.in_channels, latent, latent, generator=generator),
        "timestep": torch.tensor(500.0),
        "encoder_hidden_states": torch.randn(
            2, 77, unet.config.cross_attention_dim, generator=generator
        ),
    }
    if unet.config.addition_embed_type == "text_time":
        pooled = model.pipeline.text_encoder_2.config.projection_dim
        inputs["added_cond_kwargs"] = {
            "text_embeds": torch.randn(2, pooled, generator=generator),
            "time_ids": torch.tensor([[size, size, 0, 0, size, size]] * 2, dtype=torch.float32),
        }
    figures, outputs = {}, {}
    for label, budget in (("resident", None), ("in place", 1.0)):
        plan = PrecisionPlan(
            device="cpu",
            dtypes={n: "fp32" for n in ("text_encoder", *_second(model), "unet", "vae")},
            memory_budget_mb=budget,
        )
        placed = placement.PlacedPipeline(model.pipeline, plan, components=["unet"])
        with torch.inference_mode():
            placed["unet"](**inputs)  # warm-up
            begun = time.perf_counter()
            outputs[label] = placed["unet"](**inputs).sample
            seconds = time.perf_counter() - begun
        figures[label] = {
            "seconds": round(seconds, 2),
            "device_gib": round(placed.placed_bytes / GIB, 2),
        }
        placed.release()
    same = bool(torch.equal(outputs["resident"], outputs["in place"]))
    snr = snr_db(outputs["in place"], outputs["resident"])
    return {"size": size, **figures, "identical": same, "snr_db": snr}


def table(document: dict) -> str:
    lines = [
        f"{document['model']}, stored in fp16 (GiB per component: "
        + ", ".join(f"{k} {v}" for k, v in document["stored_gib"].items())
        + f"); {machine_line(document['machine'])}",
        "",
        f"{'strategy':<26}{'device peak GiB':>16}{'RAM peak MiB':>14}",
    ]
    for label, figures in document["results"].items():
        ram = "-" if figures["ram_mib"] is None else f"{figures['ram_mib']:.0f}"
        lines.append(f"{label:<26}{figures['device_gib']:>16.2f}{ram:>14}")
    lines.append("")
    lines.append("Device GiB held after each placement:")
    labels = list(document["results"])
    lines.append(f"  {'step':<36}" + "".join(f"{label:>26}" for label in labels))
    rows = zip(*(document["results"][label]["steps"] for label in labels), strict=True)
    for row in rows:
        lines.append(f"  {row[0]['step']:<36}" + "".join(f"{s['device_gib']:>26.2f}" for s in row))
    call = document["unet_call"]
    outcome = "identical" if call["identical"] else f"differ: {call['snr_db']:.1f} dB"
    lines.append("")
    lines.append(
        f"One UNet call in fp32 at {call['size']} px: resident {call['resident']['seconds']} s "
        f"holding {call['resident']['device_gib']} GiB; in place from fp16 "
        f"{call['in place']['seconds']} s holding {call['in place']['device_gib']} GiB; "
        f"outputs {outcome}."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sd1", choices=("sd1", "sdxl"))
    parser.add_argument("--size", type=int, default=256, help="the UNet call's size in px")
    parser.add_argument("--json")
    args = parser.parse_args()
    document = run(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
