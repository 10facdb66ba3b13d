"""Causes of a failed check beyond fp16 overflow, each planted and told apart by re-running: a
LoRA with NaN tensors (weights), a LoRA whose weight pushes a UNet layer past 65504 (blamed with
the layer and a proved lower weight), an attention kernel that returns NaN on one backend
(kernel), and a component whose state goes bad after its first run (state)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from app.core import causes, precision
from app.core.health.request import CheckRequest, CheckRun
from app.core.lora import files as lora
from app.core.lora.files import LoraFile
from app.core.settings import PrecisionSettings
from tests.support.attention_kernels import flash_nan_in_fp16
from tests.support.lora_files import kohya_lora
from tests.support.planted_sd import loaded
from tests.support.tiny_models import build_tiny_sd_pipeline

FP16 = PrecisionSettings(precision="fp16")
FF_OUT = "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.2"


def in_memory(name: str, tensors: dict[str, torch.Tensor]) -> LoraFile:
    """A LoRA as `read_lora` gives it, scanned the same way, without a file on disk."""
    from pathlib import Path

    from app.core.checkpoint import tensor_is_finite

    return LoraFile(
        path=Path(f"{name}.safetensors"),
        name=name,
        layout="kohya",
        tensors=tensors,
        non_finite=[k for k, t in tensors.items() if not tensor_is_finite(t)],
        absurd=[],
        short_hash=None,
    )


def check(model, remember=False, measure_cost=False, **kwargs):
    return causes.check_and_attribute(
        model,
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=remember, measure_cost=measure_cost),
        **kwargs,
    )


def with_loras(files: list[tuple[LoraFile, float]]):
    pipeline = build_tiny_sd_pipeline()
    model = loaded(pipeline)
    model.loras = lora.apply_loras(pipeline, files)
    return model


@pytest.mark.slow
def test_a_lora_with_a_nan_tensor_is_named_as_the_cause_and_dropping_it_is_proved():
    pipeline = build_tiny_sd_pipeline()
    good = in_memory("style", kohya_lora(pipeline, scale=0.05, seed=1))
    damaged = kohya_lora(pipeline, scale=0.05, seed=2)
    bad_key = sorted(k for k in damaged if k.startswith("lora_unet") and "lora_up" in k)[0]
    damaged[bad_key][0, 0] = float("nan")
    model = with_loras([(good, 0.7), (in_memory("broken_lora", damaged), 0.8)])

    report = check(model)
    cause = report.cause

    assert cause is not None and cause.kind == "weights"
    assert cause.lora is not None and cause.lora.name == "broken_lora"
    assert cause.lora.non_finite == [bad_key]
    assert cause.action == "drop_lora" and cause.verified and cause.quality.passed
    assert "broken_lora" in report.headline and "drop" in report.headline
    document = report.to_json()
    assert document["cause"]["kind"] == "weights"
    assert document["cause"]["lora"]["non_finite"] == [bad_key]
    assert document["verdict"] == "broken"  # no precision setting repairs this combination
    assert any("broken_lora" in note and bad_key in note for note in document["notes"])
    # The user's LoRAs are as they were: both active at their weights.
    assert [a.weight for a in model.loras] == [0.7, 0.8]


def overflowing_lora(pipeline) -> LoraFile:
    """A LoRA on one feed-forward output projection whose scaled delta reaches about 111,000
    at weight 1 in fp32 (past 65504), 55,700 at weight 0.5: alpha carries the scale, as a
    badly trained LoRA's large alpha/rank does."""
    tensors = kohya_lora(pipeline, scale=30.0, seed=0, unet_layers=(FF_OUT,))
    tensors = {k: v for k, v in tensors.items() if k.startswith("lora_unet")}
    for key in tensors:
        if key.endswith(".alpha"):
            tensors[key] = torch.tensor(400.0)
    return in_memory("hot_lora", tensors)


