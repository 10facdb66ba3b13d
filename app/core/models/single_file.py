"""Single-file checkpoints in the original (LDM / A1111 / ComfyUI) layout, assembled component
by component from the file's own tensor shapes over the shipped config folder; a transformer
file is handed to `transformer_files`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core import config_limits, limits
from app.core.checkpoint import (
    Checkpoint,
    WeightScanner,
    is_pickle_file,
    one_torch_thread,
    refuse_pickle,
    stored_dtype,
)
from app.core.checkpoint.assembly import assign, built, empty, infer, nbytes
from app.core.encoders.clip import convert_text_encoder
from app.core.encoders.vaes import vae_from_checkpoint, vae_keys
from app.core.errors import HalfSafeError, UnsupportedModelError
from app.core.families.registry import (
    detect_architecture,
    family_of_detection,
    file_layout_words,
)
from app.core.jobs import CancelToken, ProgressCallback
from app.core.models.configs import config_folder, read_json
from app.core.models.conversion import check_latents, load_vae_override, text_encoder_keys
from app.core.models.identity import Hasher, Identity, vae_files
from app.core.models.loaded import LoadedModel
from app.core.models.transformer_files import load_split, split_model


def load_single_file(
    path: Path,
    source: str,
    vae: str | None,
    allow_pickle: bool,
    progress: ProgressCallback,
    cancel: CancelToken | None,
    text_encoders: list[str] | None = None,
) -> LoadedModel:
    progress("Reading the checkpoint header", 0, 1)
    if is_pickle_file(path) and not allow_pickle:
        refuse_pickle(path)
    checkpoint = Checkpoint(path, allow_pickle=allow_pickle)
    try:
        transformer = split_model(path, checkpoint.shapes)
    except HalfSafeError:
        checkpoint.close()
        raise
    if transformer is not None:
        try:
            return load_split(
                path, checkpoint, transformer, source, vae, text_encoders or [], progress, cancel
            )
        finally:
            checkpoint.close()
    if text_encoders:
        checkpoint.close()
        raise UnsupportedModelError(
            path,
            "this checkpoint carries its own text encoders; --text-encoder is for split "
            f"transformer files ({file_layout_words()} as ComfyUI keeps them).",
        )
    hasher = Hasher(path)
    try:
        detection = _detection(path, checkpoint, vae)
        vae_path = Path(vae).expanduser() if vae is not None else None
        if vae_path is not None:
            _check_vae_file(path, vae_path, detection)
        identity = _identity(path, detection, vae_path)
        with one_torch_thread():
            pipeline, scan, used = _assemble(
                checkpoint, detection, vae, allow_pickle, progress, cancel, identity.needed
            )
        checkpoint.check_unchanged()  # what was scanned is what the file holds now
        known = identity.recall("prediction")
        prediction, because, native = _settle_prediction(
            pipeline, detection, progress, cancel, json.loads(known) if known else None
        )
        # The A1111 hash's thread writes the same cache file: let it finish first.
        short_hash = hasher.result(progress, cancel)
        if not detection.prediction_decided and known is None:
            identity.remember("prediction", json.dumps([prediction, because]))
        return LoadedModel(
            pipeline=pipeline,
            source=source,
            name=path.stem,
            format="single_file",
            architecture=detection.architecture,
            prediction_type=prediction,
            native_size=native,
            stored_dtype=stored_dtype(used),
            model_hash=short_hash,
            profile_key=identity.profile_key(scan),
            weights=scan,
            detected_because=detection.because.removesuffix(f"{detection.prediction_because}.")
            + f"{because}.",
            zero_terminal_snr=detection.zero_terminal_snr,
            prediction_because=because,
        )
    except BaseException:
        hasher.stop()
        raise
    finally:
        checkpoint.close()


def file_profile_key(path: Path, cancel: CancelToken | None = None) -> str:
    """The key remembered fixes are stored under for the single-file checkpoint `path`, as
    `load_single_file` keys it when the file is loaded alone (no --vae): the same detection,
    the same tensors digested, the same cache of the digest, without building the model. For
    a host that loaded the file with its own code (ComfyUI), so that a fix proved in either
    place is found in both. Reads every used tensor once on a file's first call (about 1 s per
    GB), nothing but the header while the cached digest is valid.

    Raises UnsupportedModelError for a file the loader would not load alone (a transformer
    file, whose key covers its companion files too; a checkpoint without a VAE; a model
    HalfSafe does not know), BadFileError for a damaged file, OSError for one it cannot
    read."""
    if is_pickle_file(path):
        refuse_pickle(path)
    with Checkpoint(path) as checkpoint:
        if split_model(path, checkpoint.shapes) is not None:
            raise UnsupportedModelError(
                path,
                "HalfSafe keys a transformer file's fixes by the files it loads with it, which "
                "only its own loader knows.",
            )
        detection = _detection(path, checkpoint, None)
        identity = _identity(path, detection, None)
        scan = None
        if identity.needed:
            scanner = WeightScanner(cancel=cancel, identify=True)
            with one_torch_thread():
                for key in _used_keys(checkpoint, detection, with_vae=True):
                    scanner.check(key, checkpoint.get(key))
            checkpoint.check_unchanged()  # what was digested is what the file holds now
            scan = scanner.result()
        return identity.profile_key(scan)


def _detection(path: Path, checkpoint: Checkpoint, vae: str | None) -> arch.Detection:
    """What the checkpoint is, or UnsupportedModelError where it cannot be loaded (with `vae`
    None: without a separate VAE)."""
    detection = detect_architecture(
        checkpoint.shapes,
        metadata=checkpoint.metadata,
        name=path.name,
        sidecar_config=_sidecar_config(path),
    )
    if not detection.supported:
        raise UnsupportedModelError(
            path, f"this looks like {detection.looks_like}: {detection.because}"
        )
    if not detection.has_vae and vae is None:
        raise UnsupportedModelError(
            path,
            "the checkpoint has no VAE (no first_stage_model tensors); pass a VAE file with --vae.",
        )
    return detection


def _identity(path: Path, detection: arch.Detection, vae: Path | None) -> Identity:
    """The identity of a load of `path` (with the separate VAE `vae`): by the architecture and
    prediction type detected from the file, before any test pass settles the latter."""
    parts = [path] if vae is None else [path, vae]
    files = [path] if vae is None else [path, *vae_files(vae)]
    return Identity(detection.architecture, detection.prediction_type, parts, files)


def _used_keys(checkpoint: Checkpoint, detection: arch.Detection, *, with_vae: bool) -> list[str]:
    """The tensors a load reads (and digests): the UNet's, each text encoder's and, `with_vae`,
    the file's own VAE's."""
    names = checkpoint.keys()
    used = [k for k in names if k.startswith(detection.unet_prefix)]
    for encoder in detection.text_encoders:
        used += text_encoder_keys(names, checkpoint.shapes, encoder)
    if with_vae:
        used += vae_keys(names, detection.vae_prefix)
    return used


def _settle_prediction(
    pipeline,
    detection: arch.Detection,
    progress: ProgressCallback,
    cancel: CancelToken | None,
    known: list[str] | None = None,
) -> tuple[str, str, int]:
    """(prediction type, how we know it, native size): what the file states, else what a test
    pass of the UNet decides (`app.core.models.prediction`), else the detection's guess with the
    reason the test gave. `known` is a test's answer cached for these unchanged files: the
    test pass costs seconds to a minute on a CPU, so a file pays it once. Sets the pipeline's
    scheduler to match."""
    kind, because, native = (
        detection.prediction_type,
        detection.prediction_because,
        detection.native_size,
    )
    if not detection.prediction_decided and known is not None and len(known) == 2:
        kind, because = str(known[0]), str(known[1])
        if kind not in ("epsilon", "v_prediction"):
            kind, because = detection.prediction_type, detection.prediction_because
        else:
            native = _native_size(detection, kind, native)
    elif not detection.prediction_decided:
        from app.core.models.prediction import probe_prediction_type

        if cancel is not None:
            cancel.raise_if_cancelled()
        progress("Testing the prediction type", 0, 1)
        tested = probe_prediction_type(pipeline, zero_terminal_snr=detection.zero_terminal_snr)
        progress("Testing the prediction type", 1, 1)
        if tested.kind is None:
            because = f"{because}; {tested.because}, so the guess stands"
        else:
            kind, because = tested.kind, tested.because
            native = _native_size(detection, kind, native)
    pipeline.scheduler = scheduler_for(
        pipeline.scheduler.config, kind, detection.zero_terminal_snr, pipeline.scheduler
    )
    return kind, because, native


def _native_size(detection: arch.Detection, prediction_type: str, native: int) -> int:
    """The checkpoint's native size once its prediction type is known, where its family's
    sizes differ by it (`Family.native_by_prediction`)."""
    family = family_of_detection(detection)
    sizes = family.native_by_prediction.get(detection.family, {}) if family else {}
    return sizes.get(prediction_type, native)


def scheduler_for(config, prediction_type: str, zero_terminal_snr: bool, like=None):
    """A scheduler of `like`'s class (or the config's) for this prediction type; with zero
    terminal SNR, betas rescaled to reach it and trailing timesteps, as such models are
    sampled (Lin et al. 2023, "Common Diffusion Noise Schedules and Sample Steps are Flawed").
    A scheduler class without that option is replaced by Euler, which has it."""
    import inspect

    import diffusers

    scheduler_class = type(like) if like is not None else getattr(diffusers, config["_class_name"])
    extra: dict[str, Any] = {"prediction_type": prediction_type}
    if zero_terminal_snr:
        if "rescale_betas_zero_snr" not in inspect.signature(scheduler_class).parameters:
            scheduler_class = diffusers.EulerDiscreteScheduler
        extra.update(rescale_betas_zero_snr=True, timestep_spacing="trailing")
    return scheduler_class.from_config(config, **extra)


def _check_vae_file(path: Path, vae: Path, detection: arch.Detection) -> None:
    """Refuse a --vae whose header or config says its latents are another family's, before
    anything is read (`parts.check_vae`)."""
    from app.core.families import architecture_title
    from app.core.models import parts

    base = read_json(
        config_folder(detection.config_name or detection.family) / "vae" / "config.json"
    )
    scale = base.get("scaling_factor")
    parts.check_vae(
        vae,
        channels=int(base.get("latent_channels", 4)),
        scales=(float(scale),) if isinstance(scale, (int, float)) else (),
        model=parts.model_words(architecture_title(detection.architecture), "checkpoint", path),
        model_file=path,
    )


def _sidecar_config(path: Path) -> str | None:
    """The A1111 `.yaml` beside a checkpoint, if it is a regular file of a sensible size."""
    sidecar = path.with_suffix(".yaml")
    if not limits.is_regular_file(sidecar):
        return None
    try:
        return limits.read_regular(sidecar, limits.MAX_CONFIG_BYTES).decode("utf-8", "replace")
    except OSError:
        return None


def _assemble(
    checkpoint: Checkpoint,
    detection: arch.Detection,
    vae: str | None,
    allow_pickle: bool,
    progress: ProgressCallback,
    cancel: CancelToken | None,
    identify: bool,
):
    """Build every component from the checkpoint; returns (pipeline, scan, used dtypes). With
    `identify`, the scan also digests every tensor used (the separate VAE's included)."""
    import diffusers
    import transformers

    folder = config_folder(detection.config_name or detection.family)
    shapes = checkpoint.shapes
    names = checkpoint.keys()
    used_keys = _used_keys(checkpoint, detection, with_vae=vae is None)
    total_bytes = sum(nbytes(checkpoint, k) for k in used_keys)
    scanner = WeightScanner(total_bytes, progress, cancel, identify=identify)
    used_dtypes = [checkpoint.dtypes[k] for k in used_keys]
    steps = 3 + len(detection.text_encoders)
    step = 0

    def stage(words: str) -> None:
        nonlocal step
        if cancel is not None:
            cancel.raise_if_cancelled()
        progress(words, step, steps)
        step += 1

    def read(keys: list[str]) -> dict[str, Any]:
        tensors = {}
        for key in keys:
            tensor = checkpoint.get(key)
            scanner.check(key, tensor)
            tensors[key] = tensor
        return tensors

    path = checkpoint.path
    components: dict[str, Any] = {}
    pooled_dim = None
    for encoder in detection.text_encoders:
        stage(f"Loading the {_component_words(encoder.component)}")
        base = read_json(folder / encoder.component / "config.json")
        config = infer(
            path,
            detection,
            arch.infer_text_encoder_config,
            config_limits.check_text_encoder_config,
            shapes,
            base,
            encoder,
        )
        if encoder.component == "text_encoder_2":
            pooled_dim = config.get("projection_dim")
        keys = text_encoder_keys(names, shapes, encoder)
        model_class = getattr(transformers, base.get("architectures", ["CLIPTextModel"])[0])
        words = _component_words(encoder.component)
        tensors = read(keys)
        model = built(path, words, empty, model_class, model_class.config_class(**config))
        state = built(path, words, convert_text_encoder, model, tensors, encoder)
        components[encoder.component] = assign(path, model, state, words)

    stage("Loading the UNet")
    base = read_json(folder / "unet" / "config.json")
    config = infer(
        path,
        detection,
        arch.infer_unet_config,
        config_limits.check_unet_config,
        shapes,
        base,
        sample_size=detection.native_size,
        pooled_text_dim=pooled_dim,
    )
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    unet_keys = [k for k in names if k.startswith(detection.unet_prefix)]
    tensors = read(unet_keys)
    model = built(path, "UNet", empty, diffusers.UNet2DConditionModel.from_config, config)
    state = built(path, "UNet", convert_ldm_unet_checkpoint, tensors, config)
    components["unet"] = assign(path, model, state, "UNet")

    stage("Loading the VAE")
    vae_base = read_json(folder / "vae" / "config.json")
    vae_scan = None  # the separate VAE's own scan, merged into the checkpoint's below
    if vae is None:
        components["vae"] = vae_from_checkpoint(
            checkpoint, detection.vae_prefix, vae_base, detection.native_size, read
        )
    else:
        components["vae"], vae_scan, vae_dtypes = load_vae_override(
            Path(vae).expanduser(), vae_base, detection.native_size, allow_pickle, cancel, identify
        )
        used_dtypes += vae_dtypes
    check_latents(Path(vae) if vae else path, components["vae"], components["unet"])

    stage("Loading the tokenizer and scheduler")
    for tokenizer in ("tokenizer", "tokenizer_2"):
        if (folder / tokenizer).is_dir() and tokenizer.replace(
            "tokenizer", "text_encoder"
        ) in components:
            components[tokenizer] = transformers.CLIPTokenizer.from_pretrained(
                folder / tokenizer, local_files_only=True, trust_remote_code=False
            )
    scheduler_config = read_json(folder / "scheduler" / "scheduler_config.json")
    scheduler_class = getattr(diffusers, scheduler_config["_class_name"])
    components["scheduler"] = scheduler_class.from_config(
        scheduler_config, prediction_type=detection.prediction_type
    )

    family = family_of_detection(detection)
    if family is None or detection.pipeline_class is None:
        raise UnsupportedModelError(path, "HalfSafe does not know which pipeline runs it.")
    pipeline_class = getattr(diffusers, detection.pipeline_class)
    options = family.checkpoint_pipeline_options
    pipeline = pipeline_class(**components, **options)
    progress("Loaded", steps, steps)
    scan = scanner.result()
    if vae_scan is not None:
        scan = scan.merged(vae_scan)
    return pipeline, scan, used_dtypes


def _component_words(component: str) -> str:
    return {"text_encoder": "text encoder", "text_encoder_2": "second text encoder"}.get(
        component, component
    )
