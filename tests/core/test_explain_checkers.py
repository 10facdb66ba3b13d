"""Another tool's safety checker (`app.core.explain.checkers`): no tool records that its checker
blanked an image, but a ComfyUI graph records that a Safety Checker node ran; then a NaN-black
image's message says the black may be the checker and the health check decides. A check that
runs clean points to the checker (status `safety_checker`, exit 0) with ComfyUI's switch; a true
fp16 overflow in the same tiny model is still the model's overflow, with its fix; and dark,
white or noisy pictures from the same workflow are not called the checker's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.core import explain
from app.core.explain import checkers
from tests.support.explain_pictures import NATURAL, decoded_noise, one_over_f, save, written
from tests.support.image_files import comfy_prompt, comfy_workflow, png_text
from tests.support.model_files import save_single_file
from tests.support.planted_sd import plant
from tests.support.tiny_models import build_tiny_sd_pipeline


def checked_prompt(ckpt: str, sensitivity: float = 0.5) -> str:
    nodes = json.loads(comfy_prompt(ckpt))
    nodes["30"] = {
        "class_type": "Safety Checker",
        "inputs": {"images": ["8", 0], "sensitivity": sensitivity},
    }
    return json.dumps(nodes)


def checked_workflow(ckpt: str, mode: int = 0) -> str:
    workflow = json.loads(comfy_workflow(ckpt))
    workflow["nodes"].append(
        {"id": 30, "type": "Safety Checker", "mode": mode, "widgets_values": [0.7]}
    )
    return json.dumps(workflow)


# Reading the record -------------------------------------------------------------------------


def test_the_checker_node_is_read_from_the_prompt_with_its_sensitivity(tmp_path):
    image = png_text(tmp_path / "c.png", {"prompt": checked_prompt("m.safetensors", 0.3)})
    record, status, _ = explain.read_image(image)
    assert record.safety_checker == checkers.RecordedChecker("Safety Checker", 0.3)
    assert record.to_json()["safety_checker"] == {
        "node": "Safety Checker",
        "sensitivity": 0.3,
        "fired": None,  # what no record says
    }
    assert status == "nan"  # the record does not say it fired: the pixels decide, then the check


@pytest.mark.parametrize(("mode", "read"), [(0, True), (2, False), (4, False)])
def test_a_workflow_checker_counts_unless_muted_or_bypassed(tmp_path, mode, read):
    image = png_text(tmp_path / "c.png", {"workflow": checked_workflow("m.safetensors", mode)})
    record, _, _ = explain.read_image(image)
    assert (record.safety_checker is not None) is read
    if read:
        assert record.safety_checker.sensitivity == 0.7


def test_a_hostile_sensitivity_is_not_read():
    nodes = [("Safety Checker", {"sensitivity": "9" * 500}), ("KSampler", {})]
    assert checkers.from_comfy_prompt(nodes) == checkers.RecordedChecker("Safety Checker")
    assert (
        checkers.from_comfy_prompt([("Safety Checker", {"sensitivity": 1e300})]).sensitivity is None
    )


def test_a_graph_without_a_checker_records_none(tmp_path):
    image = png_text(tmp_path / "c.png", {"prompt": comfy_prompt("m.safetensors")})
    assert explain.read_image(image)[0].safety_checker is None


# explain with the model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def healthy_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "calm.safetensors"
    return save_single_file(build_tiny_sd_pipeline(), path)


@pytest.fixture(scope="module")
def overflowing_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "dreamy.safetensors"
    return save_single_file(plant(build_tiny_sd_pipeline(), "vae"), path)


def black_comfy_image(tmp_path: Path, home: Path, model: Path) -> Path:
    folder = home / "ComfyUI" / "models" / "checkpoints"
    folder.mkdir(parents=True)
    shutil.copy(model, folder / model.name)
    return png_text(tmp_path / "ComfyUI_00001_.png", {"prompt": checked_prompt(model.name)})


@pytest.mark.slow
def test_a_clean_check_points_to_the_recorded_checker_not_precision(
    tmp_path, home, capsys, healthy_file
):
    image = black_comfy_image(tmp_path, home, healthy_file)
    assert main(["explain", str(image), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "safety_checker"
    assert document["check"]["verdict"] == "healthy"
    assert document["fix"] is None and document["memory_manager"] is None
    message = document["message"]
    assert "runs a safety checker (the Safety Checker node, sensitivity 0.5)" in message
    assert "the black is the safety checker's, not precision" in message
    assert "bypass the Safety Checker node" in message


@pytest.mark.slow
def test_an_overflow_in_the_same_model_is_still_the_models_with_its_fix(
    tmp_path, home, capsys, overflowing_file
):
    image = black_comfy_image(tmp_path, home, overflowing_file)
    assert main(["explain", str(image), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == "nan"
    assert document["check"]["verdict"] == "fixable"
    assert document["check"]["components"]["vae"]["status"] == "overflow"
    assert set(document["fix"]["for_tool"]["flags"]) <= {"--bf16-vae", "--fp32-vae"}
    message = document["message"]
    assert "the health check decides" in message
    assert "The health check reproduced it" in message
    assert "the black is the safety checker's" not in message


@pytest.mark.parametrize(
    ("picture", "status"),
    [
        (NATURAL["a night scene"], "ok"),
        (written(one_over_f(3), 0.015, 0.006), "black"),  # a dark picture, not zeros
        (np.full((512, 512, 3), 255, np.uint8), "saturated"),
        (decoded_noise(), "noise"),
    ],
    ids=["night", "dark", "white", "noise"],
)
def test_pictures_from_a_checked_workflow_are_not_called_the_checkers(
    tmp_path, home, capsys, picture, status
):
    image = save(tmp_path, "p.png", picture, {"prompt": checked_prompt("absent.safetensors")})
    main(["explain", str(image), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert document["image"]["status"] == status
    assert "safety checker" not in document["message"]


def test_the_checker_is_documented():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text(encoding="utf-8")
    for word in ("record.safety_checker", "Safety Checker", "`fired`"):
        assert word in docs
