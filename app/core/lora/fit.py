"""Whether a LoRA fits the model it is applied to: refused before the model is touched where its
key names tell that it was made for another family (or for a UNet reading text of another
width), and, while diffusers loads it, its layers counted against those the model took, with
the sentence for a LoRA that fits only in part or not at all.

The families, the model parts and the metadata reader are imported inside the functions that
need them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.core.errors import HalfSafeError

if TYPE_CHECKING:
    from app.core.lora.files import LoraFile


@dataclass
class LoraFit:
    """How much of a LoRA a model took, filled in as it is loaded: `offered`, the layers
    diffusers' converter made of the file for the model's parts (None where not seen), `parts`,
    the parts it named (`unet`, `text_encoder`, ...), and `applied`, the model's layers that
    hold the adapter now."""

    offered: int | None = None
    parts: tuple[str, ...] = ()
    applied: int = 0

    def note(self, name: str, model: str) -> str | None:
        """The sentence for a LoRA of which the model has only some layers, None when it has
        them all (or they were not counted)."""
        if self.offered is None or self.applied >= self.offered:
            return None
        missing = self.offered - self.applied
        return (
            f"Only {self.applied} of the {self.offered} layers of the LoRA {name} exist in "
            f"{model}: it runs with those, the other {missing} were not applied (is it made "
            "for another model?)."
        )

    def refusal(
        self, model: str, error: BaseException | None = None, loaded: Sequence[str] = ()
    ) -> str:
        """Why the LoRA is not applied, completing "<file>: ": none of its layers exist in the
        model (without `error`, or where peft refused a part that matches no layer at all:
        the part is named when it is the only one of its parts not `loaded`), or the loader's
        own `error`."""
        from app.core.components import words

        if error is not None and "not found in the base model" not in str(error):
            return f"the LoRA does not fit {model} ({_first_line(error)})."
        failed = [part for part in self.parts if part not in loaded] or list(self.parts)
        if error is not None and len(self.parts) > 1:
            which = " or ".join(f"the {words(part)}" for part in failed)
            return (
                f"the LoRA does not fit {model}: none of its layers for {which} exist there "
                "(it is made for another model), so it is not applied."
            )
        layers = f"{self.offered} " if self.offered else ""
        return (
            f"none of the LoRA's {layers}layers exist in {model}, so it changes nothing (it is "
            "made for another model)."
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line if len(line) <= 200 else line[:197] + "..."


# The key endings of a layer's down (A) factor as diffusers' converters write them for the
# model's parts: one per layer, whatever the layout the file came in.
_DOWN_ENDINGS = ("lora_A.weight", "lora.down.weight", "lora_down.weight")


@contextlib.contextmanager
def counting_layers(pipeline, fit: LoraFit) -> Iterator[None]:
    """While diffusers loads a LoRA into `pipeline`, count the layers of the state dict its
    converter hands the model's parts (into `fit`): the layers a part lacks are dropped by peft
    without a word, so this count is what the applied ones are held to."""
    convert = getattr(pipeline, "lora_state_dict", None)
    if convert is None:  # not a diffusers loader: nothing to count
        yield
        return

    def converted(*args: Any, **kwargs: Any) -> Any:
        result = convert(*args, **kwargs)
        state_dict = result[0] if isinstance(result, tuple) else result
        if isinstance(state_dict, dict):
            downs = [str(key) for key in state_dict if str(key).endswith(_DOWN_ENDINGS)]
            fit.offered = len(downs)
            fit.parts = tuple(sorted({key.partition(".")[0] for key in downs}))
        return result

    vars(pipeline)["lora_state_dict"] = converted  # the instance's, over the class's
    try:
        yield
    finally:
        vars(pipeline).pop("lora_state_dict", None)


def loaded_model_words(model) -> str:
    """ "the SDXL model x.safetensors" for a loaded model."""
    from app.core.families import architecture_title
    from app.core.models.parts import model_words

    return model_words(
        architecture_title(getattr(model, "architecture", None)), "model", model.source
    )


def check_made_for(file: LoraFile, model) -> None:
    """Refuse, from its key names and shapes alone and before the model is touched, a LoRA
    made for another family than `model`'s (its layers in another family's transformer
    layout, or another count of text encoders), or a UNet LoRA whose cross-attention reads
    text of another width than the model's UNet (SD2's 1024 on SD1's 768). One sentence
    naming the LoRA, the model and what each belongs to (WrongPartError); a LoRA whose names
    do not tell is left to the loader, whose refusal names the model too."""
    from app.core.families import family_of
    from app.core.models import parts

    try:
        family = family_of(model.pipeline)
    except HalfSafeError:
        return
    made_for = parts.lora_of(file.tensors)
    words = loaded_model_words(model)
    if made_for.families and family.title not in made_for.families:
        parts.refuse(file.path, made_for, words, f"a LoRA made for {family.title}", model.source)
    unet = getattr(model.pipeline, "unet", None)
    width = parts.cross_attention_width(file.tensors)
    wanted = getattr(getattr(unet, "config", None), "cross_attention_dim", None)
    if unet is not None and width is not None and isinstance(wanted, int) and width != wanted:
        found = parts.PartOf(f"a LoRA for a UNet reading {width}-wide text", made_for.families)
        parts.refuse(
            file.path,
            found,
            words,
            f"a LoRA for {wanted}-wide text, as its UNet reads",
            model.source,
        )


def refuse_told(lora: LoraFile, pipeline, fit: LoraFit, model: str, source) -> None:
    """A LoRA of which the model has only some layers, refused (WrongPartError, one sentence)
    where the family it was made for can be told and is not the model's: by its metadata (the
    base model its trainer wrote), else by its whole key set (every layer it adapts is a
    module of another family's transformer). Layer names that merely happen to match in part
    are no fit."""
    from app.core.families import FAMILIES, family_of
    from app.core.models import parts

    try:
        family = family_of(pipeline)
    except HalfSafeError:
        return
    told = made_for(lora)
    kin = {f.title for f in FAMILIES if str(f.id) in family.lora_kin}
    if told.families and not {family.title, *kin} & set(told.families):
        parts.refuse(
            lora.path,
            told,
            model,
            f"a LoRA made for {family.title} (only {fit.applied} of its {fit.offered} layers "
            "exist there)",
            source or lora.path,
        )


def made_for(lora: LoraFile):
    """What `lora` was made for (`parts.PartOf`): the family its metadata names (kohya's
    ss_base_model_version, modelspec.architecture), else the families whose transformer has
    every layer it adapts, else its layout's (`parts.lora_of`); no family where none tells."""
    from app.core.families import family_of_architecture
    from app.core.library.metadata import card_from_metadata
    from app.core.models import parts

    base = card_from_metadata(lora.metadata).base_model
    family = family_of_architecture(base) if base else None
    if family is not None:
        return parts.PartOf("a LoRA", (family.title,))
    told = parts.transformer_lora_of(lora.tensors)
    return told if told.families else parts.lora_of(lora.tensors)
