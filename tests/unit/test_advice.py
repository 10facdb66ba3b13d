"""`halfsafe advise FAMILY`: for each stored form a family is published in, what this device
does with it, what it needs on the card and in RAM, and whether a saved check proved it here, one
sentence each; on this CPU for every family of the README's table, and on recorded reports of a
GTX 1660, an RTX 2060, a V100 and an M1."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from app.cli import main
from app.core import paths
from app.core.advice import advise_on, family_names, resolve_family
from app.core.advice.sizes import FORMS_FILE
from app.core.components import Verdict
from app.core.errors import HalfSafeError
from app.core.formats.forms import stored_form
from app.core.formats.weight_findings import StoredQuantization
from app.core.hardware import DeviceInfo, HardwareReport, assess
from app.core.hardware.selftest_records import SelfTestResult
from app.core.health import saved
from app.core.identities import DeviceIdentity
from app.core.precision.lowbit import LowBitCall, LowBitReport
from tests.support import recorded_devices, reports

ROOT = Path(__file__).resolve().parents[2]


def _readme_families() -> list[str]:
    """The architecture names in the first column of the README's Families table."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("## Families", 1)[1].split("\n\n")[2]
    names = []
    for row in table.splitlines()[2:]:
        names += [n for n in re.findall(r"`([^`]+)`", row.split("|")[1]) if not n.startswith("-")]
    return names


def _forms(report, name: str) -> dict[str, object]:
    return {form.form: form for form in advise_on(name, report).forms}


def _quantized(*types: str) -> StoredQuantization:
    return StoredQuantization("mixed", types, ("model.safetensors",), "bf16")


# Every family, on this CPU -----------------------------------------------------------------


def test_every_family_of_the_readme_answers_on_this_cpu(capsys):
    names = _readme_families()
    assert len(names) >= 20 and "flux2-klein" in names and "anima" in names
    for name in names:
        assert main(["advise", name, "--device", "cpu", "--json"]) == 0, name
        document = json.loads(capsys.readouterr().out)
        assert document["device"]["kind"] == "cpu"
        assert document["forms"] and document["forms"][0]["form"] == "bf16", name
        for form in document["forms"]:
            sentence = form["sentence"]
            assert sentence.endswith(".") and "\n" not in sentence, sentence
            # What the device does, what it needs, whether a check proved it: each said.
            assert form["device_use"] in ("native", "emulated", "decoded", "unsupported")
            does = "runs 16-bit weights in fp32" if form["form"] == "bf16" else "decoded to fp32"
            assert does in sentence, sentence
            assert ("GiB" in sentence) != ("no projection" in sentence), sentence
            assert "no check of" in sentence, sentence


