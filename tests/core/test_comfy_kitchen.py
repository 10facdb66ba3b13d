"""comfy-kitchen's fused ops (`app.core.precision.fused`) compared backend by backend with
PyTorch's own on the same fp16 inputs, and named with the tool's switch when a black ComfyUI
image's check runs clean (`app.core.explain.kitchen`), while an overflow the check reproduces in
the same tiny model is still the model's precision fault.

comfy-kitchen is real (the dev extras install it; its `eager` backend is plain PyTorch and runs
on a CPU). The faulty backend is planted through comfy-kitchen's own registry
(`tests.support.kitchen_backends`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.cli import main
from app.core.explain import kernels as explain_kernels
from app.core.explain import kitchen
from app.core.explain.pixels import PixelFigures
from app.core.precision import fused
from tests.support.image_files import comfy_prompt, comfy_workflow, png_text
from tests.support.model_files import save_single_file, save_split_files
from tests.support.planted_sd import plant
from tests.support.tiny_models import build_tiny_flux_pipeline, build_tiny_sd_pipeline

comfy_kitchen = pytest.importorskip("comfy_kitchen")

from tests.support.kitchen_backends import planted_backend  # noqa: E402

THRESHOLD = 20.0


# The comparison ---------------------------------------------------------------------------


def test_the_packages_own_eager_ops_agree_with_pytorchs():
    compared = fused.compare(THRESHOLD)
    eager = [c for c in compared if c.kernel.backend == "eager"]
    assert {c.kernel.op for c in eager} == {op.name for op in fused.OPS}
    assert all(c.finding is None and c.calls == len(fused.SCALES) for c in eager)
    assert fused.at_fault(compared) is None
    assert eager[0].kernel.words() == f"comfy-kitchen {fused.installed()} (eager backend)"


def test_a_backend_giving_nan_is_found_with_its_op_and_backend():
    with planted_backend(("apply_rope1", "rms_adaln")):
        blamed = fused.at_fault(fused.compare(THRESHOLD))
    assert blamed is not None
    assert (blamed.kernel.backend, blamed.finding, blamed.first_bad_call) == (
        "planted",
        "non_finite",
        0,
    )
    assert blamed.kernel.op in ("apply_rope1", "rms_adaln")
    assert blamed.to_json()["dtype"] == "float16"
    # The registry is as it was.
    assert "planted" not in comfy_kitchen.list_backends()
    assert fused.at_fault(fused.compare(THRESHOLD)) is None


def test_a_backend_that_drifts_is_found_below_the_threshold():
    with planted_backend(("apply_rope",), faulty="drift"):
        (blamed,) = [c for c in fused.compare(THRESHOLD) if c.kernel.backend == "planted"]
    assert blamed.finding == "drift" and blamed.worst_snr_db < THRESHOLD


def test_inputs_pytorch_itself_overflows_on_are_not_held_against_a_kernel(monkeypatch):
    """A kernel that gives NaN on the large inputs only is blamed where PyTorch's own is finite
    on them, and not where PyTorch's own overflows there too (the inputs' fault, not the
    kernel's)."""
    rope = next(o for o in fused.OPS if o.name == "apply_rope1")

    def overflowing(**kwargs):
        out = rope.reference(**kwargs)
        return out * float("inf") if float(kwargs["x"].abs().max()) > 1000 else out

    with planted_backend(("apply_rope1",), faulty="nan_large"):
        (judged,) = [c for c in fused.compare(THRESHOLD) if c.kernel.backend == "planted"]
        monkeypatch.setattr(fused, "OPS", (fused.FusedOp("apply_rope1", rope.inputs, overflowing),))
        (spared,) = [c for c in fused.compare(THRESHOLD) if c.kernel.backend == "planted"]
    assert (judged.finding, judged.first_bad_call) == ("non_finite", 1)
    assert spared.finding is None and spared.calls == 2


def test_a_backend_that_cannot_take_the_call_is_left_out(monkeypatch):
    monkeypatch.setattr(fused, "backends", lambda: ["eager", "triton"])
    compared = fused.compare(THRESHOLD)
    assert {c.kernel.backend for c in compared} == {"eager"}


