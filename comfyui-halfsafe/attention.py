"""ComfyUI's attention switched to its `pytorch` backend (PyTorch's own
scaled_dot_product_attention) for one call or one MODEL, through ComfyUI's own
`optimized_attention_override` in the call's transformer options: every attention function
ComfyUI dispatches to that takes the override (its own backends and those made the way it makes
them) hands its call over, so a broken kernel is left out at the same precision. The check uses
it to tell an attention kernel fault from an overflow; HalfSafe Fix puts it on a clone."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import host

BACKEND = "pytorch"  # ComfyUI's registered name of the backend a switch goes to
OVERRIDE = "optimized_attention_override"  # where ComfyUI's attention looks for a replacement
LAUNCH_FLAG = "--use-pytorch-cross-attention"
# ComfyUI's own attention functions and the launch flag that chooses each: the one to leave out
# when that function is at fault.
FLAGS = {
    "attention_sage": "--use-sage-attention",
    "attention3_sage": "--use-sage-attention",
    "attention_flash": "--use-flash-attention",
    "attention_split": "--use-split-cross-attention",
    "attention_sub_quad": "--use-quad-cross-attention",
    "attention_xformers": "xformers (on while it is installed; --disable-xformers)",
}
# The backend a fix switches to, as the remembered fix's `attention_backend` setting names it:
# ComfyUI's pytorch backend is PyTorch's SDPA choosing its own kernel, the desktop's `auto`.
SETTING = {BACKEND: "auto"}


class Switch:
    """ComfyUI's attention override: each call goes to `backend`'s function; the functions
    ComfyUI would have run are counted (`replaced`, module.name -> calls)."""

    def __init__(self, backend: str = BACKEND) -> None:
        self.backend = backend
        self.function = _registered(backend)
        self.replaced: dict[str, int] = {}

    def __call__(self, func, *args, **kwargs):
        name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__name__', '?')}"
        self.replaced[name] = self.replaced.get(name, 0) + 1
        # ComfyUI marks the call as inside its wrapper: the target runs without asking again.
        return self.function(*args, **kwargs)

    def others(self) -> list[str]:
        """The functions it replaced other than its own backend's."""
        own = getattr(self.function, "__name__", "")
        return sorted(n for n in self.replaced if n.rpartition(".")[2] != own)


def _registered(backend: str):
    try:
        import comfy.ldm.modules.attention as comfy_attention
    except ImportError as error:  # not inside ComfyUI
        raise host.NodeProblem(f"HalfSafe's nodes run inside ComfyUI; {error}.") from error
    function = getattr(comfy_attention, "get_attention_function", lambda *_: None)(backend, None)
    if function is None:
        raise host.NodeProblem(
            f"This ComfyUI has no {backend} attention backend for HalfSafe Fix to switch to."
        )
    return function


def switched(kwargs: dict, switch: Switch) -> dict:
    """A denoiser call's keyword inputs with its attention switched (the caught ones are kept)."""
    options = dict(kwargs.get("transformer_options") or {})
    options[OVERRIDE] = switch
    return {**kwargs, "transformer_options": options}


def apply(model, backend: str) -> str:
    """Switch the attention of `model` (a clone) to `backend` through its model options: every
    sampler call of this clone only; nothing copied. Returns what was done, in words."""
    switch = Switch(backend)
    options = model.model_options.setdefault("transformer_options", {})
    options[OVERRIDE] = switch
    return f"attention switched to ComfyUI's {backend} backend ({_what(backend)})"


def apply_fix(model, fix: dict) -> list[str]:
    """Put the whole of the nodes' `fix` on `model` (a clone): its precision parts (compute
    dtype, islands, clamps) and its attention backend; what was done, in words."""
    precision = any(fix.get(k) for k in ("component", "islands", "clamps"))
    done = [host.apply_fix(model, fix)] if precision or not fix.get("attention") else []
    if fix.get("attention"):
        done.append(apply(model, fix["attention"]))
    return done


def _what(backend: str) -> str:
    return "PyTorch's own scaled_dot_product_attention" if backend == BACKEND else backend


@dataclass(frozen=True)
class KernelFault:
    """The same call at the same precision right with PyTorch's own attention: `replaced`, the
    functions ComfyUI's attention ran (module.name), `quality` against fp32 on PyTorch's
    attention."""

    replaced: list[str]
    quality: Any


def kernel_fault(module, call) -> KernelFault | None:
    """The denoiser call `call` run again at the precision ComfyUI runs it with the attention
    switched to PyTorch's own: a kernel fault when its every layer is finite and its output
    agrees with fp32 (computed on PyTorch's attention too) by the desktop's metric. None where
    ComfyUI's attention already was PyTorch's, or nothing took the switch."""
    from app.core.fixing.module_check import recorded_call, reference_call
    from app.core.fixing.quality import compare

    switch = Switch()
    kwargs = switched(call.kwargs, switch)
    trial = recorded_call(module, lambda: module(*call.args, **kwargs))
    if not switch.others() or not trial.finite:
        return None
    reference = reference_call(module, call.args, kwargs)
    if not reference.finite:
        return None
    quality = compare(trial.output, reference.output)
    return KernelFault(switch.others(), quality) if quality.passed else None


def dispatched_unswitchable() -> str | None:
    """The function ComfyUI's attention module dispatches to when it does not take ComfyUI's
    override (a replacement that skips ComfyUI's wrapper); None when it takes it."""
    import comfy.ldm.modules.attention as comfy_attention

    function = getattr(comfy_attention, "optimized_attention", None)
    if function is None or hasattr(function, "__wrapped__"):
        return None
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__name__', '?')}"


def fault_lines(fault: KernelFault, compute: str, layer: str | None, stats) -> list[str]:
    """The check's sentences for a kernel fault: what ran, the proof, the evidence from the
    recorded call (the first bad layer's inputs), and how to switch."""
    from app.core.components import FP16_MAX

    ran = ", ".join(fault.replaced)
    lines = [
        f"Attention kernel fault, not an overflow: ComfyUI's attention ran {ran}; at the same "
        f"precision ({compute}) its {BACKEND} backend ({_what(BACKEND)}) gives finite output "
        f"that agrees with fp32 ({fault.quality.words()})."
    ]
    if layer and stats is not None and stats.bad_with_finite_inputs:
        peak = stats.input_max_abs
        if math.isfinite(peak) and peak <= FP16_MAX:
            lines.append(
                f"Evidence: the inputs of {layer} were finite and within fp16's range (largest "
                f"|value| {peak:.3g}, limit {FP16_MAX:g}): nothing before it had overflowed, "
                "and the same layer on PyTorch's attention stays finite."
            )
    return lines


def fix_words(fault: KernelFault) -> tuple[str, str]:
    """(the fix's summary, how to apply it) for a kernel fault: switch the backend, keep the
    precision."""
    names = [n.rpartition(".")[2] for n in fault.replaced]
    summary = (
        f"Switch ComfyUI's attention from {', '.join(names)} to its {BACKEND} backend, with no "
        f"precision change (verified fix, {fault.quality.words()})."
    )
    flags = sorted({FLAGS[n] for n in names if n in FLAGS})
    instead = f" in place of {' and '.join(flags)}" if flags else ""
    how = (
        f"Start ComfyUI with {LAUNCH_FLAG}{instead} and without a node that patches its "
        "attention, or add HalfSafe Fix between the loader and the sampler: it switches this "
        "model's attention on a clone."
    )
    return summary, how
