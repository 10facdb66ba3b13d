"""Tiny transformer files that ComfyUI's own loader takes (`comfy.sd.load_diffusion_model`, the
UNETLoader's path), written by HalfSafe's layouts from diffusers' classes: the key layout the
released files use (Black Forest Labs' for Flux.1 and Flux.2, Stability AI's for SD3.5).

ComfyUI's model detection reads depth and most widths from the tensors but fixes some of them
for each family, so these are shaped as it reads them: Flux.1's and Flux.2's heads are 128 wide
(the sum of its rotary axes), SD3's MMDiT is 64 wide per block of depth (`depth` = width / 64,
one 64-wide head a block). Planted: one attention's query projection scaled so that its output
passes fp16's range (65504) while its weights and fp32 hold it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PLANT_SCALE = 1e5  # the query weights stay finite in fp16 (|w| < 0.1 * 1e5); its outputs do not


@dataclass(frozen=True)
class TinyDit:
    family: str  # HalfSafe's family id, for the file's layout
    planted: str  # the layer scaled, in diffusers' names
    comfyui_layer: str  # the same layer in ComfyUI's module names (its diffusion model's)


TINY_DITS = {
    "flux": TinyDit("flux", "transformer_blocks.0.attn.to_q", "double_blocks.0.img_attn.qkv"),
    "flux2klein": TinyDit(
        "flux2klein", "transformer_blocks.0.attn.to_q", "double_blocks.0.img_attn.qkv"
    ),
    "sd3": TinyDit("sd3", "transformer_blocks.0.attn.to_q", "joint_blocks.0.x_block.attn.qkv"),
}


def tiny_transformer(family: str, seed: int = 0):
    """A tiny diffusers transformer of `family` in the widths ComfyUI's detection reads."""
    import torch

    torch.manual_seed(seed)
    if family == "flux":  # Flux.1 dev: guidance embedding, CLIP-pooled vector, T5 text
        from diffusers import FluxTransformer2DModel

        return FluxTransformer2DModel(
            patch_size=1,
            in_channels=64,  # 16 latent channels in 2x2 patches
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=128,
            num_attention_heads=1,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            guidance_embeds=True,
            axes_dims_rope=(16, 56, 56),
        ).eval()
    if family == "flux2klein":  # Flux.2 Klein: no guidance embedding, no pooled vector
        from diffusers import Flux2Transformer2DModel

        return Flux2Transformer2DModel(
            patch_size=1,
            in_channels=128,  # 32 latent channels in 2x2 patches
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=128,
            num_attention_heads=1,
            joint_attention_dim=96,
            timestep_guidance_channels=256,
            axes_dims_rope=(32, 32, 32, 32),
            guidance_embeds=False,
        ).eval()
    if family == "sd3":  # SD3.5: RMS-normed query and key
        from diffusers import SD3Transformer2DModel

        return SD3Transformer2DModel(
            sample_size=16,
            patch_size=2,
            in_channels=16,
            num_layers=2,
            attention_head_dim=64,
            num_attention_heads=2,
            joint_attention_dim=64,
            caption_projection_dim=128,
            pooled_projection_dim=64,
            out_channels=16,
            pos_embed_max_size=32,
            qk_norm="rms_norm",
        ).eval()
    raise ValueError(f"no tiny ComfyUI transformer for {family!r}")


def save_transformer_file(transformer, path: str | Path, dtype: str = "fp16") -> Path:
    """`transformer` alone as one `.safetensors` in its family's original layout (as ComfyUI's
    diffusion_models/ files hold it, no prefix), floating weights in `dtype`."""
    from app.core.checkpoint import write_safetensors
    from app.core.checkpoint.assembly import torch_dtype
    from app.core.families.registry import family_of_denoiser
    from app.core.formats.layouts import to_original

    family = family_of_denoiser(transformer)
    assert family is not None and family.layout is not None, type(transformer).__name__
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    state = to_original(family.layout.table(config), transformer.state_dict())
    target = torch_dtype(dtype)
    return write_safetensors(
        path, {k: (v.to(target) if v.is_floating_point() else v) for k, v in state.items()}
    )


def write_tiny_dit(family: str, folder: str | Path, planted: bool) -> Path:
    """A tiny `family` transformer file in fp16 under `folder`, with its query projection
    planted past fp16's range or not."""
    import torch

    transformer = tiny_transformer(family)
    if planted:
        layer = transformer.get_submodule(TINY_DITS[family].planted)
        assert isinstance(layer, torch.nn.Linear)
        with torch.no_grad():
            layer.weight.mul_(PLANT_SCALE)
    name = f"tiny_{family}_{'planted' if planted else 'healthy'}.safetensors"
    return save_transformer_file(transformer, Path(folder) / name)