def test_nothing_is_compared_without_the_package(monkeypatch):
    monkeypatch.setattr(fused, "installed", lambda: None)
    assert fused.compare(THRESHOLD) == []
    assert kitchen.examine("comfyui", "flux-dev", "cpu", THRESHOLD).version is None


# The switches ------------------------------------------------------------------------------


def test_each_backend_is_turned_off_in_the_tools_own_terms():
    words = explain_kernels.backend_switch_words
    assert "--enable-triton-backend" in words("comfyui", "comfy-kitchen", "triton")
    assert "--disable-triton-backend" in words("comfyui", "comfy-kitchen", "triton")
    assert "ExtraArgs" in words("swarmui", "comfy-kitchen", "triton")
    assert "CUDA 12" in words("comfyui", "comfy-kitchen", "cuda")
    assert "COMFY_KITCHEN_DISABLE_HIP=1" in words("comfyui", "comfy-kitchen", "hip")
    assert 'disable_backend("planted")' in words("comfyui", "comfy-kitchen", "planted")


# explain: a black ComfyUI image -------------------------------------------------------------


def flux_in_comfy(home: Path, pipeline) -> str:
    """A tiny Flux.1 transformer file with its companions, as ComfyUI keeps them; its name."""
    paths = save_split_files(pipeline, home / "ComfyUI" / "models", name="tinyflux")
    return paths["transformer"].name


def comfy_flux_png(tmp_path: Path, unet_name: str) -> Path:
    prompt = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": unet_name}},
        # The tiny model's own scale: unsized, the check runs at Flux's native 1024 px.
        "2": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64}},
        "3": {
            "class_type": "KSampler",
            "inputs": {"seed": 1, "steps": 4, "cfg": 1.0, "sampler_name": "euler"},
        },
    }
    return png_text(tmp_path / "ComfyUI_00001_.png", {"prompt": json.dumps(prompt)})


def explain_json(image: Path, capsys, code: int) -> dict:
    assert main(["explain", str(image), "--json"]) == code
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_a_clean_check_names_the_faulty_rope_kernel_with_its_switch(tmp_path, home, capsys):
    image = comfy_flux_png(tmp_path, flux_in_comfy(home, build_tiny_flux_pipeline()))
    with planted_backend(("apply_rope1", "adaln")):
        document = explain_json(image, capsys, 1)
    assert document["check"]["verdict"] == "healthy"
    cause = document["cause"]
    assert cause["kind"] == "kernel"
    assert cause["kernel"]["op"] == "apply_rope1"
    assert cause["kernel"]["backend"] == "planted"
    assert cause["kernel"]["finding"] == "non_finite"
    assert 'disable_backend("planted")' in cause["repair"]["words"]
    at_fault = document["fused_kernels"]["at_fault"]
    assert at_fault["op"] == "apply_rope1" and "disable_backend" in at_fault["turn_off"]
    message = document["message"]
    assert "apply_rope1 gives NaN or Inf where PyTorch's own is finite" in message
    assert "not the model or fp16" in message
    # adaln, which ComfyUI's Flux path is not known to call, is a note, not the cause.
    assert any("adaln" in n and "not known to run it" in n for n in document["notes"])


@pytest.mark.slow
def test_an_overflow_in_the_same_model_is_still_the_models_precision(tmp_path, home, capsys):
    pipeline = plant(build_tiny_flux_pipeline(), "vae")
    image = comfy_flux_png(tmp_path, flux_in_comfy(home, pipeline))
    with planted_backend(("apply_rope1",)):
        document = explain_json(image, capsys, 1)
    assert document["check"]["verdict"] == "fixable"
    assert document["check"]["cause"]["kind"] == "precision"
    assert document["check"]["components"]["vae"]["status"] == "overflow"
    assert document["cause"] is None and document["fused_kernels"] is None
    assert "The health check reproduced it" in document["message"]
    assert "comfy-kitchen" not in document["message"]


