"""Loading models offline: diffusers folders, single-file checkpoints, a separate VAE, the demo.

Single files in the original (LDM / A1111 / ComfyUI) layout are assembled here component by
component: the architecture and each component's config come from the file's own tensor
shapes over the shipped config folder (`resources/configs/<name>`), the keys are mapped to
diffusers names with diffusers' conversion functions, and the tensors are assigned straight
from the memory-mapped file in their stored dtype. Transformer files (Flux.1, Chroma, SD3.x
split or all in one, Z-Image, Qwen-Image) are mapped by the layout tables of `split.py` and assembled with their
companions in the same way. Nothing reaches the network: the offline
switches are set and every diffusers/transformers call is local-only.

torch, diffusers and transformers are imported inside the functions that use them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core import encoders, limits, paths, quantized, split
from app.core.checkpoint import (
    Checkpoint,
    WeightScan,
    WeightScanner,
    cached_model_hash,
    cached_value,
    files_stamp,
    is_pickle_file,
    model_hash,
    one_torch_thread,
    read_safetensors_header,
    refuse_pickle,
    scan_weights,
    store_value,
    stored_dtype,
)
from app.core.demo import DEMO_MODELS
from app.core.errors import BadFileError, CancelledError, HalfSafeError, UnsupportedModelError
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.layouts import (
    CLIP_PREFIX,
    CLIP_PROJECTION,
    AbsurdSizes,
    Need,
    SplitModel,
    count_indices,
    to_diffusers,
)

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
_TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64"}


@dataclass
class LoadedModel:
    """A loaded pipeline and what HalfSafe knows about it."""

    pipeline: Any  # diffusers StableDiffusion(XL)Pipeline on CPU, weights in stored dtype
    source: str  # what the user gave (path or "demo")
    name: str  # file/folder stem, "demo" for the demo
    format: str  # "diffusers" | "single_file" | "demo"
    architecture: str  # "sd1" | "sd2" | "sdxl", "-inpaint" variants
    prediction_type: str  # "epsilon" | "v_prediction"
    native_size: int  # 512 / 768 / 1024 (demo: its own small size)
    stored_dtype: str  # "fp16" | "bf16" | "fp32" | "mixed"
    model_hash: str | None  # AUTOMATIC1111 short hash (first 10 hex of the file's sha256)
    profile_key: str  # identity of the weights (see `_Identity`): remembered fixes use it
    weights: WeightScan
    detected_because: str  # one sentence: why we think it is this architecture
    vae: str | None = None  # the separate VAE file or folder loaded in place of the model's
    zero_terminal_snr: bool = False  # its scheduler rescales betas to zero terminal SNR
    prediction_because: str = ""  # how the prediction type is known (part of detected_because)
    loras: list[Any] = field(default_factory=list)  # lora.AppliedLora, in the order applied
    lora_warnings: list[str] = field(default_factory=list)  # prompt tags refused, a sentence each
    # How its files store the weights when any is fp8 or GGUF (quantized.summary), else None.
    quantization: dict[str, Any] | None = None
    # A split transformer file's text-encoder and VAE files, by component (what a damaged
    # weight of that component is blamed on), and what the loader has to say about them.
    companions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # The live preview's latent colours (`preview.colours_for`) by the VAE's dtype, found on
    # the first preview; None where the VAE gave nothing to fit them to.
    preview_colours: dict[str, Any] = field(default_factory=dict, repr=False)


def set_offline() -> None:
    """Tell huggingface_hub, transformers and diffusers never to reach the network."""
    for var in (
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "DIFFUSERS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN",
    ):
        os.environ[var] = "1"
    try:
        import huggingface_hub.constants as hub_constants
    except ImportError:
        return
    # The hub reads the variable at import; when it was imported earlier, say it again.
    hub_constants.HF_HUB_OFFLINE = True


def load_model(
    source: str,
    *,
    vae: str | None = None,
    text_encoders: list[str] | None = None,
    allow_pickle: bool = False,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
) -> LoadedModel:
    """Load `source` ("demo" or "demo-overflow", a diffusers folder or a single-file checkpoint) onto the CPU.

    Weights keep their stored dtype and are scanned for NaN/Inf before anything runs.
    `vae` (a VAE file or folder) replaces the model's VAE; with a split transformer file
    (Flux.1, Chroma, SD3.x, Z-Image, Qwen-Image as ComfyUI keeps them) `vae` and
    `text_encoders` name its companions, else they are looked for in the sibling folders (see
    `split.py`). Pickle files are refused with PickleRefusedError unless `allow_pickle`, and
    then read with PyTorch's weights-only loader. Bad input raises BadFileError or UnsupportedModelError with one sentence naming the file;
    on any failure nothing stays loaded. Runs on the calling thread (the file hash is computed
    on a worker thread meanwhile); checks `cancel` between tensors and components.
    """
    progress = on_progress or no_progress
    set_offline()
    if source in DEMO_MODELS:
        if vae is not None:
            raise BadFileError(
                vae, "the demo model has its own tiny VAE; a separate VAE cannot replace it."
            )
        return _load_demo(source, progress, cancel)
    path = Path(source).expanduser()
    if not path.exists():
        raise BadFileError(path, "the model does not exist (no such file or folder).")
    # Every file read below is dequantised as it is read, whichever loader reads it; what that
    # shows about its scales and values is gathered here for the report.
    with quantized.collecting() as collected:
        if path.is_dir():
            loaded = _load_folder(path, source, vae, allow_pickle, progress, cancel)
        else:
            loaded = _load_single_file(
                path, source, vae, allow_pickle, progress, cancel, text_encoders
            )
    loaded.vae = str(Path(vae).expanduser()) if vae is not None else None
    loaded.quantization = quantized.summary(collected.files)
    loaded.weights.bad_quantized = list(collected.findings)
    return loaded


def check_openable(source: str, *, allow_pickle: bool = False) -> None:
    """Refuse, from its header alone, a source that `load_model` would refuse at its first
    steps: a missing path, a pickle the user has not allowed, a file that is neither a
    safetensors nor a GGUF model (a text file, random bytes, a damaged header).

    Cheap and bounded (headers only, nothing built), so that a caller holding a loaded model can
    keep it when the new one cannot even be opened. Raises what `load_model` raises; passing does
    not promise that the load succeeds.
    """
    from app.core.checkpoint import read_header

    if source in DEMO_MODELS:
        return
    path = Path(source).expanduser()
    if not path.exists():
        raise BadFileError(path, "the model does not exist (no such file or folder).")
    if path.is_dir():
        return
    if is_pickle_file(path):
        if not allow_pickle:
            refuse_pickle(path)
        return
    read_header(path)


# The demo ----------------------------------------------------------------------------------


def _load_demo(name: str, progress: ProgressCallback, cancel: CancelToken | None) -> LoadedModel:
    from app.core import demo

    progress("Building the demo model", 0, 1)
    pipeline = demo.build_demo_pipeline(name)
    progress("Building the demo model", 1, 1)
    weights = scan_weights(pipeline, on_progress=progress, cancel=cancel)
    return LoadedModel(
        pipeline=pipeline,
        source=name,
        name=name,
        format="demo",
        architecture="sd1",
        prediction_type=pipeline.scheduler.config.prediction_type,
        native_size=demo.DEMO_SIZE,
        stored_dtype="fp32",
        model_hash=None,
        profile_key=f"{name}-{demo.DEMO_VERSION}",
        weights=weights,
        detected_because=f"{demo.DEMO_MODELS[name]}: a tiny SD1.x-shaped pipeline built into "
        "HalfSafe.",
    )


# Shipped config folders --------------------------------------------------------------------


def config_folder(name: str) -> Path:
    """The ready-to-use diffusers config folder for `name` (one of architecture.CONFIG_NAMES).

    The shipped folder (`resources/configs/<name>`) holds the JSON configs; the tokenizer
    folders get the shared CLIP vocabulary and merges (`resources/tokenizers/clip`) copied in.
    The result lives in the cache directory, keyed by the content of both, and is built once;
    it is what `from_single_file(..., config=...)` and our own loader read.
    """
    if name not in arch.CONFIG_NAMES:
        raise ValueError(f"no shipped config named {name!r}")
    shipped = paths.resource("configs", name)
    vocabulary = paths.resource("tokenizers", "clip")
    digest = hashlib.sha256()
    for file in sorted(shipped.rglob("*.json")):
        digest.update(str(file.relative_to(shipped)).encode())
        digest.update(file.read_bytes())
    for file in ("vocab.json", "merges.txt"):  # 1.5 MB: hashed, as a stamp could be forged
        digest.update(file.encode())
        digest.update((vocabulary / file).read_bytes())
    target = paths.cache_dir() / "configs" / f"{name}-{digest.hexdigest()[:12]}"
    if (target / "model_index.json").is_file():
        return target
    staging = target.with_name(f"{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(shipped, staging)
    for tokenizer in staging.glob("tokenizer*"):
        for file in ("vocab.json", "merges.txt"):
            shutil.copyfile(vocabulary / file, tokenizer / file)
    try:
        os.replace(staging, target)
    except OSError:
        # Another process built it first; theirs is identical.
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _read_json(path: Path, owner: Path | None = None) -> dict[str, Any]:
    """A config's JSON object; only a regular file, bounded in size and nesting (see limits)."""
    owner = owner or path
    try:
        return limits.read_json_object(path)
    except FileNotFoundError:
        raise BadFileError(owner, f"{path.name} is missing.") from None
    except OSError as error:
        raise BadFileError(path, f"the file cannot be read ({error.strerror or error}).") from None
    except ValueError as error:
        if "not valid JSON" in str(error):
            raise BadFileError(path, "the file is not valid JSON.") from None
        raise BadFileError(path, f"{error}.") from None


