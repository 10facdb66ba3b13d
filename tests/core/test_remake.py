"""`explain --remake`: an image made again from its record with its model and compared with the
file. A file that is the picture's negative (colours inverted after the model made it, as a
warm decode does) is "inverted", its cause the tool's memory with the tool's switch; the picture
itself matches; another picture (another seed, A1111's GPU noise) claims nothing; a NaN-black
image made by a true fp16 overflow in the same model is still the check's overflow.

The tool's picture is made here by HalfSafe's own generation in fp32, from the seed and
settings its record says (ComfyUI draws its starting noise on the CPU, as HalfSafe does), so
the remake, in the image's own fp16, is another run of the same model at another precision."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from app.cli import main
from app.core import samplers
from app.core.explain import remake
from app.core.explain.records import read_record
from app.core.generation import GenerationRequest
from app.core.generation.entry import generate_unsaved
from app.core.models import load_model
from app.core.settings import PrecisionSettings
from tests.support.explain_pictures import decoded_noise, one_over_f, written
from tests.support.image_files import a1111_parameters, comfy_prompt, png_text
from tests.support.model_files import save_single_file
from tests.support.planted_sd import plant
from tests.support.tiny_models import build_tiny_sd_pipeline

SEED = 42  # comfy_prompt's KSampler: 12 steps, CFG 7, euler/normal, 64x64


@pytest.fixture
def comfy_model(home):
    """A tiny SD checkpoint where ComfyUI keeps it, and the model loaded."""
    folder = home / "ComfyUI" / "models" / "checkpoints"
    folder.mkdir(parents=True)
    path = folder / "dreamy.safetensors"
    save_single_file(build_tiny_sd_pipeline(), path)
    return load_model(path)


def drawn(model, seed: int = SEED, **change) -> np.ndarray:
    """The picture the tool made: comfy_prompt's settings, `seed`, in fp32 on the CPU."""
    values = {"prompt": "a lighthouse", **change}
    request = GenerationRequest(
        negative_prompt="blurry",
        steps=12,
        cfg=7.0,
        seed=seed,
        width=64,
        height=64,
        scheduler=samplers.read("euler", "normal")[0],
        **values,
    )
    result = generate_unsaved(
        model, request, precision=PrecisionSettings(precision="fp32"), device="cpu"
    )
    image = result.images[0].image
    assert image is not None
    return np.asarray(image.convert("RGB"))


def comfy_image(tmp_path, pixels: np.ndarray, name: str = "ComfyUI_00001_.png"):
    graph = comfy_prompt("dreamy.safetensors")
    return png_text(tmp_path / name, {"prompt": graph}, Image.fromarray(pixels))


def explained(image, capsys, *flags: str, code: int | None = None) -> dict:
    found = main(["explain", str(image), "--json", "--device", "cpu", *flags])
    document = json.loads(capsys.readouterr().out)
    if code is not None:
        assert found == code, document["message"]
    return document


# The comparison ---------------------------------------------------------------------------


def test_the_comparison_tells_a_picture_its_negative_and_another_picture_apart():
    rng = np.random.default_rng(0)
    # A picture: large shapes (a gradient and a disc) with fine noise over them.
    y, x = np.mgrid[0:96, 0:128]
    base = 40 + 150 * x / 128 + 60 * ((x - 64) ** 2 + (y - 48) ** 2 < 900)
    picture = np.clip(base[..., None] + rng.normal(0, 12, (96, 128, 3)), 0, 255).astype(np.uint8)
    other = np.clip(
        (220 - 150 * y / 96)[..., None] + rng.normal(0, 12, (96, 128, 3)), 0, 255
    ).astype(np.uint8)
    regrained = np.clip(picture + rng.normal(0, 6, picture.shape), 0, 255).astype(np.uint8)
    assert remake.correlation(picture, regrained) > 0.99
    assert remake.correlation(picture, 255 - picture) == pytest.approx(-1.0, abs=1e-3)  # rounding
    assert abs(remake.correlation(picture, other)) < 0.5
    assert remake.correlation(picture, np.full_like(picture, 128)) == 0.0  # nothing to compare
    # Another size of the same picture (a file saved smaller) is the same picture.
    smaller = np.asarray(Image.fromarray(picture).resize((64, 48), Image.Resampling.LANCZOS))
    assert remake.correlation(picture, smaller) > 0.95
    assert remake.verdict(regrained, picture)[0] == "matches"
    assert remake.verdict(255 - picture, picture)[0] == "inverted"
    assert remake.verdict(other, picture)[0] == "differs"


