"""The model library: checkpoints found in the user's model folders, read from headers only.

Scans the folders from settings plus the usual AUTOMATIC1111, ComfyUI and StabilityMatrix model
folders that exist on this computer and HalfSafe's own, and lists every checkpoint with its
architecture, stored dtype and size. Only safetensors headers and folder configs are read, never
weights; pickles are listed but not opened. A broken file is listed with its problem and the
scan goes on. Results are cached by path, size and modification time, so a rescan only reads
what changed. No torch here.

One responsibility per module, each importing only those before it:
  entries     LibraryEntry and ModelFolder, their roles, how deep and wide a scan looks
  yaml_files  the tools' small YAML files, read within bounds
  folders     which folders the library lists: the tools' installs, extra_model_paths.yaml,
              the settings' folders, HalfSafe's own
  index       the cache of rows (library.json), checked row by row when read back
  inspection  one row from a file's header or a diffusers folder's configs
  scan        scan_library: the files below each folder, read or cached, VAEs paired
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.lazy import lazy_exports

if TYPE_CHECKING:
    from app.core.library.entries import (
        MAX_DEPTH,
        MAX_FOLDER_ENTRIES,
        MODEL,
        VAE,
        LibraryEntry,
        ModelFolder,
    )
    from app.core.library.folders import (
        APP_MODELS,
        default_folders,
        default_model_folders,
        extra_model_paths,
        library_folders,
        library_roots,
        tool_of,
    )
    from app.core.library.index import INDEX_FILE, INDEX_FORMAT, INDEX_LIMIT, index_version
    from app.core.library.scan import MODEL_SUFFIXES, VAE_PAIR_SUFFIXES, scan_library
    from app.core.library.yaml_files import (
        MAX_YAML_BYTES,
        MAX_YAML_DEPTH,
        MAX_YAML_PATHS,
        MAX_YAML_SECTIONS,
    )

__all__ = [
    "APP_MODELS",
    "INDEX_FILE",
    "INDEX_LIMIT",
    "INDEX_FORMAT",
    "MAX_DEPTH",
    "MAX_FOLDER_ENTRIES",
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_PATHS",
    "MAX_YAML_SECTIONS",
    "MODEL",
    "MODEL_SUFFIXES",
    "VAE",
    "VAE_PAIR_SUFFIXES",
    "LibraryEntry",
    "ModelFolder",
    "default_folders",
    "default_model_folders",
    "extra_model_paths",
    "index_version",
    "library_folders",
    "library_roots",
    "scan_library",
    "tool_of",
]

if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            ".entries": [
                "MAX_DEPTH",
                "MAX_FOLDER_ENTRIES",
                "MODEL",
                "VAE",
                "LibraryEntry",
                "ModelFolder",
            ],
            ".folders": [
                "APP_MODELS",
                "default_folders",
                "default_model_folders",
                "extra_model_paths",
                "library_folders",
                "library_roots",
                "tool_of",
            ],
            ".index": ["INDEX_FILE", "INDEX_FORMAT", "INDEX_LIMIT", "index_version"],
            ".scan": ["MODEL_SUFFIXES", "VAE_PAIR_SUFFIXES", "scan_library"],
            ".yaml_files": [
                "MAX_YAML_BYTES",
                "MAX_YAML_DEPTH",
                "MAX_YAML_PATHS",
                "MAX_YAML_SECTIONS",
            ],
        },
    )