# Identity ----------------------------------------------------------------------------------


class _Identity:
    """The identity of one load's weights, for remembered fixes: the digest of every tensor the
    model runs (`checkpoint.TensorDigest`, computed by the weight scan), with the architecture
    and prediction type the loader read them as.

    Hashing costs about 1 s per GB, where the NaN/Inf scan alone streams at several GB/s from
    a warm file, so the digest is cached like the A1111 hash: under the model (and separate
    VAE) paths, with the stamp (`checkpoint.file_stamp`) of every file it was read from. A later
    load of unchanged files asks the scan for no digest; a moved file is hashed again and gets
    the same key back.
    """

    def __init__(self, architecture: str, prediction_type: str, parts: list[Path], files) -> None:
        self._words = f"{architecture}\0{prediction_type}"
        self._key = json.dumps(["tensors", architecture, *(str(p.resolve()) for p in parts)])
        self._stamp: dict[str, Any] | None = None  # unstamped: never cached, hashed every time
        self.cached: str | None = None
        with contextlib.suppress(OSError):
            self._stamp = files_stamp(files)
            self.cached = cached_value(self._key, self._stamp, "content")

    def recall(self, name: str) -> str | None:
        """Another value cached for these unchanged files (None when none is valid)."""
        if self._stamp is None:
            return None
        with contextlib.suppress(OSError):
            return cached_value(self._key, self._stamp, name)
        return None

    def remember(self, name: str, value: str) -> None:
        if self._stamp is not None:
            with contextlib.suppress(OSError):  # not cached only costs the work again
                store_value(self._key, self._stamp, name, value)

    @property
    def needed(self) -> bool:
        """True when the weight scan must compute the digest (nothing valid is cached)."""
        return self.cached is None

    def profile_key(self, scan: WeightScan) -> str:
        """The key for this load, caching a freshly computed digest. The scan must have been
        asked to identify when `needed` was True."""
        content = self.cached or scan.content
        if content is None:
            raise ValueError("the weight scan computed no content digest")
        if self.cached is None and self._stamp is not None:
            # A cache that cannot be written only costs hashing again next time.
            with contextlib.suppress(OSError):
                store_value(self._key, self._stamp, "content", content)
        return hashlib.sha256(f"{self._words}\0{content}".encode()).hexdigest()


