"""Model families as data plus the few steps that differ between them.

A family says which components a pipeline has (by role, see `components.py`), how to encode a
prompt into the named tensors its denoiser takes, which of those tensors come from which text
encoder (so the NaN watch can blame the right one), and how to make the denoiser's extra inputs
for the check's probe. The health check and generation loop over a family's components and call
these steps; neither names an architecture. A new family (a DiT with a `transformer`, other
text encoders) is one more class here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.components import Role, of_role


@dataclass(frozen=True)
class Family:
    """Stable Diffusion 1.x/2.x: one CLIP text encoder, a UNet, a VAE."""

    name: str = "sd"

    def components(self, pipeline) -> list[str]:
        """The pipeline's checkable components, in run order."""
        from app.core.precision import pipeline_components

        return pipeline_components(pipeline)

    def text_encoders(self, pipeline) -> list[str]:
        return of_role(self.components(pipeline), Role.TEXT_ENCODER)

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        """The prompt as the pipeline's `__call__` takes it: prompt_embeds and, with guidance,
        negative_prompt_embeds (batch 1 each), read as AUTOMATIC1111 reads it (emphasis, BREAK,
        77-token chunks: `app.core.prompts`)."""
        from app.core.prompts import encode_sd

        return encode_sd(pipe, prompt, negative, device, guidance)

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        """Which parts of the encoded tensors each text encoder produced."""
        return {"text_encoder": _hidden(tensors)}

    def denoiser_inputs(self, conditioning: dict[str, Any], size: int, device) -> dict[str, Any]:
        """Keyword arguments of one UNet call on the CFG batch (negative first), beyond the
        latents and the timestep."""
        import torch

        text = torch.cat([conditioning["negative_prompt_embeds"], conditioning["prompt_embeds"]])
        return {"encoder_hidden_states": text}


@dataclass(frozen=True)
class SDXLFamily(Family):
    """SDXL: two CLIP text encoders whose hidden states lie side by side, pooled embeddings from
    the second, and size conditioning for the UNet."""

    name: str = "sdxl"

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        from app.core.prompts import encode_sdxl

        return encode_sdxl(pipe, prompt, negative, device, guidance)

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        hidden = _hidden(tensors)
        first = getattr(pipe, "text_encoder", None)
        split = first.config.hidden_size if first is not None else 0
        pooled = [
            tensors[k]
            for k in ("pooled_prompt_embeds", "negative_pooled_prompt_embeds")
            if k in tensors
        ]
        outputs = {"text_encoder": [h[..., :split] for h in hidden]} if split else {}
        outputs["text_encoder_2"] = [h[..., split:] for h in hidden] + pooled
        return outputs  # in run order: a failure is blamed on the first encoder that failed

    def denoiser_inputs(self, conditioning: dict[str, Any], size: int, device) -> dict[str, Any]:
        import torch

        inputs = super().denoiser_inputs(conditioning, size, device)
        time_ids = torch.tensor(
            [[size, size, 0, 0, size, size]] * 2, device=device, dtype=torch.float32
        )
        pooled = torch.cat(
            [conditioning["negative_pooled_prompt_embeds"], conditioning["pooled_prompt_embeds"]]
        )
        inputs["added_cond_kwargs"] = {"text_embeds": pooled, "time_ids": time_ids}
        return inputs


def _hidden(tensors: dict[str, Any]) -> list[Any]:
    return [tensors[k] for k in ("prompt_embeds", "negative_prompt_embeds") if k in tensors]


def family_of(pipeline) -> Family:
    """The family a loaded pipeline belongs to, from the components it has."""
    if getattr(pipeline, "text_encoder_2", None) is not None:
        return SDXLFamily()
    return Family()
