"""What the part kinds share (`formats.layouts.PartKind`): a text encoder's words, its width
from its token embedding and its tokenizer as a pipeline component, the layers it keeps wider
itself (`OwnIsland`); a VAE's words. Each kind is a module of its own beside this one (`t5`, `clip`, `qwen3`, `qwen25_vl`, `qwen3_vl`,
`mistral3`, `vaes`); `kinds` lists them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.formats.layouts import Need, PartKind, Shapes


@dataclass(frozen=True)
class OwnIsland:
    """Layers a kind of part keeps wider than the part runs in, as the library it comes from
    keeps them (transformers' `_keep_in_fp32_modules`), under a public setting of their own:
    the plan, its placement, its words and the check's fixes ask the kind for them
    (`kinds.own_islands`), never name it."""

    # The setting that keeps them wider (a bool), and the dtype they then run in.
    setting: str
    dtype: str
    # How their module paths end.
    ending: str
    # A first failing layer whose path holds this is one the island is a fix for.
    within: str
    # Whether the layers they feed cast back (`placement._make_islands`): False where the
    # library runs them without, its own next layer taking the wider values back itself.
    guarded: bool
    # The fix's row in the check's fix table (`fix_candidates.FIX_KINDS`, named in reports),
    # and what it is there.
    fix: str
    about: str
    # The setting on, said as a step of a fix ("keep ... in fp32"), and the plan's reason
    # where the user set it.
    words: str
    asked: str

    def holds(self, path: str) -> bool:
        """Whether a layer of a part of this kind, at `path`, is one of the island's."""
        return path.endswith(self.ending)

    def layers(self, module) -> dict[str, str]:
        """The island in a loaded part of this kind: its layers' paths -> their dtype."""
        return {path: self.dtype for path, _ in module.named_modules() if self.holds(path)}


class TextEncoderKind(PartKind):
    """A kind of text-encoder file: `holds`, `config` and `tensors` say how one is read; the
    rest follows."""

    text_encoder = True
    # transformers' classes of this kind, as a diffusers folder's config names them (a class
    # name starting with one of these).
    classes: tuple[str, ...] = ()
    # What it offers a need: its text projection's width (SD3.x's CLIPs), not its hidden width.
    projected = False
    # The layers it keeps wider than the part runs in, each under its own setting.
    own_islands: tuple[OwnIsland, ...] = ()

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

    def is_module(self, module) -> bool:
        """Whether a loaded text encoder (a transformers model) is of this kind."""
        return self.of_class(type(module).__name__)

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