def _vae_files(vae: Path) -> list[Path]:
    """The files a separate VAE is read from (a file, or a folder's files)."""
    if vae.is_dir():
        return sorted(f for f in vae.iterdir() if f.is_file())
    return [vae]


# Single files ------------------------------------------------------------------------------


class _Hasher:
    """Computes the A1111 short hash on a worker thread while the model loads.

    Only a file's first load hashes it (the result is cached); if the load finishes first,
    `result()` waits and reports the hash's progress, so a multi-GB first load says what it
    is doing.
    """

    STAGE = "Computing the model hash (first load of this file only)"

    def __init__(self, path: Path) -> None:
        self.value: str | None = cached_model_hash(path)
        self.done_bytes = 0
        self._total = max(1, path.stat().st_size)
        self._cancel = CancelToken()
        self._thread: threading.Thread | None = None
        if self.value is None:
            self._thread = threading.Thread(
                target=self._run, args=(path,), daemon=True, name="halfsafe-model-hash"
            )
            self._thread.start()

    def _run(self, path: Path) -> None:
        try:
            self.value = model_hash(path, cancel=self._cancel, on_bytes=self._count)
        except (OSError, CancelledError, ValueError):
            self.value = None

    def _count(self, done: int) -> None:
        self.done_bytes = done

    def result(self, progress: ProgressCallback, cancel: CancelToken | None) -> str | None:
        while self._thread is not None and self._thread.is_alive():
            if cancel is not None and cancel.cancelled:
                self.stop()
                cancel.raise_if_cancelled()
            total_mb = round(self._total / 1e6)
            progress(self.STAGE, min(total_mb, round(self.done_bytes / 1e6)), total_mb)
            self._thread.join(0.25)
        return self.value

    def stop(self) -> None:
        self._cancel.cancel()


