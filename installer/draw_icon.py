"""Draws HalfSafe's app icon: a shield, left half solid, right half pale (half precision, kept safe).

Writes app/resources/icons/halfsafe.svg, halfsafe-256.png, halfsafe-512.png, halfsafe.ico (Windows)
and halfsafe.icns (macOS) from one outline, so every format shows the same shape. Needs Pillow
(the app's own environment has it): `.venv/bin/python installer/draw_icon.py`.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

ICONS = Path(__file__).resolve().parent.parent / "app" / "resources" / "icons"

VIEW = 256  # the outline below is drawn on a 256 x 256 canvas
SOLID = "#1f7a6d"  # the filled half
PALE = "#e6f4f1"  # the open half
EDGE = "#16324f"  # outline and centre line
STROKE = 12

# The shield's outline as cubic Bezier segments: start point, then (c1, c2, end) triples.
START = (128.0, 20.0)
SEGMENTS = (
    ((158.0, 38.0), (190.0, 46.0), (220.0, 46.0)),
    ((220.0, 70.0), (220.0, 94.0), (220.0, 118.0)),
    ((220.0, 176.0), (182.0, 214.0), (128.0, 238.0)),
    ((74.0, 214.0), (36.0, 176.0), (36.0, 118.0)),
    ((36.0, 94.0), (36.0, 70.0), (36.0, 46.0)),
    ((66.0, 46.0), (98.0, 38.0), (128.0, 20.0)),
)


def _svg_path() -> str:
    parts = [f"M{START[0]:g} {START[1]:g}"]
    for (x1, y1), (x2, y2), (x, y) in SEGMENTS:
        parts.append(f"C{x1:g} {y1:g} {x2:g} {y2:g} {x:g} {y:g}")
    return " ".join(parts) + " Z"


def _polygon(scale: float, steps: int = 48) -> list[tuple[float, float]]:
    """The outline flattened to points, for Pillow, which draws no curves."""
    points = [(START[0] * scale, START[1] * scale)]
    x0, y0 = START
    for (x1, y1), (x2, y2), (x3, y3) in SEGMENTS:
        for i in range(1, steps + 1):
            t = i / steps
            u = 1 - t
            x = u**3 * x0 + 3 * u * u * t * x1 + 3 * u * t * t * x2 + t**3 * x3
            y = u**3 * y0 + 3 * u * u * t * y1 + 3 * u * t * t * y2 + t**3 * y3
            point = (x * scale, y * scale)
            if abs(point[0] - points[-1][0]) + abs(point[1] - points[-1][1]) > 0.5:
                points.append(point)
        x0, y0 = x3, y3
    return points


def svg() -> str:
    path = _svg_path()
    return f"""<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {VIEW} {VIEW}" width="{VIEW}" height="{VIEW}">
  <title>HalfSafe</title>
  <defs><clipPath id="shield"><path d="{path}"/></clipPath></defs>
  <path d="{path}" fill="{PALE}"/>
  <rect x="0" y="0" width="128" height="{VIEW}" fill="{SOLID}" clip-path="url(#shield)"/>
  <line x1="128" y1="20" x2="128" y2="238" stroke="{EDGE}" stroke-width="{STROKE / 2:g}"/>
  <path d="{path}" fill="none" stroke="{EDGE}" stroke-width="{STROKE}" stroke-linejoin="round"/>
</svg>
"""


def png(size: int) -> Image.Image:
    """The icon at `size` pixels, drawn four times larger and scaled down for smooth edges."""
    big = size * 4
    scale = big / VIEW
    outline = _polygon(scale)

    shape = Image.new("L", (big, big), 0)
    ImageDraw.Draw(shape).polygon(outline, fill=255)
    left = Image.new("L", (big, big), 0)
    ImageDraw.Draw(left).rectangle((0, 0, big // 2, big), fill=255)

    image = Image.new("RGBA", (big, big), (0, 0, 0, 0))
    image.paste(Image.new("RGBA", (big, big), PALE), mask=shape)
    left_of_shield = Image.new("L", (big, big), 0)
    left_of_shield.paste(shape, mask=left)
    image.paste(Image.new("RGBA", (big, big), SOLID), mask=left_of_shield)

    draw = ImageDraw.Draw(image)
    draw.line(
        [(big / 2, 20 * scale), (big / 2, 238 * scale)], fill=EDGE, width=round(STROKE / 2 * scale)
    )
    width = round(STROKE * scale)
    radius = width / 2
    # Pillow's own line joins leave spurs on dense outlines: draw each piece, then round joins.
    for a, b in zip(outline, outline[1:] + outline[:1], strict=True):
        draw.line([a, b], fill=EDGE, width=width)
    for x, y in outline:
        draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=EDGE)
    return image.resize((size, size), Image.Resampling.LANCZOS)


def main() -> None:
    ICONS.mkdir(parents=True, exist_ok=True)
    (ICONS / "halfsafe.svg").write_text(svg(), encoding="utf-8")
    large = png(1024)
    for size in (256, 512):
        large.resize((size, size), Image.Resampling.LANCZOS).save(
            ICONS / f"halfsafe-{size}.png", optimize=True
        )
    large.save(ICONS / "halfsafe.ico", sizes=[(s, s) for s in (16, 24, 32, 48, 64, 128, 256)])
    large.save(ICONS / "halfsafe.icns")
    for name in sorted(p.name for p in ICONS.iterdir() if p.name.startswith("halfsafe")):
        print(f"{name}: {(ICONS / name).stat().st_size} bytes")


if __name__ == "__main__":
    main()
