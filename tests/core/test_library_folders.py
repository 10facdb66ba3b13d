"""The library finds the tools' folders: ComfyUI's extra_model_paths.yaml and base directories,
Forge's one-click package, InvokeAI's models tree, installs on other drives, symlinked
subfolders (loops included), `.sft` files, VAE folders and A1111's `name.vae.*` pairs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from app.core import library
from app.core.library import LibraryEntry, ModelFolder, extra_model_paths, scan_library
from tests.support.checkpoint_files import raw_safetensors, shapes_file

# Enough of a header for each kind: the library reads headers only.
UNET = {"model.diffusion_model.input_blocks.0.0.weight": (4, 4, 3, 3)}
VAE = {"encoder.down.0.block.0.conv1.weight": (4, 4, 3, 3), "decoder.up.0.block.0.x": (4,)}


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty home folder, no InvokeAI root, no drives: each test builds its own layout."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    monkeypatch.setenv("USERPROFILE", str(folder))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("INVOKEAI_ROOT", raising=False)
    monkeypatch.setattr(library.folders, "_fixed_drives", lambda: [])
    return folder


def model(path: Path, shapes=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return shapes_file(path, shapes or UNET)


def rows(entries: list[LibraryEntry]) -> dict[str, LibraryEntry]:
    return {Path(e.path).name: e for e in entries}


def scanned(folders: list[str] | None = None) -> dict[str, LibraryEntry]:
    return rows(scan_library(folders or [], use_cache=False))


# ComfyUI -----------------------------------------------------------------------------------

EXTRA_PATHS = """\
# A1111 section as in ComfyUI's extra_model_paths.yaml.example
a111:
    base_path: {a1111}

    checkpoints: models/Stable-diffusion
    vae: models/VAE
    configs: models/Stable-diffusion
    loras: |
         models/Lora
         models/LyCORIS

other_ui:
    base_path: ../shared
    is_default: true
    checkpoints: |
        checkpoints-one
        checkpoints-two
    diffusion_models: |
        models/unet
        models/diffusion_models
    text_encoders: models/clip