def _load_single_file(
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
        transformer = _split_model(path, checkpoint.shapes)
    except HalfSafeError:
        checkpoint.close()
        raise
    if transformer is not None:
        try:
            return _load_split(
                path, checkpoint, transformer, source, vae, text_encoders or [], progress, cancel
            )
        finally:
            checkpoint.close()
    if text_encoders:
        checkpoint.close()
        raise UnsupportedModelError(
            path,
            "this checkpoint carries its own text encoders; --text-encoder is for split "
            "transformer files (Flux.1, Chroma, SD3.x, Z-Image and Qwen-Image as ComfyUI keeps "
            "them).",
        )
    hasher = _Hasher(path)
    try:
        detection = arch.detect_architecture(
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
                "the checkpoint has no VAE (no first_stage_model tensors); pass a VAE "
                "file with --vae.",
            )
        vae_path = Path(vae).expanduser() if vae is not None else None
        parts = [path] if vae_path is None else [path, vae_path]
        files = [path] if vae_path is None else [path, *_vae_files(vae_path)]
        identity = _Identity(detection.architecture, detection.prediction_type, parts, files)
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


def _settle_prediction(
    pipeline,
    detection: arch.Detection,
    progress: ProgressCallback,
    cancel: CancelToken | None,
    known: list[str] | None = None,
) -> tuple[str, str, int]:
    """(prediction type, how we know it, native size): what the file states, else what a test
    pass of the UNet decides (`app.core.prediction`), else the detection's guess with the
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
        elif detection.family == "sd2":
            native = 768 if kind == "v_prediction" else 512
    elif not detection.prediction_decided:
        from app.core.prediction import probe_prediction_type

        if cancel is not None:
            cancel.raise_if_cancelled()
        progress("Testing the prediction type", 0, 1)
        tested = probe_prediction_type(pipeline, zero_terminal_snr=detection.zero_terminal_snr)
        progress("Testing the prediction type", 1, 1)
        if tested.kind is None:
            because = f"{because}; {tested.because}, so the guess stands"
        else:
            kind, because = tested.kind, tested.because
            if detection.family == "sd2":
                native = 768 if kind == "v_prediction" else 512
    pipeline.scheduler = scheduler_for(
        pipeline.scheduler.config, kind, detection.zero_terminal_snr, pipeline.scheduler
    )
    return kind, because, native


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
    used_keys = [k for k in names if k.startswith(detection.unet_prefix)]
    for encoder in detection.text_encoders:
        used_keys += _text_encoder_keys(names, shapes, encoder)
    if vae is None:
        used_keys += _vae_keys(names, detection.vae_prefix)
    total_bytes = sum(_nbytes(checkpoint, k) for k in used_keys)
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
        base = _read_json(folder / encoder.component / "config.json")
        config = _infer(
            path,
            detection,
            arch.infer_text_encoder_config,
            limits.check_text_encoder_config,
            shapes,
            base,
            encoder,
        )
        if encoder.component == "text_encoder_2":
            pooled_dim = config.get("projection_dim")
        keys = _text_encoder_keys(names, shapes, encoder)
        model_class = getattr(transformers, base.get("architectures", ["CLIPTextModel"])[0])
        words = _component_words(encoder.component)
        tensors = read(keys)
        model = _built(path, words, _empty, model_class, model_class.config_class(**config))
        state = _built(path, words, _convert_text_encoder, model, tensors, encoder)
        components[encoder.component] = _assign(path, model, state, words)

    stage("Loading the UNet")
    base = _read_json(folder / "unet" / "config.json")
    config = _infer(
        path,
        detection,
        arch.infer_unet_config,
        limits.check_unet_config,
        shapes,
        base,
        sample_size=detection.native_size,
        pooled_text_dim=pooled_dim,
    )
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    unet_keys = [k for k in names if k.startswith(detection.unet_prefix)]
    tensors = read(unet_keys)
    model = _built(path, "UNet", _empty, diffusers.UNet2DConditionModel.from_config, config)
    state = _built(path, "UNet", convert_ldm_unet_checkpoint, tensors, config)
    components["unet"] = _assign(path, model, state, "UNet")

    stage("Loading the VAE")
    vae_base = _read_json(folder / "vae" / "config.json")
    vae_scan = None  # the separate VAE's own scan, merged into the checkpoint's below
    if vae is None:
        components["vae"] = _vae_from_checkpoint(
            checkpoint, detection.vae_prefix, vae_base, detection.native_size, read
        )
    else:
        components["vae"], vae_scan, vae_dtypes = _load_vae_override(
            Path(vae).expanduser(), vae_base, detection.native_size, allow_pickle, cancel, identify
        )
        used_dtypes += vae_dtypes
    _check_latents(Path(vae) if vae else path, components["vae"], components["unet"])

    stage("Loading the tokenizer and scheduler")
    for tokenizer in ("tokenizer", "tokenizer_2"):
        if (folder / tokenizer).is_dir() and tokenizer.replace(
            "tokenizer", "text_encoder"
        ) in components:
            components[tokenizer] = transformers.CLIPTokenizer.from_pretrained(
                folder / tokenizer, local_files_only=True
            )
    scheduler_config = _read_json(folder / "scheduler" / "scheduler_config.json")
    scheduler_class = getattr(diffusers, scheduler_config["_class_name"])
    components["scheduler"] = scheduler_class.from_config(
        scheduler_config, prediction_type=detection.prediction_type
    )

    pipeline_class = getattr(diffusers, detection.pipeline_class or "StableDiffusionPipeline")
    if detection.family == "sdxl":
        pipeline = pipeline_class(
            **components, force_zeros_for_empty_prompt=True, add_watermarker=False
        )
    else:
        components.update(safety_checker=None, feature_extractor=None)
        pipeline = pipeline_class(**components, requires_safety_checker=False)
    progress("Loaded", steps, steps)
    scan = scanner.result()
    if vae_scan is not None:
        scan = scan.merged(vae_scan)
    return pipeline, scan, used_dtypes


def _component_words(component: str) -> str:
    return {"text_encoder": "text encoder", "text_encoder_2": "second text encoder"}.get(
        component, component
    )


def _nbytes(checkpoint: Checkpoint, key: str) -> int:
    if checkpoint.header is not None:
        return checkpoint.header.tensors[key].nbytes
    tensor = checkpoint.get(key)
    return tensor.numel() * tensor.element_size()


def _infer(
    path: Path, detection: arch.Detection, function, check, *args, **kwargs
) -> dict[str, Any]:
    """A component config inferred from the file's shapes, and `check`ed against the sizes of
    real models before anything is built from it (a 0-byte tensor can name any size)."""
    try:
        config = function(*args, **kwargs)
    except ValueError as error:
        raise UnsupportedModelError(
            path, f"this looks like {detection.looks_like}, but {error}."
        ) from None
    try:
        check(config)
    except ValueError as error:
        raise BadFileError(
            path, f"the weights' shapes describe a model no real file holds: {error}."
        ) from None
    return config


def _built(path: Path, words: str, build, *args):
    """`build(*args)` for one component, where a file whose names and shapes passed every
    check still does not fit what diffusers or transformers expect: a sentence, not a trace."""
    try:
        return build(*args)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RuntimeError) as error:
        raise UnsupportedModelError(
            path,
            f"the {words} cannot be built from this file's weights ({_first_line(error)}).",
        ) from None


def _empty(build, *args) -> Any:
    """`build(*args)` without allocating or initialising parameters (they come from the
    checkpoint)."""
    import importlib
    from contextlib import nullcontext

    from accelerate import init_empty_weights

    # transformers would otherwise run its random init on the empty tensors; the helper moved
    # between modules across transformers versions.
    no_init_weights: Any = nullcontext
    for module in ("transformers.initialization", "transformers.modeling_utils"):
        with contextlib.suppress(ImportError, AttributeError):
            no_init_weights = importlib.import_module(module).no_init_weights
            break
    with init_empty_weights(include_buffers=False), no_init_weights():
        return build(*args)


def _assign(path: Path, model, state: dict[str, Any], words: str):
    """Put `state` into `model` as is (no copy), all or nothing, in the component's dtype."""
    import torch

    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing:
        raise BadFileError(
            path,
            f"the {words} is incomplete: {len(missing)} of its weights are "
            f"missing (e.g. {missing[0]}).",
        )
    if unexpected:
        raise UnsupportedModelError(
            path,
            f"the {words} has {len(unexpected)} weights HalfSafe "
            f"cannot place (e.g. {unexpected[0]}).",
        )
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise BadFileError(
                path,
                f"the {words} weight {key} has shape {list(tensor.shape)} "
                f"where the rest of the file implies "
                f"{list(expected[key].shape)}.",
            )
        if expected[key].is_floating_point() and not tensor.is_floating_point():
            kind = "bool" if tensor.dtype == torch.bool else "integer"
            raise BadFileError(
                path,
                f"the {words} weight {key} is stored as {kind} values "
                f"({str(tensor.dtype).removeprefix('torch.')}) where a floating-point weight "
                "belongs, so the file is damaged or not this model.",
            )
    by_dtype: dict[Any, int] = {}
    for tensor in state.values():
        if tensor.is_floating_point():
            by_dtype[tensor.dtype] = by_dtype.get(tensor.dtype, 0) + tensor.numel()
    dtype = max(by_dtype, key=by_dtype.__getitem__) if by_dtype else torch.float32
    state = {
        k: (v.to(dtype) if v.is_floating_point() and v.dtype != dtype else v)
        for k, v in state.items()
    }
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def _text_encoder_keys(names: list[str], shapes, encoder: arch.TextEncoderLayout) -> list[str]:
    keys = [k for k in names if k.startswith(encoder.prefix)]
    if encoder.layout == "hf":
        root = encoder.prefix.removesuffix("text_model.")
        keys = [k for k in keys if not k.endswith("position_ids")]
        if encoder.drop_last_layer:  # SD2 in transformers names: as below
            last = count_indices(shapes, encoder.prefix + "encoder.layers.") - 1
            unused = f"{encoder.prefix}encoder.layers.{last}."
            return [k for k in keys if not k.startswith(unused)]
        keys += [k for k in names if k == root + "text_projection.weight"]
        return keys
    keys = [
        k
        for k in keys
        if k[len(encoder.prefix) :].split(".")[0]
        in ("token_embedding", "positional_embedding", "transformer", "ln_final", "text_projection")
    ]
    if encoder.drop_last_layer:
        last = count_indices(shapes, encoder.prefix + "transformer.resblocks.") - 1
        unused = f"{encoder.prefix}transformer.resblocks.{last}."
        # SD2 reads the penultimate layer: the last block and the projection are never used.
        keys = [
            k for k in keys if not k.startswith(unused) and k != encoder.prefix + "text_projection"
        ]
    return keys


def _convert_text_encoder(model, tensors: dict[str, Any], encoder: arch.TextEncoderLayout):
    wrapped = any(k.startswith("text_model.") for k in model.state_dict())
    if encoder.layout == "hf":
        root = encoder.prefix.removesuffix("text_model.")
        state = {}
        for key, tensor in tensors.items():
            if key == root + "text_projection.weight":
                state["text_projection.weight"] = tensor
            else:
                name = key[len(encoder.prefix) :]
                state[("text_model." + name) if wrapped else name] = tensor
        return state
    from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint

    converted = convert_open_clip_checkpoint(model, tensors, prefix=encoder.prefix)
    if not hasattr(model, "text_projection"):
        converted.pop("text_projection.weight", None)
    if not wrapped:
        converted = {k.removeprefix("text_model."): v for k, v in converted.items()}
    return converted


_VAE_PARTS = ("encoder.", "decoder.", "quant_conv.", "post_quant_conv.")


def _vae_keys(names: list[str], prefix: str) -> list[str]:
    return [k for k in names if k.startswith(prefix) and k[len(prefix) :].startswith(_VAE_PARTS)]


def _vae_from_checkpoint(
    checkpoint: Checkpoint, prefix: str, base: dict[str, Any], native_size: int, read
):
    import diffusers

    path = checkpoint.path
    try:
        config = arch.infer_vae_config(
            checkpoint.shapes, base, prefix=prefix, sample_size=native_size
        )
    except ValueError as error:
        raise UnsupportedModelError(
            path, f"its VAE is not one HalfSafe can build: {error}."
        ) from None
    try:
        limits.check_vae_config(config)
    except ValueError as error:
        raise BadFileError(
            path, f"the VAE weights' shapes describe a VAE no real file holds: {error}."
        ) from None
    tensors = read(_vae_keys(checkpoint.keys(), prefix))
    model = _built(path, "VAE", _empty, diffusers.AutoencoderKL.from_config, config)
    return _assign(path, model, _built(path, "VAE", _convert_vae, tensors, prefix, config), "VAE")


def _convert_vae(tensors: dict[str, Any], prefix: str, config: dict[str, Any]) -> dict[str, Any]:
    plain = {k[len(prefix) :]: v for k, v in tensors.items()}
    if "encoder.down_blocks.0.resnets.0.conv1.weight" in plain:
        # Already diffusers names; older files still call the attention projections
        # query/key/value/proj_attn and store them as 1x1 convolutions.
        renamed = {}
        for key, tensor in plain.items():
            for old, new in (
                (".query.", ".to_q."),
                (".key.", ".to_k."),
                (".value.", ".to_v."),
                (".proj_attn.", ".to_out.0."),
            ):
                key = key.replace(old, new)
            if ".attentions." in key and key.endswith("weight") and tensor.ndim > 2:
                tensor = tensor.reshape(tensor.shape[0], tensor.shape[1])
            renamed[key] = tensor
        return renamed
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    return convert_ldm_vae_checkpoint(plain, config)


def _load_vae_override(
    path: Path,
    base: dict[str, Any],
    native_size: int,
    allow_pickle: bool,
    cancel: CancelToken | None,
    identify: bool = False,
):
    """A separate VAE: a file (original or diffusers layout, or a full checkpoint's VAE) or a
    diffusers VAE folder. Returns (model, scan, dtypes); the scan digests with `identify`."""
    import diffusers

    if not path.exists():
        raise BadFileError(path, "the VAE does not exist (no such file or folder).")
    if path.is_dir():
        config = _read_json(path / "config.json", owner=path)
        _check_files(path, "vae")
        files = _weight_files(path, allow_pickle, path)
        dtypes = [
            d
            for f in files
            if f.suffix == ".safetensors"
            for d in read_safetensors_header(f).dtypes().values()
        ]
        torch_dtype = _torch_dtype(stored_dtype(dtypes)) if dtypes else None
        try:
            model = diffusers.AutoencoderKL.from_pretrained(
                path,
                local_files_only=True,
                torch_dtype=torch_dtype,
                use_safetensors=not all(f.suffix != ".safetensors" for f in files) or None,
            )
        except (OSError, ValueError, RuntimeError, KeyError) as error:
            raise BadFileError(
                path, f"diffusers could not load this VAE folder ({_first_line(error)})."
            ) from None
        if config.get("_class_name") not in (None, "AutoencoderKL"):
            raise UnsupportedModelError(
                path, f"this is a {config['_class_name']}, not an AutoencoderKL VAE."
            )
        return model.eval(), scan_weights(model, cancel=cancel, identify=identify), dtypes
    with Checkpoint(path, allow_pickle=allow_pickle, component="vae") as checkpoint:
        keys = checkpoint.keys()
        prefix = next(
            (p for p in (arch.VAE, "vae.", "") if any(k.startswith(p + "decoder.") for k in keys)),
            None,
        )
        if prefix is None or not any(k.startswith(prefix + "encoder.") for k in keys):
            raise BadFileError(path, "this file holds no VAE (no encoder and decoder tensors).")
        vae_keys = _vae_keys(keys, prefix)
        scanner = WeightScanner(
            sum(_nbytes(checkpoint, k) for k in vae_keys),
            cancel=cancel,
            identify=identify,
            label=f"{path.name}:",
        )

        def read(keys_: list[str]) -> dict[str, Any]:
            tensors = {}
            for key in keys_:
                tensors[key] = checkpoint.get(key)
                scanner.check(key, tensors[key])
            return tensors

        model = _vae_from_checkpoint(checkpoint, prefix, base, native_size, read)
        return model, scanner.result(), [checkpoint.dtypes[k] for k in vae_keys]


def _check_latents(path: Path, vae, unet) -> None:
    latent = vae.config.latent_channels
    # Flux and Chroma transformers work on 2x2 patches of the latent: 4 values per channel.
    kind = type(unet).__name__
    patches = 4 if kind in ("FluxTransformer2DModel", "ChromaTransformer2DModel") else 1
    # Z-Image's transformer has no out_channels: it gives back what it takes.
    channels = (unet.config.get("out_channels") or unet.config.in_channels) // patches
    if latent != channels:
        raise UnsupportedModelError(
            path,
            f"the VAE makes {latent}-channel latents but the "
            f"{'transformer' if kind.endswith('Transformer2DModel') else 'UNet'} works on "
            f"{channels}.",
        )


def _torch_dtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES.get(name, "float32"))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line[:200].rstrip(".")


