"""`halfsafe explain` on tiled noise, RGB static and false colour (`looks`), with the fast paths
the record and the tool's log show (`suspects`): int8/int4 files in a loader, ComfyUI's
version (its model compiler from 0.41, DynamicVRAM from 0.15), Qwen-Image 2.1's prefix cache
and its `device=off`, LanPaint with int8 ConvRot, a loader's unexpected keys; each with the
switch its maker gives, and with `--remake` HalfSafe's own image of the same record."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.cli import main
from app.core import explain
from app.core.explain import suspects
from app.core.explain.records import read_record
from tests.support.explain_pictures import (
    blocky,
    channels_apart,
    decoded_noise,
    normal_map,
    repeated,
    rgb_static,
)
from tests.support.image_files import a1111_parameters, comfy_prompt, png_text

NORMAL_BLUE = (128, 128, 255)


def graph(*extra: tuple[str, dict], ckpt: str = "x.safetensors") -> str:
    """comfy_prompt's graph with more nodes (class_type, inputs)."""
    nodes = json.loads(comfy_prompt(ckpt))
    for index, (kind, inputs) in enumerate(extra):
        nodes[str(20 + index)] = {"class_type": kind, "inputs": inputs}
    return json.dumps(nodes)


def workflow(version: str, *extra: dict) -> str:
    """A UI workflow whose core nodes record ComfyUI's version."""
    core = {"cnr_id": "comfy-core", "ver": version}
    nodes = [
        {
            "id": 4,
            "type": "CheckpointLoaderSimple",
            "widgets_values": ["x.safetensors"],
            "properties": core,
        },
        {
            "id": 3,
            "type": "KSampler",
            "widgets_values": [42, "fixed", 12, 7, "euler", "normal", 1],
            "properties": core,
        },
        *extra,
    ]
    return json.dumps({"last_node_id": 30, "nodes": nodes})


def image(tmp_path: Path, picture: np.ndarray, texts: dict[str, str] | None, name="i.png"):
    if texts is None:
        path = tmp_path / name
        Image.fromarray(picture).save(path)
        return path
    return png_text(tmp_path / name, texts, Image.fromarray(picture))


def explained(path, capsys, *flags: str, code: int) -> dict:
    found = main(["explain", str(path), "--json", "--device", "cpu", *flags])
    document = json.loads(capsys.readouterr().out)
    assert found == code, document["message"]
    return document


def kinds(document: dict) -> list[str]:
    return [c["kind"] for c in document["look_causes"]]


# Tiled noise and a low-bit file --------------------------------------------------------------


def test_tiled_noise_from_an_int8_file_names_the_file_and_another_stored_form(
    tmp_path, home, capsys
):
    texts = {"prompt": graph(("UNETLoader", {"unet_name": "krea2_int8.safetensors"}))}
    document = explained(image(tmp_path, blocky("sharp", 16), texts), capsys, code=1)
    assert document["image"]["status"] == "tiled_noise"
    assert document["pixels"]["tiled"] == {"period": 16, "kind": "blocks", "strength": 1.0}
    assert document["record"]["low_bit_files"] == [
        {
            "node": "UNETLoader",
            "file": "krea2_int8.safetensors",
            "format": "int8",
            "convrot": False,
        }
    ]
    assert kinds(document)[0] == "low_bit_file"
    first = document["look_causes"][0]
    assert first["cause"] == "kernel" and "bf16, fp8 or GGUF" in first["switch"]
    message = document["message"]
    assert message.startswith("This image (made by ComfyUI) is tiled noise, not a picture")
    assert "16 px grid" in message and "krea2_int8.safetensors" in message
    # No version in a prompt-only graph: the model compiler is named for 0.41 and later.
    assert "model_compiler" in kinds(document) and "dynamic_vram" not in kinds(document)
    assert "--disable-comfy-compiler" in message and "if it is 0.41 or later" in message
    # Not a precision fault: no check, no precision switches; --remake offered.
    assert document["check"] is None and document["next_steps"] is None
    assert any("explain --remake" in note for note in document["notes"])


def test_a_repeated_tile_is_said_as_a_repeat(tmp_path, home, capsys):
    texts = {"parameters": a1111_parameters("flux-w4a8.safetensors", "abcdef1234")}
    document = explained(image(tmp_path, repeated("smooth", 32), texts), capsys, code=1)
    assert document["image"]["status"] == "tiled_noise"
    assert "repeats itself every 32 px" in document["message"]
    # An infotext's model name marks the stored form too; A1111 has no model compiler.
    assert document["record"]["low_bit_files"][0]["format"] == "w4a8"
    assert kinds(document) == ["low_bit_file"]


