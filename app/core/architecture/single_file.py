"""What a single file is when it is no model a family reads: in one sentence, a LoRA, an
embedding, a VAE or text encoder on its own, another architecture's model. The families decide
what their own checkpoints hold (`app.core.families.registry.detect_architecture`).
"""

from __future__ import annotations

import re

from app.core.architecture.keys import (
    _prefix_checker,
)
from app.core.detection import UNET, VAE, Detection

_FOREIGN = (
    # (key fragment, architecture, plain words) of architectures HalfSafe does not run
    ("double_stream_blocks.", "hidream", "a HiDream model"),
    ("clip_txt_mapper.", "stable-cascade", "a Stable Cascade model"),
    ("down_blocks.1.0.channelwise.", "stable-cascade", "a Stable Cascade model"),
    ("motion_modules.", "animatediff", "an AnimateDiff motion module"),
    ("control_model.", "controlnet", "a ControlNet"),
    ("input_hint_block.", "controlnet", "a ControlNet"),
    ("controlnet_cond_embedding.", "controlnet", "a ControlNet"),
    ("adaLN_modulation.", "dit", "a diffusion transformer (DiT family)"),
    ("cap_embedder.", "lumina", "a Lumina model"),
    ("head.modulation", "wan", "a Wan video model"),
)
# Models told by their published file names (ComfyUI's templates name them so), where no key
# of theirs is known to HalfSafe: (name pattern, architecture, plain words, why not run).
_FOREIGN_NAMES = (
    (
        re.compile(r"(^|[^a-z0-9])moss[-_ ]?image", re.IGNORECASE),
        "moss-image",
        "a MOSS-Image model",
        "its name says MOSS-Image, which diffusers 0.42.1 does not run (it has no MOSS-Image "
        "pipeline or transformer), so HalfSafe can neither load nor check it.",
    ),
)


def other_file(
    keys: list[str], markers: list[tuple[str, str, str]], layouts: str, name: str = ""
) -> Detection | None:
    """A LoRA, an embedding or another architecture's model, by its keys (None: none of them).
    `markers` are the families' own (key fragment, architecture, words), asked first, for
    their weights in a layout HalfSafe does not read; `layouts` names those it reads. A model
    told only by its published file `name` (MOSS-Image) is named before its keys are guessed
    at, unless it holds an original Stable Diffusion checkpoint."""
    if any(
        (
            "lora_up" in k
            or "lora_down" in k
            or "lora_A." in k
            or "lora_B." in k
            or k.startswith(("lora_unet_", "lora_te"))
            or ".hada_w1" in k
            or ".lokr_w1" in k
        )
        for k in keys
    ):
        return Detection(
            "lora",
            False,
            "a LoRA (an add-on for a base model)",
            "its tensors are low-rank adapter pairs (lora_up/lora_down), not a "
            "full model; load a base checkpoint and apply the LoRA there.",
        )
    if keys and all(
        k in ("emb_params", "clip_l", "clip_g", "name", "step") or k.startswith("string_to_")
        for k in keys
    ):
        return Detection(
            "embedding",
            False,
            "a textual-inversion embedding",
            "it holds only token embeddings (emb_params or clip_l/clip_g), which "
            "extend a model's vocabulary; they are not a model.",
        )
    if not any(k.startswith(UNET + "input_blocks.") for k in keys):
        for pattern, arch, words, why in _FOREIGN_NAMES:
            if pattern.search(name):
                return Detection(arch, False, words, why)
    for fragment, arch, words in [*markers, *_FOREIGN]:
        if any(fragment in k for k in keys):
            return Detection(
                arch,
                False,
                words,
                f"it has {arch}-style tensors ({fragment}*), which SD1.x, SD2.x "
                "and SDXL checkpoints never have, and is in none of the transformer layouts "
                f"HalfSafe reads ({layouts}).",
            )
    return None


def not_a_full_checkpoint(keys: list[str]) -> Detection:
    """What a file with no full checkpoint in it is: a VAE, a UNet or a text encoder on its
    own, or nothing HalfSafe knows."""
    has = _prefix_checker(keys)
    if has("encoder.down.") and has("decoder.up.") or has(VAE + "encoder.") and not has(UNET):
        return Detection(
            "vae",
            False,
            "a standalone VAE",
            "it holds only a VAE (encoder/decoder tensors) and no UNet; pass it "
            "with --vae next to a model instead.",
        )
    if has("encoder.down_blocks.") and has("decoder.up_blocks."):
        return Detection(
            "vae",
            False,
            "a standalone VAE in diffusers layout",
            "it holds only a VAE (diffusers layout) and no UNet; pass it with "
            "--vae next to a model instead.",
        )
    if has("down_blocks.") and has("up_blocks.") and any(".attn2.to_k.weight" in k for k in keys):
        return Detection(
            "diffusers-unet",
            False,
            "a UNet in diffusers layout",
            "it holds only a diffusers-layout UNet (down_blocks/up_blocks), one "
            "component of a diffusers folder; open the whole folder instead.",
        )
    if has("text_model.") or has("transformer.resblocks."):
        return Detection(
            "text-encoder",
            False,
            "a text encoder on its own",
            "it holds only a CLIP text encoder, not a diffusion model.",
        )
    sample = ", ".join(sorted(keys)[:2])
    return Detection(
        "unknown",
        False,
        "not a Stable Diffusion checkpoint",
        f"none of its {len(keys)} tensors (e.g. {sample}) has the names of an "
        "SD1.x, SD2.x or SDXL checkpoint.",
    )
