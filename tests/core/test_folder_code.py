"""No code from a model folder runs, and no file past the ones HalfSafe checked is opened.

transformers' Auto classes import a folder's own .py file where a config's `auto_map` names it
(asking "Do you wish to run the custom code? [y/N]" on the terminal where no
`trust_remote_code` was given), and diffusers loads a whole pipeline from a part's folder where
the index declares the part a pipeline. Each case plants a file that writes a marker when it
runs (a .py module, a pickle) and proves it never runs: in process, and through the `halfsafe`
command on a pseudo-terminal that answers "y". Tiny FLUX.3, Anima and Qwen-Image 2.1 folders are
built in code and saved as diffusers writes them.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import select
import shutil
import sys
import time
from pathlib import Path

import pytest

from app.core import models
from app.core.errors import BadFileError, HalfSafeError
from tests.support.family_helpers import offline  # noqa: F401 - an autouse fixture: no network
from tests.support.tiny_models import (
    build_tiny_anima_pipeline,
    build_tiny_flux3_pipeline,
    build_tiny_qwenimage21_pipeline,
)

ROOT = Path(__file__).resolve().parents[2]

BUILDERS = {
    "flux3": lambda: build_tiny_flux3_pipeline(distilled=True),
    "anima": build_tiny_anima_pipeline,
    "qwenimage21": build_tiny_qwenimage21_pipeline,
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each family's tiny folder, saved once (tests plant into copies)."""
    made: dict[str, Path] = {}

    def folder(family: str) -> Path:
        if family not in made:
            made[family] = tmp_path_factory.mktemp("saved") / family
            BUILDERS[family]().save_pretrained(made[family])
        return made[family]

    return folder


def _copy(saved, family: str, tmp_path: Path) -> Path:
    folder = tmp_path / family
    shutil.copytree(saved(family), folder)
    return folder


def _marker_code(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write('ran')\n"


def _plant_tokenizer(folder: Path, marker: Path, auto_map: bool = True) -> Path:
    """A tokenizer class of the folder's own (evil.py, which writes `marker` when imported and
    is otherwise the tokenizer it replaces), named by its tokenizer_config.json."""
    (folder / "evil.py").write_text(
        _marker_code(marker)
        + "from transformers import PreTrainedTokenizerFast\n"
        + "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "EvilTokenizer"
    if auto_map:
        config["auto_map"] = {"AutoTokenizer": [None, "evil.EvilTokenizer"]}
    config_file.write_text(json.dumps(config))
    return config_file


def _plant_model(folder: Path, marker: Path, model_type: str = "evil") -> Path:
    """A model class of the folder's own (evil.py, writing `marker` when imported), named by
    its config.json's auto_map."""
    (folder / "evil.py").write_text(_marker_code(marker))
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    config["model_type"] = model_type
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}
    config_file.write_text(json.dumps(config))
    return config_file


def _declare(folder: Path, part: str, library: str, declared: str) -> None:
    index_file = next(f for f in folder.iterdir() if f.name.endswith("model_index.json"))
    index = json.loads(index_file.read_text())
    index[part][:2] = [library, declared]
    if len(index[part]) == 3:
        index[part][2]["type_hint"] = [library, declared]
    index_file.write_text(json.dumps(index))


@pytest.fixture
def answers_yes(monkeypatch):
    """Whoever sits at the terminal answers "y" to any question (as transformers asks, with
    `input`, before it runs a model's own code); the questions asked are kept."""
    asked: list[str] = []

    def answer(question: str = "") -> str:
        asked.append(question)
        return "y"

    monkeypatch.setattr("builtins.input", answer)
    return asked


# --- the folder's checks ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "part", "config"),
    [
        ("flux3", "tokenizer", "tokenizer_config.json"),
        ("flux3", "text_encoder", "config.json"),
        ("anima", "tokenizer", "tokenizer_config.json"),
        ("anima", "t5_tokenizer", "tokenizer_config.json"),
        ("anima", "text_encoder", "config.json"),
        ("qwenimage21", "processor", "tokenizer_config.json"),
    ],
)
def test_a_config_naming_code_of_the_folders_own_is_refused_and_the_code_never_runs(
    saved, tmp_path, answers_yes, family, part, config
):
    folder = _copy(saved, family, tmp_path)
    marker = tmp_path / "ran"
    if config == "config.json":
        _plant_model(
            folder / part,
            marker,
            model_type=json.loads((folder / part / "config.json").read_text())["model_type"],
        )
    else:
        _plant_tokenizer(folder / part, marker)

    with pytest.raises(BadFileError) as caught:
        models.load_model(str(folder))

    assert str(caught.value) == (
        f"{folder / part / config}: it names code of its own to run (auto_map), and HalfSafe "
        "never runs code from a model folder."
    )
    assert not marker.exists()
    assert answers_yes == []


