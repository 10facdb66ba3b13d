"""An editing model's request, check and planted overflow, and what the edit tests read back:
the components a fix changed and the arguments of the transformer's first call."""

from __future__ import annotations

import pytest
import torch

from app.core import generation, health
from app.core.health.request import CheckRequest, CheckRun
from tests.support.family_helpers import FP16

# The area Qwen-Image 2.1 reads each condition picture at in the edit tests: 256 px square's in
# its proportions. The pipeline reads a megapixel, and HalfSafe the size it names in the call
# (`QWENIMAGE21_SIZE`): the same code on a sixteenth of the pixels (at a megapixel one repair
# of a planted VAE encoder took 249 s on a 2.5 GHz CPU, here 6 s).
QWENIMAGE21_EDIT_SIZE = 256


@pytest.fixture
def smaller_qwenimage21_pictures(monkeypatch):
    """Qwen-Image 2.1's pictures read at `QWENIMAGE21_EDIT_SIZE` squared for the test."""
    from app.core.families import qwenimage21

    monkeypatch.setattr(qwenimage21, "QWENIMAGE21_SIZE", QWENIMAGE21_EDIT_SIZE)


def edit_request(tmp_path, images, **extra):
    values = dict(
        prompt="make the cube red",
        steps=3,
        cfg=3.5,
        seed=3,
        width=64,
        height=64,
        images=list(images),
        output_dir=str(tmp_path / "out"),
    )
    return generation.GenerationRequest(**{**values, **extra})


def edit_check(model, images, precision=FP16, mask=None):
    return health.check_loaded(
        model,
        CheckRequest(precision=precision, device="cpu", size=64, images=tuple(images), mask=mask),
        run=CheckRun(remember=False, measure_cost=False),
    )


def plant(pipeline, component: str, layer: str, factor: float = 1e6) -> None:
    with torch.no_grad():
        getattr(pipeline, component).get_submodule(layer).weight.mul_(factor)


def changed(report) -> set[str]:
    tested, fixed = report.plan, report.fix.plan
    return {
        c
        for c in tested.dtypes
        if tested.dtypes[c] != fixed.dtypes[c] or tested.islands(c) != fixed.islands(c)
    }


def first_transformer_call(transformer, run) -> dict:
    """The keyword arguments of the transformer's first call while `run()` runs."""
    seen: list[dict] = []

    def keep(_module, _args, kwargs):
        if not seen:
            seen.append({k: v.clone() for k, v in kwargs.items() if torch.is_tensor(v)})

    handle = transformer.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.inference_mode():
            run()
    finally:
        handle.remove()
    return seen[0]
