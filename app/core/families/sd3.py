"""Stable Diffusion 3 and 3.5 (Large, Medium): CLIP-L, CLIP-G and T5, an MMDiT `transformer` on
2x2 patches of a 16-channel latent, flow matching with the CFG batch."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from app.core.detection import Detection
from app.core.encoders.clip import CLIP_PREFIX, clip_needs
from app.core.encoders.t5 import t5_need
from app.core.encoders.vaes import VAE
from app.core.families.base import (
    Family,
    FamilyId,
    FlowMatching,
    LatentFormat,
    input_channels_problem,
    patches_problem,
    prompt_tensors,
    transformer_width,
)
from app.core.formats.layouts import (
    Layout,
    Need,
    Row,
    Shapes,
    SplitModel,
    count_indices,
    fused,
    linear,
    listed,
    reader,
    swapped,
    within_limits,
)
from app.core.images.pictures import Mode

PROBE_SD3_CFG = 4.5  # the check's guidance for SD3.5 (its reference pipelines use 3.5 to 4.5)

# SD3.x's own 16-channel VAE; the preview fits its colours.
SD3_LATENT = LatentFormat(channels=16)


# Stability AI's MMDiT layout: SD3, SD3.5 Large and Medium ----------------------------------


# Where Stability AI's all-in-one SD3.x files keep their text encoders and VAE.
SD3_INSIDE = {
    "text_encoder": "text_encoders.clip_l.transformer.",
    "text_encoder_2": "text_encoders.clip_g.transformer.",
    "text_encoder_3": "text_encoders.t5xxl.transformer.",
    "vae": "first_stage_model.",  # as in every Stability AI checkpoint
}

_SD3_MARKERS = ("joint_blocks.0.x_block.attn.qkv.weight", "x_embedder.proj.weight")
SD3_HEAD = 64  # MMDiT's head width, stored only where queries and keys are normed


def _read_sd3(shapes: Shapes, prefix: str) -> SplitModel:
    w = reader(shapes, prefix)
    width, in_channels, patch, patch_w = w("x_embedder.proj.weight", 4)
    positions = w("pos_embed", 3)[1]
    side = math.isqrt(positions)
    if patch != patch_w or side * side != positions:
        raise ValueError(
            f"its patches ({patch}x{patch_w}) or position table ({positions}) are not square"
        )
    normed = prefix + "joint_blocks.0.x_block.attn.ln_q.weight" in shapes
    head = w("joint_blocks.0.x_block.attn.ln_q.weight", 1)[0] if normed else SD3_HEAD
    if head < 8 or width % head:
        raise ValueError(f"its blocks ({width} wide) do not split into {head}-wide heads")
    layers = count_indices(shapes, prefix + "joint_blocks.")
    dual = sorted(
        i for i in range(layers) if f"{prefix}joint_blocks.{i}.x_block.attn2.qkv.weight" in shapes
    )
    out = w("final_layer.linear.weight", 2)[0]
    text_width, caption = w("context_embedder.weight", 2)[1], w("context_embedder.weight", 2)[0]
    config = {
        "_class_name": "SD3Transformer2DModel",
        "sample_size": 128,  # 1024-pixel pictures; the position table covers larger ones
        "patch_size": patch,
        "in_channels": in_channels,
        "out_channels": out // (patch * patch),
        "num_layers": layers,
        "attention_head_dim": head,
        "num_attention_heads": width // head,
        "joint_attention_dim": text_width,
        "caption_projection_dim": caption,
        "pooled_projection_dim": w("y_embedder.mlp.0.weight", 2)[1],
        "pos_embed_max_size": side,
        "dual_attention_layers": dual,
        "qk_norm": "rms_norm" if normed else None,
    }
    within_limits(config)
    if dual:
        title, why = "SD3.5 Medium", f"{len(dual)} of them with a second attention (MMDiT-X)"
    elif normed:
        title, why = "SD3.5 Large", "RMS-normed queries and keys"
    else:
        title, why = "SD3 Medium", "no query/key norm"
    if dual and normed:
        why += " and RMS-normed queries and keys"
    inside = {c: p for c, p in SD3_INSIDE.items() if _holds(shapes, c, p)}
    carried = [
        words
        for component, words in (
            ("text_encoder", "CLIP-L"),
            ("text_encoder_2", "CLIP-G"),
            ("text_encoder_3", "T5"),
            ("vae", "VAE"),
        )
        if component in inside
    ]
    holds = (
        f", and the file carries its {listed(carried)} too (text_encoders, first_stage_model)"
        if carried
        else ""
    )
    pooled = config["pooled_projection_dim"]
    latent = config["in_channels"]
    return SplitModel(
        table=_sd3_table,
        layout="sd3",
        title=title,
        prefix=prefix,
        config=config,
        architecture="sd3",
        because=(
            f"{title}-shaped: an MMDiT in Stability AI's layout ({prefix}joint_blocks) with "
            f"{layers} joint blocks, {width} wide, {why}, taking {text_width}-wide T5 features "
            f"and a {pooled}-wide CLIP-L + CLIP-G vector, on {latent}-channel latents"
            f"{holds}; flow matching."
        ),
        needs=(
            *clip_needs(pooled, inside),
            t5_need("text_encoder_3", text_width, inside.get("text_encoder_3")),
            Need(
                "vae",
                VAE,
                f"its {latent}-channel SD3 VAE",
                lambda c: c == latent,
                ("sd3", "sd35"),
                inside.get("vae"),
            ),
        ),
        pipeline_class="StableDiffusion3Pipeline",
        configs="sd3",
        scheduler={},
        latent_channels=latent,
        pooled_from=("text_encoder", "text_encoder_2"),
    )


def _sd3_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Stability AI's MMDiT names <-> diffusers' SD3Transformer2DModel names. The last joint
    block's context side only feeds attention (no output projection or MLP), and its
    modulation, like the final layer's, is (shift, scale) where diffusers has (scale, shift)."""
    yield "pos_embed", ("pos_embed.pos_embed",), "same"
    yield from linear("x_embedder.proj", "pos_embed.proj")
    yield from linear("t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1")
    yield from linear("t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2")
    yield from linear("y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1")
    yield from linear("y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2")
    yield from linear("context_embedder", "context_embedder")
    normed = config["qk_norm"] is not None
    last = config["num_layers"] - 1
    for i in range(config["num_layers"]):
        b, d = f"joint_blocks.{i}.", f"transformer_blocks.{i}."
        x, c = b + "x_block.", b + "context_block."
        yield from linear(x + "adaLN_modulation.1", d + "norm1.linear")
        yield from fused(x + "attn.qkv", (d + "attn.to_q", d + "attn.to_k", d + "attn.to_v"))
        yield from linear(x + "attn.proj", d + "attn.to_out.0")
        yield from linear(x + "mlp.fc1", d + "ff.net.0.proj")
        yield from linear(x + "mlp.fc2", d + "ff.net.2")
        yield from fused(
            c + "attn.qkv", (d + "attn.add_q_proj", d + "attn.add_k_proj", d + "attn.add_v_proj")
        )
        if normed:
            yield x + "attn.ln_q.weight", (d + "attn.norm_q.weight",), "same"
            yield x + "attn.ln_k.weight", (d + "attn.norm_k.weight",), "same"
            yield c + "attn.ln_q.weight", (d + "attn.norm_added_q.weight",), "same"
            yield c + "attn.ln_k.weight", (d + "attn.norm_added_k.weight",), "same"
        if i in config["dual_attention_layers"]:
            yield from fused(
                x + "attn2.qkv", (d + "attn2.to_q", d + "attn2.to_k", d + "attn2.to_v")
            )
            yield from linear(x + "attn2.proj", d + "attn2.to_out.0")
            if normed:
                yield x + "attn2.ln_q.weight", (d + "attn2.norm_q.weight",), "same"
                yield x + "attn2.ln_k.weight", (d + "attn2.norm_k.weight",), "same"
        if i == last:
            yield from swapped(c + "adaLN_modulation.1", d + "norm1_context.linear")
        else:
            yield from linear(c + "adaLN_modulation.1", d + "norm1_context.linear")
            yield from linear(c + "attn.proj", d + "attn.to_add_out")
            yield from linear(c + "mlp.fc1", d + "ff_context.net.0.proj")
            yield from linear(c + "mlp.fc2", d + "ff_context.net.2")
    yield from linear("final_layer.linear", "proj_out")
    yield from swapped("final_layer.adaLN_modulation.1", "norm_out.linear")