"""


def test_extra_model_paths_yaml_sections_and_multi_line_values(home):
    comfy = home / "ComfyUI"
    model(comfy / "models" / "checkpoints" / "own.safetensors")
    a1111 = home / "elsewhere" / "webui"
    model(a1111 / "models" / "Stable-diffusion" / "from-a1111.safetensors")
    model(a1111 / "models" / "VAE" / "their.vae.safetensors", VAE)
    model(
        a1111 / "models" / "LyCORIS" / "style.safetensors", {"lora_unet_x.lora_down.weight": (4,)}
    )
    shared = home / "shared"  # base_path relative to the yaml's folder
    model(shared / "checkpoints-one" / "one.safetensors")
    model(shared / "checkpoints-two" / "two.sft")
    model(shared / "models" / "diffusion_models" / "flux-transformer.safetensors", {"x": (1,)})
    model(shared / "models" / "clip" / "t5.safetensors", {"encoder.block.0.x": (1,)})
    (comfy / "extra_model_paths.yaml").write_text(EXTRA_PATHS.format(a1111=a1111))

    folders, problems = extra_model_paths(comfy / "extra_model_paths.yaml")
    assert problems == []
    assert ModelFolder(a1111 / "models" / "VAE", "vae") in folders
    assert ModelFolder(shared / "checkpoints-two", "model") in folders

    entries = scanned()
    assert {
        "own.safetensors",
        "from-a1111.safetensors",
        "their.vae.safetensors",
        "style.safetensors",
        "one.safetensors",
        "two.sft",
        "flux-transformer.safetensors",
        "t5.safetensors",
    } <= set(entries)
    assert entries["their.vae.safetensors"].role == "vae"
    assert entries["two.sft"].error is None and entries["two.sft"].role == "model"
    assert entries["style.safetensors"].architecture == "lora"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a: [unclosed\n  b: {", "not valid YAML"),
        ("a: !!python/object/apply:os.system ['touch {marker}']\n", "not valid YAML"),
        ("[" * 30_000 + "]" * 30_000, "nested too deeply"),
        ("just a string", "no sections"),
        ("x: " + "y" * (library.MAX_YAML_BYTES + 1), "more than"),
    ],
    ids=["syntax", "python-tag", "deep", "not-sections", "huge"],
)
def test_a_bad_extra_model_paths_is_one_row_and_the_scan_goes_on(home, text, words):
    comfy = home / "ComfyUI"
    model(comfy / "models" / "checkpoints" / "fine.safetensors")
    marker = home / "ran"
    yaml_file = comfy / "extra_model_paths.yaml"
    yaml_file.write_text(text.replace("{marker}", str(marker)))
    started = time.perf_counter()
    entries = scanned()
    assert time.perf_counter() - started < 5
    assert not marker.exists()
    row = entries["extra_model_paths.yaml"]
    assert row.error.startswith(f"{yaml_file}: ") and words in row.error
    assert row.error.count(".") >= 1 and "\n" not in row.error
    assert entries["fine.safetensors"].error is None


def test_billion_laughs_yaml_costs_nothing(home):
    comfy = home / "ComfyUI"
    (comfy / "models" / "checkpoints").mkdir(parents=True)
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in "bcdefghij":
        previous = chr(ord(level) - 1)
        lines.append(f"{level}: &{level} [" + ",".join(f"*{previous}" for _ in range(9)) + "]")
    (comfy / "extra_model_paths.yaml").write_text("\n".join(lines) + "\n")
    started = time.perf_counter()
    folders, problems = extra_model_paths(comfy / "extra_model_paths.yaml")
    assert folders == [] and len(problems) == 1 and "aliases" in (problems[0].error or "")
    assert time.perf_counter() - started < 2


def test_a_comfyui_base_directory_in_settings_is_read_as_its_layout(home, tmp_path):
    base = tmp_path / "comfy-base"  # what `main.py --base-directory` points at
    model(base / "models" / "checkpoints" / "ckpt.safetensors")
    model(base / "models" / "unet" / "unet-file.safetensors", {"x": (1,)})
    model(base / "models" / "diffusion_models" / "dit.safetensors", {"y": (1,)})
    model(base / "models" / "text_encoders" / "clip_l.safetensors", {"z": (1,)})
    model(base / "models" / "vae" / "ae.safetensors", VAE)
    from tests.support.tiny_models import build_tiny_sd_pipeline

    build_tiny_sd_pipeline().save_pretrained(base / "models" / "diffusers" / "a-diffusers-model")
    model(base / "input" / "not-a-model-folder.safetensors")  # outside models/: not listed
    entries = scanned([str(base)])
    assert set(entries) == {
        "ckpt.safetensors",
        "unet-file.safetensors",
        "dit.safetensors",
        "clip_l.safetensors",
        "ae.safetensors",
        "a-diffusers-model",
    }
    assert entries["a-diffusers-model"].format == "diffusers"
    assert entries["ae.safetensors"].role == "vae"
    assert entries["ckpt.safetensors"].role == "model"
    assert library.library_folders([str(base)])[0] == base / "models" / "checkpoints"


# A1111 / Forge / InvokeAI / other drives ---------------------------------------------------


def test_forge_one_click_package_is_found(home):
    webui = home / "webui_forge_cu121_torch231" / "webui"
    model(webui / "models" / "Stable-diffusion" / "forge-model.safetensors")
    model(webui / "models" / "VAE" / "sdxl_vae.safetensors", VAE)
    entries = scanned()
    assert entries["forge-model.safetensors"].role == "model"
    assert entries["sdxl_vae.safetensors"].role == "vae"
    assert webui / "models" / "Stable-diffusion" in library.default_model_folders()


def test_invokeai_models_tree_is_found(home, tmp_path, monkeypatch):
    root = home / "invokeai"
    (root).mkdir()
    (root / "invokeai.yaml").write_text("schema_version: 4.0.2\n")
    model(root / "models" / "sd-1" / "main" / "dreamshaper.safetensors")
    model(root / "models" / "sdxl" / "vae" / "sdxl-vae-fp16-fix.safetensors", VAE)
    model(root / "models" / "sd-1" / "lora" / "a-lora.safetensors", {"lora_unet_x": (1,)})
    elsewhere = tmp_path / "invoke-elsewhere"
    (elsewhere).mkdir()
    (elsewhere / "invokeai.yaml").write_text("")
    model(elsewhere / "models" / "flux" / "main" / "flux1.safetensors", {"x": (1,)})
    monkeypatch.setenv("INVOKEAI_ROOT", str(elsewhere))
    entries = scanned()
    assert entries["dreamshaper.safetensors"].role == "model"
    assert entries["sdxl-vae-fp16-fix.safetensors"].role == "vae"
    assert "a-lora.safetensors" not in entries  # InvokeAI's loras are not models
    assert "flux1.safetensors" in entries
    # A root the user adds in the settings is read the same way.
    monkeypatch.delenv("INVOKEAI_ROOT")
    assert "flux1.safetensors" in scanned([str(elsewhere)])
    # invokeai.yaml may move the models folder; a broken one is a row.
    (elsewhere / "invokeai.yaml").write_text(
        "models_dir: /elsewhere/../moved\n".replace("/elsewhere/..", str(tmp_path))
    )
    model(tmp_path / "moved" / "sdxl" / "main" / "moved.safetensors")
    assert "moved.safetensors" in scanned([str(elsewhere)])
    (elsewhere / "invokeai.yaml").write_text("models_dir: [unclosed\n")
    row = scanned([str(elsewhere)])["invokeai.yaml"]
    assert "not valid YAML" in row.error and "flux1.safetensors" in scanned([str(elsewhere)])


def test_installs_on_other_drives_are_found_by_candidates_not_walks(home, tmp_path, monkeypatch):
    d_drive, e_drive = tmp_path / "D", tmp_path / "E"
    model(d_drive / "stable-diffusion-webui" / "models" / "Stable-diffusion" / "on-d.safetensors")
    model(e_drive / "ComfyUI_windows_portable" / "ComfyUI" / "models" / "checkpoints" / "e.sft")
    model(e_drive / "some" / "deep" / "folder" / "models" / "not-found.safetensors")
    monkeypatch.setattr(library.folders, "_fixed_drives", lambda: [d_drive, e_drive])
    listed: list[Path] = []
    real_scandir = os.scandir

    def watched_scandir(path):
        listed.append(Path(path))
        return real_scandir(path)

    with monkeypatch.context() as watching:  # only this call: the teardown lists folders too
        watching.setattr(os, "scandir", watched_scandir)
        folders = library.default_model_folders()
    assert d_drive / "stable-diffusion-webui" / "models" / "Stable-diffusion" in folders
    assert e_drive / "ComfyUI_windows_portable" / "ComfyUI" / "models" / "checkpoints" in folders
    # Each drive's root is listed once (for Forge's package names), nothing below it is.
    assert [p for p in listed if p.is_relative_to(e_drive)] == [e_drive]
    names = set(scanned())
    assert {"on-d.safetensors", "e.sft"} <= names and "not-found.safetensors" not in names


# Symlinks and bounds -----------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="POSIX symlinks")
def test_symlinked_subfolders_are_followed_and_a_loop_ends(tmp_path):
    models = tmp_path / "models"
    outside = tmp_path / "big-disk" / "checkpoints"
    model(outside / "linked.safetensors")
    model(models / "here.safetensors")
    (models / "link-to-disk").symlink_to(outside, target_is_directory=True)
    (outside / "back-to-models").symlink_to(models, target_is_directory=True)  # a loop
    (models / "self").symlink_to(models, target_is_directory=True)  # another
    started = time.perf_counter()
    entries = scan_library([str(models)], include_defaults=False, use_cache=False)
    assert time.perf_counter() - started < 5
    names = sorted(Path(e.path).name for e in entries)
    assert names == ["here.safetensors", "linked.safetensors"]  # each file once


def test_depth_is_bounded(tmp_path):
    folder = tmp_path / "models"
    deep = folder.joinpath(*[f"d{i}" for i in range(library.MAX_DEPTH + 1)])
    model(deep.parent / "deepest-listed.safetensors")
    model(deep / "too-deep.safetensors")
    names = set(rows(scan_library([str(folder)], include_defaults=False, use_cache=False)))
    assert names == {"deepest-listed.safetensors"}


def test_a_folder_with_too_many_entries_gets_a_row_and_the_rest_goes_on(tmp_path, monkeypatch):
    for module in (library.scan, library.inspection):  # the walk, and a folder's size
        monkeypatch.setattr(module, "MAX_FOLDER_ENTRIES", 20)
    huge = tmp_path / "whole-disk"
    for number in range(30):
        (huge / f"folder{number:02}").mkdir(parents=True)
    fine = tmp_path / "models"
    model(fine / "ok.safetensors")
    entries = rows(scan_library([str(huge), str(fine)], include_defaults=False, use_cache=False))
    assert "more than 20 files and folders" in entries["whole-disk"].error
    assert entries["ok.safetensors"].error is None


# VAEs ---------------------------------------------------------------------------------------


def test_a1111_vae_folder_and_per_model_pairs(home):
    webui = home / "stable-diffusion-webui"
    checkpoints = webui / "models" / "Stable-diffusion"
    model(checkpoints / "anything.safetensors")
    model(checkpoints / "anything.vae.safetensors", VAE)
    model(checkpoints / "other.safetensors")
    raw_safetensors(checkpoints / "other.vae.pt", b"not opened")  # a pickle: paired, unopened
    model(checkpoints / "alone.safetensors")
    model(webui / "models" / "VAE" / "vae-ft-mse-840000-ema-pruned.safetensors", VAE)
    entries = scanned()
    assert entries["anything.safetensors"].vae == str(checkpoints / "anything.vae.safetensors")
    assert entries["other.safetensors"].vae == str(checkpoints / "other.vae.pt")
    assert entries["alone.safetensors"].vae is None
    assert entries["anything.vae.safetensors"].role == "vae"
    assert entries["other.vae.pt"].role == "vae" and entries["other.vae.pt"].format == "pickle"
    shared = entries["vae-ft-mse-840000-ema-pruned.safetensors"]
    assert (shared.role, shared.supported) == ("vae", False)
    assert webui / "models" / "VAE" not in library.default_model_folders()
    # The cached rows come back with the same roles and pairs.
    assert rows(scan_library([])) == rows(scan_library([]))
    assert rows(scan_library([]))["anything.safetensors"].vae == entries["anything.safetensors"].vae


def test_an_sft_model_loads_with_its_paired_vae(tmp_path):
    from app.core import architecture as arch
    from app.core.checkpoint import write_safetensors
    from app.core.models import load_model
    from tests.support.checkpoint_files import state_dicts_equal
    from tests.support.model_files import _ldm_vae, save_single_file
    from tests.support.tiny_models import build_tiny_sd_pipeline, tiny_vae

    folder = tmp_path / "models"
    folder.mkdir()
    save_single_file(build_tiny_sd_pipeline(), folder / "tiny.sft", dtype="fp16")
    other = tiny_vae(seed=42)
    ldm = _ldm_vae(other.state_dict(), len(other.config.block_out_channels))
    write_safetensors(
        folder / "tiny.vae.safetensors", {k.removeprefix(arch.VAE): v for k, v in ldm.items()}
    )
    entries = rows(scan_library([str(folder)], include_defaults=False, use_cache=False))
    row = entries["tiny.sft"]
    assert (row.architecture, row.supported, row.role) == ("sd1", True, "model")
    assert row.vae == str(folder / "tiny.vae.safetensors")
    loaded = load_model(row.path, vae=row.vae)
    assert state_dicts_equal(other, loaded.pipeline.vae) == []
    assert loaded.vae == row.vae
