"""The hires fix with a pixel upscaler (A1111's Lanczos and Nearest, ComfyUI's ImageScale
methods): the first picture decoded, enlarged as the tool enlarges it, encoded again by the VAE
at the final size and drawn again there; written and read back in each tool's words; a VAE
encoder that overflows only on that path is found by the check of it and repaired by the
generation; an upscaler that is a model file is one sentence naming Lanczos."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from app.core import explain, health, hires
from app.core.errors import HalfSafeError
from app.core.generation import GenerationRequest, generate
from app.core.health.request import CheckRequest, CheckRun
from app.core.hires import Hires
from app.core.settings import PrecisionSettings
from app.core.words import infotext
from tests.support.family_helpers import FP16
from tests.support.generation_models import PROMPT, tiny_model
from tests.support.image_files import a1111_parameters, comfy_prompt, png_text
from tests.support.planted_sd import plant_encoder

# -- the words ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("words", "key"),
    [
        ("Lanczos", "lanczos"),  # A1111
        ("Nearest", "nearest"),
        ("None", "lanczos"),  # A1111's resize without an upscaler ends in Pillow's Lanczos
        ("lanczos (pixels)", "lanczos"),  # ComfyUI's ImageScale, as explain records it
        ("nearest-exact (pixels)", "pixel_nearest_exact"),
        ("bilinear (pixels)", "pixel_bilinear"),
        ("bicubic (pixels)", "pixel_bicubic"),
        ("area (pixels)", "pixel_area"),
        ("nearest-exact", "latent_nearest_exact"),  # ComfyUI's LatentUpscale: latents
        ("Latent (bicubic)", "latent_bicubic"),
        ("4x-UltraSharp", None),
        ("R-ESRGAN 4x+", None),
    ],
)
def test_pixel_upscalers_are_read_in_each_tools_words(words, key):
    assert hires.key_for(words) == key
    if key is not None:
        assert hires.enlarges_pixels(key) == ("pixels" in words or "latent" not in key)


@pytest.mark.parametrize(
    "words",
    [
        "4x-UltraSharp",
        "R-ESRGAN 4x+",
        "SwinIR 4x",
        "LDSR",
        "ScuNET GAN",
        "DAT x4",
        "NMKD-Siax_200k.pth",  # ComfyUI's UpscaleModelLoader: the file's name
    ],
)
def test_an_upscaler_model_file_is_one_sentence_naming_lanczos(words):
    sentence = hires.refusal(words)
    assert sentence == (
        f"HalfSafe does not run the upscaler {words} (a model file of its own that enlarges the "
        "decoded picture); the closest it runs is Lanczos."
    )
    assert hires.is_model_upscaler(words)
    with pytest.raises(HalfSafeError, match="the closest it runs is Lanczos"):
        Hires(scale=2.0, upscaler=words).checked()


def test_a_hires_fix_starts_from_pixels_only_when_on_with_a_pixel_upscaler():
    assert Hires(scale=2.0, upscaler="lanczos").pixels
    assert Hires(scale=1.5, upscaler="pixel_area").pixels
    assert not Hires(scale=1.0, upscaler="lanczos").pixels  # off
    assert not Hires(scale=2.0, upscaler="latent_bicubic").pixels


def test_the_cli_takes_a_pixel_upscaler_and_refuses_a_model_file_with_exit_2(capsys, tmp_path):
    from app.cli import main
    from app.cli.arguments import build_parser

    parsed = build_parser().parse_args(["generate", "demo", "--hires-upscaler", "Lanczos"])
    assert parsed.hires_upscaler == "lanczos"
    with pytest.raises(SystemExit) as exited:
        main(["generate", "demo", "--hires-scale", "2", "--hires-upscaler", "4x-UltraSharp",
              "--out", str(tmp_path)])  # fmt: skip
    assert exited.value.code == 2
    assert "the closest it runs is Lanczos" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# -- enlarging the picture ---------------------------------------------------------------------


def _pictures() -> torch.Tensor:
    generator = torch.Generator().manual_seed(5)
    return torch.rand(2, 3, 24, 16, generator=generator) * 2.2 - 1.1  # a little past [-1, 1]


def test_lanczos_and_nearest_are_pillows_on_the_8_bit_picture_as_a1111_resizes():
    pictures = _pictures()
    for key, resample in (
        ("lanczos", Image.Resampling.LANCZOS),
        ("nearest", Image.Resampling.NEAREST),
    ):
        out = hires.enlarge(pictures, (40, 36), key)
        assert out.shape == (2, 3, 36, 40) and out.dtype == torch.float32
        for index in range(2):
            unit = ((pictures[index] + 1) / 2).clamp(0, 1).permute(1, 2, 0).numpy()
            eight = Image.fromarray((unit * 255).astype(np.uint8), "RGB")
            expected = np.asarray(eight.resize((40, 36), resample=resample)) / 255 * 2 - 1
            got = out[index].permute(1, 2, 0).numpy()
            assert np.allclose(got, expected, atol=1e-6), key


def test_comfyuis_methods_interpolate_the_picture_in_0_to_1():
    pictures = _pictures()
    unit = ((pictures + 1) / 2).clamp(0, 1)
    for key, mode in (
        ("pixel_bilinear", "bilinear"),
        ("pixel_bicubic", "bicubic"),
        ("pixel_nearest_exact", "nearest-exact"),
        ("pixel_area", "area"),
    ):
        expected = torch.nn.functional.interpolate(unit, size=(36, 40), mode=mode) * 2 - 1
        torch.testing.assert_close(hires.enlarge(pictures, (40, 36), key), expected)


def test_a_non_finite_picture_stays_non_finite_when_enlarged():
    pictures = _pictures()
    pictures[1, 0, 3, 3] = float("nan")
    for key in ("lanczos", "pixel_bilinear"):
        out = hires.enlarge(pictures, (40, 36), key)
        assert torch.isfinite(out[0]).all() and not torch.isfinite(out[1]).all(), key


# -- a generation ------------------------------------------------------------------------------


def _request(tmp_path, upscaler: str, **change) -> GenerationRequest:
    values = {"prompt": PROMPT, "steps": 4, "seed": 7, "width": 64, "height": 64}
    return GenerationRequest(
        **{**values, **change},
        output_dir=str(tmp_path),
        hires=Hires(scale=1.5, steps=3, denoise=0.5, upscaler=upscaler),
    )


def _encoder_calls(model) -> list[tuple[int, ...]]:
    """The sizes of the pictures the VAE's encoder reads from now on."""
    calls: list[tuple[int, ...]] = []
    model.pipeline.vae.encoder.register_forward_hook(
        lambda _module, args, _output: calls.append(tuple(args[0].shape))
    )
    return calls


