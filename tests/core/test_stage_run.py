"""The one stage runner: the check and generation run every stage through
`run.stage_run.running` (placed there, under the plan's flags and inference mode there, their
hooks attached in one set), and a stage that raises or is cancelled leaves nothing behind."""

from __future__ import annotations

import ast
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import app
from app.core import health, work
from app.core.errors import CancelledError
from app.core.generation import GenerationRequest, generate
from app.core.health import stages
from app.core.health.request import CheckRequest
from app.core.jobs import CancelToken
from app.core.models import load_model
from app.core.precision import PlacedPipeline, PrecisionPlan
from app.core.run import stage_run
from app.core.run.probe import ActivationRecorder
from app.core.settings import PrecisionSettings
from tests.support.tiny_models import build_tiny_sd_pipeline

CORE = Path(app.__file__).parent / "core"
# The packages whose stages run through the runner, and the files whose hooks were written out
# by hand before it.
STAGE_PACKAGES = ("health", "generation")
HOOKED_FILES = ("health/stages.py", "generation/stages.py", "generation/probes.py")
HOOK_CALLS = {"register_forward_hook", "register_forward_pre_hook"}


def stage_entries(source: str, hooks: bool = False) -> list[str]:
    """Where `source` runs a stage by hand, one `line: what` each: it enters the plan's backend
    flags or inference mode, places a stage's components (`placed.apply`), makes the pipeline
    twin (`placed.pipeline()`), or (`hooks`) registers a forward hook outside a `Hooks` set."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        owner = func.value if isinstance(func, ast.Attribute) else None
        on_placed = isinstance(owner, (ast.Attribute, ast.Name)) and (
            owner.attr if isinstance(owner, ast.Attribute) else owner.id
        ) in ("placed", "_placed")
        if (
            name in ("backend_flags", "inference_mode")
            or (on_placed and name in ("apply", "pipeline"))
            or (hooks and name in HOOK_CALLS)
        ):
            found.append(f"{node.lineno}: {name}")
    return found


def test_the_checker_finds_a_stage_run_by_hand():
    planted = (
        "import torch\n"
        "def stage(self, plan, block):\n"
        "    self.placed.apply(plan, ['vae'])\n"
        "    pipe = self.placed.pipeline()\n"
        "    with backend_flags(plan), torch.inference_mode():\n"
        "        block.register_forward_hook(print)\n"
        "        block.register_forward_pre_hook(print)\n"
    )
    assert stage_entries(planted, hooks=True) == [
        "3: apply",
        "4: pipeline",
        "5: backend_flags",
        "5: inference_mode",
        "6: register_forward_hook",
        "7: register_forward_pre_hook",
    ]
    assert stage_entries(planted) == stage_entries(planted, hooks=True)[:4]
    # The runner itself is where they are (`placed` by its parameter's name).
    runner = (CORE / "run" / "stage_run.py").read_text()
    assert {e.split(": ")[1] for e in stage_entries(runner)} == {
        "apply",
        "pipeline",
        "backend_flags",
        "inference_mode",
    }


def test_the_check_and_generation_run_stages_only_through_the_runner():
    by_hand = {}
    for package in STAGE_PACKAGES:
        for path in sorted((CORE / package).rglob("*.py")):
            relative = path.relative_to(CORE).as_posix()
            found = stage_entries(path.read_text(), hooks=relative in HOOKED_FILES)
            if found:
                by_hand[relative] = found
    assert by_hand == {}


def _hooks_of(modules) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every module's forward hooks and pre-hooks, by their handles' ids (the test guard's
    against an unplaced component running, `tests/core/conftest.py`, left out)."""

    def ours(hooks) -> tuple[int, ...]:
        return tuple(k for k, fn in hooks.items() if getattr(fn, "__name__", "") != "refuse")

    return {
        id(m): (ours(m._forward_hooks), ours(m._forward_pre_hooks))
        for module in modules
        for m in module.modules()
    }


