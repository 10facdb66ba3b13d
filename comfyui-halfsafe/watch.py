"""HalfSafe NaN Watch: a flag per denoiser call kept on the device (no host sync per step), read
once when sampling ends; where a step went non-finite, that call is run again recorded to name
the first bad layer. With a fix connected, the watched model samples with the fix on it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

NONE_BAD = 1 << 30  # the flag's value while no call went non-finite
FP16_MAX = 65504.0


@dataclass
class Finding:
    step: int  # 1-based sampler step
    steps: int
    call: int  # 0-based denoiser call
    first_bad_layer: str | None

    def words(self) -> str:
        layer = f"; first bad layer {self.first_bad_layer}" if self.first_bad_layer else ""
        return (
            f"HalfSafe NaN Watch: step {self.step} of {self.steps} went non-finite in the "
            f"diffusion model{layer}."
        )


@dataclass
class Watch:
    """One watched MODEL's state across a sampling run (reset as each run starts)."""

    repair: dict | None = None
    calls: list[tuple[Any, tuple, dict]] = field(default_factory=list)
    first_bad: Any = None  # 0-d device tensor: the first non-finite call's index, or NONE_BAD
    findings: list[Finding] = field(default_factory=list)
    host_syncs: int = 0
    sample_sigmas: Any = None
    blocks: dict[int, list] = field(default_factory=dict)  # id(model) -> its main blocks

    def on_call(self, executor, *args, **kwargs):
        """DIFFUSION_MODEL wrapper: the call with each main block's output watched, then the
        call's flag folded in on the device. A model may replace non-finite values before its
        output (ComfyUI's Flux code in fp16 turns inf into +-65504 and NaN into zeros inside
        its blocks), so the output alone would not show them: a block's output at or past
        fp16's largest value, or not finite, marks the call. One reduction a block (some 60 a
        Flux call, beside its billions of multiply-adds), none a layer, no read."""
        import torch

        from app.core.fixing.probe import top_blocks
        from app.core.hooks import Hooks

        root = executor.class_obj
        if id(root) not in self.blocks:  # found once, not walked again every step
            self.blocks[id(root)] = [root.get_submodule(n) for n in top_blocks(root)]
        seen: list = []

        def watch_block(_module, _args, block_output):
            for value in _floats(block_output):
                limit = FP16_MAX if value.dtype == torch.float16 else math.inf
                peak = torch.linalg.vector_norm(value.detach(), math.inf, dtype=torch.float32)
                bad = ~(peak < limit)  # NaN compares false: bad too
                seen[:] = [bad if not seen else seen[0] | bad]

        with Hooks() as hooks:
            hooks.after_each(self.blocks[id(root)], watch_block)
            output = executor(*args, **kwargs)
        index = len(self.calls)
        options = _options(args, kwargs)
        self.calls.append((root, args, kwargs))
        if self.sample_sigmas is None and options is not None:
            self.sample_sigmas = options.get("sample_sigmas")
        tensor = output if isinstance(output, torch.Tensor) else output[0]
        bad = ~torch.isfinite(tensor).all()
        if seen:
            bad = bad | seen[0].to(bad.device)
        mark = torch.where(bad, torch.tensor(index, device=tensor.device), NONE_BAD)
        self.first_bad = mark if self.first_bad is None else torch.minimum(self.first_bad, mark)
        return output

    def on_sample(self, executor, *args, **kwargs):
        """OUTER_SAMPLE wrapper: a fresh state, the sampling, then the one read."""
        self.calls, self.first_bad, self.sample_sigmas = [], None, None
        output = executor(*args, **kwargs)
        self.finish()
        return output

    def finish(self) -> Finding | None:
        if self.first_bad is None:
            return None
        first = int(self.first_bad.item())  # the run's one host sync
        self.host_syncs += 1
        if first >= NONE_BAD:
            return None
        module, args, kwargs = self.calls[first]
        step, steps = _step(self.sample_sigmas, args, kwargs, first)
        finding = Finding(step, steps, first, _first_bad_layer(module, args, kwargs))
        self.findings.append(finding)
        import logging

        logging.warning(finding.words())
        self.calls = []
        return finding


def _options(args, kwargs) -> dict | None:
    found = kwargs.get("transformer_options")
    if isinstance(found, dict):
        return found
    return next((a for a in args if isinstance(a, dict) and "sigmas" in a), None)


def _step(sample_sigmas, args, kwargs, call: int) -> tuple[int, int]:
    """Which sampler step a call belongs to: its sigma among the run's (read at the end)."""
    options = _options(args, kwargs) or {}
    sigma = options.get("sigmas")
    if sample_sigmas is None or sigma is None:
        return call + 1, 0
    sigmas = [float(s) for s in sample_sigmas.flatten().tolist()]
    here = float(sigma.flatten()[0])
    index = min(range(len(sigmas)), key=lambda i: abs(sigmas[i] - here))
    return index + 1, max(1, len(sigmas) - 1)


def _first_bad_layer(module, args, kwargs) -> str | None:
    from app.core.fixing.module_check import recorded_call

    seen = recorded_call(module, lambda: module(*args, **kwargs))
    return f"diffusion_model.{seen.first_bad_layer}" if seen.first_bad_layer else None


def watched(model, repair: dict | None = None):
    """A clone of `model` with the watch's wrappers (and with `repair`, the fix applied)."""
    import comfy.patcher_extension as extension

    from . import host

    clone = model.clone()
    if repair:
        host.apply_fix(clone, repair)
    watch = Watch(repair=repair)
    clone.add_wrapper_with_key(
        extension.WrappersMP.DIFFUSION_MODEL, "halfsafe_watch", watch.on_call
    )
    clone.add_wrapper_with_key(extension.WrappersMP.OUTER_SAMPLE, "halfsafe_watch", watch.on_sample)
    return clone, watch


def _floats(value: Any):
    from app.core.fixing.probe import float_tensors

    return float_tensors(value)
