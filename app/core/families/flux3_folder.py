"""A diffusers folder of FLUX.3 as diffusers writes it: a modular_model_index.json naming
Flux3ModularPipeline (base) or Flux3DistilledModularPipeline (the distilled Klein) and each part in
a subfolder. Each part is built by its own class from its subfolder, offline, in its stored dtype
(the folder's files were checked before: `models.folder`), and the parts are put in HalfSafe's
`Flux3Pipeline` or `Flux3DistilledPipeline`. The processor the text encoder reads prompts with is
the folder's (tokenizer/) or, where it holds none (an index may point it at another repository),
the Qwen3-VL processor HalfSafe ships; the scheduler is the folder's or, where it holds none (its
blocks build it from their spec), FLUX.3's flow matching with its constant shift of 6.93. Where
the folder holds the prompt upsampler (prompt_upsampler/, a Qwen3.5 model, with its processor in
prompt_upsampler_processor/), it is built too, in its stored dtype, without remote code."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.core.errors import BadFileError

# The parts of weight a FLUX.3 folder must hold itself.
MODEL_PARTS = ("text_encoder", "transformer", "vae")


def load(folder: Path, components: Mapping[str, Any], dtypes: Mapping[str, Any], distilled: bool):
    """The FLUX.3 pipeline of `folder` (the distilled one with `distilled`), whose parts
    (`components`: name -> [library, class], those the folder holds) passed the folder's
    checks; `dtypes` is the torch dtype per part (and "default"). Raises BadFileError for a
    part it lacks or cannot read."""
    import importlib

    import diffusers

    from app.core.encoders.tokenizers import qwen3_vl_processor
    from app.core.families.flux3_pipeline import Flux3DistilledPipeline, Flux3Pipeline
    from app.core.families.flux3_recipe import FLUX3_SHIFT
    from app.core.families.qwenimage21 import processor_from_folder

    missing = [name for name in MODEL_PARTS if name not in components]
    if missing:
        raise BadFileError(
            folder,
            f"this FLUX.3 folder does not hold its {', '.join(missing)} (an index may point "
            "a part at another repository; HalfSafe reads only what the folder holds).",
        )
    parts: dict[str, Any] = {}
    for name in MODEL_PARTS:
        library, declared = (str(v) for v in components[name])
        found = (
            getattr(importlib.import_module(library), declared, None)
            if library in ("diffusers", "transformers")
            else None
        )
        if not isinstance(found, type):
            raise BadFileError(
                folder, f"it declares the {name} a {declared}, a class unknown here."
            )
        keyword = "dtype" if library == "transformers" else "torch_dtype"
        dtype = dtypes.get(name, dtypes["default"])
        parts[name] = found.from_pretrained(
            str(folder / name), local_files_only=True, trust_remote_code=False, **{keyword: dtype}
        )
    parts["scheduler"] = (
        diffusers.FlowMatchEulerDiscreteScheduler.from_pretrained(
            str(folder / "scheduler"), trust_remote_code=False
        )
        if "scheduler" in components
        else diffusers.FlowMatchEulerDiscreteScheduler(shift=FLUX3_SHIFT)
    )
    processor = folder / "tokenizer"
    if "tokenizer" in components and processor.is_dir():
        try:
            parts["tokenizer"] = processor_from_folder(processor)
        except (OSError, ValueError) as error:
            raise BadFileError(
                folder, f"its tokenizer (Qwen3-VL's processor) cannot be read: {error}."
            ) from None
    else:
        parts["tokenizer"] = qwen3_vl_processor()
    if "prompt_upsampler" in components:
        parts.update(_upsampler(folder, components, dtypes))
    pipeline = Flux3DistilledPipeline if distilled else Flux3Pipeline
    return pipeline(**parts)


# The prompt upsampler's class, as diffusers' upsampling blocks declare it.
UPSAMPLER_CLASS = "Qwen3_5ForConditionalGeneration"


def _upsampler(folder: Path, components: Mapping[str, Any], dtypes: Mapping[str, Any]):
    """The folder's prompt upsampler and its processor (raises BadFileError where it is
    declared another class or its processor is missing or unreadable)."""
    import transformers

    from app.core.families.flux3_upsampler import decoding_config
    from app.core.families.qwenimage21 import processor_from_folder

    library, declared = (str(v) for v in components["prompt_upsampler"])
    if (library, declared) != ("transformers", UPSAMPLER_CLASS):
        raise BadFileError(
            folder,
            f"it declares the prompt upsampler {library}'s {declared}; FLUX.3's is "
            f"transformers' {UPSAMPLER_CLASS}.",
        )
    processor = folder / "prompt_upsampler_processor"
    if not processor.is_dir():
        raise BadFileError(
            folder,
            "it holds the prompt upsampler but not its processor (prompt_upsampler_processor/), "
            "which the upsampler's chat and vocabulary come from.",
        )
    try:
        read = processor_from_folder(processor)
    except (OSError, ValueError) as error:
        raise BadFileError(
            folder, f"its prompt upsampler's processor cannot be read: {error}."
        ) from None
    # Its generation_config.json is never handed to transformers: HalfSafe decodes greedily,
    # reading only its token ids (`decoding_config`).
    model = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(
        str(folder / "prompt_upsampler"),
        local_files_only=True,
        trust_remote_code=False,
        dtype=dtypes.get("prompt_upsampler", dtypes["default"]),
        generation_config=transformers.GenerationConfig(),
    )
    config = model.config.to_dict()
    vocabulary = int((config.get("text_config") or config)["vocab_size"])
    model.generation_config = decoding_config(folder / "prompt_upsampler", config, vocabulary)
    return {"prompt_upsampler": model.eval(), "prompt_upsampler_processor": read}
