"""Generation with the NaN watch, on tiny SD pipelines with planted faults (every family's
repair of a planted overflow, healthy generation and live previews: test_families.py).

Each plant makes one component overflow fp16 (a layer's weights scaled so its output passes
65504) or poisons one image on purpose; the result must name the component, repair only that
component when allowed (a VAE by decoding the same latents again, without re-running the UNet),
and save every image with its parameters.
"""

from __future__ import annotations

import copy
import json
import types

import numpy as np
import pytest
import torch
from PIL import Image

from app import cli
from app.core import generation, samplers
from app.core.errors import CancelledError, HalfSafeError
from app.core.fixing import profiles
from app.core.generation import GenerationRequest, NanWatch, generate
from app.core.images import finished as images
from app.core.images.finished import ImageSaveError, read_parameters
from app.core.jobs import CancelToken
from app.core.settings import PrecisionSettings
from app.core.words import infotext
from app.core.words.infotext import split_text
from tests.support.generation_models import Poisoned, variant
from tests.support.tiny_models import build_tiny_sd_pipeline

VAE_LAYER = "decoder.up_blocks.0.resnets.0.conv1"
FF_LAYER = "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.0.proj"
TE_LAYER = "encoder.layers.0.mlp.fc1"


def fp16(**kwargs) -> PrecisionSettings:
    return PrecisionSettings(precision="fp16", **kwargs)


@pytest.fixture(scope="module")
def base():
    return build_tiny_sd_pipeline()


@pytest.fixture(scope="module")
def device_name():
    from app.core import hardware

    return hardware.describe_device(hardware.pick_device("cpu")).name


def scaled(module, layer: str, factor: float):
    module = copy.deepcopy(module)
    with torch.no_grad():
        module.get_submodule(layer).weight.mul_(factor)
    return module


class UNetCalls:
    """Counts UNet forward calls, in the loaded UNet and in any copy placed from it (the hook is
    a plain function: copying a module copies its hooks, and a bound method would be copied
    along with its counter)."""

    def __init__(self, unet) -> None:
        counter = self.counter = [0]

        def count(*_):
            counter[0] += 1

        unet.register_forward_hook(count)

    @property
    def count(self) -> int:
        return self.counter[0]


def request(tmp_path, **kwargs) -> GenerationRequest:
    values = {
        "prompt": "a lighthouse at dusk",
        "steps": 3,
        "width": 64,
        "height": 64,
        "seed": 1234,
        "output_dir": str(tmp_path / "out"),
    }
    values.update(kwargs)
    return GenerationRequest(**values)


def pixels(entry) -> np.ndarray:
    with Image.open(entry.path) as image:
        return np.asarray(image.convert("RGB"), dtype=np.float32) / 255


def size_of(path: str) -> tuple[int, int]:
    with Image.open(path) as image:
        return image.size


# --- planted faults ---------------------------------------------------------------------------


def test_vae_overflow_is_reported_with_its_fix_when_auto_fix_is_off(base, tmp_path):
    model = variant(base, "vae-off", vae=scaled(base.vae, VAE_LAYER, 1e6))
    calls = UNetCalls(model.pipeline.unet)
    result = generate(model, request(tmp_path), precision=fp16(auto_fix="off"), device="cpu")
    (entry,) = result.images
    assert (entry.status, entry.component, entry.step) == ("nan", "vae", None)
    assert entry.fix in ({"vae_precision": "bf16"}, {"vae_precision": "fp32"})
    assert entry.fixes_applied == []
    assert "VAE" in entry.message and "NaN" in entry.message
    assert entry.non_finite == 1.0
    assert pixels(entry).max() == 0.0  # kept as it came out: black
    assert result.all_good is False
    assert calls.count == 3
    assert profiles.remembered_fix("vae-off", result.device.name) is None


