"""HalfSafe NaN Watch: a flag per denoiser call kept on the device (no host sync per step), read
once when sampling ends; where a step went non-finite, that call is run again recorded to name
the first bad layer. With a fix connected, the watched model samples with the fix on it.
Without one, a run that went non-finite is repaired: sampled again with a proved fix (the one
remembered for this model, or one proved on the failing call against fp32), so only a run that
failed pays for a fix."""

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
    # What the watch did about it, in words ("" while nothing was tried); `repaired`: the run
    # sampled again with a fix came out finite and its output is the one returned.
    repair: str = ""
    repaired: bool = False

    def words(self) -> str:
        layer = f"; first bad layer {self.first_bad_layer}" if self.first_bad_layer else ""
        said = (
            f"HalfSafe NaN Watch: step {self.step} of {self.steps} went non-finite in the "
            f"diffusion model{layer}."
        )
        return f"{said} {self.repair}" if self.repair else said


@dataclass
class Watch:
    """One watched MODEL's state across a sampling run (reset as each run starts)."""

    repair: dict | None = None  # the fix connected: on from the first step
    repairs: bool = True  # without one, sample a failed run again with a proved fix
    calls: list[tuple[Any, tuple, dict]] = field(default_factory=list)
    first_bad: Any = None  # 0-d device tensor: the first non-finite call's index, or NONE_BAD
    findings: list[Finding] = field(default_factory=list)
    host_syncs: int = 0
    sample_sigmas: Any = None
    blocks: dict[int, list] = field(default_factory=dict)  # id(model) -> the modules watched
    repairing: bool = False  # inside the run sampled again: no second repair
    failed_call: tuple | None = None  # (module, args, kwargs) of the last finding's call

    def on_call(self, executor, *args, **kwargs):
        """APPLY_MODEL wrapper (every ComfyUI model calls through it; some, SD3's MMDiT among
        them, never through the DIFFUSION_MODEL one): the call with the diffusion model's own
        call caught and each of its main blocks' outputs watched, then the call's flag folded
        in on the device. A model may replace non-finite values before its output (ComfyUI's
        Flux code in fp16 turns inf into +-65504 and NaN into zeros inside its blocks), so the
        output alone would not show them, nor, where the code clamps a part's output inside a
        block and normalises it (Lumina 2's attention and feed-forward in Z-Image), the block's:
        a block's or a composite part's output (its attention, feed-forward, modulation) at or
        past fp16's largest value, or not finite, marks the call. One reduction each (a few a
        block, beside its billions of multiply-adds), none a layer, no read."""
        import torch

        from app.core.hooks import Hooks
        from app.core.run.probe import top_blocks

        root = executor.class_obj.diffusion_model
        if id(root) not in self.blocks:  # found once, not walked again every step
            blocks = [root.get_submodule(n) for n in top_blocks(root)]
            parts = [c for b in blocks for c in b.children() if next(c.children(), None)]
            self.blocks[id(root)] = blocks + parts
        seen: list = []
        called: list = []  # the diffusion model's own calls: (args, kwargs, output)

        def watch_block(_module, _args, block_output):
            for value in _floats(block_output):
                limit = FP16_MAX if value.dtype == torch.float16 else math.inf
                peak = torch.linalg.vector_norm(value.detach(), math.inf, dtype=torch.float32)
                bad = ~(peak < limit)  # NaN compares false: bad too
                seen[:] = [bad if not seen else seen[0] | bad]

        def catch(_module, call_args, call_kwargs, call_output):
            called.append((call_args, dict(call_kwargs), call_output))

        with Hooks() as hooks:
            hooks.after_each(self.blocks[id(root)], watch_block)
            hooks.after(root, catch, kwargs=True)
            output = executor(*args, **kwargs)
        call_args, call_kwargs, result = called[0] if called else ((), {}, output)
        index = len(self.calls)
        options = _options(call_args, call_kwargs)
        self.calls.append((root, call_args, call_kwargs))
        if self.sample_sigmas is None and options is not None:
            self.sample_sigmas = options.get("sample_sigmas")
        tensor = result if isinstance(result, torch.Tensor) else result[0]
        bad = ~torch.isfinite(tensor).all()
        if seen:
            bad = bad | seen[0].to(bad.device)
        mark = torch.where(bad, torch.tensor(index, device=tensor.device), NONE_BAD)
        self.first_bad = mark if self.first_bad is None else torch.minimum(self.first_bad, mark)
        return output

    def on_sample(self, executor, *args, **kwargs):
        """OUTER_SAMPLE wrapper: a fresh state, the sampling, then the one read; a run that went
        non-finite is sampled again with a fix where one is to be had (see `_repaired`)."""
        if self.repairing:
            return executor(*args, **kwargs)
        guider = executor.class_obj
        self.calls, self.first_bad, self.sample_sigmas = [], None, None
        output = executor(*args, **kwargs)
        finding = self.finish()
        if finding is None:
            return output
        try:
            repaired = self._repaired(guider, finding, args, kwargs)
        except Exception as error:  # the run's own output stands; never stop the queue
            finding.repair = f"It could not be repaired ({type(error).__name__}: {error})."
            repaired = None
        import logging

        if finding.repair:
            logging.warning(finding.repair)
        return output if repaired is None else repaired

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
        self.failed_call = (module, args, kwargs)
        self.calls = []
        return finding

    def _repaired(self, guider, finding: Finding, args, kwargs):
        """The run sampled again from the same noise with a fix on a clone of the model: the
        fix connected is already on (nothing more to try), else the one remembered for this
        model on this device, else one proved on the failing call against fp32 (layers kept
        wider, else the whole diffusion model in fp32) and remembered. The run made again is
        watched too: its output replaces the failed one only when it came out finite."""
        if self.repair:
            finding.repair = "The fix connected was on: it does not hold at this step."
            return None
        if not self.repairs:
            return None
        shapes = kwargs.get("latent_shapes") or (args[8] if len(args) > 8 else None)
        if shapes is not None and len(shapes) > 1:
            finding.repair = "A run of several latents is not sampled again."
            return None
        from . import attention, host, store

        patcher = guider.model_patcher
        notes: list[str] = []
        fix, source = store.remembered(patcher, notes), "remembered for this model"
        proved = fix is None
        if proved:
            fix, source = self._proved(patcher), "proved on the failing call"
            if fix is None:
                finding.repair = "Not repaired: even fp32 goes non-finite at that call."
                return None
        fixed = patcher.clone()
        done = "; ".join(attention.apply_fix(fixed, fix))
        again = _guider_again(guider, fixed)
        self.repairing, self.blocks = True, {}
        self.calls, self.first_bad = [], None
        try:
            output = again.sample(*args[:8])
            if self.first_bad is not None:
                self.host_syncs += 1
                still = int(self.first_bad.item()) < NONE_BAD
            else:
                still = False
        finally:
            self.repairing, self.calls, self.blocks = False, [], {}
        host.put_back(patcher)  # the fix's layers out of the model the clones share
        if still:
            finding.repair = f"Sampled again with the fix {source} ({done}): still non-finite."
            return None
        if proved:  # remembered once the run made again with it came out finite
            store.remember(patcher, fix, fix["summary"], fix.get("made_at") or {}, notes)
        finding.repaired = True
        finding.repair = (
            f"Repaired: sampled again with the fix {source} ({done}), finite. "
            "Add HalfSafe Fix before the sampler to start with it."
        )
        return output

    def _proved(self, patcher) -> dict | None:
        """A fix proved on the failing call against the same call in fp32 (None where fp32
        fails too)."""
        from app.core.fixing.module_check import reference_call

        from . import checking, host

        module, args, kwargs = self.failed_call  # type: ignore[misc]
        call = host.DenoiserCall(args=args, kwargs=kwargs)
        reference = reference_call(module, args, kwargs)
        if not reference.finite:
            return None
        proof = checking.prove(patcher, module, call, reference)
        if proof.islands:
            paths = ", ".join(f"{host.PREFIX}.{p}" for p in proof.islands)
            proof.fix["summary"] = (
                f"Keep {len(proof.islands)} layer(s) in {proof.dtype}: {paths} "
                f"(verified fix, {proof.quality.words()})."  # type: ignore[attr-defined]
            )
            proof.fix["quality"] = proof.quality.to_json()  # type: ignore[attr-defined]
        proof.fix["made_at"] = {"unet_precision": host.precision(patcher)["compute"]}
        return proof.fix


