"""Diffusers pipeline folders: every config and weight file checked, then loaded by diffusers
itself, offline, in the stored dtypes."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core import config_limits
from app.core.checkpoint import assembly, read_safetensors_header, scan_weights, stored_dtype
from app.core.checkpoint.assembly import first_line
from app.core.encoders import vaes
from app.core.errors import BadFileError, HalfSafeError, UnsupportedModelError
from app.core.families.registry import (
    detect_from_configs,
    families_words,
    family_of_detection,
)
from app.core.jobs import CancelToken, ProgressCallback
from app.core.models.component_files import check_config, check_files, weight_files
from app.core.models.configs import read_json
from app.core.models.conversion import check_latents, load_vae_override
from app.core.models.folder_needs import check_text_widths
from app.core.models.folder_shapes import check_weights_match, held_shapes
from app.core.models.identity import Identity, vae_files
from app.core.models.loaded import LoadedModel

MODEL_COMPONENTS = (
    "unet",
    "transformer",
    "text_encoder_3",
    "vae",
    "text_encoder",
    "text_encoder_2",
    "text_conditioner",
    "safety_checker",
    "image_encoder",
    "prompt_upsampler",
)


def load_folder(
    path: Path,
    source: str,
    vae: str | None,
    allow_pickle: bool,
    progress: ProgressCallback,
    cancel: CancelToken | None,
) -> LoadedModel:

    index_file, index, components = _read_index(path, progress)
    denoiser = "transformer" if "transformer" in components else "unet"
    if denoiser not in components:
        raise UnsupportedModelError(
            path,
            f"this pipeline ({index.get('_class_name', 'unknown')}) "
            f"has no UNet or transformer; HalfSafe runs {families_words()}.",
        )
    unet_config = read_json(path / denoiser / "config.json", owner=path / denoiser)
    if denoiser == "unet":
        check_config(path / "unet" / "config.json", config_limits.check_unet_config, unet_config)
    scheduler_config = (
        read_json(path / "scheduler" / "scheduler_config.json", owner=path / "scheduler")
        if "scheduler" in components
        else {}
    )
    check_config(
        path / "scheduler" / "scheduler_config.json",
        config_limits.check_scheduler_config,
        scheduler_config,
    )
    for name in sorted(components):
        check_files(path / name)
    detection = detect_from_configs(index, unet_config, scheduler_config)
    if not detection.supported:
        raise UnsupportedModelError(
            path, f"this looks like {detection.looks_like}: {detection.because}"
        )

    _check_parts(path, index, components, unet_config, detection, vae, allow_pickle)

    dtypes, variant, pickles, read_from = _stored_dtypes(path, components, allow_pickle)
    read_from.insert(0, index_file)  # every file the weights come from, for the stamp
    if cancel is not None:
        cancel.raise_if_cancelled()
    # Stamped before anything is read, so a file changed during the load is hashed again.
    parts = [path] if vae is None else [path, Path(vae).expanduser()]
    if vae is not None and Path(vae).expanduser().exists():
        read_from += vae_files(Path(vae).expanduser())
    identity = Identity(detection.architecture, detection.prediction_type, parts, read_from)

    torch_dtype: dict[str, Any] = {"default": assembly.torch_dtype("fp32")}
    for name, found in dtypes.items():
        torch_dtype[name] = assembly.torch_dtype(stored_dtype(found))
    progress("Loading the model folder", 0, 1)
    family = family_of_detection(detection)
    pipeline = _built(path, family, components, torch_dtype, variant, pickles)
    progress("Loading the model folder", 1, 1)
    if vae is not None:
        vae_base = dict(pipeline.vae.config)
        model, _, vae_dtypes = load_vae_override(
            Path(vae).expanduser(), vae_base, detection.native_size, allow_pickle, cancel
        )
        check_latents(Path(vae), model, getattr(pipeline, denoiser))
        pipeline.register_modules(vae=model)
        dtypes["vae"] = vae_dtypes
    weights = scan_weights(pipeline, on_progress=progress, cancel=cancel, identify=identity.needed)
    all_dtypes = [d for found in dtypes.values() for d in found]
    if pickles:
        all_dtypes += [
            _dtype_code(p.dtype) for module in _modules(pipeline) for p in module.parameters()
        ]
    return LoadedModel(
        pipeline=pipeline,
        source=source,
        name=path.name,
        format="diffusers",
        architecture=detection.architecture,
        prediction_type=detection.prediction_type,
        native_size=detection.native_size,
        stored_dtype=stored_dtype(all_dtypes),
        model_hash=None,
        profile_key=identity.profile_key(weights),
        weights=weights,
        detected_because=detection.because,
        zero_terminal_snr=detection.zero_terminal_snr,
        prediction_because=detection.prediction_because,
    )


def _read_index(path: Path, progress: ProgressCallback) -> tuple[Path, dict[str, Any], dict]:
    """The folder's index file, its contents (a modular pipeline's laid out as model_index.json
    lists parts) and the parts it lists, each a subfolder; BadFileError naming what is wrong."""
    index_file = path / "model_index.json"
    if not index_file.exists() and (path / MODULAR_INDEX).exists():
        index_file = path / MODULAR_INDEX  # a modular pipeline's folder, as diffusers writes it
    if not index_file.exists():
        raise BadFileError(
            path, "this folder has no model_index.json, so it is not a diffusers pipeline folder."
        )
    progress("Checking the model folder", 0, 1)
    index = read_json(index_file)
    try:
        config_limits.check_no_custom_code(index)
    except ValueError as error:
        raise BadFileError(index_file, f"{error}.") from None
    if index_file.name == MODULAR_INDEX:
        index = modular_components(path, index)
    components = {
        name: spec
        for name, spec in index.items()
        if not name.startswith("_")
        and isinstance(spec, list)
        and len(spec) == 2
        and spec[0] is not None
        and spec[1] is not None
    }
    for name in components:
        if not (path / name).is_dir():
            raise BadFileError(
                path,
                f"model_index.json lists the component '{name}' but the "
                f"folder has no '{name}' subfolder.",
            )
    return index_file, index, components


def _stored_dtypes(
    path: Path, components: dict, allow_pickle: bool
) -> tuple[dict[str, list[str]], str | None, bool, list[Path]]:
    """Each model part's stored dtypes (from its safetensors headers), the diffusers variant
    its files are ("fp16" where only such files are there), whether any file is a pickle, and
    every file the weights come from."""
    dtypes: dict[str, list[str]] = {}
    variant = None
    pickles = False
    read_from: list[Path] = []
    for name in sorted(components):
        if name not in MODEL_COMPONENTS:
            continue
        folder = path / name
        files = weight_files(folder, allow_pickle, path)
        read_from += [folder / "config.json", *files]
        for file in files:
            if file.suffix == ".safetensors":
                header = read_safetensors_header(file)
                dtypes.setdefault(name, []).extend(header.dtypes().values())
            else:
                pickles = True
        plain = [f for f in files if ".fp16." not in f.name]
        if not plain and any(".fp16." in f.name for f in files):
            variant = "fp16"
    return dtypes, variant, pickles, read_from


def _built(path: Path, family, components: dict, torch_dtype: dict, variant, pickles: bool):
    """The pipeline built from the folder: by its family's own loader where it has one, else
    by diffusers (no code from the folder runs: trust_remote_code=False); BadFileError when
    diffusers cannot read it."""
    import diffusers

    from app.core.encoders.chat_templates import bound_pipeline

    try:
        with _without_progress_bars():
            pipeline = family.load_folder(path, components, torch_dtype) if family else None
            if pipeline is None:
                parts = family.folder_parts(path) if family is not None else {}
                pipeline = diffusers.DiffusionPipeline.from_pretrained(
                    path,
                    local_files_only=True,
                    trust_remote_code=False,
                    torch_dtype=torch_dtype,
                    variant=variant,
                    use_safetensors=None if pickles else True,
                    **parts,
                )
    except HalfSafeError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError) as error:
        raise BadFileError(
            path, f"diffusers could not load this folder ({first_line(error)})."
        ) from None
    bound_pipeline(pipeline, path)  # the folder's chat templates render within bounds
    return pipeline


@contextlib.contextmanager
def _without_progress_bars():
    """diffusers and transformers draw a bar for each part they load ("Loading weights"): noise
    on the terminal beside HalfSafe's own progress lines and refusals."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    shown = [log.is_progress_bar_enabled() for log in (diffusers_logging, transformers_logging)]
    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        for log, was in zip((diffusers_logging, transformers_logging), shown, strict=True):
            if was:
                log.enable_progress_bar()


