"""The answer `halfsafe advise` and the Models page lead with: which file of a family to take on
this device, why not the ones that keep more bits, what int8 ConvRot gains here, and on a CPU
how long a picture takes; then one table row per stored form (runs here?, card GB, RAM GB,
proved by a check?).

The rule: of the forms that run here (their parts fit on the card, whole or streamed block by
block, and the files fit in RAM), one that runs whole on the card beats one that streams (a
streamed block crosses to the card at every step), and then the form that keeps more of the
weights' precision wins (`KEEPS_MOST_FIRST`). HalfSafe decodes every quantised layer to the
precision it computes in, so no form computes faster than another here: memory alone decides.

No torch here: the window asks this too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.core.advice.sizes import GIB, NO_ROOM, STREAMS, WHOLE, SizeFit, family_table

if TYPE_CHECKING:
    from app.core.advice.advise import FamilyAdvice, FormAdvice

# Forms by how much of the weights' precision they keep: 16 bits; Q8_0's block scales beside
# int8 ConvRot's rotated rows and fp8's per-tensor scale (8 bits each); Q4_K's scaled
# sub-blocks beside NVFP4's and Q4_0's 4 bits.
KEEPS_MOST_FIRST = ("bf16", "gguf-q8_0", "int8-convrot", "fp8", "gguf-q4_k", "nvfp4", "gguf-q4_0")
# What the table says a form does here.
RUNS_WORDS = {
    WHOLE: "yes, whole on the card",
    STREAMS: "yes, streams {parts}",
    "ram": "yes, in RAM",
    NO_ROOM: "no: no room on the card",
    "too big": "no: more than this RAM",
    "unknown": "memory unknown",
    "unprojected": "not projected yet",
}
PROVED_WORDS = {None: "no", "healthy": "yes, healthy", "fixable": "yes, fixable"}
# A desktop CPU's fp32 rate in PyTorch's matrix products (8 cores with AVX2 or AVX-512 reach
# about this much), in FLOP/s: the rate the CPU estimate divides by.
CPU_FLOPS = 0.5e12
# A UNet reuses each weight at every position of its layer's resolution, most of its weights at
# the lower ones: its work per call is 2 FLOP per weight per this share of the latent's
# positions (SD1.x's UNet: 339 GMAC per call at 512 px, BK-SDM's count, over 860M weights and
# 4096 positions).
UNET_POSITION_SHARE = 0.096
TRANSFORMER_PATCH = 16  # pixels a side per token: the VAE's 8x and the 2x2 patches


@dataclass(frozen=True)
class Row:
    """One table row: a form (and the projected model, where the family has several), whether
    it runs here (a `RUNS_WORDS` key), the most the card holds at once, the RAM it takes, and
    whether a saved check proved it on this device."""

    form: str
    words: str
    model: str
    runs: str
    runs_words: str
    card_bytes: int | None
    ram_bytes: int | None
    proved: str
    streamed: tuple[str, ...] = ()

    @property
    def runs_here(self) -> bool:
        return self.runs in (WHOLE, STREAMS, "ram")

    def cells(self) -> tuple[str, str, str, str, str]:
        """The row as the table shows it: form, runs here?, card GB, RAM GB, proved?"""
        return (
            self.words,
            self.runs_words,
            _gb(self.card_bytes),
            _gb(self.ram_bytes),
            self.proved,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "form": self.form,
            "model": self.model or None,
            "runs": self.runs,
            "runs_here": self.runs_here,
            "card_bytes": self.card_bytes,
            "ram_bytes": self.ram_bytes,
        }


HEADER = ("form", "runs here?", "card GB", "RAM GB", "proved by a check?")


def rows(forms: Sequence[FormAdvice], gpu: bool) -> list[Row]:
    """One row per form and projected model, in the family's order of forms."""
    table = []
    for form in forms:
        proved = PROVED_WORDS.get(form.proof.verdict, "checked: broken")
        if not form.sizes:
            table.append(
                Row(form.form, form.words, "", "unprojected", RUNS_WORDS["unprojected"], None,
                    None, proved)
            )  # fmt: skip
        several = len(form.sizes) > 1
        for fit in form.sizes:
            runs = _runs(fit, gpu)
            words = RUNS_WORDS[runs].format(parts=_parts(fit.streamed))
            table.append(
                Row(
                    form.form,
                    f"{form.words}, {fit.model}" if several else form.words,
                    fit.model,
                    runs,
                    words,
                    fit.card_peak if runs in (WHOLE, STREAMS) else None,
                    fit.ram_needed,
                    proved,
                    fit.streamed,
                )
            )
    return table


