"""What the stages of one generation hand each other: the prompt's embeddings with their flags,
the input picture's latents, and a hires fix's second pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.generation.watch import NanWatch


@dataclass
class Conditioning:
    """Prompt embeddings for one image (batch 1) and, per text encoder, a device-side flag."""

    embeds: dict[str, Any]
    bad: dict[str, Any]


@dataclass
class Picture:
    """The input picture's latents (and, for inpainting, those of the picture with its hole)
    as the VAE's encoder made them under one plan, with a device-side flag. For an edit,
    `latents` is a list: each reference's (1, C, h, w)."""

    latents: Any
    masked: Any | None
    bad: Any


@dataclass
class SecondPass:
    """A hires fix's second pass: its latents and watch; for a pixel upscaler also the first
    pass's latents, the enlarged pictures and, per image, device-side flags of the first
    picture's decode and of the enlarged picture's encoding going non-finite from finite
    input (so that each names its own failure, not one it was handed)."""

    latents: Any
    watch: NanWatch | None
    first_latents: Any = None
    enlarged: Any = None
    decode_bad: Any = None  # (B,)
    encode_bad: Any = None  # (B,)

    def flags(self) -> list[Any]:
        return [] if self.decode_bad is None else [self.decode_bad, self.encode_bad]