def test_a_lanczos_hires_fix_encodes_the_enlarged_picture_and_is_recorded_and_read_back(
    tmp_path, home
):
    model = tiny_model()
    calls = _encoder_calls(model)
    seen: list[tuple[str, int, int]] = []
    result = generate(
        model,
        _request(tmp_path, "lanczos"),
        precision=PrecisionSettings(),
        device="cpu",
        on_progress=lambda stage, done, total: seen.append((stage, done, total)),
    )
    (image,) = result.images
    assert image.image.size == (96, 96) and image.status == "ok"
    assert calls == [(1, 3, 96, 96)]  # the first picture, enlarged, encoded at the final size
    assert ("Enlarging the picture", 0, 1) in seen and ("Hires fix", 3, 3) in seen
    parsed = infotext.parse(image.parameters)
    assert parsed.get(infotext.SIZE) == (64, 64)
    assert parsed.get(infotext.HIRES_UPSCALER) == "Lanczos"
    assert json.loads(json.dumps(result.to_json()))["hires"]["upscaler"] == "lanczos"
    record, _status, _ = explain.read_image(image.path)
    assert (record.hires_size, record.hires_upscaler) == ((96, 96), "Lanczos")
    assert hires.key_for(record.hires_upscaler) == "lanczos"
    # Made again from its record: the same picture.
    again = generate(
        model,
        _request(tmp_path / "again", hires.key_for(record.hires_upscaler) or ""),
        precision=PrecisionSettings(),
        device="cpu",
    ).images[0]
    assert np.array_equal(np.asarray(again.image), np.asarray(image.image))