def test_records_give_the_prompts_and_where_the_noise_was_made(tmp_path):
    black = Image.fromarray(np.zeros((64, 64, 3), np.uint8))
    comfy = read_record(
        png_text(tmp_path / "c.png", {"prompt": comfy_prompt("a.safetensors")}, black),
        {"prompt": comfy_prompt("a.safetensors")},
    )
    assert (comfy.prompt, comfy.negative_prompt, comfy.noise_source) == (
        "a lighthouse",
        "blurry",
        "cpu",
    )
    text = a1111_parameters("a", "0123456789")  # "a lighthouse at night", "blurry"
    assert read_record(tmp_path / "a.png", {"parameters": text}).noise_source == "gpu"
    cpu = text.replace("Version:", "RNG: CPU, Version:")
    record = read_record(tmp_path / "a.png", {"parameters": cpu})
    assert (record.negative_prompt, record.noise_source) == ("blurry", "cpu")


def test_a_guidance_distilled_image_is_made_again_with_its_guidance(tmp_path):
    black = Image.fromarray(np.zeros((64, 64, 3), np.uint8))
    graph = json.loads(comfy_prompt("flux1-dev.safetensors"))
    graph["3"]["inputs"]["cfg"] = 1.0  # ComfyUI's Flux.1 dev: no CFG batch, guidance beside
    graph["9"] = {
        "class_type": "FluxGuidance",
        "inputs": {"guidance": 3.5, "conditioning": ["6", 0]},
    }
    text = {"prompt": json.dumps(graph)}
    comfy = read_record(png_text(tmp_path / "c.png", text, black), text)
    assert (comfy.cfg, comfy.guidance) == (1.0, 3.5)
    assert remake.request_of(comfy, 64, 64).cfg == 3.5
    forge = a1111_parameters("flux1-dev", "0123456789", "f2.0.1", **{"Distilled CFG Scale": 3.5})
    record = read_record(
        tmp_path / "f.png", {"parameters": forge.replace("CFG scale: 7", "CFG scale: 1")}
    )
    assert (record.made_by, record.cfg, record.guidance) == ("forge", 1.0, 3.5)
    assert remake.request_of(record, 64, 64).cfg == 3.5
    # A model with real CFG keeps its scale.
    plain = read_record(tmp_path / "a.png", {"parameters": a1111_parameters("a", "0123456789")})
    assert plain.guidance is None and remake.request_of(plain, 64, 64).cfg == 7.0


# End to end ----------------------------------------------------------------------------------


def test_an_inverted_comfyui_image_is_named_with_its_memory_manager(comfy_model, tmp_path, capsys):
    picture = drawn(comfy_model)
    image = comfy_image(tmp_path, 255 - picture)
    # Its pixels alone are a picture: nothing is claimed without the remake.
    plain = explained(image, capsys, code=0)
    assert plain["image"]["status"] == "ok" and plain["remake"] is None
    document = explained(image, capsys, "--remake", code=1)
    assert document["image"]["status"] == "inverted"
    assert document["remake"]["verdict"] == "inverted"
    assert document["remake"]["correlation"] <= -0.95
    assert document["remake"]["seed"] == SEED and document["remake"]["size"] == [64, 64]
    cause = document["cause"]
    assert cause["kind"] == "state" and cause["repair"]["verified"] is True
    assert "--disable-dynamic-vram" in cause["repair"]["words"]  # ComfyUI's DynamicVRAM
    assert "negative" in document["message"] and "inverted" in document["message"]


def test_the_picture_itself_matches_and_claims_nothing(comfy_model, tmp_path, capsys):
    image = comfy_image(tmp_path, drawn(comfy_model))
    document = explained(image, capsys, "--remake", code=0)
    assert document["image"]["status"] == "ok" and document["cause"] is None
    assert document["remake"]["verdict"] == "matches"
    assert document["remake"]["correlation"] >= 0.95  # fp32 here, fp16 in the remake
    assert "same picture" in document["message"]
    # With a face fix in its graph, the pictures are compared box by box too: nothing differs.
    graph = json.loads(comfy_prompt("dreamy.safetensors"))
    graph["10"] = {"class_type": "FaceDetailer", "inputs": {"denoise": 0.4, "image": ["8", 0]}}
    image = png_text(
        tmp_path / "ComfyUI_00003_.png",
        {"prompt": json.dumps(graph)},
        Image.fromarray(drawn(comfy_model)),
    )
    document = explained(image, capsys, "--remake", code=0)
    assert document["record"]["second_passes"][0]["name"] == "FaceDetailer"
    assert document["remake"]["verdict"] == "matches" and document["remake"]["pass_box"] is None


