"""`halfsafe advise FAMILY` leads with the answer, which file to take on this device, then a
table of the forms; it takes the labels the window shows; it says how slow a CPU is; and where
comfy-kitchen is missing, `advise` and `gpu` say in one sentence that the int8 kernels other
tools run were not tried here, and how to have them tried."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from app.cli import main
from app.cli.text import advice_text, hardware_text
from app.core.advice import advise_on, architecture_choices, resolve_family
from app.core.advice.kernels import KITCHEN_TESTED, install_command
from app.core.formats.forms import FORMS
from app.core.precision.lowbit import LowBitCall, LowBitReport
from tests.support import recorded_devices

ROOT = Path(__file__).resolve().parents[2]
FORM_WORDS = [form.words for form in FORMS]


def _taken(answer: str) -> list[str]:
    """The forms the answer says to take."""
    return re.findall(r"take the (.+?) file", answer)


@pytest.fixture
def no_kitchen(monkeypatch):
    """comfy-kitchen not importable here, as on a fresh install."""
    monkeypatch.setitem(sys.modules, "comfy_kitchen", None)


# The answer -----------------------------------------------------------------------------------


def test_a_gtx_1660_super_takes_the_q4_k_file_and_is_told_why_int8_is_no_faster():
    advice = advise_on("zimage-turbo", recorded_devices.gtx_1660_super())
    assert advice.answer.startswith(
        "On this NVIDIA GeForce GTX 1660 SUPER: take the GGUF Q4_K file (3.2 GB on the card at "
        "most, whole; 7.0 GB of RAM); fp8 keeps more bits but streams its transformer block by "
        "block at every step."
    )
    assert _taken(advice.answer) == ["GGUF Q4_K"]
    # TU116 has no tensor cores: no int8 fast path for any tool, and HalfSafe decodes anyway.
    assert "int8 ConvRot runs no faster here: HalfSafe decodes each of its layers to fp32" in (
        advice.answer
    )
    assert "has no int8 tensor cores" in advice.answer
    int8 = next(f for f in advice.forms if f.form == "int8-convrot")
    assert int8.use.use == "emulated" and "no tensor cores at all" in int8.sentence
    # Flux.1 dev does not fit whole: the file that fits in its 16 GB of RAM and streams.
    flux = advise_on("flux-dev", recorded_devices.gtx_1660_super()).answer
    assert _taken(flux) == ["GGUF Q4_K"]
    assert "streaming its transformer block by block" in flux
    assert "fp8 needs 17.4 GB of RAM, more than this computer has" in flux


def test_an_rtx_3060_takes_the_file_that_runs_whole_on_its_12_gb():
    card = recorded_devices.rtx_3060()
    assert _taken(advise_on("flux-dev", card).answer) == ["GGUF Q4_K"]
    zimage = advise_on("zimage-turbo", card).answer
    assert _taken(zimage) == ["GGUF Q8_0"]
    assert "(6.1 GB on the card at most, whole; 11.7 GB of RAM)" in zimage
    # Its int8 tensor cores serve other tools' kernels, not HalfSafe's decoding.
    assert "tools with int8 kernels (ComfyUI's) may run it faster on this card" in zimage
    assert _taken(advise_on("sdxl", card).answer) == ["bf16 or fp16 (16 bits)"]


def test_a_cpu_is_told_it_runs_but_takes_minutes_per_picture():
    computer = recorded_devices.cpu_only()
    flux = advise_on("flux-dev", computer).answer
    assert flux.startswith("On this CPU (x86 CPU, 32 GB of RAM): take the GGUF Q8_0 file")
    assert _taken(flux) == ["GGUF Q8_0"]
    assert "It runs on a CPU, but slowly: each step of a 1024 px picture is about 97 TFLOP" in (
        flux
    )
    assert re.search(r"so \d+ minutes or more for 25 steps\.", flux), flux
    sd1 = advise_on("sd1", computer).answer
    assert "each step of a 512 px picture is about" in sd1


def test_each_recorded_device_gets_one_form_for_every_projected_family():
    for report in (
        recorded_devices.gtx_1660_super(),
        recorded_devices.rtx_3060(),
        recorded_devices.cpu_only(),
    ):
        for name in ("sd1", "sdxl", "flux-dev", "chroma", "zimage-turbo", "sd3", "qwenimage"):
            answer = advise_on(name, report).answer
            taken = _taken(answer)
            if "no published form runs here" in answer:
                assert not taken
                continue
            assert len(taken) == 1 and taken[0] in FORM_WORDS, (name, taken)
    # Qwen-Image's smallest files and HalfSafe's working set pass a 16 GB computer's RAM.
    qwen = advise_on("qwenimage", recorded_devices.gtx_1660_super()).answer
    assert qwen.endswith(
        "no published form runs here: the smallest, NVFP4, needs 17.0 GB of RAM, more than this "
        "computer has."
    )


def test_the_text_leads_with_the_answer_then_the_table(capsys):
    assert main(["advise", "flux-dev", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert _taken(lines[0]) and lines[1] == ""
    assert lines[2].split() == ["form", "runs", "here?", "card", "GB", "RAM", "GB", "proved",
                                "by", "a", "check?"]  # fmt: skip
    rows = lines[4:10]
    assert [row.split("  ")[0] for row in rows] == [
        "bf16 or fp16 (16 bits)", "fp8", "NVFP4", "GGUF Q8_0", "GGUF Q4_0", "GGUF Q4_K",
    ]  # fmt: skip


def test_the_json_keeps_its_fields_and_gains_the_answer(capsys):
    assert main(["advise", "flux-dev", "--device", "cpu", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    for key in ("halfsafe", "family", "architecture", "title", "device", "ram_bytes", "forms"):
        assert key in document
    assert document["forms"][0]["sentence"] and document["forms"][0]["memory"]
    assert _taken(document["answer"])
    [row] = [r for r in document["table"] if r["form"] == "gguf-q8_0"]
    assert row["runs_here"] is True and row["runs"] == "ram" and row["ram_bytes"] > 0
    assert document["int8_kernels"] is None  # Flux.1 is published in no int8 form


# The labels the window shows ----------------------------------------------------------------


def test_the_labels_the_window_shows_are_taken(capsys):
    assert main(["advise", "Flux.1 dev", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("On this CPU")
    for name, title in architecture_choices():
        assert resolve_family(title)[1] == name, title
        assert resolve_family(title.upper())[1] == name, title
    assert resolve_family("FLUX-DEV")[:2] == ("flux", "flux-dev")
    assert resolve_family("  flux.2   KLEIN ")[:2] == ("flux2klein", "flux2-klein")


# The int8 kernels -------------------------------------------------------------------------------


def test_without_comfy_kitchen_advise_and_gpu_say_the_int8_kernels_were_not_tried(no_kitchen):
    card = recorded_devices.rtx_3060()
    command = f'{sys.executable} -m pip install "comfy-kitchen=={KITCHEN_TESTED}"'
    if " " in sys.executable:
        command = f'"{sys.executable}" -m pip install "comfy-kitchen=={KITCHEN_TESTED}"'
    assert install_command() == command
    sentence = (
        "The int8 kernels ComfyUI and Forge Neo run (comfy-kitchen's) were not tried on this "
        "GPU, since comfy-kitchen is not installed beside HalfSafe: to try them, run "
        f"`{command}` (the version HalfSafe is tested with; your ComfyUI may carry another), "
        "then `halfsafe gpu --retest`"
    )
    advice = advise_on("zimage-turbo", card)
    assert advice.kernels.startswith(sentence)
    assert sentence in advice_text(advice)
    assert sentence in hardware_text(card)
    # Families published in no int8 form, and a CPU, have nothing to try.
    assert advise_on("flux-dev", card).kernels == ""
    assert "comfy-kitchen" not in hardware_text(recorded_devices.cpu_only())


def test_once_the_self_test_ran_the_int8_kernels_the_sentence_is_gone(no_kitchen):
    card = recorded_devices.rtx_3060()
    device = card.devices[0]
    assert device.self_test is not None
    low_bit = LowBitReport(
        version=KITCHEN_TESTED, device="cuda:0", dtype="bf16", shapes_from="generic", timed=True,
        backends=["cuda"], calls=[LowBitCall("cuda", "int8_linear", 96, 3072, 3072, "right", 0.0)],
    )  # fmt: skip
    tried = replace(device, self_test=replace(device.self_test, low_bit=low_bit))
    report = replace(card, devices=[tried, *card.devices[1:]])
    assert advise_on("zimage-turbo", report).kernels == ""
    assert "were not tried" not in hardware_text(report)


def test_installed_but_not_tried_says_to_run_the_self_test_again():
    advice = advise_on("zimage-turbo", recorded_devices.rtx_3060())
    from app.core.precision.fused import installed

    if installed() is None:
        pytest.skip("comfy-kitchen is not installed here")
    assert "were not tried on this GPU yet: run `halfsafe gpu --retest`" in advice.kernels


def test_the_tested_comfy_kitchen_is_the_one_the_extras_pin():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    extras = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    pin = f'"comfy-kitchen=={KITCHEN_TESTED}"'
    assert f"kernels = [{pin}]" in extras
    dev = extras.split("dev = [", 1)[1].split("\n]", 1)[0]
    assert pin in dev
    assert re.findall(r"comfy-kitchen==([\d.]+)", extras) == [KITCHEN_TESTED] * 2