def test_a_latent_hires_fix_never_runs_the_vae_encoder(tmp_path, home):
    model = tiny_model()
    calls = _encoder_calls(model)
    result = generate(
        model, _request(tmp_path, "latent"), precision=PrecisionSettings(), device="cpu"
    )
    assert result.images[0].image.size == (96, 96) and calls == []


def test_a_batch_enlarges_each_picture_as_it_would_alone(tmp_path, home):
    model = tiny_model()
    batch = generate(
        model,
        _request(tmp_path / "batch", "pixel_bicubic", batch=2),
        precision=PrecisionSettings(precision="fp32"),
        device="cpu",
    ).images
    alone = generate(
        model,
        _request(tmp_path / "alone", "pixel_bicubic", seed=8),
        precision=PrecisionSettings(precision="fp32"),
        device="cpu",
    ).images[0]
    assert [image.seed for image in batch] == [7, 8]
    difference = np.abs(np.asarray(batch[1].image).astype(int) - np.asarray(alone.image))
    assert difference.max() <= 1


# -- a VAE encoder that overflows only on the pixel path --------------------------------------


def test_a_planted_encoder_overflow_shows_only_on_the_pixel_path_and_is_repaired(tmp_path, home):
    model = tiny_model()
    layer = plant_encoder(model.pipeline)
    latent = generate(model, _request(tmp_path / "latent", "latent"), precision=FP16, device="cpu")
    assert latent.images[0].status == "ok"  # the encoder never ran
    result = generate(model, _request(tmp_path / "pixels", "lanczos"), precision=FP16, device="cpu")
    (image,) = result.images
    assert (image.status, image.component) == ("fixed", "vae_encoder")
    assert image.first_bad_module == layer
    assert image.fixes_applied and "VAE" in image.fixes_applied[0]
    assert image.image.size == (96, 96)
    assert np.isfinite(np.asarray(image.image, dtype=float)).all()
    assert "NaN component: vae_encoder" in image.parameters