def test_another_picture_claims_nothing_and_says_why(comfy_model, home, tmp_path, capsys):
    # A ComfyUI record whose picture came from another seed.
    image = comfy_image(tmp_path, 255 - drawn(comfy_model, seed=7))
    document = explained(image, capsys, "--remake", code=0)
    assert document["remake"]["verdict"] == "differs" and document["cause"] is None
    assert abs(document["remake"]["correlation"]) < 0.8
    assert any("another picture" in note for note in document["notes"])
    # An A1111 image: its noise came from the GPU (its default), which HalfSafe does not draw.
    folder = home / "stable-diffusion-webui" / "models" / "Stable-diffusion"
    folder.mkdir(parents=True)
    save_single_file(build_tiny_sd_pipeline(), folder / "anime.safetensors")
    # Its picture here stands for one from GPU noise: another seed's.
    text = a1111_parameters("anime", "0123456789", Sampler="Euler")
    picture = drawn(comfy_model, seed=7, prompt="a lighthouse at night")
    a1111 = png_text(tmp_path / "00001-1234.png", {"parameters": text}, Image.fromarray(picture))
    document = explained(a1111, capsys, "--remake", code=0)
    assert document["record"]["noise_source"] == "gpu"
    assert document["remake"]["verdict"] == "differs"
    assert any("starting noise on the GPU" in note for note in document["notes"])


def test_a_record_that_cannot_make_the_image_again_says_so(comfy_model, tmp_path, capsys):
    graph = json.loads(comfy_prompt("dreamy.safetensors"))
    del graph["3"]["inputs"]["seed"]
    image = png_text(
        tmp_path / "ComfyUI_00002_.png",
        {"prompt": json.dumps(graph)},
        Image.fromarray(255 - drawn(comfy_model)),
    )
    document = explained(image, capsys, "--remake", code=0)
    assert document["remake"] is None and document["image"]["status"] == "ok"
    assert any("not made again: its record gives no seed" in n for n in document["notes"])


def test_a_true_overflow_in_the_same_model_is_still_the_checks(home, tmp_path, capsys):
    folder = home / "ComfyUI" / "models" / "checkpoints"
    folder.mkdir(parents=True)
    save_single_file(plant(build_tiny_sd_pipeline(), "vae"), folder / "dreamy.safetensors")
    black = np.zeros((64, 64, 3), np.uint8)
    document = explained(comfy_image(tmp_path, black), capsys, "--remake", code=1)
    assert document["image"]["status"] == "nan" and document["remake"] is None
    assert document["check"]["verdict"] == "fixable"
    assert document["check"]["cause"]["kind"] == "precision"
    assert any("not made again" in note for note in document["notes"])


# A pass over one region, proved against the picture made again -----------------------------

BOX = (160, 96, 352, 288)  # a face-sized box in a 512 px picture, on the 32 px grid