# Transformer files (Flux.1, Chroma, SD3.x, Z-Image, Qwen-Image as ComfyUI keeps them) -------


def _split_model(path: Path, shapes) -> SplitModel | None:
    """The transformer file's model from its header (None: not a transformer file)."""
    try:
        return split.read_model(shapes)
    except AbsurdSizes as error:
        raise BadFileError(
            path, f"the weights' shapes describe a model no real file holds: {error}."
        ) from None
    except ValueError as error:
        raise UnsupportedModelError(
            path, f"this {split.layout_words(shapes)} is not one HalfSafe can build: {error}."
        ) from None


def _load_split(
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

    from app.core.tokenizers import clip_tokenizer, qwen2_tokenizer, qwen3_tokenizer, t5_tokenizer

    tokenizers = {"t5": t5_tokenizer, "qwen3": qwen3_tokenizer, "qwen25_vl": qwen2_tokenizer}
    companions = split.find_companions(path, model, text_encoders, vae)
    missing = split.missing_sentence(model, companions, path)
    if missing is not None:
        raise UnsupportedModelError(path, missing)
    external = {c: p for c, p in companions.found.items() if p is not None}
    parts = [path, *external.values()]
    files = [path]
    for component, file in external.items():
        files += _vae_files(file) if component == "vae" else [file]
    identity = _Identity(model.architecture, "flow", parts, files)
    hasher = _Hasher(path)
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
                if need.kind == "wan_vae" and where is not None:
                    part, dtypes = _load_wan_vae_file(where)
                elif need.kind == "vae":
                    base = _read_json(
                        paths.resource("configs", model.configs, "vae", "config.json")
                    )
                    if where is not None:
                        part, _, dtypes = _load_vae_override(
                            where, base, 1024, allow_pickle=False, cancel=cancel
                        )
                    else:
                        part, dtypes = _inner_vae(checkpoint, need.inside or "", base)
                elif where is not None:
                    with Checkpoint(where, component=need.component) as companion:
                        part, dtypes = _load_text_encoder(companion, "", need)
                else:
                    part, dtypes = _load_text_encoder(checkpoint, need.inside or "", need)
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
                if need.is_text_encoder:
                    tokenizer = need.component.replace("text_encoder", "tokenizer")
                    components[tokenizer] = (
                        tokenizers[need.kind]()
                        if need.kind in tokenizers
                        else clip_tokenizer(need.pad_token)
                    )
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
            scheduler_config = _read_json(
                paths.resource("configs", model.configs, "scheduler", "scheduler_config.json")
            )
            components["scheduler"] = diffusers.FlowMatchEulerDiscreteScheduler.from_config(
                scheduler_config, **model.scheduler
            )
            pipeline = getattr(diffusers, model.pipeline_class)(**components)
        progress("Scanning the weights", steps - 1, steps)
        weights = scan_weights(
            pipeline, on_progress=progress, cancel=cancel, identify=identity.needed
        )
        short_hash = hasher.result(progress, cancel)
    except BaseException:
        hasher.stop()
        raise
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
        profile_key=identity.profile_key(weights),
        weights=weights,
        detected_because=model.because,
        companions=companions.used(),
        notes=split.companion_notes(model, companions),
    )


