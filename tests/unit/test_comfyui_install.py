"""HalfSafe's node package installed into a ComfyUI (`comfyui.install`, `halfsafe comfyui install
[PATH]`): copied whole into its custom_nodes folder, with the pip command for that ComfyUI's own
Python; a folder that is not a ComfyUI, or none found, is one sentence and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.core.comfyui import install
from app.core.errors import HalfSafeError
from tests.support.comfyui_graphs import PACKAGE


def comfyui(folder: Path, venv: str | None = None) -> Path:
    """A ComfyUI source install's layout: main.py beside the comfy package."""
    (folder / "comfy").mkdir(parents=True)
    (folder / "main.py").write_text("# ComfyUI\n")
    (folder / "models" / "checkpoints").mkdir(parents=True)
    if venv:
        python = folder / venv / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text("")
    return folder


def package_files(folder: Path) -> set[str]:
    return {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_the_package_is_copied_into_custom_nodes_with_the_pip_command(tmp_path, capsys):
    root = comfyui(tmp_path / "ComfyUI", venv="venv")

    assert main(["comfyui", "install", str(root), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    target = root / "custom_nodes" / "comfyui-halfsafe"
    assert document["installed"] == str(target)
    assert package_files(target) == package_files(PACKAGE)
    assert (target / "nodes.py").read_bytes() == (PACKAGE / "nodes.py").read_bytes()
    assert not list(target.rglob("__pycache__"))
    python = str(root / "venv" / "bin" / "python")
    assert document["command"][:4] == [python, "-m", "pip", "install"]
    assert document["python_known"] is True
    assert python in document["message"] and "restart ComfyUI" in document["message"]
    # Nothing else is left in custom_nodes (no staging folder).
    assert [p.name for p in (root / "custom_nodes").iterdir()] == ["comfyui-halfsafe"]


def test_the_portable_build_is_named_by_its_outer_folder_and_uses_its_embedded_python(tmp_path):
    outer = tmp_path / "ComfyUI_windows_portable"
    comfyui(outer / "ComfyUI")
    embedded = outer / "python_embeded" / "python.exe"
    embedded.parent.mkdir()
    embedded.write_text("")

    installed = install.install_nodes(outer)
    assert installed.target == outer / "ComfyUI" / "custom_nodes" / "comfyui-halfsafe"
    assert installed.command[:5] == [str(embedded), "-s", "-m", "pip", "install"]


def test_comfyui_desktops_folder_is_one_and_an_earlier_copy_is_replaced(tmp_path):
    desktop = tmp_path / "Documents" / "ComfyUI"
    (desktop / "models").mkdir(parents=True)
    target = desktop / "custom_nodes" / "comfyui-halfsafe"
    target.mkdir(parents=True)
    (target / "pyproject.toml").write_text('[project]\nname = "comfyui-halfsafe"\n')
    (target / "stale.py").write_text("")

    installed = install.install_nodes(desktop)
    assert installed.target == target and not (target / "stale.py").exists()
    assert package_files(target) == package_files(PACKAGE)
    assert installed.python_known is False  # no .venv here: the words say which Python
    assert "the Python that runs that ComfyUI" in installed.words


def test_another_folder_of_the_packages_name_is_left_alone(tmp_path):
    root = comfyui(tmp_path / "ComfyUI")
    theirs = root / "custom_nodes" / "comfyui-halfsafe"
    theirs.mkdir(parents=True)
    (theirs / "mine.txt").write_text("keep")
    with pytest.raises(HalfSafeError, match="is not HalfSafe's node package"):
        install.install_nodes(root)
    assert (theirs / "mine.txt").read_text() == "keep"


def test_a_folder_that_is_not_a_comfyui_is_one_sentence_and_exit_2(tmp_path, capsys):
    (tmp_path / "photos").mkdir()
    assert main(["comfyui", "install", str(tmp_path / "photos")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and "\n" not in err
    assert err.startswith(f"halfsafe: {tmp_path / 'photos'} is not a ComfyUI folder")
    assert not (tmp_path / "photos" / "custom_nodes").exists()
    assert main(["comfyui", "install", str(tmp_path / "missing")]) == 2
    assert "is not a ComfyUI folder" in capsys.readouterr().err


def test_without_a_path_the_comfyui_found_is_used_or_the_how_is_said(home, capsys):
    assert main(["comfyui", "install"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("halfsafe: No ComfyUI was found")
    assert "custom_nodes" in err

    root = comfyui(home / "ComfyUI", venv=".venv")
    assert main(["comfyui", "install"]) == 0
    out = capsys.readouterr().out
    assert (root / "custom_nodes" / "comfyui-halfsafe" / "nodes.py").is_file()
    assert str(root / ".venv" / "bin" / "python") in out

    comfyui(home / "Documents" / "ComfyUI")  # a second one: which is the user's to say
    assert main(["comfyui", "install"]) == 2
    assert "more than one ComfyUI" in capsys.readouterr().err
