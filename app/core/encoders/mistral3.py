"""Mistral 3 Small text encoders (Flux.2 dev's mistral_3_small_flux2): named, not read. Flux.2
dev's tokenizer is not shipped, so a Flux.2 dev file is refused before its encoder is looked
for (`families.flux2.DEV_TOKENIZER_MISSING`); no file is told to be one."""

from __future__ import annotations

from typing import Any

from app.core.encoders.kind import TextEncoderKind
from app.core.errors import UnsupportedModelError
from app.core.formats.layouts import Need, Shapes


class Mistral3Kind(TextEncoderKind):
    key = "mistral3"
    name = "Mistral 3"
    classes = ("Mistral3",)

    def holds(self, shapes: Shapes) -> bool:
        return False

    def embedding(self, shapes: Shapes) -> str:
        return "model.embed_tokens.weight"

    def width(self, shapes: Shapes) -> int | None:
        return None

    def load(self, checkpoint, prefix: str, need: Need, configs: str) -> tuple[Any, list]:
        raise UnsupportedModelError(checkpoint.path, "HalfSafe does not read Mistral 3 files.")


MISTRAL3 = Mistral3Kind()
