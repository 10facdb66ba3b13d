"""A diffusers folder's model components held against their own weights before anything is
loaded: each config.json against the tensor names and shapes in its weight files' headers.

A config that does not describe its weights makes diffusers drop weights in silence (a config
naming fewer blocks than the file holds), build a model of the config's size whatever the files
hold, or fail minutes later in a traceback. So a denoiser or VAE is built empty from its config
on PyTorch's meta device (no memory, no weights; the build stops as soon as it makes more
tensors than its files hold, so a config naming 100,000 layers costs no time either), and the
tensors it would load are matched with the files' names and shapes as diffusers' loader matches
them. A text encoder's width, layers and vocabulary are read from its token embedding and its
numbered layers instead (transformers renames keys between versions, so names are not compared).
Headers only: no tensor data is read. torch and diffusers are imported inside the functions.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.core.checkpoint.header import read_safetensors_header
from app.core.errors import BadFileError, WrongVariant, WrongVariantError
from app.core.formats import int4
from app.core.formats.layouts import Shapes, count_indices, count_words
from app.core.limits import index_in_name

# How many tensors and modules an empty build may make per tensor its files hold before it is
# stopped: a real model's config builds exactly the tensors of its files (a few buffers more),
# and a module holds one or two of them.
_TENSORS_PER_WEIGHT = 2
_MODULES_PER_WEIGHT = 4
_SLACK = 256

# A text encoder's token embedding (by how its key ends) and where its numbered layers are,
# beside it: T5's shared embedding first (its encoder may also keep a tied copy).
_EMBEDDINGS = (
    ("shared.weight", "encoder.block."),
    ("embeddings.token_embedding.weight", "encoder.layers."),  # CLIP
    ("embed_tokens.weight", "layers."),  # Qwen, Mistral and other language models
)


def held_shapes(files: list[Path]) -> dict[str, tuple[int, ...]] | None:
    """The tensor shapes a component's weight files hold, as its loader reads them
    (`loaded_files`), from their headers; None for pickles, whose shapes are not known without
    unpickling them."""
    if not files or any(f.suffix != ".safetensors" for f in files):
        return None
    held: dict[str, tuple[int, ...]] = {}
    for file in loaded_files(files):
        header = read_safetensors_header(file)
        int4.refuse_int4(file, header.dtypes())  # GPTQ's packed layers lack the plain weights
        held.update(header.shapes())
    return held


def check_weights_match(
    folder: Path, spec: list[Any], config: Mapping[str, Any], held: Shapes | None
) -> None:
    """Raise BadFileError naming `folder`/config.json when the config does not describe the
    tensors its weight files hold (`held`, from `held_shapes`): blocks it builds that the files
    lack or that they hold beyond it, tensors of other shapes, a text encoder of another width
    or depth. `spec` is the component's [library, class] from model_index.json; `config` its
    config.json, already within real models' sizes (`config_limits.check_component_config`).

    A config with a quantization_config is refused first, naming the method
    (`int4.refuse_quantization_config`); pickles (`held` None) are not checked. Imports torch
    and diffusers for a diffusers model; allocates nothing.
    """
    int4.refuse_quantization_config(folder / "config.json", config)
    if held is None:
        return
    library, class_name = str(spec[0]), str(spec[1])
    if library == "diffusers":
        found = _model_problem(class_name, config, held)
    elif library == "transformers":
        found = _text_encoder_mismatch(config, held)
    else:
        return
    if found is None:
        return
    problem, variant = found
    path = folder / "config.json"
    if variant is None:
        raise BadFileError(
            path, f"{problem}, so the config and the weights are of different models."
        )
    kind, where, in_file, in_config, setting = variant
    raise WrongVariantError(
        path,
        VARIANT_WORDS["refused"].format(problem=problem),
        WrongVariant(folder.name, kind, where, in_file, in_config, setting, str(path)),
    )


def loaded_files(files: list[Path]) -> list[Path]:
    """The weight files a loader reads of a component folder's: the plain ones where there are
    any (else the fp16 variant's, as the folder loader asks for), and of those the ones named as
    diffusers and transformers name them (a stray file beside them is not read)."""
    plain = [f for f in files if ".fp16." not in f.name] or files
    named = [f for f in plain if f.name.startswith(("diffusion_pytorch_model", "model"))]
    return named or plain


# Denoisers and VAEs: the config built empty ------------------------------------------------


class _Overbuilt(Exception):
    """An empty build made more tensors or modules than the files could fill."""


def _model_problem(class_name: str, config: Mapping[str, Any], held: Shapes) -> _Found | None:
    import diffusers

    model_class = getattr(diffusers, class_name, None)
    if not (isinstance(model_class, type) and issubclass(model_class, diffusers.ModelMixin)):
        return None  # not a diffusers model: the pipeline's own check names the class
    limit = _TENSORS_PER_WEIGHT * len(held) + _SLACK
    try:
        model = _built_empty(model_class, config, limit, _MODULES_PER_WEIGHT * len(held) + _SLACK)
    except _Overbuilt:
        return (
            f"it builds a {class_name} of more than {limit:,} tensors where the weights beside "
            f"it hold {len(held):,}"
        ), None
    except Exception as error:  # a config diffusers cannot build at all, whatever it raises
        from app.core.checkpoint.assembly import first_line

        return f"diffusers cannot build a {class_name} from it ({first_line(error)})", None
    # The names diffusers' loader renames (old attention blocks' query/key/value), renamed.
    renamed = model._fix_state_dict_keys_on_load(dict(held))
    held = renamed if isinstance(renamed, dict) else held
    # A buffer the files lack keeps the value it is built with, as diffusers loads it; what
    # the class says its files may hold beyond it is dropped by design.
    buffers = {name for name, _ in model.named_buffers()}
    built = {
        name: tuple(tensor.shape)
        for name, tensor in model.state_dict().items()
        if name in held or name not in buffers
    }
    ignored = [re.compile(p) for p in model_class._keys_to_ignore_on_load_unexpected or []]
    held = {k: v for k, v in held.items() if k in built or not any(p.search(k) for p in ignored)}
    beyond = [k for k in held if k not in built]
    lacking = [k for k in built if k not in held]
    return mismatch(built, held, beyond, lacking, config)


def _built_empty(model_class, config: Mapping[str, Any], tensors: int, modules: int):
    """`model_class` built from `config` on the meta device, stopped with _Overbuilt once it
    registers more than `tensors` parameters and buffers or `modules` submodules."""
    import torch
    from torch.nn.modules import module as torch_module

    me = threading.get_ident()
    made = {"tensors": 0, "modules": 0}

    def counter(kind: str, limit: int):
        def count(*_args) -> None:
            if threading.get_ident() != me:
                return  # another thread's modules (a hash worker, the GUI's engine client)
            made[kind] += 1
            if made[kind] > limit:
                raise _Overbuilt(kind)

        return count

    hooks = [
        torch_module.register_module_parameter_registration_hook(counter("tensors", tensors)),
        torch_module.register_module_buffer_registration_hook(counter("tensors", tensors)),
        torch_module.register_module_module_registration_hook(counter("modules", modules)),
    ]
    try:
        with torch.device("meta"):
            return model_class.from_config(dict(config))
    finally:
        for hook in hooks:
            hook.remove()


# Words ----------------------------------------------------------------------------------------


# A config and weights of two variants of one model, said first: the counts, then where.
# {problem} completes "<config.json>: ...".
VARIANT_WORDS = {
    "blocks": (
        "{held} in the weights, {in_config} in the config: {subject} builds "
        "{built} in {where} where the weights beside it hold {in_file}"
    ),
    "shape": (
        "{where} is {in_file} in the weights, {in_config} in the config: {subject} builds it "
        "as {in_config} where the weights beside it hold {in_file}"
    ),
    "refused": (
        "{problem}, so the config is another variant of the model than its weights (a model "
        "built from it drops or invents weights and draws noise: no numeric failure)."
    ),
}

# What a config and its weights differ in: the words, and for another variant its kind,
# where, the count or shape in the weights and in the config, and the config value behind it.
_Variant = tuple[str, str, int | tuple[int, ...], int | tuple[int, ...], str | None]
_Found = tuple[str, _Variant | None]


def mismatch_words(
    built: Shapes,
    held: Shapes,
    beyond: list[str],
    lacking: list[str],
    config: Mapping[str, Any],
) -> str | None:
    """What differs between the tensors a config builds and those its files hold, in words
    completing "<config.json>: ..." (`mismatch`); None when they match."""
    found = mismatch(built, held, beyond, lacking, config)
    return found[0] if found is not None else None


def mismatch(
    built: Shapes,
    held: Shapes,
    beyond: list[str],
    lacking: list[str],
    config: Mapping[str, Any],
) -> _Found | None:
    """What differs between the tensors a config builds and those its files hold: numbered
    blocks first (the outermost that differ), then a tensor of another shape (both another
    variant of the model), then tensors one side lacks; None when they match. A config value
    that alone makes the differing number is named ("its num_single_layers (1) builds ...")."""
    built_groups, held_groups = _numbered(built), _numbered(held)
    differing = sorted(
        (
            g
            for g in set(built_groups) | set(held_groups)
            if built_groups.get(g, 0) != held_groups.get(g, 0)
        ),
        key=lambda g: (g.count("."), g),
    )
    if differing:
        group = differing[0]
        count, found = built_groups.get(group, 0), held_groups.get(group, 0)
        setting = _setting(config, count)
        words = VARIANT_WORDS["blocks"].format(
            in_file=found,
            held=count_words(found, "block"),
            in_config=count,
            subject=_subject(setting, count),
            built=count_words(count, "block"),
            where=group,
        )
        return words, ("blocks", group, found, count, setting)
    for name in sorted(k for k in built if k in held):
        mine, theirs = tuple(built[name]), tuple(held[name])
        if mine != theirs:
            differs = next((a for a, b in zip(mine, theirs, strict=False) if a != b), None)
            setting = _setting(config, differs)
            words = VARIANT_WORDS["shape"].format(
                where=name,
                in_file=_shape(theirs),
                in_config=_shape(mine),
                subject=_subject(setting, differs),
            )
            return words, ("shape", name, theirs, mine, setting)
    if lacking:
        first = sorted(lacking)[0]
        return f"it builds {first}{_more(lacking)}, which the weights beside it lack", None
    if beyond:
        first = sorted(beyond)[0]
        words = f"the weights beside it hold {first}{_more(beyond)}, for which it builds no place"
        return words, None
    return None


def _numbered(shapes: Shapes) -> dict[str, int]:
    """Each numbered group of tensors ("transformer_blocks", "down_blocks.0.resnets") and how
    many members its names reach (the highest index plus one)."""
    groups: dict[str, int] = {}
    for name in shapes:
        parts = name.split(".")
        for i, part in enumerate(parts[:-1]):
            index = index_in_name(part) if i else None
            if index is not None:
                group = ".".join(parts[:i])
                groups[group] = max(groups.get(group, 0), index + 1)
    return groups


def _setting(config: Mapping[str, Any], value: int | None) -> str | None:
    """The one size in the config that has `value` ("num_layers"), or None."""
    if value is None:
        return None
    keys = [
        k
        for k, v in config.items()
        if not k.startswith("_") and not isinstance(v, bool) and v == value
    ]
    return keys[0] if len(keys) == 1 else None


def _subject(setting: str | None, value: int | None) -> str:
    """ "its num_layers (19)" where the config's `setting` alone has `value`, else "it"."""
    return f"its {setting} ({value})" if setting is not None else "it"


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) if shape else "a scalar"


