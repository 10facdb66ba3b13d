"""The engine's job loop in-process (fast) and as a real process (queue, cancel, crash)."""

from __future__ import annotations

import io
import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import ClassVar

import pytest

from app.core.components import Verdict
from app.core.generation import GenerationRequest
from app.core.hardware import HardwareReport
from app.core.requests.records import (
    CheckRequest,
    ExplainRequest,
    GenerateRequest,
    HardwareRequest,
    LoadRequest,
    PingRequest,
    RememberFixRequest,
)
from app.core.settings import PrecisionSettings
from app.engine.events import (
    CancelRequest,
    EngineEvent,
    EventState,
    JobRequest,
    ProtocolError,
    encode,
    read_message,
)
from app.engine.failures import describe_exception, describe_exit
from app.engine.jobs import HANDLERS
from app.engine.process import (
    ROOT,
    EngineProcess,
    engine_command,
    engine_python_path,
    log_path,
)
from app.engine.server import Engine
from tests.support import sample_jobs
from tests.support.sample_jobs import Count, Fail, Recall, Remember, Segfault


def _one_sentence(text: str) -> bool:
    return bool(text) and "\n" not in text and text.endswith(".") and "Traceback" not in text


# The event type ------------------------------------------------------------------------------


def test_every_event_state_pickles_cleanly_with_preview_bytes():
    for state in EventState:
        event = EngineEvent(
            7,
            "generate",
            state,
            stage="Denoising",
            done=3,
            total=20,
            message="A sentence.",
            preview_png=b"\x89PNG...",
            result={"images": [{"seed": 1}]},
        )
        again = pickle.loads(pickle.dumps(event))
        assert again == event and again.state is state


def test_frames_round_trip_and_garbage_is_refused():
    stream = io.BytesIO(encode(JobRequest(1, PingRequest())) + encode(CancelRequest(1)))
    assert read_message(stream) == JobRequest(1, PingRequest())
    assert read_message(stream) == CancelRequest(1)
    assert read_message(stream) is None
    with pytest.raises(ProtocolError):
        read_message(io.BytesIO(b"\x05\x00\x00\x00abc"))
    with pytest.raises(ProtocolError):
        read_message(io.BytesIO(encode(JobRequest(1, PingRequest()))[:4] + b"\x80\x04junk"))


# In-process ----------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[EngineEvent] = []
        self.condition = threading.Condition()

    def __call__(self, event: EngineEvent) -> None:
        with self.condition:
            self.events.append(event)
            self.condition.notify_all()

    def wait_final(self, job_id: int, timeout: float = 10.0) -> EngineEvent:
        deadline = time.monotonic() + timeout
        with self.condition:
            while True:
                for event in self.events:
                    if event.job_id == job_id and event.state.final:
                        return event
                left = deadline - time.monotonic()
                assert left > 0, f"job {job_id} did not finish: {self.events}"
                self.condition.wait(left)

    def of(self, job_id: int) -> list[EngineEvent]:
        return [e for e in self.events if e.job_id == job_id]


@pytest.fixture
def engine():
    recorder = Recorder()
    engine = Engine(recorder, {**HANDLERS, **sample_jobs.HANDLERS})
    worker = threading.Thread(target=engine.serve, daemon=True)
    worker.start()
    yield engine, recorder
    engine.stop()
    worker.join(5)


def test_jobs_run_one_at_a_time_in_order(engine):
    engine, events = engine
    for job_id in (1, 2, 3):
        engine.receive(JobRequest(job_id, Count(steps=3, seconds=0.01)))
    for job_id in (1, 2, 3):
        assert events.wait_final(job_id).state == EventState.RESULT
    finals = [e.job_id for e in events.events if e.state.final]
    assert finals == [1, 2, 3]
    # No job started before the one ahead of it ended.
    order = [(e.job_id, e.state) for e in events.events if e.state != EventState.QUEUED]
    current = None
    for job_id, state in order:
        if current is None:
            current = job_id
        assert job_id == current
        if state.final:
            current = None
    assert events.of(1)[0].state == EventState.QUEUED


def test_cancel_reaches_a_running_job_within_a_step(engine):
    engine, events = engine
    engine.receive(JobRequest(1, Count(steps=1000, seconds=0.02)))
    deadline = time.monotonic() + 5
    while not any(e.state == EventState.PROGRESS and e.done >= 2 for e in events.of(1)):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    asked = time.monotonic()
    engine.receive(CancelRequest(1))
    final = events.wait_final(1)
    assert final.state == EventState.CANCELLED
    assert time.monotonic() - asked < 0.5
    steps = [e.done for e in events.of(1) if e.state == EventState.PROGRESS]
    assert max(steps) < 1000


