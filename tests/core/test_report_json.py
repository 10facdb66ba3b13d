"""The `--json` objects of `check` and `generate` are a contract other tools read
(docs/json.md): which model, which device and what the fix costs keep their keys, their order
and their values byte for byte, however the records behind them are built.

The check and the generation are real runs of the built-in demo on the CPU; the fixture pins
the figures of a GPU check (peak memory measured), which a CPU run cannot give. The records
behind those objects cross from the engine to the window as themselves.
"""

from __future__ import annotations

import io
import json
import types
from dataclasses import replace

import pytest

from app.cli import main
from app.core import hardware, health
from app.core.health import FixCost
from app.core.identities import DeviceIdentity, ModelIdentity
from app.core.lora.files import read_lora
from app.core.models import load_model
from app.engine.events import EngineEvent, EventState, encode, read_message
from tests.support import reports
from tests.support.lora_files import kohya_lora, save_lora

CHECK_KEYS = [
    "halfsafe",
    "model",
    "device",
    "tested",
    "tested_layers",
    "weights",
    "components",
    "verdict",
    "headline",
    "fix",
    "advice",
    "cause",
    "loras",
    "remembered",
    "seconds",
    "size",
    "mode",
    "pictures",
    "memory",
    "work",
    "timesteps",
    "notes",
    "versions",
    "low_bit_kernels",
]
GENERATION_KEYS = [
    "halfsafe",
    "images",
    "settings",
    "seconds",
    "model",
    "device",
    "mode",
    "pictures",
    "canvas",
    "clip_skip",
    "hires",
    "step_cache",
    "prompt_cache",
    "warnings",
    "memory",
    "fix_for_job",
    "upsampled_prompt",
]
STEP_COST_KEYS = [
    "component",
    "step_ms",
    "step_ms_range",
    "unet_step_ms",
    "unet_step_ms_range",
    "rounds",
    "peak_memory_mb",
    "weights_mb",
]


def _cpu_json() -> str:
    name = hardware.describe_device(hardware.pick_device("cpu")).name
    return json.dumps({"kind": "cpu", "name": name})


def _run(capsys, *argv: str) -> tuple[int, dict]:
    status = main([*argv, "--device", "cpu", "--json"])
    return status, json.loads(capsys.readouterr().out)


def test_a_real_checks_model_device_and_fix_cost_keep_their_json(capsys):
    status, document = _run(capsys, "check", "demo-overflow", "--precision", "fp16", "--size", "64")

    assert status == 1 and document["verdict"] == "fixable"
    assert list(document) == CHECK_KEYS
    assert (document["mode"], document["pictures"]) == ("txt2img", [])
    assert json.dumps(document["model"]) == (
        '{"source": "demo-overflow", "format": "demo", "architecture": "sd1", '
        '"name": "demo-overflow", "prediction": {"type": "v_prediction", '
        '"zero_terminal_snr": false, "because": ""}, "quantization": null, "companions": {}}'
    )
    assert json.dumps(document["device"]) == _cpu_json()
    cost = document["fix"]["cost"]
    assert list(cost) == ["fix", "no_half", "no_half_placed", "summary"]
    for step in (cost["fix"], cost["no_half"]):
        assert list(step) == STEP_COST_KEYS
        low, high = step["step_ms_range"]
        assert low <= step["step_ms"] <= high
        assert step["rounds"] == health.COST_ROUNDS
        assert step["peak_memory_mb"] is None  # a CPU reports no peak
        assert isinstance(step["weights_mb"], float)
    assert cost["fix"]["weights_mb"] < cost["no_half"]["weights_mb"]
    # demo-overflow's VAE overflows: its fix is priced by the VAE's decode.
    assert cost["fix"]["component"] == "vae" and cost["fix"]["unet_step_ms"] is None
    assert cost["summary"].startswith("Per VAE decode the fix")


