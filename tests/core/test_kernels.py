"""Attention kernels HalfSafe does not ship: found without importing them, reported by `gpu`,
turned off by a named attention backend, and, when one replaced PyTorch's SDPA and gives NaN,
compared with PyTorch's math kernel on the same inputs and named as the cause, while a true fp16
overflow in the same model is still `precision`. The kernel is a planted package
(`tests.support.attention_kernels`) patched in the way SageAttention is."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F

from app.core.precision import PrecisionPlan, backend_flags, kernels
from app.core.settings import PrecisionSettings
from tests.support import attention_kernels as planted
from tests.support.image_files import (
    a1111_parameters,
    comfy_prompt,
    comfy_workflow,
    pixels,
    png_text,
)
from tests.support.planted_sd import check_and_attribute, loaded, plant
from tests.support.tiny_models import build_tiny_sd_pipeline

FP16 = PrecisionSettings(precision="fp16")


def qkv(dtype=torch.float16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, 16, 8, generator=generator).to(dtype) for _ in range(3)]


# --- detection --------------------------------------------------------------------------------


def test_an_installed_kernel_is_listed_with_its_version_without_being_imported(tmp_path):
    # A package that would fail loudly if imported: detection must read only its metadata.
    planted.write_distribution(
        tmp_path, "sageattention", "2.1.1", {"__init__.py": "raise RuntimeError('imported')\n"}
    )
    with planted.on_path(tmp_path):
        found = {k.name: k for k in kernels.installed_kernels()}
        assert "sageattention" not in sys.modules
    sage = found["sageattention"]
    assert sage.words() == "sageattention 2.1.1"
    assert not sage.patched_sdpa and sage.function is None
    assert sage.to_json() == {
        "name": "sageattention",
        "version": "2.1.1",
        "patched_sdpa": False,
        "function": None,
        "diffusers_backend": None,
        "op": "scaled_dot_product_attention",
        "backend": None,
    }
    assert "sageattention" not in {k.name for k in kernels.installed_kernels()}  # gone again


def test_a_replaced_sdpa_is_named_after_the_library_it_comes_from(tmp_path):
    assert kernels.patched_sdpa() is None  # PyTorch's own here
    with planted.patched_in(tmp_path):
        found = kernels.patched_sdpa()
        listed = {k.name: k for k in kernels.installed_kernels()}
    assert found is not None and found.words() == "quantattn 0.3.0"
    assert found.patched_sdpa and found.function == "quantattn.core.quant_attention"
    assert listed["quantattn"] == found
    assert F.scaled_dot_product_attention is kernels.torch_sdpa()  # restored
    assert kernels.patched_sdpa() is None


def test_diffusers_backend_from_the_environment_is_listed(monkeypatch):
    monkeypatch.setenv(kernels.DIFFUSERS_BACKEND_ENV, "sage")
    listed = {k.name: k for k in kernels.installed_kernels()}
    assert listed["sageattention"].diffusers_backend == "sage"
    monkeypatch.setenv(kernels.DIFFUSERS_BACKEND_ENV, "native")
    assert all(k.diffusers_backend is None for k in kernels.installed_kernels())


def test_gpu_report_lists_the_kernels_in_json_and_notes(tmp_path):
    from app.cli.text import hardware_text
    from app.core.hardware import hardware_report

    with planted.patched_in(tmp_path):
        report = hardware_report(self_test=False)
    document = report.to_json()
    entry = next(k for k in document["attention_kernels"] if k["name"] == "quantattn")
    assert entry["version"] == "0.3.0" and entry["patched_sdpa"] is True
    text = hardware_text(report)
    assert "Attention kernel quantattn 0.3.0 has replaced PyTorch's" in text


# --- turning it off, and the comparison ------------------------------------------------------


def test_a_named_backend_runs_pytorchs_own_sdpa_and_puts_the_replacement_back(tmp_path):
    with planted.patched_in(tmp_path) as module:
        q, k, v = qkv()
        with backend_flags(PrecisionPlan(device="cpu", dtypes={}, attention_backend="auto")):
            assert F.scaled_dot_product_attention is module.quant_attention
            assert torch.isnan(F.scaled_dot_product_attention(q, k, v)).all()
        for backend in ("math", "classic"):
            with backend_flags(PrecisionPlan(device="cpu", dtypes={}, attention_backend=backend)):
                assert torch.isfinite(F.scaled_dot_product_attention(q, k, v)).all()
            assert F.scaled_dot_product_attention is module.quant_attention


def test_the_comparison_finds_nan_and_drift_and_clears_an_honest_kernel(tmp_path):
    q, k, v = qkv()
    with planted.patched_in(tmp_path) as module:
        suspect = kernels.patched_sdpa()
        assert suspect is not None
        with kernels.comparing(suspect, 20.0) as nan_run:
            out = F.scaled_dot_product_attention(q, k, v)
        assert torch.isfinite(out).all()  # the run goes on with the math kernel's answer
        assert nan_run.finding == "non_finite" and nan_run.first_bad_call == 0
        assert nan_run.shape == [1, 2, 16, 8] and nan_run.dtype == "float16"
        assert F.scaled_dot_product_attention is module.quant_attention

    def noisy(query, key, value, *args, **kwargs):  # right in shape, wrong in value: ~6 dB
        out = kernels.torch_sdpa()(query, key, value, *args, **kwargs)
        return out + 0.5 * out.abs().mean() * torch.ones_like(out)

    F.scaled_dot_product_attention = noisy
    try:
        drifting = kernels.AttentionKernel("noisy")
        with kernels.comparing(drifting, 20.0) as drift_run:
            F.scaled_dot_product_attention(q, k, v)
            F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    finally:
        F.scaled_dot_product_attention = kernels.torch_sdpa()
    assert drift_run.calls == 2 and drift_run.finding == "drift"
    assert drift_run.worst_snr_db < 20.0

    with planted.patched_in(tmp_path / "honest", faulty=False):
        suspect = kernels.patched_sdpa()
        assert suspect is not None
        with kernels.comparing(suspect, 20.0) as honest_run:
            F.scaled_dot_product_attention(q, k, v)
    assert honest_run.calls == 1 and honest_run.finding is None


# --- the check ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_replaced_sdpa_that_gives_nan_in_fp16_is_named_as_the_kernel_cause(tmp_path):
    with planted.patched_in(tmp_path) as module:
        report = check_and_attribute(loaded(build_tiny_sd_pipeline(), "planted-kernel"))
        still = F.scaled_dot_product_attention
    cause = report.cause

    assert still is module.quant_attention  # the check put the user's kernel back
    assert F.scaled_dot_product_attention is kernels.torch_sdpa()
    assert cause is not None and cause.kind == "kernel"
    assert cause.kernel is not None and cause.kernel.kernel.words() == "quantattn 0.3.0"
    assert cause.kernel.comparison.finding == "non_finite"
    assert cause.action == "switch_backend" and cause.verified and cause.quality.passed
    backend = cause.settings["attention_backend"]
    assert backend in ("classic", "math")
    assert cause.repair == f"turn off quantattn 0.3.0: use the {backend} attention backend"
    assert "quantattn 0.3.0" in report.headline and "turn quantattn off" in report.headline
    assert report.verdict == "fixable" and report.fix.settings == {"attention_backend": backend}
    document = report.to_json()["cause"]
    assert document["kind"] == "kernel"
    assert document["kernel"]["words"] == "quantattn 0.3.0"
    assert (document["kernel"]["name"], document["kernel"]["version"]) == ("quantattn", "0.3.0")
    assert document["kernel"]["patched_sdpa"] is True
    assert document["kernel"]["finding"] == "non_finite"
    assert document["kernel"]["comparison"]["dtype"] == "float16"

    from app.cli.text import health_text

    text = health_text(report)
    assert "Cause:   kernel (quantattn 0.3.0), a kernel fault, not the model;" in text
    assert "repair: turn off quantattn" in text


@pytest.mark.slow
@pytest.mark.parametrize("faulty", [True, False], ids=["nan-kernel", "honest-kernel"])
def test_a_true_fp16_overflow_with_a_replaced_sdpa_is_still_precision(tmp_path, faulty):
    pipeline = plant(build_tiny_sd_pipeline(), "unet_ff")  # a UNet layer scaled past 65504
    with planted.patched_in(tmp_path, faulty=faulty):
        report = check_and_attribute(loaded(pipeline, "overflow-with-kernel"))
    cause = report.cause

    assert report.components["unet"].status == "overflow"
    assert cause is not None and cause.kind == "precision" and cause.kernel is None
    assert report.to_json()["cause"]["kernel"] is None
    assert "quantattn" not in report.headline
    # The faulty kernel is still named, as a note: turning it off alone is not enough here.
    named = [n for n in report.notes if "quantattn 0.3.0 gives NaN" in n]
    assert len(named) == (1 if faulty else 0)


@pytest.mark.slow
def test_generation_compares_the_kernel_before_it_believes_a_precision_repair(tmp_path):
    from app.core import generation
    from app.core.fixing import profiles

    request = generation.GenerationRequest(
        prompt="a red cube", steps=2, width=64, height=64, seed=5, output_dir=str(tmp_path)
    )
    model = loaded(build_tiny_sd_pipeline(), "kernel-generation")
    with planted.patched_in(tmp_path / "site") as module:
        result = generation.generate(
            model, request, precision=PrecisionSettings(precision="fp16"), device="cpu"
        )
        still = F.scaled_dot_product_attention
    (image,) = result.images

    assert still is module.quant_attention  # the user's kernel is put back after the job
    assert image.status == "fixed" and image.non_finite == 0.0
    assert image.cause == "kernel", image.message
    backend = image.fix["attention_backend"] if image.fix else None
    assert backend in ("classic", "math")
    assert image.fix == {"attention_backend": backend}  # no component widened
    assert "quantattn 0.3.0" in image.message
    # Remembered is the switch, never the precision repair the kernel's NaN would have cost.
    remembered = profiles.remembered_fix("kernel-generation", result.device.name)
    assert remembered is not None and remembered.settings == {"attention_backend": backend}


# --- explain: what other tools record ------------------------------------------------------


def sage_prompt(mode: str = "auto") -> str:
    """A ComfyUI API prompt whose model passes through KJNodes' Patch Sage Attention KJ."""
    nodes = json.loads(comfy_prompt("wan_like.safetensors"))
    nodes["9"] = {
        "class_type": "PathchSageAttentionKJ",
        "inputs": {"model": ["4", 0], "sage_attention": mode, "allow_compile": False},
    }
    nodes["3"]["inputs"]["model"] = ["9", 0]
    return json.dumps(nodes)


