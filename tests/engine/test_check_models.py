"""The engine's side of the Fixes page: every check keeps its report, "Check all my models"
checks the library in turn and gives the user's model back, and a fix remembered from a
generation is stored in words the file accepts."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from app.core import hardware
from app.core.components import Verdict
from app.core.fixing import profiles
from app.core.health import saved
from app.core.models import load_model
from app.core.requests.records import (
    CheckModelsRequest,
    CheckRequest,
    LoadRequest,
    RememberFixRequest,
)
from app.core.settings import PrecisionSettings
from app.engine import jobs
from app.engine.events import EngineEvent, EventState, JobRequest, encode, read_message
from app.engine.server import JobContext, Session
from tests.support.model_files import save_single_file

FP32 = PrecisionSettings("fp32")


class Job:
    """One handler call in-process, as the engine makes it: its events, and a cancel that a
    test can pull when a progress stage appears."""

    def __init__(self, session: Session, request: Any, cancel_at: str | None = None) -> None:
        self.events: list[EngineEvent] = []
        self.cancel_at = cancel_at
        from app.core.jobs import CancelToken

        self.token = CancelToken()
        self.context = JobContext(JobRequest(1, request), session, self._send, self.token)

    def _send(self, event: EngineEvent) -> None:
        self.events.append(event)
        if self.cancel_at and self.cancel_at in event.stage:
            self.token.cancel()

    def stages(self) -> list[str]:
        return [e.stage for e in self.events if e.state == EventState.PROGRESS]


def _load(session: Session, source: str) -> None:
    request = LoadRequest(source)
    jobs.load(Job(session, request).context, request)


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    """A model folder: the demo as an A1111 single file, and a file that is no model."""
    folder = tmp_path_factory.mktemp("models")
    save_single_file(load_model("demo").pipeline, folder / "shapes.safetensors")
    (folder / "broken.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    return folder


def _run(session: Session, request: CheckModelsRequest, cancel_at: str | None = None):
    job = Job(session, request, cancel_at)
    result = jobs.check_models(job.context, request)
    # What the GUI reads back: only builtins and HalfSafe's records.
    frame = encode(EngineEvent(1, "check_models", EventState.RESULT, result=result))
    assert read_message(io.BytesIO(frame)).result == result  # type: ignore[union-attr]
    return result, job


def test_a_check_keeps_its_report_for_the_model_and_device():
    session = Session()
    _load(session, "demo-overflow")
    request = CheckRequest(PrecisionSettings("fp16"), size=64, steps=2)
    result = jobs.check(Job(session, request).context, request)
    kept = saved.last_report(session.model.profile_key, result.report.device.name)
    assert kept is not None
    assert kept.verdict is Verdict.FIXABLE and kept.headline == result.report.headline
    assert kept.markdown == result.markdown and kept.model_name == "demo-overflow"


def test_checking_every_model_goes_on_past_a_broken_one_and_gives_the_model_back(library):
    session = Session()
    _load(session, "demo")
    before = session.model
    request = CheckModelsRequest(folders=(str(library),), precision=FP32, size=64, steps=2)
    result, job = _run(session, request)

    rows = {row.name: row for row in result.rows}
    assert set(rows) == {"broken.safetensors", "shapes.safetensors"}
    broken = rows["broken.safetensors"]
    assert broken.verdict is None and "broken.safetensors" in broken.words
    assert "\n" not in broken.words
    shapes = rows["shapes.safetensors"]
    assert shapes.verdict is Verdict.HEALTHY and shapes.words.startswith("Safe at your settings")
    assert not result.cancelled and result.restore_problem == ""
    # Each model's report is kept, under its own identity.
    kept = [r for r in saved.saved_reports().reports if r.source == shapes.source]
    assert len(kept) == 1 and kept[0].verdict is Verdict.HEALTHY
    assert kept[0].headline == shapes.words
    # Progress names the model and counts models.
    assert "shapes.safetensors (2 of 2): Checking the VAE" in job.stages()
    # The user's model is loaded again, and the record says so.
    assert session.model_request == LoadRequest("demo") and session.model is not before
    assert result.loaded is not None and result.loaded.name == "demo"
    assert result.loaded_request == LoadRequest("demo")


def test_a_cancel_ends_the_run_between_models_and_still_gives_the_model_back(library):
    session = Session()
    _load(session, "demo")
    shapes = str(library / "shapes.safetensors")
    request = CheckModelsRequest(models=("demo-overflow", shapes), precision=FP32, size=64, steps=2)
    result, job = _run(session, request, cancel_at="(2 of 2)")
    assert result.cancelled
    assert [row.name for row in result.rows] == ["demo-overflow"]  # the second was not finished
    assert saved.saved_reports().reports[0].model_name == "demo-overflow"
    assert session.model_request == LoadRequest("demo") and result.loaded is not None
    assert any(stage.startswith("Loading demo again") for stage in job.stages())


def test_re_verifying_the_loaded_model_checks_it_with_the_fix_without_reloading():
    session = Session()
    _load(session, "demo-overflow")
    model = session.model
    fixed = PrecisionSettings("fp16", vae_precision="fp32")
    result, _job = _run(
        session, CheckModelsRequest(models=("demo-overflow",), precision=fixed, size=64, steps=2)
    )
    [row] = result.rows
    assert row.verdict is Verdict.HEALTHY and "(fp16, VAE in fp32)" in row.words
    assert session.model is model  # never unloaded
    assert result.loaded_request == LoadRequest("demo-overflow")


def test_a_run_with_nothing_loaded_leaves_nothing_loaded(library):
    session = Session()
    shapes = str(library / "shapes.safetensors")
    result, _job = _run(
        session, CheckModelsRequest(models=(shapes,), precision=FP32, size=64, steps=2)
    )
    assert result.rows[0].verdict is Verdict.HEALTHY
    assert session.model is None and result.loaded is None and result.loaded_request is None


def test_a_fix_applied_from_a_generation_is_stored_as_a_generation_repair():
    session = Session()
    _load(session, "demo-overflow")
    layers = ["vae:decoder.up_blocks.0.resnets.0.conv1"]
    request = RememberFixRequest({"fp32_modules": layers}, "1 VAE layer", "generation")
    summary = jobs.remember_fix(Job(session, request).context, request)
    assert summary.remembered_fix is not None
    [stored] = profiles.stored_fixes().fixes
    assert stored.fix.verified_by == "generation repair"
    # The file reads back whole: the entry is not refused as damage.
    assert profiles.lookup(stored.profile_key, stored.device, stored.torch_version).notes == []


def test_applying_the_fix_a_check_just_remembered_keeps_its_proof_and_its_time():
    """Apply fix on the Health check page sends the fix the check remembered already: the
    entry stays as the check wrote it (its sentence, and the time it was proved), rather than
    being written again at the time of the click."""
    session = Session()
    _load(session, "demo-overflow")
    request = CheckRequest(PrecisionSettings("fp16"), size=64, steps=2)
    report = jobs.check(Job(session, request).context, request).report
    assert report.fix is not None
    [before] = profiles.stored_fixes().fixes
    again = RememberFixRequest(dict(report.fix.settings), "short words", "health check")
    jobs.remember_fix(Job(session, again).context, again)
    [after] = profiles.stored_fixes().fixes
    assert after.fix.saved_at == before.fix.saved_at
    assert after.fix.summary == report.fix.summary


def test_applying_a_fix_keeps_what_the_check_remembered_beside_it():
    """A check run with a remembered VAE fix remembers the UNet's layers with it; Apply fix
    sends the layers alone, which that entry holds: it stays whole (before, it was replaced by
    the layers, the VAE's fix lost)."""
    session = Session()
    _load(session, "demo-overflow")
    model = session.model
    assert model is not None
    device = hardware.describe_device("cpu").name
    layers = ["unet:mid_block.attentions.0.proj_out"]
    held = {"no_half_vae": True, "bf16_modules": layers}
    profiles.remember_fix(model.profile_key, device, held, "both parts", "health check")
    request = RememberFixRequest({"bf16_modules": layers}, "the layers", "health check")
    jobs.remember_fix(Job(session, request).context, request)
    stored = profiles.remembered_fix(model.profile_key, device)
    assert stored is not None and stored.settings == held and stored.summary == "both parts"