def test_a_real_generations_model_and_device_keep_their_json(capsys, tmp_path):
    pipeline = load_model("demo").pipeline
    lora = save_lora(kohya_lora(pipeline, scale=0.05), tmp_path / "ink.safetensors")
    status, document = _run(
        capsys,
        "generate",
        "demo",
        "--prompt",
        "a red circle on a blue background",
        "--steps",
        "2",
        "--width",
        "64",
        "--height",
        "64",
        "--seed",
        "7",
        "--lora",
        f"{lora}:0.5",
        "--out",
        str(tmp_path / "out"),
    )

    assert status == 0
    assert list(document) == GENERATION_KEYS
    applied = {
        "name": "ink",
        "path": str(lora),
        "weight": 0.5,
        "hash": read_lora(lora).short_hash,
        "non_finite": [],
        "absurd": [],
    }
    assert json.dumps(document["model"]) == json.dumps(
        {"source": "demo", "name": "demo", "architecture": "sd1", "hash": None, "loras": [applied]}
    )
    assert json.dumps(document["device"]) == _cpu_json()


@pytest.mark.parametrize("report", [reports.fixable, reports.islands])
def test_a_gpu_checks_device_and_fix_cost_keep_their_json(report):
    document = report().to_json()

    assert list(document) == CHECK_KEYS
    assert json.dumps(document["device"]) == ('{"kind": "cuda", "name": "NVIDIA GeForce RTX 3060"}')
    assert json.dumps(document["fix"]["cost"]) == (
        '{"fix": {"component": "unet", "step_ms": 61.0, "step_ms_range": [59.5, 63.0], '
        '"unet_step_ms": 61.0, "unet_step_ms_range": [59.5, 63.0], "rounds": 5, '
        '"peak_memory_mb": 7100.0, "weights_mb": 5300.0}, '
        '"no_half": {"component": "unet", "step_ms": 118.0, "step_ms_range": [116.0, 121.5], '
        '"unet_step_ms": 118.0, "unet_step_ms_range": [116.0, 121.5], "rounds": 5, '
        '"peak_memory_mb": 12900.0, "weights_mb": 10500.0}, "no_half_placed": "as_generated", '
        '"summary": "Per UNet step the fix was 1.9x as fast as no-half. The fix leaves the '
        "denoiser as your settings run it, so these step times compare that with fp32, not the "
        "fix's own cost.\"}"
    )


def test_which_model_which_device_and_the_cost_cross_to_the_window_as_records():
    """The engine's frame reader builds only builtins and HalfSafe's records: a check and a
    generation arrive with their model, device and cost typed, equal to what was sent."""
    check = reports.result(reports.islands())
    made = reports.generation({"images": [reports.image("/out/00001-1234.png")]})
    for result in (check, made):
        event = EngineEvent(1, "check", EventState.RESULT, result=result)
        assert read_message(io.BytesIO(encode(event))) == event
    assert isinstance(check.report.model, ModelIdentity)
    assert isinstance(made.device, DeviceIdentity)
    assert isinstance(check.report.fix.cost, FixCost)


def test_the_cost_reads_as_one_line_per_plan():
    cost = reports.vae_fp32_fix().cost
    assert cost is not None
    assert health.cost_words(cost.fix) == (
        "61.0 ms per UNet step (59.5-63.0 over 5 runs), 7100 MB peak, 5300 MB of weights"
    )
    on_a_cpu = replace(cost.no_half, peak_memory_mb=None)
    assert health.cost_words(on_a_cpu) == (
        "118.0 ms per UNet step (116.0-121.5 over 5 runs), 10500 MB of weights"
    )


def test_a_fix_identical_to_fp32_is_said_identical_in_its_table_not_200_db():
    from app.core.fixing.quality import QUALITY_CEILING_DB, Quality
    from app.core.health.words import candidate_rows

    assert Quality(QUALITY_CEILING_DB).figure() == "identical"
    assert Quality(47.3).figure() == "47.3 dB"
    row = types.SimpleNamespace(
        component="vae",
        words="run the VAE in fp32",
        modules=0,
        quality=Quality(QUALITY_CEILING_DB),
        verified=True,
        chosen=True,
        finite=True,
        cost=None,
    )
    (shown,) = candidate_rows([row], {})
    assert shown[3] == "identical"