def _flags() -> tuple[object, ...]:
    matmul = torch.backends.cuda.matmul
    return (
        matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        matmul.allow_fp16_reduced_precision_reduction,
        torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed(),
    )


def _set_flags(flags: tuple[Any, ...]) -> None:
    matmul = torch.backends.cuda.matmul
    matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags[0], flags[1]
    matmul.allow_fp16_reduced_precision_reduction = flags[2]
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(flags[3])


@pytest.fixture
def ambient_flags():
    """Process flags unlike every plan's below, put back after the test."""
    before = _flags()
    _set_flags((False, False, False, False))
    yield (False, False, False, False)
    _set_flags(before)


PLAN_FLAGS = {
    "allow_tf32": True,
    "fp16_reduced_precision_reduction": True,
    "attention_reduced_precision": True,
}


class _Failed(Exception):
    pass


def test_a_stage_that_raises_leaves_no_hook_and_the_flags_restored(ambient_flags):
    pipeline = build_tiny_sd_pipeline()
    plan = PrecisionPlan("cpu", {"text_encoder": "fp16", "unet": "fp16", "vae": "fp16"})
    plan = replace(plan, **PLAN_FLAGS)
    placed = PlacedPipeline(pipeline, plan, components=())
    with stage_run.running(placed, plan, ["vae"]):
        pass  # placed: the hooks its copy keeps (input casts) are the baseline
    vae = placed["vae"]
    before = _hooks_of([vae, pipeline.vae])
    inside = {}
    with pytest.raises(_Failed), stage_run.running(placed, plan, ["vae"]) as stage:
        assert stage.pipe.vae is vae  # the twin runs the placed copy
        stage.watching(ActivationRecorder(vae))
        stage.hooks.around(vae.decoder, lambda *_: None, lambda *_: None)
        inside = {
            "hooks": _hooks_of([vae]) != before,
            "flags": _flags(),
            "inference": torch.is_inference_mode_enabled(),
        }
        raise _Failed
    assert inside == {"hooks": True, "flags": (True, True, True, True), "inference": True}
    assert _hooks_of([vae, pipeline.vae]) == before
    assert _flags() == ambient_flags and not torch.is_inference_mode_enabled()
    assert not any(hasattr(m, ActivationRecorder.SCORES) for m in vae.modules())


def test_a_check_stage_that_fails_leaves_its_watchers_off(ambient_flags):
    """The check's recorders, timers and stop leave with a stage whose run raised (latents the
    VAE cannot read)."""
    from tests.support.planted_sd import loaded

    model = loaded(build_tiny_sd_pipeline())
    plan = PrecisionPlan("cpu", {"text_encoder": "fp16", "unet": "fp16", "vae": "fp16"})
    runner = stages.Runner(model, plan, 64, "a cat", 4, "euler")
    runner.decode(plan, torch.zeros(1, 4, 8, 8))
    before = _hooks_of([runner.placed["vae"]])
    with pytest.raises(RuntimeError):
        runner.decode(plan, torch.zeros(1, 3, 8, 8))  # 3 channels where the VAE reads 4
    assert _hooks_of([runner.placed["vae"]]) == before
    assert _flags() == ambient_flags and not torch.is_inference_mode_enabled()


def test_a_cancelled_generation_leaves_no_hook_and_the_flags_restored(ambient_flags, tmp_path):
    """The NaN watch's hooks, on the denoiser while it runs, leave with a job cancelled in its
    denoising loop; the process flags are back as they were."""
    model = load_model("demo")
    pipeline = model.pipeline
    components = [pipeline.text_encoder, pipeline.unet, pipeline.vae]
    settings = PrecisionSettings(precision="fp32", fp16_reduced_precision_reduction=True)
    request = GenerationRequest(
        prompt="a red circle", steps=4, width=64, height=64, seed=1, output_dir=str(tmp_path)
    )
    generate(model, request, precision=settings, device="cpu")  # fp32 on the CPU: placed as loaded
    before = _hooks_of(components)
    token = CancelToken()
    seen = {}

    def progress(stage, step, total):
        if stage == "Generating" and step == 2:
            seen.update(hooks=_hooks_of([pipeline.unet]) != before, reduced=_flags()[2])
            token.cancel()

    with pytest.raises(CancelledError):
        generate(
            model, request, precision=settings, device="cpu", on_progress=progress, cancel=token
        )
    assert seen == {"hooks": True, "reduced": True}  # the watch attached, the plan's flags on
    assert _hooks_of(components) == before
    assert _flags() == ambient_flags and not torch.is_inference_mode_enabled()


