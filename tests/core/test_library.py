"""The model library: headers only, broken files listed not fatal, defaults, and the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from app.core import library, paths
from app.core.library import LibraryEntry, default_model_folders, scan_library
from tests.support.checkpoint_files import raw_safetensors, shapes_file
from tests.support.model_files import save_single_file
from tests.support.tiny_models import build_tiny_sd_pipeline, build_tiny_sdxl_pipeline


@pytest.fixture
def model_folder(tmp_path):
    folder = tmp_path / "models"
    (folder / "sub").mkdir(parents=True)
    save_single_file(build_tiny_sd_pipeline(), folder / "sd1-fp16.safetensors", dtype="fp16")
    save_single_file(build_tiny_sdxl_pipeline(), folder / "sub" / "xl.safetensors")
    raw_safetensors(folder / "broken.safetensors", b"{not json")
    shapes_file(folder / "a-lora.safetensors", {"lora_unet_x.lora_down.weight": (4, 8)})
    torch.save({"w": torch.zeros(2)}, str(folder / "old.ckpt"))
    build_tiny_sd_pipeline().save_pretrained(folder / "diffusers-model")
    (folder / "notes.txt").write_text("not a model")
    (folder / ".hidden").mkdir()
    shapes_file(folder / ".hidden" / "skipped.safetensors", {"x": (1,)})
    return folder


def by_name(entries: list[LibraryEntry]) -> dict[str, LibraryEntry]:
    return {Path(e.path).name: e for e in entries}


def test_scan_lists_checkpoints_with_architecture_dtype_and_size(model_folder):
    entries = by_name(scan_library([str(model_folder)], include_defaults=False))
    assert set(entries) == {
        "sd1-fp16.safetensors",
        "xl.safetensors",
        "broken.safetensors",
        "a-lora.safetensors",
        "old.ckpt",
        "diffusers-model",
    }
    sd1 = entries["sd1-fp16.safetensors"]
    assert (sd1.architecture, sd1.stored_dtype, sd1.supported, sd1.error) == (
        "sd1",
        "fp16",
        True,
        None,
    )
    assert sd1.size_bytes == (model_folder / "sd1-fp16.safetensors").stat().st_size
    assert entries["xl.safetensors"].architecture == "sdxl"
    assert entries["xl.safetensors"].stored_dtype == "fp32"
    folder = entries["diffusers-model"]
    assert (folder.format, folder.architecture, folder.stored_dtype) == ("diffusers", "sd1", "fp32")
    assert folder.size_bytes > 0
    lora = entries["a-lora.safetensors"]
    assert (lora.architecture, lora.supported, lora.error) == ("lora", False, None)
    pickle = entries["old.ckpt"]
    assert (pickle.format, pickle.architecture, pickle.error) == ("pickle", None, None)


def test_a_broken_file_is_listed_as_broken_and_the_scan_goes_on(model_folder):
    entries = by_name(scan_library([str(model_folder)], include_defaults=False))
    broken = entries["broken.safetensors"]
    assert broken.architecture is None and "not valid JSON" in broken.error
    assert str(model_folder / "broken.safetensors") in broken.error
    assert entries["sd1-fp16.safetensors"].error is None


def test_scan_reads_headers_only(model_folder, monkeypatch):
    from app.core import checkpoint
    from app.core.checkpoint import reader

    def no_tensor_reads(*args, **kwargs):
        raise AssertionError("the library must not read weights")

    monkeypatch.setattr(checkpoint.Checkpoint, "get", no_tensor_reads)
    monkeypatch.setattr(reader, "load_pickle_state_dict", no_tensor_reads)
    assert len(scan_library([str(model_folder)], include_defaults=False)) == 6


def test_index_is_cached_and_refreshed_when_a_file_changes(model_folder, monkeypatch):
    first = scan_library([str(model_folder)], include_defaults=False)
    index = json.loads((library.index._index_path()).read_text())
    assert index["version"] == library.index_version() and len(index["entries"]) == 6

    calls = []
    real_inspect = library.inspection._inspect
    monkeypatch.setattr(
        library.inspection,
        "_inspect",
        lambda path, kind: calls.append(path.name) or real_inspect(path, kind),
    )
    assert scan_library([str(model_folder)], include_defaults=False) == first
    assert calls == []

    shapes_file(model_folder / "broken.safetensors", {"model.diffusion_model.x": (1,)})
    again = by_name(scan_library([str(model_folder)], include_defaults=False))
    assert calls == ["broken.safetensors"]
    assert again["broken.safetensors"].error is None


def test_a_family_added_since_the_last_scan_makes_its_files_read_again(model_folder, monkeypatch):
    """A cache kept by a HalfSafe without a family says its files are unsupported (or another
    family's); the registry it was made with is in its version, so the rows are read anew."""
    from app.core.families import registry

    with monkeypatch.context() as before:
        without_sdxl = tuple(f for f in registry.FAMILIES if f.id != "sdxl")
        before.setattr(registry, "FAMILIES", without_sdxl)
        old = by_name(scan_library([str(model_folder)], include_defaults=False))
        assert old["xl.safetensors"].architecture != "sdxl"
    now = by_name(scan_library([str(model_folder)], include_defaults=False))
    assert (now["xl.safetensors"].architecture, now["xl.safetensors"].supported) == ("sdxl", True)


def test_a_family_recognising_files_anew_invalidates_the_cache(monkeypatch):
    from app.core.families import registry

    version = library.index_version()
    monkeypatch.setattr(type(registry.FAMILIES[0]), "detection_version", 2)
    assert library.index_version() != version
    assert library.index_version().startswith(f"{library.INDEX_FORMAT}-")


def test_damaged_index_is_ignored(model_folder):
    library.index._index_path().write_text("{oops")
    assert len(scan_library([str(model_folder)], include_defaults=False)) == 6


def test_missing_folders_are_skipped(tmp_path):
    assert scan_library([str(tmp_path / "nowhere")], include_defaults=False) == []


def test_default_folders_are_the_usual_installs_that_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("USERPROFILE", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    a1111 = tmp_path / "stable-diffusion-webui" / "models" / "Stable-diffusion"
    comfy = tmp_path / "ComfyUI" / "models" / "checkpoints"
    matrix = tmp_path / "StabilityMatrix" / "Data" / "Models" / "StableDiffusion"
    for folder in (a1111, comfy, matrix):
        folder.mkdir(parents=True)
    folders = default_model_folders()
    assert folders[:3] == [a1111, comfy, matrix]
    assert folders[-1] == Path(paths.data_dir()) / library.APP_MODELS
    save_single_file(build_tiny_sd_pipeline(), comfy / "in-comfy.safetensors", dtype="fp16")
    names = [Path(e.path).name for e in scan_library()]
    assert names == ["in-comfy.safetensors"]


def test_settings_folders_are_scanned_with_the_defaults(tmp_path, monkeypatch, model_folder):
    from app.core.settings import Settings, save_settings

    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    settings = Settings()
    settings["model_folders"] = [str(model_folder)]
    save_settings(settings)
    assert len(scan_library()) == 6
    own = paths.data_dir() / library.APP_MODELS
    shapes_file(own / "mine.safetensors", {"model.diffusion_model.x": (1,)})
    assert len(scan_library()) == 7
    assert len(scan_library([str(model_folder)])) == 7  # given folders plus the defaults


def test_scan_reports_progress_and_honours_cancel(model_folder):
    from app.core.errors import CancelledError
    from app.core.jobs import CancelToken

    seen = []
    scan_library(
        [str(model_folder)],
        include_defaults=False,
        on_progress=lambda stage, done, total: seen.append((done, total)),
    )
    assert seen[-1] == (6, 6)
    token = CancelToken()
    token.cancel()
    with pytest.raises(CancelledError):
        scan_library([str(model_folder)], include_defaults=False, cancel=token)
