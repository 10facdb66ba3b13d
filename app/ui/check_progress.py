"""What a running health check has said so far, as the Health check page shows it while it runs:
the stage it is at, each stage's name and step, what it found, how much of the check is done."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from app.ui import words

# How the check names a stage, one part of the model after another ("Checking the UNet", sent
# as k of n): the bar is split into those stages, and every other phase fills the one it is in.
STAGE_WORDS = "Checking the "


@dataclass
class CheckProgress:
    """What a running check has said so far: the stage it is at (one part of the model, `index`
    of `count` from 0; count 0 until a stage is named), each stage's name, the step within the
    stage, what it found, and how much of the whole check is done (`filled`, 0 to 1)."""

    count: int = 0
    index: int = -1
    names: dict[int, str] = field(default_factory=dict)
    step: str = ""
    findings: dict[int, list[str]] = field(default_factory=dict)  # by stage; -1: before any
    filled: float = 0.0
    halted: bool = False
    _phase: str = ""
    _phase_start: float = 0.0

    def advance(self, stage: str, done: int, total: int) -> None:
        """A progress event: a new stage, or a step within the current one."""
        if stage.startswith(STAGE_WORDS) and total >= 2 and 0 <= done < total:
            self.count, self.index = total, done
            self.names[done] = stage
            self.step, self._phase = "", ""
            self.filled = max(self.filled, done / total)
            return
        self.step = stage
        if not self.count:
            return
        end = (self.index + 1) / self.count
        phase = stage.split(":")[0]  # "Trying a fix: …" names each candidate it tries
        if phase != self._phase:
            self._phase, self._phase_start = phase, self.filled
        counted = total > 1 or (total == 1 and done >= 1)
        share = min(done / total, 1.0) if counted else 0.0
        # A step fills at most half of what is left of its stage, as steps follow one another
        # with no count of them: the bar never goes back, nor fills before the stage ends.
        start = self._phase_start
        self.filled = max(self.filled, start + share * (end - start) / 2)

    def found(self, message: str) -> None:
        self.findings.setdefault(self.index if self.count else -1, []).append(message)

    def writing(self) -> None:
        self.index, self.step, self.filled = self.count, "Writing the report", 1.0

    def stopped(self) -> None:
        self.halted = True

    def lines(self) -> list[str]:
        """The card's lines, as rich text: every stage reached, ticked or current, and what
        each found; then how many parts are left."""
        lines = [f"⚠ {html.escape(f)}" for f in self.findings.get(-1, [])]
        step = html.escape(self.step)
        if not self.count:
            if self.halted:
                return [*lines, f"✗ Stopped: {step}." if step else "✗ Stopped before it began."]
            return [*lines, f"▶ {step or 'Starting'}…"]
        for index in range(min(self.index + 1, self.count)):
            name = self.names.get(index, f"Stage {index + 1}")
            part = html.escape(words.first_upper(name.removeprefix(STAGE_WORDS)))
            if index < self.index:
                lines.append(f"✓ {part}")
            elif self.halted:
                lines.append(f"✗ <b>{part}</b>: stopped" + (f" ({step})" if step else ""))
            else:
                lines.append(f"▶ <b>{part}</b>: {step or 'checking'}…")
            lines.extend(
                f"&nbsp;&nbsp;&nbsp;⚠ {html.escape(f)}" for f in self.findings.get(index, [])
            )
        left = self.count - self.index - 1
        parts = f"{left} more part{'s' if left > 1 else ''}"
        if left > 0:
            lines.append(
                f"{parts} not checked." if self.halted else f"{parts} to check after this one."
            )
        elif self.index >= self.count and step:
            lines.append(f"▶ {step}…")
        return lines