@pytest.fixture
def placements(monkeypatch):
    """Each `PlacedPipeline.apply` that places components, with whether the stage runner made it
    (the calling frame's file)."""
    made: list[tuple[tuple[str, ...], bool]] = []
    apply = PlacedPipeline.apply

    def spied(self, plan, components=None):
        caller = Path(sys._getframe(1).f_code.co_filename).name
        if components is None or len(components):
            made.append((tuple(components or plan.dtypes), caller == "stage_run.py"))
        return apply(self, plan, components)

    monkeypatch.setattr(PlacedPipeline, "apply", spied)
    return made


def test_the_check_and_a_generation_place_through_the_same_runner(placements, tmp_path):
    model = load_model("demo")
    report = health.check_loaded(
        model, CheckRequest(precision=PrecisionSettings(precision="fp16"), device="cpu", size=64)
    )
    checked = list(placements)
    placements.clear()
    request = GenerationRequest(
        prompt="a red circle", steps=2, width=64, height=64, seed=1, output_dir=str(tmp_path)
    )
    with work.counting() as generated:
        generate(model, request, precision=PrecisionSettings(precision="fp16"), device="cpu")
    # A healthy check: the text encoder, the denoiser, the VAE, one stage each; a generation of
    # one image the same three.
    assert [names for names, _ in checked] == [("text_encoder",), ("unet",), ("vae",)]
    assert [names for names, _ in placements] == [("text_encoder",), ("unet",), ("vae",)]
    assert all(by_runner for _, by_runner in checked + placements)
    assert report.verdict == "healthy" and report.work is not None
    assert report.work.stage_runs == 3 == generated.stage_runs
    assert report.work.placements <= 3 and generated.placements <= 3


def test_the_check_and_a_generation_encode_a_picture_through_the_same_code(tmp_path, monkeypatch):
    """An inpainting job's picture and its picture with the hole reach the VAE's encoder
    through `run.pictures.encoded` alone, from the check and from a generation alike."""
    import numpy as np
    from PIL import Image

    from app.core.run import pictures as picture_parts

    rng = np.random.RandomState(0)
    image, mask = tmp_path / "input.png", tmp_path / "mask.png"
    Image.fromarray((rng.rand(64, 64, 3) * 255).astype(np.uint8)).save(image)
    hole = np.zeros((64, 64), np.uint8)
    hole[16:48, 16:48] = 255
    Image.fromarray(hole).save(mask)
    calls: list[int] = []
    real = picture_parts.encoded

    def spied(*args, **kwargs):
        parts = real(*args, **kwargs)
        calls.append(len(parts))
        return parts

    monkeypatch.setattr(picture_parts, "encoded", spied)
    model = load_model("demo")
    fp32 = PrecisionSettings(precision="fp32")
    health.check_loaded(
        model,
        CheckRequest(precision=fp32, device="cpu", size=64, images=(str(image),), mask=str(mask)),
    )
    checked = list(calls)
    calls.clear()
    request = GenerationRequest(
        prompt="a red circle",
        steps=2,
        width=64,
        height=64,
        seed=1,
        images=[str(image)],
        mask=str(mask),
        strength=0.5,
        output_dir=str(tmp_path / "out"),
    )
    generate(model, request, precision=fp32, device="cpu")
    assert checked and set(checked) == {2}  # the picture and the picture with its hole
    assert calls == [2]
