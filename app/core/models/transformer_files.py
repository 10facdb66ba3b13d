"""Transformer files (Flux.1, Chroma, SD3.x split or all in one, Z-Image, Qwen-Image as
ComfyUI keeps them), mapped by the layout tables of `split.py` and assembled with their
companions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core import paths
from app.core.checkpoint import Checkpoint, one_torch_thread, scan_weights, stored_dtype
from app.core.checkpoint.assembly import assign, built, empty, first_line
from app.core.components import words as component_words
from app.core.errors import BadFileError, UnsupportedModelError
from app.core.families.registry import family_of_architecture
from app.core.formats.layouts import AbsurdSizes, InnerPart, SplitModel, to_diffusers
from app.core.jobs import CancelToken, ProgressCallback
from app.core.models import split
from app.core.models.configs import read_json
from app.core.models.identity import Hasher, Identity, link_own_files, vae_files
from app.core.models.loaded import LoadedModel


def split_model(path: Path, shapes) -> SplitModel | None:
    """The transformer file's model from its header (None: not a transformer file)."""
    try:
        return split.read_model(shapes, path.name)
    except AbsurdSizes as error:
        raise BadFileError(
            path, f"the weights' shapes describe a model no real file holds: {error}."
        ) from None
    except ValueError as error:
        raise UnsupportedModelError(
            path, f"this {split.layout_words(shapes)} is not one HalfSafe can build: {error}."
        ) from None


def load_split(
    path: Path,
    checkpoint: Checkpoint,
    model: SplitModel,
    source: str,
    vae: str | None,
    text_encoders: list[str],
    progress: ProgressCallback,
    cancel: CancelToken | None,
) -> LoadedModel:
    """A transformer file with its text encoders and VAE, from companion files (see
    `split.py`) or from the file itself (SD3.x as Stability AI ships it): every header is read
    and every companion found before a tensor is read."""
    import diffusers

    if model.unsupported is not None:
        raise UnsupportedModelError(path, model.unsupported + ".")
    companions = split.find_companions(path, model, text_encoders, vae)
    missing = split.missing_sentence(model, companions, path)
    if missing is not None:
        raise UnsupportedModelError(path, missing)
    external = {c: p for c, p in companions.found.items() if p is not None}
    parts = [path, *external.values()]
    files = [path]
    for component, file in external.items():
        files += vae_files(file) if component == "vae" else [file]
    identity = Identity(model.architecture, "flow", parts, files)
    hasher = Hasher(path)
    used: list[str] = []
    steps = 2 + len(model.needs)
    try:
        with one_torch_thread():
            progress("Loading the transformer", 0, steps)
            # What the file's reader finds wrong in a quantized weight names the component
            # being read (the file may hold the text encoders and VAE too).
            checkpoint.component = "transformer"
            transformer = _split_transformer(path, checkpoint, model)
            used += [checkpoint.dtypes[model.prefix + row[0]] for row in model.rows()]
            components: dict[str, Any] = {"transformer": transformer}
            for step, need in enumerate(model.needs, start=1):
                if cancel is not None:
                    cancel.raise_if_cancelled()
                progress(f"Loading the {need.words.removeprefix('its ')}", step, steps)
                where = external.get(need.component)
                checkpoint.component = need.component
                if where is not None:
                    with Checkpoint(where, component=need.component) as companion:
                        part, dtypes = need.kind.load(companion, "", need, model.configs)
                else:  # the transformer's own file holds it (SD3.x as Stability AI ships it)
                    part, dtypes = need.kind.load(
                        checkpoint, need.inside or "", need, model.configs
                    )
                if not need.is_text_encoder:
                    latent = part.config.get("latent_channels") or part.config.get("z_dim")
                    if latent != model.latent_channels:
                        raise UnsupportedModelError(
                            where or path,
                            f"the VAE makes {latent}-channel latents but the transformer "
                            f"works on {model.latent_channels}.",
                        )
                components[need.component] = part
                used += dtypes
                reader = need.kind.prompt_reader(need)
                if reader is not None:
                    components[reader[0]] = reader[1]
            for inner in model.inner:  # parts the file holds beside the transformer
                checkpoint.component = inner.component
                part, dtypes = _inner_part(path, checkpoint, inner)
                components[inner.component] = part
                used += dtypes
            if model.pooled_from:
                widths = [components[c].config.projection_dim for c in model.pooled_from]
                if sum(widths) != model.config["pooled_projection_dim"]:
                    raise UnsupportedModelError(
                        path,
                        f"its CLIP text encoders' pooled vectors ({' + '.join(map(str, widths))}"
                        f") are not the {model.config['pooled_projection_dim']} values its "
                        "transformer takes.",
                    )
            checkpoint.check_unchanged()
            scheduler_config = read_json(
                paths.resource("configs", model.configs, "scheduler", "scheduler_config.json")
            )
            components["scheduler"] = diffusers.FlowMatchEulerDiscreteScheduler.from_config(
                scheduler_config, **model.scheduler
            )
            family = family_of_architecture(model.architecture)
            pipeline = family.pipeline_from_parts(components) if family is not None else None
            if pipeline is None:
                pipeline = getattr(diffusers, model.pipeline_class)(**components)
        progress("Scanning the weights", steps - 1, steps)
        weights = scan_weights(
            pipeline, on_progress=progress, cancel=cancel, identify=identity.needed
        )
        short_hash = hasher.result(progress, cancel)
    except BaseException:
        hasher.stop()
        raise
    profile_key = identity.profile_key(weights)
    link_own_files(profile_key, {"transformer": path, **external}, cancel)
    return LoadedModel(
        pipeline=pipeline,
        source=source,
        name=path.stem,
        format="split_files" if model.companions else "single_file",  # as the library says
        architecture=model.architecture,
        prediction_type="flow",
        native_size=model.native_size,
        stored_dtype=stored_dtype(used),
        model_hash=short_hash,
        profile_key=profile_key,
        weights=weights,
        detected_because=model.because,
        companions=companions.used(),
        notes=split.companion_notes(model, companions),
    )