def test_lanpaint_with_int8_convrot_comes_first_and_without_it_is_not_named(tmp_path, home, capsys):
    loader = ("UNETLoader", {"unet_name": "anima_int8_convrot.safetensors"})
    texts = {"prompt": graph(loader, ("LanPaint_KSampler", {"steps": 20}))}
    document = explained(image(tmp_path, blocky("grain", 64), texts), capsys, code=1)
    assert document["record"]["inpaint_samplers"] == ["LanPaint_KSampler"]
    assert document["record"]["low_bit_files"][0]["convrot"] is True
    assert kinds(document)[:2] == ["inpaint_low_bit", "low_bit_file"]
    assert "LanPaint issue 99" in document["message"]
    assert "ComfyUI's own KSampler" in document["look_causes"][0]["switch"]

    loader = ("UNETLoader", {"unet_name": "anima_bf16.safetensors"})
    texts = {"prompt": graph(loader, ("LanPaint_KSampler", {"steps": 20}))}
    document = explained(image(tmp_path, blocky("grain", 64), texts, "b.png"), capsys, code=1)
    assert "inpaint_low_bit" not in kinds(document) and "low_bit_file" not in kinds(document)


@pytest.mark.parametrize(
    ("inputs", "named"),
    [
        ({"cache_dtype": "int8", "device": "cuda"}, True),
        ({"cache_dtype": "int4", "device": "cuda"}, True),
        ({"cache_dtype": "fp16", "device": "cuda"}, False),
        ({"cache_dtype": "int4", "device": "off"}, False),
    ],
)
def test_qwen_image_21s_prefix_cache_is_named_unless_off_or_fp16(
    tmp_path, home, capsys, inputs, named
):
    texts = {"prompt": graph(("QwenImage21Cache", inputs))}
    document = explained(image(tmp_path, repeated("pixel", 8), texts), capsys, code=1)
    cache = document["record"]["prefix_cache"]
    assert cache["dtype"] == inputs["cache_dtype"] and cache["off"] == (inputs["device"] == "off")
    assert ("prefix_cache" in kinds(document)) == named
    if named:
        switch = document["look_causes"][kinds(document).index("prefix_cache")]["switch"]
        assert "device to off" in switch and "fp16" in switch
    if inputs["device"] == "off":
        assert "device=off: its prefix cache is ruled out" in document["message"]


def test_a_workflows_prefix_cache_is_read_from_its_widgets():
    text = workflow(
        "0.42.0", {"id": 9, "type": "QwenImage21Cache", "widgets_values": ["int4", "cuda"]}
    )
    record = read_record(Path("w.png"), {"workflow": text})
    assert record.run.prefix_cache == suspects.PrefixCache("QwenImage21Cache", "int4", "cuda")
    muted = workflow(
        "0.42.0",
        {"id": 9, "type": "QwenImage21Cache", "widgets_values": ["int4", "cuda"], "mode": 4},
    )
    assert read_record(Path("w.png"), {"workflow": muted}).run.prefix_cache is None


# RGB static, false colour and ComfyUI's version ---------------------------------------------


def test_rgb_static_from_a_recent_comfyui_names_dynamic_vram_then_the_compiler(
    tmp_path, home, capsys
):
    texts = {"workflow": workflow("0.42.0")}
    document = explained(image(tmp_path, rgb_static("pure"), texts), capsys, code=1)
    assert document["image"]["status"] == "rgb_static"
    assert document["pixels"]["static"]["coloured"] == 1.0
    assert document["pixels"]["saturated"] is None  # static first: no overflow is claimed
    assert document["record"]["version"] == "0.42.0"
    assert kinds(document) == ["dynamic_vram", "model_compiler"]
    vram, compiler = document["look_causes"]
    assert vram["cause"] == "state" and "--disable-dynamic-vram" in vram["switch"]
    assert "will be removed soon" in vram["switch"]
    assert "--disable-comfy-compiler" in compiler["switch"]
    assert "--disable-cuda-graphs" in compiler["switch"]
    assert "ComfyUI 0.42.0, the version the record names" in compiler["words"]
    assert "RGB static, not a picture" in document["message"]


