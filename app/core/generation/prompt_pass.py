"""The prompt's stage in a generation, beside `stages.JobStages.encode`: the prompt the text
encoders read (the prompt upsampler's caption where the job asks for one) and the device-side
flags of each text encoder going non-finite or saturating at fp16's limit."""

from __future__ import annotations

from typing import Any

from app.core.generation.records import UPSAMPLER_WORDS
from app.core.lora.files import strip_tags
from app.core.precision import PrecisionPlan


def written_prompt(stages, plan: PrecisionPlan) -> str:
    """The prompt the text encoders read: the user's, its <lora:...> tags stripped (they
    are not words), or where the model has a prompt upsampler and the job asks for it, the
    caption the upsampler writes from it, once a job, in its planned dtype (the user's
    prompt where it writes nothing)."""
    prompt = strip_tags(stages.request.prompt)
    if not (stages.request.upsample_prompt and "prompt_upsampler" in plan.dtypes):
        return prompt
    if not stages.upsampler_ran:
        stages.upsampler_ran = True
        out, _ = stages.stages.upsample(plan, prompt)  # as many tokens as its pipeline allows
        written = out["written"]
        if not written.finite:  # its caption is noise: the prompt as typed, and why
            dtype = plan.dtypes["prompt_upsampler"]
            stages.notes.append(UPSAMPLER_WORDS["non_finite"].format(dtype=dtype))
        elif written.text:
            stages.upsampled = str(written.text)
    return stages.upsampled or prompt


def encoder_flags(
    family, pipe, tensors: dict[str, Any], saturated: dict[str, list[Any]]
) -> dict[str, Any]:
    """Per text encoder, a device-side flag: did its part of the embeddings go non-finite,
    or did one of its blocks saturate at fp16's limit (T5 clamps an overflow there)."""
    import torch

    flags = {}
    for name, parts in family.encoder_outputs(pipe, tensors).items():
        checks = [~torch.isfinite(p).all() for p in parts] + saturated.get(name, [])
        flags[name] = torch.stack(checks).any()
    return flags


def saturation_hook(saturated: dict[str, list[Any]], name: str):
    """A forward hook that keeps, on the device, whether a block's fp16 output reached the
    clamp (no host sync)."""
    from app.core.components import FP16_MAX

    def hook(module, args, output):
        import torch

        hidden = output[0] if isinstance(output, tuple) else output
        if isinstance(hidden, torch.Tensor) and hidden.dtype == torch.float16:
            saturated.setdefault(name, []).append((hidden.abs() >= FP16_MAX - 1000).any())

    return hook
