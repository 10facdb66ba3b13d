"""A diffusers folder of Anima as diffusers writes it: a modular_model_index.json naming
AnimaModularPipeline and each part in a subfolder. Each part is built by its own class from its
subfolder, offline, in its stored dtype (the folder's files were checked before: `models.folder`),
and the parts are put in HalfSafe's `AnimaPipeline`. A tokenizer the folder does not hold (an
index may point it at another repository) is the one HalfSafe ships: Qwen2's byte-level BPE for
the Qwen3 text encoder, T5's SentencePiece vocabulary for the T5 ids."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from app.core.errors import BadFileError, UnsupportedModelError

# The parts of weight an Anima folder must hold itself.
MODEL_PARTS = ("text_encoder", "text_conditioner", "transformer", "vae")


def load(folder: Path, components: Mapping[str, Any], dtypes: Mapping[str, Any]):
    """The AnimaPipeline of `folder`, whose parts (`components`: name -> [library, class], those
    the folder holds) passed the folder's checks; `dtypes` is the torch dtype per part (and
    "default"). Raises BadFileError for a part it lacks."""
    import diffusers

    from app.core.encoders.tokenizers import qwen2_tokenizer, t5_tokenizer
    from app.core.families.anima_pipeline import AnimaPipeline, without_padding_channel

    missing = [name for name in MODEL_PARTS if name not in components]
    if missing:
        raise BadFileError(
            folder,
            f"this Anima folder does not hold its {', '.join(missing)} (an index may point "
            "a part at another repository; HalfSafe reads only what the folder holds).",
        )
    parts: dict[str, Any] = {}
    with _no_progress_bars():
        _load_parts(folder, components, dtypes, parts)
    parts["transformer"] = without_padding_channel(parts["transformer"])
    _check_widths(folder, parts)
    scheduler = folder / "scheduler"
    parts["scheduler"] = (
        diffusers.FlowMatchEulerDiscreteScheduler.from_pretrained(
            str(scheduler), trust_remote_code=False
        )
        if "scheduler" in components
        else diffusers.FlowMatchEulerDiscreteScheduler(shift=ANIMA_SHIFT)
    )
    parts["tokenizer"] = _tokenizer(folder, components, "tokenizer") or qwen2_tokenizer()
    parts["t5_tokenizer"] = _tokenizer(folder, components, "t5_tokenizer") or t5_tokenizer()
    return AnimaPipeline(**parts)


def _check_widths(folder: Path, parts: Mapping[str, Any]) -> None:
    """Refuse parts that do not read each other: the text conditioner reads the text encoder's
    states and gives what the transformer's cross-attention reads."""
    states = parts["text_encoder"].config.hidden_size
    conditioner = parts["text_conditioner"].config
    reads = parts["transformer"].config["text_embed_dim"]
    if states != conditioner["source_dim"]:
        raise UnsupportedModelError(
            folder,
            f"its text encoder gives {states}-wide states, but its text conditioner reads "
            f"{conditioner['source_dim']}-wide ones.",
        )
    if reads != conditioner["target_dim"]:
        raise UnsupportedModelError(
            folder,
            f"its text conditioner gives {conditioner['target_dim']}-wide text, but its "
            f"transformer reads {reads}-wide text.",
        )


def _load_parts(
    folder: Path, components: Mapping[str, Any], dtypes: Mapping[str, Any], parts: dict
) -> None:
    """Each model part from its subfolder, by its declared class, into `parts`."""
    for name in MODEL_PARTS:
        library, declared = components[name]
        found = _class_named(str(library), str(declared))
        if found is None:
            raise BadFileError(
                folder, f"it declares the {name} a {declared}, a class unknown here."
            )
        dtype = dtypes.get(name, dtypes["default"])
        keyword = "dtype" if library == "transformers" else "torch_dtype"
        parts[name] = found.from_pretrained(
            str(folder / name), local_files_only=True, trust_remote_code=False, **{keyword: dtype}
        )


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers draws a bar while it reads a model's weights: noise beside HalfSafe's own
    progress."""
    from transformers.utils import logging

    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            logging.enable_progress_bar()


# Anima's flow-matching shift where a folder carries no scheduler: the one ComfyUI samples it
# with (its model sampling's shift 3).
ANIMA_SHIFT = 3.0


def _tokenizer(folder: Path, components: Mapping[str, Any], name: str):
    """The tokenizer the folder holds as `name`, or None where it holds none."""
    if name not in components or not (folder / name).is_dir():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        str(folder / name), local_files_only=True, trust_remote_code=False
    )


def _class_named(library: str, name: str):
    """The class `name` of diffusers or transformers (the folder's checks found it there), or
    None."""
    import importlib

    if library not in ("diffusers", "transformers"):
        return None
    found = getattr(importlib.import_module(library), name, None)
    return found if isinstance(found, type) else None
