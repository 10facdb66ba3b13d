"""What only Qwen-Image (a Qwen2.5-VL text encoder, an MMDiT transformer on packed 2x2 patches
with real CFG, a causal 3D VAE with per-channel latent statistics) does, on a tiny pipeline
built in code: a size off its patch grid refused in one sentence. A diffusers folder, the
health check with planted overflows in the Qwen2.5-VL feed-forward, a block and the VAE, and
generation repairing a block and the 3D VAE are every family's contract: test_families.py.
Split files as ComfyUI keeps them: test_qwenimage_split.py.
"""

from __future__ import annotations

import pytest

from app.core import generation
from app.core.errors import HalfSafeError
from tests.support.family_helpers import (
    FP16,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.tiny_models import build_tiny_qwenimage_pipeline


def loaded(pipeline, key: str):
    return in_memory(pipeline, key, "qwenimage")


def test_a_size_off_the_patch_grid_is_one_sentence(tmp_path):
    request = generation.GenerationRequest(
        prompt="a red cat", steps=2, cfg=4.0, seed=3, width=72, height=64, output_dir=str(tmp_path)
    )

    with pytest.raises(HalfSafeError) as raised:
        generation.generate(
            loaded(build_tiny_qwenimage_pipeline(), "qwenimage-size"), request, precision=FP16
        )

    assert str(raised.value) == (
        "qwenimage-size: this model makes pictures whose sides are multiples of 16 px, not 72x64."
    )
    assert not list(tmp_path.iterdir())
