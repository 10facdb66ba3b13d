"""A fix one job runs with over the user's own settings (`job_fix`), and the words a job says
when the user's own settings set a remembered fix aside: the fix named is the fix run, and no
note or headline credits a fix that did not run."""

from __future__ import annotations

import pytest

from app.core import generation, hardware, health, models
from app.core.errors import HalfSafeError
from app.core.fixing import profiles
from app.core.fixing.job_fix import JobFix, with_job_fix
from app.core.health.request import CheckRequest, CheckRun
from app.core.settings import PrecisionSettings
from app.core.words import infotext

MINE = PrecisionSettings(precision="fp16", vae_precision="fp16")  # chosen by hand


def test_a_job_fix_replaces_the_users_own_choice_and_says_which():
    merged, job_fix = with_job_fix(MINE, {"vae_precision": "bf16"})
    assert merged.vae_precision == "bf16" and merged.precision == "fp16"
    assert job_fix == JobFix({"vae_precision": "bf16"}, {"vae_precision": "fp16"})
    assert job_fix.to_json() == {
        "settings": {"vae_precision": "bf16"},
        "overrode": {"vae_precision": "fp16"},
    }


def test_a_job_fix_over_auto_overrides_nothing_and_adds_to_the_users_layers():
    mine = PrecisionSettings(precision="fp16", fp32_modules=("vae:a",))
    merged, job_fix = with_job_fix(mine, {"vae_precision": "fp32", "fp32_modules": ["vae:b"]})
    assert merged.vae_precision == "fp32"
    assert list(merged.fp32_modules) == ["vae:a", "vae:b"]
    assert job_fix is not None and job_fix.overrode == {}
    assert with_job_fix(mine, {}) == (mine, None)


@pytest.mark.parametrize(
    ("fix", "said"),
    [
        ({"steps": 4}, "'steps', which is no precision setting"),
        ({"vae_precision": "fp12"}, "VAE precision"),
        (["vae_precision"], "must be precision settings by name"),
    ],
)
def test_a_job_fix_that_is_no_precision_fix_is_refused_in_one_sentence(fix, said):
    with pytest.raises(HalfSafeError, match=said):
        with_job_fix(MINE, fix)


@pytest.fixture
def demo():
    return models.load_model("demo-overflow")  # its VAE overflows in fp16


def _remember_checked(model, settings) -> None:
    profiles.remember_fix(
        model.profile_key,
        hardware.describe_device("cpu").name,
        settings,
        "The VAE overflowed; fix: run the VAE in bf16.",
        "health check",
        parts=model.components,
    )


def _request(tmp_path):
    return generation.GenerationRequest(
        prompt="a red circle on a blue background",
        steps=2,
        width=64,
        height=64,
        seed=3,
        output_dir=str(tmp_path),
    )


def test_the_fix_a_job_is_given_runs_over_the_users_setting_and_its_record_says_so(demo, tmp_path):
    _remember_checked(demo, {"vae_precision": "bf16"})
    mine = PrecisionSettings(precision="fp16", vae_precision="fp16", auto_fix="off")
    without = generation.generate(demo, _request(tmp_path), precision=mine, device="cpu")
    assert without.images[0].status == "nan"  # the user's fp16 overrides the remembered fix
    result = generation.generate(
        demo, _request(tmp_path), precision=mine, device="cpu", fix={"vae_precision": "bf16"}
    )
    assert result.images[0].status == "ok"
    assert result.settings["vae_precision"] == "bf16"
    assert result.job_fix == JobFix({"vae_precision": "bf16"}, {"vae_precision": "fp16"})
    assert result.to_json()["fix_for_job"]["overrode"] == {"vae_precision": "fp16"}
    # The PNG's record says it too, beside the settings that ran.
    recorded = infotext.parse(result.images[0].parameters)
    assert recorded.get(infotext.FIX_FOR_JOB) == ["VAE precision bf16 (over fp16)"]
    assert recorded.settings(infotext.SETTING_KEYS)["vae_precision"] == "bf16"
    # The job's notes say nothing of the fix it was given: its record holds it, and the window
    # says it from there as things stand when it is read (a note written now would go stale
    # once the fix is made the setting).
    notes = " ".join(result.warnings)
    assert "this job only" not in notes and "your settings are unchanged" not in notes
    # The fix ran because the job was given it, not because the settings held it.
    assert "Your settings include the fix remembered" not in notes
    assert "so this job ran without it" not in notes


def test_auto_repair_under_an_overriding_setting_says_the_fix_was_not_in_place(demo, tmp_path):
    _remember_checked(demo, {"vae_precision": "bf16"})
    mine = PrecisionSettings(precision="fp16", vae_precision="fp16", auto_fix="auto")
    result = generation.generate(demo, _request(tmp_path), precision=mine, device="cpu")
    assert result.images[0].status == "fixed"
    notes = result.warnings
    said = [n for n in notes if "remembered for this model" in n]
    assert len(said) == 1, notes  # one note, not two that contradict each other
    assert said[0].startswith(
        "Your own VAE precision fp16 set aside the fix remembered for this model on this "
        "device (run the VAE in bf16), so this job ran without it, went non-finite and was "
        "repaired after"
    )
    assert "every job at these settings will be repaired again" in said[0]
    assert "set VAE precision to Auto, or make the fix your setting" in said[0]
    # The checked fix stays remembered; the next job repairs again, and says so again.
    stored = profiles.remembered_fix(demo.profile_key, hardware.describe_device("cpu").name)
    assert stored is not None and stored.settings == {"vae_precision": "bf16"}


def test_a_no_half_check_credits_no_remembered_fix(demo):
    _remember_checked(demo, {"vae_precision": "bf16"})
    report = health.check_loaded(
        demo,
        CheckRequest(precision=PrecisionSettings(no_half=True), device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.remembered is None
    assert not report.headline.startswith("Safe with the fix remembered")
    assert report.headline.startswith("Safe at your settings")
    assert report.plan.remembered_used == ()
    assert "remembered" not in report.plan.reasons.get("vae_precision", "")
    notes = " ".join(report.notes)
    assert "Using the fix remembered" not in notes
