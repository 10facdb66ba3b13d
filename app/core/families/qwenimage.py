"""Qwen-Image: a Qwen2.5-VL text encoder, an MMDiT `transformer` with real CFG, a causal 3D VAE
(Wan 2.1's layout) with per-channel latent statistics."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from app.core.detection import Detection, pipeline_part_class
from app.core.families.base import (
    Family,
    FamilyId,
    LatentFormat,
    ShiftedSigmas,
    input_channels_problem,
    packed_noise,
    patches_problem,
    prompt_tensors,
    transformer_width,
)
from app.core.layouts import (
    Layout,
    Need,
    Row,
    Shapes,
    SplitModel,
    count_indices,
    linear,
    reader,
    within_limits,
)
from app.core.pictures import Mode

PROBE_QWEN_CFG = 4.0  # the check's guidance for Qwen-Image (QwenImagePipeline's default)

# The Wan 2.1-layout VAE: 16 channels, normalised per channel; the preview fits its colours.
QWENIMAGE_LATENT = LatentFormat(channels=16)


# Qwen-Image (ComfyUI: diffusion_models/qwen_image_bf16.safetensors, in diffusers' names) ---


_QWENIMAGE_MARKERS = ("transformer_blocks.0.img_mod.1.weight", "txt_norm.weight", "img_in.weight")


def _read_qwenimage(shapes: Shapes, prefix: str) -> SplitModel:
    w = reader(shapes, prefix)
    inner, in_channels = w("img_in.weight", 2)
    head = w("transformer_blocks.0.attn.norm_q.weight", 1)[0]
    if head < 16 or inner % head or head % 16 or in_channels % 4:
        raise ValueError(f"its blocks ({inner} wide, {head}-wide heads) are not Qwen-Image's")
    config = {
        "_class_name": "QwenImageTransformer2DModel",
        "patch_size": 2,
        "in_channels": in_channels,
        "out_channels": w("proj_out.weight", 2)[0] // 4,
        "num_layers": count_indices(shapes, prefix + "transformer_blocks."),
        "attention_head_dim": head,
        "num_attention_heads": inner // head,
        "joint_attention_dim": w("txt_norm.weight", 1)[0],
        "guidance_embeds": False,
        # Rotary axes (frame, height, width) in Qwen-Image's proportions: 16, 56, 56 of 128.
        "axes_dims_rope": [head // 8, 7 * head // 16, 7 * head // 16],
    }
    within_limits(config)
    latent = in_channels // 4
    text_width = config["joint_attention_dim"]
    return SplitModel(
        table=_qwenimage_table,
        layout="qwenimage",
        title="Qwen-Image",
        prefix=prefix,
        config=config,
        architecture="qwenimage",
        because=(
            f"Qwen-Image: an MMDiT transformer file in diffusers' names ({prefix}"
            f"transformer_blocks with img_mod, txt_norm) with {config['num_layers']} blocks, "
            f"{inner} wide, on {latent}-channel latents in 2x2 patches, reading "
            f"{text_width}-wide Qwen2.5-VL hidden states; flow matching with real CFG."
        ),
        needs=(
            Need(
                "text_encoder",
                "qwen25_vl",
                "its Qwen2.5-VL text encoder (qwen_2.5_vl_7b)",
                lambda width: width == text_width,
                ("qwen_2.5", "qwen2.5", "qwen25"),
            ),
            Need(
                "vae",
                "wan_vae",
                "its VAE (qwen_image_vae)",
                lambda c: c == latent,
                ("qwen_image", "qwen"),
            ),
        ),
        pipeline_class="QwenImagePipeline",
        # Flux.1's flow-matching schedule reshaped as Qwen-Image's: an exponential,
        # resolution-dependent shift ending at sigma 0.02. Its VAE's config comes from shapes.
        configs="flux",
        scheduler={
            "shift": 1.0,
            "max_shift": 0.9,
            "max_image_seq_len": 8192,
            "shift_terminal": 0.02,
            "time_shift_type": "exponential",
        },
        native_size=1328,
        latent_channels=latent,
    )


def _qwenimage_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Qwen-Image's files keep diffusers' QwenImageTransformer2DModel names: every row is the
    key itself."""
    names = [
        "time_text_embed.timestep_embedder.linear_1",
        "time_text_embed.timestep_embedder.linear_2",
    ]
    names += ["img_in", "txt_in", "norm_out.linear", "proj_out"]
    yield "txt_norm.weight", ("txt_norm.weight",), "same"
    for i in range(config["num_layers"]):
        b = f"transformer_blocks.{i}."
        for norm in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            yield f"{b}attn.{norm}.weight", (f"{b}attn.{norm}.weight",), "same"
        names += [
            b + name
            for name in (
                "img_mod.1",
                "txt_mod.1",
                "attn.to_q",
                "attn.to_k",
                "attn.to_v",
                "attn.add_q_proj",
                "attn.add_k_proj",
                "attn.add_v_proj",
                "attn.to_out.0",
                "attn.to_add_out",
                "img_mlp.net.0.proj",
                "img_mlp.net.2",
                "txt_mlp.net.0.proj",
                "txt_mlp.net.2",
            )
        ]
    for name in names:
        yield from linear(name, name)