# The index diffusers writes for a modular pipeline's folder (`ModularPipeline.save_pretrained`).
MODULAR_INDEX = "modular_model_index.json"


def modular_components(folder: Path, index: dict[str, Any]) -> dict[str, Any]:
    """A modular_model_index.json as model_index.json lists a pipeline's parts (name ->
    [library, class]): each entry there is [library, class, loading spec] (library and class
    null where the part was not loaded when the folder was written: its spec's type hint names
    them); only the parts the folder holds in their own subfolder are kept (an entry may point
    at another repository, which HalfSafe does not fetch)."""
    found: dict[str, Any] = {key: value for key, value in index.items() if key.startswith("_")}
    for name, entry in index.items():
        if not name.isidentifier() or name.startswith("_"):
            continue  # a part's name is its subfolder's: never a path
        if not isinstance(entry, list) or len(entry) != 3:
            continue
        library, declared, spec = entry
        spec = spec if isinstance(spec, dict) else {}
        hint = spec.get("type_hint")
        if (library is None or declared is None) and isinstance(hint, list) and len(hint) == 2:
            library, declared = hint
        if (
            isinstance(library, str)
            and isinstance(declared, str)
            and (spec.get("subfolder") or name) == name
            and (folder / name).is_dir()
        ):
            found[name] = [library, declared]
    return found