def test_vae_overflow_is_repaired_from_the_same_latents(base, tmp_path, device_name):
    model = variant(base, "vae-auto", vae=scaled(base.vae, VAE_LAYER, 1e6))
    calls = UNetCalls(model.pipeline.unet)
    result = generate(model, request(tmp_path), precision=fp16(auto_fix="auto"), device="cpu")
    (entry,) = result.images
    assert (entry.status, entry.component) == ("fixed", "vae")
    (fix,) = entry.fixes_applied  # the overflowing VAE layers kept wider, or the whole VAE
    assert "VAE" in fix
    assert entry.first_bad_module == VAE_LAYER
    assert calls.count == 3  # the UNet ran once for this image: only the decode was redone
    image = pixels(entry)
    assert np.isfinite(image).all() and image.std() > 0.01 and image.max() > 0.1
    # Only the VAE changed: the UNet and the text encoder kept fp16.
    assert entry.settings["unet_precision"] == "fp16"
    assert entry.settings["text_encoder_precision"] == "fp16"
    assert entry.settings["no_half"] is False
    assert result.all_good is True
    remembered = profiles.remembered_fix("vae-auto", device_name)
    assert remembered is not None and remembered.verified_by == "generation repair"
    assert remembered.made_at["precision"] == remembered.made_at["vae_precision"] == "fp16"
    assert remembered.parts == ("text_encoder", "unet", "vae")
    assert set(remembered.settings) in ({"vae_precision"}, {"bf16_modules"}, {"fp32_modules"})

    # The next job starts from the remembered fix: nothing goes NaN, nothing to repair.
    again = generate(model, request(tmp_path), precision=fp16(), device="cpu")
    (entry,) = again.images
    assert (entry.status, entry.fixes_applied) == ("ok", [])
    assert {k: entry.settings[k] for k in remembered.settings} == remembered.settings
    assert any("remembered" in warning for warning in again.warnings)


def test_a_fix_stored_while_the_job_ran_is_not_replaced_by_its_repair(base, tmp_path, device_name):
    """A check (here, or in ComfyUI on the same file) stores a fix while a generation runs: the
    generation's repair, proved on the fix it started with, does not replace it at the end (it
    wrote its own over it, a check's proof replaced by a weaker one)."""
    model = variant(base, "vae-race", vae=scaled(base.vae, VAE_LAYER, 1e6))
    checked = {"vae_precision": "fp32"}
    stored: list[bool] = []

    def meanwhile(*_) -> None:
        if not stored:
            stored.append(True)
            profiles.remember_fix("vae-race", device_name, checked, "A check's.", "health check")

    result = generate(
        model,
        request(tmp_path),
        precision=fp16(auto_fix="auto"),
        device="cpu",
        on_progress=meanwhile,
    )
    assert [entry.status for entry in result.images] == ["fixed"]
    remembered = profiles.remembered_fix("vae-race", device_name)
    assert remembered is not None and remembered.settings == checked
    assert remembered.verified_by == "health check"
    assert any("while this job ran" in warning for warning in result.warnings)


def test_ask_offers_a_fix_that_passed_a_quick_test_and_keeps_the_image(base, tmp_path):
    model = variant(base, "vae-ask", vae=scaled(base.vae, VAE_LAYER, 1e6))
    result = generate(model, request(tmp_path), precision=fp16(auto_fix="ask"), device="cpu")
    (entry,) = result.images
    assert (entry.status, entry.component, entry.fixes_applied) == ("nan", "vae", [])
    assert set(entry.fix) in ({"vae_precision"}, {"bf16_modules"}, {"fp32_modules"})
    assert entry.first_bad_module == VAE_LAYER
    assert "quick test" in entry.message
    assert profiles.remembered_fix("vae-ask", result.device.name) is None


def test_unet_overflow_is_reported_then_repaired_with_the_unet_fix(base, tmp_path):
    model = variant(base, "unet", unet=scaled(base.unet, FF_LAYER, 1e5))
    off = generate(model, request(tmp_path), precision=fp16(auto_fix="off"), device="cpu")
    (entry,) = off.images
    assert (entry.status, entry.component, entry.step) == ("nan", "unet", 1)
    assert entry.fix in ({"unet_precision": "bf16"}, {"unet_precision": "fp32"})
    assert "step 1 of 3" in entry.message

    calls = UNetCalls(model.pipeline.unet)
    fixed = generate(model, request(tmp_path), precision=fp16(auto_fix="auto"), device="cpu")
    (entry,) = fixed.images
    assert (entry.status, entry.component, entry.step) == ("fixed", "unet", 1)
    (fix,) = entry.fixes_applied
    assert "UNet" in fix
    assert entry.first_bad_module == FF_LAYER
    assert entry.settings["vae_precision"] == "fp16" and entry.settings["no_half"] is False
    assert np.isfinite(pixels(entry)).all() and pixels(entry).std() > 0.01
    # First run (3 steps), the layer probe, its fp32 twin (the per-layer peaks the islands are
    # drawn from), the fix's one-call check and its fp32 reference, the full re-run.
    assert calls.count == 3 + 1 + 1 + 1 + 1 + 3
    assert entry.quality is not None and entry.quality.passed
    # What the image was made with, in the JSON and in the PNG: the UNet's layers kept wider
    # (bf16 where native, else fp32), the rest of it in fp16.
    key = "bf16_modules" if entry.settings["bf16_modules"] else "fp32_modules"
    layers = entry.settings[key]
    assert layers and all(layer.startswith("unet:") for layer in layers)
    assert entry.settings["unet_precision"] == "fp16"
    assert entry.to_json()["settings"][key] == layers
    label = "BF16 layers" if key == "bf16_modules" else "FP32 layers"
    assert split_text(read_parameters(entry.path))[2][label] == " ".join(layers)


