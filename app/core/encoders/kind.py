"""What the part kinds share (`formats.layouts.PartKind`): a text encoder's words, its width
from its token embedding and its tokenizer as a pipeline component; a VAE's words. Each kind
is a module of its own beside this one (`t5`, `clip`, `qwen3`, `qwen25_vl`, `qwen3_vl`,
`mistral3`, `vaes`); `kinds` lists them."""

from __future__ import annotations

from typing import Any

from app.core.formats.layouts import Need, PartKind, Shapes


class TextEncoderKind(PartKind):
    """A kind of text-encoder file: `holds`, `config` and `tensors` say how one is read; the
    rest follows."""

    text_encoder = True
    # transformers' classes of this kind, as a diffusers folder's config names them (a class
    # name starting with one of these).
    classes: tuple[str, ...] = ()
    # What it offers a need: its text projection's width (SD3.x's CLIPs), not its hidden width.
    projected = False

    @property
    def words(self) -> str:
        return f"{self.name} text encoder"

    def embedding(self, shapes: Shapes) -> str:
        """The key of its token embedding in a file of this kind."""
        raise NotImplementedError

    def embedding_width(self, shapes: Shapes) -> int | None:
        """Its hidden width from its token embedding alone (None where the file has none):
        what a part is called, not whether it can be built."""
        shape = shapes.get(self.embedding(shapes), ())
        return shape[1] if len(shape) == 2 else None

    def of_class(self, class_name: str) -> bool:
        return class_name.startswith(self.classes)

    def tokenizer(self, need: Need) -> Any:
        raise NotImplementedError

    def prompt_reader(self, need: Need) -> tuple[str, Any] | None:
        return need.component.replace("text_encoder", "tokenizer"), self.tokenizer(need)


class VaeKind(PartKind):
    """A kind of VAE file, told by its layout; what it offers is its latent channels."""

    name = "VAE"
    text_encoder = False
    # Its files' layout in words where it is not the original one ("the Wan 2.1 layout"), and
    # the diffusers class a folder of it declares.
    layout = ""
    diffusers_class = "AutoencoderKL"

    @property
    def words(self) -> str:
        return "VAE"

    def prompt_reader(self, need: Need) -> tuple[str, Any] | None:
        return None
