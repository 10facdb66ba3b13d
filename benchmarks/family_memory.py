"""What each family needs at real size, projected from its published shapes: the bytes its
files hold (which stay in RAM while it is loaded) and, for each card size, whether HalfSafe's
plan holds every part whole, streams some block by block, or cannot run it, for a check
(healthy or failing: the fp32 reference computes from the stored weights when a wider copy
would not fit, so both need the same) and a generation.

Every model is built on the meta device (no memory, no values) from its published config: the
ones HalfSafe ships in app/resources/configs (SD1.5, SDXL, Flux.1 dev, the Flux.2 VAE), diffusers'
defaults where they are the published model's (Qwen-Image's transformer and VAE, Flux.2 dev's
transformer), transformers' defaults for Mistral Small 3.1 (Flux.2 dev's text encoder), and the
published widths and depths of the others written out below (Qwen2.5-VL-7B, Qwen3-4B/8B, the
Klein transformers, SD3.5 Large's; Chroma's and Z-Image's are diffusers' defaults, 8.9B and
6.15B as published). Parts are counted by HalfSafe's own `streaming.sizes` and judged as
`PlacedPipeline` judges them under a budget.

Forms: "16-bit" is every part as fp16/bf16. In "fp8", "Q8_0" and "Q4_0" the denoiser and every
text encoder of over 1B parameters are in that form, as ComfyUI and Forge users keep them: each
matrix whose rows split into 32-value blocks at 1, 34/32 or 18/32 bytes a weight, the rest at 2.
The VAE and CLIP encoders stay 16-bit.

A card's budget is what a job on it gets without a budget set: its memory less 0.5 GiB the
desktop and the CUDA context hold, less HalfSafe's reserve for activations (a fifth of the card,
at least 1.5 GiB). RAM is judged against the computer's memory less 2.5 GiB for the system,
with 1.5 GiB for HalfSafe's own working set.

Usage: python benchmarks/family_memory.py [--families sd15,sdxl,...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from common import ROOT, emit, machine

from app.core.advice import sizes  # the judgement `halfsafe advise` makes of these figures

GIB = sizes.GIB
CARDS_GIB = (6, 8, 12, 24)
RAM_GIB = (16, 32)
FORMS = {"16-bit": None, "fp8": 1.0, "Q8_0": 34 / 32, "Q4_0": 18 / 32}
BIG_ENCODER = 1e9  # parameters: a text encoder past this is quantized with the denoiser
CONFIGS = ROOT / "app" / "resources" / "configs"

# Published widths and depths not shipped as config files.
QWEN25_VL_7B = {  # Qwen/Qwen2.5-VL-7B-Instruct
    "text_config": {
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
    },
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "out_hidden_size": 3584,
    },
}
QWEN3 = {  # Qwen/Qwen3-4B and Qwen3-8B (the Klein text encoders), without the LM head
    "4B": {"hidden_size": 2560, "num_hidden_layers": 36, "intermediate_size": 9728},
    "8B": {"hidden_size": 4096, "num_hidden_layers": 36, "intermediate_size": 12288},
}
SD35_LARGE = {  # stabilityai/stable-diffusion-3.5-large's transformer (8.1B)
    "num_layers": 38,
    "attention_head_dim": 64,
    "num_attention_heads": 38,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 2432,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "patch_size": 2,
    "sample_size": 128,
    "pos_embed_max_size": 192,
    "qk_norm": "rms_norm",
}
KLEIN = {  # FLUX.2 [klein] 4B and 9B: 128-wide heads, Qwen3's last three layers as text input
    "4B": {"num_layers": 5, "num_single_layers": 20, "num_attention_heads": 24},
    "9B": {"num_layers": 8, "num_single_layers": 24, "num_attention_heads": 32},
}


def _json(*parts: str) -> dict:
    return json.loads(CONFIGS.joinpath(*parts, "config.json").read_text())


def _on_meta(build: Callable[[], object]):
    import torch

    with torch.device("meta"):
        return build()


def _clip(folder: str, part: str = "text_encoder"):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig.from_dict(_json(folder, part))
    kind = CLIPTextModelWithProjection if part == "text_encoder_2" else CLIPTextModel
    return kind(config)


def _diffusers(kind: str, *parts: str, **overrides):
    import diffusers

    model = getattr(diffusers, kind)
    config = {**_json(*parts), **overrides} if parts else overrides
    return model.from_config(config)


def _qwen3(size: str):
    from transformers import Qwen3Config, Qwen3Model

    return Qwen3Model(
        Qwen3Config(**QWEN3[size], num_attention_heads=32, num_key_value_heads=8, vocab_size=151936)
    )


def _families() -> dict[str, tuple[str, dict[str, Callable[[], object]]]]:
    """family -> (its words, part -> builder); the denoiser first."""
    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        T5Config,
        T5EncoderModel,
    )

    def t5xxl():
        return T5EncoderModel(T5Config.from_dict(_json("flux", "text_encoder_2")))

    def klein(size: str, encoder: str):
        text = 3 * QWEN3[encoder]["hidden_size"]
        return {
            "transformer": lambda: _diffusers(
                "Flux2Transformer2DModel", **KLEIN[size], joint_attention_dim=text
            ),
            "text_encoder": lambda: _qwen3(encoder),
            "vae": lambda: _diffusers("AutoencoderKLFlux2", "flux2", "vae"),
        }

    return {
        "sd15": (
            "SD1.5",
            {
                "unet": lambda: _diffusers("UNet2DConditionModel", "sd1", "unet"),
                "text_encoder": lambda: _clip("sd1"),
                "vae": lambda: _diffusers("AutoencoderKL", "sd1", "vae"),
            },
        ),
        "sdxl": (
            "SDXL",
            {
                "unet": lambda: _diffusers("UNet2DConditionModel", "sdxl", "unet"),
                "text_encoder": lambda: _clip("sdxl"),
                "text_encoder_2": lambda: _clip("sdxl", "text_encoder_2"),
                "vae": lambda: _diffusers("AutoencoderKL", "sdxl", "vae"),
            },
        ),
        "flux1": (
            "Flux.1 dev",
            {
                "transformer": lambda: _diffusers("FluxTransformer2DModel", "flux", "transformer"),
                "text_encoder": lambda: _clip("sd1"),
                "text_encoder_2": lambda: T5EncoderModel(
                    T5Config.from_dict(_json("flux", "text_encoder_2"))
                ),
                "vae": lambda: _diffusers("AutoencoderKL", "flux", "vae"),
            },
        ),
        "sd2": (
            "SD2.x",
            {
                "unet": lambda: _diffusers("UNet2DConditionModel", "sd2", "unet"),
                "text_encoder": lambda: _clip("sd2"),
                "vae": lambda: _diffusers("AutoencoderKL", "sd2", "vae"),
            },
        ),
        "chroma": (
            "Chroma",
            {
                # diffusers' defaults are Chroma1's published shape (8.9B).
                "transformer": lambda: _diffusers("ChromaTransformer2DModel"),
                "text_encoder": lambda: t5xxl(),
                "vae": lambda: _diffusers("AutoencoderKL", "flux", "vae"),
            },
        ),
        "zimage": (
            "Z-Image",
            {
                # diffusers' defaults are Z-Image's published shape (6.15B), Turbo's and Base's.
                "transformer": lambda: _diffusers("ZImageTransformer2DModel"),
                "text_encoder": lambda: _qwen3("4B"),
                "vae": lambda: _diffusers("AutoencoderKL", "flux", "vae"),
            },
        ),
        "sd35large": (
            "SD3.5 Large",
            {
                "transformer": lambda: _diffusers("SD3Transformer2DModel", **SD35_LARGE),
                "text_encoder": lambda: _clip("sdxl"),
                "text_encoder_2": lambda: _clip("sdxl", "text_encoder_2"),
                "text_encoder_3": lambda: t5xxl(),
                "vae": lambda: _diffusers("AutoencoderKL", "sd3", "vae"),
            },
        ),
        "klein4b": ("Flux.2 Klein 4B", klein("4B", "4B")),
        "klein9b": ("Flux.2 Klein 9B", klein("9B", "8B")),
        "qwenimage": (
            "Qwen-Image",
            {
                "transformer": lambda: _diffusers("QwenImageTransformer2DModel"),
                "text_encoder": lambda: Qwen2_5_VLForConditionalGeneration(
                    Qwen2_5_VLConfig(**QWEN25_VL_7B)
                ),
                "vae": lambda: _diffusers("AutoencoderKLQwenImage"),
            },
        ),
        "flux2dev": (
            "Flux.2 dev",
            {
                "transformer": lambda: _diffusers("Flux2Transformer2DModel"),
                "text_encoder": lambda: Mistral3ForConditionalGeneration(Mistral3Config()),
                "vae": lambda: _diffusers("AutoencoderKLFlux2", "flux2", "vae"),
            },
        ),
    }


def _bytes_of(per_weight: float | None):
    """A tensor's bytes in a form: quantized matrices at `per_weight`, the rest at 2."""

    def held(name: str, tensor, dtype) -> int:
        if not tensor.is_floating_point():
            return tensor.numel() * tensor.element_size()
        matrix = tensor.dim() == 2 and tensor.shape[-1] % 32 == 0
        if per_weight is not None and matrix:
            return int(tensor.numel() * per_weight)
        return tensor.numel() * 2

    return held


