"""Pictures drawn in code for the pixel tests: what the demo model draws for each prompt it was
trained on, at any size."""

from __future__ import annotations

import numpy as np
from PIL import Image


def demo_picture(shape: str, colour: str, background: str, size: int, grain: float = 0.0):
    """What the demo draws for "a <colour> <shape> on a <background> background": one flat shape
    of the prompted colour, centred, on the other (drawn 4 times larger and reduced, so its edges
    are soft as a decoded picture's are), with a VAE's grain where asked."""
    from PIL import ImageDraw

    from app.core.demo import DEMO_COLOURS

    big = size * 4
    image = Image.new("RGB", (big, big), DEMO_COLOURS[background])
    draw, centre, radius = ImageDraw.Draw(image), big / 2, big * 0.28
    box = (centre - radius, centre - radius, centre + radius, centre + radius)
    if shape == "circle":
        draw.ellipse(box, fill=DEMO_COLOURS[colour])
    elif shape == "square":
        draw.rectangle(box, fill=DEMO_COLOURS[colour])
    else:
        corners = [
            (centre, box[1]),
            (box[0], centre + radius * 0.8),
            (box[2], centre + radius * 0.8),
        ]
        draw.polygon(corners, fill=DEMO_COLOURS[colour])
    picture = np.asarray(image.resize((size, size), Image.Resampling.LANCZOS)).astype(float)
    picture += np.random.default_rng(size).normal(0.0, grain, picture.shape)
    return np.clip(picture, 0, 255).round().astype(np.uint8)


def demo_prompts() -> list[tuple[str, str, str]]:
    """Every prompt the demo was trained on (docs/cli.md): (shape, colour, background)."""
    from app.core.demo import DEMO_COLOURS, DEMO_SHAPES

    return [
        (shape, colour, background)
        for shape in DEMO_SHAPES
        for colour in DEMO_COLOURS
        for background in DEMO_COLOURS
        if colour != background
    ]


def halfsafe_parameters(prompt: str, size: int, seed: int = 7) -> str:
    """The record HalfSafe writes in a demo picture it made (its PNG's `parameters`)."""
    return (
        f"{prompt}\nSteps: 25, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 7, "
        f"Seed: {seed}, Size: {size}x{size}, Model: demo, RNG: CPU, Architecture: sd1, "
        "Precision: fp32, HalfSafe: 1.0"
    )
