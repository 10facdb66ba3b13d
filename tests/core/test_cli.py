"""The `halfsafe` command's parsing contract: version, bad flags, flags over saved settings."""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from app import __version__
from app.cli import keep_library_warnings_off_the_terminal, main
from app.cli.arguments import build_parser, effective_settings
from app.core.settings import FIELDS, Settings, save_settings, settings_path
from tests.support.cli_output import without_progress

ROOT = Path(__file__).resolve().parents[2]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"halfsafe {__version__}"


@pytest.mark.parametrize(
    "argv",
    [
        ["check"],  # MODEL missing
        ["check", "demo", "--precision", "fp8"],  # not a choice
        ["generate", "demo", "--steps", "0"],  # out of range
        ["generate", "demo", "--width", "513"],  # not a multiple of 8
        ["check", "demo", "--device", "gpu"],  # not a device
        ["frobnicate"],  # no such command
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("halfsafe: ")


def test_flags_override_saved_settings_one_at_a_time():
    saved = Settings()
    saved["no_half_vae"] = True
    saved["attention_backend"] = "math"
    save_settings(saved)
    args = build_parser().parse_args(["check", "demo", "--upcast-attention", "--no-tf32"])
    values = effective_settings(args)
    assert values["upcast_attention"] is True  # from the flag
    assert values["allow_tf32"] is False  # from the flag
    assert values["no_half_vae"] is True  # from the saved file
    assert values["attention_backend"] == "math"  # from the saved file


# Hostile values: one sentence naming the flag, exit 2, no traceback, at once ----------------

_DIGITS_400 = "9" * 400
_DIGITS_5000 = "9" * 5000


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["generate", "demo", "--steps", _DIGITS_400], "--steps: a number of 400 digits"),
        (["generate", "demo", "--seed", _DIGITS_5000], "--seed: a number of 5000 digits"),
        (["generate", "demo", "--seed", "-" + _DIGITS_5000], "below the minimum -1"),
        (["generate", "demo", "--width", _DIGITS_400], "--width: a number of 400 digits"),
        (["generate", "demo", "--height", _DIGITS_5000], "--height: a number of 5000 digits"),
        (["generate", "demo", "--batch", "1" + "0" * 300], "--batch: a number of 301 digits"),
        (["generate", "demo", "--steps", "1e400"], "--steps: expected a whole number"),
        (["generate", "demo", "--cfg", "nan"], "--cfg: expected a finite number, got nan"),
        (["generate", "demo", "--cfg", "inf"], "--cfg: expected a finite number, got inf"),
        (["generate", "demo", "--cfg=-inf"], "--cfg: expected a finite number, got -inf"),
        (["generate", "demo", "--cfg", "1e999"], "--cfg: expected a finite number"),
        (["generate", "demo", "--cfg", _DIGITS_5000], "above the maximum 30"),
        (["check", "demo", "--size", "100000"], "--size: 100000 is above the maximum 4096"),
        (["check", "demo", "--size", _DIGITS_400], "--size: a number of 400 digits"),
        (["check", "demo", "--size", "100"], "--size: 100 is not a multiple of 8"),
        (["check", "demo", "--size", "32"], "--size: 32 is below the minimum 64"),
    ],
    ids=lambda v: v[-1][:12] if isinstance(v, list) else None,
)
def test_an_absurd_number_is_one_sentence_and_exit_2(capsys, argv, words):
    saved = Settings()
    saved["steps"] = 33
    before = save_settings(saved).read_bytes()
    started = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert time.monotonic() - started < 5
    assert settings_path().read_bytes() == before  # the saved settings are untouched
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("halfsafe: argument ")
    assert words in err and "Traceback" not in err
    assert len(err) < 160  # the value is never echoed whole


def test_the_check_size_bound_is_documented_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "64 to 4096 and a multiple of 8" in help_text


def test_hostile_saved_settings_cost_a_field_not_the_command(capsys):
    path = settings_path()
    path.write_text(
        '{"schema_version": 1, "settings": {"steps": Infinity, "cfg": 1e400, '
        f'"seed": {_DIGITS_5000}, "no_half_vae": true}}}}'
    )
    values = effective_settings(build_parser().parse_args(["generate", "demo", "--steps", "30"]))
    assert values["steps"] == 30 and values["no_half_vae"] is True
    assert values["cfg"] == FIELDS["cfg"].default and values["seed"] == FIELDS["seed"].default
    err = capsys.readouterr().err
    assert "'cfg'" in err and "'seed'" in err and "Traceback" not in err
    assert all(len(line) < 300 for line in err.splitlines())