def _split_transformer(path: Path, checkpoint: Checkpoint, model: SplitModel):
    """The diffusers transformer from the file's original-layout keys, by the layout's table."""
    import diffusers

    config = model.config
    build = getattr(diffusers, config["_class_name"]).from_config
    transformer = built(path, "transformer", empty, build, config)
    expected = {k: tuple(v.shape) for k, v in transformer.state_dict().items()}
    tensors = {}
    for original, _, _ in model.rows():
        key = model.prefix + original
        if key not in checkpoint.shapes:
            raise BadFileError(path, f"the transformer is incomplete: {key} is missing.")
        tensors[key] = checkpoint.get(key)
    try:
        state = to_diffusers(model.rows(), tensors, expected, model.prefix)
    except (ValueError, RuntimeError) as error:
        raise BadFileError(
            path, f"the transformer does not fit together: {first_line(error)}."
        ) from None
    return assign(path, transformer, state, "transformer")


def _inner_part(path: Path, checkpoint: Checkpoint, inner: InnerPart):
    """A part the transformer's file holds under `inner.prefix`, in its diffusers class's own
    names (Anima's LLM adapter). Returns (model, stored dtypes)."""
    import diffusers

    words = component_words(inner.component)
    build = getattr(diffusers, inner.class_name).from_config
    module = built(path, words, empty, build, inner.config)
    # Its own weights only (a quantized file keeps scales beside them: `get` applies them).
    keys = [inner.prefix + name for name in module.state_dict()]
    missing = [k for k in keys if k not in checkpoint.shapes]
    if missing:
        raise BadFileError(path, f"the {words} is incomplete: {missing[0]} is missing.")
    state = {k[len(inner.prefix) :]: checkpoint.get(k) for k in keys}
    return assign(path, module, state, words), [checkpoint.dtypes[k] for k in keys]
