"""What the library lists: a row (`LibraryEntry`: a checkpoint, a VAE, or a file or folder that
could not be read), a folder with what its files are (`ModelFolder`), and how far below a
folder a scan looks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# How deep below a model folder files are listed (subfolders, symlinked ones included).
MAX_DEPTH = 6
# Directory entries looked at below one model folder: a model folder holds hundreds, a folder
# that is really a whole disk millions. Past this the folder gets a row saying so and the scan
# moves on, so a scan lists at most this many entries per folder (and never stats the rest).
MAX_FOLDER_ENTRIES = 50_000

MODEL = "model"
VAE = "vae"


@dataclass(frozen=True)
class LibraryEntry:
    """One checkpoint (or VAE) found in a model folder."""

    path: str
    architecture: str | None  # "sd1", "sd2", "sdxl", "-inpaint" variants, or what else it is
    stored_dtype: str | None  # "fp16", "bf16", "fp32", "mixed"; None when not read
    size_bytes: int
    error: str | None = None  # one sentence when the file is broken
    format: str = "single_file"  # "single_file" | "diffusers" | "pickle" | "split_files"
    supported: bool = False  # HalfSafe can load it
    detected_because: str | None = None
    role: str = MODEL  # "model" | "vae": a VAE is chosen beside a model, never loaded alone
    vae: str | None = None  # the VAE A1111 pairs with this model (`name.vae.safetensors`)
    # A split transformer file (Flux.1, Chroma, SD3.x, Z-Image, Qwen-Image as ComfyUI keeps
    # them): the companion files found beside it by component (None where missing), and the
    # sentence naming what is missing.
    companions: dict[str, str | None] | None = None
    missing: str | None = None


@dataclass(frozen=True)
class ModelFolder:
    """A folder the library lists, and what its files are (models, or VAEs)."""

    path: Path
    role: str = MODEL