def test_cancel_drops_a_queued_job_without_running_it(engine):
    engine, events = engine
    engine.receive(JobRequest(1, Count(steps=20, seconds=0.02)))
    engine.receive(JobRequest(2, Count(steps=2)))
    engine.receive(CancelRequest(2))
    assert events.wait_final(2).state == EventState.CANCELLED
    assert events.wait_final(1).state == EventState.RESULT
    assert [e.state for e in events.of(2)] == [EventState.QUEUED, EventState.CANCELLED]


@dataclass(frozen=True)
class _Unreadable:
    """A job whose answer the window could not read."""

    kind: ClassVar[str] = "unreadable"


@dataclass(frozen=True)
class _Nonsense:
    """A request no engine has a handler for."""

    kind: ClassVar[str] = "nonsense"


@pytest.mark.parametrize(
    "request_, expected",
    [
        (
            sample_jobs.Fail(),
            "Something went wrong while running the job (ValueError); the details have the "
            "full report.",
        ),
        (sample_jobs.BadFile(), "/models/x.safetensors: the header is cut short."),
        (
            sample_jobs.Oom(),
            "The GPU ran out of memory while running the job; try a smaller image size or "
            "batch, a lower Memory budget in Settings so that large parts stream, or close "
            "other programs that use the GPU.",
        ),
        (
            GenerateRequest(GenerationRequest("a lake")),
            "No model is loaded; load one on the Models page first.",
        ),
        (_Nonsense(), "This engine cannot run 'nonsense' jobs."),
    ],
)
def test_errors_are_one_plain_sentence_with_details_apart(engine, request_, expected):
    engine, events = engine
    kind = request_.kind
    engine.receive(JobRequest(1, request_))
    final = events.wait_final(1)
    assert final.state == EventState.ERROR
    assert final.message == expected
    assert _one_sentence(final.message)
    if kind == "fail":
        assert "Traceback" in final.details and "something internal" in final.details
    elif kind != "oom":
        # An expected error's sentence is all there is to show: no traceback behind "Show
        # Details" that makes it look like a crash (the engine log keeps it).
        assert "Traceback" not in final.details
    # The engine keeps serving after a failed job.
    engine.receive(JobRequest(2, PingRequest()))
    assert events.wait_final(2).state == EventState.RESULT


def test_session_survives_between_jobs(engine):
    engine, events = engine
    engine.receive(JobRequest(1, Remember(value=42)))
    engine.receive(JobRequest(2, Recall()))
    assert events.wait_final(2).result["value"] == 42


def test_exit_descriptions_are_plain_words():
    assert "killed" in describe_exit(-signal.SIGKILL).message
    assert "segmentation fault" in describe_exit(-signal.SIGSEGV).message
    assert "ran out of memory" in describe_exit(1, "RuntimeError: out of memory").message
    assert describe_exit(3).message == "The engine stopped unexpectedly (exit status 3)."
    for code in (-9, -11, -6, 0, 1, 139):
        assert _one_sentence(describe_exit(code).message)
    assert _one_sentence(describe_exception(KeyError("x"), "load").message)


# A real engine process -----------------------------------------------------------------------


class ProcessEvents:
    def __init__(self) -> None:
        self.recorder = Recorder()
        self.exits: list = []
        self.exited = threading.Event()

    def on_exit(self, failure) -> None:
        self.exits.append(failure)
        self.exited.set()


@pytest.fixture
def process():
    engine = EngineProcess(extra_args=["--handlers", "tests.support.sample_jobs"])
    heard = ProcessEvents()
    engine.start(heard.recorder, heard.on_exit)
    yield engine, heard
    engine.stop(timeout=2)


def test_real_process_queues_and_answers(process):
    engine, heard = process
    for job_id in (1, 2):
        engine.send(JobRequest(job_id, Count(steps=2)))
    engine.send(JobRequest(3, PingRequest()))
    assert heard.recorder.wait_final(1, 30).result["counted"] == 2
    assert heard.recorder.wait_final(2, 30).state == EventState.RESULT
    assert heard.recorder.wait_final(3, 30).result["pid"] == engine.pid != os.getpid()