def test_library_warnings_stay_off_the_terminal_but_ours_show(capsys):
    with warnings.catch_warnings():
        keep_library_warnings_off_the_terminal()
        warnings.warn_explicit(
            "Detected pickle protocol 4",
            UserWarning,
            "torch/serialization.py",
            1,
            module="torch.serialization",
        )
        warnings.warn_explicit(
            "HalfSafe advice", UserWarning, "app/core/models.py", 1, module="app.core.models"
        )
    assert capsys.readouterr().err == "halfsafe: HalfSafe advice\n"


def _pickle_protocol_4_checkpoint(path):
    import torch

    torch.save(
        {"state_dict": {"w": torch.zeros(2)}},
        str(path),
        _use_new_zipfile_serialization=False,
        pickle_protocol=4,
    )
    return path


def test_pytorchs_pickle_protocol_warning_never_reaches_the_terminal(tmp_path):
    """The loader reads legacy pickles with PyTorch's warnings silenced (they are advice for
    PyTorch's users, not HalfSafe's); the answer is one sentence."""
    checkpoint = _pickle_protocol_4_checkpoint(tmp_path / "old.ckpt")
    done = subprocess.run(
        [sys.executable, "-m", "app", "check", str(checkpoint), "--allow-pickle"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (1, 2), done.stderr
    assert "Detected pickle protocol" not in done.stderr and "Warning" not in done.stderr
    assert without_progress(done.stderr).count("\n") <= 1 and "Traceback" not in done.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="resource limits are POSIX")
def test_an_absurd_flag_is_refused_under_a_memory_limit_before_anything_heavy_loads():
    limit = 256 << 20  # 256 MiB of address space: importing torch alone would not fit
    code = (
        "import resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
        "from app.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code, "generate", "demo", "--seed", _DIGITS_5000],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 30
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "5000 digits" in done.stderr


# The records the window sends: check and generate build them from the flags --------------


def test_check_flags_become_the_check_request_the_engine_runs(tmp_path):
    """The probe follows the saved sampler; the LoRAs are exactly those the flags name."""
    from app.cli.commands import check_request
    from app.core.lora.files import LoraRequest
    from app.core.requests.records import CheckRequest
    from app.core.settings import PrecisionSettings

    saved = Settings()
    saved["steps"] = 12
    saved["scheduler"] = "ddim"
    save_settings(saved)
    lora = tmp_path / "ink.safetensors"
    argv = ["check", "demo", "--precision", "fp16", "--device", "cpu", "--size", "64"]
    args = build_parser().parse_args([*argv, "--lora", f"{lora}:0.5", "--allow-pickle"])
    values = effective_settings(args)

    assert check_request(args, values) == CheckRequest(
        precision=PrecisionSettings.from_mapping(values),
        device="cpu",
        size=64,
        steps=12,
        scheduler="ddim",
        loras=(LoraRequest(str(lora), 0.5),),
        allow_pickle=True,
    )
    assert values["precision"] == "fp16"
    # A saved hires fix from a pixel upscaler: the VAE's encoder is probed too, as the window's.
    saved["hires_scale"], saved["hires_upscaler"] = 2.0, "lanczos"
    save_settings(saved)
    assert check_request(args, effective_settings(args)).pixel_upscale is True
    saved["hires_upscaler"] = "latent"
    save_settings(saved)
    assert check_request(args, effective_settings(args)).pixel_upscale is False


def test_generate_flags_become_the_generate_request_the_engine_runs(tmp_path):
    """A side left out is the model's native size; the rest comes from the flags over the
    saved settings."""
    from app.cli.commands import generate_request
    from app.core.generation import GenerationRequest
    from app.core.lora.files import LoraRequest
    from app.core.requests.records import GenerateRequest
    from app.core.settings import PrecisionSettings

    lora = tmp_path / "ink.safetensors"
    args = build_parser().parse_args(
        ["generate", "demo", "--prompt", "a red circle", "--steps", "3", "--width", "64",
         "--seed", "7", "--out", str(tmp_path), "--lora", str(lora), "--no-half-vae"]
    )  # fmt: skip
    values = effective_settings(args)

    request = generate_request(args, values, native_size=128)

    assert request == GenerateRequest(
        generation=GenerationRequest(
            prompt="a red circle",
            negative_prompt=values["negative_prompt"],
            steps=3,
            cfg=values["cfg"],
            seed=7,
            width=64,
            height=128,
            batch=values["batch"],
            scheduler=values["scheduler"],
            output_dir=str(tmp_path),
        ),
        precision=PrecisionSettings.from_mapping(values),
        device=values["device"],
        loras=(LoraRequest(str(lora), 1.0),),
    )
    assert request.precision.no_half_vae is True


@pytest.fixture
def input_picture(tmp_path):
    from PIL import Image

    path = tmp_path / "photo.png"
    Image.new("RGB", (300, 200), (200, 120, 40)).save(path)
    mask = tmp_path / "mask.png"
    Image.new("L", (300, 200), 255).save(mask)
    return path, mask


def test_picture_flags_become_the_request_with_the_pictures_proportions(tmp_path, input_picture):
    from app.cli.commands import check_request, generate_request

    photo, mask = input_picture
    argv = ["generate", "demo", "--image", str(photo), "--mask", str(mask), "--strength", "0.4"]
    args = build_parser().parse_args(argv)
    generation = generate_request(args, effective_settings(args), native_size=128).generation
    assert (generation.images, generation.mask, generation.strength) == (
        [str(photo)],
        str(mask),
        0.4,
    )
    assert (generation.width, generation.height) == (128, 80)  # 300x200 at 128 px, by 16s
    wider = build_parser().parse_args([*argv, "--width", "768"])
    generation = generate_request(wider, effective_settings(wider), native_size=128).generation
    assert (generation.width, generation.height) == (768, 512)  # the height follows the picture
    assert generation.mode_for().value == "inpaint"
    args = build_parser().parse_args(["check", "demo", "--image", str(photo)])
    request = check_request(args, effective_settings(args))
    assert (request.images, request.mask) == ((str(photo),), None)


def test_canvas_flags_become_the_requests_layout(input_picture):
    from app.cli.commands import generate_request
    from app.core.images.canvas import Canvas

    photo, mask = input_picture
    argv = ["generate", "demo", "--image", str(photo), "--mask", str(mask)]
    args = build_parser().parse_args(argv)
    assert generate_request(args, effective_settings(args), 128).generation.canvas == Canvas()
    argv += ["--mask-blur", "0", "--only-masked", "--masked-padding", "64"]
    args = build_parser().parse_args([*argv, "--extend", "right=100, top=20"])
    generation = generate_request(args, effective_settings(args), 128).generation
    assert generation.canvas == Canvas(0, True, 64, (0, 20, 100, 0))
    # The size left out follows the extended canvas: 400 x 220 at 128 px, by 16s.
    assert (generation.width, generation.height) == (128, 64)
    args = build_parser().parse_args(
        ["generate", "demo", "--image", str(photo), "--extend", "left=8"]
    )
    generation = generate_request(args, effective_settings(args), 128).generation
    assert generation.mask is None and generation.mode_for().value == "inpaint"


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--mask", "{mask}"], "A mask needs the picture it masks"),
        (["--image", "{missing}"], "missing.png: not a file"),
        (["--image", "{text}"], "notes.txt: not a picture HalfSafe can read"),
        (["--image", "{photo}", "--strength", "0"], "--strength: 0 is not more than 0"),
        (["--strength", "0.5"], "--strength is how much of an input picture is drawn again"),
        (["--extend", "right=64"], "--extend extends an input picture's canvas"),
        (["--image", "{photo}", "--extend", "up=64"], "'up=64' is not SIDE=PX"),
        (["--image", "{photo}", "--extend", "left=0"], "nothing would be extended"),
        (["--image", "{photo}", "--extend", "left=9999"], "9999 is not from 0 to 2048"),
        (["--image", "{photo}", "--mask-blur", "4"], "--mask-blur lays out an inpainting job"),
        (["--image", "{photo}", "--only-masked"], "--only-masked lays out an inpainting job"),
        (["--image", "{photo}", "--mask", "{mask}", "--mask-blur", "-1"], "-1 is not from 0"),
        (
            ["--image", "{photo}", "--mask", "{mask}", "--masked-padding", "8"],
            "--masked-padding is the room around --only-masked's box",
        ),
    ],
)
def test_a_bad_picture_flag_is_one_line_and_exit_2_before_a_model_loads(
    capsys, tmp_path, input_picture, extra, words, monkeypatch
):
    from app.core import models

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(models, "load_model", no_load)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    paths = {"mask": input_picture[1], "photo": input_picture[0], "text": text}
    paths["missing"] = tmp_path / "missing.png"
    argv = ["generate", "demo", *(e.format(**paths) for e in extra)]
    try:
        code = main(argv)
    except SystemExit as usage_error:  # argparse's own refusal of a flag's value
        code = usage_error.code
    assert code == 2
    err = without_progress(capsys.readouterr().err)
    assert err.count("\n") == 1 and err.startswith("halfsafe: ") and words in err
