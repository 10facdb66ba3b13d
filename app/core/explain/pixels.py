"""What explain measured in an image's pixels (`image_file.pixel_status`): its size, how bright
and how spread its brightness is, and each signature found (a flat colour, saturation, coloured
noise, a box of noise), one record for the words and the JSON alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.explain.designs import Design
from app.core.explain.looks import FalseColour, Static, Tiled
from app.core.explain.regions import NoisyRegion
from app.core.explain.signatures import Noise, Saturated
from app.core.images.finished import FlatRegion


@dataclass(frozen=True)
class PixelFigures:
    """The figures of one picture, judged by the pixels that show (`transparent`: the share
    that does not). Brightness figures are 0..1, rounded to 4 places as the JSON gives them."""

    width: int = 0
    height: int = 0
    transparent: float = 0.0
    all_zero: bool = False
    mean: float = 0.0
    spread: float = 0.0
    bright: float = 0.0
    flat: FlatRegion | None = None
    saturated: Saturated | None = None
    noise: Noise | None = None
    noise_region: NoisyRegion | None = None
    tiled: Tiled | None = None
    static: Static | None = None
    false_colour: FalseColour | None = None
    # What a picture made so on purpose cannot show, measured where the pixels look like a
    # fault (`designs`): the verdict claims the fault only with its `proof`.
    design: Design | None = None

    @property
    def clipped_white(self) -> bool:
        """Almost all white and almost flat: white clipped at 255, which is never `flat` (a
        flat colour has no channel at 0 or 255)."""
        return self.mean >= 0.97 and self.spread <= 0.02

    @property
    def coloured_noise(self) -> bool:
        return self.noise is not None and self.noise.coloured_noise

    def to_json(self) -> dict[str, Any]:
        flat = self.flat
        return {
            "width": self.width,
            "height": self.height,
            "transparent": self.transparent,
            "all_zero": self.all_zero,
            "mean": self.mean,
            "spread": self.spread,
            "bright": self.bright,
            "flat": None
            if flat is None
            else {
                "colour": list(flat.colour),
                "share": round(flat.share, 4),
                "box": list(flat.box),
                "stage": zeroed_stage(flat),
            },
            "saturated": self.saturated.to_json() if self.saturated is not None else None,
            "noise": self.noise.to_json() if self.noise is not None else None,
            "noise_region": self.noise_region.to_json() if self.noise_region else None,
            "tiled": self.tiled.to_json() if self.tiled is not None else None,
            "static": self.static.to_json() if self.static is not None else None,
            "false_colour": self.false_colour.to_json() if self.false_colour else None,
            "design": self.design.to_json() if self.design is not None else None,
        }


def zeroed_stage(flat: FlatRegion) -> str:
    """Where a NaN was replaced by zeros to leave this flat colour: mid-grey is a zero in the
    picture (-1..1 pixels at 0), any other exact colour a zero in the latents, decoded."""
    return "pixels" if flat.mid_grey else "latent"