def _check_parts(
    path: Path,
    index: dict[str, Any],
    components: dict[str, Any],
    denoiser_config: dict[str, Any],
    detection: arch.Detection,
    vae: str | None,
    allow_pickle: bool,
) -> None:
    """Refuse, from configs and headers alone, before diffusers builds a thing: a text encoder
    folder of another kind than the pipeline takes there; a component declared as a class the
    pipeline does not take (a Flux.1 transformer in a Flux.2 Klein folder); a config.json that
    does not describe the weights beside it (`folder_shapes`); a text encoder of another width
    than the transformer reads (`folder_needs`); a VAE (its vae/ folder or --vae) whose latents
    are another family's; beside a UNet, a text encoder of another width than it reads."""
    from app.core.families import architecture_title, family_of_detection
    from app.core.models import parts

    family = family_of_detection(detection)
    title = architecture_title(detection.architecture)
    model = parts.model_words(title, "model", path)
    takes = parts.pipeline_takes(str(index.get("_class_name")))
    _check_encoder_kinds(path, components, takes, model)
    _check_classes(path, components, takes, title)
    held: dict[str, Any] = {}  # component -> the shapes its weight files hold
    for name in sorted(components):
        if name in MODEL_COMPONENTS:
            config = read_json(path / name / "config.json", owner=path / name)
            held[name] = held_shapes(weight_files(path / name, allow_pickle, path))
            check_weights_match(path / name, components[name], config, held[name])
    if vae is not None and Path(vae).expanduser().is_dir():
        given = Path(vae).expanduser()
        config = read_json(given / "config.json", owner=given)
        shapes = held_shapes(weight_files(given, allow_pickle, given))
        declared = str(config.get("_class_name") or "AutoencoderKL")
        check_weights_match(given, ["diffusers", declared], config, shapes)
    if family is not None:
        check_text_widths(path, components, denoiser_config, family, held, model)

    packed = family.packed_channels if family is not None else 1
    # Z-Image's transformer has no out_channels: it gives back what it takes.
    out = denoiser_config.get("out_channels") or denoiser_config.get("in_channels")
    scales = parts.family_scales(family.title) if family is not None else ()
    wanted_vae = [c.__name__ for c in takes.get("vae", ())]
    layouts = {vaes.layout_of_class(name) for name in wanted_vae}
    layout = layouts.pop() if len(layouts) == 1 else None
    if isinstance(out, int) and out > 0:
        channels = out // packed
        given_vaes = [Path(vae).expanduser()] if vae is not None else []
        for vae_path in ([path / "vae"] if "vae" in components else []) + given_vaes:
            parts.check_vae(
                vae_path,
                channels=channels,
                scales=scales,
                layout=layout,
                model=model,
                model_file=path,
            )
    encoders = sorted(c for c in components if c.startswith("text_encoder"))
    text_width = denoiser_config.get("cross_attention_dim")
    if encoders == ["text_encoder"] and isinstance(text_width, int):
        config = read_json(path / "text_encoder" / "config.json", owner=path / "text_encoder")
        width = config.get("hidden_size")
        found = parts.text_encoder_class_part(str(components["text_encoder"][1]), config)
        if found is not None and isinstance(width, int) and width != text_width:
            parts.refuse(
                path / "text_encoder", found, model, f"a {text_width}-wide text encoder", path
            )