def _qwen3_encoder(checkpoint: Checkpoint):
    """A Qwen3 text encoder file in transformers' layout (ComfyUI's qwen_3_4b.safetensors):
    the decoder's layers, read as a Qwen3Model (the LM head, if any, is not used). Returns
    (model, stored dtypes)."""
    import transformers

    path = checkpoint.path
    prefix = encoders.qwen3_prefix(checkpoint.shapes)
    try:
        if prefix is None:
            raise ValueError("it has no Qwen3 layers (embed_tokens, q_norm)")
        config = encoders.qwen3_config(checkpoint.shapes, prefix)
    except (KeyError, ValueError) as error:
        raise UnsupportedModelError(
            path, f"this Qwen3 text encoder cannot be built: {error}."
        ) from None
    keys = [k for k in checkpoint.shapes if k.startswith(prefix) and k != "lm_head.weight"]
    tensors = {k[len(prefix) :]: checkpoint.get(k) for k in keys}
    dtypes = [checkpoint.dtypes[k] for k in keys]
    model = _empty(transformers.Qwen3Model, transformers.Qwen3Config(**config))
    return _assign(path, model, tensors, "Qwen3 text encoder"), dtypes


def _qwen25_vl_encoder(checkpoint: Checkpoint):
    """A Qwen2.5-VL file as ComfyUI keeps it (qwen_2.5_vl_7b.safetensors: model.*, visual.*,
    lm_head), read as a Qwen2_5_VLForConditionalGeneration. Returns (model, stored dtypes)."""
    import transformers

    path = checkpoint.path
    try:
        config = encoders.qwen25_vl_config(checkpoint.shapes)
    except (KeyError, ValueError) as error:
        raise UnsupportedModelError(
            path, f"this Qwen2.5-VL text encoder cannot be built: {error}."
        ) from None
    tensors = {}
    for key in checkpoint.shapes:
        name = encoders.qwen25_vl_to_transformers(key)
        tensors[name if name is not None else key] = checkpoint.get(key)
    dtypes = list(checkpoint.dtypes.values())
    model = _empty(
        transformers.Qwen2_5_VLForConditionalGeneration, transformers.Qwen2_5_VLConfig(**config)
    )
    return _assign(path, model, tensors, "Qwen2.5-VL text encoder"), dtypes


