"""The check's stages over the host contract (`app.core.run.host.Host`) with a host that is no
HalfSafe pipeline: plain torch modules (`tests/support/torch_host.py`). The probe finds the
failing component and its first bad layer, the first finding is told at once, and the check's
fix search (`health.fix.choose_fix`: its candidates re-run against an fp32 reference) proves the
island fix that this test computes itself from the plain model's fp32 run and verifies with
its own fp16 copy; a healthy plain model comes out healthy."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from app.core import work
from app.core.components import FP16_MAX
from app.core.fixing.job_plans import fp32_reference
from app.core.health.fix import Search, choose_fix
from app.core.health.observations import Observations
from app.core.health.stages import Runner, first_bad_name, probe_host
from app.core.jobs import CancelToken
from app.core.precision import PrecisionPlan
from app.core.run.host import Prompt
from app.core.run.pipeline_host import PipelineHost
from tests.support import torch_host
from tests.support.torch_host import BACK, PLANTED, TorchHost

SIZE = 64
PROMPT = "a lighthouse"


def _plan(host: TorchHost, dtype: str) -> PrecisionPlan:
    """Every component in `dtype`, computing from the stored weights as a check's plans do."""
    return PrecisionPlan(
        device="cpu", dtypes=dict.fromkeys(host.components(), dtype), compute_in_place=True
    )


def _no_progress(*_) -> None:
    pass


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_a_healthy_plain_model_comes_out_healthy(dtype):
    host = TorchHost(torch_host.build())
    run = probe_host(host, _plan(host, dtype), size=SIZE, prompt=PROMPT)
    assert set(run.probes) == {"text_encoder", "unet", "vae"}
    assert run.failed == [] and run.finite
    assert all(p.max_abs < FP16_MAX for p in run.probes.values())
    assert run.image.shape == (1, 3, SIZE, SIZE)


def test_the_probe_names_the_failing_component_and_its_first_bad_layer():
    host = TorchHost(torch_host.plant(torch_host.build()))
    run = probe_host(host, _plan(host, "fp16"), size=SIZE, prompt=PROMPT)
    # The denoiser failed first, in the planted layer; the decoder only read its NaN.
    assert run.failed == ["unet", "vae"]
    assert run.first_bad_module("unet") == PLANTED
    assert run.first_bad_module("vae") is None
    # In fp32 the same plain model is finite: the fault is fp16's range.
    wide = probe_host(host, _plan(host, "fp32"), size=SIZE, prompt=PROMPT)
    assert wide.finite and wide.probes["unet"].max_abs > FP16_MAX


def _own_fp32_peaks(parts, conditioning, timesteps) -> dict[str, float]:
    """Each layer of the denoiser that holds weights: the largest |input| or |output| it saw in
    the plain model's own fp32 run of the probe's calls (this test's hooks, not the check's)."""
    peaks: dict[str, float] = {}
    handles = []
    for name, layer in parts.unet.named_modules():
        if not name or next(layer.parameters(recurse=False), None) is None:
            continue

        def seen(_module, args, output, name=name):
            largest = max(float(args[0].abs().max()), float(output.abs().max()))
            peaks[name] = max(peaks.get(name, 0.0), largest)

        handles.append(layer.register_forward_hook(seen))
    try:
        with torch.no_grad():
            torch_host.stepped(parts.unet, conditioning.float(), SIZE, timesteps)
    finally:
        for handle in handles:
            handle.remove()
    return peaks


class _Widened(nn.Module):
    """`inner` computing in fp32 inside an fp16 model: fp16 in, fp32 inside, fp16 out."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner.float()

    def forward(self, x):
        return self.inner(x.float()).to(x.dtype)


def _own_island_run(parts, conditioning, timesteps, island: set[str]):
    """The denoiser in fp16 with the layers of `island` in fp32 (this test's own fix, placed by
    hand on a plain copy): the feed-forward whose weighted layers are the island, wrapped whole
    (its activation holds no weights). The latents the probe's calls make."""
    (holder,) = {name.rsplit(".", 1)[0] for name in island}
    source = parts.unet.get_submodule(holder)
    held = {f"{holder}.{n}" for n, m in source.named_children() if list(m.parameters())}
    assert held == island
    fixed = copy.deepcopy(parts.unet).half()
    block, attribute = holder.rsplit(".", 1)
    setattr(fixed.get_submodule(block), attribute, _Widened(copy.deepcopy(source)))
    with torch.no_grad():
        return torch_host.stepped(fixed, conditioning.half(), SIZE, timesteps)


