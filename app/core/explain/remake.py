"""An image made again from its record and compared with the file (`explain --remake`): the
one proof of inverted colours, which no figure of the pixels alone gives (`signatures`).

A picture's negative is as natural a picture as the picture, by every figure of its pixels. But
where the record holds everything that made the image (model, prompt, seed, steps, CFG, sampler,
size) and its starting noise came from a source HalfSafe draws the same way (the CPU: HalfSafe's
own images and ComfyUI's), the model makes the same picture again. Both are compared on their
brightness over a 64x64 grid (each cell the mean of its pixels, so that the last bits of a
different GPU or kernel do not count): the correlation of the two
- is near 1 for the same picture (`MATCH`);
- near -1 for its negative (`INVERTED`): the colours were inverted after the model made it, as
  a warm decode in a tool's memory manager does (ComfyUI issue 15452), while the model made it
  right here, freshly loaded;
- and anywhere between for another picture: another noise source (A1111's GPU noise), another
  sampler or model, a LoRA not found. Nothing is claimed then.
Two different pictures of one prompt correlate at 0.2 to 0.5 (a centred subject, a sky above),
never near -1; the thresholds leave that margin on both sides. Each verdict also needs the
cells themselves close (`CLOSE`: their mean difference from the picture made again, or from its
negative), so that a dim or nearly flat file, whose few levels can correlate with anything, is
neither. A graph that inverts its picture itself (ComfyUI's ImageInvert on the chain from the
file's saver back to its decoder: `saved_chain`) is compared with the negative of the picture
made again; one that saves both the picture and its negative, where the file may be either,
with both, and the file is never called inverted then.

The picture made again also proves what the pixels alone cannot for a pass over one region (a
face fix, `regions`): where the record shows such a pass, the two pictures are compared 32 px
cell by cell. A box where they differ (each cell's mean brightness step at least `DIFFER`),
the rest the same picture (its cells correlating at `MATCH` or more), in which the file has no
shapes left (structure at most `NOISE_STRUCTURE`, brightness spread at least `STRENGTH`) where
the picture made again has them (structure at least `PICTURE_STRUCTURE`) is noise that pass
drew: brown, grey or coloured alike, which the pixels alone tell from a texture only when it is
coloured. A pass that drew a face again leaves shapes in its box, and is not claimed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

GRID = 64  # the comparison's cells per side
MATCH = 0.8  # correlation at or above: the same picture
INVERTED = -0.8  # at or below: its negative
CLOSE = 0.1  # the most the cells may differ on average (0..1) from the picture or its negative
# The statuses of an image that is a picture to compare (NaN-black and flat images are the
# check's to prove; a safety checker's blank is no picture), and the looks a tool's failing
# fast path draws (`looks`), compared with HalfSafe's own image of the same record.
REMADE_STATUSES = ("ok", "black", "noise_region", "tiled_noise", "rgb_static", "false_colour")
MAX_SEED = 2**32 - 1  # HalfSafe's seeds, as its generation takes them

# A pass's box: cells whose mean brightness differs by this much (0..1) between the file and
# the picture made again; inside it, the picture made again at least this structure (pictures
# measure 0.12 and up, noise 0.05 at most: `signatures`).
DIFFER = 0.1
PICTURE_STRUCTURE = 0.12

REMAKE_VERDICTS = ("matches", "inverted", "differs", "pass_noise")

REMAKE_WORDS = {
    "matches": (
        "HalfSafe made the image again from its record ({made}), and it is the same picture "
        "(brightness correlation {r:.2f}): the model and its settings make it as it is."
    ),
    "inverted": (
        "HalfSafe made the image again from its record ({made}), and the file is that "
        "picture's negative (brightness correlation {r:.2f}): its colours were inverted after "
        "the model made it, which a decode by a model kept loaded in memory does (or an editor "
        "that kept the image's record). The model is fine: freshly loaded here, it made the "
        "picture right. {state}"
    ),
    "differs": (
        "HalfSafe made the image again from its record ({made}), and it is another picture "
        "(brightness correlation {r:.2f}), so it tells nothing about this one{why}."
    ),
    "pass_noise": (
        "HalfSafe made the image again from its record ({made}): outside x {x0}-{x1}, "
        "y {y0}-{y1} ({share} of it) it is the same picture (cell correlation {outside:.2f}), "
        "but inside that box the file has no shapes left (structure {structure:.2f}, against "
        "{made_structure:.2f} in the picture made again): noise, whatever its colour, where "
        "the first pass drew a picture."
    ),
    "gpu_noise": (
        ": {tool} made its starting noise on the GPU ({source}), HalfSafe makes it on the CPU, "
        "so one seed gives another picture"
    ),
    "unknown_noise": (
        ": {tool} does not record where it made its starting noise, and HalfSafe makes it on "
        "the CPU"
    ),
    "asked_not_made": "It was not made again: {why}",
    "look_clean": (
        "HalfSafe made the image again from its record with PyTorch's own kernels on the "
        "decoded weights ({made}), and it is a picture, not {look}: the model and its settings "
        "draw a picture, so the {look} came from the tool's run (its kernels, its cache or its "
        "memory), not from the model or fp16."
    ),
    "look_same": (
        "HalfSafe made the image again from its record ({made}), and it is no picture either "
        "({made_look}): the model at these settings draws no picture with ordinary kernels "
        "as well, so it is not the tool's fast path but the model file or its settings (a "
        "variant the loader does not know, a sampler or step count the model was not made "
        "for)."
    ),
    "look_offer": (
        "explain --remake makes HalfSafe's own image of the same record with ordinary kernels "
        "on the decoded weights, to compare: a picture there puts the cause in the tool's run."
    ),
    "inverts": (
        " The image's graph inverts its picture itself ({node}): it is compared with the "
        "negative of the picture made again."
    ),
    "inverts_unsure": (
        " The image's graph saves the picture and, through {node}, its negative, and the file "
        "does not say which it is: it is compared with both, and a negative is not claimed."
    ),
    "file_size": (
        "It was made again at the file's size, {made}, not at the {recorded} its record gives: "
        "that is larger than the file, and would take far longer to make than the file can "
        "show. A picture made at another size is another picture, so a file saved smaller than "
        "it was made is compared with another picture, which claims nothing."
    ),
    "no_size": "Its record gives no size: it was made again at the file's size, {made}.",
    "no_picture": (
        "It was not made again: a safety checker's blank or a flat image is no picture to compare."
    ),
    "checked_instead": (
        "It was not made again: a NaN-black or flat image is no picture to compare, and the "
        "check above is the proof."
    ),
}
# Why an image cannot be made again from its record, by what is missing.
_MISSING = {
    "seed": "its record gives no seed",
    "steps": "its record gives no step count",
    "scheduler": "HalfSafe does not run its sampler",
    "hires": "it was drawn again at a larger size (a hires fix or second sampler), which "
    "--remake does not repeat",
    "picture": "it was drawn from a picture (image-to-image: a denoise below 1), which "
    "--remake does not repeat",
    "seed_range": "its seed {seed} is beyond the seeds HalfSafe draws noise from (0 to "
    f"{MAX_SEED:,})",
}


@dataclass(frozen=True)
class PassBox:
    """A box of noise a pass over one region left, proved against the picture made again:
    `box` (x0, y0, x1, y1; ends exclusive), its `share` of the picture, the cells' correlation
    `outside` it, and the structure inside of the file and of the picture made again."""

    box: tuple[int, int, int, int]
    share: float
    outside: float
    structure: float
    made_structure: float

    def to_json(self) -> dict[str, Any]:
        return {
            "box": list(self.box),
            "share": round(self.share, 4),
            "outside": round(self.outside, 4),
            "structure": round(self.structure, 4),
            "made_structure": round(self.made_structure, 4),
        }


@dataclass(frozen=True)
class Remade:
    """The image made again from its record and compared: `verdict` one of REMAKE_VERDICTS,
    `correlation` of the two pictures' brightness, `words` the sentence."""

    verdict: str
    correlation: float
    words: str
    seed: int | None = None
    size: tuple[int, int] | None = None
    box: PassBox | None = None  # verdict "pass_noise": the box a pass left noise in
    # Where it was made at another size than its record's (`made_size`), the sentence.
    note: str | None = None
    # The look of the picture made again (`looks.look`), for a file that shows one; else None.
    look: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "look": self.look,
            "pass_box": self.box.to_json() if self.box is not None else None,
            "correlation": round(self.correlation, 4),
            "seed": self.seed,
            "size": list(self.size) if self.size else None,
            "words": self.words,
        }


