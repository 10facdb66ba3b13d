"""Every text-encoder kind HalfSafe reads, in the order a file is told by (a Qwen3-VL holds a
Qwen3's names, so it is asked first), what a file, a transformers class or a loaded encoder
is, and the layers the kinds keep wider themselves (`own_islands`)."""

from __future__ import annotations

from app.core.encoders.clip import CLIP
from app.core.encoders.kind import OwnIsland, TextEncoderKind
from app.core.encoders.qwen3 import QWEN3
from app.core.encoders.qwen3_vl import QWEN3_VL
from app.core.encoders.qwen25_vl import QWEN25_VL
from app.core.encoders.t5 import T5
from app.core.formats.layouts import Shapes

TEXT_ENCODERS: tuple[TextEncoderKind, ...] = (T5, CLIP, QWEN25_VL, QWEN3_VL, QWEN3)
# Every kind's own islands, each under its own setting.
OWN_ISLANDS: tuple[OwnIsland, ...] = tuple(i for kind in TEXT_ENCODERS for i in kind.own_islands)


def text_encoder_kind(shapes: Shapes) -> TextEncoderKind | None:
    """The kind of text encoder a file holds, in the layout its files use, or None."""
    return next((kind for kind in TEXT_ENCODERS if kind.holds(shapes)), None)


def class_kind(class_name: str) -> TextEncoderKind | None:
    """The kind of text encoder a transformers class is ("T5EncoderModel": T5), or None."""
    return next((kind for kind in TEXT_ENCODERS if kind.of_class(class_name)), None)


def module_kind(module) -> TextEncoderKind | None:
    """The kind of a loaded text encoder (a transformers model), or None."""
    return next((kind for kind in TEXT_ENCODERS if kind.is_module(module)), None)


def own_islands(module) -> tuple[OwnIsland, ...]:
    """The layers a loaded part's kind keeps wider itself; none for a part of no such kind."""
    kind = module_kind(module)
    return kind.own_islands if kind is not None else ()


def own_island(setting: str) -> OwnIsland | None:
    """The kinds' own island `setting` keeps wider, or None for another setting."""
    return next((i for i in OWN_ISLANDS if i.setting == setting), None)


def words() -> str:
    """ "CLIP, T5, Qwen3, Qwen2.5-VL or Qwen3-VL" """
    names = [kind.name for kind in (CLIP, T5, QWEN3, QWEN25_VL, QWEN3_VL)]
    return ", ".join(names[:-1]) + " or " + names[-1]
