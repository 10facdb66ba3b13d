"""A LoRA the user asked for (`LoraRequest`), as plain data.

It lives apart from the LoRA reader (`lora`, which re-exports it and imports the checkpoint
reader and scanner): the window builds these for its job requests and must not import the
reader to do so. Imports no other HalfSafe module.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoraRequest:
    """A LoRA the user asked for: a path (or a name to look up) and its weight."""

    path: str
    weight: float = 1.0
