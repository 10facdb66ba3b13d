"""Flux.1, Chroma, SD3.5, Z-Image and Qwen-Image on the CPU at tiny size: the health check after
load next to one 20-step generation (the plain diffusers pipeline, same size, same plan), for the
Flux.1 dev (guidance embedding) and schnell shapes, Chroma (T5 only, real CFG), the SD3.5 shapes
(MMDiT, CFG batch; `sd3.5-medium`: SD3.5 Medium's second attention in the first block), Z-Image
(Qwen3, single stream; generated as Turbo runs, without CFG) and Qwen-Image (Qwen2.5-VL, MMDiT,
real CFG).

The tiny pipelines are the test suite's (tests/support/tiny_models.py:
`build_tiny_flux_pipeline`, `build_tiny_sd3_pipeline`, `build_tiny_zimage_pipeline`, ...): the
ratio says how the check's stages (text encoders once, 3 transformer steps, one VAE decode)
compare with a generation's 20 steps; absolute times at this size are dominated by per-call
overheads.

Usage: python benchmarks/flux.py [--sizes 64,128] [--repeats 3]
       [--models flux-dev,flux-schnell,chroma,sd3.5,sd3.5-medium,zimage,qwenimage] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics

from common import emit, machine, timed


def bench(shape: str, size: int, repeats: int) -> dict:
    import torch

    from app.core import health
    from app.core.checkpoint import scan_weights
    from app.core.health.request import CheckRequest, CheckRun
    from app.core.models import LoadedModel
    from app.core.precision import PlacedPipeline, backend_flags
    from app.core.settings import PrecisionSettings
    from tests.support.tiny_models import (
        build_tiny_chroma_pipeline,
        build_tiny_flux_pipeline,
        build_tiny_qwenimage_pipeline,
        build_tiny_sd3_pipeline,
        build_tiny_zimage_pipeline,
    )

    if shape.startswith("sd3.5"):
        pipeline = build_tiny_sd3_pipeline(medium=shape == "sd3.5-medium")
    elif shape == "chroma":
        pipeline = build_tiny_chroma_pipeline()
    elif shape == "zimage":
        pipeline = build_tiny_zimage_pipeline()
    elif shape == "qwenimage":
        pipeline = build_tiny_qwenimage_pipeline()
    else:
        pipeline = build_tiny_flux_pipeline(guidance=shape == "flux-dev")
    model = LoadedModel(
        pipeline=pipeline,
        source="<tiny flux>",
        name="tiny-flux",
        format="demo",
        architecture="sd3" if shape.startswith("sd3.5") else shape,
        prediction_type="flow",
        native_size=size,
        stored_dtype="fp32",
        model_hash=None,
        profile_key=f"bench-tiny-{shape}",
        weights=scan_weights(pipeline),
        detected_because="benchmark",
    )
    settings = PrecisionSettings(precision="fp32")

    def check():
        return health.check_loaded(
            model,
            CheckRequest(precision=settings, device="cpu", size=size),
            run=CheckRun(remember=False),
        )

    report = check()  # warm-up
    placed = PlacedPipeline(pipeline, report.plan)
    pipe = placed.pipeline()
    pipe.set_progress_bar_config(disable=True)

    def generate():
        with backend_flags(report.plan), torch.inference_mode():
            pipe(
                health.DEFAULT_PROMPT,
                num_inference_steps=20,
                height=size,
                width=size,
                **(
                    {"guidance_scale": 4.5}
                    if shape.startswith("sd3.5")
                    else {
                        "chroma": {"guidance_scale": 5.0},
                        "zimage": {"guidance_scale": 0.0},  # Turbo: no CFG
                        "qwenimage": {"true_cfg_scale": 4.0, "negative_prompt": " "},
                    }.get(shape, {"guidance_scale": 3.5})
                ),
                generator=torch.Generator().manual_seed(0),
            )

    generate()  # warm-up
    checks = [timed(check, torch.device("cpu")) for _ in range(repeats)]
    generations = [timed(generate, torch.device("cpu")) for _ in range(repeats)]
    c, g = statistics.median(checks), statistics.median(generations)
    return {
        "model": {
            "flux-dev": "tiny Flux.1 dev",
            "flux-schnell": "tiny Flux.1 schnell",
            "chroma": "tiny Chroma",
            "zimage": "tiny Z-Image",
            "qwenimage": "tiny Qwen-Image",
            "sd3.5-medium": "tiny SD3.5 Medium (MMDiT-X)",
        }.get(shape, "tiny SD3.5"),
        "size": size,
        "check_s": round(c, 3),
        "generation_20_steps_s": round(g, 3),
        "check_over_generation": round(c / g, 3),
        "repeats": repeats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,128")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="flux-dev,flux-schnell,chroma,sd3.5,zimage,qwenimage")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [
        bench(shape, int(size), args.repeats)
        for shape in args.models.split(",")
        for size in args.sizes.split(",")
    ]
    table = "\n".join(
        f"| {r['model']} | {r['size']} | fp32 | {r['check_s']:.3f} s | "
        f"{r['generation_20_steps_s']:.3f} s | {100 * r['check_over_generation']:.0f}% |"
        for r in rows
    )
    emit({"machine": machine("cpu"), "flux": rows}, table, args.json)


if __name__ == "__main__":
    main()
