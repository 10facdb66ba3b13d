"""How long something took or will take, in one way wherever it is said (the command line's
progress lines, the window's status): "45 s", "4 min 05 s", "2 h 03 min"."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """`seconds` rounded to the second first, so that 299.6 s is "5 min 00 s", never
    "4 min 60 s"; negative as 0."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, whole = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {whole:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