def brightness_noise(tint: tuple[float, float, float], seed: int = 5) -> np.ndarray:
    """Noise in brightness only, in grains a latent cell (8 px) wide, tinted: brown or grey
    noise, which the pixels alone do not tell from a texture."""
    x0, y0, x1, y1 = BOX
    rng = np.random.default_rng(seed)
    cells = rng.random(((y1 - y0) // 8, (x1 - x0) // 8))
    grains = np.asarray(
        Image.fromarray((cells * 255).astype(np.uint8)).resize(
            (x1 - x0, y1 - y0), Image.Resampling.BILINEAR
        ),
        dtype=np.float64,
    )
    return np.clip(grains[..., None] * np.array(tint), 0, 255).astype(np.uint8)


def boxed(picture: np.ndarray, patch: np.ndarray) -> np.ndarray:
    x0, y0, x1, y1 = BOX
    out = picture.copy()
    out[y0:y1, x0:x1] = patch
    return out


def made_again(picture: np.ndarray) -> np.ndarray:
    """The same picture from another run: its last bits differ (fp16 against fp32)."""
    rng = np.random.default_rng(11)
    return np.clip(picture + rng.normal(0, 2.0, picture.shape), 0, 255).astype(np.uint8)


@pytest.mark.parametrize(
    "patch",
    [
        pytest.param(lambda: brightness_noise((0.8, 0.55, 0.3)), id="brown noise"),
        pytest.param(lambda: brightness_noise((0.7, 0.7, 0.7)), id="grey noise"),
        pytest.param(lambda: with_colour(), id="coloured noise"),
    ],
)
def test_noise_a_pass_left_in_its_box_is_found_whatever_its_colour(patch):
    picture = written(one_over_f(1), 0.5, 0.2)
    found = remake.pass_box(boxed(picture, patch()), made_again(picture))
    assert found is not None and found.box == BOX
    assert found.outside >= 0.95 and found.structure <= 0.1 and found.made_structure >= 0.12
    assert found.share == pytest.approx(192 * 192 / 512**2)


def with_colour() -> np.ndarray:
    x0, y0, x1, y1 = BOX
    noise = Image.fromarray(decoded_noise(3)).resize((x1 - x0, y1 - y0), Image.Resampling.BILINEAR)
    return np.asarray(noise)


def test_a_pass_that_drew_a_picture_or_nothing_is_not_claimed():
    picture = written(one_over_f(1), 0.5, 0.2)
    x0, y0, x1, y1 = BOX
    face = written(one_over_f(30), 0.5, 0.2)[y0:y1, x0:x1]  # the pass drew a face again
    assert remake.pass_box(boxed(picture, face), made_again(picture)) is None
    assert remake.pass_box(picture, made_again(picture)) is None  # nothing changed
    grained = written(one_over_f(1), 0.5, 0.2, grain=0.05)  # grain over all of it
    assert remake.pass_box(grained, picture) is None
    # Another picture altogether (another seed): no box, the rest does not match.
    other = written(one_over_f(2), 0.5, 0.2)
    noisy = boxed(other, brightness_noise((0.8, 0.55, 0.3)))
    assert remake.pass_box(noisy, picture) is None
    # Where the picture made again had no shapes in the box either, nothing is proved.
    flat_sky = picture.copy()
    flat_sky[y0:y1, x0:x1] = 128
    assert remake.pass_box(boxed(picture, brightness_noise((0.8, 0.55, 0.3))), flat_sky) is None


def test_a_pass_box_is_the_images_noise_region_with_the_pass_named(tmp_path):
    from app.core.explain import explanation as module
    from app.core.explain.matching import ModelMatch
    from app.core.explain.message import _status_words
    from app.core.explain.pixels import PixelFigures
    from app.core.explain.regions import SecondPass

    picture = written(one_over_f(1), 0.5, 0.2)
    box = remake.pass_box(boxed(picture, brightness_noise((0.8, 0.55, 0.3))), made_again(picture))
    assert box is not None
    record = read_record(tmp_path / "a.png", {"parameters": a1111_parameters("a", "0123456789")})
    record.second_passes = [SecondPass("ADetailer", "face_yolov8n.pt", 0.4)]
    remade = remake.Remade("pass_noise", 0.9, "the pass's box is noise", 1234, (512, 512), box)
    found = module.Explanation(
        "x.png", "a1111", "ok", record, PixelFigures(), ModelMatch(True, "/m/a.safetensors", [])
    )
    module.take_remade(found, remade, state="")
    assert found.status == "noise_region" and found.problem and found.cause is None
    words = _status_words(found)
    assert "the pass's box is noise" in words and "ADetailer (detector face_yolov8n.pt" in words
    assert found.to_json()["remake"]["pass_box"]["box"] == list(BOX)


# What must never be claimed, and records that cannot be made again ---------------------------


def test_a_dim_or_nearly_flat_file_is_neither_the_picture_nor_its_negative():
    picture = written(one_over_f(1), 0.5, 0.2)
    # Three grey levels that happen to follow the picture's negative: correlated, not close.
    levels = np.digitize(255 - picture.mean(axis=-1), [100, 160])
    dim = np.repeat((10 + 4 * levels)[..., None], 3, axis=-1).astype(np.uint8)
    assert remake.correlation(dim, picture) <= -0.8
    assert remake.verdict(dim, picture)[0] == "differs"
    assert remake.verdict(255 - picture, picture)[0] == "inverted"
    assert remake.verdict(made_again(picture), picture)[0] == "matches"


def test_records_that_cannot_make_their_image_again_say_why(tmp_path):
    black = Image.fromarray(np.zeros((64, 64, 3), np.uint8))

    def comfy(change) -> str | None:
        graph = json.loads(comfy_prompt("a.safetensors"))
        change(graph)
        text = {"prompt": json.dumps(graph)}
        return remake.missing(read_record(png_text(tmp_path / "c.png", text, black), text))

    assert comfy(lambda g: None) is None
    big_seed = comfy(lambda g: g["3"]["inputs"].update(seed=2**40))
    assert big_seed is not None and "1099511627776" in big_seed
    assert "image-to-image" in (comfy(lambda g: g["3"]["inputs"].update(denoise=0.6)) or "")
    img2img = a1111_parameters("a", "0123456789", **{"Denoising strength": 0.5})
    assert "image-to-image" in (
        remake.missing(read_record(tmp_path / "a.png", {"parameters": img2img})) or ""
    )


def test_a_comfyui_prompt_is_read_through_the_conditioning_nodes_between(tmp_path):
    graph = json.loads(comfy_prompt("flux1-dev.safetensors"))
    graph["9"] = {
        "class_type": "FluxGuidance",
        "inputs": {"guidance": 3.5, "conditioning": ["6", 0]},
    }
    graph["3"]["inputs"]["positive"] = ["9", 0]
    graph["10"] = {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}}
    text = {"prompt": json.dumps(graph)}
    black = Image.fromarray(np.zeros((64, 64, 3), np.uint8))
    record = read_record(png_text(tmp_path / "c.png", text, black), text)
    assert (record.prompt, record.negative_prompt, record.guidance) == (
        "a lighthouse",
        "blurry",
        3.5,
    )
    # Through a ControlNet's advanced apply, each prompt by its own output.
    graph["12"] = {
        "class_type": "ControlNetApplyAdvanced",
        "inputs": {"positive": ["9", 0], "negative": ["7", 0], "strength": 0.8},
    }
    graph["3"]["inputs"].update(positive=["12", 0], negative=["12", 1])
    text = {"prompt": json.dumps(graph)}
    record = read_record(png_text(tmp_path / "e.png", text, black), text)
    assert (record.prompt, record.negative_prompt) == ("a lighthouse", "blurry")
    graph["3"]["inputs"].update(positive=["9", 0], negative=["7", 0])
    # A conditioning loop leads nowhere, in bounded steps.
    graph["9"]["inputs"]["conditioning"] = ["9", 0]
    text = {"prompt": json.dumps(graph)}
    assert read_record(png_text(tmp_path / "d.png", text, black), text).prompt == ""


@pytest.mark.parametrize("chunk", ["[1]", '"abc"', "42", "null"])
def test_a_prompt_chunk_that_is_no_graph_is_read_without_a_prompt(tmp_path, chunk):
    black = Image.fromarray(np.zeros((64, 64, 3), np.uint8))
    image = png_text(tmp_path / "ComfyUI_00001_.png", {"prompt": chunk}, black)
    record = read_record(image, {"prompt": chunk})
    assert record.made_by == "comfyui" and record.prompt == ""


def saving(graph: dict, *chain: str, prefix: str = "ComfyUI", saver: str = "12") -> dict:
    """`graph` with a VAE decode of its sampler's latents (node "8"), then the image nodes
    `chain` in turn, then a SaveImage (`saver`) of the last with `prefix`."""
    graph["8"] = {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}}
    link = ["8", 0]
    for number, kind in enumerate(chain):
        node_id = f"{saver}{number}"
        graph[node_id] = {"class_type": kind, "inputs": {"image": link}}
        link = [node_id, 0]
    graph[saver] = {
        "class_type": "SaveImage",
        "inputs": {"images": link, "filename_prefix": prefix},
    }
    return graph


