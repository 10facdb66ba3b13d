"""Other tools' flags: AUTOMATIC1111's and ComfyUI's spellings set the HalfSafe setting that
does the same, through the real parser, and stay out of --help."""

from __future__ import annotations

import pytest

from app.cli import main
from app.cli.arguments import OTHER_TOOLS_FLAGS, build_parser, effective_settings
from app.core.settings import PrecisionSettings


def parsed(*flags: str, command: str = "generate") -> dict:
    args = build_parser().parse_args([command, "demo", *flags])
    return {k: v for k, v in effective_settings(args).items()}


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        # AUTOMATIC1111 / Forge / SD.Next
        (["--precision", "autocast"], {"precision": "autocast"}),
        (["--precision", "full"], {"precision": "fp16", "no_half": False}),
        (["--precision", "full", "--no-half"], {"precision": "fp16", "no_half": True}),
        (["--upcast-sampling"], {"upcast_attention": True}),
        (["--disable-nan-check"], {"nan_check": False}),
        # ComfyUI
        (["--force-fp32"], {"no_half": True}),
        (["--fp32-vae"], {"vae_precision": "fp32"}),
        (["--bf16-vae"], {"vae_precision": "bf16"}),
        (["--fp16-vae"], {"vae_precision": "fp16"}),
        (["--fp16-unet"], {"unet_precision": "fp16"}),
        (["--bf16-unet"], {"unet_precision": "bf16"}),
        (["--fp32-unet"], {"unet_precision": "fp32"}),
        (["--fp32-text-enc"], {"text_encoder_precision": "fp32"}),
        (["--force-upcast-attention"], {"upcast_attention": True}),
        (["--upcast-attention", "--dont-upcast-attention"], {"upcast_attention": False}),
    ],
)
def test_other_tools_flags_set_the_same_halfsafe_setting(flags, expected):
    values = parsed(*flags)
    assert {k: values[k] for k in expected} == expected
    PrecisionSettings.from_mapping(values)  # and the result is a valid set of settings


def test_the_aliases_reach_the_check_command_too():
    assert parsed("--force-fp32", "--fp32-vae", command="check")["no_half"] is True
    assert parsed("--precision", "full", command="check")["precision"] == "fp16"


def test_the_aliases_resolve_to_the_plan_a1111_or_comfyui_would_run():
    from app.core.precision import resolve_plan

    components = ("text_encoder", "unet", "vae")

    def plan(*flags):
        values = parsed(*flags)
        return resolve_plan(
            PrecisionSettings.from_mapping(values), device="cuda", components=components
        )

    assert plan("--precision", "full", "--no-half").dtypes == dict.fromkeys(components, "fp32")
    a1111_default = plan("--precision", "autocast")
    assert a1111_default.autocast and a1111_default.dtypes["unet"] == "fp16"
    assert not plan("--precision", "full").autocast  # A1111: full turns autocast off
    comfy = plan("--precision", "fp16", "--bf16-vae", "--force-upcast-attention")
    assert comfy.dtypes["vae"] == "bf16" and comfy.upcast_attention


def test_the_aliases_are_hidden_from_help_and_bad_values_still_fail(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    shown = capsys.readouterr().out
    for flag, _, _ in OTHER_TOOLS_FLAGS:
        assert flag not in shown
    assert "--disable-nan-check" not in shown and "full" not in shown.split("--precision")[1][:60]
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "demo", "--precision", "fp8"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("halfsafe: argument --precision: invalid choice")


def test_a_prompt_that_cannot_be_read_is_one_sentence_before_the_model_loads(capsys, monkeypatch):
    from app.core import models

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded for a prompt that cannot be read")

    monkeypatch.setattr(models, "load_model", no_loading)
    assert main(["generate", "demo", "--prompt", "(" * 51 + "cat"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nest more than 50 deep" in err