def measure_family(parts: dict[str, Callable[[], object]]) -> dict:
    """Per part and form: parameters and `streaming.sizes` (whole, resident, largest block)."""
    import torch

    from app.core.precision import streaming

    measured = {}
    for name, build in parts.items():
        module = _on_meta(build)
        parameters = sum(p.numel() for p in module.parameters())
        quantizable = name in ("unet", "transformer") or (
            name.startswith("text_encoder") and parameters > BIG_ENCODER
        )
        forms = {}
        for form, per_weight in FORMS.items():
            held = streaming.sizes(
                module, torch.float16, bytes_of=_bytes_of(per_weight if quantizable else None)
            )
            forms[form] = {
                "whole": held.whole,
                "resident": held.resident,
                "block": held.block,
                "blocks": held.blocks,
            }
        measured[name] = {"parameters": parameters, "forms": forms}
        del module
    return measured


def card_budget(card_gib: float) -> float:
    """Bytes a job's parts may each hold on a card of `card_gib` with nothing else running
    (`streaming.device_budget` on the free memory left beside the desktop)."""
    return sizes.card_budget(int(card_gib * GIB))


def verdict(parts: dict, form: str, budget: float) -> str:
    """'whole', 'streams <parts>' or 'no (<part> needs N GiB)' for one card."""
    streamed, short = [], []
    for name, part in parts.items():
        held = part["forms"][form]
        if held["whole"] <= budget:
            continue
        floor = held["resident"] + held["block"]
        if held["blocks"] and floor <= budget:
            streamed.append(name)
        else:
            short.append(f"{name} needs {floor / GIB:.1f}")
    if short:
        return "no (" + ", ".join(short) + " GiB)"
    return "streams " + ", ".join(streamed) if streamed else "whole"


