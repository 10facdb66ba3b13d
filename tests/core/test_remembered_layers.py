"""A remembered fix that names a layer the model does not have (edited on the Fixes page, or
kept from another version of the model) costs only that layer: the rest of the fix is used,
every job's notes name the layer left out, and a repair that replaces such a fix says so and
does not save the missing layer again."""

from __future__ import annotations

import pytest

from app.core import generation, hardware, health, models
from app.core.fixing import profiles
from app.core.health.request import CheckRequest, CheckRun
from app.core.settings import PrecisionSettings

GOOD = ("vae:decoder.up_blocks.0.resnets.0.conv1", "vae:decoder.up_blocks.0.resnets.0.norm2")
MISSING = "vae:decoder.no_such_layer"
FP16 = PrecisionSettings(precision="fp16")


@pytest.fixture
def demo():
    return models.load_model("demo-overflow")  # its VAE overflows in fp16 at two layers


def _remember(model, layers) -> None:
    profiles.remember_fix(
        model.profile_key,
        hardware.describe_device("cpu").name,
        {"bf16_modules": list(layers)},
        "The VAE overflowed; fix: keep layers of the VAE in bf16.",
        "health check",
    )


def test_a_missing_layer_costs_only_itself_and_is_named(demo):
    _remember(demo, [*GOOD, MISSING])
    report = health.check_loaded(
        demo,
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.verdict == "healthy"  # the two real layers in bf16 were used
    assert set(report.plan.islands("vae")) == {g.split(":", 1)[1] for g in GOOD}
    assert report.plan.remembered_dropped == (MISSING,)
    note = next(n for n in report.notes if "Using the fix remembered" in n)
    assert f"Left out of it: {MISSING}, which this model does not have" in note


def test_a_fix_of_missing_layers_only_says_so_not_that_settings_override_it(demo, tmp_path):
    _remember(demo, [MISSING])
    request = generation.GenerationRequest(
        prompt="a lake", steps=2, width=64, height=64, seed=3, output_dir=str(tmp_path)
    )
    result = generation.generate(
        demo, request, precision=PrecisionSettings(precision="fp16", auto_fix="off"), device="cpu"
    )
    assert result.images[0].status == "nan"  # nothing of the fix could run
    words = " ".join(result.warnings)
    assert f"names only {MISSING}, which this model does not have" in words
    assert "override" not in words


def test_a_repair_that_replaces_a_remembered_fix_says_so_and_drops_the_missing_layer(
    demo, tmp_path
):
    _remember(demo, [MISSING])
    request = generation.GenerationRequest(
        prompt="a lake", steps=2, width=64, height=64, seed=3, output_dir=str(tmp_path)
    )
    result = generation.generate(demo, request, precision=FP16, device="cpu")
    assert result.images[0].status == "fixed"
    assert any("is now the one this job proved" in w for w in result.warnings)
    saved = profiles.remembered_fix(demo.profile_key, result.device.name)
    assert saved is not None
    assert MISSING not in [
        e for key in ("fp32_modules", "bf16_modules") for e in saved.settings.get(key, [])
    ]


def test_a_model_loaded_says_which_layers_of_its_remembered_fix_it_lacks(demo):
    from app.core.models.summary import summarise

    _remember(demo, [*GOOD, MISSING])
    summary = summarise(demo, "cpu")
    assert summary.layers["vae"] and "decoder.up_blocks.0.resnets.0.conv1" in summary.layers["vae"]
    assert summary.unknown_layers([*GOOD, MISSING]) == [MISSING]
    (note,) = [n for n in summary.profile_notes if MISSING in n]
    assert "which this model does not have" in note


@pytest.mark.parametrize("attributed", [False, True], ids=["check", "check_and_attribute"])
def test_a_fix_proved_with_a_remembered_one_is_remembered_with_it(attributed):
    """A check that runs with the fix remembered for the model (the VAE in fp32) and proves
    the UNet's fix beside it remembers both: its proof stood on the VAE in fp32. The next
    check, with what it remembered, is healthy (it was "fixable" again, the VAE's fix lost)."""
    from app.core import causes
    from tests.support.planted_sd import loaded, plant
    from tests.support.tiny_models import build_tiny_sd_pipeline

    device = hardware.describe_device("cpu").name
    profiles.remember_fix("both", device, {"no_half_vae": True}, "The VAE.", "health check")

    def planted():
        return loaded(plant(plant(build_tiny_sd_pipeline(), "vae"), "unet_ff"), "both")

    request = CheckRequest(precision=FP16, device="cpu", size=64)
    run = CheckRun(remember=True, measure_cost=False)
    check = causes.check_and_attribute if attributed else health.check_loaded
    report = check(planted(), request, run=run)
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    assert report.plan.dtypes["vae"] == "fp32"  # the remembered VAE fix ran
    assert report.fix.settings.keys() == {"bf16_modules"}  # what this check proved

    stored = profiles.remembered_fix("both", device)
    assert stored is not None
    assert stored.settings == {"no_half_vae": True, **report.fix.settings}
    again = health.check_loaded(planted(), request, run=CheckRun(remember=False))
    assert again.verdict == "healthy", again.headline
