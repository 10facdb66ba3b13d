"""`halfsafe explain` on a black image whose model is not in the library: the check cannot run,
so the answer gives the next steps of the tool that made the image, in its own terms and said as
likely: the likely cause from what the record says (the model family it implies, a VAE made for
fp16, a NaN replaced by zeros before the VAE, a part the tool already runs wide), the tool's
switches in order, and still the step that lets the check prove it. A dark picture or a
safety-checker blank gets none: no precision switch changes those."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.cli import main
from app.core.explain import next_steps
from app.core.explain.pixels import PixelFigures
from app.core.explain.records import Record
from app.core.words import tools
from tests.support.image_files import a1111_parameters, comfy_prompt, pixels, png_text

FORGE = "f2.0.1v1.10.1-previous-669-gdfdcbab6"
NOT_A_VERDICT = "not a diagnosis"
ADD_FOLDER = "Settings > Model folders"


def swarm(model: str = "lost/model") -> str:
    return json.dumps({"sui_image_params": {"prompt": "a cat", "model": model, "steps": 20}})


def invoke(model: dict) -> str:
    return json.dumps({"app_version": "5.4.0", "positive_prompt": "a cat", "model": model})


def explain_json(image: Path, capsys, code: int = 1) -> dict:
    assert main(["explain", str(image), "--json"]) == code
    return json.loads(capsys.readouterr().out)


# Each tool's own switch ----------------------------------------------------------------------

# The first switch each tool's next steps give for a NaN-black image of an unknown family. A1111
# and HalfSafe run the VAE in fp16, so the VAE comes first; the others run it wider by default,
# so the UNet's attention does (InvokeAI and SD.Next have no attention switch but fp32).
FIRST_SWITCH = [
    ({"parameters": a1111_parameters("lost-model", "0123456789")}, "a1111", ["--no-half-vae"], {}),
    (
        {"parameters": a1111_parameters("lost-model", "0123456789", version=FORGE)},
        "forge",
        ["--force-upcast-attention"],
        {},
    ),
    (
        {"parameters": a1111_parameters("lost-model", "0123456789", "app", App="SD.Next")},
        "sdnext",
        [],
        {"no_half": True},
    ),
    (
        {"prompt": comfy_prompt("lost/model.safetensors")},
        "comfyui",
        ["--force-upcast-attention"],
        {},
    ),
    ({"parameters": swarm()}, "swarmui", ["--force-upcast-attention"], {}),
    (
        {"invokeai_metadata": invoke({"name": "lost-model"})},
        "invokeai",
        [],
        {"precision": "float32"},
    ),
    (
        {"parameters": "a cat\nSteps: 20, Sampler: Euler, Seed: 1, Model: lost, HalfSafe: 0.1"},
        "halfsafe",
        ["--vae-precision fp32"],
        {},
    ),
]


@pytest.mark.parametrize(
    ("texts", "tool", "flags", "settings"), FIRST_SWITCH, ids=[c[1] for c in FIRST_SWITCH]
)
def test_a_missing_model_gives_the_tools_own_switch(
    tmp_path, home, capsys, texts, tool, flags, settings
):
    image = png_text(tmp_path / "black.png", texts)

    document = explain_json(image, capsys)

    steps = document["next_steps"]
    assert document["image"]["made_by"] == tool and document["check"] is None
    assert steps["tool"] == tool and steps["add_folder"] is True
    first = steps["switches"][0]
    assert (first["flags"], first["settings"], first["only_if"]) == (flags, settings, None)
    assert steps["how"] == tools.TOOLS[tool].how
    message = document["message"]
    assert NOT_A_VERDICT in message and "The likely cause is" in message
    assert f"In {tools.TOOLS[tool].name}, try first: " in message
    said = " ".join(flags) or next(iter(settings))
    assert said in message
    assert ADD_FOLDER in message  # the check can still prove it
    assert "reproduced it" not in message and "The fix" not in message


def test_the_plain_text_answer_gives_the_switches_in_order(tmp_path, home, capsys):
    image = png_text(
        tmp_path / "00012-1234.png", {"parameters": a1111_parameters("lost-model", "0123456789")}
    )
    assert main(["explain", str(image)]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    vae = first.index("try first: start it with --no-half-vae")
    upcast = first.index('set upcast_attn = true ("Upcast cross attention layer to float32")')
    no_half = first.index("start it with --no-half.")
    assert vae < upcast < no_half < first.index(ADD_FOLDER)


@pytest.mark.parametrize(
    ("texts", "tool", "vae_flag", "unless"),
    [
        (
            {"parameters": a1111_parameters("lost-model", "0123456789", version=FORGE)},
            "forge",
            ["--vae-in-fp32"],
            "--vae-in-fp16",
        ),
        ({"prompt": comfy_prompt("lost.safetensors")}, "comfyui", ["--fp32-vae"], "--fp16-vae"),
        ({"parameters": swarm()}, "swarmui", ["--fp32-vae"], "ExtraArgs"),
    ],
    ids=["forge", "comfyui", "swarmui"],
)
def test_a_vae_the_tool_runs_wide_by_default_is_tried_last_and_only_if_changed(
    tmp_path, home, capsys, texts, tool, vae_flag, unless
):
    image = png_text(tmp_path / "black.png", texts)
    steps = explain_json(image, capsys)["next_steps"]
    assert steps["likely"] == "denoiser"
    last = steps["switches"][-1]
    assert last["part"] == "vae" and last["flags"] == vae_flag
    assert unless in last["only_if"]
    assert all(s["only_if"] is None for s in steps["switches"][:-1])


# What the record implies ---------------------------------------------------------------------


def test_an_sdxl_model_named_in_an_a1111_image_points_at_sdxls_vae(tmp_path, home, capsys):
    parameters = a1111_parameters("juggernautXL_v9", "0123456789")
    image = png_text(tmp_path / "xl.png", {"parameters": parameters})
    document = explain_json(image, capsys)
    steps = document["next_steps"]
    assert (steps["family"], steps["likely"]) == ("sdxl", "sdxl_vae")
    assert steps["switches"][0]["flags"] == ["--no-half-vae"]
    assert "SDXL's original VAE overflowing fp16" in document["message"]
    assert "juggernautXL_v9" in document["message"]


def test_an_sd2_model_points_at_attention_first(tmp_path, home, capsys):
    parameters = a1111_parameters("v2-1_768-ema-pruned", "0123456789")
    image = png_text(tmp_path / "sd2.png", {"parameters": parameters})
    steps = explain_json(image, capsys)["next_steps"]
    assert (steps["family"], steps["likely"]) == ("sd2", "sd2_attention")
    assert [s["part"] for s in steps["switches"]] == ["attention", "all"]
    assert steps["switches"][0]["settings"] == {"upcast_attn": True}


def test_comfyui_upcasts_sd2_attention_itself_so_that_switch_comes_last(tmp_path, home, capsys):
    image = png_text(tmp_path / "sd2.png", {"prompt": comfy_prompt("v2-1_768-ema-pruned.ckpt")})
    steps = explain_json(image, capsys)["next_steps"]
    flags = [s["flags"] for s in steps["switches"]]
    assert flags[0] == ["--fp32-unet"]
    assert flags[-1] == ["--force-upcast-attention"]
    assert "--dont-upcast-attention" in steps["switches"][-1]["only_if"]


def test_invokeais_stated_base_and_an_fp16_vae_keep_the_vae_out_of_it(tmp_path, home, capsys):
    metadata = json.loads(invoke({"name": "Juggernaut XL", "base": "sdxl"}))
    metadata["vae"] = {"name": "sdxl-vae-fp16-fix"}
    image = png_text(tmp_path / "invoke.png", {"invokeai_metadata": json.dumps(metadata)})
    document = explain_json(image, capsys)
    steps = document["next_steps"]
    assert (steps["family"], steps["likely"]) == ("sdxl", "denoiser")
    assert "vae" not in [s["part"] for s in steps["switches"]]
    assert "made for fp16 (sdxl-vae-fp16-fix)" in document["message"]


@pytest.mark.parametrize(
    ("record", "family"),
    [
        (Record(model="sd_xl_base_1.0"), "sdxl"),
        (Record(model="Juggernaut XL"), "sdxl"),
        (Record(model="ponyDiffusionV6XL_v6StartWithThisOne"), "sdxl"),
        (Record(model="SDXL/dreamshaper.safetensors"), "sdxl"),
        (Record(model="lost", vae="sdxl_vae.safetensors"), "sdxl"),
        (Record(model="v2-1_768-ema-pruned"), "sd2"),
        (Record(model="sd21-unclip-h"), "sd2"),
        (Record(model="stable-diffusion-2-1-base"), "sd2"),
        (Record(model="v1-5-pruned-emaonly"), None),
        (Record(model="dreamshaper_v2"), None),  # a version number, not SD 2
        (Record(model="realisticVision_v2.0"), None),
        (Record(model="pixelart_xlarge"), None),
        (Record(model="flux1-dev", base="flux"), None),  # a stated family is believed
        (Record(model="Juggernaut XL", base="sd-1"), None),
        (Record(model="whatever", base="sdxl-refiner"), "sdxl"),
        (Record(model="whatever", base="StableDiffusionXLPipeline"), "sdxl"),
        (Record(model="v2-1_512", base="StableDiffusionPipeline"), "sd2"),
    ],
    ids=lambda value: value.model if isinstance(value, Record) else str(value),
)
def test_the_family_comes_from_what_the_record_states_then_the_names(record, family):
    fault = next_steps.model_family(record)[0]
    assert (fault.family if fault is not None else None) == family


def test_sdnext_and_invokeai_records_keep_the_family_they_state(tmp_path):
    from app.core import explain

    parameters = a1111_parameters("lost", "0123456789", "app", App="SD.Next")
    parameters += ", Pipeline: StableDiffusionXLPipeline"
    sdnext = png_text(tmp_path / "sdnext.png", {"parameters": parameters})
    assert explain.read_image(sdnext)[0].base == "StableDiffusionXLPipeline"
    v3 = invoke({"model_name": "dreamshaper", "base_model": "sd-2", "model_type": "main"})
    invokeai = png_text(tmp_path / "invoke.png", {"invokeai_metadata": v3})
    assert explain.read_image(invokeai)[0].base == "sd-2"


# What the pixels say ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("texts", "image", "status"),
    [
        ({"parameters": a1111_parameters("lost-model", "0123456789")}, "dark", "black"),
        (
            {
                "parameters": "a cat\nSteps: 20, Sampler: Euler, Seed: 1, Model: lost, "
                "NaN watch: safety_checker, HalfSafe: 0.1"
            },
            "zero",
            "safety_checker",
        ),
    ],
    ids=["dark", "safety-checker"],
)
def test_a_dark_picture_or_a_safety_checker_blank_gets_no_switch(
    tmp_path, home, capsys, texts, image, status
):
    path = png_text(tmp_path / "x.png", texts, pixels(image))
    document = explain_json(path, capsys, code=0)
    assert document["image"]["status"] == status
    assert document["next_steps"] is None
    message = document["message"]
    assert "--no-half" not in message and "upcast" not in message and "try first" not in message


def test_a_grey_forge_image_gets_the_nan_steps_with_its_flat_words(tmp_path, home, capsys):
    grey = Image.fromarray(np.full((64, 64, 3), 128, np.uint8), "RGB")
    parameters = a1111_parameters("lost-model", "0123456789", version=FORGE)
    image = png_text(tmp_path / "grey.png", {"parameters": parameters}, grey)
    document = explain_json(image, capsys)
    assert document["image"]["status"] == "nan_zeroed"
    message = document["message"]
    assert message.index("flat grey instead of black") < message.index("The likely cause is")
    assert document["next_steps"]["switches"][0]["flags"] == ["--force-upcast-attention"]


def test_zeros_before_the_vae_leave_the_vae_out_of_the_steps(tmp_path, home, capsys):
    picture = np.random.default_rng(0).integers(0, 256, (64, 64, 3)).astype(np.uint8)
    picture[8:56, 8:56] = (93, 110, 104)  # one exact colour framed by detail: zeroed latents
    parameters = a1111_parameters("lost-model", "0123456789")
    image = png_text(tmp_path / "latent.png", {"parameters": parameters}, Image.fromarray(picture))
    document = explain_json(image, capsys)
    assert document["pixels"]["flat"]["stage"] == "latent"
    steps = document["next_steps"]
    assert steps["likely"] == "denoiser"
    assert [s["part"] for s in steps["switches"]] == ["attention", "unet"]  # --no-half covers all
    assert "came before the VAE" in document["message"]


def test_a_sage_node_and_a_compile_step_are_ruled_out_first(tmp_path, home, capsys):
    nodes = json.loads(comfy_prompt("lost.safetensors"))
    nodes["9"] = {
        "class_type": "PathchSageAttentionKJ",
        "inputs": {"model": ["4", 0], "sage_attention": "auto"},
    }
    nodes["10"] = {"class_type": "TorchCompileModel", "inputs": {"model": ["9", 0]}}
    grey = Image.fromarray(np.full((64, 64, 3), 128, np.uint8), "RGB")
    image = png_text(tmp_path / "ComfyUI_00001_.png", {"prompt": json.dumps(nodes)}, grey)
    document = explain_json(image, capsys)
    assert document["next_steps"]["rule_out"] == ["sageattention", "compile"]
    message = document["message"]
    assert message.index("First rule out SageAttention") < message.index("Then, in ComfyUI")


def test_an_image_that_names_no_model_gets_the_steps_without_the_folder(tmp_path, home, capsys):
    nodes = json.loads(comfy_prompt("x.safetensors"))
    del nodes["4"]
    image = png_text(tmp_path / "ComfyUI_00002_.png", {"prompt": json.dumps(nodes)})
    document = explain_json(image, capsys)
    steps = document["next_steps"]
    assert steps["tool"] == "comfyui" and steps["add_folder"] is False
    assert "does not say which model" in document["message"]
    assert ADD_FOLDER not in document["message"]


def test_an_image_with_no_record_gets_no_tools_steps(tmp_path, home, capsys):
    image = tmp_path / "plain.png"
    pixels("zero").save(image)
    document = explain_json(image, capsys)
    assert document["image"]["made_by"] == "unknown"
    assert document["next_steps"] is None


# The tables the steps come from --------------------------------------------------------------


def test_each_tools_attention_switch_is_one_that_tool_reads():
    # Forge's backend reads --force-upcast-attention; A1111's upcast_attn setting is dead code
    # there. SD.Next's upcast_attn is a hidden legacy option: it has no attention switch.
    upcast = tools.TERMS[("upcast_attention", True)]
    assert upcast["forge"].flags == ("--force-upcast-attention",) and not upcast["forge"].settings
    assert upcast["sdnext"].settings == {"no_half": True} and upcast["sdnext"].note
    assert upcast["a1111"].settings == {"upcast_attn": True}


def test_halfsafes_own_image_skips_what_its_record_shows_was_on():
    record = Record(made_by="halfsafe", model="lost", precision={"vae_precision": "fp32"})
    steps = next_steps.plan(record, "nan", PixelFigures(), add_folder=True)
    assert steps is not None
    assert [s.flags for s in steps.switches] == [["--upcast-attention"], ["--no-half"]]


def test_the_next_steps_are_documented():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text(encoding="utf-8")
    for word in ("`next_steps`", "`next_steps.switches`", "`only_if`", "`next_steps.add_folder`"):
        assert word in docs
