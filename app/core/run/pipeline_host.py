"""HalfSafe's own placed pipelines as a host of the stages (`host.Host`): a loaded model's
diffusers pipeline, its family's steps (`Family.encode`, `probe_denoise`, `decode`, an edit's
and a picture's), and a `PlacedPipeline` that places a plan's components one stage at a time."""

from __future__ import annotations

from typing import Any

from app.core.components import module_of
from app.core.encoders.prompts import clip_options
from app.core.families import capabilities, family_of
from app.core.run.host import Prompt
from app.core.run.watchers import counted_module


class PipelineHost:
    """A loaded model (`model.pipeline`, its family) placed by `placed` (a `PlacedPipeline` of
    that pipeline) on `device`. Beside the contract it keeps what the stages a pipeline alone
    runs read: the model, its family and the placed pipeline."""

    def __init__(self, model, placed, device) -> None:
        self.model = model
        self.placed = placed
        self.device = device
        self.family = family_of(model.pipeline)
        self.denoiser: str = self.family.denoiser

    @property
    def parts(self) -> Any:
        return self.model.pipeline

    def components(self) -> list[str]:
        return self.family.components(self.model.pipeline)

    def text_encoders(self, plan) -> list[str]:
        return [n for n in self.family.text_encoders(self.model.pipeline) if n in plan.dtypes]

    def loaded(self, name: str) -> Any:
        return getattr(self.model.pipeline, module_of(name))

    def counted(self, name: str) -> Any:
        return counted_module(name, self.placed[name])

    def stored_dtype(self, name: str) -> str:
        from app.core.precision.plan import dtype_name

        first = next(self.loaded(name).parameters(), None)
        return dtype_name(first.dtype) if first is not None else "fp32"

    def compute_dtype(self, name: str, plan) -> str | None:
        return plan.dtypes.get(module_of(name))

    def probe_timesteps(self, steps: int, scheduler: str, size: int) -> list[float]:
        return self.family.probe_timesteps(
            self.model, steps, scheduler, size or self.model.native_size
        )

    def encode(self, stage, prompt: Prompt, references: Any = None) -> Any:
        if references is not None:
            return capabilities.editing(self.family).encode_edit(
                stage.pipe,
                prompt.text,
                prompt.negative,
                self.device,
                prompt.guidance,
                references,
            )
        return self.family.encode(
            stage.pipe,
            prompt.text,
            prompt.negative,
            self.device,
            prompt.guidance,
            **clip_options(prompt.clip_skip),
        )

    def denoise(
        self, stage, conditioning: Any, size: int, timesteps: list[float], references: Any = None
    ) -> Any:
        if references is not None:
            return capabilities.editing(self.family).probe_edit(
                stage.pipe, conditioning, size, self.device, timesteps, references
            )
        return self.family.probe_denoise(stage.pipe, conditioning, size, self.device, timesteps)

    def decode(self, stage, latents: Any) -> Any:
        return self.family.decode(self.placed["vae"], latents)