def test_false_colour_from_an_older_comfyui_names_neither_and_says_so(tmp_path, home, capsys):
    # Smooth fields apart around a normal map's blue: not unit normals, so no normal map
    # (a real one is a picture made on purpose: test_on_purpose).
    texts = {"workflow": workflow("0.12.3")}
    document = explained(image(tmp_path, channels_apart(0, NORMAL_BLUE), texts), capsys, code=1)
    assert document["image"]["status"] == "false_colour"
    assert document["pixels"]["false_colour"]["mean"][2] > 200  # blue: a normal map
    assert kinds(document) == []
    assert "shows none of the fast paths" in document["message"]
    # Version unknown: DynamicVRAM "if it is 0.15 or later", first for false colour.
    texts = {"prompt": graph()}
    picture = channels_apart(1, NORMAL_BLUE)
    document = explained(image(tmp_path, picture, texts, "b.png"), capsys, code=1)
    assert kinds(document) == ["dynamic_vram", "model_compiler"]
    assert "if it is 0.15 or later" in document["look_causes"][0]["words"]


def test_swarmui_gets_the_switches_in_its_extra_args(tmp_path, home, capsys):
    params = {"sui_image_params": {"model": "qwen_int8", "seed": 1, "steps": 20}}
    texts = {"parameters": json.dumps(params)}
    document = explained(image(tmp_path, rgb_static("eight"), texts), capsys, code=1)
    assert document["image"]["made_by"] == "swarmui"
    switches = {c["kind"]: c["switch"] for c in document["look_causes"]}
    assert "ExtraArgs" in switches["dynamic_vram"] and "ExtraArgs" in switches["model_compiler"]


# The tool's log ------------------------------------------------------------------------------


COMFY_LOG = """\
Total VRAM 16368 MB, total RAM 64000 MB
ComfyUI version: 0.12.1
[Prompt Server] web root: /comfy/web
ComfyUI version: 0.42.3
model weight dtype torch.bfloat16, manual cast: None
unet unexpected: ['blocks.28.attn.qkv.weight', 'blocks.28.attn.proj.weight', "blocks.29.mlp.w1"]
Prompt executed in 12.01 seconds
"""


def test_a_log_gives_the_version_and_the_loaders_unexpected_keys(tmp_path, home, capsys):
    log = tmp_path / "comfyui.log"
    log.write_text(COMFY_LOG, encoding="utf-8")
    texts = {"prompt": graph()}
    path = image(tmp_path, blocky("smoothed", 32), texts)
    document = explained(path, capsys, "--log", str(log), code=1)
    assert document["log"] == {
        "path": str(log),
        "version": "0.42.3",  # the last start in the log
        "unexpected_keys": [
            {"part": "unet", "count": 3, "first": "blocks.28.attn.qkv.weight"},
        ],
    }
    assert document["record"]["version"] == "0.42.3"
    assert kinds(document)[0] == "unexpected_keys"
    first = document["look_causes"][0]
    assert first["cause"] == "weights" and "3 of the file's unet weights" in first["words"]
    assert "loader (or the model config) made for its variant" in first["switch"]
    # Coloured noise with the same log: the unexpected keys are a note beside its words.
    path = image(tmp_path, decoded_noise(), texts, "n.png")
    document = explained(path, capsys, "--log", str(log), code=1)
    assert document["image"]["status"] == "noise" and kinds(document) == ["unexpected_keys"]
    assert any("did not use 3 of the file's unet weights" in n for n in document["notes"])


@pytest.mark.parametrize("bad", ["missing", "binary"])
def test_a_log_that_cannot_be_read_is_one_sentence(tmp_path, home, capsys, bad):
    log = tmp_path / "comfy.log"
    if bad == "binary":
        log.write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    path = image(tmp_path, blocky("sharp", 16), {"prompt": graph()})
    assert main(["explain", str(path), "--log", str(log)]) == 2
    error = capsys.readouterr().err.strip()
    assert str(log) in error and len(error.splitlines()) == 1
    assert "Traceback" not in error


# No record: nothing claimed -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("picture", "look"),
    [
        (blocky("sharp", 16), "tiled or blocky noise"),
        (rgb_static("pure"), "RGB static"),
        (normal_map(0, 15.0), "false colour"),
    ],
)
def test_a_look_without_a_record_is_not_claimed(tmp_path, home, capsys, picture, look):
    document = explained(image(tmp_path, picture, None), capsys, code=0)
    assert document["image"]["status"] == "unclaimed"
    assert f"looks like {look}" in document["message"]
    assert "does not say which" in document["message"]


