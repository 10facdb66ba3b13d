"""The three nodes: HalfSafe Check, HalfSafe Fix and HalfSafe NaN Watch. Each takes ComfyUI's own
MODEL, never changes it (clones, then patches), and answers bad input with one sentence in its
output instead of an error that stops the queue."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from . import host

CATEGORY = "HalfSafe"
FIX_TYPE = "HALFSAFE_FIX"

log = logging.getLogger("halfsafe")


def _one_sentence(error: BaseException) -> str:
    import torch

    if isinstance(error, host.NodeProblem):
        return str(error)
    if isinstance(error, torch.OutOfMemoryError):
        return "The model no longer fits in memory for HalfSafe's check: free memory and queue it again."
    if isinstance(error, ImportError):
        return f"HalfSafe's core is not installed in ComfyUI's Python ({error}); install the node package's requirements."
    log.exception("HalfSafe node failed")
    return f"HalfSafe could not finish: {type(error).__name__}: {error}"


class HalfSafeCheck:
    CATEGORY = CATEGORY
    RETURN_TYPES = ("STRING", "IMAGE", FIX_TYPE)
    RETURN_NAMES = ("report", "report_image", "fix")
    FUNCTION = "check"
    OUTPUT_NODE = True
    DESCRIPTION = (
        "Runs one denoiser call (and, where connected, one VAE decode and one text encode) as "
        "this ComfyUI runs it, names the first layer that overflows fp16 and proves the "
        "cheapest fix against fp32."
    )

    @classmethod
    def INPUT_TYPES(cls):
        size = {"default": 512, "min": 64, "max": 8192, "step": 8}
        return {
            "required": {
                "model": ("MODEL",),
                "width": ("INT", size),
                "height": ("INT", size),
                "steps": ("INT", {"default": 20, "min": 1, "max": 1000}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF}),
            },
            "optional": {"clip": ("CLIP",), "vae": ("VAE",)},
        }

    def check(self, model, width, height, steps, seed, clip=None, vae=None):
        from . import checking, parts, report_image, store

        verdict, fix = None, None
        try:
            outcome = checking.check(model, width, height, steps, seed, clip)
            verdict, fix = outcome.verdict, outcome.fix
            size = (width, height, steps, seed)
            found = parts.check_parts(model, outcome, size, clip, vae, _one_sentence)
            verdict = found.verdict
            for part, part_fix in (
                ("vae", found.vae_fix),
                ("text_encoder", found.text_encoder_fix),
            ):
                if part_fix is not None:
                    fix = {**(fix or {"islands": {}, "component": None}), part: part_fix}
                    fix.setdefault("summary", part_fix["summary"])
            text = found.text
            if fix is not None:
                unsaid: list[str] = []
                store.remember(
                    model, fix, fix["summary"], fix.get("made_at") or {}, unsaid, vae, clip
                )
                *lines, summary = text.split("\n")  # the line of verdicts stays the last
                text = "\n".join([*lines, *unsaid, summary])
        except Exception as error:  # never stop the user's queue
            text = _one_sentence(error)
        finally:  # the fixes tried ran on clones: the MODEL passed in holds its own layers
            # again (a failure here is the next job's load's to report, as ComfyUI does it)
            with contextlib.suppress(Exception):
                host.put_back(model)
        image = report_image.render(text, verdict)
        return {"ui": {"text": [text]}, "result": (text, image, fix)}


class HalfSafeFix:
    CATEGORY = CATEGORY
    RETURN_TYPES = ("MODEL", "STRING", "VAE", "CLIP")
    RETURN_NAMES = ("model", "report", "vae", "clip")
    FUNCTION = "fix"
    DESCRIPTION = (
        "Applies HalfSafe's proved fix to a clone of the model (and of the VAE and the CLIP, "
        "where the fix has a part for them): the check's, or the one remembered for this model "
        "file on this device."
    )

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {"model": ("MODEL",)},
            "optional": {"fix": (FIX_TYPE,), "vae": ("VAE",), "clip": ("CLIP",)},
        }

    def fix(self, model, fix=None, vae=None, clip=None):
        from . import parts, store

        notes: list[str] = []
        try:
            host.diffusion_model(model)
            from_store = fix is None
            if fix is None:
                fix = store.remembered(model, notes, vae, clip)
            if not fix:
                said = "No fix to apply: the model is used as it is."
                return (model, " ".join(notes + [said]), vae, clip)
            from . import attention

            patched = model.clone()
            done = attention.apply_fix(patched, fix)
            said = f"HalfSafe Fix: {'; '.join(done)}."
            if from_store:
                said += f" The fix remembered for this model on this device: {fix['summary']}"
                for part, whose in (("vae", "this VAE"), ("text_encoder", "this CLIP")):
                    part_said = (fix.get(part) or {}).get("summary")
                    if part_said and part_said not in fix["summary"]:
                        said += f" The fix remembered for {whose}: {part_said}"
        except Exception as error:
            return (model, _one_sentence(error), vae, clip)
        # Each other part on its own: one that cannot be applied leaves the model's fix
        # applied and its own input as it came, and says why.
        fixed_vae, vae_said = _part(vae, fix.get("vae"), parts.fixed_vae, "VAE", "a VAE")
        fixed_clip, clip_said = _part(
            clip, fix.get("text_encoder"), parts.fixed_clip, "CLIP", "a text-encoder"
        )
        told = " ".join(s for s in (said, vae_said, clip_said, *notes) if s)
        return (patched, told, fixed_vae, fixed_clip)


def _part(given, part, apply, name: str, kind: str) -> tuple[Any, str]:
    """`given` (a VAE or a CLIP, or None) with the fix's `part` for it applied to a clone, and
    what was done, in a sentence: `given` itself where there is no part or it fails."""
    if not part:
        return given, ""
    if given is None:
        return given, f"The fix has {kind} part: connect the {name} to HalfSafe Fix to apply it."
    try:
        fixed, done = apply(given, part)
    except Exception as error:
        return given, f"The {name} is used as it is: {_one_sentence(error)}"
    return fixed, f"The {name}: {done}."


class HalfSafeNaNWatch:
    CATEGORY = CATEGORY
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "watch"
    DESCRIPTION = (
        "Watches every denoiser step on the device without a host sync per step; when one goes "
        "non-finite, names the step and the first bad layer in ComfyUI's log and, with repair "
        "on and no fix connected, samples that run again with a proved fix."
    )

    @classmethod
    def INPUT_TYPES(cls):
        repair = {
            "default": True,
            "tooltip": "When a run goes non-finite, sample it again with the fix remembered "
            "for this model, or one proved on the failing step against fp32.",
        }
        return {
            "required": {"model": ("MODEL",)},
            "optional": {"fix": (FIX_TYPE,), "repair": ("BOOLEAN", repair)},
        }

    def watch(self, model, fix=None, repair=True):
        from . import watch

        try:
            host.diffusion_model(model)
            clone, _ = watch.watched(model, fix, repair)
            return (clone,)
        except Exception as error:
            log.warning("%s", _one_sentence(error))
            return (model,)


NODE_CLASS_MAPPINGS = {
    "HalfSafeCheck": HalfSafeCheck,
    "HalfSafeFix": HalfSafeFix,
    "HalfSafeNaNWatch": HalfSafeNaNWatch,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "HalfSafeCheck": "HalfSafe Check",
    "HalfSafeFix": "HalfSafe Fix",
    "HalfSafeNaNWatch": "HalfSafe NaN Watch",
}