def _holds(shapes: Shapes, component: str, prefix: str) -> bool:
    """Whether an SD3.x file holds `component` under `prefix`."""
    if component == "vae":
        return prefix + "decoder.conv_in.weight" in shapes
    if component == "text_encoder_3":
        return prefix + "shared.weight" in shapes
    return prefix + CLIP_PREFIX + "embeddings.token_embedding.weight" in shapes


LAYOUT = Layout("SD3-style transformer", _SD3_MARKERS, (), _read_sd3, _sd3_table)


@dataclass(frozen=True)
class SD3Family(FlowMatching, Family):
    """Stable Diffusion 3 / 3.5 (large and medium): CLIP-L and CLIP-G give token features side
    by side and a pooled vector each, T5-XXL the longer token sequence after them; an MMDiT
    `transformer` denoises 2x2 patches of a 16-channel latent by flow matching, with the CFG
    batch (negative first) as SD does."""

    id = FamilyId("sd3")
    file_markers = (("joint_blocks.", "a Stable Diffusion 3 model"),)
    title = "Stable Diffusion 3.x"
    architectures = {"sd3": "Stable Diffusion 3.x"}
    trainer_words = ((r"stable-diffusion-(v)?3|^sd-?3|^sd-v3", "sd3"),)
    latent = SD3_LATENT
    transformer_class = "SD3Transformer2DModel"
    layout = LAYOUT
    pipeline_class = "StableDiffusion3Pipeline"
    companion_names = {
        "text_encoder": "clip_l",
        "text_encoder_2": "clip_g",
        "text_encoder_3": "t5xxl",
        "vae": "sd3_vae",
    }
    picture_pipelines = {
        Mode.IMAGE: "StableDiffusion3Img2ImgPipeline",
        Mode.INPAINT: "StableDiffusion3InpaintPipeline",
    }

    def detect_folder(
        self,
        model_index: Mapping[str, Any],
        transformer: Mapping[str, Any],
        scheduler: Mapping[str, Any],
    ) -> Detection:
        layers = int(transformer.get("num_layers", 0))
        dual = transformer.get("dual_attention_layers") or ()
        normed = transformer.get("qk_norm") == "rms_norm"
        if dual:
            shape, why_shape = (
                "SD3.5 Medium",
                f"{len(dual)} of them with a second attention (MMDiT-X)",
            )
        elif normed:
            shape, why_shape = "SD3.5 Large", "RMS-normed queries and keys"
        else:
            shape, why_shape = "SD3 Medium", "no query/key norm"
        encoders = (
            "CLIP-L, CLIP-G and T5" if "text_encoder_3" in model_index else "CLIP-L and CLIP-G"
        )
        width = transformer_width(transformer)
        because = (
            f"{shape}-shaped: its StableDiffusion3Pipeline has an SD3Transformer2DModel (MMDiT) with "
            f"{layers} joint blocks, {width} wide, {why_shape}, on "
            f"{transformer.get('in_channels', 16)}-channel latents, and {encoders} text encoders; "
            "flow matching."
        )
        return Detection(
            "sd3",
            True,
            f"an {shape} pipeline",
            because,
            "flow",
            1024,
            None,
            "StableDiffusion3Pipeline",
        )

    denoiser: str = "transformer"
    sample_argument: str = "hidden_states"
    max_sequence_length: int = 256  # T5 tokens, the reference pipeline's default

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        embeds, negative_embeds, pooled, negative_pooled = pipe.encode_prompt(
            prompt=prompt,
            prompt_2=None,
            prompt_3=None,
            device=device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=guidance,
            negative_prompt=negative,
            max_sequence_length=self.max_sequence_length,
        )
        tensors = {
            "prompt_embeds": embeds,
            "negative_prompt_embeds": negative_embeds,
            "pooled_prompt_embeds": pooled,
            "negative_pooled_prompt_embeds": negative_pooled,
        }
        return {k: v for k, v in tensors.items() if v is not None}

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        clip_tokens = pipe.tokenizer_max_length
        first = pipe.text_encoder.config
        second = pipe.text_encoder_2.config
        hidden = prompt_tensors(tensors)
        pooled = [
            tensors[k]
            for k in ("pooled_prompt_embeds", "negative_pooled_prompt_embeds")
            if k in tensors
        ]
        wide, pooled_wide = first.hidden_size, first.projection_dim
        outputs = {
            "text_encoder": [h[:, :clip_tokens, :wide] for h in hidden]
            + [p[..., :pooled_wide] for p in pooled],
            "text_encoder_2": [h[:, :clip_tokens, wide : wide + second.hidden_size] for h in hidden]
            + [p[..., pooled_wide:] for p in pooled],
        }
        if getattr(pipe, "text_encoder_3", None) is not None:
            outputs["text_encoder_3"] = [h[:, clip_tokens:] for h in hidden]
        return outputs

    def denoiser_inputs(self, conditioning: dict[str, Any], size: int, device) -> dict[str, Any]:
        import torch

        return {
            "encoder_hidden_states": torch.cat(
                [conditioning["negative_prompt_embeds"], conditioning["prompt_embeds"]]
            ),
            "pooled_projections": torch.cat(
                [
                    conditioning["negative_pooled_prompt_embeds"],
                    conditioning["pooled_prompt_embeds"],
                ]
            ),
        }

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        return patches_problem(
            self, pipeline, width, height, int(pipeline.transformer.config.patch_size)
        )

    def probe_timesteps(self, model, steps: int, scheduler: str, size: int) -> list[float]:
        """The first, middle and last timestep of StableDiffusion3Pipeline's flow-matching
        schedule at the user's step count (shifted as its scheduler config says)."""
        schedule = self.make_scheduler(scheduler, model.pipeline, None)
        schedule.set_timesteps(max(2, steps))
        timesteps = [float(t) for t in schedule.timesteps]
        picked = {timesteps[0], timesteps[len(timesteps) // 2], timesteps[-1]}
        return sorted((round(t, 2) for t in picked), reverse=True)

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps` with the CFG batch; returns the
        latents (1, 16, h, w)."""
        import torch

        transformer = pipe.transformer
        side = size // self.latent_factor(pipe)
        generator = torch.Generator().manual_seed(0)
        channels = transformer.config.in_channels
        latents = torch.randn((1, channels, side, side), generator=generator).to(device)
        extra = self.denoiser_inputs(conditioning, size, device)
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            velocity = transformer(
                hidden_states=torch.cat([latents] * 2),
                timestep=torch.full([2], sigma * 1000.0, device=device),
                **extra,
            ).sample.float()
            uncond, cond = velocity.chunk(2)
            latents = latents + (following - sigma) * (uncond + PROBE_SD3_CFG * (cond - uncond))
        return latents

    def text_to_image_problem(self, pipeline) -> str | None:
        return input_channels_problem(pipeline, "latent_channels", 1)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        import torch

        factor = self.latent_factor(pipeline)
        shape = (1, pipeline.transformer.config.in_channels, height // factor, width // factor)
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        return torch.cat([torch.randn(shape, generator=g) for g in generators]), generators