def _runs(fit: SizeFit, gpu: bool) -> str:
    if fit.ram_fits is False:
        return "too big"
    if not gpu:
        return "ram" if fit.ram_fits else "unknown"
    if fit.card is None:
        return "unknown"
    return fit.card


def _rank(row: Row) -> tuple[int, int]:
    placed = 1 if row.runs == STREAMS else 0
    return placed, KEEPS_MOST_FIRST.index(row.form)


def choose(table: Sequence[Row], model: str) -> Row | None:
    """The row to take for projected model `model`: None where no form of it runs here."""
    runs = [row for row in table if row.model == model and row.runs_here]
    return min(runs, key=_rank) if runs else None


def answer_words(advice: FamilyAdvice, table: Sequence[Row]) -> str:
    """The answer: which file to take on this device (per projected model), why not the one
    that keeps more bits, what int8 ConvRot gains here, and on a CPU how long a picture takes."""
    device = advice.device
    gpu = device.kind not in ("cpu", "mps")
    where = f"On this {device.name}" if gpu else f"On this {_device_words(advice)}"
    models = list(dict.fromkeys(row.model for row in table if row.model))
    if not models:
        return (
            f"{where}: HalfSafe has no projection of {advice.title}'s size at real size yet, so "
            "it cannot say which file fits; the table says what this device does with each form."
        )
    several = len(models) > 1
    takes = []
    for model in models:
        chosen = choose(table, model)
        named = f"for {model} " if several else ""
        if chosen is None:
            takes.append(f"{named}no published form runs here: {_smallest(table, model)}")
            continue
        takes.append(
            f"{named}take the {chosen.words.split(',')[0]} file ({_needs(chosen, gpu)})"
            f"{_why_not(table, chosen)}"
        )
    sentences = [f"{where}: {'; '.join(takes)}."]
    if device.kind == "cpu" and any(choose(table, model) for model in models):
        sentences.append(_cpu_speed(advice, models))
    int8 = _int8_words(advice, table)
    if int8:
        sentences.append(int8)
    return " ".join(sentences)


def _device_words(advice: FamilyAdvice) -> str:
    kind = {"cpu": "CPU", "mps": "Apple GPU"}[advice.device.kind]
    ram = f", {advice.ram_bytes / GIB:.0f} GB of RAM" if advice.ram_bytes else ""
    return f"{kind} ({advice.device.name}{ram})"


def _needs(row: Row, gpu: bool) -> str:
    ram = f"{_gb(row.ram_bytes)} GB of RAM"
    if not gpu:
        return ram
    if row.runs == STREAMS:
        placed = f"streaming its {_parts(row.streamed)} block by block"
    else:
        placed = "whole"
    proved = {
        PROVED_WORDS["healthy"]: ", proved healthy here by a saved check",
        PROVED_WORDS["fixable"]: ", with a fix a saved check proved here",
    }.get(row.proved, "")
    return f"{_gb(row.card_bytes)} GB on the card at most, {placed}; {ram}{proved}"


def _parts(names: Sequence[str]) -> str:
    from app.core.components import words

    return " and ".join(words(name) for name in names)