def test_the_text_says_one_line_per_form(capsys):
    assert main(["advise", "flux2-klein", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Flux.2 Klein on "))
    assert [line.split(":")[0] for line in lines[start + 1 :]] == [
        "- bf16 or fp16 (16 bits)",
        "- fp8",
        "- NVFP4",
        "- GGUF Q8_0",
        "- GGUF Q4_0",
        "- GGUF Q4_K",
    ]


def test_an_unknown_family_is_one_sentence_naming_the_families(capsys):
    assert main(["advise", "sd4"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith("halfsafe: 'sd4' is not a model family HalfSafe runs; give one of: ")
    for name in ("sd1", "sdxl", "flux-dev", "flux2-klein", "qwenimage21", "anima"):
        assert f" {name}," in line or line.endswith(f" {name}.")
    for name in ("", "flux-foo", "sdxl-turbo"):
        with pytest.raises(HalfSafeError):
            resolve_family(name)


def test_family_ids_and_architecture_names_both_resolve():
    assert resolve_family("flux2klein")[:2] == ("flux2klein", "flux2-klein")
    assert resolve_family("flux-kontext") == ("flux", "flux-kontext", "Flux.1 Kontext")
    assert resolve_family("SD2-inpaint")[:2] == ("sd", "sd2-inpaint")
    assert set(_readme_families()) <= set(family_names()) | {"sd2-inpaint"}


# Recorded devices -----------------------------------------------------------------------------


def test_a_gtx_1660_has_no_int8_tensor_cores_emulates_fp8_and_bf16_and_computes_in_fp32():
    forms = _forms(recorded_devices.gtx_1660(), "zimage-turbo")
    assert list(forms) == [
        "bf16", "fp8", "int8-convrot", "gguf-q8_0", "gguf-q4_0", "gguf-q4_k",
    ]  # fmt: skip
    sixteen = forms["bf16"]
    assert sixteen.use.use == "emulated" and sixteen.use.precision == "fp32"
    assert "compute capability 7.5; bf16 tensor cores start at 8.0" in sixteen.sentence
    assert "the self-test found its bf16 results right" in sixteen.sentence
    assert "fp16 is unreliable on it [nvidia-turing-gtx16-fp16-nan]" in sixteen.sentence
    # TU116 has no tensor cores at all, whatever its compute capability.
    assert forms["int8-convrot"].use.use == "emulated"
    assert "this GPU has no tensor cores at all (a TU116 or TU117 chip" in (
        forms["int8-convrot"].sentence
    )
    assert forms["fp8"].use.use == "emulated"
    assert "decoded to fp32" in forms["fp8"].sentence
    [fit] = forms["fp8"].sizes
    assert (fit.model, fit.card, fit.streamed, fit.ram_fits) == (
        "Z-Image", "streams", ("transformer",), True,
    )  # fmt: skip
    # A family not yet projected says so, never a guess.
    krea = _forms(recorded_devices.gtx_1660(), "krea2")["int8-convrot"]
    assert krea.sizes == ()
    assert "HalfSafe has no projection of Krea 2's size at real size yet" in krea.sentence


def test_a_gtx_1660_holds_klein_4b_whole_in_fp8_and_streams_it_in_16_bits():
    forms = _forms(recorded_devices.gtx_1660(), "flux2-klein")
    four, nine = forms["fp8"].sizes
    assert (four.model, four.card, four.ram_fits) == ("Flux.2 Klein 4B", "whole", True)
    assert (nine.card, nine.streamed) == ("streams", ("transformer", "text_encoder"))
    assert nine.ram_fits is False  # 15.7 GiB of files and the working set in 16 GB
    assert "it runs whole on this 6 GB card, and they fit in this computer's 16 GB of RAM" in (
        forms["fp8"].sentence
    )
    assert forms["bf16"].sizes[0].card == "streams"
    assert forms["nvfp4"].use.use == "emulated"
    assert "start at 10.0, Blackwell" in forms["nvfp4"].sentence


def test_an_rtx_2060_computes_in_fp16_with_native_int8_and_emulated_bf16():
    forms = _forms(recorded_devices.rtx_2060(), "qwenimage21")
    assert "int8-convrot" in forms and "nvfp4" in forms
    assert forms["bf16"].use.use == "emulated" and forms["bf16"].use.precision == "fp16"
    assert "fp16 is" not in forms["bf16"].sentence  # fast here: nothing to warn of
    assert forms["int8-convrot"].use.use == "native"
    assert (
        "this GPU has int8 tensor cores (compute capability 7.5" in forms["int8-convrot"].sentence
    )
    assert forms["fp8"].use.use == "emulated"
    assert "decoded to fp16" in forms["gguf-q4_k"].sentence


def _with_low_bit(report: HardwareReport, *calls: LowBitCall) -> HardwareReport:
    """`report` with its card's self-test holding a low-bit section of `calls`."""
    card = report.devices[0]
    assert card.self_test is not None
    low_bit = LowBitReport(
        version="0.2.40",
        device="cuda:0",
        dtype="bf16",
        shapes_from="generic",
        timed=True,
        backends=sorted({c.backend for c in calls}),
        calls=list(calls),
    )
    test = replace(card.self_test, low_bit=low_bit)
    return replace(report, devices=[replace(card, self_test=test), *report.devices[1:]])


def test_the_int8_sentence_says_what_the_self_test_found_of_the_int8_kernels():
    # Not run: the sentence says so, never a guess.
    untested = _forms(recorded_devices.rtx_2060(), "krea2")["int8-convrot"]
    assert "the self-test has not run int8 kernels here" in untested.sentence
    right = [LowBitCall("cuda", "int8_linear", m, 3072, 3072, "right", 0.002) for m in (96, 97)]
    clean = _forms(_with_low_bit(recorded_devices.rtx_2060(), *right), "krea2")["int8-convrot"]
    assert "comfy-kitchen 0.2.40's int8 kernels right here at all 2 shapes" in clean.sentence
    # A T4-like fault: the GEMM wrong for one M range. A capable card, and still no fast path.
    wrong = LowBitCall("cuda", "int8_linear", 97, 3072, 3072, "wrong", 1.7)
    # The int4 GEMM is no int8 op: its fault is left to the int4 forms' own words.
    int4 = LowBitCall("cuda", "w4a8_int8_linear", 97, 3072, 3072, "wrong", 2.0)
    faulty = _with_low_bit(recorded_devices.rtx_2060(), right[0], wrong, int4)
    sentence = _forms(faulty, "krea2")["int8-convrot"].sentence
    assert (
        "but the self-test found comfy-kitchen 0.2.40's cuda int8 GEMM wrong results here at 1 "
        "of 2 shapes (first at M 97, K 3072, N 3072), so tools using it may draw noise"
    ) in sentence
    # The other forms do not speak of int8 kernels.
    assert "int8 kernels" not in _forms(faulty, "krea2")["bf16"].sentence


def test_a_v100_has_no_int8_tensor_cores():
    forms = _forms(recorded_devices.v100(), "flux3-klein")
    int8 = forms["int8-convrot"]
    assert int8.use.use == "emulated"
    assert "this GPU has no int8 tensor cores (compute capability 7.0; they start at 7.5" in (
        int8.sentence
    )
    assert forms["bf16"].use.use == "emulated"
    flux = _forms(recorded_devices.v100(), "flux-dev")
    [fit] = flux["gguf-q4_0"].sizes
    assert (fit.card, fit.ram_fits) == ("whole", True)  # 9.1 GiB on a 16 GB card
    assert "runs whole on this 16 GB card" in flux["gguf-q4_0"].sentence
    [wide] = flux["bf16"].sizes
    assert wide.card == "streams" and wide.ram_fits is True


def test_an_m1_computes_bf16_through_fp32_in_the_computers_memory():
    forms = _forms(recorded_devices.m1(), "sdxl")
    assert list(forms) == ["bf16", "fp8"]
    sixteen = forms["bf16"]
    assert sixteen.use.use == "emulated"
    assert "Apple's GPU computes bf16 through fp32" in sixteen.sentence
    [fit] = sixteen.sizes
    assert fit.card is None and fit.ram_fits is True
    assert "this device computes in the computer's memory" in sixteen.sentence
    assert "int8" not in forms and forms["fp8"].use.use == "emulated"
    assert "this Apple GPU has none" in forms["fp8"].sentence


def test_an_rdna2_card_has_no_usable_bf16_by_the_quirks_table():
    card = assess(
        DeviceInfo(
            kind="rocm",
            index=0,
            name="AMD Radeon RX 6700 XT",
            capability=(10, 3),
            memory_total_mb=12272,
            vendor="amd",
            arch="gfx1031",
            os_name="linux",
        ),
        SelfTestResult.skipped(),
    )
    report = HardwareReport("0.1.0", "2.13.0", None, [card, recorded_devices.m1().devices[1]])
    forms = _forms(report, "sdxl")
    assert forms["bf16"].use.use == "unsupported"
    assert "no usable bf16 [amd-rdna1-rdna2-no-bf16]" in forms["bf16"].sentence
    assert "HalfSafe runs 16-bit weights in fp16 here" in forms["bf16"].sentence
    assert "this GPU has none" in forms["fp8"].sentence  # ROCm: no NVIDIA tensor cores
    assert "runs whole on this 12 GB card" in forms["bf16"].sentence


# What a check proved --------------------------------------------------------------------------


def _save_check(device: str, architecture: str, quantization: StoredQuantization | None, verdict):
    model = replace(reports.SDXL, architecture=architecture, quantization=quantization)
    health = reports.report(
        model=model, device=DeviceIdentity(kind="cuda", name=device), verdict=verdict
    )
    key = f"{device}{architecture}{quantization}".encode().hex()[:64]
    return saved.save_report(key, reports.result(health))


def test_a_saved_check_on_this_device_proves_its_form_and_no_other():
    card = recorded_devices.rtx_2060()
    name = card.devices[0].name
    _save_check(name, "flux-dev", _quantized("F8_E4M3", "BF16"), Verdict.HEALTHY)
    _save_check(name, "flux-schnell", _quantized("Q4_K", "Q8_0"), Verdict.BROKEN)
    _save_check("NVIDIA GeForce RTX 3060", "flux-dev", None, Verdict.HEALTHY)
    _save_check(name, "sdxl", None, Verdict.HEALTHY)  # another family
    listed = saved.saved_reports().reports
    forms = {f.form: f for f in advise_on("flux", card, saved=listed).forms}
    assert forms["fp8"].proof.verdict == "healthy"
    assert "the check proved sdxl in this form healthy on this device" in forms["fp8"].sentence
    assert forms["gguf-q4_k"].proof.verdict == "broken"
    assert "in this form broken on this device" in forms["gguf-q4_k"].sentence
    # Checked in bf16 only on another card; the Q8_0 layers of the Q4_K file name no form.
    for form in ("bf16", "gguf-q8_0", "nvfp4"):
        assert forms[form].proof.verdict is None
        assert "no check of a Flux.1 model in this form on this device is saved" in (
            forms[form].sentence
        )


def test_a_saved_report_keeps_the_architecture_and_form_it_checked():
    stored = _save_check("GPU", "flux-dev", _quantized("NVFP4", "F8_E4M3"), Verdict.HEALTHY)
    assert stored is not None
    [back] = saved.saved_reports().reports
    assert (back.architecture, back.stored_form) == ("flux-dev", "nvfp4")
    # A report saved before they were kept reads back with neither.
    [path] = saved.folder().glob("*.json")
    document = json.loads(path.read_text(encoding="utf-8"))
    del document["architecture"], document["stored_form"]
    path.write_text(json.dumps(document), encoding="utf-8")
    [old] = saved.saved_reports().reports
    assert (old.architecture, old.stored_form) == ("", "")


@pytest.mark.parametrize(
    ("types", "form"),
    [
        ((), "bf16"),
        (("F8_E4M3",), "fp8"),
        (("INT8_CONVROT", "F8_E4M3"), "int8-convrot"),
        (("int8_convrot_g256",), "int8-convrot"),
        (("Q4_K", "Q6_K", "F16"), "gguf-q4_k"),
        (("Q8_0", "F32"), "gguf-q8_0"),
        (("INT8",), ""),  # int8 per tensor is no published form of these families
    ],
)
def test_the_stored_form_of_a_checked_model(types, form):
    assert stored_form(_quantized(*types) if types else None) == form


# The projection's data ------------------------------------------------------------------------


def test_the_shipped_projection_is_the_benchmarks_recorded_one():
    shipped = json.loads(paths.resource(FORMS_FILE).read_text(encoding="utf-8"))
    recorded = json.loads(
        (ROOT / "benchmarks/results/family-memory-projection.json").read_text(encoding="utf-8")
    )["families"]
    assert set(shipped["projections"]) == set(recorded)
    for key, family in recorded.items():
        assert shipped["projections"][key]["words"] == family["words"]
        assert shipped["projections"][key]["parts"] == {
            name: {"parameters": part["parameters"], "forms": part["forms"]}
            for name, part in family["parts"].items()
        }
    from app.core.families.registry import FAMILIES

    assert set(shipped["forms"]) == {family.id for family in FAMILIES}
    for projected in shipped["projected_as"].values():
        assert set(projected) <= set(recorded)