def test_text_encoder_overflow_is_repaired_with_the_encoder_fix(base, tmp_path):
    model = variant(base, "te", text_encoder=scaled(base.text_encoder, TE_LAYER, 1e5))
    result = generate(model, request(tmp_path), precision=fp16(), device="cpu")
    (entry,) = result.images
    assert (entry.status, entry.component, entry.step) == ("fixed", "text_encoder", None)
    assert entry.first_bad_module == TE_LAYER
    assert set(entry.fix) in ({"text_encoder_precision"}, {"bf16_modules"}, {"fp32_modules"})
    assert entry.settings["unet_precision"] == entry.settings["vae_precision"] == "fp16"


def test_a_batch_with_one_bad_image_saves_the_others(base, tmp_path):
    vae = copy.deepcopy(base.vae)
    decodes = []

    def poison_second_image(module, args, output):
        decodes.append(1)
        if len(decodes) == 2:
            output = output.clone()
            output[..., :16, :16] = float("nan")  # a corner: some pixels, not all
            return output
        return None

    vae.decoder.conv_out.register_forward_hook(poison_second_image)
    model = variant(base, "batch", vae=vae)
    # The poison strikes once: with auto_fix the image would be decoded again and come out
    # finite (an intermittent fault, test_intermittent.py); here it is kept as it came out.
    result = generate(
        model,
        request(tmp_path, batch=3),
        precision=PrecisionSettings(auto_fix="off"),
        device="cpu",
    )
    statuses = [e.status for e in result.images]
    assert statuses == ["ok", "nan", "ok"]
    assert [e.seed for e in result.images] == [1234, 1235, 1236]
    bad = result.images[1]
    assert bad.component == "vae" and 0.0 < bad.non_finite < 1.0
    assert "of its pixels" in bad.message
    for entry in result.images:
        assert entry.path and size_of(entry.path) == (64, 64)
    assert len({e.path for e in result.images}) == 3
    assert result.all_good is False


def test_without_the_nan_watch_the_pixels_are_still_classified(base, tmp_path):
    vae = copy.deepcopy(base.vae)
    vae.decoder.conv_out.register_forward_hook(lambda m, a, out: out * float("nan"))
    model = variant(base, "unwatched", vae=vae)
    result = generate(
        model, request(tmp_path), precision=PrecisionSettings(nan_check=False), device="cpu"
    )
    (entry,) = result.images
    assert (entry.status, entry.component, entry.fix) == ("nan", None, None)
    assert "watch was off" in entry.message


# --- black images that are not NaN ---------------------------------------------------------