def test_a_graph_that_inverts_its_picture_matches_its_negative(comfy_model, tmp_path, capsys):
    graph = saving(json.loads(comfy_prompt("dreamy.safetensors")), "ImageInvert")
    image = png_text(
        tmp_path / "ComfyUI_00004_.png",
        {"prompt": json.dumps(graph)},
        Image.fromarray(255 - drawn(comfy_model)),
    )
    document = explained(image, capsys, "--remake", code=0)
    assert document["record"]["inverts"] == "ImageInvert"
    assert document["image"]["status"] == "ok" and document["cause"] is None
    assert document["remake"]["verdict"] == "matches"
    assert "ImageInvert" in document["remake"]["words"]


def test_a_seed_beyond_halfsafes_is_a_note_and_the_explanation_stays(comfy_model, tmp_path, capsys):
    graph = json.loads(comfy_prompt("dreamy.safetensors"))
    graph["3"]["inputs"]["seed"] = 2**40  # ComfyUI's randomize draws seeds up to 2**64
    image = png_text(
        tmp_path / "ComfyUI_00005_.png",
        {"prompt": json.dumps(graph)},
        Image.fromarray(drawn(comfy_model)),
    )
    document = explained(image, capsys, "--remake", code=0)
    assert document["image"]["status"] == "ok" and document["remake"] is None
    assert any("not made again: its seed 1099511627776" in n for n in document["notes"])
    # A value HalfSafe refuses once generation reads it is a note too, not the command's end.
    graph["3"]["inputs"].update(seed=42, steps=5000)  # past HalfSafe's most steps
    image = png_text(
        tmp_path / "ComfyUI_00006_.png",
        {"prompt": json.dumps(graph)},
        Image.fromarray(drawn(comfy_model)),
    )
    document = explained(image, capsys, "--remake", code=0)
    assert document["remake"] is None
    assert any(n.startswith("It was not made again: ") for n in document["notes"])