@pytest.mark.slow
def test_a_lora_that_pushes_a_unet_layer_past_fp16_is_blamed_with_the_layer_and_a_lower_weight():
    pipeline = build_tiny_sd_pipeline()
    model = loaded(pipeline)
    model.loras = lora.apply_loras(pipeline, [(overflowing_lora(pipeline), 1.0)])

    report = check(model)
    blame = report.cause.lora

    assert report.components["unet"].status == "overflow"
    assert blame is not None and blame.name == "hot_lora" and blame.component == "unet"
    assert blame.layer == FF_OUT
    # The proved weight: below the user's, above what the search must find at least (0.5 ran
    # finite in fp16), and its quality measured against fp32 at that same weight.
    assert blame.safe_weight is not None and 0.5 <= blame.safe_weight < 1.0
    assert blame.quality is not None and blame.quality.passed
    assert "picture changes" in report.cause.summary
    assert report.cause.to_json()["lora"]["picture_changes"] is True
    # The proof holds when re-run by hand: fp16 at the safe weight is finite.
    from app.core.health import probe_run

    lora.use_weights(pipeline, model.loras, {model.loras[0].adapter: blame.safe_weight})
    assert probe_run(model, report.plan, size=64).finite
    lora.use_weights(pipeline, model.loras)
    assert not probe_run(model, report.plan, size=64).finite  # and the user's weight is not


def test_a_nan_from_one_attention_backend_is_a_kernel_fault_fixed_by_switching_backend(
    monkeypatch,
):
    real = precision.SafeAttnProcessor.__call__

    def broken_kernel(self, attn, hidden_states, *args, **kwargs):
        out = real(self, attn, hidden_states, *args, **kwargs)
        return torch.full_like(out, float("nan"))  # the SDPA path is broken, fp32 included

    monkeypatch.setattr(precision.SafeAttnProcessor, "__call__", broken_kernel)
    report = check(loaded(build_tiny_sd_pipeline(), "kernel-check"), remember=True)

    assert report.cause is not None and report.cause.kind == "kernel"
    assert report.cause.component == "unet"
    assert report.verdict == "fixable"
    assert report.fix is not None and report.fix.verified
    assert report.fix.settings == {"attention_backend": "classic"}
    assert report.fix.plan.dtypes == report.plan.dtypes  # same precision: not a precision fix
    assert report.to_json()["cause"]["repair"]["action"] == "switch_backend"
    assert "kernel fault" in report.headline and "overflow" not in report.headline.split(",")[0]
    # The candidates the check tried stay beside the repair, none of them chosen.
    from app.cli.text import health_text

    assert report.fix.candidates and not any(c.chosen for c in report.fix.candidates)
    assert "none chosen: the cause's repair replaced them" in health_text(report)
    # Remembered for this model on this device, so the next job runs on that backend.
    from app.core.fixing import profiles

    remembered = profiles.remembered_fix("kernel-check", report.device.name)
    assert remembered is not None and remembered.settings == {"attention_backend": "classic"}


@pytest.mark.slow
@pytest.mark.parametrize("component", ["vae", "text_encoder"])
def test_state_poisoned_after_the_first_run_is_a_state_fault_fixed_by_reloading(
    tmp_path, component
):
    from app.core.checkpoint import write_safetensors
    from app.core.models import load_model

    folder = tmp_path / "tiny"
    build_tiny_sd_pipeline().save_pretrained(folder)
    model = load_model(str(folder))
    style = None
    if component == "text_encoder":
        # The text encoder carries a LoRA, and one came and went before it, so the LoRA kept
        # has the second adapter name: the fresh encoder must get the same names for the
        # user's LoRA list to keep driving it.
        tensors = kohya_lora(model.pipeline, scale=0.05)
        style = write_safetensors(tmp_path / "style.safetensors", tensors)
        other = write_safetensors(tmp_path / "other.safetensors", kohya_lora(model.pipeline))
        lora.load_requested(
            model, [lora.LoraRequest(str(other), 0.3), lora.LoraRequest(str(style), 0.5)]
        )
        lora.load_requested(model, [lora.LoraRequest(str(style), 0.5)])
        layer = model.pipeline.text_encoder.get_submodule("encoder.layers.0.mlp.fc1")
    else:
        layer = model.pipeline.vae.decoder.conv_in
    weight = layer.weight

    def poison_after_first_call(module, args, output):
        with torch.no_grad():
            weight.fill_(float("nan"))  # an in-place bug that corrupts the loaded weights

    layer.register_forward_hook(poison_after_first_call)
    with torch.inference_mode():  # the first generation: fine, and it leaves the part poisoned
        if component == "vae":
            first = model.pipeline.vae.decode(torch.randn(1, 4, 8, 8)).sample
        else:
            first = model.pipeline.text_encoder(torch.tensor([[0, 5, 7, 1]])).last_hidden_state
    assert torch.isfinite(first).all() and not torch.isfinite(weight).all()
    assert model.weights.non_finite == []  # the file itself is fine

    report = check(model)

    assert report.cause is not None and report.cause.kind == "state"
    assert report.cause.component == component
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    assert report.to_json()["cause"]["repair"]["action"] == "reload"
    # The repair is applied: the model in memory now checks healthy.
    assert check(model).verdict == "healthy"
    if style is not None:  # and the user's LoRA list still drives the reloaded encoder
        (kept,) = model.loras
        tokens = torch.tensor([[0, 5, 7, 1]])

        def encoded_at(weight: float):
            lora.use_weights(model.pipeline, model.loras, {kept.adapter: weight})
            with torch.inference_mode():
                return model.pipeline.text_encoder(tokens).last_hidden_state

        assert not torch.allclose(encoded_at(0.0), encoded_at(2.0), atol=1e-5)