def _check_encoder_kinds(
    path: Path, components: dict[str, Any], takes: dict[str, tuple[type, ...]], model: str
) -> None:
    """A text encoder folder of another kind (T5, CLIP, Qwen3, ...) than the pipeline takes
    there (a modular pipeline annotates none: then the kind the index declares), named by what
    it is: the class its config.json was saved from, else the class declared."""
    from app.core.encoders import kinds
    from app.core.models import parts

    for name in sorted(c for c in components if c.startswith("text_encoder")):
        config = read_json(path / name / "config.json", owner=path / name)
        declared = str(components[name][1])
        saved = config.get("architectures")
        stored = saved[0] if isinstance(saved, list) and saved and isinstance(saved[0], str) else ""
        is_class = stored if kinds.class_kind(stored) is not None else declared
        found = parts.text_encoder_class_part(is_class, config)
        wanted = [k for c in takes.get(name, ()) if (k := kinds.class_kind(c.__name__))]
        if not wanted and (declared_kind := kinds.class_kind(declared)) is not None:
            wanted = [declared_kind]
        if found is not None and wanted and kinds.class_kind(is_class) not in wanted:
            parts.refuse(path / name, found, model, parts.text_encoder_part(wanted[0]).words, path)


def _check_classes(
    path: Path, components: dict[str, Any], takes: dict[str, tuple[type, ...]], title: str
) -> None:
    """Each model component declared (model_index.json) as a class diffusers or transformers
    has, and one the pipeline takes there: the class diffusers would build it as, whatever its
    weights are."""
    from app.core.models import parts

    for name in sorted(components):
        library, declared = str(components[name][0]), str(components[name][1])
        found = _declared_class(library, declared)
        _refuse_nested_pipeline(path, name, declared, found)
        if name not in MODEL_COMPONENTS:
            continue
        if library not in ("diffusers", "transformers"):
            if found is None:  # diffusers would look for it in the part's folder: its own code
                raise BadFileError(
                    path / name,
                    f"the folder's index declares the {name} {parts.a(declared)} of "
                    f"{_shown(library)}, which is none of diffusers, transformers or diffusers' "
                    "pipelines, and HalfSafe runs no other code.",
                )
            continue
        if found is None:
            raise BadFileError(
                path / "model_index.json",
                f"it declares the {name} {parts.a(declared)}, a class {library} does not have.",
            )
        wanted = takes.get(name, ())
        if wanted and not any(issubclass(found, c) for c in wanted):
            index = "model_index.json" if (path / "model_index.json").exists() else MODULAR_INDEX
            wanted_names = [c.__name__ for c in wanted]
            parts.refuse_class(path / name, name, declared, title, path, wanted_names, index)


def _declared_class(library: str, declared: str) -> type | None:
    """The class an index names for a part: of diffusers or transformers, or of one of
    diffusers' pipeline modules (as model_index.json names a safety checker's:
    ["stable_diffusion", "StableDiffusionSafetyChecker"]); None for any other."""
    import importlib

    from app.core.models import parts

    if library in ("diffusers", "transformers"):
        return parts.class_named(library, declared)
    if not library.isidentifier() or library.startswith("_"):
        return None
    with contextlib.suppress(ImportError, RuntimeError, AttributeError):
        found = getattr(importlib.import_module(f"diffusers.pipelines.{library}"), declared, None)
        return found if isinstance(found, type) else None
    return None


def _refuse_nested_pipeline(path: Path, name: str, declared: str, found: type | None) -> None:
    """A part declared as a whole pipeline (diffusers would load another pipeline from the
    part's folder and the subfolders in it, which no check of HalfSafe's has read) is
    refused."""
    import diffusers
    from diffusers.modular_pipelines import ModularPipeline

    from app.core.models import parts

    if found is not None and issubclass(found, (diffusers.DiffusionPipeline, ModularPipeline)):
        raise BadFileError(
            path / name,
            f"the folder's index declares the {name} {parts.a(declared)}, a whole pipeline "
            "where one part belongs, and HalfSafe does not load a pipeline nested in a part.",
        )


def _shown(text: str) -> str:
    """A name from a file as a sentence quotes it: short."""
    return repr(text) if len(text) <= 60 else repr(text[:57] + "...")


def _modules(pipeline) -> list[Any]:
    return [m for m in pipeline.components.values() if hasattr(m, "parameters")]


def _dtype_code(dtype) -> str:
    return {"torch.float16": "F16", "torch.bfloat16": "BF16", "torch.float32": "F32"}.get(
        str(dtype), "F64"
    )
