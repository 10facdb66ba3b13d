"""Anima: a Qwen3 0.6B text encoder, an LLM adapter (the `text_conditioner`) that turns its
states and the prompt's T5 token ids into what the transformer reads, Cosmos-Predict2's 2B DiT
(`CosmosTransformer3DModel`), Qwen-Image's VAE. diffusers runs it as a modular pipeline only:
HalfSafe runs diffusers' blocks through a small adapter (`anima_pipeline.AnimaPipeline`)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core import limits
from app.core.detection import Detection, pipeline_part_class
from app.core.encoders.qwen3 import QWEN3
from app.core.encoders.vaes import WAN_VAE
from app.core.families.base import (
    Family,
    FamilyId,
    FlowMatching,
    input_channels_problem,
    patches_problem,
    transformer_width,
)
from app.core.families.qwenimage import QWENIMAGE_LATENT
from app.core.families.variants import PublishedVariant
from app.core.formats.layouts import (
    InnerPart,
    Layout,
    Need,
    Row,
    Shapes,
    SplitModel,
    bounded,
    count_indices,
    reader,
    within_limits,
)
from app.core.images.pictures import Mode

# The check's guidance: the middle of Anima's recommended CFG scale of 4-5.
PROBE_ANIMA_CFG = 4.0
# Qwen3 and T5 tokens a prompt is read to (AnimaTextEncoderStep's default).
MAX_SEQUENCE_LENGTH = 512


# Cosmos-Predict2's original layout, as Anima's file keeps it (ComfyUI:
# diffusion_models/anima*.safetensors), with the LLM adapter beside it (llm_adapter.*) ----------

_ANIMA_MARKERS = (
    "x_embedder.proj.1.weight",
    "blocks.0.self_attn.q_proj.weight",
    "blocks.0.adaln_modulation_cross_attn.1.weight",
)
# Cosmos-Predict2 2B's settings that no tensor records (its released config): rotary tables
# for up to 128 frames and 240 latent cells a side, the image axes' rotary scale.
ANIMA_MAX_SIZE = (128, 240, 240)
ANIMA_ROPE_SCALE = (1.0, 4.0, 4.0)
# Its patches: one frame, 2x2 latent cells (the file records only their product).
ANIMA_PATCH = (1, 2, 2)
# The LLM adapter's prefix after the transformer's, and what its tensors do not record.
ADAPTER = "llm_adapter."
ADAPTER_MIN_TOKENS = 512  # the conditioning is padded to 512 tokens


def _read_adapter(shapes: Shapes, prefix: str) -> dict[str, Any] | None:
    """The AnimaTextConditioner config of the file's LLM adapter (None: the file has none)."""
    if prefix + ADAPTER + "embed.weight" not in shapes:
        return None
    w = reader(shapes, prefix + ADAPTER)
    vocab, target = w("embed.weight", 2)
    model, source = w("blocks.0.cross_attn.k_proj.weight", 2)
    head = w("blocks.0.cross_attn.q_norm.weight", 1)[0]
    hidden = w("blocks.0.mlp.0.weight", 2)[0]
    if head < 8 or model % head:
        raise ValueError(f"its LLM adapter ({model} wide, {head}-wide heads) is not Anima's")
    layers = count_indices(shapes, prefix + ADAPTER + "blocks.")
    bounded(
        ("number of LLM adapter blocks", layers, limits.MAX_TRANSFORMER_DEPTH),
        ("LLM adapter width", model, limits.MAX_TRANSFORMER_WIDTH),
        ("LLM adapter vocabulary", vocab, limits.MAX_VOCAB),
    )
    return {
        "source_dim": source,
        "target_dim": target,
        "model_dim": model,
        "num_layers": layers,
        "num_attention_heads": model // head,
        "mlp_ratio": hidden / model,
        "target_vocab_size": vocab,
        "use_self_attention": prefix + ADAPTER + "blocks.0.self_attn.q_proj.weight" in shapes,
        "use_layer_norm": prefix + ADAPTER + "blocks.0.norm_mlp.bias" in shapes,
        "min_sequence_length": ADAPTER_MIN_TOKENS,
    }