def test_an_unknown_tokenizer_class_is_refused_in_one_sentence(saved, tmp_path, answers_yes):
    folder = _copy(saved, "flux3", tmp_path)
    marker = tmp_path / "ran"
    config = _plant_tokenizer(folder / "tokenizer", marker, auto_map=False)

    with pytest.raises(BadFileError) as caught:
        models.load_model(str(folder))

    assert str(caught.value) == (
        f"{config}: its tokenizer_class 'EvilTokenizer' is no tokenizer transformers knows, so "
        "loading it would need code of the model's own, which HalfSafe never runs."
    )
    assert not marker.exists()


def test_an_unknown_model_type_is_refused_in_one_sentence(saved, tmp_path):
    folder = _copy(saved, "anima", tmp_path)
    config_file = folder / "text_encoder" / "config.json"
    config = json.loads(config_file.read_text())
    config["model_type"] = "evil"
    config_file.write_text(json.dumps(config))

    with pytest.raises(BadFileError) as caught:
        models.load_model(str(folder))

    assert str(caught.value) == (
        f"{config_file}: its model_type 'evil' is no model transformers knows, so loading it "
        "would need code of the model's own, which HalfSafe never runs."
    )


@pytest.mark.parametrize(
    ("family", "part", "declared", "wanted"),
    [
        ("flux3", "text_encoder", "AutoModel", "a Qwen3VLForConditionalGeneration"),
        ("flux3", "transformer", "Flux2Transformer2DModel", "a Flux3Transformer2DModel"),
        ("anima", "text_encoder", "AutoModel", "a Qwen3Model"),
    ],
)
def test_a_modular_folders_part_of_a_class_its_family_does_not_take_is_refused(
    saved, tmp_path, family, part, declared, wanted
):
    """Modular pipelines annotate no parts: the classes their blocks expect are the ones the
    family takes (an Auto class would build whatever its config names)."""
    folder = _copy(saved, family, tmp_path)
    library = "diffusers" if part == "transformer" else "transformers"
    _declare(folder, part, library, declared)

    with pytest.raises(HalfSafeError) as caught:
        models.load_model(str(folder))

    said = str(caught.value)
    assert said.startswith(f"{folder / part}: ")
    article = "an" if declared[0] in "AEIOU" else "a"
    assert f"modular_model_index.json declares this {article} {declared}" in said
    assert said.endswith(f"needs {wanted}.")