class FlagEverything(torch.nn.Module):
    """Stands in for StableDiffusionSafetyChecker: flags every image and blanks it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1))

    @property
    def device(self):  # pipelines ask their modules for it, as of any transformers model
        return self.weight.device

    def forward(self, clip_input, images):
        for index in range(len(images)):
            images[index] = np.zeros(images[index].shape)
        return images, [True] * len(images)


class FeatureExtractor:
    def __call__(self, images, return_tensors="pt"):
        return types.SimpleNamespace(pixel_values=torch.zeros(len(images), 3, 8, 8))


def test_safety_checker_black_is_not_called_nan(base, tmp_path):
    model = variant(
        base, "safety", safety_checker=FlagEverything(), feature_extractor=FeatureExtractor()
    )
    result = generate(model, request(tmp_path), precision=PrecisionSettings(), device="cpu")
    (entry,) = result.images
    assert (entry.status, entry.component, entry.fix) == ("safety_checker", None, None)
    assert "safety checker" in entry.message
    assert pixels(entry).max() == 0.0
    assert entry.non_finite == 0.0


def _dark_vae(base, scale: float, bias: float):
    vae = copy.deepcopy(base.vae)
    with torch.no_grad():
        vae.decoder.conv_out.weight.mul_(scale)
        vae.decoder.conv_out.bias.fill_(bias)
    return vae


def test_a_dark_but_finite_image_is_not_called_nan(base, tmp_path):
    blank = variant(base, "blank", vae=_dark_vae(base, 0.0, -1.0))
    result = generate(blank, request(tmp_path), precision=PrecisionSettings(), device="cpu")
    (entry,) = result.images
    assert (entry.status, entry.component, entry.step) == ("black", None, None)
    assert "prompt" in entry.message and "NaN" in entry.message
    assert result.all_good is False

    dark = variant(base, "dark", vae=_dark_vae(base, 0.1, -0.85))
    result = generate(dark, request(tmp_path), precision=PrecisionSettings(), device="cpu")
    (entry,) = result.images
    assert entry.status == "ok"
    assert pixels(entry).mean() < 0.15  # dark indeed


# --- the loop: cancel, progress, previews, samplers ----------------------------------------


def test_cancel_stops_within_one_step(base, tmp_path):
    model = variant(base, "cancel")
    calls = UNetCalls(model.pipeline.unet)
    token = CancelToken()

    def progress(stage, step, total):
        if stage == "Generating" and step == 2:
            token.cancel()

    with pytest.raises(CancelledError):
        generate(
            model,
            request(tmp_path, steps=10),
            precision=PrecisionSettings(),
            device="cpu",
            on_progress=progress,
            cancel=token,
        )
    assert calls.count == 2
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_progress_every_step_and_previews_every_few(base, tmp_path):
    model = variant(base, "preview")
    steps, previews = [], []
    generate(
        model,
        request(tmp_path, steps=8, width=64, height=96),
        precision=PrecisionSettings(),
        device="cpu",
        on_progress=lambda stage, step, total: steps.append((stage, step, total)),
        on_preview=lambda step, image: previews.append((step, image.size)),
    )
    assert [s for s in steps if s[0] == "Generating"] == [("Generating", i, 8) for i in range(1, 9)]
    assert previews and len(previews) < 8
    assert all(size == (8, 12) for _, size in previews)
    assert all(step < 8 for step, _ in previews)


@pytest.mark.parametrize("scheduler", ["euler", "euler_a", "dpmpp_2m_karras", "ddim"])
def test_every_sampler_makes_the_same_image_for_the_same_seed(base, tmp_path, scheduler):
    model = variant(base, f"sampler-{scheduler}")
    settings = PrecisionSettings()
    first = generate(
        model, request(tmp_path, steps=2, scheduler=scheduler), precision=settings, device="cpu"
    )
    again = generate(
        model, request(tmp_path, steps=2, scheduler=scheduler), precision=settings, device="cpu"
    )
    other = generate(
        model,
        request(tmp_path, steps=2, scheduler=scheduler, seed=99),
        precision=settings,
        device="cpu",
    )
    assert first.images[0].status == "ok"
    assert np.array_equal(pixels(first.images[0]), pixels(again.images[0]))
    assert not np.array_equal(pixels(first.images[0]), pixels(other.images[0]))
    assert first.images[0].path != again.images[0].path


def test_without_guidance_the_watch_follows_the_unguided_batch(base, tmp_path):
    model = variant(base, "cfg1")
    result = generate(
        model,
        request(tmp_path, cfg=1.0, steps=2, batch=2),
        precision=PrecisionSettings(),
        device="cpu",
    )
    assert [e.status for e in result.images] == ["ok", "ok"]


def test_v_prediction_is_carried_into_the_scheduler(base):
    for name in ("euler", "euler_a", "dpmpp_2m_karras", "ddim"):
        scheduler = generation.make_scheduler(name, base.scheduler.config, "v_prediction")
        assert scheduler.config.prediction_type == "v_prediction"
    karras = generation.make_scheduler("dpmpp_2m_karras", base.scheduler.config)
    assert karras.config.use_karras_sigmas is True


def test_bad_requests_are_refused_in_words(base, tmp_path):
    model = variant(base, "bad")
    for bad in ({"width": 65}, {"steps": 0}, {"scheduler": "dpmpp_2s_a"}, {"batch": 0}):
        with pytest.raises(HalfSafeError) as error:
            generate(model, request(tmp_path, **bad), precision=PrecisionSettings(), device="cpu")
        assert "\n" not in str(error.value)


# --- the NaN watch itself ----------------------------------------------------------------------


def test_watch_records_image_and_first_step_without_reading_the_device(monkeypatch):
    unet = Poisoned()
    watch = NanWatch(unet, batch=2)
    latents = torch.zeros(2, 4, 8, 8)
    context = torch.zeros(4, 7, 16)

    def refuse(*_args, **_kwargs):
        raise AssertionError("the watch read a value back from the device")

    with monkeypatch.context() as patched:
        for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__"):
            patched.setattr(torch.Tensor, name, refuse)
        for step in range(4):
            sample = torch.cat([latents] * 2) + step
            unet(sample, torch.tensor(900.0 - step), encoder_hidden_states=context)
            watch.after_step(step, latents)
    watch.remove()

    bad, first = generation.read_flags(watch.flags())[:2], generation.read_flags(watch.flags())[2:]
    assert bad == [0, 1] and first == [-1, 2]
    kept = watch.failing_input(1)
    assert kept["sample"].shape == (2, 4, 8, 8)
    assert float(kept["sample"].mean()) == 2.0  # the input of the call that first went bad
    assert float(kept["timestep"]) == 898.0
    assert kept["encoder_hidden_states"].shape == (2, 7, 16)


# --- saving ----------------------------------------------------------------------------------


def test_png_parameters_parse_back_to_the_inputs(base, tmp_path):
    model = variant(base, "params")
    asked = request(
        tmp_path,
        # A1111's syntax is interpreted for the encoder and recorded as written.
        prompt="a (red fox:1.3), [snow]: at night BREAK \\(moon\\)",
        negative_prompt="((blurry)), text",
        steps=2,
        cfg=6.5,
        seed=4242,
        width=64,
        height=72,
        scheduler="euler_a",
    )
    result = generate(model, asked, precision=PrecisionSettings(), device="cpu")
    (entry,) = result.images
    assert entry.path.endswith("00001-4242.png")
    prompt, negative, params = split_text(read_parameters(entry.path))
    assert (prompt, negative) == (asked.prompt, asked.negative_prompt)
    assert params["Steps"] == "2"
    assert params["Sampler"] == "Euler a"
    assert samplers.key_for(params["Sampler"]) == "euler_a"
    assert float(params["CFG scale"]) == 6.5
    assert params["Seed"] == "4242"
    assert params["Size"] == "64x72"
    assert params["Model hash"] == "abcdef1234"
    assert params["Model"] == "params"
    assert params["RNG"] == "CPU"  # A1111 reads this and makes its noise on the CPU too
    assert params["UNet precision"] == result.settings["unet_precision"]
    assert params["NaN watch"] == "ok"
    # TF32 is on by default, but only a CUDA GPU of the Ampere kind or later runs it: on a CPU
    # the file records what ran.
    assert PrecisionSettings().allow_tf32 and params["TF32"] == "False"
    assert result.settings["allow_tf32"] is False
    # A1111's order: the standard fields first, on the last line.
    last = read_parameters(entry.path).splitlines()[-1]
    assert last.startswith(
        "Steps: 2, Sampler: Euler a, CFG scale: 6.5, Seed: 4242, Size: 64x72, Model hash: abcdef1234, Model: params, RNG: CPU, "
    )


def test_png_parameters_name_a_separate_vae_and_its_hash_as_a1111_does(base, tmp_path):
    import hashlib

    model = variant(base, "with-vae")
    vae_file = tmp_path / "vae-ft-mse-840000-ema-pruned.safetensors"
    vae_file.write_bytes(b"stand-in bytes: the hash is of the file, whatever it holds")
    model.vae = str(vae_file)
    result = generate(
        model, request(tmp_path, steps=1, seed=5), precision=PrecisionSettings(), device="cpu"
    )
    text = read_parameters(result.images[0].path)
    params = split_text(text)[2]
    assert params["VAE hash"] == hashlib.sha256(vae_file.read_bytes()).hexdigest()[:10]
    assert params["VAE"] == vae_file.name
    assert "Model: with-vae, VAE hash: " in text  # where A1111 writes them
    # The model's own VAE: no VAE pairs at all.
    plain = generate(
        variant(base, "own-vae"),
        request(tmp_path, steps=1),
        precision=PrecisionSettings(),
        device="cpu",
    )
    assert "VAE hash" not in split_text(read_parameters(plain.images[0].path))[2]


def test_saving_never_overwrites_and_numbers_on(tmp_path):
    image = Image.new("RGB", (8, 8), (10, 20, 30))
    folder = tmp_path / "pictures"
    first = images.save_png(image, folder, 7, "a\nSteps: 1, Sampler: Euler, Seed: 7")
    (folder / "00005-1.png").write_bytes(b"someone else's file")
    second = images.save_png(image, folder, 7)
    assert (first.name, second.name) == ("00001-7.png", "00006-7.png")
    assert (folder / "00005-1.png").read_bytes() == b"someone else's file"
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temp files left


def test_unwritable_output_folder_is_a_clear_error_and_keeps_the_images(base, tmp_path):
    model = variant(base, "unwritable")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the folder should be")
    with pytest.raises(ImageSaveError) as caught:
        generate(
            model,
            request(tmp_path, output_dir=str(blocker / "images")),
            precision=PrecisionSettings(),
            device="cpu",
        )
    message = str(caught.value)
    assert str(blocker) in message and "\n" not in message
    result = caught.value.result
    assert result.images[0].image.size == (64, 64) and result.images[0].path == ""
    (saved,) = result.save(tmp_path / "elsewhere")
    assert read_parameters(saved).startswith("a lighthouse at dusk")


def test_a_failed_save_is_rescued_into_halfsafes_own_folder(base, tmp_path):
    from app.core import paths
    from app.core.generation import rescue_unsaved

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the folder should be")
    with pytest.raises(ImageSaveError) as caught:
        generate(
            variant(base, "rescue"),
            request(tmp_path, output_dir=str(blocker / "images")),
            precision=PrecisionSettings(),
            device="cpu",
        )
    rescued = rescue_unsaved(caught.value)
    folder = paths.data_dir() / "unsaved"
    assert str(folder) in str(rescued) and str(blocker) in str(rescued)
    (saved,) = folder.iterdir()
    assert read_parameters(saved).startswith("a lighthouse at dusk")


def test_infotext_quotes_values_like_a1111():
    text = infotext.join_text(
        "p", "", [("Steps", 2), ("Note", "a, b"), ("Skip", None), ("Ratio", "1:2")]
    )
    assert text == 'p\nSteps: 2, Note: "a, b", Ratio: "1:2"'
    assert split_text(text) == ("p", "", {"Steps": "2", "Note": "a, b", "Ratio": "1:2"})


# --- the command --------------------------------------------------------------------------------


def test_cli_generate_demo_json_holds_the_contract(tmp_path, capsys):
    status = cli.main(
        ["generate", "demo", "--json", "--prompt", "a boat", "--steps", "2", "--width", "64",
         "--height", "64", "--seed", "7", "--out", str(tmp_path / "cli")]
    )  # fmt: skip
    assert status == 0
    document = json.loads(capsys.readouterr().out)
    assert {"halfsafe", "images", "settings", "seconds"} <= set(document)
    (entry,) = document["images"]
    assert {
        "path",
        "seed",
        "status",
        "component",
        "step",
        "fixes_applied",
        "message",
        "fix",
    } <= set(entry)
    assert entry["status"] == "ok" and entry["seed"] == 7
    assert entry["path"].endswith("00001-7.png")
    assert document["settings"]["unet_precision"] in ("fp16", "bf16", "fp32")
    assert isinstance(document["seconds"], float)


@pytest.mark.parametrize(
    "flags",
    [["--steps", "0"], ["--scheduler", "dpmpp_2s_a"], ["--width", "65"], ["--auto-fix", "maybe"]],
)
def test_cli_generate_bad_flags_exit_2(flags, capsys):
    with pytest.raises(SystemExit) as caught:
        cli.main(["generate", "demo", *flags])
    assert caught.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


# --- on a GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_watch_adds_no_host_sync_inside_the_loop(base, tmp_path):
    """Under `set_sync_debug_mode("warn")`, count the synchronising calls between the end of the
    first step and the end of the last: the watched loop makes no more than plain diffusers."""
    import warnings

    from app.core.precision import PlacedPipeline, backend_flags, resolve_plan

    model = variant(base, "sync")
    steps = 6

    def count_inside(run) -> int:
        marks: list[int] = []
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")

            def mark() -> None:
                marks.append(sum("synchronizing" in str(r.message) for r in records))

            torch.cuda.set_sync_debug_mode("warn")
            try:
                run(mark)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        assert len(marks) == steps
        return marks[-1] - marks[0]

    def watched(mark) -> None:
        def progress(stage, step, total):
            if stage == "Generating":
                mark()

        result = generate(
            model,
            request(tmp_path, steps=steps),
            precision=fp16(),
            device="cuda",
            on_progress=progress,
        )
        assert result.images[0].status == "ok"

    def plain(mark) -> None:
        plan = resolve_plan(fp16(), device="cuda", components=["text_encoder", "unet", "vae"])
        placed = PlacedPipeline(model.pipeline, plan)
        pipe = placed.pipeline()
        pipe.scheduler = generation.make_scheduler("dpmpp_2m_karras", base.scheduler.config)
        pipe.set_progress_bar_config(disable=True)

        def step_end(_pipe, _index, _t, _tensors):
            mark()
            return {}

        with backend_flags(plan), torch.inference_mode():
            pipe(
                prompt="a lighthouse at dusk",
                height=64,
                width=64,
                num_inference_steps=steps,
                output_type="latent",
                callback_on_step_end=step_end,
            )
        placed.release()

    assert count_inside(watched) <= count_inside(plain)


def test_a_checked_fix_the_user_overrode_stays_when_a_generation_repairs_around_it(
    base, tmp_path, device_name
):
    """The check proved 'run the VAE in fp32' against fp32; the user then set the VAE to fp16
    and a generation repaired its image with layers. The checked fix stays remembered (the
    repair proves only a finite image, at settings the fix was never meant for), and the job
    says so; merged, the two read 'keep 2 VAE layers in bf16; run the VAE in fp32'."""
    model = variant(base, "vae-overridden", vae=scaled(base.vae, VAE_LAYER, 1e6))
    profiles.remember_fix(
        "vae-overridden", device_name, {"vae_precision": "fp32"}, "checked", "health check"
    )
    result = generate(
        model,
        request(tmp_path),
        precision=fp16(auto_fix="auto", vae_precision="fp16"),
        device="cpu",
    )
    (entry,) = result.images
    assert (entry.status, entry.component) == ("fixed", "vae")
    remembered = profiles.remembered_fix("vae-overridden", device_name)
    assert remembered is not None and remembered.verified_by == "health check"
    assert remembered.settings == {"vae_precision": "fp32"}
    (said,) = [w for w in result.warnings if "remembered for this model" in w]
    assert said.startswith(
        "Your own VAE precision fp16 set aside the fix remembered for this model on this "
        "device (run the VAE in fp32), so this job ran without it"
    )
    assert "The remembered fix stays" in said
    assert not any("is now the one this job proved" in w for w in result.warnings)


def test_a_repair_the_user_overrode_is_replaced_by_the_repair_that_ran(base, tmp_path, device_name):
    """A remembered fix that a generation proved (finite only) is no better proof than the new
    repair: the one that ran at the user's settings replaces it, with none of the overridden
    setting merged in."""
    model = variant(base, "vae-repaired", vae=scaled(base.vae, VAE_LAYER, 1e6))
    profiles.remember_fix(
        "vae-repaired", device_name, {"vae_precision": "fp32"}, "repaired", "generation repair"
    )
    result = generate(
        model,
        request(tmp_path),
        precision=fp16(auto_fix="auto", vae_precision="fp16"),
        device="cpu",
    )
    assert result.images[0].status == "fixed"
    remembered = profiles.remembered_fix("vae-repaired", device_name)
    assert remembered is not None and remembered.verified_by == "generation repair"
    assert remembered.settings.get("vae_precision") != "fp32", remembered.settings
    assert any("is now the one this job proved" in w for w in result.warnings)
