"""VAE tiling: decoding (and encoding) a picture in overlapping tiles with diffusers' own tiled
decode, so that a large picture's activations fit beside the VAE on a small card. The classic
case: SDXL at 1024 px with its VAE in fp32 (the cure for its black images) needs several GB of
activations in the decoder's last blocks, more than a 6 or 8 GB card has left.

The `vae_tiling` setting is "on", "off" or "auto"; a job resolves "auto" once, from its picture
size, before it runs (`resolve`), so its plan and every record made from it say "on" or "off":
what ran. The activation recorder keeps each layer's largest value over all its calls, so a
layer that overflows in one tile is found as it is untiled.
"""

from __future__ import annotations

# Full-resolution feature maps a decoder's last block holds at once (its input, a norm's output,
# a convolution's output and the residual), a judgment from diffusers' ResnetBlock2D.
LIVE_MAPS = 4
# The smallest tile `resolve` makes: below it the overlaps diffusers blends take most of each
# tile.
SMALLEST_TILE_PX = 256


def decode_bytes(vae, height: int, width: int, dtype_bytes: int) -> int | None:
    """The activations one image's decode holds at its peak, estimated from the VAE's config
    (the widest feature map at full resolution, `LIVE_MAPS` of them); None for a VAE whose
    config does not say its block widths."""
    config = getattr(vae, "config", None)
    widths = getattr(config, "block_out_channels", None) if config is not None else None
    if not widths:
        return None
    full_resolution = widths[1] if len(widths) > 1 else widths[0]
    return LIVE_MAPS * int(full_resolution) * height * width * dtype_bytes


def can_tile(vae) -> bool:
    """Whether this VAE has diffusers' tiled decode."""
    return callable(getattr(vae, "enable_tiling", None)) and hasattr(vae, "use_tiling")


def resolve(plan, vae, height: int, width: int, free_bytes: int | None = None):
    """`plan` with `vae_tiling` "on" or "off" for a picture of `height` x `width` px, and
    the tiles' size where it is on (`tile_px`): "auto" is "on" where the room beside the VAE
    (its bytes as placed) is less than the decode's activations. The room is the job's memory budget where it has one (on any device: a
    decode stage holds the VAE alone, so the budget less the VAE is what its activations get)
    and a CUDA or ROCm GPU's free memory, the smaller of the two; with neither (a CPU without
    a budget) auto does not tile. A VAE without a tiled decode is "off" whatever was asked.
    `free_bytes` stands for the device's free memory when given."""
    from dataclasses import replace

    from app.core.precision.plan import torch_dtype

    asked = plan.vae_tiling
    if vae is None or not can_tile(vae):
        return replace(plan, vae_tiling="off")
    if asked == "off":
        return plan
    dtype = torch_dtype(plan.dtypes.get("vae", "fp32"))
    room = _room_beside(vae, plan, dtype, free_bytes)
    if asked == "auto":
        needed = decode_bytes(vae, height, width, dtype.itemsize)
        if needed is None or room is None or needed <= room:
            return replace(plan, vae_tiling="off")
    return replace(plan, vae_tiling="on", vae_tile_px=tile_px(vae, dtype, room))


def tile_px(vae, dtype, room: int | None) -> int:
    """The side of the tiles a VAE decodes in so that one tile's activations fit `room`: its
    own tile size (0), halved until one fits, down to `SMALLEST_TILE_PX`. 0 where the VAE
    sets its tiles otherwise (diffusers' newer VAEs tile at 256 px already) or the room is not
    known."""
    own = getattr(vae, "tile_sample_min_size", None)
    if room is None or not isinstance(own, int) or not hasattr(vae, "tile_latent_min_size"):
        return 0
    side = own
    while side // 2 >= SMALLEST_TILE_PX and _tile_bytes(vae, side, dtype) > room:
        side //= 2
    return 0 if side == own else side


def _tile_bytes(vae, side: int, dtype) -> int:
    return decode_bytes(vae, side, side, dtype.itemsize) or 0


def _room_beside(vae, plan, dtype, free_bytes: int | None) -> int | None:
    """What the decode's activations may take: the smaller of the job's budget and the device's
    free memory (`free_bytes`, else measured on a CUDA device), less the VAE's weights in
    `dtype`; None where neither is known."""
    limits = [] if free_bytes is None else [free_bytes]
    if plan.memory_budget_mb is not None:
        limits.append(int(plan.memory_budget_mb * 2**20))
    if free_bytes is None and plan.device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            from app.core.precision.transfer import cuda_free_bytes

            limits.append(cuda_free_bytes(plan.device))
    if not limits:
        return None
    weights = sum(p.numel() for p in vae.parameters()) * dtype.itemsize
    return min(limits) - weights


def apply(vae, plan) -> None:
    """Set a placed VAE's tiled decode to what `plan` says (every time: a VAE placed as the
    loaded one itself must not keep another job's choice). Smaller tiles than the VAE's own
    are set on a copy only (`PlacedPipeline` copies a tiled VAE, its tensors shared)."""
    if not can_tile(vae):
        return
    vae.use_tiling = plan.vae_tiling == "on"
    if vae.use_tiling and plan.vae_tile_px:
        scale = vae.tile_sample_min_size // vae.tile_latent_min_size
        vae.tile_sample_min_size = plan.vae_tile_px
        vae.tile_latent_min_size = plan.vae_tile_px // scale
