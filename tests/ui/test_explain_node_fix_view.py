"""The explanation of a ComfyUI image whose fix is in the diffusion model: the Fix card leads with
HalfSafe Fix between the loader and the sampler, **Save workflow…** writes the image's workflow
with the nodes, and **Install HalfSafe's nodes…** copies the node package into the ComfyUI
HalfSafe finds (a folder that is not one is one sentence)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from app.core.comfyui.workflow import CheckInputs, with_fix_node
from app.core.explain import Explanation
from app.core.explain.matching import ModelMatch
from app.core.explain.node_fix import NodeFix
from app.core.explain.pixels import PixelFigures
from app.core.explain.records import Record
from app.core.words.tools import ToolFix
from tests.support.comfyui_graphs import PACKAGE, comfyui_default_workflow, ui_link_problems


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    for var in ("HOME", "USERPROFILE"):
        monkeypatch.setenv(var, str(home))
    return home


def comfy_explanation(path: Path, node_fix: NodeFix | None) -> Explanation:
    return Explanation(
        path=str(path),
        made_by="comfyui",
        status="nan",
        record=Record(made_by="comfyui", model="sd15.safetensors"),
        pixels=PixelFigures(),
        model=ModelMatch(found=True, path="/m/sd15.safetensors", looked_in=["/m"]),
        halfsafe_flags=["--unet-precision bf16"],
        tool_fix=ToolFix("comfyui", ["--bf16-unet"], {}, "Add the flags to ComfyUI.", [], True),
        node_fix=node_fix,
        message="This image is NaN-black.",
    )


def show(window, engines, tmp_path, node_fix: NodeFix | None):
    image = tmp_path / "ComfyUI_00001_.png"
    dialog = window.explain_image(str(image))
    engines.current.finish(engines.current.last_job("explain"), comfy_explanation(image, node_fix))
    return dialog


def node_fix() -> NodeFix:
    placed = with_fix_node(None, comfyui_default_workflow("sd15.safetensors"), CheckInputs())
    return NodeFix(placed, ["--bf16-unet"], [], "ComfyUI_00001_-halfsafe-fix.json")


def test_the_fix_card_leads_with_the_node_and_saves_the_workflow(window, engines, tmp_path):
    dialog = show(window, engines, tmp_path, node_fix())
    body = html.unescape(dialog.fix_body.text())
    assert body.index("Add HalfSafe Fix between the loader and the sampler") < body.index(
        "--bf16-unet"
    )
    assert "Without HalfSafe's nodes" in body
    assert dialog.save_workflow_button.isVisible() and dialog.install_nodes_button.isVisible()

    target = tmp_path / "saved.json"
    dialog.save_workflow_to(str(target))
    graph = json.loads(target.read_text())
    assert ui_link_problems(graph) == []
    assert any(n["type"] == "HalfSafeFix" for n in graph["nodes"])
    assert str(target) in dialog.installed_text.text()
    # A folder that cannot be written is one sentence, and nothing is half written.
    dialog.save_workflow_to(str(tmp_path / "missing" / "saved.json"))
    assert len(window.dialogs.shown) == 1
    assert "was not saved" in window.dialogs.shown[0].message
    assert not (tmp_path / "missing").exists()


def test_the_install_button_copies_the_nodes_into_the_comfyui_found(
    window, engines, tmp_path, home
):
    root = home / "ComfyUI"
    (root / "comfy").mkdir(parents=True)
    (root / "main.py").write_text("# ComfyUI\n")
    dialog = show(window, engines, tmp_path, node_fix())

    dialog.install_nodes_button.click()

    target = root / "custom_nodes" / "comfyui-halfsafe"
    assert (target / "nodes.py").read_bytes() == (PACKAGE / "nodes.py").read_bytes()
    said = dialog.installed_text.text()
    assert dialog.installed_text.isVisible()
    assert str(target) in said and "pip install" in said and "restart ComfyUI" in said
    assert window.dialogs.shown == []
    # A folder named that is not a ComfyUI: one sentence, nothing copied there.
    (tmp_path / "photos").mkdir()
    dialog.install_nodes_into(str(tmp_path / "photos"))
    assert len(window.dialogs.shown) == 1
    said = window.dialogs.shown[0].message
    assert "is not a ComfyUI folder" in said and "\n" not in said
    assert not (tmp_path / "photos" / "custom_nodes").exists()


def test_a_fix_without_the_node_shows_neither_button(window, engines, tmp_path):
    dialog = show(window, engines, tmp_path, None)
    assert dialog.fix_card.isVisible() and "--bf16-unet" in dialog.fix_body.text()
    assert not dialog.save_workflow_button.isVisible()
    assert not dialog.install_nodes_button.isVisible()