def _read_anima(shapes: Shapes, prefix: str) -> SplitModel:
    w = reader(shapes, prefix)
    width, patch_values = w("x_embedder.proj.1.weight", 2)
    head = w("blocks.0.self_attn.q_norm.weight", 1)[0]
    patch = ANIMA_PATCH[0] * ANIMA_PATCH[1] * ANIMA_PATCH[2]
    if head < 8 or width % head or patch_values % patch:
        raise ValueError(f"its blocks ({width} wide, {head}-wide heads) are not Cosmos's")
    if any(key.startswith(prefix + "extra_pos_embedder.") for key in shapes):
        raise ValueError("it has learnable position embeddings, which Anima's Cosmos has not")
    latent = patch_values // patch - 1  # the last input channel is the padding mask
    layers = count_indices(shapes, prefix + "blocks.")
    text = w("blocks.0.cross_attn.k_proj.weight", 2)[1]
    bounded(
        ("number of blocks", layers, limits.MAX_TRANSFORMER_DEPTH),
        ("width", width, limits.MAX_TRANSFORMER_WIDTH),
        ("number of attention heads", width // head, limits.MAX_HEADS),
        ("number of latent channels", latent, limits.MAX_IMAGE_CHANNELS),
    )
    config = {
        "_class_name": "CosmosTransformer3DModel",
        "in_channels": latent,
        "out_channels": w("final_layer.linear.weight", 2)[0] // patch,
        "num_attention_heads": width // head,
        "attention_head_dim": head,
        "num_layers": layers,
        "mlp_ratio": w("blocks.0.mlp.layer1.weight", 2)[0] / width,
        "text_embed_dim": text,
        "adaln_lora_dim": w("blocks.0.adaln_modulation_self_attn.1.weight", 2)[0],
        "max_size": list(ANIMA_MAX_SIZE),
        "patch_size": list(ANIMA_PATCH),
        "rope_scale": list(ANIMA_ROPE_SCALE),
        # HalfSafe runs it without the padding-mask channel (always zero in Anima's blocks:
        # `anima_pipeline.without_padding_channel`); the table drops its columns.
        "concat_padding_mask": False,
        "extra_pos_embed_type": None,
    }
    within_limits(config)
    adapter = _read_adapter(shapes, prefix)
    source = adapter["source_dim"] if adapter else None
    if adapter is not None and adapter["target_dim"] != text:
        raise ValueError(
            f"its LLM adapter gives {adapter['target_dim']}-wide text where its blocks read {text}"
        )
    return SplitModel(
        table=_anima_table,
        layout="anima",
        title="Anima",
        prefix=prefix,
        config=config,
        architecture="anima",
        because=(
            f"Anima: a Cosmos DiT in its original layout ({prefix}blocks, x_embedder, "
            f"t_embedder, final_layer) with {layers} blocks, {width} wide, on {latent}-channel "
            f"latents in 2x2 patches, and its LLM adapter ({prefix}{ADAPTER}) reading "
            f"{source}-wide Qwen3 hidden states; flow matching with CFG."
        ),
        needs=(
            Need(
                "text_encoder",
                QWEN3,
                "its Qwen3 text encoder (qwen_3_06b)",
                lambda found: source is None or found == source,
                ("qwen_3_06b", "qwen3_06b", "qwen_3", "qwen3"),
            ),
            Need(
                "vae",
                WAN_VAE,
                "its VAE (qwen_image_vae)",
                lambda c: c == latent,
                ("qwen_image", "qwen"),
            ),
        ),
        pipeline_class="AnimaModularPipeline",
        # A flow-matching Euler with a fixed shift of 3, as ComfyUI samples Anima.
        configs="flux",
        scheduler={"shift": 3.0, "use_dynamic_shifting": False},
        latent_channels=latent,
        unsupported=(
            None
            if adapter is not None
            else "this Cosmos transformer has no LLM adapter (llm_adapter.*): it is not an "
            "Anima model, and HalfSafe runs Cosmos only as Anima"
        ),
        inner=(
            (InnerPart("text_conditioner", prefix + ADAPTER, "AnimaTextConditioner", adapter),)
            if adapter is not None
            else ()
        ),
    )


def _anima_block(i: int) -> Iterator[Row]:
    original, diffusers = f"blocks.{i}.", f"transformer_blocks.{i}."
    for stage, norm in (("self_attn", "norm1"), ("cross_attn", "norm2"), ("mlp", "norm3")):
        for index, linear in ((1, "linear_1"), (2, "linear_2")):
            yield (
                f"{original}adaln_modulation_{stage}.{index}.weight",
                (f"{diffusers}{norm}.{linear}.weight",),
                "same",
            )
    for stage, attention in (("self_attn", "attn1"), ("cross_attn", "attn2")):
        for mine, theirs in (
            ("q_proj", "to_q"),
            ("k_proj", "to_k"),
            ("v_proj", "to_v"),
            ("output_proj", "to_out.0"),
            ("q_norm", "norm_q"),
            ("k_norm", "norm_k"),
        ):
            yield (
                f"{original}{stage}.{mine}.weight",
                (f"{diffusers}{attention}.{theirs}.weight",),
                "same",
            )
    yield f"{original}mlp.layer1.weight", (f"{diffusers}ff.net.0.proj.weight",), "same"
    yield f"{original}mlp.layer2.weight", (f"{diffusers}ff.net.2.weight",), "same"


def _anima_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Cosmos-Predict2's original names <-> diffusers' CosmosTransformer3DModel names (as
    diffusers' own Cosmos converter renames them; every linear without bias): the patch
    embedder's padding-mask columns dropped, the timestep embedder and its norm, each block's
    three modulations, attentions and MLP, the final layer."""
    patch = math.prod(config["patch_size"])
    yield "x_embedder.proj.1.weight", ("patch_embed.proj.weight",), f"pad:{patch}"
    for linear in ("linear_1", "linear_2"):
        yield (
            f"t_embedder.1.{linear}.weight",
            (f"time_embed.t_embedder.{linear}.weight",),
            "same",
        )
    yield "t_embedding_norm.weight", ("time_embed.norm.weight",), "same"
    for i in range(config["num_layers"]):
        yield from _anima_block(i)
    for index, linear in ((1, "linear_1"), (2, "linear_2")):
        yield (
            f"final_layer.adaln_modulation.{index}.weight",
            (f"norm_out.{linear}.weight",),
            "same",
        )
    yield "final_layer.linear.weight", ("proj_out.weight",), "same"


# Cosmos's training saves keep the transformer under "net." (ComfyUI reads them so).
LAYOUT = Layout(
    "Cosmos-style transformer",
    _ANIMA_MARKERS,
    (),
    _read_anima,
    _anima_table,
    own_prefixes=("net.",),
)


@dataclass(frozen=True)
class AnimaFamily(FlowMatching, Family):
    """Anima: the prompt's Qwen3 last hidden states (its real tokens, no chat format) and its
    T5 token ids (no T5 model: the ids index the text conditioner's own embedding) go through
    the text conditioner, a small cross-attending transformer run once per prompt; what it gives
    (padded to 512 tokens) conditions the Cosmos DiT, which denoises Qwen-Image's 16-channel
    latents (one frame) in 2x2 patches by flow matching with real CFG. Its sigmas are linear
    from 1 to 1/steps, shifted by its scheduler's fixed shift."""

    id = FamilyId("anima")
    title = "Anima"
    architectures = {"anima": "Anima"}
    trainer_words = ((r"(^|-)anima($|-)", "anima"),)
    latent = QWENIMAGE_LATENT
    transformer_class = "CosmosTransformer3DModel"
    layout = LAYOUT
    pipeline_class = "AnimaModularPipeline"
    companion_names = {"text_encoder": "qwen_3_06b", "vae": "qwen_image_vae"}
    # Anima 2B is Cosmos-Predict2 2B's 28 blocks; Anima 2.9B the same blocks, 40 of them.
    variants = (
        PublishedVariant("Anima 2B", "num_layers", 28, "blocks"),
        PublishedVariant("Anima 2.9B", "num_layers", 40, "blocks"),
    )
    # diffusers' Anima image-to-image blocks, which `AnimaPipeline` runs given a picture.
    picture_pipelines = {Mode.IMAGE: "AnimaModularPipeline"}

    denoiser: str = "transformer"
    sample_argument: str = "hidden_states"

    def owns(self, pipeline) -> bool:
        # Cosmos-Predict2's own pipelines share the transformer; Anima's has the conditioner.
        return super().owns(pipeline) and getattr(pipeline, "text_conditioner", None) is not None

    def detect_folder(
        self,
        model_index: Mapping[str, Any],
        transformer: Mapping[str, Any],
        scheduler: Mapping[str, Any],
    ) -> Detection:
        width = transformer_width(transformer)
        because = (
            f"Anima: its {self.pipeline_class} has a Cosmos DiT (CosmosTransformer3DModel) with "
            f"{transformer.get('num_layers')} blocks, {width} wide, on "
            f"{transformer.get('in_channels', 16)}-channel latents in 2x2 patches, reading "
            f"{transformer.get('text_embed_dim')}-wide text from a text conditioner "
            f"({pipeline_part_class(model_index, 'text_conditioner')}) over a Qwen3 text encoder "
            f"({pipeline_part_class(model_index, 'text_encoder')}); flow matching with CFG."
        )
        return Detection(
            "anima", True, "an Anima pipeline", because, "flow", 1024, None, self.pipeline_class
        )

    def load_folder(
        self, folder: Path, components: Mapping[str, Any], dtypes: Mapping[str, Any]
    ) -> Any:
        """diffusers loads Anima only as a modular pipeline: its parts are built one by one
        and put in HalfSafe's AnimaPipeline (`anima_folder.load`)."""
        from app.core.families.anima_folder import load

        return load(folder, components, dtypes)

    def pipeline_from_parts(self, components: dict[str, Any]) -> Any:
        """Anima's parts from its transformer file (the LLM adapter as the text conditioner)
        and companions, with the T5 tokenizer HalfSafe ships, in HalfSafe's AnimaPipeline."""
        from app.core.encoders.tokenizers import t5_tokenizer
        from app.core.families.anima_pipeline import AnimaPipeline

        return AnimaPipeline(**components, t5_tokenizer=t5_tokenizer())

    def latent_factor(self, pipeline) -> int:
        return 2 ** len(pipeline.vae.temperal_downsample)

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        """The prompt through the text encoder and the text conditioner (diffusers' steps):
        `prompt_embeds` as the transformer reads them, `qwen_prompt_embeds` as the text encoder
        made them (the negative prompt's under `negative_`, with `guidance`)."""
        return pipe.encode_prompt(prompt, negative, device, guidance, MAX_SEQUENCE_LENGTH)

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        return {
            "text_encoder": [t for k, t in tensors.items() if k.endswith("qwen_prompt_embeds")],
            "text_conditioner": [
                tensors[k] for k in ("prompt_embeds", "negative_prompt_embeds") if k in tensors
            ],
        }

    def pipeline_embeds(self, embeds: dict[str, Any], batch: int) -> dict[str, Any]:
        # The pipeline takes the conditioner's output; the text encoder's was read from it.
        conditioned = {k: v for k, v in embeds.items() if "qwen" not in k}
        return super().pipeline_embeds(conditioned, batch)

    def _sigmas(self, pipeline, steps: int) -> list[float]:
        """The sigmas Anima's blocks run: linear from 1 to 1/steps, shifted by the
        scheduler."""
        import numpy as np

        scheduler = self.make_scheduler("euler", pipeline, None)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps).tolist())
        return [float(s) for s in scheduler.sigmas[:-1]]

    def probe_timesteps(self, model, steps: int, scheduler: str, size: int) -> list[float]:
        """The first, middle and last timestep (sigma x 1000) of the schedule Anima's blocks
        run at the user's step count (its shift is fixed: the same at every size)."""
        sigmas = self._sigmas(model.pipeline, max(2, steps))
        picked = {sigmas[0], sigmas[len(sigmas) // 2], sigmas[-1]}
        return sorted((round(s * 1000.0, 2) for s in picked), reverse=True)

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """diffusers' Anima denoising blocks through `timesteps`, from seeded noise, with CFG
        on the prompt and the empty negative prompt (both conditionings are checked); the
        sigmas are given as they are (a copy of the scheduler shifted by 1), so the blocks step
        exactly through them, Euler to 0 after the last. Returns the latents (1, 16, h, w)."""
        import torch

        side = size // self.latent_factor(pipe)
        channels = pipe.transformer.config.in_channels
        generator = torch.Generator().manual_seed(0)
        noise = torch.randn((1, channels, 1, side, side), generator=generator)
        scheduler = type(pipe.scheduler).from_config(
            pipe.scheduler.config, shift=1.0, use_dynamic_shifting=False
        )
        latents = pipe(
            conditioning["prompt_embeds"],
            conditioning.get("negative_prompt_embeds"),
            height=size,
            width=size,
            latents=noise.to(device),
            guidance_scale=PROBE_ANIMA_CFG,
            sigmas=[float(t) / 1000.0 for t in timesteps],
            scheduler=scheduler,
        ).images
        return latents[:, :, 0]

    def picture_pipeline(self, pipe, mode: Mode, latent_channels: int):
        """The same pipeline: given the picture's latents, it runs diffusers' image-to-image
        blocks."""
        return pipe

    def encode_pixels(self, vae, pixels):
        """The picture as one frame through the causal 3D VAE's encoder, normalised per
        channel as `decode` undoes it (AnimaImg2ImgVaeEncoderStep's latents, its mode)."""
        import torch

        z = vae.encode(pixels.to(vae.dtype).unsqueeze(2)).latent_dist.mode()[:, :, 0]
        channels = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, device=z.device).view(1, channels, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=z.device).view(1, channels, 1, 1)
        return (z.float() - mean) / std

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        return patches_problem(self, pipeline, width, height)

    def text_to_image_problem(self, pipeline) -> str | None:
        return input_channels_problem(pipeline, "z_dim", 1)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        """Seeded noise per image (made on the CPU), one frame of latents as the pipeline's
        blocks take them: (B, C, 1, h, w)."""
        import torch

        factor = self.latent_factor(pipeline)
        channels = pipeline.transformer.config.in_channels
        h, w = height // factor, width // factor
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        latents = [torch.randn((1, channels, 1, h, w), generator=g) for g in generators]
        return torch.cat(latents), generators

    def image_latents(self, pipeline, latents, height: int, width: int):
        return latents[:, :, 0] if latents.dim() == 5 else latents  # (B, C, h, w)

    def decode(self, vae, latents):
        """Qwen-Image's VAE: the per-channel normalisation undone, the one frame decoded (as
        AnimaVaeDecoderStep)."""
        import torch

        channels = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, device=latents.device).view(1, channels, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=latents.device).view(1, channels, 1, 1)
        z = (latents.float() * std + mean).unsqueeze(2)
        return vae.decode(z.to(vae.dtype)).sample[:, :, 0]