def _why_not(table: Sequence[Row], chosen: Row) -> str:
    """Why the nearest form that keeps more bits is not the answer ("" where none does)."""
    better = [
        row
        for row in table
        if row.model == chosen.model
        and KEEPS_MOST_FIRST.index(row.form) < KEEPS_MOST_FIRST.index(chosen.form)
    ]
    if not better:
        return ""
    nearest = max(better, key=lambda row: KEEPS_MOST_FIRST.index(row.form))
    name = nearest.words.split(",")[0]
    if nearest.runs == "too big":
        why = f"needs {_gb(nearest.ram_bytes)} GB of RAM, more than this computer has"
    elif nearest.runs == NO_ROOM:
        why = "has no room on this card"
    elif nearest.runs == STREAMS:
        why = (
            f"keeps more bits but streams its {_parts(nearest.streamed)} block by block at "
            "every step"
        )
    else:
        why = "cannot be judged here"
    return f"; {name} {why}"


def _smallest(table: Sequence[Row], model: str) -> str:
    mine = [row for row in table if row.model == model]
    smallest = min(mine, key=lambda row: row.ram_bytes or 0)
    name = smallest.words.split(",")[0]
    if smallest.runs == "too big":
        return f"the smallest, {name}, needs {_gb(smallest.ram_bytes)} GB of RAM, more than this computer has"
    return f"the smallest, {name}, has no room on this card"


def _cpu_speed(advice: FamilyAdvice, models: Sequence[str]) -> str:
    """How long a picture takes on a CPU, from the first projected model's denoiser weights: a
    rough lower bound (attention's own work left out)."""
    work = step_flops(advice.architecture, advice.family, models[0])
    if work is None:
        return ""
    side, flops = work
    named = f" of {models[0]}" if len(models) > 1 else ""
    step_s = flops / CPU_FLOPS
    steps = _steps(advice)
    return (
        f"It runs on a CPU, but slowly: each step of a {side} px picture{named} is about "
        f"{flops / 1e12:.{0 if flops >= 1e13 else 1}f} TFLOP, some {_duration(step_s)} at the "
        f"{CPU_FLOPS / 1e12:g} TFLOP/s a desktop CPU computes in fp32, so "
        f"{_duration(step_s * steps)} or more for {steps} steps."
    )


def step_flops(architecture: str, family_id: str, model: str) -> tuple[int, float] | None:
    """(picture side in px, FLOP of one denoiser call at that side) for the projection whose
    words are `model`; None where the family has none."""
    from app.core.advice.sizes import projections_for

    data = family_table()
    for key in projections_for(family_id, architecture):
        projected = data["projections"][key]
        if projected["words"] != model:
            continue
        side = int(data.get("picture_side", {}).get(key, 1024))
        name, part = next(iter(projected["parts"].items()))
        if name == "unet":
            positions = (side / 8) ** 2 * UNET_POSITION_SHARE
        else:
            positions = (side / TRANSFORMER_PATCH) ** 2
        return side, 2 * part["parameters"] * positions
    return None


def _steps(advice: FamilyAdvice) -> int:
    from app.core.families.registry import family
    from app.core.settings.schema import FIELDS

    defaults = family(advice.family).generation_defaults(advice.architecture)
    return defaults.steps if defaults is not None else int(FIELDS["steps"].default)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds / 3600:.1f} hours"


def _int8_words(advice: FamilyAdvice, table: Sequence[Row]) -> str:
    """Why int8 ConvRot runs no faster here, where the family publishes it and it is not the
    answer: HalfSafe decodes it as every form, and what other tools' int8 kernels would do."""
    int8 = next((form for form in advice.forms if form.form == "int8-convrot"), None)
    if int8 is None or any(
        choose(table, row.model) == row for row in table if row.form == int8.form
    ):
        return ""
    precision = int8.use.precision
    sentence = (
        f"int8 ConvRot runs no faster here: HalfSafe decodes each of its layers to {precision} "
        "as it computes, as it does every form"
    )
    if int8.use.use != "native":
        return sentence + ", and this device has no int8 tensor cores for other tools' kernels."
    return sentence + "; tools with int8 kernels (ComfyUI's) may run it faster on this card."


def _gb(value: int | None) -> str:
    return "-" if value is None else f"{value / GIB:.1f}"