def test_lora_tags_in_a_comfyui_prompt_are_text(home, tmp_path, capsys):
    folder = home / "ComfyUI" / "models" / "checkpoints"
    folder.mkdir(parents=True)
    save_single_file(plant(build_tiny_sd_pipeline(), "vae"), folder / "dreamy.safetensors")
    graph = json.loads(comfy_prompt("dreamy.safetensors"))
    graph["6"]["inputs"]["text"] = "a lighthouse <lora:add_detail:0.8>"
    image = png_text(
        tmp_path / "ComfyUI_00007_.png",
        {"prompt": json.dumps(graph)},
        Image.fromarray(np.zeros((64, 64, 3), np.uint8)),
    )
    document = explained(image, capsys, code=1)
    assert document["check"]["verdict"] == "fixable"
    assert not any("LoRA" in note for note in document["notes"])


def test_the_engines_model_is_used_when_the_image_names_the_vae_it_runs(tmp_path):
    """A ComfyUI Flux.1 graph names its VAE (ae.safetensors): the model the engine holds,
    loaded with that file, is used, never loaded a second time beside it."""
    from app.core.explain import explanation as module
    from app.core.explain.matching import ModelMatch
    from app.core.explain.pixels import PixelFigures
    from app.core.jobs import CancelToken, no_progress
    from app.core.models import load_model as load
    from tests.support.model_files import save_split_files
    from tests.support.tiny_models import build_tiny_flux_pipeline

    written = save_split_files(build_tiny_flux_pipeline(), tmp_path / "models")
    model = load(str(written["transformer"]))  # its companions found beside it
    found = ModelMatch(True, str(written["transformer"]), [])
    record = read_record(tmp_path / "a.png", {"prompt": comfy_prompt("flux1.safetensors")})
    image = module.Explanation("x.png", "comfyui", "ok", record, PixelFigures(), found)
    same = module._image_model(
        image, written["vae"], model, no_progress, CancelToken(), who="HalfSafe"
    )
    assert same is model
    other = tmp_path / "other-vae.safetensors"
    other.write_bytes(written["vae"].read_bytes())
    fresh = module._image_model(image, other, model, no_progress, CancelToken(), who="HalfSafe")
    assert fresh is not model  # another VAE asked: the model is loaded with it


