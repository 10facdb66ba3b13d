"""Flux.1 dev and schnell: CLIP-L pooled + T5 sequence, a `transformer` on packed 2x2 patches of
a 16-channel latent by flow matching, guidance as an embedding instead of a CFG batch. Flux.1
Kontext, its editing variant, is the same transformer with the reference picture's latents in
its sequence."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from app.core.detection import Detection
from app.core.encoders.clip import CLIP
from app.core.encoders.t5 import t5_need
from app.core.encoders.vaes import VAE
from app.core.families.base import (
    Family,
    FamilyId,
    LatentFormat,
    ShiftedSigmas,
    input_channels_problem,
    packed_noise,
    patches_problem,
    transformer_width,
)
from app.core.families.capabilities import Control, Editing
from app.core.formats.layouts import (
    Layout,
    Need,
    Row,
    Shapes,
    SplitModel,
    count_indices,
    fused,
    linear,
    reader,
    swapped,
    within_limits,
)
from app.core.images.pictures import Mode
from app.core.words import infotext

PROBE_GUIDANCE = 3.5  # the check's distilled guidance (Flux.1 dev's guidance embedding)

# Flux.1's VAE (also Chroma's and Z-Image's): 16 channels; the preview fits its colours.
FLUX_LATENT = LatentFormat(channels=16)


# Black Forest Labs' key layout (ComfyUI: diffusion_models/flux1-dev.safetensors) ----------


BFL_MARKERS = ("double_blocks.0.img_attn.qkv.weight", "img_in.weight")
CHROMA_MARKER = "distilled_guidance_layer.in_proj.weight"


def bfl_blocks(shapes: Shapes, prefix: str) -> dict[str, Any]:
    """What Flux.1 and Chroma transformers share, read from the shapes."""
    w = reader(shapes, prefix)
    inner, in_channels = w("img_in.weight", 2)
    head = w("double_blocks.0.img_attn.norm.query_norm.scale", 1)[0]
    mlp = w("double_blocks.0.img_mlp.0.weight", 2)[0]
    if head < 8 or inner % head or mlp != 4 * inner:
        raise ValueError(f"its blocks ({inner} wide, {head}-wide heads, MLP {mlp}) are not Flux's")
    return {
        "patch_size": 1,
        "in_channels": in_channels,
        "out_channels": w("final_layer.linear.weight", 2)[0],
        "num_layers": count_indices(shapes, prefix + "double_blocks."),
        "num_single_layers": count_indices(shapes, prefix + "single_blocks."),
        "attention_head_dim": head,
        "num_attention_heads": inner // head,
        "joint_attention_dim": w("txt_in.weight", 2)[1],
        # Rotary axes (index, height, width) in Flux's proportions: 16, 56, 56 of 128.
        "axes_dims_rope": [head // 8, 7 * head // 16, 7 * head // 16],
    }


def flux_vae_need(latent: int) -> Need:
    return Need("vae", VAE, "its 16-channel VAE (ae)", lambda c: c == latent, ("ae", "flux"))


def beside_the_noise(in_channels: int, out_channels: int) -> str:
    """What a Flux.1 transformer reads beside the noise in its input channels: "" (text to
    image), "fill" (Fill: the masked picture's latents and the mask, 8x8 mask values per latent
    cell, all in 2x2 patches) or "control" (Depth, Canny: a control picture's latents); a
    ValueError for any other count."""
    beside = in_channels - out_channels
    if beside == 0:
        return ""
    if beside == out_channels + 4 * MASK_CELL:
        return "fill"
    if beside == out_channels:
        return "control"
    raise ValueError(
        f"its transformer takes {in_channels} input channels for {out_channels} output "
        "channels, as no Flux.1 model does"
    )


def _read_flux(shapes: Shapes, prefix: str) -> SplitModel:
    config = {"_class_name": "FluxTransformer2DModel", **bfl_blocks(shapes, prefix)}
    config["pooled_projection_dim"] = reader(shapes, prefix)("vector_in.in_layer.weight", 2)[1]
    config["guidance_embeds"] = prefix + "guidance_in.in_layer.weight" in shapes
    within_limits(config)
    beside = beside_the_noise(config["in_channels"], config["out_channels"])
    latent = config["out_channels"] // 4
    dev = bool(config["guidance_embeds"])
    variant = "dev" if dev else "schnell"
    width = config["num_attention_heads"] * config["attention_head_dim"]
    guidance = (
        "and a guidance embedding (guidance_in), as the guidance-distilled Flux.1 dev has"
        if dev
        else "and no guidance embedding (no guidance_in), as Flux.1 schnell"
    )
    clip_width = config["pooled_projection_dim"]
    title = {"": f"Flux.1 {variant}", "fill": "Flux.1 Fill", "control": "Flux.1 Depth or Canny"}
    reads = {
        "": "",
        "fill": f", and beside the noise {_FILL_WORDS.format(inputs=config['in_channels'])}",
        "control": f", and beside the noise {_CONTROL_WORDS.format(inputs=config['in_channels'])}",
    }
    return SplitModel(
        table=bfl_table,
        layout="flux",
        title="Flux.1",
        prefix=prefix,
        config=config,
        architecture={"": f"flux-{variant}", "fill": FILL, "control": CONTROL}[beside],
        because=(
            f"{title[beside]}: a transformer in Black Forest Labs' layout ({prefix}double_blocks, "
            f"single_blocks) with {config['num_layers']} double and "
            f"{config['num_single_layers']} single blocks, {width} wide, taking "
            f"{config['joint_attention_dim']}-wide T5 features and a "
            f"{clip_width}-wide CLIP vector{reads[beside]}, {guidance}; flow matching."
        ),
        needs=(
            t5_need("text_encoder_2", config["joint_attention_dim"]),
            Need(
                "text_encoder",
                CLIP,
                "its CLIP-L text encoder (clip_l)",
                lambda w: w == clip_width,
                ("clip_l", "clip-l", "clipl"),
            ),
            flux_vae_need(latent),
        ),
        pipeline_class={"": "FluxPipeline", "fill": FILL_PIPELINE, "control": CONTROL_PIPELINE}[
            beside
        ],
        configs="flux",
        # Schnell's schedule differs from dev's only in not shifting by resolution.
        scheduler={"use_dynamic_shifting": dev, "shift": 3.0 if dev else 1.0},
        latent_channels=latent,
    )


def bfl_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Black Forest Labs' names <-> diffusers' FluxTransformer2DModel and
    ChromaTransformer2DModel names. Chroma has no per-block modulation, time, vector or
    guidance embedding and no final modulation: its approximator gives them all."""
    chroma = config["_class_name"] == "ChromaTransformer2DModel"
    if chroma:
        layer = "distilled_guidance_layer"
        yield from linear(f"{layer}.in_proj", f"{layer}.in_proj")
        for i in range(config["approximator_layers"]):
            yield from linear(f"{layer}.layers.{i}.in_layer", f"{layer}.layers.{i}.linear_1")
            yield from linear(f"{layer}.layers.{i}.out_layer", f"{layer}.layers.{i}.linear_2")
            yield f"{layer}.norms.{i}.scale", (f"{layer}.norms.{i}.weight",), "same"
        yield from linear(f"{layer}.out_proj", f"{layer}.out_proj")
    else:
        yield from linear("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1")
        yield from linear("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2")
        yield from linear("vector_in.in_layer", "time_text_embed.text_embedder.linear_1")
        yield from linear("vector_in.out_layer", "time_text_embed.text_embedder.linear_2")
        if config["guidance_embeds"]:
            yield from linear("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1")
            yield from linear("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2")
    yield from linear("txt_in", "context_embedder")
    yield from linear("img_in", "x_embedder")
    for i in range(config["num_layers"]):
        b, d = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        if not chroma:
            yield from linear(b + "img_mod.lin", d + "norm1.linear")
            yield from linear(b + "txt_mod.lin", d + "norm1_context.linear")
        yield from fused(b + "img_attn.qkv", (d + "attn.to_q", d + "attn.to_k", d + "attn.to_v"))
        yield from fused(
            b + "txt_attn.qkv",
            (d + "attn.add_q_proj", d + "attn.add_k_proj", d + "attn.add_v_proj"),
        )
        for side, added in (("img", ""), ("txt", "added_")):
            for bfl, ours in (("query", "q"), ("key", "k")):
                yield (
                    f"{b}{side}_attn.norm.{bfl}_norm.scale",
                    (f"{d}attn.norm_{added}{ours}.weight",),
                    "same",
                )
        yield from linear(b + "img_mlp.0", d + "ff.net.0.proj")
        yield from linear(b + "img_mlp.2", d + "ff.net.2")
        yield from linear(b + "txt_mlp.0", d + "ff_context.net.0.proj")
        yield from linear(b + "txt_mlp.2", d + "ff_context.net.2")
        yield from linear(b + "img_attn.proj", d + "attn.to_out.0")
        yield from linear(b + "txt_attn.proj", d + "attn.to_add_out")
    for i in range(config["num_single_layers"]):
        b, d = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        if not chroma:
            yield from linear(b + "modulation.lin", d + "norm.linear")
        yield from fused(
            b + "linear1", (d + "attn.to_q", d + "attn.to_k", d + "attn.to_v", d + "proj_mlp")
        )
        yield from linear(b + "linear2", d + "proj_out")
        yield b + "norm.query_norm.scale", (d + "attn.norm_q.weight",), "same"
        yield b + "norm.key_norm.scale", (d + "attn.norm_k.weight",), "same"
    yield from linear("final_layer.linear", "proj_out")
    if not chroma:  # BFL's final modulation is (shift, scale), diffusers' (scale, shift)
        yield from swapped("final_layer.adaLN_modulation.1", "norm_out.linear")


def _named_flux(model: SplitModel, file_name: str) -> SplitModel:
    """Flux.1 Kontext's transformer is shaped as dev's (it reads the reference picture's
    latents in its sequence, not in its channels): only the file's name tells it, as the
    name Black Forest Labs and ComfyUI give it (flux1-kontext-dev) does."""
    if model.architecture != "flux-dev" or "kontext" not in file_name.lower():
        return model
    return replace(
        model,
        architecture=KONTEXT,
        pipeline_class=KONTEXT_PIPELINE,
        because=(
            "Flux.1 Kontext, as the file's name says (its weights are shaped as Flux.1 dev's, "
            f"as Kontext's are): {model.because.removeprefix('Flux.1 dev: ')}"
        ),
    )


LAYOUT = Layout(
    "Flux-style transformer", BFL_MARKERS, (CHROMA_MARKER,), _read_flux, bfl_table, _named_flux
)


KONTEXT = "flux-kontext"  # the architecture's name
KONTEXT_PIPELINE = "FluxKontextPipeline"
FILL_PIPELINE = "FluxFillPipeline"
CONTROL_PIPELINE = "FluxControlPipeline"
FILL = "flux-fill"  # the architecture's name
MASK_CELL = 64  # Fill's mask values per latent cell: the VAE's 8x8 pixels

_FILL_WORDS = (
    "the masked picture's latents and the mask, 8x8 values per latent cell, in 2x2 patches "
    "({inputs} input channels in all), as an inpainting model reads them"
)
_CONTROL_WORDS = (
    "a control picture's latents (a depth map or an edge picture; {inputs} input channels in all)"
)
CONTROL = "flux-control"  # the architecture's name


def _detect_kontext(transformer: Mapping[str, Any]) -> Detection:
    latent = int(transformer.get("in_channels", 64)) // 4
    because = (
        f"Flux.1 Kontext: its FluxKontextPipeline has a FluxTransformer2DModel with "
        f"{transformer.get('num_layers')} double and {transformer.get('num_single_layers')} "
        f"single blocks, {transformer_width(transformer)} wide, on {latent}-channel latents in "
        "2x2 patches, that edits a reference picture whose latents it reads in its sequence "
        "beside the noise; a guidance embedding; flow matching."
    )
    return Detection(
        KONTEXT,
        True,
        "a Flux.1 Kontext (editing) pipeline",
        because,
        "flow",
        1024,
        None,
        KONTEXT_PIPELINE,
    )


def _detect_fill(transformer: Mapping[str, Any]) -> Detection:
    inputs = int(transformer.get("in_channels", 384))
    because = (
        f"Flux.1 Fill: its FluxFillPipeline has a FluxTransformer2DModel with "
        f"{transformer.get('num_layers')} double and {transformer.get('num_single_layers')} "
        f"single blocks, {transformer_width(transformer)} wide, that reads beside the noise "
        f"{_FILL_WORDS.format(inputs=inputs)}; a guidance embedding; flow matching."
    )
    return Detection(
        FILL,
        True,
        "a Flux.1 Fill (inpainting) pipeline",
        because,
        "flow",
        1024,
        None,
        FILL_PIPELINE,
    )


def _detect_control(transformer: Mapping[str, Any]) -> Detection:
    inputs = int(transformer.get("in_channels", 128))
    because = (
        f"Flux.1 Depth or Canny: its FluxControlPipeline has a FluxTransformer2DModel with "
        f"{transformer.get('num_layers')} double and {transformer.get('num_single_layers')} "
        f"single blocks, {transformer_width(transformer)} wide, that reads beside the noise "
        f"{_CONTROL_WORDS.format(inputs=inputs)}; a guidance embedding; flow matching."
    )
    return Detection(
        CONTROL,
        True,
        "a Flux.1 Depth or Canny (control) pipeline",
        because,
        "flow",
        1024,
        None,
        CONTROL_PIPELINE,
    )


# What a folder's pipeline needs its transformer to read beside the noise ("": nothing, as
# text-to-image and Kontext, which reads its reference in the sequence), and in words.
_FOLDER_READS = {FILL_PIPELINE: "fill", CONTROL_PIPELINE: "control"}
_NEEDS_WORDS = {
    "": "a transformer that takes as many input channels as it gives back ({out})",
    "fill": (
        "a Fill transformer, which reads the masked picture's latents and the mask beside the "
        "noise ({fill} input channels for {out} output channels)"
    ),
    "control": (
        "a Depth or Canny transformer, which reads a control picture's latents beside the "
        "noise ({control} input channels for {out} output channels)"
    ),
}
_TAKES_WORDS = {
    "": "as Flux.1 dev's and schnell's do",
    "fill": "as Flux.1 Fill's does",
    "control": "as Flux.1 Depth's and Canny's do",
}
_FOLDER_VARIANTS = {
    FILL_PIPELINE: (FILL, "a Flux.1 Fill (inpainting) pipeline"),
    CONTROL_PIPELINE: (CONTROL, "a Flux.1 Depth or Canny (control) pipeline"),
    KONTEXT_PIPELINE: (KONTEXT, "a Flux.1 Kontext (editing) pipeline"),
}


def _variant_mismatch(
    model_index: Mapping[str, Any], transformer: Mapping[str, Any]
) -> Detection | None:
    """A folder whose pipeline reads other inputs than its transformer takes (a Fill folder
    holding Flux.1 dev's transformer, whose inpainting would fail at its first step), as an
    unsupported Detection that says both; None when they agree."""
    class_name = str(model_index.get("_class_name"))
    inputs = transformer.get("in_channels", 64)
    out = transformer.get("out_channels") or inputs
    if not isinstance(inputs, int) or not isinstance(out, int):
        return None
    wanted = _FOLDER_READS.get(class_name, "")
    try:
        found = beside_the_noise(inputs, out)
    except ValueError as error:
        takes = str(error)
    else:
        if found == wanted:
            return None
        takes = f"its transformer takes {inputs} input channels, {_TAKES_WORDS[found]}"
    needs = _NEEDS_WORDS[wanted].format(out=out, fill=2 * out + 4 * MASK_CELL, control=2 * out)
    architecture, looks = _FOLDER_VARIANTS.get(class_name, ("flux", "a Flux.1 pipeline"))
    return Detection(architecture, False, looks, f"its {class_name} needs {needs}, but {takes}.")


def is_fill(pipeline) -> bool:
    """Whether a loaded pipeline is Flux.1 Fill's."""
    return type(pipeline).__name__ == FILL_PIPELINE


def is_control(pipeline) -> bool:
    """Whether a loaded pipeline is Flux.1 Depth's or Canny's."""
    return type(pipeline).__name__ == CONTROL_PIPELINE


def _latent_channels(transformer) -> int:
    """The channels of the latents a Flux.1 transformer denoises: a quarter of its output (2x2
    patches); Fill and the control models read more than that in their input."""
    config = transformer.config
    return (config.out_channels or config.in_channels) // 4


@dataclass(frozen=True)
class FluxFamily(Editing, Control, ShiftedSigmas, Family):
    """Flux.1 dev and schnell: CLIP-L gives a pooled vector, T5 the token sequence; a
    `transformer` denoises 2x2 patches of a 16-channel latent by flow matching; dev takes the
    guidance scale as an embedding (one batch, no negative prompt), schnell takes none."""

    takes_step_cache = True

    id = FamilyId("flux")
    file_markers = (("double_blocks.", "a Flux model"),)
    title = "Flux.1"
    architectures = {
        "flux": "Flux.1",
        "flux-dev": "Flux.1 dev",
        "flux-schnell": "Flux.1 schnell",
        "flux-kontext": "Flux.1 Kontext",
        FILL: "Flux.1 Fill",
        CONTROL: "Flux.1 Depth or Canny",
    }
    trainer_words = (
        (r"flux.*kontext", "flux-kontext"),
        (r"flux.*fill", "flux-fill"),
        (r"flux.*schnell", "flux-schnell"),
        (r"flux-?1?-dev", "flux-dev"),
        (r"flux", "flux"),
    )
    latent = FLUX_LATENT
    transformer_class = "FluxTransformer2DModel"
    packed_channels = 4
    layout = LAYOUT
    pipeline_class = "FluxPipeline"
    companion_names = {"text_encoder": "clip_l", "text_encoder_2": "t5xxl", "vae": "ae"}
    picture_pipelines = {Mode.IMAGE: "FluxImg2ImgPipeline", Mode.INPAINT: "FluxInpaintPipeline"}
    # Kontext takes one reference; without one its pipeline draws from the prompt alone.
    edit_pipelines = {KONTEXT_PIPELINE: 1}
    # Fill inpaints; Depth and Canny draw after a control picture.
    variant_pipelines: ClassVar[tuple[str, ...]] = (FILL_PIPELINE, CONTROL_PIPELINE)

    def recognises(self, class_name: str) -> bool:
        return super().recognises(class_name) or class_name in self.variant_pipelines

    def detect_folder(
        self,
        model_index: Mapping[str, Any],
        transformer: Mapping[str, Any],
        scheduler: Mapping[str, Any],
    ) -> Detection:
        mismatch = _variant_mismatch(model_index, transformer)
        if mismatch is not None:
            return mismatch
        if model_index.get("_class_name") == KONTEXT_PIPELINE:
            return _detect_kontext(transformer)
        if model_index.get("_class_name") == FILL_PIPELINE:
            return _detect_fill(transformer)
        if model_index.get("_class_name") == CONTROL_PIPELINE:
            return _detect_control(transformer)
        dev = bool(transformer.get("guidance_embeds"))
        variant = "dev" if dev else "schnell"
        latent = int(transformer.get("in_channels", 64)) // 4
        width = transformer_width(transformer)
        guidance = (
            "and a guidance embedding, as the guidance-distilled Flux.1 dev has"
            if dev
            else "and no guidance embedding, as Flux.1 schnell"
        )
        because = (
            f"Flux.1 {variant}: its FluxPipeline has a FluxTransformer2DModel with "
            f"{transformer.get('num_layers')} double and {transformer.get('num_single_layers')} "
            f"single blocks, {width} wide, on {latent}-channel latents in 2x2 patches, {guidance}; "
            "flow matching."
        )
        return Detection(
            f"flux-{variant}",
            True,
            f"a Flux.1 {variant} pipeline",
            because,
            "flow",
            1024,
            None,
            "FluxPipeline",
        )

    denoiser: str = "transformer"
    sample_argument: str = "hidden_states"
    comfyui_fused_rope = True  # comfy/ldm/flux/layers.py (and Chroma's) attend through it

    @staticmethod
    def max_sequence_length(pipe) -> int:
        # Flux.1 dev reads 512 T5 tokens, schnell 256 (the reference pipelines' defaults).
        return 512 if pipe.transformer.config.guidance_embeds else 256

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        embeds, pooled, _ = pipe.encode_prompt(
            prompt=prompt,
            prompt_2=None,
            device=device,
            num_images_per_prompt=1,
            max_sequence_length=self.max_sequence_length(pipe),
        )
        return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        return {
            "text_encoder": [tensors["pooled_prompt_embeds"]],
            "text_encoder_2": [tensors["prompt_embeds"]],
        }

    def denoiser_inputs(self, conditioning: dict[str, Any], size: int, device) -> dict[str, Any]:
        import torch

        embeds = conditioning["prompt_embeds"]
        return {
            "encoder_hidden_states": embeds,
            "pooled_projections": conditioning["pooled_prompt_embeds"],
            "txt_ids": torch.zeros(embeds.shape[1], 3, device=device),
        }

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps` (x + (sigma_next - sigma) * v, the
        last step to sigma 0), one batch with the guidance embedding; returns (1, 16, h, w)."""
        return self._probe(pipe, conditioning, size, device, timesteps, [])

    def probe_edit(self, pipe, conditioning, size: int, device, timesteps, references) -> Any:
        """As `probe_denoise`, with each reference's packed latents after the noise in the
        transformer's sequence (their position ids' first axis 1, as Kontext places them);
        only the noise's part of the output steps."""
        return self._probe(pipe, conditioning, size, device, timesteps, references)

    def _probe(self, pipe, conditioning, size: int, device, timesteps, references) -> Any:
        import torch
        from diffusers import FluxPipeline

        transformer = pipe.transformer
        side = size // self.latent_factor(pipe)
        channels = _latent_channels(transformer)
        generator = torch.Generator().manual_seed(0)
        noise = torch.randn((1, channels, side, side), generator=generator)
        latents = FluxPipeline._pack_latents(noise, 1, channels, side, side).to(device)
        image_ids = FluxPipeline._prepare_latent_image_ids(
            1, side // 2, side // 2, device, torch.float32
        )
        # Fill (the masked picture and the mask) and the control models (the control picture)
        # read theirs in the channels, not the sequence; with no picture (a check without one,
        # whose report says so: `health.check.WITHOUT_PICTURE`) zeros, no picture's latents.
        beside = None
        if is_fill(pipe) or is_control(pipe):
            wanted = transformer.config.in_channels - 4 * channels
            beside = (
                self.channel_latents(pipe, references, device)
                if references
                else latents.new_zeros(1, latents.shape[1], wanted)
            )
            references = []
        packed, ids = [], [image_ids]
        for reference in references:
            h, w = reference.shape[-2:]
            packed.append(FluxPipeline._pack_latents(reference.float(), 1, channels, h, w))
            reference_ids = FluxPipeline._prepare_latent_image_ids(
                1, h // 2, w // 2, device, torch.float32
            )
            reference_ids[..., 0] = 1
            ids.append(reference_ids)
        extra = self.denoiser_inputs(conditioning, size, device)
        if transformer.config.guidance_embeds:
            extra["guidance"] = torch.full([1], PROBE_GUIDANCE, device=device)
        tokens = latents.shape[1]
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            hidden = latents if beside is None else torch.cat([latents, beside], dim=2)
            velocity = transformer(
                hidden_states=torch.cat([hidden, *packed], dim=1),
                timestep=torch.full([1], sigma, device=device),
                img_ids=torch.cat(ids),
                **extra,
            ).sample.float()[:, :tokens]
            latents = latents + (following - sigma) * velocity
        return FluxPipeline._unpack_latents(latents, size, size, self.latent_factor(pipe))

    def edit_call(
        self, pipeline, embeds: dict[str, Any], batch: int, latents, pictures, size
    ) -> dict[str, Any]:
        # Kontext takes the reference as latents (it does not encode them again).
        return {**self.pipeline_embeds(embeds, batch), "image": latents[0]}

    def pipeline_arguments(self, pipeline, width: int, height: int) -> dict[str, Any]:
        # Kontext's pipeline redraws any size at its `max_area` (a megapixel): this one's area
        # keeps the job's size.
        if type(pipeline).__name__ == KONTEXT_PIPELINE:
            return {"max_area": width * height}
        return {}

    def channel_latents(self, pipe, beside, device) -> Any:
        """What Fill or a control model reads beside the noise in its channels, (1, tokens, C),
        from `sequence_latents`: the control picture's latents packed in 2x2 patches (as its
        pipeline packs them), or Fill's masked picture and mask (`fill_channels`)."""
        from diffusers import FluxPipeline

        if is_fill(pipe):
            return self.fill_channels(pipe, beside[0], beside[1], device)
        (latents,) = beside
        _, channels, height, width = latents.shape
        return FluxPipeline._pack_latents(latents.float(), 1, channels, height, width).to(device)

    def fill_channels(self, pipe, masked, mask, device) -> Any:
        """What Flux.1 Fill reads beside the noise, (1, tokens, 320): the masked picture's
        latents (as `encode_pixels` made them) and the mask (1, 1, H, W), packed by the
        pipeline's own `prepare_mask_latents` (which shifts and scales the raw latents it is
        given, so they are handed over raw)."""
        import torch

        vae = pipe.vae.config
        raw = masked.float() / vae.scaling_factor + vae.shift_factor
        height, width = mask.shape[-2:]
        packed_mask, packed = pipe.prepare_mask_latents(
            mask.to(device, torch.float32),
            raw.to(device),
            1,
            raw.shape[1],
            1,
            height,
            width,
            torch.float32,
            device,
            None,
        )
        return torch.cat((packed, packed_mask), dim=-1)

    def sequence_latents(self, pipeline, mode: Mode, encoded, mask=None) -> list[Any] | None:
        # Fill reads the picture with its hole and the mask, a control model the control
        # picture (in their channels: `_probe`).
        if mode is Mode.INPAINT and is_fill(pipeline):
            return [encoded[1], mask]
        if mode is Mode.CONTROL:
            return [encoded[0] if isinstance(encoded, list) else encoded]
        return super().sequence_latents(pipeline, mode, encoded, mask)

    def takes_control(self, pipeline) -> bool:
        return is_control(pipeline)

    def control_call(self, pipeline, latents) -> dict[str, Any]:
        # Packed latents (3-D) are read as they are; the pipeline repeats them for the batch.
        from diffusers import FluxPipeline

        _, channels, height, width = latents.shape
        packed = FluxPipeline._pack_latents(latents, 1, channels, height, width)
        return {"control_image": packed}

    def text_to_image_problem(self, pipeline) -> str | None:
        if is_fill(pipeline):
            return (
                "this is Flux.1 Fill, an inpainting model: give it a picture and a mask "
                "(white where it paints)."
            )
        if is_control(pipeline):
            return (
                "this is Flux.1 Depth or Canny, a control model: give it the control picture "
                "it follows (a depth map or an edge picture)."
            )
        return input_channels_problem(pipeline, "latent_channels", 4, " (a Depth or Canny model?)")

    def picture_problem(self, pipeline, mode: Mode) -> str | None:
        if is_fill(pipeline) and mode is Mode.IMAGE:
            return (
                "this is Flux.1 Fill, an inpainting model: give it a mask with the picture "
                "(white where it paints)."
            )
        return super().picture_problem(pipeline, mode)

    def redraws_from_noise(self, pipeline, mode: Mode) -> bool:
        return super().redraws_from_noise(pipeline, mode) or (
            mode is Mode.INPAINT and is_fill(pipeline)
        )

    def encodes_its_pictures(self, pipeline, mode: Mode) -> bool:
        # diffusers' FluxFillPipeline takes no latents of the masked picture: its call refuses
        # them beside a picture and cannot do without one. It encodes the picture itself.
        return super().encodes_its_pictures(pipeline, mode) or (
            mode is Mode.INPAINT and is_fill(pipeline)
        )

    def own_encoding_call(self, pipeline, pictures) -> dict[str, Any]:
        # The picture in [0, 1] (the pipeline's processor makes it [-1, 1] and greys the hole,
        # as `Pictures.masked_pixels` does) and the hard mask; from noise, every step.
        return {
            "image": (pictures.pixels + 1.0) / 2.0,
            "mask_image": pictures.mask,
            "strength": 1.0,
        }

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        return patches_problem(self, pipeline, width, height)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        from diffusers import FluxPipeline

        channels = _latent_channels(pipeline.transformer)
        return packed_noise(
            self, pipeline, FluxPipeline._pack_latents, (), seeds, height, width, channels
        )

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        # dev: the guidance embedding's scale (schnell ignores it); never a negative batch.
        return {"guidance_scale": cfg}

    def guidance_parameters(self, cfg: float) -> list[tuple[str, Any]]:
        # As Forge writes Flux's: no CFG batch (scale 1), the embedding's scale beside it.
        return [(infotext.CFG_SCALE.name, "1"), (infotext.DISTILLED_CFG_SCALE.name, f"{cfg:g}")]

    def clamped_blocks(self, denoiser) -> list[Any]:
        # diffusers clips the fp16 residual stream of every double and single block to +-65504
        # by hand (as ComfyUI does): an overflow inside a block leaves it saturated, not inf.
        return [*denoiser.transformer_blocks, *denoiser.single_transformer_blocks]

    def image_latents(self, pipeline, latents, height: int, width: int):
        from diffusers import FluxPipeline

        return FluxPipeline._unpack_latents(latents, height, width, self.latent_factor(pipeline))
