"""What the stages drive: a host of a model's components (`Host`). HalfSafe's own placed
pipelines are one host (`pipeline_host.PipelineHost`); a model another program loaded (ComfyUI's
MODEL, CLIP and VAE) or plain torch modules are others. The stages (`stages.Stages`) and the
check's runner (`health.stages.Runner`) reach a model through this contract alone for the
prompt's encoding, the denoiser's probe and the decode, the modules they watch and the plans
they place; the stages a pipeline alone runs (the prompt upsampler, the VAE's encoder, a
generation's loop) still reach its pipeline (`PipelineHost.model`).

Components are named as HalfSafe's plans name them (`text_encoder`, `unet` or `transformer`,
`vae`, ...: `PrecisionPlan.dtypes`' keys), so that a plan, a probe and a fix mean the same on
every host. A component's named modules are those of its root module (`loaded(name)`, `placed[name]`), in
`named_modules()`'s dotted names: the names a first bad layer and a fix's islands are given in.

A host's plans are placed by its `placed` (`Placement`), which the stage runner
(`stage_run.running`) applies for each stage: HalfSafe's `PlacedPipeline`, over a pipeline or
any holder of a model's modules. Islands are placed as HalfSafe places them: their wider output
is taken back by the next layer outside them (the check's island candidates are drawn for
that); a host placing islands another way must give the check islands drawn for its way."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class Prompt:
    """What the text encoders read: the prompt, the negative prompt, whether guidance takes
    both (classifier-free guidance), and AUTOMATIC1111's clip skip."""

    text: str
    negative: str = ""
    guidance: bool = True
    clip_skip: int = 1


class Placement(Protocol):
    """How a plan is placed on a host's components and taken off (`PlacedPipeline`'s
    interface)."""

    def apply(self, plan, components: Collection[str] | None = None) -> None:
        """Place `components` (None: every one of the plan) under `plan`, each in its dtype
        with its islands and clamps, taking every other component's placement off."""
        ...

    def release(self) -> None:
        """Take every placement off and give the device's memory back."""
        ...

    def __getitem__(self, name: str) -> Any:
        """The root module of component `name` as placed now (as loaded where it is not)."""
        ...

    def pipeline(self) -> Any:
        """What a stage's call runs on, holding the placed components (a pipeline's twin)."""
        ...


class Host(Protocol):
    """A model's components as the stages drive them: which there are, their root modules as
    loaded and as placed, the module whose forward is one call of each, their dtypes, placing a
    plan on them and taking it off (`placed`), and one call of each (the text encoders on a
    prompt, the denoiser at the probe's timesteps, the decode)."""

    # The device the components run on (a torch.device).
    device: Any
    # The denoiser's component name (`unet`, `transformer`).
    denoiser: str

    @property
    def placed(self) -> Placement:
        """What places a plan on the components and takes it off."""
        ...

    @property
    def parts(self) -> Any:
        """Each component's loaded root module as an attribute of its name (HalfSafe's pipeline
        itself): what a plan's memory is counted from (`placement.generation_held_mb`)."""
        ...

    def components(self) -> list[str]:
        """The components the host holds, in the order a job runs them."""
        ...

    def text_encoders(self, plan) -> list[str]:
        """The text encoders `plan` places, in the order the host reads the prompt with them."""
        ...

    def loaded(self, name: str) -> Any:
        """The root module of component `name` as loaded (the VAE's for its encoder): its
        layers, never placed, for reading its structure."""
        ...

    def counted(self, name: str) -> Any:
        """The module of component `name` whose forward is one call of it (a VAE's decoder:
        its stage calls `decode`, never its forward); what a stage counts, times and stops."""
        ...

    def stored_dtype(self, name: str) -> str:
        """The dtype component `name`'s floating weights are loaded in ("fp16", "bf16",
        "fp32")."""
        ...

    def compute_dtype(self, name: str, plan) -> str | None:
        """The dtype component `name` computes in under `plan` (None: the plan leaves it out)."""
        ...

    def probe_timesteps(self, steps: int, scheduler: str, size: int) -> list[float]:
        """The timesteps the check's probe calls the denoiser at, for the user's sampler at
        `steps` steps and a `size` px picture (first, middle and last)."""
        ...

    def encode(self, stage, prompt: Prompt, references: Any = None) -> Any:
        """The prompt and the negative prompt through the text encoders placed for `stage`
        (`stage_run.StageRun`), once: the conditioning the denoiser reads. `references`: an
        edit's reference pictures where its text encoder reads them (None for other jobs)."""
        ...

    def denoise(
        self, stage, conditioning: Any, size: int, timesteps: list[float], references: Any = None
    ) -> Any:
        """The denoiser called once at each of `timesteps` from seeded noise at `size` px, on
        `conditioning`, each call's output stepping the latents on to the next timestep; the
        last latents. One timestep is one call of `counted(denoiser)`: the runner counts, stops
        and tells by calls. `references`: latents the denoiser reads in its sequence."""
        ...

    def decode(self, stage, latents: Any) -> Any:
        """The VAE placed for `stage` decoding `latents` once: pixels (B, C, H, W) in [-1, 1]."""
        ...