def missing(record) -> str | None:
    """What keeps `record` from making its image again (a sentence's end), or None."""
    if record.seed is None or record.seed < 0:
        return _MISSING["seed"]
    if record.seed > MAX_SEED:
        return _MISSING["seed_range"].format(seed=record.seed)
    if not record.steps:
        return _MISSING["steps"]
    if record.scheduler is None:
        return _MISSING["scheduler"]
    if record.hires_size:
        return _MISSING["hires"]
    if record.denoise is not None and record.denoise < 1.0:
        return _MISSING["picture"]
    return None


def request_of(record, width: int, height: int):
    """The generation request that makes `record`'s image again at width x height: its
    prompts, seed, steps, sampler and Clip skip; its CFG scale, or for a guidance-distilled
    model the guidance it recorded (what HalfSafe's CFG scale is for one: Flux.1 dev)."""
    from app.core.generation import GenerationRequest

    cfg = record.guidance if record.guidance is not None else record.cfg
    return GenerationRequest(
        prompt=record.prompt,
        negative_prompt=record.negative_prompt,
        steps=record.steps,
        cfg=cfg if cfg is not None else GenerationRequest.cfg,
        seed=record.seed,
        width=width,
        height=height,
        scheduler=record.scheduler,
        clip_skip=record.clip_skip or 1,
    )


