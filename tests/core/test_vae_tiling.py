"""VAE tiling (`vae_tiling`): "auto" is resolved per job from the picture's size and what the
device has free beside the VAE, the record says "on" or "off" (what ran), a tiled decode runs
diffusers' tiled decode under HalfSafe's hooks, and a VAE overflow is found at the same layer
with the same fix tiled as untiled."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from app.core import generation, health
from app.core.precision import PrecisionPlan, tiling
from app.core.settings import PrecisionSettings
from app.core.words import infotext
from tests.core.test_health import loaded
from tests.core.test_memory_budget import _half_stored
from tests.support.tiny_models import build_tiny_sd_pipeline

GIB = 2**30


def _small_tiles(pipeline):
    """The tiny VAE's tiles made 32 px (4 latents), so a 64 px picture decodes in tiles."""
    pipeline.vae.tile_sample_min_size = 32
    pipeline.vae.tile_latent_min_size = 4
    return pipeline


def test_auto_tiles_only_where_the_decode_would_not_fit_beside_the_vae():
    vae = build_tiny_sd_pipeline().vae
    plan = PrecisionPlan(device="cuda:0", dtypes={"vae": "fp32"})
    # The widest full-resolution map (32 channels here), four of them live, 4 bytes a value.
    needed = tiling.decode_bytes(vae, 1024, 1024, 4)
    assert needed == 4 * 32 * 1024 * 1024 * 4
    # The device's free memory holds the VAE's weights and the decode's activations.
    weights = sum(p.numel() for p in vae.parameters()) * 4
    free = needed + weights
    assert tiling.resolve(plan, vae, 1024, 1024, free_bytes=free - 1).vae_tiling == "on"
    assert tiling.resolve(plan, vae, 1024, 1024, free_bytes=free).vae_tiling == "off"
    # A choice made is kept; a CPU's memory is not measured, so without a budget auto does
    # not tile there.
    assert tiling.resolve(replace(plan, vae_tiling="off"), vae, 1024, 1024, 0).vae_tiling == "off"
    assert tiling.resolve(replace(plan, vae_tiling="on"), vae, 64, 64).vae_tiling == "on"
    cpu = replace(plan, device="cpu")
    assert tiling.resolve(cpu, vae, 4096, 4096).vae_tiling == "off"
    # A budget bounds the room on any device: the decode stage holds the VAE alone, so the
    # budget less the VAE's weights is what its activations get.
    budgeted = replace(cpu, memory_budget_mb=free / 2**20)
    assert tiling.resolve(budgeted, vae, 1024, 1024).vae_tiling == "off"
    assert tiling.resolve(budgeted, vae, 1025, 1024).vae_tiling == "on"
    # On a GPU the smaller of the budget and its free memory decides.
    on_gpu = replace(budgeted, device="cuda:0")
    assert tiling.resolve(on_gpu, vae, 1024, 1024, free_bytes=100 * GIB).vae_tiling == "off"
    assert tiling.resolve(on_gpu, vae, 1024, 1024, free_bytes=free - 1).vae_tiling == "on"
    roomy = replace(on_gpu, memory_budget_mb=100 * 1024)
    assert tiling.resolve(roomy, vae, 1024, 1024, free_bytes=free - 1).vae_tiling == "on"
    # A VAE without a tiled decode never tiles, whatever was asked.
    assert tiling.resolve(
        replace(plan, vae_tiling="on"), torch.nn.Linear(2, 2), 64, 64
    ).vae_tiling == ("off")


def test_a_tiled_generation_runs_the_tiled_decode_and_says_so(tmp_path, monkeypatch):
    from diffusers import AutoencoderKL

    tiled_calls: list[int] = []
    real = AutoencoderKL.tiled_decode

    def counting(self, *args, **kwargs):
        tiled_calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(AutoencoderKL, "tiled_decode", counting)
    model = loaded(_small_tiles(_half_stored()), "tiling-generation")
    results = {}
    for choice in ("off", "on"):
        request = generation.GenerationRequest(
            prompt="a lake", steps=2, width=64, height=64, seed=4, output_dir=str(tmp_path)
        )
        results[choice] = generation.generate(
            model,
            request,
            precision=PrecisionSettings(precision="fp16", vae_tiling=choice),
            device="cpu",
        ).images[0]
        assert bool(tiled_calls) is (choice == "on")
    for choice, image in results.items():
        assert image.status == "ok"
        assert image.settings["vae_tiling"] == choice
        parsed = infotext.parse(image.parameters)
        assert parsed.get(infotext.VAE_TILING) == choice
    assert model.pipeline.vae.use_tiling is False  # the loaded VAE keeps no job's choice


@pytest.mark.parametrize("choice", ["off", "on"])
def test_a_vae_overflow_is_found_at_the_same_layer_with_the_same_fix_in_tiles(choice, monkeypatch):
    from diffusers import AutoencoderKL

    tiled_calls: list[int] = []
    real = AutoencoderKL.tiled_decode
    monkeypatch.setattr(
        AutoencoderKL,
        "tiled_decode",
        lambda self, *a, **k: tiled_calls.append(1) or real(self, *a, **k),
    )
    report = health.check_loaded(
        loaded(_small_tiles(_half_stored("vae")), f"tiling-{choice}"),
        precision=PrecisionSettings(precision="fp16", vae_tiling=choice),
        device="cpu",
        size=64,
        remember=False,
        measure_cost=False,
    )
    assert report.to_json()["memory"]["vae_tiling"] == choice
    assert bool(tiled_calls) is (choice == "on")  # the probe, the reference, the candidates
    assert report.verdict == "fixable"
    vae = report.components["vae"]
    assert vae.status in ("overflow", "nan")
    untiled = health.check_loaded(
        loaded(_small_tiles(_half_stored("vae")), "tiling-reference"),
        precision=PrecisionSettings(precision="fp16", vae_tiling="off"),
        device="cpu",
        size=64,
        remember=False,
        measure_cost=False,
    )
    assert vae.first_bad_module == untiled.components["vae"].first_bad_module
    assert report.fix is not None and report.fix.verified
    assert report.fix.settings == untiled.fix.settings
    assert report.plan.vae_tiling == choice
