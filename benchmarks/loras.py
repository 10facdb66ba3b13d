"""LoRA and cause-attribution benchmark, side by side in one run: what reading, scanning and
applying a LoRA costs, what an unmerged LoRA adapter adds to a UNet step, and what telling a
failure's cause apart costs next to the check itself.

A rank-16 LoRA in kohya layout on every attention and feed-forward projection of the model's
UNet and text encoder (random factors, as many tensors as a real one for that model). Step
times alternate LoRA off and on, round by round. The attribution cases plant one fault each:
the same LoRA with one NaN element (weights), and an attention processor that returns NaN
(kernel); each reports the check's time and the attribution's, and how many passes of the
check's three stages the attribution ran.

Usage: python benchmarks/loras.py [--device cpu|cuda] [--models demo,sd1] [--size PX]
       [--rounds N] [--json FILE]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import NATIVE_SIZE, bench_model, emit, machine, names, spread, status, sync

RANK = 16
_ENDINGS = (
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "ff.net.0.proj",
    "ff.net.2",
    "q_proj",
    "k_proj",
    "v_proj",
    "out_proj",
    "fc1",
    "fc2",
)


def kohya_lora(pipeline, nan: bool = False) -> dict:
    import torch

    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for prefix, module in (("lora_unet_", pipeline.unet), ("lora_te_", pipeline.text_encoder)):
        for name, layer in module.named_modules():
            if not (isinstance(layer, torch.nn.Linear) and name.endswith(_ENDINGS)):
                continue
            key = prefix + ("text_model_" if prefix == "lora_te_" else "") + name.replace(".", "_")
            tensors[f"{key}.lora_down.weight"] = torch.randn(
                RANK, layer.in_features, generator=generator
            ) * (layer.in_features**-0.5)
            tensors[f"{key}.lora_up.weight"] = (
                torch.randn(layer.out_features, RANK, generator=generator) * 0.01
            )
            tensors[f"{key}.alpha"] = torch.tensor(float(RANK))
    if nan:
        first = next(k for k in tensors if k.endswith("lora_up.weight"))
        tensors[first][0, 0] = float("nan")
    return tensors


def unet_step_ms(model, plan, size: int, device, rounds: int, loras) -> dict:
    """One UNet call with the CFG batch, LoRA off and on alternately."""
    import torch

    from app.core.lora import files as lora
    from app.core.precision import PlacedPipeline, backend_flags

    placed = PlacedPipeline(model.pipeline, plan)
    unet = placed["unet"]
    sample = torch.randn(2, unet.config.in_channels, size // 8, size // 8, device=device)
    hidden = torch.randn(2, 77, unet.config.cross_attention_dim, device=device)
    times: dict[str, list[float]] = {"off": [], "on": []}

    def step():
        with backend_flags(plan), torch.inference_mode():
            unet(sample.to(unet.dtype), 500, encoder_hidden_states=hidden.to(unet.dtype))

    for which in ("off", "on", "off", "on"):  # warm-up both
        lora.use_weights(model.pipeline, loras if which == "on" else [])
        step()
    for _ in range(rounds):
        for which in ("off", "on"):
            lora.use_weights(model.pipeline, loras if which == "on" else [])
            sync(device)
            started = time.perf_counter()
            step()
            sync(device)
            times[which].append((time.perf_counter() - started) * 1000)
    placed.release()
    lora.use_weights(model.pipeline, loras)
    return {which: spread(values, 2) for which, values in times.items()}


def attribution_case(model, size: int, device: str, plant) -> dict:
    """Check, then attribute; the passes of the three stages the attribution ran."""
    from app.core import health
    from app.core.causes import attribution
    from app.core.health.request import CheckRequest, CheckRun
    from app.core.settings import PrecisionSettings

    settings = PrecisionSettings(precision="fp16" if device.startswith("cuda") else "fp32")
    request = CheckRequest(precision=settings, device=device, size=size)
    counted = {"runs": 0}
    real_run = attribution.probe_run

    def counting(*args, **kwargs):
        counted["runs"] += 1
        return real_run(*args, **kwargs)

    with plant():
        started = time.perf_counter()
        report = health.check_loaded(
            model, request, run=CheckRun(remember=False, measure_cost=False)
        )
        checked = time.perf_counter() - started
        attribution.probe_run = counting
        try:
            started = time.perf_counter()
            cause = attribution.attribute(model, report, request)
            attributed = time.perf_counter() - started
        finally:
            attribution.probe_run = real_run
    return {
        "check_s": round(checked, 3),
        "attribution_s": round(attributed, 3),
        "passes": counted["runs"],
        "cause": cause.kind if cause else None,
        "verified": bool(cause and cause.verified),
    }


def bench(name: str, args) -> dict:
    import contextlib

    import torch

    from app.core import hardware, precision
    from app.core.checkpoint import write_safetensors
    from app.core.fixing import job_plans
    from app.core.lora import files as lora
    from app.core.settings import PrecisionSettings

    device = torch.device(args.device)
    size = args.size or NATIVE_SIZE[name]
    row: dict = {"model": name, "size": size}
    with tempfile.TemporaryDirectory() as folder:
        model = bench_model(name)
        path = write_safetensors(Path(folder) / "style.safetensors", kohya_lora(model.pipeline))
        row["lora_mb"] = round(path.stat().st_size / 1e6, 1)
        started = time.perf_counter()
        file = lora.read_lora(path)
        row["read_and_scan_s"] = round(time.perf_counter() - started, 3)
        started = time.perf_counter()
        applied = lora.apply_loras(model.pipeline, [(file, 0.8)])
        row["apply_s"] = round(time.perf_counter() - started, 3)
        row["tensors"] = len(file.tensors)
        info = hardware.describe_device(device)
        dtype = "fp16" if device.type == "cuda" else "fp32"
        plan = job_plans.plan_for_model(
            model,
            PrecisionSettings(precision=dtype),
            device=device,
            device_info=info,
            remembered=None,
        )
        row["unet_step_ms"] = unet_step_ms(model, plan, size, device, args.rounds, applied)

        nan_model = bench_model(name)
        nan_path = write_safetensors(
            Path(folder) / "melted.safetensors", kohya_lora(nan_model.pipeline, nan=True)
        )
        nan_model.loras = lora.apply_loras(nan_model.pipeline, [(lora.read_lora(nan_path), 0.8)])
        row["nan_lora"] = attribution_case(
            nan_model, size, args.device, lambda: contextlib.nullcontext()
        )

        @contextlib.contextmanager
        def broken_sdpa():
            real = precision.SafeAttnProcessor.__call__

            def broken(self, attn, hidden_states, *a, **k):
                return real(self, attn, hidden_states, *a, **k) * float("nan")

            precision.SafeAttnProcessor.__call__ = broken
            try:
                yield
            finally:
                precision.SafeAttnProcessor.__call__ = real

        row["kernel"] = attribution_case(bench_model(name), size, args.device, broken_sdpa)
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| model | size | LoRA tensors (MB) | read + scan | apply | UNet step, LoRA off | "
        "UNet step, LoRA on (unmerged) | NaN LoRA: check / attribution (passes) | "
        "kernel fault: check / attribution (passes) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        off, on = r["unet_step_ms"]["off"], r["unet_step_ms"]["on"]
        cases = []
        for key in ("nan_lora", "kernel"):
            c = r[key]
            cases.append(
                f"{c['check_s']:.2f} s / {c['attribution_s']:.2f} s ({c['passes']}; "
                f"{c['cause']}{', verified' if c['verified'] else ''})"
            )
        lines.append(
            f"| {r['model']} | {r['size']} | {r['tensors']} ({r['lora_mb']}) | "
            f"{r['read_and_scan_s']:.3f} s | {r['apply_s']:.3f} s | "
            f"{off['median']:.1f} ms ({off['min']:.1f}-{off['max']:.1f}) | "
            f"{on['median']:.1f} ms ({on['min']:.1f}-{on['max']:.1f}) | {cases[0]} | {cases[1]} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", help="comma-separated: demo, sd1 (default: demo)")
    parser.add_argument("--size", type=int, help="probe and step size in px (default: native)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    rows = []
    for name in names(args.models, ("demo",)):
        with status(f"LoRAs and causes on {name}"):
            rows.append(bench(name, args))
    document = {"machine": machine(args.device), "loras": rows}
    emit(document, table(rows), args.json)


if __name__ == "__main__":
    main()
