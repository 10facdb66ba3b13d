"""The NaN watch: device-side flags of which images of a denoising run went non-finite and at
which step, kept without a host sync per step and read in one transfer after the loop."""

from __future__ import annotations

from typing import Any

from app.core.hooks import Hooks

# The denoiser's arguments that carry a cache of another call's keys and values.
_PROMPT_CACHE_ARGUMENTS = ("kv_cache", "kv_cache_mode")


class NanWatch:
    """Per-image, device-side record of non-finite values in one denoising run.

    Hooks the UNet: after each call, "output not all finite" is folded per image (the CFG
    halves of the batch belong to the same image) and ORed into `bad`; the first bad step is
    kept in `first_step` with `torch.where`, and so is the UNet input of that call, which lets a
    repair probe exactly the forward pass that failed. `after_step` does the same for the
    latents and advances the step. Nothing here synchronises with the device; `read` is the one
    transfer. Create and use it on the job's thread; remove it when the run ends.
    """

    def __init__(
        self,
        unet,
        batch: int,
        *,
        keep_failing_input: bool = True,
        sample_argument: str = "sample",
        timestep_argument: str = "timestep",
        clamped: list[Any] | tuple[Any, ...] = (),
        order: int = 1,
    ) -> None:
        import inspect

        import torch

        from app.core.precision.streaming import device_of

        device = device_of(unet)
        self.sample_argument = sample_argument  # the denoiser's keyword for the latents
        self.timestep_argument = timestep_argument
        self._signature = inspect.signature(unet.forward)  # names positional arguments
        self._listed = False  # the denoiser takes and returns one tensor per image (Z-Image)
        self.batch = batch
        self.step = 0
        # Denoiser calls per sampler step: a second-order sampler (Heun, DPM2) calls it twice
        # per step but the last (diffusers' `scheduler.order`), and a step is counted as one.
        self.order = max(1, order)
        self.bad = torch.zeros(batch, dtype=torch.bool, device=device)
        self.first_step = torch.full((batch,), -1, dtype=torch.long, device=device)
        self._keep = keep_failing_input
        self._pending: tuple[Any, Any, dict[str, Any]] | None = None
        self._sample: Any = None  # (copies, batch, C, h, w): each image's first bad input
        self._timestep: Any = None  # (batch,)
        self._kwargs: dict[str, Any] = {}
        self._copies = 1
        self._saturated = None  # per image: a clamped block's fp16 output hit 65504 this call
        self._hooks = Hooks()
        self._hooks.before(unet, self._before, kwargs=True)
        self._hooks.after(unet, self._after, kwargs=True)
        # Blocks the model clamps to fp16's limit: a saturated output is an overflow too.
        self._hooks.after_each(clamped, self._block_after)

    def _per_image(self, flags):
        n = flags.shape[0]
        if n % self.batch:
            return flags.any().expand(self.batch)
        return flags.view(n // self.batch, self.batch).any(0)

    def _before(self, module, args, kwargs):
        import torch

        if self._keep:
            try:
                named = dict(self._signature.bind_partial(*args, **kwargs).arguments)
            except TypeError:
                return
            for name, parameter in self._signature.parameters.items():
                if parameter.kind is parameter.VAR_KEYWORD:  # **kwargs: their own names
                    named.update(named.pop(name, {}))
            # A prompt cache (Qwen-Image 2.1's keys and values of the text, kept by the first
            # step): the call kept is re-run alone, and computes them itself.
            for name in _PROMPT_CACHE_ARGUMENTS:
                named.pop(name, None)
            sample = named.pop(self.sample_argument, None)
            timestep = named.pop(self.timestep_argument, None)
            if isinstance(sample, list):
                self._listed = True
                sample = torch.stack(sample)
            self._pending = (sample, timestep, named)

    def _block_after(self, module, args, output):
        import torch

        from app.core.components import FP16_MAX

        for tensor in output if isinstance(output, tuple) else (output,):
            if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float16:
                continue
            hit = (tensor.abs() >= FP16_MAX).flatten(1).any(1) | ~torch.isfinite(tensor).flatten(
                1
            ).all(1)
            self._saturated = hit if self._saturated is None else self._saturated | hit

    def _after(self, module, args, kwargs, output):
        import torch

        out = output[0] if isinstance(output, tuple) else output.sample
        if isinstance(out, list):
            out = torch.stack(out)
        flags = ~torch.isfinite(out).flatten(1).all(1)
        if self._saturated is not None and self._saturated.shape == flags.shape:
            flags = flags | self._saturated
        self._saturated = None
        bad = self._per_image(flags)
        newly = bad & ~self.bad
        self.first_step = torch.where(newly, self.step, self.first_step)
        if self._keep and self._pending is not None:
            self._keep_input(newly)
        self.bad = self.bad | bad

    def _keep_input(self, newly) -> None:
        import torch

        if self._pending is None:
            return
        sample, timestep, rest = self._pending
        self._pending = None
        if sample is None or sample.shape[0] % self.batch:
            return
        copies = sample.shape[0] // self.batch
        per_image = sample.view(copies, self.batch, *sample.shape[1:])
        if self._sample is None or self._sample.shape != per_image.shape:
            self._sample = torch.zeros_like(per_image)
            self._timestep = torch.zeros(self.batch, device=sample.device)
        where = newly.view(1, self.batch, *([1] * (per_image.dim() - 2)))
        self._sample = torch.where(where, per_image, self._sample)
        t = timestep.float() if isinstance(timestep, torch.Tensor) else float(timestep)
        self._timestep = torch.where(newly, t, self._timestep)
        self._kwargs = rest
        self._copies = copies

    def after_step(self, call: int, latents) -> None:
        """Fold the latents after the pipeline's loop iteration `call` (0-based: one denoiser
        call; `order` of them make a sampler step) into the flags."""
        import torch

        bad = self._per_image(~torch.isfinite(latents).flatten(1).all(1))
        newly = bad & ~self.bad
        self.first_step = torch.where(newly, call // self.order, self.first_step)
        self.bad = self.bad | bad
        self.step = (call + 1) // self.order  # the step the next call belongs to

    def flags(self) -> list[Any]:
        """The device tensors `read` would transfer, for reading together with others."""
        return [self.bad, self.first_step]

    def failing_input(self, index: int) -> dict[str, Any] | None:
        """The UNet call that first went non-finite for image `index`, as forward arguments
        (sample, timestep and the rest, for that image only); None if none was kept."""
        if self._sample is None:
            return None
        sample = self._sample[:, index]
        kwargs = {
            k: _select(v, index, self._copies, self.batch)
            for k, v in self._kwargs.items()
            if k != "return_dict"
        }
        return {
            self.sample_argument: list(sample.unbind(0)) if self._listed else sample,
            self.timestep_argument: self._timestep[index : index + 1],
            **kwargs,
        }

    def remove(self) -> None:
        self._hooks.remove()


def _select(value: Any, index: int, copies: int, batch: int) -> Any:
    """Image `index` out of a CFG-batched argument (dicts walked, per-image lists picked from;
    other values kept)."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.dim() and value.shape[0] == copies * batch:
            return value.reshape(copies, batch, *value.shape[1:])[:, index]
        return value
    if isinstance(value, dict):
        return {k: _select(v, index, copies, batch) for k, v in value.items()}
    if isinstance(value, list) and len(value) == copies * batch:  # one entry per image
        return [value[copy * batch + index] for copy in range(copies)]
    return value


def read_flags(tensors: list[Any]) -> list[int]:
    """Bring several small device tensors to the host in one transfer, as integers."""
    import torch

    if not tensors:
        return []
    return torch.cat([t.reshape(-1).long() for t in tensors]).cpu().tolist()


class EncoderFlag:
    """For a pipeline that encodes its pictures itself (an edit's references, Flux.1 Fill's
    picture): hooks on its VAE encoder's parts that fold "output not all finite" into `bad`, a
    device-side flag (no host sync), attached to a stage's `hooks` and leaving with it."""

    def __init__(self, vae, device, hooks: Hooks) -> None:
        import torch

        self.device = device
        self.bad = torch.zeros((), dtype=torch.bool, device=device)
        for name in ("encoder", "quant_conv"):
            part = getattr(vae, name, None)
            if part is not None:
                hooks.after(part, self._after)

    def _after(self, module, args, output) -> None:
        import torch

        tensor = output[0] if isinstance(output, tuple) else output
        if isinstance(tensor, torch.Tensor):
            self.bad = self.bad | ~torch.isfinite(tensor).all().to(self.device)