def sage_workflow(*nodes: dict) -> str:
    workflow = json.loads(comfy_workflow("wan_like.safetensors"))
    workflow["nodes"].extend(nodes)
    return json.dumps(workflow)


def test_explain_names_a_sage_node_as_the_suspect_with_comfyuis_switch(tmp_path, home, capsys):
    from app.cli import main

    image = png_text(tmp_path / "ComfyUI_00001_.png", {"prompt": sage_prompt()}, pixels("zero"))

    assert main(["explain", str(image), "--json"]) == 1  # NaN-black; its model is not here
    document = json.loads(capsys.readouterr().out)
    recorded = {"kernel": "sageattention", "node": "PathchSageAttentionKJ", "mode": "auto"}
    assert document["record"]["attention_kernels"] == [recorded]
    (suspect,) = document["suspects"]
    assert {k: suspect[k] for k in recorded} == recorded
    assert "sage_attention to disabled" in suspect["turn_off"]
    assert "--use-sage-attention" in suspect["turn_off"]
    note = next(n for n in document["notes"] if "SageAttention" in n)
    assert "PathchSageAttentionKJ (auto)" in note and "generate the image again" in note


@pytest.mark.parametrize(
    ("node", "found"),
    [
        (
            {
                "id": 9,
                "type": "PathchSageAttentionKJ",
                "mode": 0,
                "widgets_values": ["auto", False],
            },
            "auto",
        ),
        (
            {
                "id": 9,
                "type": "PathchSageAttentionKJ",
                "mode": 0,
                "widgets_values": ["sageattn_qk_int8_pv_fp8_cuda", False],
            },
            "sageattn_qk_int8_pv_fp8_cuda",
        ),
        ({"id": 9, "type": "PathchSageAttentionKJ", "mode": 4, "widgets_values": ["auto"]}, None),
        (
            {"id": 9, "type": "PathchSageAttentionKJ", "mode": 0, "widgets_values": ["disabled"]},
            None,
        ),
        (
            {
                "id": 9,
                "type": "DiffusionModelLoaderKJ",
                "mode": 0,
                "widgets_values": ["wan.safetensors", "default", "default", False, "auto", False],
            },
            "auto",
        ),
        (
            {
                "id": 9,
                "type": "DiffusionModelLoaderKJ",
                "mode": 0,
                "widgets_values": ["wan.safetensors", "default", "default", False, "disabled"],
            },
            None,
        ),
        (
            {"id": 9, "type": "SageAttention3Patch", "mode": 0, "widgets_values": [False, True]},
            None,
        ),
        ({"id": 9, "type": "SageAttention3Patch", "mode": 0, "widgets_values": [True, True]}, True),
    ],
)
def test_a_workflow_records_the_sage_nodes_that_ran(tmp_path, node, found):
    from app.core import explain

    image = png_text(tmp_path / "wf.png", {"workflow": sage_workflow(node)}, pixels("noise"))
    record, _, _ = explain.read_image(image)
    assert record.made_by == "comfyui"
    if found is None:
        assert record.attention == []
    else:
        (recorded,) = record.attention
        assert recorded.kernel == "sageattention" and recorded.node == node["type"]
        assert recorded.mode == (None if found is True else found)


def test_tools_that_record_no_kernel_are_not_claimed_to(tmp_path):
    from app.core import explain

    parameters = a1111_parameters("sd15", "0123456789", version="f2.0.1v1.10.1")
    image = png_text(tmp_path / "forge.png", {"parameters": parameters}, pixels("noise"))
    record, _, _ = explain.read_image(image)
    assert record.made_by == "forge" and record.attention == []
    disabled = png_text(tmp_path / "off.png", {"prompt": sage_prompt("disabled")}, pixels("noise"))
    assert explain.read_image(disabled)[0].attention == []


def test_the_kernel_fields_are_documented():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    docs = (root / "docs" / "json.md").read_text(encoding="utf-8")
    for word in ("`attention_kernels`", "`patched_sdpa`", "record.attention_kernels", "`suspects`"):
        assert word in docs
    assert "| `kernel` | object or null |" in docs
    assert "attention_kernels" in (root / "docs" / "cli.md").read_text(encoding="utf-8")
