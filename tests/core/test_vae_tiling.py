"""VAE tiling (`vae_tiling`): "auto" is resolved per job from the picture's size and what the
device has free beside the VAE, the record says "on" or "off" (what ran), a tiled decode runs
diffusers' tiled decode under HalfSafe's hooks, and a VAE overflow is found at the same layer
with the same fix tiled as untiled."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from app.core import generation, health
from app.core.health.request import CheckRequest, CheckRun
from app.core.precision import PrecisionPlan, tiling
from app.core.settings import PrecisionSettings
from app.core.words import infotext
from tests.support.planted_sd import half_stored, loaded
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
    model = loaded(_small_tiles(half_stored()), "tiling-generation")
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
        loaded(_small_tiles(half_stored("vae")), f"tiling-{choice}"),
        CheckRequest(
            precision=PrecisionSettings(precision="fp16", vae_tiling=choice), device="cpu", size=64
        ),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert report.to_json()["memory"]["vae_tiling"] == choice
    assert bool(tiled_calls) is (choice == "on")  # the probe, the reference, the candidates
    assert report.verdict == "fixable"
    vae = report.components["vae"]
    assert vae.status in ("overflow", "nan")
    untiled = health.check_loaded(
        loaded(_small_tiles(half_stored("vae")), "tiling-reference"),
        CheckRequest(
            precision=PrecisionSettings(precision="fp16", vae_tiling="off"), device="cpu", size=64
        ),
        run=CheckRun(remember=False, measure_cost=False),
    )
    assert vae.first_bad_module == untiled.components["vae"].first_bad_module
    assert report.fix is not None and report.fix.verified
    assert report.fix.settings == untiled.fix.settings
    assert report.plan.vae_tiling == choice


def test_tiles_are_made_smaller_than_the_vaes_own_where_one_would_not_fit(monkeypatch):
    vae = build_tiny_sd_pipeline().vae  # its own tiles: 128 px (16 latents), a 128 px picture one
    monkeypatch.setattr(tiling, "SMALLEST_TILE_PX", 32)
    weights = sum(p.numel() for p in vae.parameters()) * 4
    plan = PrecisionPlan(device="cpu", dtypes={"vae": "fp32"})
    fits_64 = weights + tiling.decode_bytes(vae, 64, 64, 4)
    budgeted = replace(plan, memory_budget_mb=fits_64 / 2**20)
    resolved = tiling.resolve(budgeted, vae, 128, 128)
    assert (resolved.vae_tiling, resolved.vae_tile_px) == ("on", 64)
    # Room for its own tiles: they are kept (0); asked for without a budget, likewise.
    roomy = replace(
        plan, memory_budget_mb=(weights + tiling.decode_bytes(vae, 128, 128, 4)) / 2**20
    )
    assert tiling.resolve(roomy, vae, 256, 256).vae_tile_px == 0
    assert tiling.resolve(replace(plan, vae_tiling="on"), vae, 256, 256).vae_tile_px == 0
    # Never below the smallest tile, however little room.
    starved = replace(plan, memory_budget_mb=weights / 2**20)
    assert tiling.resolve(starved, vae, 128, 128).vae_tile_px == 32


def test_a_budgeted_generation_decodes_in_tiles_of_the_size_that_fits(tmp_path, monkeypatch):
    from diffusers import AutoencoderKL

    sizes: list[tuple[int, int]] = []
    real = AutoencoderKL.tiled_decode

    def seen(self, *args, **kwargs):
        sizes.append((self.tile_sample_min_size, self.tile_latent_min_size))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(AutoencoderKL, "tiled_decode", seen)
    monkeypatch.setattr(tiling, "SMALLEST_TILE_PX", 32)
    model = loaded(build_tiny_sd_pipeline(), "tiling-budget")
    vae = model.pipeline.vae
    # Room for a 64 px tile's activations (in fp32, the widest the VAE runs in) beside the
    # VAE in fp32, not for one of its own 128 px tiles.
    weights = sum(p.numel() for p in vae.parameters()) * 4
    budget = weights + tiling.decode_bytes(vae, 64, 64, 4)
    lines: list[str] = []
    request = generation.GenerationRequest(
        prompt="a lake", steps=2, width=128, height=128, seed=4, output_dir=str(tmp_path)
    )
    image = generation.generate(
        model,
        request,
        precision=PrecisionSettings(precision="fp16", max_vram_gb=budget / 2**30),
        device="cpu",
        on_progress=lambda message, *_: lines.append(str(message)),
    ).images[0]
    assert image.status == "ok"
    assert image.settings["vae_tiling"] == "on"
    assert sizes and set(sizes) == {(64, 8)}
    assert any("the VAE decodes in 64 px tiles" in line for line in lines)
    assert (vae.tile_sample_min_size, vae.use_tiling) == (128, False)  # the loaded VAE's own