def test_the_looks_are_problems_with_words_and_the_terminal_says_them(tmp_path, home, capsys):
    assert set(suspects.LOOKS) <= set(explain.PROBLEMS) and set(suspects.LOOKS) <= set(
        explain.STATUS_WORDS
    )
    texts = {"prompt": graph(("UNETLoader", {"unet_name": "krea2_int8.safetensors"}))}
    path = image(tmp_path, blocky("sharp", 16), texts)
    assert main(["explain", str(path)]) == 1
    out = capsys.readouterr().out
    assert "Pixels:  blocks at 16 px (strength 1.00): tiled noise" in out
    assert "(coloured noise)" not in out


def test_low_bit_forms_are_read_from_file_names():
    assert suspects.low_bit_form("models/unet/krea2_int8_convrot.safetensors") == ("int8", True)
    assert suspects.low_bit_form("Qwen-Image-NVFP4.safetensors") == ("nvfp4", False)
    assert suspects.low_bit_form("flux-dev-int4.gguf") == ("int4", False)
    assert suspects.low_bit_form("convrot_model.safetensors") == ("int8", True)
    assert suspects.low_bit_form("paint8_model.safetensors") is None
    assert suspects.low_bit_form("flux1-dev-fp8.safetensors") is None


# --remake: HalfSafe's own image of the same record ------------------------------------------


def test_remake_compares_a_look_with_halfsafes_own_picture(tmp_path, home, capsys):
    from tests.support.model_files import save_single_file
    from tests.support.tiny_models import build_tiny_sd_pipeline

    folder = home / "ComfyUI" / "models" / "checkpoints"
    folder.mkdir(parents=True)
    save_single_file(build_tiny_sd_pipeline(), folder / "dreamy.safetensors")
    nodes = json.loads(
        graph(("CLIPLoader", {"clip_name": "t5xxl_int8.safetensors"}), ckpt="dreamy.safetensors")
    )
    nodes["5"]["inputs"].update(width=128, height=128)
    path = image(tmp_path, blocky("sharp", 16, size=128), {"prompt": json.dumps(nodes)})
    document = explained(path, capsys, "--remake", code=1)
    assert document["image"]["status"] == "tiled_noise"
    remade = document["remake"]
    assert remade["look"] is None and remade["size"] == [128, 128]
    assert "it is a picture, not tiled or blocky noise" in remade["words"]
    cause = document["cause"]
    assert cause["kind"] == "kernel" and cause["repair"]["verified"] is False
    assert "t5xxl_int8.safetensors" in cause["repair"]["words"]
    assert "came from the tool's run" in document["message"]


def test_a_picture_made_again_with_the_same_look_puts_it_in_the_model():
    from app.core.explain import remake

    picture = blocky("sharp", 16)
    same = remake._look_remade("tiled_noise", picture, picture, "seed 1", 1, (512, 512), None)
    assert same.look == "tiled_noise" and "no picture either (tiled or blocky noise)" in same.words
    assert same.to_json()["look"] == "tiled_noise"
    other = remake._look_remade("false_colour", picture, picture, "seed 1", 1, (512, 512), None)
    assert "no picture either (tiled or blocky noise)" in other.words


def test_the_looks_and_their_switches_are_documented():
    root = Path(__file__).resolve().parents[2]
    json_md = (root / "docs" / "json.md").read_text(encoding="utf-8")
    for word in (
        "`tiled_noise`",
        "`rgb_static`",
        "`false_colour`",
        "`pixels.tiled`",
        "`pixels.static`",
        "`pixels.false_colour`",
        "`record.low_bit_files`",
        "`record.prefix_cache`",
        "`record.inpaint_samplers`",
        "`look_causes`",
        "`log`",
    ):
        assert word in json_md, word
    cli_md = (root / "docs" / "cli.md").read_text(encoding="utf-8")
    for switch in (
        "--disable-comfy-compiler",
        "--disable-cuda-graphs",
        "--disable-dynamic-vram",
        "`device` to off",
        "--log PATH",
        "bf16, fp8 or GGUF",
    ):
        assert switch in cli_md, switch
