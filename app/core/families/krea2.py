"""Krea 2 (base and Turbo): a Qwen3-VL text encoder read at a dozen of its layers, a single-stream
`transformer` that fuses those layers itself, Qwen-Image's causal 3D VAE."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from app.core import limits
from app.core.detection import Detection, pipeline_part_class
from app.core.encoders.qwen3_vl import QWEN3_VL
from app.core.encoders.vaes import WAN_VAE
from app.core.errors import HalfSafeError
from app.core.families.base import (
    Family,
    FamilyId,
    FlowMatching,
    input_channels_problem,
    patches_problem,
    transformer_width,
)
from app.core.families.qwenimage import QWENIMAGE_LATENT
from app.core.families.vl_prompts import PipelinePrompts
from app.core.formats.layouts import (
    Layout,
    Need,
    Row,
    Shapes,
    SplitModel,
    bounded,
    count_indices,
    linear,
    reader,
    within_limits,
)

# The check's guidance in Krea 2's own convention (prompt + g x (prompt - negative)): the base
# model's default, 4.5 (a CFG scale of 5.5); Turbo samples without guidance.
PROBE_KREA2_GUIDANCE = 4.5
# Turbo's fixed timestep shift (Krea2Pipeline's `mu` when `is_distilled`).
TURBO_MU = 1.15


# Krea's own key layout (ComfyUI: diffusion_models/krea2*.safetensors) ----------------------

_KREA2_MARKERS = ("txtfusion.projector.weight", "blocks.0.mod.lin", "first.weight")
# Krea2Transformer2DModel's settings that no tensor records (its released values).
KREA2_ROPE_THETA = 1000.0
KREA2_NORM_EPS = 1e-5
# The Qwen3-VL hidden states Krea 2 reads (Krea2Pipeline's default `text_encoder_select_layers`:
# every third of Qwen3-VL-4B's 36 layers from the second; 0 is the embedding). A transformer file
# does not say which layers its text fusion was trained on: a split file reads these.
KREA2_TAPS = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)
# The packed latent's patches: the released model's 2x2 (the file records only their product
# with the VAE's channels).
KREA2_PATCH = 2


def _heads(w, block: str, width: int) -> tuple[int, int, int]:
    """(head width, query heads, key/value heads) of one of Krea's attention blocks."""
    head = w(f"{block}attn.qknorm.qnorm.scale", 1)[0]
    keys = w(f"{block}attn.wk.weight", 2)[0]
    if head < 8 or head % 8 or width % head or keys % head:
        raise ValueError(f"its attention ({width} wide, {head}-wide heads) is not Krea 2's")
    heads, kv_heads = width // head, keys // head
    if heads % kv_heads:
        raise ValueError(f"its {heads} query heads do not share {kv_heads} key/value heads")
    return head, heads, kv_heads