def test_the_check_of_the_pixel_path_probes_the_vae_encoder_at_the_final_size(home):
    model = tiny_model()
    layer = plant_encoder(model.pipeline)
    calls = _encoder_calls(model)
    plain = health.check_loaded(
        model,
        CheckRequest(precision=FP16, device="cpu", size=96),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert plain.verdict == "healthy" and "vae_encoder" not in plain.components
    assert calls == []
    report = health.check_loaded(
        model,
        CheckRequest(precision=FP16, device="cpu", size=96, pixel_upscale=True),
        run=CheckRun(remember=False, measure_cost=False),
    )
    encoder = report.components["vae_encoder"]
    assert calls and {shape[-2:] for shape in calls} == {(96, 96)}
    assert encoder.status.failed and encoder.first_bad_module == layer
    assert not report.components["vae"].status.failed  # the decoder is reported on its own
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    changed = {
        name
        for name, dtype in report.fix.plan.dtypes.items()
        if dtype != report.plan.dtypes[name]
        or report.fix.plan.islands(name) != report.plan.islands(name)
    }
    assert changed == {"vae"}, report.fix.summary
    assert any("encoder was checked at 96 px" in note for note in report.notes)
    assert report.to_json()["components"]["vae_encoder"]["first_bad_module"] == layer


# -- explain reads the pixel path --------------------------------------------------------------


def _asked(tmp_path, monkeypatch, image) -> tuple[dict, list[str]]:
    """What `explain` asks of the check for an image (the check itself stood in for)."""
    from app.core import causes
    from app.core.explain import explanation as module
    from app.core.explain.matching import ModelMatch

    model = tiny_model()
    model.source = str(tmp_path / "anime.safetensors")
    (tmp_path / "anime.safetensors").write_bytes(b"0")
    asked: dict = {}

    def check(_model, request, **_how):
        asked.update(vars(request))  # what the check is asked, field by field
        raise HalfSafeError("stopped here")

    monkeypatch.setattr(causes, "check_and_attribute", check)
    record, status, figures = explain.read_image(image)
    match = ModelMatch(True, model.source, [str(tmp_path)], matched_by="name")
    found = module.Explanation(str(image), "a1111", status, record, figures, match)
    with pytest.raises(HalfSafeError, match="stopped here"):
        module._run_check(found, "cpu", model, False, lambda *_: None, None)
    return asked, found.notes


@pytest.mark.parametrize(
    ("upscaler", "pixels"),
    [("Lanczos", True), ("Latent", False), ("4x-UltraSharp", True), ("Nearest", True)],
)
def test_explain_checks_an_a1111_hires_image_on_the_path_its_upscaler_took(
    tmp_path, home, monkeypatch, upscaler, pixels
):
    text = a1111_parameters(
        "anime",
        "0123456789",
        **{"Hires upscale": 1.5, "Hires upscaler": upscaler, "Size": "64x64"},
    )
    image = png_text(tmp_path / "00001-1.png", {"parameters": text})
    asked, notes = _asked(tmp_path, monkeypatch, image)
    assert asked["size"] == 96 and asked["pixel_upscale"] is pixels
    assert any("drawn again at 96x96" in note for note in notes)
    assert any("the VAE's encoder at that size" in note for note in notes) is pixels
    assert any("closest it runs is Lanczos" in note for note in notes) is (upscaler[0] == "4")


def test_explain_checks_a_comfyui_pixel_upscale_between_two_samplers_with_it(
    tmp_path, home, monkeypatch
):
    """VAEDecode -> ImageScaleBy(lanczos) -> VAEEncode -> KSampler: read as a second pass at
    the enlarged size from Lanczos, checked there with the VAE's encoder."""
    graph = json.loads(comfy_prompt("anime.safetensors"))
    graph.update(
        {
            "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
            "9": {
                "class_type": "ImageScaleBy",
                "inputs": {"upscale_method": "lanczos", "scale_by": 1.5, "image": ["8", 0]},
            },
            "10": {"class_type": "VAEEncode", "inputs": {"pixels": ["9", 0], "vae": ["4", 2]}},
            "11": {
                "class_type": "KSampler",
                "inputs": {
                    **graph["3"]["inputs"],
                    "denoise": 0.5,
                    "latent_image": ["10", 0],
                },
            },
            "12": {"class_type": "VAEDecode", "inputs": {"samples": ["11", 0], "vae": ["4", 2]}},
        }
    )
    image = png_text(tmp_path / "ComfyUI_00001_.png", {"prompt": json.dumps(graph)})
    record, _status, _ = explain.read_image(image)
    assert (record.width, record.hires_size, record.hires_upscaler) == (
        64,
        (96, 96),
        "lanczos (pixels)",
    )
    assert hires.key_for(record.hires_upscaler) == "lanczos"
    asked, notes = _asked(tmp_path, monkeypatch, image)
    assert asked["size"] == 96 and asked["pixel_upscale"] is True
    assert any("the VAE's encoder at that size" in note for note in notes)


def test_the_cause_of_an_encoder_nan_on_the_pixel_path_is_precision_not_chance(home):
    """The attribution's identical re-run runs the text-to-image path, without the VAE's
    encoder: it cannot call the encoder's NaN intermittent, and the verified fix stands."""
    from app.core import causes

    model = tiny_model()
    plant_encoder(model.pipeline)
    report = causes.check_and_attribute(
        model,
        CheckRequest(precision=FP16, device="cpu", size=96, pixel_upscale=True),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.components["vae_encoder"].status.failed
    assert report.verdict == "fixable" and report.cause is not None
    assert report.cause.kind == "precision", report.cause.summary


def test_a_vae_decoder_overflow_on_the_pixel_path_is_the_first_pictures_decode_and_is_repaired(
    tmp_path, home
):
    """The first picture's decode, before it is enlarged, is where a decoder overflow first
    shows on the pixel path: named the VAE's (not the encoder's or the second pass's, which
    only read its NaN), probed on the first pass's latents, and the image made again whole."""
    from tests.support.planted_sd import VAE_LAYER, plant

    model = tiny_model()
    plant(model.pipeline, "vae")
    result = generate(model, _request(tmp_path, "lanczos"), precision=FP16, device="cpu")
    (image,) = result.images
    assert (image.status, image.component, image.step) == ("fixed", "vae", None)
    assert image.first_bad_module == VAE_LAYER
    assert image.image.size == (96, 96)
    assert np.asarray(image.image).std() > 0  # a picture, not a flat fill
