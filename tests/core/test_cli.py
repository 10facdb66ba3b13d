"""The `halfsafe` command's parsing contract: version, bad flags, flags over saved settings."""

from __future__ import annotations

import pytest

from app import __version__
from app.cli import build_parser, effective_settings, main
from app.core.settings import Settings, save_settings


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