LAYOUT = Layout(
    "Qwen-Image-style transformer", _QWENIMAGE_MARKERS, (), _read_qwenimage, _qwenimage_table
)


@dataclass(frozen=True)
class QwenImageFamily(ShiftedSigmas, Family):
    """Qwen-Image: a Qwen2.5-VL text encoder whose last hidden states (the prompt's tokens
    after its system instruction) condition an MMDiT `transformer` on packed 2x2 patches of a
    16-channel latent, by flow matching with real CFG (a second call on the negative prompt,
    its result rescaled to the prompt's norm); a causal 3D VAE (one frame per image) with a
    per-channel latent mean and spread."""

    id = FamilyId.QWENIMAGE
    title = "Qwen-Image"
    architectures = {"qwenimage": "Qwen-Image"}
    latent = QWENIMAGE_LATENT
    transformer_class = "QwenImageTransformer2DModel"
    layout = LAYOUT
    pipeline_class = "QwenImagePipeline"
    companion_names = {"text_encoder": "qwen_2.5_vl_7b", "vae": "qwen_image_vae"}
    picture_pipelines = {
        Mode.IMAGE: "QwenImageImg2ImgPipeline",
        Mode.INPAINT: "QwenImageInpaintPipeline",
    }

    def detect_folder(
        self, model_index: Mapping[str, Any], transformer: Mapping[str, Any]
    ) -> Detection:
        width = transformer_width(transformer)
        because = (
            f"Qwen-Image: its QwenImagePipeline has a QwenImageTransformer2DModel (MMDiT) with "
            f"{transformer.get('num_layers')} blocks, {width} wide, on "
            f"{int(transformer.get('in_channels', 64)) // 4}-channel latents in 2x2 patches, a "
            f"Qwen2.5-VL text encoder ({pipeline_part_class(model_index, 'text_encoder')}) and a 3D VAE; flow matching "
            "with real CFG."
        )
        return Detection(
            "qwenimage",
            True,
            "a Qwen-Image pipeline",
            because,
            "flow",
            1328,
            None,
            "QwenImagePipeline",
        )

    denoiser: str = "transformer"
    sample_argument: str = "hidden_states"
    max_sequence_length: int = 512  # the reference pipeline's default

    def latent_factor(self, pipeline) -> int:
        return 2 ** len(pipeline.vae.temperal_downsample)

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        tensors: dict[str, Any] = {}
        texts = [("", prompt)] + ([("negative_", negative)] if guidance else [])
        for prefix, text in texts:
            embeds, mask = pipe.encode_prompt(
                prompt=text,
                device=device,
                num_images_per_prompt=1,
                max_sequence_length=self.max_sequence_length,
            )
            tensors[prefix + "prompt_embeds"] = embeds
            if mask is not None:  # None: every token counts
                tensors[prefix + "prompt_embeds_mask"] = mask
        return tensors

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        return {"text_encoder": prompt_tensors(tensors)}

    def pipeline_embeds(self, embeds: dict[str, Any], batch: int) -> dict[str, Any]:
        # QwenImagePipeline keeps its latents in the embeddings' dtype: fp32 keeps the sampler's
        # latents in fp32 whatever the text encoder ran in (the transformer casts its inputs).
        import torch

        repeated = super().pipeline_embeds(embeds, batch)
        return {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in repeated.items()}

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps`, each a call on the prompt and one
        on the empty negative prompt combined by CFG and rescaled to the prompt's norm, as
        QwenImagePipeline runs them; returns the latents (1, 16, h, w)."""
        import torch
        from diffusers import QwenImagePipeline

        transformer = pipe.transformer
        side = size // self.latent_factor(pipe)
        channels = transformer.config.in_channels // 4
        generator = torch.Generator().manual_seed(0)
        noise = torch.randn((1, channels, side, side), generator=generator)
        latents = QwenImagePipeline._pack_latents(noise, 1, channels, side, side).to(device)
        shapes = [[(1, side // 2, side // 2)]]
        calls = [
            {
                "encoder_hidden_states": conditioning[prefix + "prompt_embeds"],
                "encoder_hidden_states_mask": conditioning.get(prefix + "prompt_embeds_mask"),
            }
            for prefix in ("", "negative_")
        ]
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            t = torch.full([1], sigma, device=device)
            cond, uncond = (
                transformer(
                    hidden_states=latents, timestep=t, img_shapes=shapes, **call, return_dict=False
                )[0].float()
                for call in calls
            )
            combined = uncond + PROBE_QWEN_CFG * (cond - uncond)
            scale = cond.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True)
            latents = latents + (following - sigma) * (combined * scale)
        return self.image_latents(pipe, latents, size, size)

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        return patches_problem(self, pipeline, width, height)

    def text_to_image_problem(self, pipeline) -> str | None:
        return input_channels_problem(pipeline, "z_dim", 4)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        from diffusers import QwenImagePipeline

        # The 3D VAE's latents carry a frame axis of one.
        return packed_noise(
            self, pipeline, QwenImagePipeline._pack_latents, (1,), seeds, height, width
        )

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        return {"true_cfg_scale": cfg}  # real CFG when a negative prompt is given (cfg > 1)

    def image_latents(self, pipeline, latents, height: int, width: int):
        from diffusers import QwenImagePipeline

        factor = self.latent_factor(pipeline)
        frames = QwenImagePipeline._unpack_latents(latents, height, width, factor)
        return frames[:, :, 0]  # (B, C, h, w): the one frame

    def clamped_blocks(self, denoiser) -> list[Any]:
        # diffusers clips each block's fp16 image and text streams to +-65504.
        return list(denoiser.transformer_blocks)

    def decode(self, vae, latents):
        """Undo the per-channel normalisation and decode the one frame."""
        import torch

        channels = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, device=latents.device).view(1, channels, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=latents.device).view(1, channels, 1, 1)
        z = (latents.float() * std + mean).unsqueeze(2)
        return vae.decode(z.to(vae.dtype)).sample[:, :, 0]

    def encode_pixels(self, vae, pixels):
        """The picture as one frame through the causal 3D VAE's encoder, normalised per
        channel as `decode` undoes it."""
        import torch

        z = vae.encode(pixels.to(vae.dtype).unsqueeze(2)).latent_dist.mode()[:, :, 0]
        channels = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, device=z.device).view(1, channels, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=z.device).view(1, channels, 1, 1)
        return (z.float() - mean) / std