def _snapped(side: int, key: str) -> int:
    """A side as generation takes it: a multiple of its step, within its bounds."""
    from app.core.settings import FIELDS

    field = FIELDS[key]
    step = int(field.step or 1)
    low, high = int(cast(float, field.minimum)), int(cast(float, field.maximum))
    return min(high, max(low, side // step * step))


def made_size(record, file_width: int, file_height: int) -> tuple[tuple[int, int], str | None]:
    """The size to make `record`'s image again at, and a note where it is not the record's:
    the record's where it is no larger than the file (a file enlarged after it was made is
    still that picture), else the file's, so that the work is bounded by what the file shows
    (a 128 px file whose record says 4096x4096 would otherwise take minutes); the file's too
    where the record gives none. Sides snapped as generation takes them (`FIELDS`)."""
    by_file = (_snapped(file_width, "width"), _snapped(file_height, "height"))
    said = f"{by_file[0]}x{by_file[1]}"
    if not (record.width and record.height):
        return by_file, REMAKE_WORDS["no_size"].format(made=said)
    if record.width * record.height <= file_width * file_height:
        return (record.width, record.height), None
    recorded = f"{record.width}x{record.height}"
    return by_file, REMAKE_WORDS["file_size"].format(made=said, recorded=recorded)


def _grid(rgb) -> Any:
    """A picture's brightness, 0..1, averaged over GRID x GRID cells."""
    import numpy as np
    from PIL import Image

    grey = Image.fromarray(np.asarray(rgb, dtype=np.uint8)).convert("L")
    cells = grey.resize((GRID, GRID), Image.Resampling.BOX)
    return np.asarray(cells, dtype=np.float64).ravel() / 255.0


def _correlated(a, b) -> float:
    """The correlation of two grids of cells; 0 where either is flat (nothing to compare)."""
    import numpy as np

    a, b = a - a.mean(), b - b.mean()
    scale = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / scale) if scale > 0 else 0.0


def correlation(file_rgb, made_rgb) -> float:
    """The correlation of two pictures' brightness, each averaged over a GRID x GRID grid of
    cells (uint8 (H, W, 3) arrays, resized to one grid whatever their sizes). 0 where either
    is one flat colour (no picture to compare)."""
    return _correlated(_grid(file_rgb), _grid(made_rgb))


def _cell_means(grey, cell: int):
    """Per `cell` px cell, the mean of a (H, W) float picture cropped to whole cells."""
    rows, columns = grey.shape[0] // cell, grey.shape[1] // cell
    whole = grey[: rows * cell, : columns * cell]
    return whole.reshape(rows, cell, columns, cell).mean(axis=(1, 3))


def pass_box(file_rgb, made_rgb) -> PassBox | None:
    """The box of noise a pass over one region left in `file_rgb` that the picture made
    again (`made_rgb`, resized to the file's size where it differs) shows a picture in, or
    None (see the module's words). uint8 (H, W, 3) arrays."""
    import numpy as np
    from PIL import Image

    from app.core.explain.regions import CELL, FILL, MAX_SHARE, MIN_SIDE, STRENGTH, largest_group
    from app.core.explain.signatures import NOISE_STRUCTURE, noise

    file_rgb = np.asarray(file_rgb, dtype=np.uint8)
    height, width = file_rgb.shape[:2]
    if min(height, width) < 2 * MIN_SIDE:
        return None
    made = Image.fromarray(np.asarray(made_rgb, dtype=np.uint8))
    if made.size != (width, height):
        made = made.resize((width, height), Image.Resampling.LANCZOS)
    made_rgb = np.asarray(made.convert("RGB"))
    grey_file = file_rgb.astype(np.float32).mean(axis=-1) / 255.0
    grey_made = made_rgb.astype(np.float32).mean(axis=-1) / 255.0
    differ = _cell_means(np.abs(grey_file - grey_made), CELL) >= DIFFER
    group = largest_group(differ)
    if not group:
        return None
    rows, columns = [r for r, _ in group], [c for _, c in group]
    top, bottom, left, right = min(rows), max(rows) + 1, min(columns), max(columns) + 1
    cells = (bottom - top) * (right - left)
    if (
        min(bottom - top, right - left) * CELL < MIN_SIDE
        or len(group) < FILL * cells
        or cells > MAX_SHARE * differ.size
    ):
        return None
    inside = np.zeros_like(differ)
    inside[top:bottom, left:right] = True
    outside = _correlated(
        _cell_means(grey_file, CELL)[~inside], _cell_means(grey_made, CELL)[~inside]
    )
    box = (left * CELL, top * CELL, right * CELL, bottom * CELL)
    crop = file_rgb[box[1] : box[3], box[0] : box[2]]
    found, before = noise(crop), noise(made_rgb[box[1] : box[3], box[0] : box[2]])
    spread = float((crop.astype(np.float32) / 255.0).std(axis=(0, 1)).mean())
    if (
        outside < MATCH
        or found is None
        or before is None
        or found.structure > NOISE_STRUCTURE
        or before.structure < PICTURE_STRUCTURE
        or spread < STRENGTH
    ):
        return None
    share = (box[2] - box[0]) * (box[3] - box[1]) / float(width * height)
    return PassBox(box, share, outside, found.structure, before.structure)


def verdict(file_rgb, made_rgb) -> tuple[str, float]:
    """("matches", "inverted" or "differs", the correlation) of a file and the picture made
    again: correlated at MATCH or more and CLOSE to it, or at INVERTED or less and CLOSE to
    its negative (whose cells are 1 minus the picture's)."""
    a, b = _grid(file_rgb), _grid(made_rgb)
    r = _correlated(a, b)
    if r >= MATCH and float(abs(a - b).mean()) <= CLOSE:
        return "matches", r
    if r <= INVERTED and float(abs(a - (1.0 - b)).mean()) <= CLOSE:
        return "inverted", r
    return "differs", r


def _either(found: str, r: float, negative: tuple[str, float]) -> tuple[str, float]:
    """The verdict of a file that may be the picture or its negative, saved alike: "matches"
    where it is either (with that one's correlation), else "differs"; never "inverted"."""
    if found == "matches":
        return found, r
    if negative[0] == "matches":
        return negative
    return "differs", r


def noise_words(record, tool_name: str) -> str:
    """Why a picture made again from another noise source differs (a sentence's end), or ""
    where the noise came from the CPU as HalfSafe's does."""
    if record.noise_source == "cpu":
        return ""
    if record.noise_source in ("gpu", "nv"):
        source = "its RNG setting" if record.noise_source == "nv" else "its default"
        return REMAKE_WORDS["gpu_noise"].format(tool=tool_name, source=source)
    return REMAKE_WORDS["unknown_noise"].format(tool=tool_name)


def remake(
    record,
    file: Path,
    model,
    *,
    precision,
    device: str,
    tool_name: str,
    state_words: str,
    look: str | None = None,
    on_progress=None,
    cancel=None,
) -> Remade:
    """Make the image `file` records again with `model` (its LoRAs applied), as its record
    says, with `precision` (the image's own; a NaN is repaired as generation repairs it), and
    compare the two (`correlation`). Writes nothing. `state_words`: what rules out the tool's
    memory manager, said when the file is the picture's negative. `look`: the file's look
    (`looks`), where it shows one: the picture made again is judged by it instead."""
    import numpy as np
    from PIL import Image, ImageOps

    from app.core.generation.entry import generate_unsaved
    from app.core.images.finished import open_picture

    assert missing(record) is None, "a record that cannot make its image again (`missing`)"
    with open_picture(file) as image:
        # As a viewer shows it: a JPEG's or WebP's EXIF orientation applied.
        file_rgb = np.asarray(ImageOps.exif_transpose(image).convert("RGB"))
    (width, height), size_note = made_size(record, file_rgb.shape[1], file_rgb.shape[0])
    request = request_of(record, width, height)
    result = generate_unsaved(
        model, request, precision=precision, device=device, on_progress=on_progress, cancel=cancel
    )
    made = result.images[0].image
    assert made is not None  # every image generation makes keeps its picture
    made_rgb = np.asarray(made.convert("RGB") if isinstance(made, Image.Image) else made)
    inverts = ""
    if record.inverts:  # what the graph saves is the negative of what the model drew
        made_rgb = 255 - made_rgb
        inverts = REMAKE_WORDS["inverts"].format(node=record.inverts)
    said = f"seed {record.seed}, {width}x{height}, {record.steps} steps"
    if look is not None:
        return _look_remade(look, file_rgb, made_rgb, said, record.seed, (width, height), size_note)
    box = pass_box(file_rgb, made_rgb) if record.second_passes else None
    if box is not None:
        x0, y0, x1, y1 = box.box
        words = REMAKE_WORDS["pass_noise"].format(
            made=said,
            x0=x0,
            y0=y0,
            x1=x1 - 1,
            y1=y1 - 1,
            share=f"{box.share:.0%}",
            outside=box.outside,
            structure=box.structure,
            made_structure=box.made_structure,
        )
        r = correlation(file_rgb, made_rgb)
        return Remade(
            "pass_noise", r, words + inverts, record.seed, (width, height), box, size_note
        )
    found, r = verdict(file_rgb, made_rgb)
    if record.inverts_unsure:
        # The graph saves the negative too: a file that is it matches that save.
        found, r = _either(found, r, verdict(file_rgb, 255 - made_rgb))
        inverts = REMAKE_WORDS["inverts_unsure"].format(node=record.inverts_unsure)
    words = REMAKE_WORDS[found].format(
        made=said, r=r, state=state_words, why=noise_words(record, tool_name)
    )
    return Remade(found, r, words + inverts, record.seed, (width, height), note=size_note)


def _look_remade(
    look: str, file_rgb, made_rgb, said: str, seed, size, size_note: str | None
) -> Remade:
    """A file that shows `look` against the picture made again: a look there too (the model
    draws no picture at these settings) or a picture (the tool's run drew the look)."""
    from app.core.explain.findings import LOOK_NAMES
    from app.core.explain.looks import look as look_of

    made_look = look_of(made_rgb)
    key = "look_clean" if made_look is None else "look_same"
    words = REMAKE_WORDS[key].format(
        made=said, look=LOOK_NAMES[look], made_look=LOOK_NAMES.get(made_look or "", "")
    )
    found, r = verdict(file_rgb, made_rgb)
    return Remade(found, r, words, seed, size, note=size_note, look=made_look)