def _guider_again(guider, fixed):
    """A copy of the sampling's guider (its conds and cfg as the workflow set them) whose model
    is `fixed`: sampling it runs the whole preparation again, as ComfyUI does for a run."""
    import copy

    again = copy.copy(guider)
    again.model_patcher = fixed
    again.model_options = fixed.model_options
    return again


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

    if not args and not kwargs:  # the model never called its diffusion model
        return None
    seen = recorded_call(module, lambda: module(*args, **kwargs))
    return f"diffusion_model.{seen.first_bad_layer}" if seen.first_bad_layer else None


def watched(model, repair: dict | None = None, repairs: bool = True):
    """A clone of `model` with the watch's wrappers (and with `repair`, the fix applied; with
    `repairs` and no fix, a failed run sampled again with a proved one)."""
    import comfy.patcher_extension as extension

    from . import attention, host

    clone = model.clone()
    # The whole fix connected, its attention switch too (as HalfSafe Fix puts it on); a fix
    # with nothing for the diffusion model (a VAE's alone) leaves the watch free to repair.
    done = attention.apply_fix(clone, repair) if repair else []
    applied = [d for d in done if d != host.NOTHING]
    watch = Watch(repair=repair if applied else None, repairs=repairs)
    clone.add_wrapper_with_key(extension.WrappersMP.APPLY_MODEL, "halfsafe_watch", watch.on_call)
    clone.add_wrapper_with_key(extension.WrappersMP.OUTER_SAMPLE, "halfsafe_watch", watch.on_sample)
    return clone, watch


def _floats(value: Any):
    from app.core.run.probe import float_tensors

    return float_tensors(value)
