"""Loading models offline: diffusers folders, single-file checkpoints, a separate VAE, the demo.

Single files in the original (LDM / A1111 / ComfyUI) layout are assembled component by
component: the architecture and each component's config come from the file's own tensor
shapes over the shipped config folder (`app/resources/configs/<name>`), the keys are mapped to
diffusers names with diffusers' conversion functions, and the tensors are assigned straight
from the memory-mapped file in their stored dtype. Transformer files (Flux.1, Chroma, SD3.x
split or all in one, Z-Image, Qwen-Image) are mapped by the layout tables of `split.py` and
assembled with their companions in the same way. Nothing reaches the network: the offline
switches are set and every diffusers/transformers call is local-only.

This module holds the entry points (`load_model`, `check_openable`) and the demo; one
responsibility per module below, each importing only those before it:
  loaded             LoadedModel, the record every loader returns
  configs            the shipped config folders made ready offline; reading a config's JSON
  component_files    a component folder's files checked before diffusers or transformers
  identity           the weights' content digest and the A1111 short hash, cached
  assembly           a component built empty from a config, its stored tensors assigned
  conversion         text encoders and VAEs from checkpoint layouts; a separate VAE
  companions         a transformer file's companion text encoders and VAEs
  transformer_files  transformer files with their companions (see `split.py`)
  single_file        single-file checkpoints, component by component
  folder             diffusers pipeline folders

torch, diffusers and transformers are imported inside the functions that use them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.errors import BadFileError
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.lazy import lazy_exports

if TYPE_CHECKING:
    from app.core.checkpoint import (
        read_safetensors_header,  # tests read the files they wrote through here
    )
    from app.core.models.configs import config_folder
    from app.core.models.folder import MODEL_COMPONENTS
    from app.core.models.loaded import LoadedModel
    from app.core.models.single_file import scheduler_for

STARTING_DIFFUSERS = "Starting the image library (once per engine)"

__all__ = [
    "MODEL_COMPONENTS",
    "LoadedModel",
    "check_openable",
    "config_folder",
    "load_model",
    "read_safetensors_header",
    "scheduler_for",
    "set_offline",
]

# The loaders and what they use are dozens of modules; `models.summary`, which the GUI imports,
# must not pay for them (see app/core/lazy.py).
if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            "app.core.checkpoint": ["read_safetensors_header"],
            ".configs": ["config_folder"],
            ".folder": ["MODEL_COMPONENTS"],
            ".loaded": ["LoadedModel"],
            ".single_file": ["scheduler_for"],
        },
    )


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
    from app.core.memory import said_as_sentence

    with said_as_sentence("loading the model"):
        return _load_model(source, vae, text_encoders, allow_pickle, on_progress, cancel)


def _load_model(
    source: str,
    vae: str | None,
    text_encoders: list[str] | None,
    allow_pickle: bool,
    on_progress: ProgressCallback | None,
    cancel: CancelToken | None,
) -> LoadedModel:
    from app.core.demo import DEMO_MODELS
    from app.core.formats import quantized
    from app.core.models.folder import load_folder
    from app.core.models.single_file import load_single_file

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
    start_diffusers(progress)
    # Every file read below is dequantised as it is read, whichever loader reads it; what that
    # shows about its scales and values is gathered here for the report.
    with quantized.collecting() as collected:
        if path.is_dir():
            loaded = load_folder(path, source, vae, allow_pickle, progress, cancel)
        else:
            loaded = load_single_file(
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
    from app.core.checkpoint.header import read_header
    from app.core.checkpoint.pickles import is_pickle_file, refuse_pickle
    from app.core.demo import DEMO_MODELS

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


def start_diffusers(progress: ProgressCallback) -> None:
    """Import diffusers, which takes seconds once per engine (most of a first demo load), with
    a stage that names the wait instead of a bar that sits still under another name."""
    if "diffusers" not in sys.modules:
        progress(STARTING_DIFFUSERS, 0, 1)
        import diffusers  # noqa: F401 - imported for its cost, here rather than mid-load


# The demo ----------------------------------------------------------------------------------


def _load_demo(name: str, progress: ProgressCallback, cancel: CancelToken | None) -> LoadedModel:
    from app.core import demo
    from app.core.checkpoint.scan import scan_weights
    from app.core.models.loaded import LoadedModel

    start_diffusers(progress)
    pipeline = demo.build_demo_pipeline(name, progress)
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
