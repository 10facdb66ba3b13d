"""What the families whose text encoder is a Qwen vision-language model share about prompts
(Qwen-Image's Qwen2.5-VL, Qwen-Image 2.1's and Krea 2's Qwen3-VL): their diffusers pipeline
encodes a prompt itself, in the model's chat template, into its hidden states and a mask of the
tokens that count; the check and the NaN watch read those two tensors, the prompt's and the
negative prompt's; and the pipeline keeps its latents in the embeddings' dtype, so the
embeddings go to it in fp32 (the transformer casts its inputs) whatever the encoder ran in."""

from __future__ import annotations

from typing import Any

from app.core.families.base import prompt_tensors


class PipelinePrompts:
    """A family mixin (listed before `Family`): `encode`, `encoder_outputs` and
    `pipeline_embeds` from one `prompt_embeds` the family says."""

    def prompt_embeds(self, pipe, text: str, device) -> tuple[Any, Any]:
        """(hidden states, mask or None: every token counts) of one prompt, as the family's
        pipeline encodes it."""
        raise NotImplementedError

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        tensors: dict[str, Any] = {}
        texts = [("", prompt)] + ([("negative_", negative)] if guidance else [])
        for prefix, text in texts:
            embeds, mask = self.prompt_embeds(pipe, text, device)
            tensors[prefix + "prompt_embeds"] = embeds
            if mask is not None:
                tensors[prefix + "prompt_embeds_mask"] = mask
        return tensors

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        return {"text_encoder": prompt_tensors(tensors)}

    def pipeline_embeds(self, embeds: dict[str, Any], batch: int) -> dict[str, Any]:
        import torch

        repeated = super().pipeline_embeds(embeds, batch)  # type: ignore[misc]
        return {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in repeated.items()}
