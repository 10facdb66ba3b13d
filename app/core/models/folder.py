"""Diffusers pipeline folders: every config and weight file checked, then loaded by diffusers
itself, offline, in the stored dtypes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core import limits
from app.core.checkpoint import read_safetensors_header, scan_weights, stored_dtype
from app.core.errors import BadFileError, HalfSafeError, UnsupportedModelError
from app.core.families.registry import families_words, family_of_architecture
from app.core.jobs import CancelToken, ProgressCallback
from app.core.models import assembly
from app.core.models.assembly import first_line
from app.core.models.component_files import check_config, check_files, weight_files
from app.core.models.configs import read_json
from app.core.models.conversion import check_latents, load_vae_override
from app.core.models.identity import Identity, vae_files
from app.core.models.loaded import LoadedModel

MODEL_COMPONENTS = (
    "unet",
    "transformer",
    "text_encoder_3",
    "vae",
    "text_encoder",
    "text_encoder_2",
    "safety_checker",
    "image_encoder",
)


def load_folder(
    path: Path,
    source: str,
    vae: str | None,
    allow_pickle: bool,
    progress: ProgressCallback,
    cancel: CancelToken | None,
) -> LoadedModel:
    import diffusers

    index_file = path / "model_index.json"
    if not index_file.exists():
        raise BadFileError(
            path, "this folder has no model_index.json, so it is not a diffusers pipeline folder."
        )
    progress("Checking the model folder", 0, 1)
    index = read_json(index_file)
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
    denoiser = "transformer" if "transformer" in components else "unet"
    if denoiser not in components:
        raise UnsupportedModelError(
            path,
            f"this pipeline ({index.get('_class_name', 'unknown')}) "
            f"has no UNet or transformer; HalfSafe runs {families_words()}.",
        )
    unet_config = read_json(path / denoiser / "config.json", owner=path / denoiser)
    if denoiser == "unet":
        check_config(path / "unet" / "config.json", limits.check_unet_config, unet_config)
    scheduler_config = (
        read_json(path / "scheduler" / "scheduler_config.json", owner=path / "scheduler")
        if "scheduler" in components
        else {}
    )
    check_config(
        path / "scheduler" / "scheduler_config.json",
        limits.check_scheduler_config,
        scheduler_config,
    )
    for name in sorted(components):
        check_files(path / name)
    detection = arch.detect_from_configs(index, unet_config, scheduler_config)
    if not detection.supported:
        raise UnsupportedModelError(
            path, f"this looks like {detection.looks_like}: {detection.because}"
        )

    dtypes: dict[str, list[str]] = {}
    variant = None
    pickles = False
    read_from = [index_file]  # every file the weights come from, for the identity's stamp
    for name in sorted(components):
        if name not in MODEL_COMPONENTS:
            continue
        folder = path / name
        read_json(folder / "config.json", owner=folder)
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
    family = family_of_architecture(detection.architecture)
    try:
        parts = family.folder_parts(path) if family is not None else {}
        pipeline = diffusers.DiffusionPipeline.from_pretrained(
            path,
            local_files_only=True,
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


def _modules(pipeline) -> list[Any]:
    return [m for m in pipeline.components.values() if hasattr(m, "parameters")]


def _dtype_code(dtype) -> str:
    return {"torch.float16": "F16", "torch.bfloat16": "BF16", "torch.float32": "F32"}.get(
        str(dtype), "F64"
    )