def _load_wan_vae_file(path: Path):
    """Qwen-Image's VAE file in the Wan 2.1 layout (qwen_image_vae.safetensors)."""
    import diffusers

    with Checkpoint(path, component="vae") as checkpoint:
        try:
            config = encoders.wan_vae_config(checkpoint.shapes)
        except (KeyError, ValueError) as error:
            raise UnsupportedModelError(path, f"this VAE cannot be built: {error}.") from None
        model = _empty(diffusers.AutoencoderKLQwenImage.from_config, config)
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        try:
            state = encoders.wan_vae_to_diffusers(
                {k: checkpoint.get(k) for k in checkpoint.shapes},
                expected,
                config["num_res_blocks"],
            )
        except KeyError as error:
            raise BadFileError(
                path, f"the VAE is incomplete: {error.args[0]} is missing."
            ) from None
        dtypes = list(checkpoint.dtypes.values())
    return _assign(path, model, state, "VAE"), dtypes


def _split_transformer(path: Path, checkpoint: Checkpoint, model: SplitModel):
    """The diffusers transformer from the file's original-layout keys, by the layout's table."""
    import diffusers

    config = model.config
    build = getattr(diffusers, config["_class_name"]).from_config
    transformer = _built(path, "transformer", _empty, build, config)
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
            path, f"the transformer does not fit together: {_first_line(error)}."
        ) from None
    return _assign(path, transformer, state, "transformer")


