"""What HalfSafe's pipelines over diffusers' modular blocks share (Anima's, FLUX.3's): the block
added at the end of each denoising step that hands the step's latents to a callback, as a
classic pipeline's `callback_on_step_end` does (the progress, the live preview, cancel and the
NaN watch's per-step fold), and the assembly of a modular pipeline with diffusers' assembly
warnings kept off the user's terminal.

Imported only where such a model is built or loaded: it subclasses diffusers' classes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from diffusers.modular_pipelines.modular_pipeline import ModularPipelineBlocks
from diffusers.modular_pipelines.modular_pipeline_utils import InputParam

# diffusers' modular pipelines log, at warning level, every time one is assembled: that their
# guiders are experimental, that a part was not made by their ComponentSpec. Said on every
# job, they would be noise on a user's terminal.
_ASSEMBLY_LOGGERS = (
    "diffusers.guiders.guider_utils",
    "diffusers.modular_pipelines.modular_pipeline_utils",
    "diffusers.modular_pipelines.modular_pipeline",
)


class StepEndStep(ModularPipelineBlocks):
    """The last block of each denoising step: the step's latents to `step_callback(pipeline,
    step, timestep, {"latents": ...})`, whose returned "latents" (if any) replace them. A
    family's subclass names its model (`model_name`)."""

    @property
    def description(self) -> str:
        return "Hands each step's latents to a callback, as a pipeline's callback_on_step_end."

    @property
    def inputs(self) -> list[InputParam]:
        return [InputParam("step_callback", description="Called after each denoising step.")]

    @torch.no_grad()
    def __call__(self, components, block_state, i: int, t):
        callback = getattr(block_state, "step_callback", None)
        if callback is not None:
            changed = callback(components, i, t, {"latents": block_state.latents}) or {}
            block_state.latents = changed.get("latents", block_state.latents)
        return components, block_state


@contextlib.contextmanager
def quiet_assembly() -> Iterator[None]:
    """diffusers' assembly warnings silenced (errors still said). The levels are process-wide:
    the engine runs one job at a time."""
    loggers = [logging.getLogger(name) for name in _ASSEMBLY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def assembled(modular_class, blocks, parts: Mapping[str, Any], guidance_scale: float | None) -> Any:
    """A `modular_class` pipeline on `blocks` with the `parts` its blocks ask for and, where
    they take one, a classifier-free guider at `guidance_scale` (at 1 or below it makes one
    call a step, on the prompt alone); quietly, without a progress bar."""
    from diffusers.guiders import ClassifierFreeGuidance

    with quiet_assembly():
        modular = modular_class(blocks=blocks)
        wanted = set(modular.component_names)
        chosen = {n: part for n, part in parts.items() if n in wanted}
        if "guider" in wanted and guidance_scale is not None:
            chosen["guider"] = ClassifierFreeGuidance(guidance_scale=guidance_scale)
        modular.update_components(**chosen)
    modular.set_progress_bar_config(disable=True)
    return modular
