"""HalfSafe's ComfyUI nodes on the DiT families ComfyUI v0.29 loads only at (some of) their
released widths: Krea 2 and Anima from small files (ComfyUI reads their widths, or fixes them
only at the released size), Qwen-Image, Z-Image and Chroma at their released widths with one or
two blocks (tests/support/comfyui_families.py). Each file is written by HalfSafe's layouts in the
released key layout, loaded by ComfyUI's own `load_diffusion_model` (every tensor used, none
missing) and checked in fp16 on a CPU with no CLIP connected. One planted file (one attention's
query projection past fp16's range, finite in fp32) and one healthy file per ComfyUI process.
Qwen-Image runs in fp16 only with ComfyUI's `--fp16-unet` (its supported dtypes leave fp16 out),
as a user on a card without bf16 runs it.

For Qwen-Image, Z-Image and Chroma, `halfsafe check` on the desktop checks the same planted
file with tiny companions beside it, and names the same layer and fix (the other families'
agreement is in test_verdicts_agree.py).

Needs HALFSAFE_COMFYUI and HALFSAFE_COMFYUI_PYTHON, as test_nodes.py; skipped without them.
Each family takes from seconds (Krea 2) to a few minutes (Z-Image, Chroma) on two CPU cores and
under 5 GB of memory (Z-Image's two 3840-wide blocks and four refiners, 2.2 GB in fp16)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.comfyui_env import COMFYUI, NEEDS_COMFYUI, PACKAGE, PYTHON
from tests.support.comfyui_families import DESKTOP_COMPANIONS, FAMILY_FILES
from tests.support.desktop_check import assert_same_layer_and_fix, desktop_check

ROOT = Path(__file__).resolve().parents[2]
ZEROS = "No CLIP connected: the text was zeros of the model's own text width."
FP16_UNET = {"qwenimage"}  # families ComfyUI computes in fp16 only when told to
# ComfyUI's config class for each file (Z-Image is a Lumina 2 model with Z-Image's config).
CONFIGS = {
    "krea2": "Krea2",
    "anima": "Anima",
    "qwenimage": "QwenImage",
    "zimage": "ZImage",
    "chroma": "Chroma",
}
# Where the model's own code turns fp16's inf and NaN into +-65504 and zeros (Flux's layers in
# Chroma, Lumina's in Z-Image): the overflow gives a wrong picture, not a black one.
HIDDEN = {"chroma", "zimage"}

pytestmark = NEEDS_COMFYUI


def write_files(family: str, folder: Path) -> tuple[Path, Path, Path | None]:
    """The planted and the healthy file, written by a process of their own (a released width's
    weights are given back to the system before ComfyUI loads them); for the families the
    desktop checks too (`DESKTOP_COMPANIONS`), the planted one in a models folder with the
    desktop's companions, and its transformer's config."""
    code = (
        "import sys; from tests.support.comfyui_families import DESKTOP_COMPANIONS, "
        "write_desktop_folder, write_family_files\n"
        "f, d = sys.argv[1], sys.argv[2]\n"
        "print(*write_desktop_folder(f, d) if f in DESKTOP_COMPANIONS "
        "else (*write_family_files(f, d)[:2], '-'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, family, str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    planted, healthy, config = done.stdout.split()
    return Path(planted), Path(healthy), None if config == "-" else Path(config)


@pytest.fixture(scope="module", params=list(FAMILY_FILES))
def driven(request, tmp_path_factory) -> tuple[str, dict]:
    family = request.param
    work = tmp_path_factory.mktemp(f"comfyui_{family}")
    planted, healthy, config = write_files(family, work)
    command = [PYTHON, str(Path(__file__).with_name("drive_families.py")), COMFYUI, str(PACKAGE)]
    command += [str(planted), str(healthy)] + (["--fp16-unet"] if family in FP16_UNET else [])
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "HALFSAFE_DATA_DIR": str(work / "data")},
            cwd=work,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        found = json.loads(done.stdout.strip().splitlines()[-1])
        if config is not None:  # `halfsafe check` on the same planted file, in its own home
            (work / "desktop").mkdir()
            found["desktop"] = desktop_check(planted, work / "desktop")
            found["desktop_config"] = json.loads(config.read_text(encoding="utf-8"))
    finally:  # up to 2.4 GB a file (Qwen-Image's companion encoder): not kept for the
        # session's end, where pytest would remove them, so that the suite holds one family's
        # files at a time on the disk
        healthy.unlink()
        planted.unlink()
        shutil.rmtree(work / "models", ignore_errors=True)
    return family, found


def test_comfyui_loads_the_file_as_the_family_in_fp16_using_every_tensor(driven):
    family, found = driven
    assert (found["model"], found["config"]) == (FAMILY_FILES[family].model, CONFIGS[family])
    assert found["precision"] == {"stored": "fp16", "compute": "fp16", "manual_cast": "False"}
    assert found["keys_said"] == []  # no key missing, none unused


def test_check_names_the_planted_layer_in_comfyuis_names_and_proves_an_island(driven):
    family, found = driven
    check, layer = found["check"], FAMILY_FILES[family].comfyui_layer
    assert ZEROS in check["text"]
    assert f"First bad layer: diffusion_model.{layer}." in check["text"]
    # The island closes where fp32's values are back in fp16's range: the planted layer's
    # attention, or its block where the attention's output is added in place.
    island = FAMILY_FILES[family].island
    assert layer.startswith(island + ".")
    assert check["fix"]["islands"] == {island: "fp32"} and check["fix"]["component"] is None
    assert check["fix"]["quality"]["value"] >= check["fix"]["quality"]["threshold"]
    assert found["untouched"]  # the MODEL passed in: no patch, the same weights


def test_fix_makes_the_call_match_fp32_on_a_clone(driven):
    family, found = driven
    fix = found["fix"]
    assert fix["patches"] == [f"diffusion_model.{FAMILY_FILES[family].island}"]
    assert fix["fixed_finite"] and fix["fixed_db"] >= 20
    # Unfixed, the call is non-finite, or finite where the model's code replaced fp16's inf
    # and NaN, and then far from fp32.
    assert fix["original_finite"] == (family in HIDDEN)
    assert not fix["original_finite"] or fix["original_db"] < 20
    said = "the model's own code replaced the non-finite values"
    assert (said in found["check"]["text"]) == fix["original_finite"]
    assert found["untouched"]


def test_a_healthy_file_of_the_family_is_healthy(driven):
    family, found = driven
    healthy = found["healthy"]
    assert healthy["model"] == found["model"]
    assert healthy["fix"] is None
    assert ZEROS in healthy["text"] and "\nHealthy: every layer stayed finite" in healthy["text"]


def test_the_node_and_the_desktop_name_the_same_layer_and_fix(driven):
    """`halfsafe check` on the planted file, with the tiny companions the desktop loads beside
    it, gives the node's verdict in diffusers' names: the same first bad layer and a fix inside
    the node's island, mapped through the layout's key table (`app.core.formats.layer_names`).
    Krea 2's and Anima's, and the tiny families', are in test_verdicts_agree.py."""
    from app.core.families.registry import FAMILIES
    from app.core.formats.layer_names import LayerNames

    family, found = driven
    if family not in DESKTOP_COMPANIONS:
        pytest.skip("its desktop check is in test_verdicts_agree.py")
    report, config = found["desktop"], found["desktop_config"]
    (layout,) = [f.layout for f in FAMILIES if f.transformer_class == config["_class_name"]]
    names = LayerNames(layout.table(config))

    layer = FAMILY_FILES[family].comfyui_layer
    assert_same_layer_and_fix(report, found["check"], layer, names)