def run(args) -> dict:
    chosen = args.families.split(",") if args.families else None
    document = {"machine": machine("cpu"), "families": {}}
    for key, (words, parts) in _families().items():
        if chosen and key not in chosen:
            continue
        measured = measure_family(parts)
        rows = {}
        for form in FORMS:
            files = sum(p["forms"][form]["whole"] for p in measured.values())
            denoiser = next(iter(measured.values()))
            rows[form] = {
                "files_bytes": files,
                "ram": {f"{ram}": sizes.ram_fits(files, ram * GIB) for ram in RAM_GIB},
                "cards": {
                    f"{card}": verdict(measured, form, card_budget(card)) for card in CARDS_GIB
                },
                # Before: the check held the fp32 reference and the fp16 copy of a failing
                # denoiser together, about 10 bytes per denoiser weight (measured).
                "before_check_gib": 10 * denoiser["parameters"] / GIB,
            }
        document["families"][key] = {"words": words, "parts": measured, "rows": rows}
    return document


def table(document: dict) -> str:
    cards = " | ".join(f"{c} GB card" for c in CARDS_GIB)
    rams = " | ".join(f"{r} GB RAM" for r in RAM_GIB)
    lines = [
        "Projected from the published shapes (meta device; no weights made)",
        "",
        f"| family | form | files | {rams} | {cards} | check's device need before |",
        "|---|---|---|" + "---|" * (len(RAM_GIB) + len(CARDS_GIB)) + "---|",
    ]
    for family in document["families"].values():
        for form, row in family["rows"].items():
            ram = " | ".join("fits" if row["ram"][f"{r}"] else "no" for r in RAM_GIB)
            card = " | ".join(row["cards"][f"{c}"] for c in CARDS_GIB)
            lines.append(
                f"| {family['words']} | {form} | {row['files_bytes'] / GIB:.1f} GiB | {ram} | "
                f"{card} | {row['before_check_gib']:.0f} GiB |"
            )
    lines.append("")
    lines.append("Parts (parameters; 16-bit: whole, kept on the device, largest block, blocks):")
    for family in document["families"].values():
        for name, part in family["parts"].items():
            held = part["forms"]["16-bit"]
            lines.append(
                f"  {family['words']:<16} {name:<15} {part['parameters'] / 1e9:6.2f}B  "
                f"{held['whole'] / GIB:6.2f} / {held['resident'] / GIB:5.2f} / "
                f"{held['block'] / GIB:5.2f} GiB, {held['blocks']} blocks"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", help="comma-separated keys (sd15, sdxl, flux1, ...)")
    parser.add_argument("--json")
    args = parser.parse_args()
    document = run(args)
    emit(document, table(document), args.json)


if __name__ == "__main__":
    main()
