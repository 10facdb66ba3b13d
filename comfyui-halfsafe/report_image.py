"""The check's report as a picture for the graph (an IMAGE tensor: 1 x H x W x 3, 0..1)."""

from __future__ import annotations

import textwrap

WIDTH, MARGIN, LINE = 768, 16, 18
COLOURS = {"healthy": (46, 125, 50), "fixable": (230, 145, 0), "broken": (198, 40, 40)}


def render(text: str, verdict: str | None):
    import numpy as np
    import torch
    from PIL import Image, ImageDraw, ImageFont

    lines: list[str] = []
    for paragraph in text.splitlines() or [""]:
        lines += textwrap.wrap(paragraph, 100) or [""]
    height = 2 * MARGIN + 12 + LINE * len(lines)
    picture = Image.new("RGB", (WIDTH, height), (250, 250, 250))
    draw = ImageDraw.Draw(picture)
    draw.rectangle((0, 0, WIDTH, 8), fill=COLOURS.get(verdict or "", (90, 90, 90)))
    font = ImageFont.load_default()
    for row, line in enumerate(lines):
        draw.text((MARGIN, MARGIN + 12 + row * LINE), line, fill=(20, 20, 20), font=font)
    array = np.asarray(picture, dtype=np.float32) / 255.0
    return torch.from_numpy(array)[None]
