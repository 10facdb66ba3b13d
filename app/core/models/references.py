"""How many input pictures a model can take, told from its headers and configs before it loads:
a job that gives more is refused in a sentence instead of after minutes of loading."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from app.core.errors import HalfSafeError
from app.core.families import capabilities
from app.core.families.base import Family
from app.core.families.registry import (
    detect_architecture,
    detect_from_configs,
    family_of_architecture,
)


def family_before_loading(source: str) -> Family | None:
    """The family `source` (a diffusers folder, a modular one, a single or transformer file)
    belongs to, from its headers and configs alone; None where that is not known so cheaply
    (the demo, a pickle, a file the load will refuse in its own words)."""
    from app.core.checkpoint.header import read_header
    from app.core.checkpoint.pickles import is_pickle_file
    from app.core.demo import DEMO_MODELS
    from app.core.models import split

    path = Path(source).expanduser()
    if source in DEMO_MODELS:
        return None
    try:
        if path.is_dir():
            architecture = _folder_architecture(path)
        elif not path.is_file() or is_pickle_file(path):
            return None
        else:
            header = read_header(path)
            shapes = header.shapes()
            transformer = split.read_model(shapes, path.name)
            architecture = (
                transformer.architecture
                if transformer is not None
                else detect_architecture(
                    shapes, metadata=header.metadata, name=path.name
                ).architecture
            )
    except (HalfSafeError, OSError, ValueError):
        return None  # the load says what is wrong with it
    return family_of_architecture(architecture) if architecture else None


def _folder_architecture(path: Path) -> str | None:
    from app.core.models.configs import read_json
    from app.core.models.folder import MODULAR_INDEX, modular_components

    index_file = path / "model_index.json"
    modular = not index_file.exists() and (path / MODULAR_INDEX).exists()
    if modular:
        index_file = path / MODULAR_INDEX
    if not index_file.exists():
        return None
    index = read_json(index_file)
    if modular:
        index = modular_components(path, index)
    denoiser = "transformer" if "transformer" in index else "unet"
    if not (path / denoiser / "config.json").exists():
        return None
    config = read_json(path / denoiser / "config.json", owner=path / denoiser)
    scheduler_file = path / "scheduler" / "scheduler_config.json"
    scheduler = (
        read_json(scheduler_file, owner=path / "scheduler") if scheduler_file.exists() else {}
    )
    return detect_from_configs(index, config, scheduler).architecture


def most_pictures(family: Family) -> int:
    """The most input pictures any model of `family` takes: its editing pipelines' most
    references, else one (image-to-image, inpainting, a control picture)."""
    editing = family.edit_pipelines if isinstance(family, capabilities.Editing) else {}
    return max([1, *editing.values()])


def check_picture_count(source: str, images: Sequence[str]) -> None:
    """Refuse more input pictures than any model of `source`'s family takes, before the model
    loads (minutes for a large one). Passing promises nothing: the loaded model may take fewer
    (a Qwen-Image that is no Edit Plus), which its job then says."""
    if len(images) <= 1:
        return
    family = family_before_loading(source)
    if family is None:
        return
    most = most_pictures(family)
    if len(images) <= most:
        return
    name = Path(source).name
    takes = f"takes at most {most}" if most > 1 else "takes one picture"
    raise HalfSafeError(
        f"{len(images)} pictures were given; {name} is a {family.title} model, which {takes}."
    )