def test_state_gone_bad_beside_a_true_overflow_is_named_and_the_overflow_still_fixed(
    tmp_path, monkeypatch
):
    """A VAE poisoned in memory in a model whose UNet truly overflows fp16: the precision
    search fixes the UNet and nothing fixes the VAE, so the VAE alone is the suspect; reloaded,
    it runs, and the check run again on it proves the UNet's precision fix, which is the one
    remembered (the reload is the moment's)."""
    from app.core.fixing import profiles
    from app.core.models import load_model
    from tests.support.planted_sd import plant

    folder = tmp_path / "tiny"
    plant(build_tiny_sd_pipeline(), "unet_ff").save_pretrained(folder)
    model = load_model(str(folder))
    overflow_alone = check(model)
    assert overflow_alone.cause.kind == "precision" and overflow_alone.cause.component == "unet"
    with torch.no_grad():  # then a bug leaves NaN in the loaded VAE (its file is fine)
        model.pipeline.vae.decoder.conv_in.weight[0, 0, 0, 0] = float("nan")
    remembered: list[dict] = []
    monkeypatch.setattr(profiles, "remember_fix", lambda _k, _d, s, *a, **k: remembered.append(s))

    report = check(model, remember=True)

    assert report.cause is not None and report.cause.kind == "state"
    assert report.cause.component == "vae" and report.cause.action == "reload"
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    assert report.fix.steps[0] == "reload the VAE"
    assert report.fix.settings == overflow_alone.fix.settings  # the UNet's precision fix
    assert report.components["unet"].status == "overflow"
    assert report.components["vae"].status == "ok"  # the reloaded VAE, checked again
    assert "VAE in memory went bad" in report.headline and "UNet" in report.headline
    assert remembered == [overflow_alone.fix.settings]
    # The model in memory runs the reloaded VAE: with the fix, it checks healthy.
    fixed = replace(FP16, **overflow_alone.fix.settings)
    again = causes.check_and_attribute(
        model,
        CheckRequest(precision=fixed, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert again.verdict == "healthy"


def test_state_gone_bad_upstream_of_a_true_overflow_is_named_too(tmp_path):
    """The other order: the UNet went bad in memory and the VAE truly overflows. The check
    hands the VAE a stand-in for the UNet's output, on which it overflows on its own."""
    from app.core.models import load_model
    from tests.support.planted_sd import plant

    folder = tmp_path / "tiny"
    plant(build_tiny_sd_pipeline(), "vae").save_pretrained(folder)
    model = load_model(str(folder))
    alone = check(model)
    assert alone.cause.kind == "precision" and alone.cause.component == "vae"
    with torch.no_grad():
        model.pipeline.unet.conv_in.weight[0, 0, 0, 0] = float("nan")

    report = check(model)

    assert report.cause is not None and report.cause.kind == "state"
    assert report.cause.component == "unet" and report.cause.reloaded == ("unet",)
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    assert report.fix.settings == alone.fix.settings and report.fix.steps[0] == "reload the UNet"
    assert report.cause.quality is None  # proved finite in fp32: nothing compared, no figure


def test_a_part_no_precision_fixes_is_said_alone_with_its_verb():
    """The broken headline names the parts nothing fixed, not every failed one."""
    from app.core.health.report import headline
    from tests.support.planted_sd import plant

    model = loaded(plant(build_tiny_sd_pipeline(), "unet_ff"))
    with torch.no_grad():  # gone bad after loading (no reload to prove it here)
        model.pipeline.vae.decoder.conv_in.weight[0, 0, 0, 0] = float("nan")
    report = check(model, reload=lambda: (_ for _ in ()).throw(OSError("gone")))
    assert report.verdict == "broken" and report.cause is None
    assert report.unfixed == ["vae"]
    assert headline(report).startswith("Broken: the VAE gives no finite output")


def test_a_plain_overflow_is_a_precision_cause_without_extra_runs():
    from tests.support.planted_sd import plant

    report = check(loaded(plant(build_tiny_sd_pipeline(), "vae")))
    assert report.cause is not None and report.cause.kind == "precision"
    assert report.cause.action == "change_precision" and report.cause.verified


def broken_sdpa(monkeypatch):
    real = precision.SafeAttnProcessor.__call__

    def broken_kernel(self, attn, hidden_states, *args, **kwargs):
        out = real(self, attn, hidden_states, *args, **kwargs)
        return torch.full_like(out, float("nan"))

    monkeypatch.setattr(precision.SafeAttnProcessor, "__call__", broken_kernel)


def generate(model, tmp_path, **settings):
    from app.core.generation import GenerationRequest
    from app.core.generation import generate as run

    request = GenerationRequest(
        prompt="a red square", steps=2, width=64, height=64, seed=11, output_dir=str(tmp_path)
    )
    settings.setdefault("auto_fix", "auto")
    return run(
        model, request, precision=PrecisionSettings(precision="fp16", **settings), device="cpu"
    )


@pytest.mark.slow
def test_the_nan_watch_repairs_a_kernel_fault_by_switching_backend(monkeypatch, tmp_path):
    from app.core.images.finished import read_parameters
    from app.core.words.infotext import split_text

    broken_sdpa(monkeypatch)
    result = generate(loaded(build_tiny_sd_pipeline(), "kernel-gen"), tmp_path)
    (image,) = result.images

    assert image.status == "fixed" and image.cause == "kernel"
    assert image.fix == {"attention_backend": "classic"}
    assert image.non_finite == 0.0 and "classic" in image.fixes_applied[-1]
    _, _, params = split_text(read_parameters(image.path) or "")
    assert params["Attention backend"] == "classic"
    assert result.to_json()["images"][0]["cause"] == "kernel"
    from app.core.fixing import profiles

    remembered = profiles.remembered_fix("kernel-gen", result.device.name)
    assert remembered is not None and remembered.settings["attention_backend"] == "classic"


@pytest.mark.slow
def test_the_nan_watch_drops_a_lora_with_nan_tensors_and_says_so(tmp_path):
    from app.core.images.finished import read_parameters
    from app.core.words.infotext import split_text

    pipeline = build_tiny_sd_pipeline()
    good = in_memory("style", kohya_lora(pipeline, scale=0.05, seed=1))
    damaged = kohya_lora(pipeline, scale=0.05, seed=2)
    damaged[sorted(k for k in damaged if "lora_up" in k)[0]][0, 0] = float("nan")
    model = with_loras([(good, 0.7), (in_memory("broken_lora", damaged), 0.8)])

    (image,) = generate(model, tmp_path).images

    assert image.status == "fixed" and image.cause == "weights"
    assert "broken_lora" in image.message and "drop" in image.fixes_applied[-1]
    prompt, _, params = split_text(read_parameters(image.path) or "")
    assert prompt == "a red square <lora:style:0.7>"  # what the image was really made with
    assert [a.name for a in model.loras] == ["style", "broken_lora"]  # the user's list is kept


def test_a_few_nan_tiles_are_a_finding_with_their_share_and_place(tmp_path):
    """A decode that loses one 16x16 tile of a 64x64 image (as a tiled VAE can): the image is
    not ok, the share is exact and the box is where the tile is."""
    from app.core.images.finished import read_parameters
    from app.core.words.infotext import split_text

    pipeline = build_tiny_sd_pipeline()

    def lose_a_tile(module, args, output):
        output = output.clone()
        output[:, :, 16:32, 48:64] = float("nan")
        return output

    pipeline.vae.decoder.conv_out.register_forward_hook(lose_a_tile)
    result = generate(loaded(pipeline, "tile"), tmp_path, auto_fix="off")
    (image,) = result.images

    assert image.status == "nan" and image.component == "vae"
    assert image.non_finite == pytest.approx(16 * 16 / (64 * 64))
    assert image.non_finite_box == (48, 16, 64, 32)
    assert "6.2% of its pixels" in image.message and "x 48-63, y 16-31" in image.message
    assert result.to_json()["images"][0]["non_finite_box"] == [48, 16, 64, 32]
    _, _, params = split_text(read_parameters(image.path) or "")
    assert params["Non-finite region"] == "x 48-63, y 16-31"


@pytest.mark.slow
def test_the_nan_watch_reloads_a_component_gone_bad_in_memory(tmp_path):
    from app.core.models import load_model

    folder = tmp_path / "tiny"
    build_tiny_sd_pipeline().save_pretrained(folder)
    model = load_model(str(folder))
    with torch.no_grad():  # an earlier job's in-place bug left a NaN in the loaded VAE
        model.pipeline.vae.decoder.conv_in.weight[0, 0, 0, 0] = float("nan")

    result = generate(model, tmp_path / "out")
    (image,) = result.images

    assert image.status == "fixed" and image.cause == "state" and image.component == "vae"
    assert image.non_finite == 0.0 and "reload" in image.fixes_applied[-1]
    assert torch.isfinite(model.pipeline.vae.decoder.conv_in.weight).all()
    assert result.to_json()["model"]["loras"] == []


@pytest.mark.slow
def test_the_nan_watch_reloads_a_part_gone_bad_beside_a_true_overflow(tmp_path):
    """The UNet truly overflows fp16 and the VAE went bad in memory: the image is made again
    on the reloaded VAE with the UNet's precision repair, and says both."""
    from app.core.models import load_model
    from tests.support.planted_sd import plant

    folder = tmp_path / "tiny"
    plant(build_tiny_sd_pipeline(), "unet_ff").save_pretrained(folder)
    model = load_model(str(folder))
    with torch.no_grad():
        model.pipeline.vae.decoder.conv_in.weight[0, 0, 0, 0] = float("nan")

    (image,) = generate(model, tmp_path / "out").images

    assert image.status == "fixed" and image.cause == "state" and image.non_finite == 0.0
    assert "reload the VAE" in image.fixes_applied
    assert any("UNet" in fix for fix in image.fixes_applied[:-1])  # its own precision repair
    assert torch.isfinite(model.pipeline.vae.decoder.conv_in.weight).all()


@pytest.mark.slow
def test_two_loras_fine_alone_that_overflow_together_are_blamed_together():
    pipeline = build_tiny_sd_pipeline()
    half = overflowing_lora(pipeline)
    half.tensors = {
        k: (torch.tensor(200.0) if k.endswith(".alpha") else v) for k, v in half.tensors.items()
    }
    model = loaded(pipeline)
    model.loras = lora.apply_loras(pipeline, [(half, 0.9), (in_memory("twin", half.tensors), 1.0)])

    report = check(model)
    blame = report.cause.lora

    assert report.components["unet"].status == "overflow"
    assert blame is not None and blame.name == "twin" and blame.layer == FF_OUT
    assert "Together the LoRAs hot_lora, twin" in report.cause.summary
    assert blame.safe_weight is not None and blame.safe_weight < 1.0 and blame.quality.passed


def fp16_sdpa_fault_but_math(monkeypatch):
    """Attention that returns NaN in fp16 on every SDPA kernel but PyTorch's math one (fp32 and
    the math kernel are fine): a fault the check's own math-kernel candidate repairs."""
    real = precision.SafeAttnProcessor.__call__

    def broken_kernel(self, attn, hidden_states, *args, **kwargs):
        out = real(self, attn, hidden_states, *args, **kwargs)
        if out.dtype == torch.float16 and torch.backends.cuda.flash_sdp_enabled():
            return torch.full_like(out, float("nan"))
        return out

    monkeypatch.setattr(precision.SafeAttnProcessor, "__call__", broken_kernel)


def test_a_chosen_fix_that_only_switches_the_backend_is_a_kernel_cause_without_a_rerun(
    monkeypatch,
):
    fp16_sdpa_fault_but_math(monkeypatch)
    stages: list[str] = []
    report = check(
        loaded(build_tiny_sd_pipeline(), "kernel-by-fix"),
        on_progress=lambda stage, *_: stages.append(stage),
    )

    assert report.cause is not None and report.cause.kind == "kernel"
    assert report.cause.settings == {"attention_backend": "math"} and report.cause.verified
    # The fix is the check's own ranked choice, kept with its candidates table.
    assert report.fix is not None and report.fix.verified
    assert report.fix.settings["attention_backend"] == "math"
    assert report.fix.plan.dtypes == report.plan.dtypes
    chosen = [c for c in report.fix.candidates if c.chosen]
    assert [c.kind for c in chosen] == ["math_attention"]
    assert "kernel fault" in report.headline and "math attention backend" in report.headline
    # The kernel probe did not run the math backend a second time.
    assert not any(s.startswith("Re-running with the") for s in stages)


@pytest.mark.slow
def test_the_nan_watch_says_kernel_when_its_repair_only_switched_the_backend(monkeypatch, tmp_path):
    fp16_sdpa_fault_but_math(monkeypatch)
    result = generate(loaded(build_tiny_sd_pipeline(), "kernel-by-repair"), tmp_path)
    (image,) = result.images

    assert image.status == "fixed" and image.non_finite == 0.0
    assert image.fix is not None and image.fix["attention_backend"] == "math"
    assert image.cause == "kernel"


def test_a_kernel_fault_in_the_text_encoder_is_a_kernel_cause_not_an_overflow(monkeypatch):
    flash_nan_in_fp16(monkeypatch)
    report = check(loaded(build_tiny_sd_pipeline(), "kernel-text"), remember=True)

    assert report.components["text_encoder"].status.failed
    assert report.cause is not None and report.cause.kind == "kernel", report.cause
    assert report.cause.component == "text_encoder"
    assert report.fix is not None and report.fix.verified
    assert report.fix.settings == {"attention_backend": "math"}
    assert report.fix.plan.dtypes == report.plan.dtypes  # no component widened
    assert "overflow" not in report.headline.split(",")[0]
    from app.core.fixing import profiles

    remembered = profiles.remembered_fix("kernel-text", report.device.name)
    assert remembered is not None and remembered.settings == {"attention_backend": "math"}


def test_a_kernel_fault_in_every_component_is_named_once_with_both_fixes_priced(monkeypatch):
    """PyTorch's flash kernel returning NaN in fp16 everywhere attention runs: Flux.1's two
    text encoders, its transformer and its VAE all go NaN, and fp16 on the math backend is
    right. One kernel fault, named for every part it struck (never "overflowed"); the backend
    switch is the fix, and the precision fix the check found is kept beside it, both timed
    against no-half."""
    from tests.support.family_helpers import in_memory
    from tests.support.tiny_models import build_tiny_flux_pipeline

    flash_nan_in_fp16(monkeypatch)
    model = in_memory(build_tiny_flux_pipeline(), "kernel-everywhere", "flux-dev")
    report = check(model, measure_cost=True)

    struck = ["text_encoder", "text_encoder_2", "transformer", "vae"]
    assert [n for n, c in report.components.items() if c.status.failed] == struck
    cause = report.cause
    assert cause is not None and cause.kind == "kernel" and cause.verified, cause
    assert report.fix is not None and report.fix.settings == {"attention_backend": "math"}
    assert report.fix.plan.dtypes == report.plan.dtypes  # fp16 stays
    parts = "text encoder, second text encoder, transformer and VAE"
    assert f"attention kernel fault in the {parts}, not an overflow" in report.headline
    assert "overflowed" not in report.headline and "overflowed" not in cause.summary
    # Both fixes priced: the backend switch and the precision fix, each beside no-half.
    assert report.fix.cost is not None and report.fix.cost.fix.unet_step_ms > 0
    alternative = cause.alternative
    assert alternative is not None and alternative.verified
    assert alternative.plan.dtypes != report.plan.dtypes  # it changes precision
    assert alternative.cost is not None and alternative.cost.fix.unet_step_ms > 0
    said = report.to_json()["cause"]
    assert said["alternative"]["settings"] == alternative.settings
    assert said["alternative"]["cost"]["fix"]["unet_step_ms"] > 0
    assert "ms with the math attention backend" in cause.summary
    assert "with the precision fix" in cause.summary
    from app.cli.text import health_text
    from app.core.health.words import flags

    assert f"\nOr:      {flags(alternative.settings)} (" in health_text(report)


def test_an_encoder_nan_on_the_image_to_image_path_is_not_called_intermittent(tmp_path):
    """A check with an input picture whose VAE encoder overflows: the attribution's identical
    re-run (the text-to-image path) never runs the encoder, so it cannot prove the NaN
    intermittent; the verified fix is the cause."""
    from PIL import Image

    from tests.support.planted_sd import plant_encoder

    picture = tmp_path / "input.png"
    Image.new("RGB", (64, 64), (120, 30, 200)).save(picture)
    model = loaded(build_tiny_sd_pipeline())
    plant_encoder(model.pipeline)
    report = causes.check_and_attribute(
        model,
        CheckRequest(
            precision=PrecisionSettings(precision="fp16"),
            device="cpu",
            size=64,
            images=(str(picture),),
        ),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.components["vae_encoder"].status.failed
    assert report.verdict == "fixable" and report.cause is not None
    assert report.cause.kind == "precision", report.cause.summary