def _more(names: list[str]) -> str:
    return f" and {count_words(len(names) - 1, 'more tensor')}" if len(names) > 1 else ""


# Text encoders: width, depth and vocabulary from the embedding and the layers ---------------


def text_encoder_problem(config: Mapping[str, Any], held: Shapes) -> str | None:
    """Where a text encoder's config (its text_config, for a multimodal one) disagrees with its
    weights on its width, its number of layers or its vocabulary, in words completing
    "<config.json>: ..."; None when they agree or the weights' layout is not one read here."""
    found = _text_encoder_mismatch(config, held)
    return found[0] if found is not None else None


def _text_encoder_mismatch(config: Mapping[str, Any], held: Shapes) -> _Found | None:
    """`text_encoder_problem`'s words, and for a width or a number of layers the variant
    (`mismatch`): a vocabulary of another size is another tokenizer, not another variant."""
    found = _token_embedding(held)
    if found is None:
        return None
    embedding, layers_prefix = found
    shape = held[embedding]
    if len(shape) != 2:
        return None
    vocabulary, width = shape
    text, its = config, "its"
    nested = config.get("text_config")
    if isinstance(nested, Mapping) and not any(k in config for k in ("hidden_size", "d_model")):
        text, its = nested, "its text_config's"
    for key in ("hidden_size", "d_model"):
        stated = text.get(key)
        if isinstance(stated, int) and stated != width:
            words = (
                f"{width} wide in the weights, {stated} in the config: {its} {key} is {stated} "
                f"where the weights beside it are {width} wide ({embedding})"
            )
            return words, ("shape", embedding, tuple(shape), (vocabulary, stated), key)
    layers = count_indices(held, layers_prefix)
    for key in ("num_hidden_layers", "num_layers"):
        stated = text.get(key)
        if layers and isinstance(stated, int) and stated != layers:
            words = VARIANT_WORDS["blocks"].format(
                in_file=layers,
                held=count_words(layers, "layer"),
                in_config=stated,
                subject=f"{its} {key} ({stated})",
                built=count_words(stated, "layer"),
                where=f"{layers_prefix.rstrip('.')}",
            )
            return words, ("blocks", layers_prefix.rstrip("."), layers, stated, key)
    stated = text.get("vocab_size")
    if isinstance(stated, int) and stated != vocabulary:
        words = (
            f"{its} vocab_size is {stated} where the weights beside it embed {vocabulary} "
            f"tokens ({embedding})"
        )
        return words, None
    return None


def text_encoder_width(held: Shapes, projected: bool = False) -> int | None:
    """A text encoder's hidden width from its token embedding, or with `projected` the width of
    its text projection (a CLIP with one); None where its weights have neither."""
    if projected:
        shape = held.get("text_projection.weight", ())
        return shape[0] if len(shape) == 2 else None
    found = _token_embedding(held)
    shape = held[found[0]] if found is not None else ()
    return shape[1] if len(shape) == 2 else None


def _token_embedding(held: Shapes) -> tuple[str, str] | None:
    """The key of a text encoder's token embedding and the prefix of its numbered layers
    (a vision tower's embeddings are not it), or None."""
    names = sorted(k for k in held if "visual" not in k and "vision" not in k)
    for ending, layers in _EMBEDDINGS:
        for name in names:
            if name == ending or name.endswith("." + ending):
                return name, name[: -len(ending)] + layers
    return None