def _load_text_encoder(checkpoint: Checkpoint, prefix: str, need: Need):
    """A text encoder under `prefix` of a file, as `need.kind` says: a CLIP or T5 in
    transformers' layout (a companion's own `clip_l.safetensors`, or the text_encoders.* of an
    SD3.x file), a Qwen3 or a Qwen2.5-VL file. Returns (model, stored dtypes)."""
    import transformers

    if need.kind == "qwen3":
        return _qwen3_encoder(checkpoint)
    if need.kind == "qwen25_vl":
        return _qwen25_vl_encoder(checkpoint)
    path = checkpoint.path
    words = need.words.removeprefix("its ")
    shapes = {k[len(prefix) :]: v for k, v in checkpoint.shapes.items() if k.startswith(prefix)}
    layout = arch.TextEncoderLayout(need.component, CLIP_PREFIX, "hf")  # a CLIP's
    try:
        if need.kind == "t5":
            config = encoders.t5_config(shapes)
        else:
            folder, component = need.clip_config.split("/")
            base = _read_json(paths.resource("configs", folder, component, "config.json"))
            config = arch.infer_text_encoder_config(shapes, base, layout)
        limits.check_text_encoder_config(config)
    except (KeyError, ValueError) as error:
        raise UnsupportedModelError(path, f"the {words} cannot be built: {error}.") from None
    if need.kind == "clip_projected" and CLIP_PROJECTION not in shapes:
        raise UnsupportedModelError(
            path,
            f"the {words} has no text projection ({prefix}{CLIP_PROJECTION}), which "
            "its pooled vector goes through.",
        )
    if need.kind == "t5":
        keys = list(shapes)
        model = _empty(transformers.T5EncoderModel, transformers.T5Config(**config))
    else:
        projected = need.kind == "clip_projected"
        keys = [k for k in shapes if k.startswith(CLIP_PREFIX)]
        keys = [k for k in keys if not k.endswith("position_ids")]
        keys += [CLIP_PROJECTION] if projected else []
        model_class = (
            transformers.CLIPTextModelWithProjection if projected else transformers.CLIPTextModel
        )
        model = _empty(model_class, transformers.CLIPTextConfig(**config))
    tensors = {k: checkpoint.get(prefix + k) for k in keys}
    dtypes = [checkpoint.dtypes[prefix + k] for k in keys]
    if need.kind == "t5":
        expected = model.state_dict()
        # Files differ in whether they repeat the tied token embedding under the encoder's name.
        if (
            "encoder.embed_tokens.weight" in expected
            and "encoder.embed_tokens.weight" not in tensors
        ):
            tensors["encoder.embed_tokens.weight"] = tensors["shared.weight"]
        state = {
            k: v for k, v in tensors.items() if k in expected or not k.startswith("encoder.embed")
        }
    else:
        state = _convert_text_encoder(model, tensors, layout)
    return _assign(path, model, state, words), dtypes


def _inner_vae(checkpoint: Checkpoint, prefix: str, base: dict[str, Any]):
    """The VAE an SD3.x file carries (first_stage_model.*). Returns (model, stored dtypes)."""
    keys = _vae_keys(checkpoint.keys(), prefix)

    def read(names: list[str]) -> dict[str, Any]:
        return {k: checkpoint.get(k) for k in names}

    model = _vae_from_checkpoint(checkpoint, prefix, base, 1024, read)
    return model, [checkpoint.dtypes[k] for k in keys]


# Diffusers folders -------------------------------------------------------------------------


def _check_config(path: Path, check, config: dict[str, Any]) -> None:
    """`check` a config against real models' sizes before anything reads a size from it."""
    try:
        check(config)
    except ValueError as error:
        raise BadFileError(path, f"{error}.") from None


def _check_files(folder: Path, component: str | None = None) -> None:
    """Every file diffusers or transformers would open in a component folder is a regular
    file, and each config, vocabulary and merges file is well formed and within real sizes,
    before the folder is handed to them (see limits.check_component_files)."""
    try:
        limits.check_component_files(folder, component)
    except limits.ComponentFileError as error:
        raise BadFileError(error.path, f"{error.reason}.") from None


def _weight_files(folder: Path, allow_pickle: bool, owner: Path) -> list[Path]:
    """The weight files of one component folder, each safetensors header validated."""
    files = sorted(f for f in folder.glob("*.safetensors") if f.is_file())
    if files:
        for file in files:
            read_safetensors_header(file)
        return files
    pickles = sorted(
        f
        for f in folder.iterdir()
        if f.is_file() and f.suffix.lower() in (".bin", ".ckpt", ".pt", ".pth")
    )
    if pickles:
        if not allow_pickle:
            refuse_pickle(pickles[0])
        return pickles
    raise BadFileError(folder, f"the {folder.name} folder of {owner.name} has no weights file.")


def _load_folder(
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
    index = _read_json(index_file)
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
            "has no UNet or transformer; HalfSafe runs SD1.x, SD2.x, SDXL and Flux.1.",
        )
    unet_config = _read_json(path / denoiser / "config.json", owner=path / denoiser)
    if denoiser == "unet":
        _check_config(path / "unet" / "config.json", limits.check_unet_config, unet_config)
    scheduler_config = (
        _read_json(path / "scheduler" / "scheduler_config.json", owner=path / "scheduler")
        if "scheduler" in components
        else {}
    )
    _check_config(
        path / "scheduler" / "scheduler_config.json",
        limits.check_scheduler_config,
        scheduler_config,
    )
    for name in sorted(components):
        _check_files(path / name)
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
        _read_json(folder / "config.json", owner=folder)
        files = _weight_files(folder, allow_pickle, path)
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
        read_from += _vae_files(Path(vae).expanduser())
    identity = _Identity(detection.architecture, detection.prediction_type, parts, read_from)

    torch_dtype: dict[str, Any] = {"default": _torch_dtype("fp32")}
    for name, found in dtypes.items():
        torch_dtype[name] = _torch_dtype(stored_dtype(found))
    progress("Loading the model folder", 0, 1)
    try:
        pipeline = diffusers.DiffusionPipeline.from_pretrained(
            path,
            local_files_only=True,
            torch_dtype=torch_dtype,
            variant=variant,
            use_safetensors=None if pickles else True,
        )
    except HalfSafeError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError) as error:
        raise BadFileError(
            path, f"diffusers could not load this folder ({_first_line(error)})."
        ) from None
    progress("Loading the model folder", 1, 1)
    if vae is not None:
        vae_base = dict(pipeline.vae.config)
        model, _, vae_dtypes = _load_vae_override(
            Path(vae).expanduser(), vae_base, detection.native_size, allow_pickle, cancel
        )
        _check_latents(Path(vae), model, getattr(pipeline, denoiser))
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
