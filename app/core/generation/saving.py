"""Where the images go: the output folder a request names (else the settings', else the
default pictures folder), and HalfSafe's own `unsaved` folder when saving there fails."""

from __future__ import annotations

from pathlib import Path

from app.core import paths
from app.core.generation.records import GenerationRequest
from app.core.images.finished import ImageSaveError


def output_folder(request: GenerationRequest) -> Path:
    from app.core import paths
    from app.core.settings import load_settings

    if request.output_dir:
        return Path(request.output_dir).expanduser()
    chosen = load_settings().settings["output_folder"]
    return Path(chosen).expanduser() if chosen else paths.default_output_dir()


def rescue_unsaved(error: ImageSaveError) -> ImageSaveError:
    """After a failed save, write the images that are still only in memory to HalfSafe's own
    `unsaved` folder, and return the error with what became of them: saved there instead, or
    (that folder failing too) plainly not saved. The returned error keeps `.result`, so a
    caller that lives on (the GUI) can still hold the images in memory."""
    if error.result is None:
        return error
    rescue = paths.data_dir() / "unsaved"
    try:
        error.result.save(rescue)
    except ImageSaveError as second:
        unsaved = sum(1 for entry in error.result.images if not entry.path)
        noun = "image was" if unsaved == 1 else "images were"
        return ImageSaveError(
            f"{error} {second} So {unsaved} generated {noun} not saved.", error.result
        )
    return ImageSaveError(f"{error} The images were saved to {rescue} instead.", error.result)