def _read_krea2(shapes: Shapes, prefix: str) -> SplitModel:
    w = reader(shapes, prefix)
    width, in_channels = w("first.weight", 2)
    text_width = w("txtmlp.0.scale", 1)[0]
    text_layers = w("txtfusion.projector.weight", 2)[1]
    head, heads, kv_heads = _heads(w, "blocks.0.", width)
    fusion = "txtfusion.layerwise_blocks.0."
    _, text_heads, text_kv_heads = _heads(w, fusion, text_width)
    layers = count_indices(shapes, prefix + "blocks.")
    layerwise = count_indices(shapes, prefix + "txtfusion.layerwise_blocks.")
    refiners = count_indices(shapes, prefix + "txtfusion.refiner_blocks.")
    if text_layers != len(KREA2_TAPS):
        raise ValueError(
            f"its text fusion reads {text_layers} text-encoder layers where Krea 2 reads "
            f"{len(KREA2_TAPS)}, and no tensor says which"
        )
    if in_channels % (KREA2_PATCH * KREA2_PATCH):
        raise ValueError(f"its {in_channels} input channels are not 2x2 patches of a latent")
    latent = in_channels // (KREA2_PATCH * KREA2_PATCH)
    feed_forward = w("blocks.0.mlp.gate.weight", 2)[0]
    text_feed_forward = w(fusion + "mlp.gate.weight", 2)[0]
    timestep_width = w("tmlp.0.weight", 2)[1]
    bounded(
        ("feed-forward width", feed_forward, limits.MAX_WIDTH),
        ("text-fusion feed-forward width", text_feed_forward, limits.MAX_WIDTH),
        ("timestep embedding width", timestep_width, limits.MAX_WIDTH),
        ("number of text-fusion blocks", layerwise, limits.MAX_TRANSFORMER_DEPTH),
        ("number of caption refiner blocks", refiners, limits.MAX_TRANSFORMER_DEPTH),
        ("number of text-encoder layers read", text_layers, limits.MAX_TEXT_LAYERS),
        ("text width", text_width, limits.MAX_WIDTH),
        ("number of text-fusion heads", text_heads, limits.MAX_HEADS),
        ("number of latent channels", latent, limits.MAX_IMAGE_CHANNELS),
    )
    config = {
        "_class_name": "Krea2Transformer2DModel",
        "in_channels": in_channels,
        "num_layers": layers,
        "attention_head_dim": head,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": feed_forward,
        "timestep_embed_dim": timestep_width,
        "text_hidden_dim": text_width,
        "num_text_layers": text_layers,
        "text_num_attention_heads": text_heads,
        "text_num_key_value_heads": text_kv_heads,
        "text_intermediate_size": text_feed_forward,
        "num_layerwise_text_blocks": layerwise,
        "num_refiner_text_blocks": refiners,
        # Rotary axes (frame, height, width) in Krea 2's proportions: 32, 48, 48 of 128.
        "axes_dims_rope": [head // 4, 3 * head // 8, 3 * head // 8],
        "rope_theta": KREA2_ROPE_THETA,
        "norm_eps": KREA2_NORM_EPS,
    }
    within_limits(config)
    return SplitModel(
        table=_krea2_table,
        layout="krea2",
        title="Krea 2",
        prefix=prefix,
        config=config,
        architecture="krea2",
        because=(
            f"Krea 2: a single-stream transformer in Krea's layout ({prefix}blocks, txtfusion, "
            f"txtmlp, first, last) with {layers} blocks, {width} wide, on {latent}-channel "
            f"latents in 2x2 patches, fusing {text_layers} layers of {text_width}-wide Qwen3-VL "
            "hidden states; flow matching with CFG."
        ),
        needs=(
            Need(
                "text_encoder",
                QWEN3_VL,
                "its Qwen3-VL text encoder (qwen3_vl_4b)",
                lambda found: found == text_width,
                ("qwen3_vl", "qwen3-vl", "qwen_3_vl", "qwen3vl"),  # qwen3vl_4b_int8_convrot
                reads="4b",
            ),
            Need(
                "vae",
                WAN_VAE,
                "its VAE (qwen_image_vae)",
                lambda c: c == latent,
                ("qwen_image", "qwen"),
            ),
        ),
        pipeline_class="Krea2Pipeline",
        # Flux.1's flow-matching scheduler reshaped as Krea 2's: an exponential shift by
        # resolution, 0.5 at 256 patches to 1.15 at 6,400. Its VAE's config comes from shapes.
        configs="flux",
        scheduler={
            "shift": 1.0,
            "base_shift": 0.5,
            "max_shift": 1.15,
            "base_image_seq_len": 256,
            "max_image_seq_len": 6400,
            "time_shift_type": "exponential",
        },
        latent_channels=latent,
    )


def _krea2_attention(original: str, diffusers: str) -> Iterator[Row]:
    for mine, theirs in (("wq", "to_q"), ("wk", "to_k"), ("wv", "to_v"), ("gate", "to_gate")):
        yield f"{original}attn.{mine}.weight", (f"{diffusers}attn.{theirs}.weight",), "same"
    yield f"{original}attn.wo.weight", (f"{diffusers}attn.to_out.0.weight",), "same"
    for mine, theirs in (("qnorm", "norm_q"), ("knorm", "norm_k")):
        yield f"{original}attn.qknorm.{mine}.scale", (f"{diffusers}attn.{theirs}.weight",), "same"
    for part in ("gate", "up", "down"):
        yield f"{original}mlp.{part}.weight", (f"{diffusers}ff.{part}.weight",), "same"
    yield f"{original}prenorm.scale", (f"{diffusers}norm1.weight",), "same"
    yield f"{original}postnorm.scale", (f"{diffusers}norm2.weight",), "same"


def _krea2_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Krea's original names <-> diffusers' Krea2Transformer2DModel names: the patch embedder
    (first), timestep MLPs (tmlp, tproj), caption projection (txtmlp) and final layer (last)
    renamed, norms' `scale` as `weight`, attention and feed-forward renamed inside each block,
    and each block's six modulation vectors kept flattened into one."""
    yield from linear("first", "img_in")
    yield from linear("tmlp.0", "time_embed.linear_1")
    yield from linear("tmlp.2", "time_embed.linear_2")
    yield from linear("tproj.1", "time_mod_proj")
    yield "txtmlp.0.scale", ("txt_in.norm.weight",), "same"
    yield from linear("txtmlp.1", "txt_in.linear_1")
    yield from linear("txtmlp.3", "txt_in.linear_2")
    yield "txtfusion.projector.weight", ("text_fusion.projector.weight",), "same"
    for stage, count in (
        ("layerwise_blocks", config["num_layerwise_text_blocks"]),
        ("refiner_blocks", config["num_refiner_text_blocks"]),
    ):
        for i in range(count):
            yield from _krea2_attention(f"txtfusion.{stage}.{i}.", f"text_fusion.{stage}.{i}.")
    for i in range(config["num_layers"]):
        yield f"blocks.{i}.mod.lin", (f"transformer_blocks.{i}.scale_shift_table",), "flat"
        yield from _krea2_attention(f"blocks.{i}.", f"transformer_blocks.{i}.")
    yield from linear("last.linear", "final_layer.linear")
    yield "last.norm.scale", ("final_layer.norm.weight",), "same"
    yield "last.modulation.lin", ("final_layer.scale_shift_table",), "same"


LAYOUT = Layout("Krea 2-style transformer", _KREA2_MARKERS, (), _read_krea2, _krea2_table)


def layers_problem(pipeline) -> str | None:
    """Why the pipeline's text encoder cannot give its transformer the layers it reads (None:
    it can): each tapped layer must exist, one per layer the text fusion takes."""
    taps = tuple(pipeline.text_encoder_select_layers)
    layers = pipeline.text_encoder.config.text_config.num_hidden_layers
    wanted = pipeline.transformer.config.num_text_layers
    if len(taps) != wanted:
        return (
            f"its transformer fuses {wanted} text-encoder layers but the pipeline reads "
            f"{len(taps)} ({', '.join(map(str, taps))})."
        )
    if max(taps) > layers:
        return (
            f"it reads the text encoder's layer {max(taps)}, but its Qwen3-VL text encoder has "
            f"{layers} layers."
        )
    return None


def is_turbo(pipeline) -> bool:
    """Whether the pipeline is the few-step distilled checkpoint (its `is_distilled` flag)."""
    return bool(getattr(pipeline, "config", {}).get("is_distilled", False))


def patch_size(pipeline) -> int:
    return int(getattr(pipeline, "patch_size", 2))


@dataclass(frozen=True)
class Krea2Family(PipelinePrompts, FlowMatching, Family):
    """Krea 2: the prompt, padded to a fixed length inside Qwen-Image's chat template, runs
    through a Qwen3-VL text encoder; the hidden states of a dozen of its layers
    (`text_encoder_select_layers`), stacked per token after the system instruction, are what
    the single-stream `transformer` takes with a mask of the real tokens. The transformer fuses
    the layers, refines the caption and denoises `patch_size`-square patches of Qwen-Image's
    16-channel latent by flow matching (its prediction is the velocity). Guidance follows Krea's
    convention, prompt + g x (prompt - negative), which is CFG at scale 1 + g: the pipeline's
    `guidance_scale` is the user's CFG scale minus 1. The base model's schedule shifts by the
    image's size; Turbo (`is_distilled`) shifts by a fixed 1.15 and samples without guidance."""

    id = FamilyId("krea2")
    title = "Krea 2"
    architectures = {"krea2": "Krea 2"}
    trainer_words = ((r"krea-?2", "krea2"),)
    latent = QWENIMAGE_LATENT
    transformer_class = "Krea2Transformer2DModel"
    packed_channels = 4  # 2x2 patches of 16 latent channels: 64 in
    layout = LAYOUT
    pipeline_class = "Krea2Pipeline"
    companion_names = {"text_encoder": "qwen3_vl_4b", "vae": "qwen_image_vae"}

    def detect_folder(
        self,
        model_index: Mapping[str, Any],
        transformer: Mapping[str, Any],
        scheduler: Mapping[str, Any],
    ) -> Detection:
        width = transformer_width(transformer)
        patch = int(model_index.get("patch_size", 2))
        latent = int(transformer.get("in_channels", 64)) // (patch * patch)
        turbo = bool(model_index.get("is_distilled", False))
        because = (
            f"Krea 2{' Turbo' if turbo else ''}: its Krea2Pipeline has a single-stream "
            f"Krea2Transformer2DModel with {transformer.get('num_layers')} blocks, {width} wide, "
            f"on {latent}-channel latents in {patch}x{patch} patches, reading "
            f"{transformer.get('num_text_layers')} layers of a Qwen3-VL text encoder "
            f"({pipeline_part_class(model_index, 'text_encoder')}), and a 3D VAE; flow "
            + ("matching, distilled to sample without CFG." if turbo else "matching with CFG.")
        )
        return Detection(
            "krea2", True, "a Krea 2 pipeline", because, "flow", 1024, None, "Krea2Pipeline"
        )

    denoiser: str = "transformer"
    sample_argument: str = "hidden_states"
    max_sequence_length: int = 512  # text tokens the transformer takes (the pipeline's default)

    def latent_factor(self, pipeline) -> int:
        return 2 ** len(pipeline.vae.temperal_downsample)

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        problem = layers_problem(pipe)
        if problem is not None:
            raise HalfSafeError(f"This Krea 2 model cannot read a prompt: {problem}")
        return super().encode(pipe, prompt, negative, device, guidance)

    def prompt_embeds(self, pipe, text: str, device) -> tuple[Any, Any]:
        # (1, tokens, layers, width), and (1, tokens) True for the real tokens
        return pipe.encode_prompt(
            prompt=text, device=device, max_sequence_length=self.max_sequence_length
        )

    def _sigmas(self, pipeline, steps: int, size: int) -> list[float]:
        """The sigmas Krea2Pipeline runs at this step count and size: linear from 1 to 1/steps,
        shifted by the image's patch count (base) or by Turbo's fixed 1.15."""
        import numpy as np
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        scheduler = self.make_scheduler("euler", pipeline, None)
        config = scheduler.config
        side = size // (self.latent_factor(pipeline) * patch_size(pipeline))
        mu = (
            TURBO_MU
            if is_turbo(pipeline)
            else calculate_shift(
                side * side,
                config.get("base_image_seq_len", 256),
                config.get("max_image_seq_len", 6400),
                config.get("base_shift", 0.5),
                config.get("max_shift", 1.15),
            )
        )
        sigmas = np.linspace(1.0, 1 / steps, steps).tolist()
        scheduler.set_timesteps(sigmas=sigmas, mu=mu)
        return [float(s) for s in scheduler.sigmas[:-1]]

    def probe_timesteps(self, model, steps: int, scheduler: str, size: int) -> list[float]:
        """The first, middle and last timestep (sigma x 1000) of the schedule the pipeline
        runs at the user's step count and this size."""
        sigmas = self._sigmas(model.pipeline, max(2, steps), size)
        picked = {sigmas[0], sigmas[len(sigmas) // 2], sigmas[-1]}
        return sorted((round(s * 1000.0, 2) for s in picked), reverse=True)

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps`, each a transformer call on the prompt
        and one on the empty negative prompt (both conditionings are checked), combined by
        Krea 2's guidance (none for Turbo), as Krea2Pipeline runs them; returns the latents
        (1, 16, h, w)."""
        import torch

        transformer = pipe.transformer
        patch = patch_size(pipe)
        side = size // self.latent_factor(pipe)
        channels = transformer.config.in_channels // (patch * patch)
        generator = torch.Generator().manual_seed(0)
        noise = torch.randn((1, channels, side, side), generator=generator)
        latents = pipe._pack_latents(noise, 1, channels, side, side).to(device)
        grid = side // patch
        tokens = conditioning["prompt_embeds"].shape[1]
        positions = pipe.prepare_position_ids(tokens, grid, grid, device)
        calls = [
            {
                "encoder_hidden_states": conditioning[prefix + "prompt_embeds"],
                "encoder_attention_mask": conditioning[prefix + "prompt_embeds_mask"],
            }
            for prefix in ("", "negative_")
        ]
        guidance = 0.0 if is_turbo(pipe) else PROBE_KREA2_GUIDANCE
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            t = torch.full([1], sigma, device=device)
            cond, uncond = (
                transformer(
                    hidden_states=latents,
                    timestep=t,
                    position_ids=positions,
                    **call,
                    return_dict=False,
                )[0].float()
                for call in calls
            )
            velocity = cond + guidance * (cond - uncond)
            latents = latents + (following - sigma) * velocity
        return self.image_latents(pipe, latents, size, size)

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        return patches_problem(self, pipeline, width, height, patch_size(pipeline))

    def text_to_image_problem(self, pipeline) -> str | None:
        return layers_problem(pipeline) or input_channels_problem(
            pipeline, "z_dim", patch_size(pipeline) ** 2
        )

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        """Seeded noise per image (made on the CPU), packed into the pipeline's patches."""
        import torch

        factor = self.latent_factor(pipeline)
        patch = patch_size(pipeline)
        channels = pipeline.transformer.config.in_channels // (patch * patch)
        h, w = height // factor, width // factor
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        packed = [
            pipeline._pack_latents(torch.randn((1, channels, h, w), generator=g), 1, channels, h, w)
            for g in generators
        ]
        return torch.cat(packed), generators

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        # Krea's guidance g is CFG at 1 + g; 0 turns the negative call off (Turbo, CFG 1).
        return {"guidance_scale": max(cfg - 1.0, 0.0)}

    def image_latents(self, pipeline, latents, height: int, width: int):
        return pipeline._unpack_latents(latents, height, width)[:, :, 0]  # (B, C, h, w)

    def decode(self, vae, latents):
        """Qwen-Image's VAE: the per-channel normalisation undone, the one frame decoded."""
        import torch

        channels = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, device=latents.device).view(1, channels, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=latents.device).view(1, channels, 1, 1)
        z = (latents.float() * std + mean).unsqueeze(2)
        return vae.decode(z.to(vae.dtype)).sample[:, :, 0]
