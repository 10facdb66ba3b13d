"""LoRAs in kohya's layout (as A1111 and sd-scripts write them) for the tiny SD1.x pipeline's
UNet and text encoder, and their files."""

from __future__ import annotations

from pathlib import Path

import torch

from app.core.checkpoint import write_safetensors

UNET_LAYERS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "ff.net.2")
TE_LAYERS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj")
RANK = 4


def linears(module, endings) -> list[tuple[str, torch.nn.Linear]]:
    return [(n, m) for n, m in module.named_modules() if n.endswith(endings)]


def kohya_lora(pipeline, *, scale: float = 0.3, seed: int = 0, unet_layers=UNET_LAYERS):
    """A LoRA in kohya's layout (as A1111 and sd-scripts write it) for the tiny pipeline's
    UNet and text encoder: `lora_unet_<path>` / `lora_te_text_model_<path>` with lora_down,
    lora_up and alpha."""
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}

    def add(key: str, layer: torch.nn.Linear) -> None:
        tensors[f"{key}.lora_down.weight"] = torch.randn(
            RANK, layer.in_features, generator=generator
        )
        tensors[f"{key}.lora_up.weight"] = (
            torch.randn(layer.out_features, RANK, generator=generator) * scale
        )
        tensors[f"{key}.alpha"] = torch.tensor(float(RANK))

    for name, layer in linears(pipeline.unet, unet_layers):
        add("lora_unet_" + name.replace(".", "_"), layer)
    for name, layer in linears(pipeline.text_encoder, TE_LAYERS):
        add("lora_te_text_model_" + name.replace(".", "_"), layer)
    return tensors


def save_lora(tensors, path: Path) -> Path:
    return write_safetensors(path, tensors)