@pytest.mark.slow
def test_a_clean_check_with_agreeing_kernels_says_they_are_not_the_cause(tmp_path, home, capsys):
    image = comfy_flux_png(tmp_path, flux_in_comfy(home, build_tiny_flux_pipeline()))
    document = explain_json(image, capsys, 1)
    assert document["cause"] is None
    assert document["fused_kernels"]["installed"] is True
    assert document["fused_kernels"]["at_fault"] is None
    assert any("RoPE kernels" in n and "not the cause" in n for n in document["notes"])


@pytest.mark.slow
def test_a_unet_comfyui_image_does_not_run_the_kitchen(tmp_path, home, capsys, healthy_file):
    """ComfyUI's UNets apply no rotary embeddings: a faulty kernel is not theirs."""
    image = comfy_black_png(tmp_path, home, healthy_file)
    with planted_backend(("apply_rope1",)):
        document = explain_json(image, capsys, 1)
    assert document["check"]["verdict"] == "healthy"
    assert document["cause"] is None and document["fused_kernels"] is None
    assert "comfy-kitchen" not in document["message"]


@pytest.fixture(scope="module")
def healthy_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "calm.safetensors"
    return save_single_file(build_tiny_sd_pipeline(), path)


def comfy_black_png(tmp_path: Path, home: Path, model: Path) -> Path:
    folder = home / "ComfyUI" / "models" / "checkpoints"
    folder.mkdir(parents=True)
    shutil.copy(model, folder / model.name)
    return png_text(
        tmp_path / "ComfyUI_00001_.png",
        {"prompt": comfy_prompt(model.name), "workflow": comfy_workflow(model.name)},
    )


def test_only_families_comfyui_runs_rope_through_it_are_compared(monkeypatch):
    monkeypatch.setattr(fused, "installed", lambda: None)
    assert kitchen.examine("comfyui", "flux-dev", "cpu", THRESHOLD) is not None
    assert kitchen.examine("swarmui", "chroma", "cpu", THRESHOLD) is not None
    assert kitchen.examine("comfyui", "sdxl", "cpu", THRESHOLD) is None
    assert kitchen.examine("a1111", "flux-dev", "cpu", THRESHOLD) is None  # A1111 runs none
    assert kitchen.examine("comfyui", None, "cpu", THRESHOLD) is None


def test_the_fields_are_documented():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text(encoding="utf-8")
    for word in ("fused_kernels", "comfy-kitchen", "`backend`", "--enable-triton-backend"):
        assert word in docs


def test_the_findings_cross_to_the_window_as_plain_records():
    """An explanation holding comfy-kitchen's comparison and cause, a second pass and a
    safety checker is read back by the engine's frame reader (HalfSafe's records only)."""
    import io

    from app.core import explain
    from app.core.explain import checkers, regions
    from app.core.explain.matching import ModelMatch
    from app.engine.events import EngineEvent, EventState, encode, read_message

    with planted_backend(("apply_rope1",)):
        finding = kitchen.examine("comfyui", "flux-dev", "cpu", THRESHOLD)
    assert finding is not None and finding.blamed is not None
    record = explain.Record(made_by="comfyui")
    record.second_passes = [regions.SecondPass("FaceDetailer", "bbox/face_yolov8m.pt", 0.5)]
    record.safety_checker = checkers.RecordedChecker("Safety Checker", 0.5)
    result = explain.Explanation(
        "x.png", "comfyui", "nan", record, PixelFigures(), ModelMatch(False, None, [])
    )
    result.kitchen = finding
    result.cause = kitchen.cause(finding, "comfyui", "ComfyUI", "cpu")
    event = EngineEvent(1, "explain", EventState.RESULT, result=result)
    again = read_message(io.BytesIO(encode(event)))
    assert again.result.to_json() == result.to_json()


def test_halfsafe_gpu_says_where_an_installed_comfy_kitchen_runs(home, monkeypatch):
    from app.core import hardware

    notes = hardware.hardware_report(self_test=False).notes
    (said,) = [n for n in notes if n.startswith("comfy-kitchen")]
    assert fused.installed() in said and "HalfSafe's own runs do not use it" in said
    monkeypatch.setattr(fused, "installed", lambda: None)
    notes = hardware.hardware_report(self_test=False).notes
    assert not [n for n in notes if "comfy-kitchen" in n]
