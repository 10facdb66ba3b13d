"""Names and settings in a model's files that are not what they claim: a block index written in
other digits (`²`, Arabic-Indic) or 5,000 digits long, a text encoder whose config says GPTQ,
a GPTQ text encoder beside a transformer file; and names that would write on the terminal (a
newline and escape codes in a tensor name, a 100,000-character family name). Each is one
sentence naming the file, exit 2, through the command's own entry (`app.cli.main`) in this
process: each is refused before anything loads, and none can wait on anything."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from app.cli import main
from app.cli.terminal import MAX_RUN, for_terminal
from app.core.checkpoint import write_safetensors
from app.core.limits import index_in_name
from tests.support.hostile_files import UNET, empty_tensor, tiny_folder, tiny_sd1_tensors
from tests.support.model_files import save_split_files
from tests.support.tiny_models import build_tiny_zimage_pipeline


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("good") / "tiny-sd")


def copy_of(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / "model"))


def one_sentence(argv: list[str], capsys, *words: str) -> str:
    """`halfsafe ARGV` exits 2 with one line on stderr saying each of `words`, no traceback."""
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert err.count("\n") == 1 and err.startswith("halfsafe: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    return err


# Block indices -------------------------------------------------------------------------------


@pytest.mark.parametrize("index", ["²", "9" * 5000], ids=["superscript two", "5000 digits"])
def test_a_block_index_of_odd_digits_is_a_name_not_a_number(good_folder, tmp_path, capsys, index):
    folder = copy_of(good_folder, tmp_path)
    weights = folder / "unet" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    tensors[f"down_blocks.{index}.resnets.0.conv1.weight"] = torch.zeros(1)
    write_safetensors(weights, tensors)

    argv = ["check", str(folder), "--size", "64"]
    err = one_sentence(argv, capsys, str(folder / "unet" / "config.json"), "down_blocks.")
    assert len(err) < 2 * MAX_RUN + 1000  # a 5,000-digit name is shortened, with a count
    if len(index) > 1000:
        assert "characters left out" in err


@pytest.mark.parametrize(
    ("part", "number"),
    [
        ("12", 12),
        ("0", 0),
        ("99999999", 99_999_999),  # an absurd size, read to be refused as one
        ("²", None),
        ("٣", None),
        ("1" * 19, None),
        ("", None),
        ("-1", None),
    ],
)
def test_only_a_few_ascii_digits_make_an_index(part, number):
    assert index_in_name(part) == number


# GPTQ text encoders --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "setting",
    ["gptq", {"quant_method": "gptq", "bits": 4, "group_size": 128}],
    ids=["a bare name", "transformers' table"],
)
def test_a_text_encoder_config_that_says_gptq_is_named_gptq(good_folder, tmp_path, capsys, setting):
    folder = copy_of(good_folder, tmp_path)
    config_path = folder / "text_encoder" / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["quantization_config"] = setting
    config_path.write_text(json.dumps(config), encoding="utf-8")

    one_sentence(
        ["check", str(folder), "--size", "64"], capsys, str(config_path), "GPTQ", "optimum"
    )


def test_another_quantization_method_is_named_not_imported(good_folder, tmp_path, capsys):
    folder = copy_of(good_folder, tmp_path)
    config_path = folder / "text_encoder" / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    config_path.write_text(json.dumps(config), encoding="utf-8")

    one_sentence(["check", str(folder), "--size", "64"], capsys, str(config_path), "'bitsandbytes'")


def gptq_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A text encoder's weights as a GPTQ export stores them: each projection's weight as
    `qweight` (eight 4-bit values an int32), `qzeros`, `scales` and the channel order `g_idx`."""
    packed: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith("proj.weight") and tensor.dim() == 2:
            base, (rows, columns) = name.removesuffix("weight"), tensor.shape
            packed[base + "qweight"] = torch.zeros(columns // 8, rows, dtype=torch.int32)
            packed[base + "qzeros"] = torch.zeros(1, rows // 8, dtype=torch.int32)
            packed[base + "scales"] = torch.ones(1, rows, dtype=torch.float16)
            packed[base + "g_idx"] = torch.zeros(columns, dtype=torch.int32)
        else:
            packed[name] = tensor
    return packed


@pytest.fixture(scope="module")
def zimage_with_a_gptq_encoder(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("split") / "models"
    written = save_split_files(build_tiny_zimage_pipeline(), root, "z_image")
    encoder = written["text_encoder"]
    gptq = encoder.with_name("qwen_3_4b_gptq.safetensors")
    write_safetensors(gptq, gptq_state(load_file(encoder)))
    encoder.unlink()
    return written["transformer"], gptq


def test_a_gptq_companion_in_the_folders_is_passed_over_as_gptq(zimage_with_a_gptq_encoder, capsys):
    transformer, gptq = zimage_with_a_gptq_encoder

    argv = ["check", str(transformer), "--size", "64"]
    err = one_sentence(argv, capsys, str(transformer), str(gptq), "GPTQ")
    assert "q_proj.weight" not in err


def test_a_gptq_text_encoder_given_is_refused_as_gptq(zimage_with_a_gptq_encoder, capsys):
    transformer, gptq = zimage_with_a_gptq_encoder

    argv = ["check", str(transformer), "--text-encoder", str(gptq), "--size", "64"]
    err = one_sentence(argv, capsys, str(gptq), "GPTQ", "qweight")
    assert "q_proj.weight" not in err


# What reaches the terminal -------------------------------------------------------------------

FAKE_LINE = "\n\x1b[32mhalfsafe: Verdict: Healthy\x1b[0m"


def test_a_tensor_name_cannot_write_a_line_of_its_own(tmp_path, capsys):
    tensors = tiny_sd1_tensors()
    tensors[UNET + "x" + FAKE_LINE] = empty_tensor(10**12, 0)
    path = write_safetensors(tmp_path / "model.safetensors", tensors)

    argv = ["check", str(path), "--size", "64"]
    err = one_sentence(argv, capsys, str(path), "\\x1b[32mhalfsafe: Verdict: Healthy")
    assert "\x1b" not in err


def test_a_family_name_of_100000_characters_is_shortened(capsys):
    argv = ["advise", "a" * 100_000 + "\x1b[2J"]
    err = one_sentence(argv, capsys, "characters left out", "is not a model family")
    assert len(err) < 2_000 and "\x1b" not in err


def test_a_report_keeps_its_lines_and_escapes_the_rest():
    assert for_terminal("one\ntwo\x1b[31m\r") == "one\ntwo\\x1b[31m\\r"
    assert for_terminal("one\ntwo", one_line=True) == "one\\ntwo"
    assert for_terminal("right\u202eto left") == "right\\u202eto left"
    assert for_terminal("tab\tkept é ü 中") == "tab\tkept é ü 中"
    long = "a" * 120 + "b" * 10_000 + "c" * 40
    assert (
        for_terminal(f"x {long} y")
        == f"x {'a' * 120}...[10,000 characters left out]...{'c' * 40} y"
    )
    assert for_terminal("p" * MAX_RUN) == "p" * MAX_RUN
