"""One row per file or folder, from headers and configs only: a safetensors or GGUF file's
architecture and stored dtype (a split transformer with the companions beside it), a diffusers
folder's from its configs, a pickle listed unopened; a fault costs only its own row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from app.core import architecture as arch
from app.core import component_limits, config_limits, families, limits
from app.core.checkpoint import (
    SAFETENSORS_SUFFIX,
    read_header,
    read_safetensors_header,
    stored_dtype,
)
from app.core.errors import BadFileError
from app.core.formats.quantized import SCALED_FP8_MARKER
from app.core.library.entries import MAX_FOLDER_ENTRIES, LibraryEntry
from app.core.models import split


def _inspect_one(path: Path, kind: str) -> LibraryEntry:
    """One row, whatever the file holds: a file that trips a fault HalfSafe did not foresee
    costs its own row (with the fault named), never the rest of the library."""
    try:
        return _inspect(path, kind)
    except Exception as error:  # the promise is per row; the GUI shows the text
        words = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        return LibraryEntry(
            str(path),
            None,
            None,
            0,
            f"{path}: HalfSafe could not read it ({type(error).__name__}"
            f"{': ' + words if words else ''}).",
            format="diffusers" if kind == "diffusers" else kind,
        )


def _inspect(path: Path, kind: str) -> LibraryEntry:
    if kind == "diffusers":
        return _inspect_folder(path)
    try:
        size = path.stat().st_size
    except OSError as error:
        return LibraryEntry(
            str(path),
            None,
            None,
            0,
            f"{path}: the file cannot be read ({error.strerror or error}).",
            format=kind,
        )
    if kind == "pickle":
        return LibraryEntry(
            str(path),
            None,
            None,
            size,
            None,
            format="pickle",
            detected_because="a pickle checkpoint: not opened (it could run "
            "code); load it with --allow-pickle to inspect it",
        )
    try:
        header = read_header(path)
    except BadFileError as error:
        return LibraryEntry(str(path), None, None, size, str(error))
    sidecar = path.with_suffix(".yaml")
    sidecar_text = None
    if limits.is_regular_file(sidecar):
        try:
            raw = limits.read_regular(sidecar, limits.MAX_CONFIG_BYTES)
            sidecar_text = raw.decode("utf-8", errors="replace")
        except OSError:
            sidecar_text = None
    # ComfyUI's `scaled_fp8` marker is bookkeeping, not a weight: a bf16 file with it is bf16.
    dtype = stored_dtype(d for n, d in header.dtypes().items() if n != SCALED_FP8_MARKER)
    layout = split.find_layout(header.shapes())
    transformer = None
    if layout is not None:
        try:
            transformer = split.read_model(header.shapes(), path.name)
        except ValueError as error:
            return LibraryEntry(
                str(path),
                layout[0],
                dtype if dtype != "none" else None,
                size,
                None,
                format="split_files",
                detected_because=(
                    f"this {split.layout_words(header.shapes())} is not one HalfSafe can build: "
                    f"{error}."
                ),
            )
    if transformer is not None:
        return LibraryEntry(
            str(path),
            transformer.architecture,
            dtype if dtype != "none" else None,
            size,
            None,
            # A transformer file with companions, or an SD3.x file that holds them all.
            format="split_files" if transformer.companions else "single_file",
            supported=True,
            detected_because=transformer.because,
        )
    detection = families.detect_architecture(
        header.shapes(), metadata=header.metadata, name=path.name, sidecar_config=sidecar_text
    )
    problem = arch.shape_problem(header.shapes(), detection) if detection.supported else None
    return LibraryEntry(
        str(path),
        detection.architecture,
        dtype if dtype != "none" else None,
        size,
        f"{path}: this looks like {detection.looks_like}, but {problem}." if problem else None,
        supported=detection.supported and problem is None,
        detected_because=detection.because,
    )


def _with_companions(entry: LibraryEntry) -> LibraryEntry:
    """A split transformer file's entry with the companions found beside it (headers only), or,
    for a file no companion makes runnable (Flux.2 dev's, whose tokenizer is not shipped), the
    sentence saying why in `missing`. Whatever goes wrong on the way costs this row only: it
    then says so and is not loadable."""
    path = Path(entry.path)
    try:
        transformer = split.read_model(read_header(path).shapes(), path.name)
        if transformer is None:
            return entry
        if transformer.unsupported is not None:  # no companion would make it run
            return replace(entry, supported=False, missing=transformer.unsupported + ".")
        found = split.find_companions(path, transformer, [], None)
        missing = split.missing_sentence(transformer, found, path)
    except (BadFileError, ValueError):
        return entry
    except Exception as error:  # the promise is per row, as in `_inspect_one`
        return replace(
            entry,
            supported=False,
            missing=f"{path}: HalfSafe could not look for its text encoders and VAE "
            f"({type(error).__name__}).",
        )
    companions = {c: str(p) if p else None for c, p in found.found.items()}
    return replace(entry, companions=companions, missing=missing, supported=missing is None)


def _inspect_folder(path: Path) -> LibraryEntry:
    size = 0
    dtypes: list[str] = []
    try:
        index = _folder_config(path / "model_index.json")
        denoiser = "transformer" if "transformer" in index else "unet"
        unet = _folder_config(
            path / denoiser / "config.json",
            config_limits.check_unet_config if denoiser == "unet" else None,
        )
        scheduler_file = path / "scheduler" / "scheduler_config.json"
        scheduler = (
            _folder_config(scheduler_file, config_limits.check_scheduler_config)
            if scheduler_file.exists()
            else {}
        )
        for component in _components(path, index):
            component_limits.check_component_files(component)
    except component_limits.ComponentFileError as error:
        return LibraryEntry(
            str(path), None, None, 0, f"{error.path}: {error.reason}.", format="diffusers"
        )
    except BadFileError as error:
        return LibraryEntry(str(path), None, None, 0, str(error), format="diffusers")
    for count, file in enumerate(path.rglob("*")):
        if count >= MAX_FOLDER_ENTRIES:
            break  # a real pipeline folder holds some 20 files; the size stays a lower bound
        try:
            if file.is_file():
                size += file.stat().st_size
        except OSError:
            continue
        if file.suffix == SAFETENSORS_SUFFIX and file.parent.name in index:
            try:
                dtypes.extend(read_safetensors_header(file).dtypes().values())
            except BadFileError as error:
                return LibraryEntry(str(path), None, None, size, str(error), format="diffusers")
    detection = families.detect_from_configs(index, unet, scheduler)
    dtype = stored_dtype(dtypes)
    return LibraryEntry(
        str(path),
        detection.architecture,
        dtype if dtype != "none" else None,
        size,
        None,
        format="diffusers",
        supported=detection.supported,
        detected_because=detection.because,
    )


def _components(path: Path, index: dict) -> list[Path]:
    """The component folders model_index.json names that exist (the loader reads those)."""
    return [
        path / name
        for name in sorted(index)
        if not name.startswith("_") and isinstance(index[name], list) and (path / name).is_dir()
    ]


def _folder_config(file: Path, check: Callable[[dict], None] | None = None) -> dict:
    """One JSON config of a diffusers folder, read as the loader reads it (regular files only,
    bounded size and nesting) and checked against real models' sizes; BadFileError names it."""
    try:
        config = limits.read_json_object(file)
        if check is not None:
            check(config)
    except OSError as error:
        raise BadFileError(file, f"the file cannot be read ({error.strerror or error}).") from None
    except ValueError as error:
        raise BadFileError(file, f"{error}.") from None
    return config