def test_an_invert_on_a_branch_never_saved_is_not_the_files(comfy_model, tmp_path, capsys):
    """A mask branch inverts the decoded picture (ImageInvert, then ImageToMask into nothing
    saved); the file is the picture the SaveImage wrote straight from the decoder: it matches,
    never "inverted"."""
    graph = saving(json.loads(comfy_prompt("dreamy.safetensors")))
    graph["20"] = {"class_type": "ImageInvert", "inputs": {"image": ["8", 0]}}
    graph["21"] = {"class_type": "ImageToMask", "inputs": {"image": ["20", 0], "channel": "red"}}
    image = png_text(
        tmp_path / "ComfyUI_00007_.png",
        {"prompt": json.dumps(graph)},
        Image.fromarray(drawn(comfy_model)),
    )
    document = explained(image, capsys, "--remake", code=0)
    assert document["record"]["inverts"] is None
    assert document["record"]["inverts_unsure"] is None
    assert document["image"]["status"] == "ok" and document["cause"] is None
    assert document["remake"]["verdict"] == "matches"
    assert "ImageInvert" not in document["remake"]["words"]


def test_the_files_saver_is_told_by_its_name_among_several(tmp_path):
    """A graph saving the picture ("pic") and its negative ("neg"): each file is read through
    its own saver's chain; a file whose name names neither may be both."""
    graph = saving(json.loads(comfy_prompt("dreamy.safetensors")), prefix="renders/pic")
    graph = saving(graph, "ImageScale", "ImageInvert", prefix="neg", saver="30")
    text = {"prompt": json.dumps(graph)}
    picture = read_record(tmp_path / "pic_00001_.png", text)
    negative = read_record(tmp_path / "neg_00001_.png", text)
    renamed = read_record(tmp_path / "wallpaper.png", text)
    assert (picture.inverts, picture.inverts_unsure) == ("", "")
    assert (negative.inverts, negative.inverts_unsure) == ("ImageInvert", "")
    assert (renamed.inverts, renamed.inverts_unsure) == ("", "ImageInvert")
    # Inverted twice on the way is the picture again.
    twice = saving(json.loads(comfy_prompt("x")), "ImageInvert", "ImageInvert")
    assert read_record(tmp_path / "ComfyUI_00001_.png", {"prompt": json.dumps(twice)}).inverts == ""


def test_a_file_that_may_be_either_save_is_never_called_inverted(comfy_model, tmp_path, capsys):
    graph = saving(json.loads(comfy_prompt("dreamy.safetensors")), "ImageInvert", saver="30")
    graph = saving(graph, prefix="ComfyUI")  # the same prefix, straight from the decoder
    image = png_text(
        tmp_path / "ComfyUI_00008_.png",
        {"prompt": json.dumps(graph)},
        Image.fromarray(255 - drawn(comfy_model)),
    )
    document = explained(image, capsys, "--remake", code=0)
    assert document["record"]["inverts_unsure"] == "ImageInvert"
    assert document["image"]["status"] == "ok" and document["cause"] is None
    assert document["remake"]["verdict"] == "matches"
    assert "does not say which" in document["remake"]["words"]


def test_a_file_smaller_than_its_record_is_made_again_at_its_own_size(
    comfy_model, tmp_path, capsys
):
    """A 64 px file whose record says 256x256 (a 4096 px record on a 128 px file ran for
    minutes) is made at the file's size, and the notes say so."""
    graph = json.loads(comfy_prompt("dreamy.safetensors"))
    graph["5"]["inputs"].update(width=256, height=256)
    image = png_text(
        tmp_path / "ComfyUI_00009_.png",
        {"prompt": json.dumps(graph)},
        Image.fromarray(drawn(comfy_model)),
    )
    document = explained(image, capsys, "--remake", code=0)
    assert document["record"]["size"] == [256, 256]
    assert document["remake"]["size"] == [64, 64]
    assert document["remake"]["verdict"] == "matches"
    assert any("at the file's size, 64x64, not at the 256x256" in n for n in document["notes"])


def test_the_size_made_again_is_bounded_by_the_file():
    from app.core.explain.records import Record

    def size(width, height, file_width, file_height):
        return remake.made_size(Record(width=width, height=height), file_width, file_height)

    made, note = size(4096, 4096, 128, 128)
    assert made == (128, 128) and note is not None and "4096x4096" in note
    assert size(512, 512, 512, 512) == ((512, 512), None)
    # A file enlarged after it was made is still its record's picture: made at that size.
    assert size(512, 512, 1024, 1024) == ((512, 512), None)
    # Sides as generation takes them: multiples of 8, at least 64.
    assert size(1024, 1024, 203, 30)[0] == (200, 64)
    made, note = size(None, None, 300, 200)
    assert made == (296, 200) and note is not None and "no size" in note