def _snr_db(output, reference) -> float:
    error = (output.float() - reference.float()).pow(2).mean()
    return float(10 * torch.log10(reference.float().pow(2).mean() / error))


def test_the_check_proves_the_island_fix_computed_for_the_plain_model():
    parts = torch_host.plant(torch_host.build())
    host = TorchHost(parts)
    plan = _plan(host, "fp16")
    runner = Runner(None, plan, SIZE, PROMPT, 20, "euler", host=host)
    told: list[tuple[str, str | None]] = []
    with work.counting() as counted:
        with runner.telling(lambda name, probe: told.append((name, first_bad_name(probe)))):
            encoded = runner.encode(plan)
            first = runner.denoise(plan, encoded.output)
        # The first finding is told as the check tells it, from the first failing call.
        assert told == [("unet", PLANTED)]
        assert first.probes["unet"].non_finite

        def stage_fn(p, record):
            return runner.denoise(p, encoded.output, record)

        search, seen = Search(plan), Observations()
        seen.add(first, plan)
        with runner.recording_in_full():
            reference = stage_fn(fp32_reference(plan), True)
        good = choose_fix(
            "unet",
            stage_fn,
            search,
            reference,
            runner,
            seen,
            PLANTED,
            False,
            _no_progress,
            CancelToken(),
        )
        search.finish(_no_progress, CancelToken())
        host.placed.release()

    # This test's own island: every layer of the plain model whose fp32 input or output
    # passes fp16's range (the planted layer, and the one its values feed until back in it).
    conditioning = host.loaded("text_encoder")(
        torch.stack([torch_host.token_ids(PROMPT), torch_host.token_ids("")])
    )
    peaks = _own_fp32_peaks(parts, conditioning, runner.timesteps)
    own_island = {name for name, peak in peaks.items() if peak > FP16_MAX}
    assert own_island == {PLANTED, BACK}
    assert max(p for n, p in peaks.items() if n not in own_island) < FP16_MAX / 100

    # The check proved that island (fp32 where bf16 is not native), verified against fp32.
    assert good is not None and not good.probes["unet"].non_finite
    assert search.plan.islands("unet") == dict.fromkeys(sorted(own_island), "fp32")
    assert search.plan.dtypes["unet"] == "fp16"
    quality = search.qualities["unet"]
    assert quality.passed and quality.value > 40
    chosen = search.candidates[0]
    assert chosen.chosen and chosen.kind == "islands" and chosen.layers_changed == 2

    # The same fix placed by hand on a plain fp16 copy is finite and agrees with fp32, as the
    # check's run of it does.
    with torch.no_grad():
        wide = torch_host.stepped(parts.unet, conditioning, SIZE, runner.timesteps)
    own = _own_island_run(parts, conditioning, runner.timesteps, own_island)
    assert bool(torch.isfinite(own).all())
    assert _snr_db(own, wide) > 40
    assert _snr_db(good.output, own) > 40

    # What it ran: the text encoder once, the denoiser in fp16 (the first probe and its
    # descent, the candidates) and in fp32 (the reference, the whole-component candidate).
    assert counted.calls["text_encoder"] == {"fp16": 1}
    assert set(counted.calls["unet"]) == {"fp16", "fp32"}


def test_halfsafes_pipelines_are_a_host():
    """The check's default host is HalfSafe's placed pipeline: the same contract."""
    from tests.support.planted_sd import loaded
    from tests.support.tiny_models import build_tiny_sd_pipeline

    model = loaded(build_tiny_sd_pipeline())
    plan = PrecisionPlan(
        device="cpu", dtypes=dict.fromkeys(["text_encoder", "unet", "vae"], "fp32")
    )
    runner = Runner(model, plan, SIZE, PROMPT, 20, "euler")
    host = runner.host
    assert isinstance(host, PipelineHost) and host.denoiser == "unet"
    assert host.components() == ["text_encoder", "unet", "vae"]
    assert host.loaded("vae_encoder") is model.pipeline.vae
    assert host.counted("vae") is model.pipeline.vae.decoder
    assert host.stored_dtype("unet") == "fp32" and host.compute_dtype("vae_encoder", plan) == "fp32"
    assert isinstance(Prompt("x"), Prompt)
