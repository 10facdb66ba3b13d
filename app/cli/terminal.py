"""Text as the terminal receives it: what came from files and arguments (tensor and file names,
a family name, a record's words) made safe to print, at the one place the CLI prints.

A name in a model file can hold a newline and escape codes: printed raw, it draws lines HalfSafe
never wrote (a green "Verdict: Healthy" inside a refusal), moves the cursor, or retitles the
window. So every control character but the tab (and the newline of a multi-line report) is shown
as its escape (`\\x1b`, `\\n`), as are the marks that reorder text right to left; and a run of
characters without a space longer than MAX_RUN (a 100,000-character family name) is shortened
to its ends, with a count of what was left out. JSON output needs none of this: json.dumps
escapes every control character, and is printed as it is.
"""

from __future__ import annotations

import re

# A run of characters without a space that is printed whole: a long path or tensor name fits.
MAX_RUN = 300
_HEAD, _TAIL = 120, 40  # characters kept of a longer run, from its start and its end

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional marks, embeddings,
# overrides and isolates (which make text read in another order than it is stored).
_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_IN_LINES = re.compile(f"[{_CONTROLS}]")
_IN_ONE_LINE = re.compile(f"[{_CONTROLS}\n]")
_LONG_RUN = re.compile(rf"\S{{{MAX_RUN + 1},}}")


def for_terminal(text: object, *, one_line: bool = False) -> str:
    """`text` as it may be printed: control characters as their escapes (with `one_line`, the
    newline too: an error sentence or a warning is one line whatever names it holds), and each
    run of more than MAX_RUN characters without a space shortened to its ends around "...",
    saying how many characters were left out."""
    pattern = _IN_ONE_LINE if one_line else _IN_LINES
    shown = pattern.sub(lambda found: ascii(found.group())[1:-1], str(text))
    return _LONG_RUN.sub(_shortened, shown)


def _shortened(found: re.Match[str]) -> str:
    run = found.group()
    left_out = len(run) - _HEAD - _TAIL
    return f"{run[:_HEAD]}...[{left_out:,} characters left out]...{run[-_TAIL:]}"