def test_real_process_cancel(process):
    engine, heard = process
    engine.send(JobRequest(1, Count(steps=10_000, seconds=0.01)))
    deadline = time.monotonic() + 30
    while not any(e.state == EventState.PROGRESS and e.done > 0 for e in heard.recorder.of(1)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    engine.send(CancelRequest(1))
    assert heard.recorder.wait_final(1, 10).state == EventState.CANCELLED


def test_real_process_error_event_is_one_sentence(process):
    engine, heard = process
    engine.send(JobRequest(1, Fail()))
    final = heard.recorder.wait_final(1, 30)
    assert final.state == EventState.ERROR and _one_sentence(final.message)
    assert "something internal" in final.details


def test_malformed_jobs_get_an_error_and_the_engine_keeps_running(process):
    """A plain dict or string where a request belongs, as a job's request or as the whole
    frame, or a job without a number: each is answered with an ERROR, and a valid job after them succeeds."""
    engine, heard = process
    engine.send(JobRequest(1, {"source": "model.safetensors"}))  # type: ignore[arg-type]
    engine.send(JobRequest(2, "check"))  # type: ignore[arg-type]
    engine.send({"job_id": 3, "kind": "check"})  # type: ignore[arg-type]
    engine.send("generate")  # type: ignore[arg-type]
    engine.send(JobRequest("5", PingRequest()))  # type: ignore[arg-type]
    engine.send(JobRequest(4, PingRequest()))
    for job_id in (1, 2):
        final = heard.recorder.wait_final(job_id, 30)
        assert final.state == EventState.ERROR and _one_sentence(final.message)
    assert heard.recorder.wait_final(4, 30).result["pid"] == engine.pid
    refused = [e for e in heard.recorder.of(0) if e.state == EventState.ERROR]
    assert len(refused) == 3 and all(_one_sentence(e.message) for e in refused)
    assert engine.running and not heard.exits
    assert "Traceback" not in log_path().read_text()


def test_killed_engine_is_detected_and_described(process):
    engine, heard = process
    engine.send(JobRequest(1, PingRequest()))
    heard.recorder.wait_final(1, 30)
    if sys.platform == "win32":
        engine._process.kill()
    else:
        os.kill(engine.pid, signal.SIGKILL)
    assert heard.exited.wait(10)
    failure = heard.exits[0]
    assert "killed" in failure.message and _one_sentence(failure.message)
    assert not engine.running


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_segfault_is_detected_and_described(process):
    engine, heard = process
    engine.send(JobRequest(1, Segfault()))
    assert heard.exited.wait(20)
    assert "segmentation fault" in heard.exits[0].message
    # faulthandler wrote where it happened into the engine log, shown as details.
    assert "Fatal Python error" in heard.exits[0].details or "Segmentation" in log_path().read_text(
        errors="replace"
    )


def test_asked_stop_is_not_reported_as_a_death():
    engine = EngineProcess()
    heard = ProcessEvents()
    engine.start(heard.recorder, heard.on_exit)
    engine.send(JobRequest(1, PingRequest()))
    heard.recorder.wait_final(1, 30)
    engine.stop(timeout=5)
    assert not engine.running
    assert not heard.exited.wait(0.5)


def test_engine_exits_when_the_gui_goes_away():
    engine = EngineProcess()
    heard = ProcessEvents()
    engine.start(heard.recorder, heard.on_exit)
    engine.send(JobRequest(1, PingRequest()))
    heard.recorder.wait_final(1, 30)
    engine._process.stdin.close()  # what the OS does when the GUI process dies
    assert heard.exited.wait(10)
    assert engine._process.returncode == 0


# The folder the window was started in --------------------------------------------------------


def plant_shadowing_modules(folder, marker) -> None:
    """Modules named as ones the engine imports (its own package, argparse, runpy), each
    writing `marker` when imported: what Python would run first from the working folder."""
    code = f"open({str(marker)!r}, 'a').write(__name__)\n"
    for name in ("argparse.py", "runpy.py", "app/__init__.py", "app/engine/__init__.py"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(code)


@pytest.mark.parametrize(
    "how",
    ["as started", "by another python", "with an empty PYTHONPATH entry"],
)
def test_the_engine_imports_nothing_from_the_folder_it_was_started_in(tmp_path, monkeypatch, how):
    """'as started': -P on Python 3.11+; 'by another python' (whose version is not known):
    the form every Python from 3.10 runs, which takes the folder off sys.path itself; an empty
    entry of the user's PYTHONPATH ("$PYTHONPATH:/x") would name the folder again."""
    started_in, marker = tmp_path / "downloads", tmp_path / "ran"
    started_in.mkdir()
    plant_shadowing_modules(started_in, marker)
    monkeypatch.chdir(started_in)
    if how == "with an empty PYTHONPATH entry":
        monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", "") + os.pathsep)
    python = sys.executable if how == "by another python" else None
    engine = EngineProcess(python=python)
    heard = ProcessEvents()
    engine.start(heard.recorder, heard.on_exit)
    try:
        engine.send(JobRequest(1, PingRequest()))
        final = heard.recorder.wait_final(1, 60)
    finally:
        engine.stop(timeout=5)
    assert final.state == EventState.RESULT and final.result["pid"] == engine.pid
    assert not marker.exists(), marker.read_text()


def test_the_engine_command_leaves_the_working_folder_out_on_every_python(monkeypatch):
    assert engine_command("py", ["--heartbeat", "2.0"], (3, 11)) == [
        "py", "-P", "-m", "app.engine", "--heartbeat", "2.0",
    ]  # fmt: skip
    before_3_11 = engine_command("py", ["--heartbeat", "2.0"], (3, 10))
    assert before_3_11[:2] == ["py", "-c"] and before_3_11[3:] == ["--heartbeat", "2.0"]
    assert "-P" not in before_3_11 and "-m" not in before_3_11
    monkeypatch.setattr(sys, "frozen", True, raising=False)  # the bundle: installer/frozen_entry.py
    assert engine_command("HalfSafe", [], (3, 11)) == ["HalfSafe", "-m", "app.engine"]


def test_the_engine_path_keeps_only_absolute_folders_after_the_apps():
    given = os.pathsep.join(["", "relative", os.path.abspath("x"), ""])
    assert engine_python_path(given).split(os.pathsep) == [str(ROOT), os.path.abspath("x")]
    assert engine_python_path(None) == str(ROOT)


# A failed open keeps the loaded model --------------------------------------------------------


def _unsupported_model(path):
    """A well-formed safetensors file that is no model HalfSafe runs: it opens, then fails."""
    import torch
    from safetensors.torch import save_file

    save_file({"some.layer.weight": torch.zeros(4, 4)}, str(path))
    return path


def _written(path, data: bytes):
    path.write_bytes(data)
    return path


def _folder(path):
    path.mkdir()
    return path


@pytest.mark.parametrize(
    "make, refused_early",
    [
        (lambda d: _written(d / "notes.txt", b"not a model"), True),
        (lambda d: _written(d / "x.safetensors", os.urandom(3000)), True),
        (lambda d: _written(d / "model.ckpt", b"\x80\x04junk"), True),
        (lambda d: _unsupported_model(d / "other.safetensors"), False),
        (lambda d: _folder(d / "empty-folder"), False),
    ],
    ids=["text file", "random bytes", "pickle not allowed", "unsupported model", "empty folder"],
)
def test_a_failed_open_leaves_the_loaded_model_loaded(engine, tmp_path, make, refused_early):
    engine, events = engine
    engine.receive(JobRequest(1, LoadRequest("demo")))
    assert events.wait_final(1, timeout=60).state == EventState.RESULT
    before = engine.session.model

    bad = make(tmp_path)
    engine.receive(JobRequest(2, LoadRequest(str(bad))))
    final = events.wait_final(2, timeout=60)
    assert final.state == EventState.ERROR and _one_sentence(final.message)
    assert str(bad.name) in final.message
    # The engine still holds the demo, and says so with the error.
    assert final.result.model.name == "demo"
    assert final.result.request.source == "demo"
    assert engine.session.model is not None and engine.session.model.source == "demo"
    # A file that cannot even be opened is refused before anything changes; one that fails
    # later is refused after the demo was let go, and the demo is loaded again.
    assert (engine.session.model is before) is refused_early
    engine.receive(JobRequest(3, CheckRequest(PrecisionSettings("fp32"), size=64)))
    assert events.wait_final(3, timeout=120).state == EventState.RESULT


def test_a_fix_applied_from_the_gui_is_remembered_for_the_loaded_model(engine):
    engine, events = engine
    engine.receive(JobRequest(1, LoadRequest("demo-overflow")))
    assert events.wait_final(1, timeout=60).state == EventState.RESULT
    layers = ["vae:decoder.up_blocks.0.resnets.0.conv1", "vae:decoder.up_blocks.0.resnets.0.norm2"]
    remember = RememberFixRequest({"fp32_modules": layers}, summary="2 VAE layers in fp32")
    engine.receive(JobRequest(2, remember))
    final = events.wait_final(2, timeout=60)
    assert final.state == EventState.RESULT
    assert final.result.remembered_fix.settings == {"fp32_modules": layers}
    # The next check runs with it, though the settings name no layers.
    engine.receive(JobRequest(3, CheckRequest(PrecisionSettings("fp16"), size=64)))
    report = events.wait_final(3, timeout=300).result.report
    assert report.remembered == "2 VAE layers in fp32"
    assert report.verdict is Verdict.HEALTHY
    # What the GUI process reads back of each result: only builtins and HalfSafe's records.
    for job_id in (1, 2, 3):
        assert read_message(io.BytesIO(encode(events.wait_final(job_id)))) is not None


def test_a_frame_holding_anything_but_plain_data_is_refused_unbuilt():
    from fractions import Fraction

    frame = encode(EngineEvent(1, "hardware", EventState.RESULT, result={"torch": Fraction(1, 3)}))
    with pytest.raises(ProtocolError, match=r"fractions\.Fraction, not plain data"):
        read_message(io.BytesIO(frame))


def test_a_library_value_in_a_record_is_refused_unbuilt():
    from torch.torch_version import TorchVersion

    # torch's version is a str subclass: in a record, it would import torch in the GUI process.
    report = HardwareReport(halfsafe="0", torch=TorchVersion("2.13.0"), cuda=None, devices=[])
    frame = encode(EngineEvent(1, "hardware", EventState.RESULT, result=report))
    with pytest.raises(ProtocolError, match=r"TorchVersion, not plain data"):
        read_message(io.BytesIO(frame))


def test_every_job_result_crosses_to_the_gui_as_core_records(engine, tmp_path):
    """Each job's real result reads back through the frame reader (which refuses any class
    but builtins and HalfSafe's records) equal to what the engine sent."""
    engine, events = engine
    generation = GenerationRequest("a red cube", steps=2, width=64, height=64, seed=3)
    jobs = [
        HardwareRequest(self_test=False),
        LoadRequest("demo"),
        CheckRequest(PrecisionSettings("fp32"), size=64, steps=2),
        GenerateRequest(replace(generation, output_dir=str(tmp_path))),
    ]
    for job_id, request in enumerate(jobs, start=1):
        engine.receive(JobRequest(job_id, request))
    finals = [events.wait_final(job_id, timeout=300) for job_id in range(1, len(jobs) + 1)]
    assert [f.state for f in finals] == [EventState.RESULT] * len(jobs), finals
    image = finals[-1].result.images[0].path
    engine.receive(JobRequest(9, ExplainRequest(image)))
    finals.append(events.wait_final(9, timeout=300))
    assert finals[-1].state == EventState.RESULT, finals[-1]
    for final in finals:
        again = read_message(io.BytesIO(encode(final)))
        assert isinstance(again, EngineEvent) and again.result == final.result
    kinds = [type(f.result).__name__ for f in finals]
    assert kinds == [
        "HardwareReport",
        "ModelSummary",
        "CheckResult",
        "GenerationResult",
        "Explanation",
    ]


def test_an_answer_the_window_cannot_read_fails_its_job_not_the_engine():
    """A value that is not plain data in a job's result would end the stream (and the window
    would kill the engine): the job ends with an ERROR event instead, a progress stage of
    HalfSafe's own str kind crosses as text, and the next job runs."""
    from fractions import Fraction

    from app.core.health.check import Headline

    def unreadable_result(context, _request):
        context.progress(
            Headline("The VAE went NaN/Inf in fp16; proving a fix against fp32."), 0, 0
        )
        return {"ratio": Fraction(1, 3)}

    recorder = Recorder()
    engine = Engine(recorder, {**HANDLERS, **sample_jobs.HANDLERS, _Unreadable: unreadable_result})
    worker = threading.Thread(target=engine.serve, daemon=True)
    worker.start()
    try:
        engine.receive(JobRequest(1, _Unreadable()))
        engine.receive(JobRequest(2, Count(steps=1, seconds=0.0)))
        failed, then = recorder.wait_final(1), recorder.wait_final(2)
    finally:
        engine.stop()
        worker.join(5)
    assert (failed.state, failed.error_type) == (EventState.ERROR, "UnreadableAnswer")
    assert "Fraction" in failed.details and then.state == EventState.RESULT
    for event in recorder.events:
        again = read_message(io.BytesIO(encode(event)))
        assert again == event
    stages = [e.stage for e in recorder.of(1) if e.state == EventState.PROGRESS]
    assert "The VAE went NaN/Inf in fp16; proving a fix against fp32." in stages
    assert all(type(stage) is str for stage in stages)


def test_every_event_of_explaining_a_black_image_reads_back(engine, tmp_path):
    """Explaining HalfSafe's own black image reruns the check, whose first finding is sent
    before the fixes are proved: every event on the way reads back through the frame
    reader, as the window reads it."""
    engine, events = engine
    black = GenerationRequest(
        "a yellow triangle", steps=2, width=128, height=128, seed=7, output_dir=str(tmp_path)
    )
    engine.receive(JobRequest(1, LoadRequest("demo-overflow")))
    engine.receive(JobRequest(2, GenerateRequest(black, PrecisionSettings("fp16", auto_fix="off"))))
    made = events.wait_final(2, timeout=300)
    assert made.state == EventState.RESULT and made.result.images[0].status == "nan", made
    engine.receive(JobRequest(3, ExplainRequest(made.result.images[0].path)))
    explained = events.wait_final(3, timeout=300)
    assert explained.state == EventState.RESULT, explained
    assert any(
        e.state == EventState.PROGRESS and "proving a fix" in (e.stage or "") for e in events.of(3)
    )
    for event in events.events:
        assert read_message(io.BytesIO(encode(event))) == event


def test_a_cancelled_load_loads_the_previous_model_again():
    """Cancel a load, and the model the user had is loaded back: the reload's progress is no
    cancellation point (it used to raise the same cancel, and the user was left with none)."""
    from app.core.errors import CancelledError
    from app.core.jobs import CancelToken
    from app.core.models import load_model
    from app.engine import jobs
    from app.engine.server import JobContext, Session

    demo = LoadRequest("demo")
    session = Session(model=load_model("demo"), model_request=demo)
    heard: list[EngineEvent] = []
    cancel = CancelToken()
    cancel.cancel()  # the user pressed Cancel as the new load began
    request = LoadRequest("demo-overflow")
    context = JobContext(JobRequest(2, request), session, heard.append, cancel)

    with pytest.raises(CancelledError):
        jobs.load(context, request)

    assert session.model is not None and session.model.source == "demo"
    assert session.model_request == demo
    assert any("Loading demo again" in e.stage for e in heard if e.state == EventState.PROGRESS)


def test_the_check_job_hands_the_request_it_received_whole_to_the_check(monkeypatch):
    """The engine's check job gives the check the very request it received, not a copy rebuilt
    field by field: what the request holds reaches the stage runner though no function in
    between names it (the prompt, a field the request gained after its callers were written,
    and the prompt's CLIP layer)."""
    from app.core.causes import check as attributed
    from app.core.health import check as health_check
    from app.core.jobs import CancelToken
    from app.core.models import load_model
    from app.engine import jobs
    from app.engine.server import JobContext, Session

    checked: list[object] = []
    real_check_loaded = attributed.check_loaded

    def check_loaded(model, *args, **how):
        checked.extend(args)
        return real_check_loaded(model, *args, **how)

    runners: list[tuple[tuple, dict]] = []

    class Runner(health_check.Runner):
        def __init__(self, *args, **kwargs) -> None:
            runners.append((args, kwargs))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(attributed, "check_loaded", check_loaded)
    monkeypatch.setattr(health_check, "Runner", Runner)
    demo = LoadRequest("demo")
    session = Session(model=load_model("demo"), model_request=demo)
    request = CheckRequest(
        PrecisionSettings("fp32"), size=64, steps=2, clip_skip=2, prompt="a red bicycle"
    )
    context = JobContext(JobRequest(2, request), session, lambda event: None, CancelToken())

    result = jobs.check(context, request)

    assert result.report.verdict == "healthy"
    assert len(checked) == 1 and checked[0] is request
    ((args, kwargs),) = runners  # the check's own runner: a healthy check attributes nothing
    assert args[3] == "a red bicycle" and kwargs["clip_skip"] == 2