@pytest.mark.parametrize("allow_pickle", [False, True])
def test_a_part_declared_a_pipeline_is_refused_before_any_file_under_it_is_opened(
    saved, tmp_path, opened_under, allow_pickle
):
    """diffusers would load another pipeline from the part's folder and its subfolders (here a
    DDPM pipeline whose UNet weights are a pickle), which no check has read."""
    folder = _copy(saved, "flux3", tmp_path)
    marker = tmp_path / "ran"
    _declare(folder, "transformer", "diffusers", "DiffusionPipeline")
    nested = folder / "transformer"
    (nested / "model_index.json").write_text(
        json.dumps(
            {
                "_class_name": "DDPMPipeline",
                "unet": ["diffusers", "UNet2DModel"],
                "scheduler": ["diffusers", "DDPMScheduler"],
            }
        )
    )
    for name in ("unet", "scheduler"):
        (nested / name).mkdir()
    (nested / "scheduler" / "scheduler_config.json").write_text('{"_class_name": "DDPMScheduler"}')
    (nested / "unet" / "config.json").write_text(
        json.dumps({"_class_name": "UNet2DModel", "block_out_channels": [32], "norm_num_groups": 8})
    )
    (nested / "unet" / "diffusion_pytorch_model.bin").write_bytes(
        pickle.dumps({"weight": _Payload(str(marker))})
    )
    opened = opened_under(nested / "unet")

    with pytest.raises(BadFileError) as caught:
        models.load_model(str(folder), allow_pickle=allow_pickle)

    assert str(caught.value) == (
        f"{nested}: the folder's index declares the transformer a DiffusionPipeline, a whole "
        "pipeline where one part belongs, and HalfSafe does not load a pipeline nested in a "
        "part."
    )
    assert opened == []
    assert not marker.exists()


def test_a_part_of_a_library_of_the_folders_own_is_refused_and_its_code_never_runs(
    saved, tmp_path, answers_yes
):
    """model_index.json may name a part's library: one that is none of diffusers',
    transformers' or diffusers' pipelines' is a .py file in the part's folder to diffusers."""
    folder = _copy(saved, "qwenimage21", tmp_path)
    marker = tmp_path / "ran"
    (folder / "transformer" / "evil.py").write_text(_marker_code(marker))
    index = json.loads((folder / "model_index.json").read_text())
    index["transformer"] = ["evil", "EvilModel"]
    (folder / "model_index.json").write_text(json.dumps(index))

    with pytest.raises(BadFileError) as caught:
        models.load_model(str(folder))

    assert str(caught.value) == (
        f"{folder / 'transformer'}: the folder's index declares the transformer an EvilModel of "
        "'evil', which is none of diffusers, transformers or diffusers' pipelines, and HalfSafe "
        "runs no other code."
    )
    assert not marker.exists()
    assert answers_yes == []


class _Payload:
    """Unpickled, writes its marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


_WATCHED: list[tuple[str, list[str]]] = []


def _audit(event: str, args) -> None:
    if event == "open" and _WATCHED and isinstance(args[0], (str, os.PathLike)):
        path = os.fspath(args[0])
        for folder, seen in _WATCHED:
            if path.startswith(folder):
                seen.append(path)


sys.addaudithook(_audit)


@pytest.fixture
def opened_under():
    """The files under a folder opened from then on in this process, to the test's end (an
    audit hook: Python's own record of every open, whoever calls it)."""

    def watch(folder: Path) -> list[str]:
        seen: list[str] = []
        _WATCHED.append((str(folder), seen))
        return seen

    yield watch
    _WATCHED.clear()


# --- every from_pretrained HalfSafe calls -----------------------------------------------------


