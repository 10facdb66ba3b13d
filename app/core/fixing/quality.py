"""What "verified" measures: how closely a repaired part's output agrees with an fp32 reference of
the same inputs (`Quality`, a signal-to-noise ratio in dB), and the one table of words the pages
say it in. A fix is verified when its output is finite **and** agrees; finite is not enough, as
a clamp that saturates or a precision loss can give finite nonsense.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

# Agreement with the fp32 reference, as a signal-to-noise ratio in dB:
#   SNR = 10 * log10(sum(reference^2) / sum((output - reference)^2)).
# bf16 keeps 8 mantissa bits (about 0.4% error per value): the bf16 fixes of the test suite's
# planted faults measure 32-45 dB against fp32 (text encoder, UNet over the probe's three steps,
# decoded image). 20 dB allows an error of 10% of the signal's power, which no precision change
# of a working component comes near, while a saturating clamp lands far below it (the tests'
# clamp of a VAE layer: under 5 dB).
QUALITY_METRIC = "snr_db"
QUALITY_THRESHOLD_DB = 20.0
QUALITY_CEILING_DB = 200.0  # identical outputs: reported as this instead of infinity


@dataclass(frozen=True)
class Quality:
    """How closely an output matches the fp32 reference of the same inputs."""

    value: float
    metric: str = QUALITY_METRIC
    threshold: float = QUALITY_THRESHOLD_DB

    @property
    def passed(self) -> bool:
        return math.isfinite(self.value) and self.value >= self.threshold

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": round(self.value, 2), "threshold": self.threshold}

    def words(self) -> str:
        """The figure as the check writes it into its sentences (`QUALITY_FIGURE` reads it
        back): '47.3 dB against fp32, threshold 20 dB', 'identical against fp32, ...'."""
        return f"{self.figure()} against fp32, threshold {self.threshold:g} dB"

    def figure(self) -> str:
        """The figure alone, for a table's cell: '47.3 dB', 'identical' (at the ceiling, an
        output the same as fp32's, never '200.0 dB')."""
        return "identical" if self.value >= QUALITY_CEILING_DB else f"{self.value:.1f} dB"

    def plain_words(self) -> str:
        """The figure in the pages' plain words (`AGREEMENT_WORDS`)."""
        if self.value >= QUALITY_CEILING_DB:
            return AGREEMENT_WORDS["identical"]
        if not self.passed:  # NaN and -inf too
            return AGREEMENT_WORDS["differs"]
        return AGREEMENT_WORDS["close" if self.value >= CLOSE_DB else "enough"]

    def figure_words(self) -> str:
        """What the plain words stand for, in one clause: how far the output was from an fp32
        run of the same inputs, as a share of its size (20 dB is 10%)."""
        if self.value >= QUALITY_CEILING_DB:
            return "its output was the same as an fp32 run of the same inputs"
        if not math.isfinite(self.value):
            return "its output was not finite, so it could not be compared with fp32"
        off = _share_off(self.value)
        how = f"within about {off} of" if self.passed else f"about {off} off"
        return (
            f"its output was {how} an fp32 run of the same inputs ({self.value:.1f} dB "
            f"signal-to-noise; a fix counts as verified from {self.threshold:g} dB, about "
            f"{_share_off(self.threshold)})"
        )


# A fix's agreement with fp32 in the pages' plain words: the one table for it.
AGREEMENT_WORDS = {
    "identical": "identical to full precision",
    "close": "matches full precision closely",
    "enough": "close enough to full precision",
    "differs": "differs from full precision",
}
CLOSE_DB = 30.0  # "matches closely" from here: an error of 3% of the output's size
# `Quality.words` as written into a check's sentences, in parentheses or not.
QUALITY_FIGURE = re.compile(
    r"(\()?(identical|(-?[\d.]+|-?inf|nan) dB) against fp32, threshold ([\d.]+) dB(?(1)\))"
)


def _share_off(db: float) -> str:
    share = 100 * 10 ** (-db / 20)
    return "less than 0.01%" if share < 0.01 else f"{share:.2g}%"


def qualities_in(text: str) -> list[Quality]:
    """The figures `Quality.words` wrote into a check's sentence, in order: a headline or a
    fix's summary kept as text (a saved report, a remembered fix) read back by the one module
    that writes them."""
    found = []
    for match in QUALITY_FIGURE.finditer(text):
        value = QUALITY_CEILING_DB if match.group(3) is None else float(match.group(3))
        found.append(Quality(value, threshold=float(match.group(4))))
    return found


def plain_figures(text: str) -> str:
    """A check's sentence with each figure in plain words: '...verified fix (47.3 dB against
    fp32, threshold 20 dB)...' -> '...verified fix (matches full precision closely)...'."""

    def plain(match: re.Match[str]) -> str:
        value = QUALITY_CEILING_DB if match.group(3) is None else float(match.group(3))
        said = Quality(value, threshold=float(match.group(4))).plain_words()
        return f"({said})" if match.group(1) else said

    return QUALITY_FIGURE.sub(plain, text)


def snr_db(output: Any, reference: Any) -> float:
    """Signal-to-noise ratio of `output` against `reference` in dB, over every floating tensor
    of both (matched in order). -inf when the output is non-finite or shaped differently; the
    ceiling when they are identical."""
    from app.core.run.probe import float_tensors

    outputs, references = list(float_tensors(output)), list(float_tensors(reference))
    if len(outputs) != len(references) or not references:
        return -math.inf
    signal = noise = 0.0
    for out, ref in zip(outputs, references, strict=True):
        if out.shape != ref.shape:
            return -math.inf
        ref32 = ref.detach().float()
        diff = out.detach().to(ref32.device).float() - ref32
        signal += float(ref32.square().sum())
        noise += float(diff.square().sum())
    if not (math.isfinite(noise) and math.isfinite(signal)):
        return -math.inf
    if noise == 0.0:
        return QUALITY_CEILING_DB
    if signal == 0.0:
        return -math.inf
    return min(QUALITY_CEILING_DB, 10.0 * math.log10(signal / noise))


def compare(output: Any, reference: Any) -> Quality:
    return Quality(snr_db(output, reference))