def test_every_from_pretrained_call_in_the_app_refuses_a_models_own_code():
    """transformers' default (trust_remote_code unset) asks on the terminal and runs the
    folder's code on "y"; every call HalfSafe makes says no outright."""
    lacking = []
    calls = 0
    for file in sorted((ROOT / "app").rglob("*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "from_pretrained"
            ):
                continue
            calls += 1
            said = {k.arg: k.value for k in node.keywords}
            refused = said.get("trust_remote_code")
            if not (isinstance(refused, ast.Constant) and refused.value is False):
                lacking.append(f"{file.relative_to(ROOT)}:{node.lineno}")
    assert calls >= 10  # the walk finds HalfSafe's loaders
    assert lacking == []


def test_the_processor_loaders_refuse_a_tokenizer_of_the_folders_own_when_asked_past_checks(
    saved, tmp_path, answers_yes
):
    """The folder's checks refuse auto_map first; the loaders themselves also never ask, so a
    "y" at the terminal runs nothing."""
    from app.core.families.qwenimage import _edit_processor_from
    from app.core.families.qwenimage21 import processor_from_folder

    folder = _copy(saved, "qwenimage21", tmp_path) / "processor"
    marker = tmp_path / "ran"
    _plant_tokenizer(folder, marker)

    for loader in (processor_from_folder, _edit_processor_from):
        with pytest.raises(ValueError, match="trust_remote_code=True"):
            loader(folder)

    assert not marker.exists()
    assert answers_yes == []


@pytest.mark.parametrize("family", ["flux3", "anima"])
def test_the_part_loaders_refuse_a_models_own_code_when_asked_past_checks(
    saved, tmp_path, answers_yes, family
):
    """A text encoder declared as an Auto class whose config names code of its own, handed to
    the family's part loader directly: transformers is told no, so nothing is asked or run."""
    from app.core.families import anima_folder, flux3_folder

    folder = _copy(saved, family, tmp_path)
    marker = tmp_path / "ran"
    _plant_model(folder / "text_encoder", marker)
    index = json.loads((folder / "modular_model_index.json").read_text())
    components = {n: v[:2] for n, v in index.items() if not n.startswith("_")}
    components["text_encoder"] = ["transformers", "AutoModel"]
    dtypes = {"default": None}

    with pytest.raises(ValueError, match="trust_remote_code=True"):
        if family == "flux3":
            flux3_folder.load(folder, components, dtypes, distilled=True)
        else:
            anima_folder.load(folder, components, dtypes)

    assert not marker.exists()
    assert answers_yes == []


# --- the halfsafe command on a terminal that answers "y" --------------------------------------


@pytest.mark.parametrize(
    ("family", "part"),
    [
        ("flux3", "tokenizer"),
        pytest.param("anima", "tokenizer", marks=pytest.mark.slow),
        pytest.param("qwenimage21", "processor", marks=pytest.mark.slow),
    ],
)
def test_the_check_on_a_terminal_answering_yes_runs_no_code_and_refuses(
    saved, tmp_path, family, part
):
    folder = _copy(saved, family, tmp_path)
    marker = tmp_path / "ran"
    config = _plant_tokenizer(folder / part, marker)

    status, output = _on_terminal(
        [sys.executable, "-m", "app.cli", "check", str(folder), "--size", "64"], cwd=tmp_path
    )

    assert not marker.exists()
    assert "[y/N]" not in output
    assert status == 2, output
    assert (
        output.strip()
        .splitlines()[-1]
        .endswith(
            f"halfsafe: {config}: it names code of its own to run (auto_map), and HalfSafe never "
            "runs code from a model folder."
        )
    )


def _on_terminal(argv: list[str], cwd: Path, timeout: float = 300) -> tuple[int, str]:
    """Run `argv` with a pseudo-terminal as its stdin, stdout and stderr, whose user has typed
    "y" ahead and answers "y" to every "[y/N]" question; its exit status and everything it
    wrote there."""
    import pty
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    terminal, its_side = pty.openpty()
    process = subprocess.Popen(
        argv, stdin=its_side, stdout=its_side, stderr=its_side, cwd=cwd, env=env
    )
    os.close(its_side)
    os.write(terminal, b"y\n")
    output, asked, deadline = b"", 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([terminal], [], [], 1.0)
        if not ready:
            if process.poll() is not None:
                break
            continue
        try:
            chunk = os.read(terminal, 65536)
        except OSError:  # the command closed the terminal
            break
        if not chunk:
            break
        output += chunk
        if output.count(b"[y/N]") > asked:
            asked += 1
            os.write(terminal, b"y\n")
    else:
        process.kill()
    os.close(terminal)
    return process.wait(timeout=30), output.decode("utf-8", "replace")
