"""Qwen-Image: a Qwen2.5-VL text encoder, an MMDiT `transformer` with real CFG, a causal 3D VAE
(Wan 2.1's layout) with per-channel latent statistics. Qwen-Image-Edit (and Edit-Plus, which
takes up to three pictures) is the same transformer editing reference pictures: its text
encoder reads them beside the prompt through its vision tower, and their latents join the
transformer's sequence."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core import limits
from app.core.detection import Detection, pipeline_part_class
from app.core.encoders.qwen25_vl import QWEN25_VL
from app.core.encoders.vaes import WAN_VAE
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
from app.core.families.capabilities import Editing
from app.core.families.vl_prompts import PipelinePrompts
from app.core.formats.layouts import (
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
from app.core.images.pictures import Mode

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
                QWEN25_VL,
                "its Qwen2.5-VL text encoder (qwen_2.5_vl_7b)",
                lambda width: width == text_width,
                ("qwen_2.5", "qwen2.5", "qwen25"),
            ),
            Need(
                "vae",
                WAN_VAE,
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


EDIT_PIPELINE = "QwenImageEditPipeline"  # Qwen-Image-Edit: one picture
EDIT_PLUS_PIPELINE = "QwenImageEditPlusPipeline"  # Edit-Plus (2509, 2511): up to three
# Qwen2-VL's image preprocessing, as Qwen-Image-Edit's processor/ folder sets it: 14-px patches
# merged 2x2, two frames per temporal patch, CLIP's mean and spread.
QWEN2_VL_IMAGES: dict[str, Any] = {
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 16384},
}


def _detect_edit(model_index: Mapping[str, Any], transformer: Mapping[str, Any]) -> Detection:
    plus = model_index.get("_class_name") == EDIT_PLUS_PIPELINE
    title = "Qwen-Image-Edit-Plus" if plus else "Qwen-Image-Edit"
    takes = "up to three reference pictures" if plus else "one reference picture"
    because = (
        f"{title}: its {model_index.get('_class_name')} has a QwenImageTransformer2DModel "
        f"(MMDiT) with {transformer.get('num_layers')} blocks, "
        f"{transformer_width(transformer)} wide, that edits {takes}: its Qwen2.5-VL text "
        f"encoder ({pipeline_part_class(model_index, 'text_encoder')}) reads them beside the "
        "prompt and their latents join the transformer's sequence; flow matching with real CFG."
    )
    return Detection(
        "qwenimage-edit-plus" if plus else "qwenimage-edit",
        True,
        f"a {title} (editing) pipeline",
        because,
        "flow",
        1024,
        None,
        str(model_index.get("_class_name")),
    )


def edit_processor(tokenizer=None, images: Mapping[str, Any] | None = None):
    """Qwen2.5-VL's processor as Qwen-Image-Edit's pipeline calls it: the Qwen BPE
    (`tokenizer`, by default the shipped one) and transformers' PIL image processor (`images`:
    its settings, by default Qwen2-VL's). transformers' Qwen2VLProcessor also holds a video
    processor whose Qwen2-VL class needs torchvision, which HalfSafe does not ship; the editing
    pipeline never passes a video, so a plain video processor stands in that one slot, its
    class check relaxed while the processor is built. Nothing about images changes."""
    from transformers import Qwen2VLImageProcessorPil, Qwen2VLProcessor
    from transformers.video_processing_utils import BaseVideoProcessor, VideoProcessorMixin

    from app.core.encoders.tokenizers import qwen2_tokenizer

    settings = {k: v for k, v in (images or QWEN2_VL_IMAGES).items() if not k.endswith("_type")}
    for old, new in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if old in settings:  # the older preprocessor_config.json's names
            settings.setdefault("size", {})[new] = settings.pop(old)
    processor = Qwen2VLProcessor.__new__(Qwen2VLProcessor)
    checked = processor.check_argument_for_proper_class

    def check(argument_name: str, argument):
        if argument_name == "video_processor" and isinstance(argument, VideoProcessorMixin):
            return type(argument)
        return checked(argument_name, argument)

    processor.check_argument_for_proper_class = check  # this instance only, while it is built
    try:
        processor.__init__(
            image_processor=Qwen2VLImageProcessorPil(**settings),
            tokenizer=tokenizer if tokenizer is not None else qwen2_tokenizer(),
            video_processor=BaseVideoProcessor(),
        )
    finally:
        del processor.check_argument_for_proper_class
    return processor


def _edit_processor_from(folder: Path):
    """Qwen-Image-Edit's processor from a pipeline folder's processor/ files: the tokenizer
    there and its image processor's settings (processor_config.json as transformers saves it,
    or an older preprocessor_config.json), its chat templates rendered within bounds
    (`chat_templates.bound`). Raises ValueError or OSError naming what is missing or malformed."""
    from transformers import AutoTokenizer

    from app.core.encoders.chat_templates import bound

    images: Any = None
    combined, older = folder / "processor_config.json", folder / "preprocessor_config.json"
    if combined.is_file():
        images = limits.read_json_object(combined).get("image_processor")
    elif older.is_file():
        images = limits.read_json_object(older)
    if not isinstance(images, dict):
        raise ValueError(f"{folder} has no image processor settings")
    tokenizer = AutoTokenizer.from_pretrained(
        str(folder), local_files_only=True, trust_remote_code=False
    )
    return bound(edit_processor(tokenizer, images), folder)


@dataclass(frozen=True)
class QwenImageFamily(Editing, PipelinePrompts, ShiftedSigmas, Family):
    """Qwen-Image: a Qwen2.5-VL text encoder whose last hidden states (the prompt's tokens
    after its system instruction) condition an MMDiT `transformer` on packed 2x2 patches of a
    16-channel latent, by flow matching with real CFG (a second call on the negative prompt,
    its result rescaled to the prompt's norm); a causal 3D VAE (one frame per image) with a
    per-channel latent mean and spread."""

    takes_step_cache = True

    id = FamilyId("qwenimage")
    title = "Qwen-Image"
    architectures = {
        "qwenimage": "Qwen-Image",
        "qwenimage-edit": "Qwen-Image-Edit",
        "qwenimage-edit-plus": "Qwen-Image-Edit-Plus",
    }
    trainer_words = (
        (r"qwen-?image-?edit", "qwenimage-edit"),
        (r"qwen-?image", "qwenimage"),
    )
    latent = QWENIMAGE_LATENT
    transformer_class = "QwenImageTransformer2DModel"
    layout = LAYOUT
    pipeline_class = "QwenImagePipeline"
    companion_names = {"text_encoder": "qwen_2.5_vl_7b", "vae": "qwen_image_vae"}
    picture_pipelines = {
        Mode.IMAGE: "QwenImageImg2ImgPipeline",
        Mode.INPAINT: "QwenImageInpaintPipeline",
    }
    edit_pipelines = {EDIT_PIPELINE: 1, EDIT_PLUS_PIPELINE: 3}

    def detect_folder(
        self,
        model_index: Mapping[str, Any],
        transformer: Mapping[str, Any],
        scheduler: Mapping[str, Any],
    ) -> Detection:
        if model_index.get("_class_name") in self.edit_pipelines:
            return _detect_edit(model_index, transformer)
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

    def prompt_embeds(self, pipe, text: str, device) -> tuple[Any, Any]:
        return pipe.encode_prompt(
            prompt=text,
            device=device,
            num_images_per_prompt=1,
            max_sequence_length=self.max_sequence_length,
        )

    def folder_parts(self, folder: Path) -> dict[str, Any]:
        """An editing folder's processor, built from its processor/ files (diffusers' own
        loader asks transformers for Qwen2-VL's video processor, which needs torchvision)."""
        if (folder / "processor").is_dir():
            return {"processor": _edit_processor_from(folder / "processor")}
        return {}

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps`, each a call on the prompt and one
        on the empty negative prompt combined by CFG and rescaled to the prompt's norm, as
        QwenImagePipeline runs them; returns the latents (1, 16, h, w)."""
        return self._probe(pipe, conditioning, size, device, timesteps, [])

    def probe_edit(self, pipe, conditioning, size: int, device, timesteps, references) -> Any:
        """As `probe_denoise`, with each reference's packed latents after the noise in the
        transformer's sequence and its shape in `img_shapes`, as the editing pipelines run
        it; only the noise's part of the output steps."""
        return self._probe(pipe, conditioning, size, device, timesteps, references)

    def _probe(self, pipe, conditioning, size: int, device, timesteps, references) -> Any:
        import torch
        from diffusers import QwenImagePipeline

        transformer = pipe.transformer
        side = size // self.latent_factor(pipe)
        channels = transformer.config.in_channels // 4
        generator = torch.Generator().manual_seed(0)
        noise = torch.randn((1, channels, side, side), generator=generator)
        latents = QwenImagePipeline._pack_latents(noise, 1, channels, side, side).to(device)
        shapes = [(1, side // 2, side // 2)]
        packed = []
        for reference in references:
            h, w = reference.shape[-2:]
            packed.append(QwenImagePipeline._pack_latents(reference.float(), 1, channels, h, w))
            shapes.append((1, h // 2, w // 2))
        calls = [
            {
                "encoder_hidden_states": conditioning[prefix + "prompt_embeds"],
                "encoder_hidden_states_mask": conditioning.get(prefix + "prompt_embeds_mask"),
            }
            for prefix in ("", "negative_")
        ]
        tokens = latents.shape[1]
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            t = torch.full([1], sigma, device=device)
            sequence = torch.cat([latents, *packed], dim=1)
            cond, uncond = (
                transformer(
                    hidden_states=sequence,
                    timestep=t,
                    img_shapes=[shapes],
                    **call,
                    return_dict=False,
                )[0].float()[:, :tokens]
                for call in calls
            )
            combined = uncond + PROBE_QWEN_CFG * (cond - uncond)
            scale = cond.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True)
            latents = latents + (following - sigma) * (combined * scale)
        return self.image_latents(pipe, latents, size, size)

    # -- editing ----------------------------------------------------------------------------

    def encode_edit(
        self, pipe, prompt: str, negative: str, device, guidance: bool, references
    ) -> dict[str, Any]:
        """The prompt with the reference pictures, as the editing pipeline encodes them: each
        picture resized as that pipeline resizes it for the vision tower (Edit-Plus: about
        384x384; Edit: about a megapixel), named "Picture n" before the prompt."""
        tensors: dict[str, Any] = {}
        seen = self._condition_pictures(pipe, references)
        texts = [("", prompt)] + ([("negative_", negative)] if guidance else [])
        for prefix, text in texts:
            embeds, mask = pipe.encode_prompt(
                prompt=text,
                image=seen,
                device=device,
                num_images_per_prompt=1,
                max_sequence_length=self.max_sequence_length,
            )
            tensors[prefix + "prompt_embeds"] = embeds
            if mask is not None:
                tensors[prefix + "prompt_embeds_mask"] = mask
        return tensors

    @staticmethod
    def _plus(pipeline) -> bool:
        return type(pipeline).__name__ == EDIT_PLUS_PIPELINE

    def _sizes(self, pipeline, picture, area: int) -> tuple[int, int]:
        """(width, height) of `picture` at `area` pixels in its proportions, in multiples of
        32, by the editing pipeline's own rule."""
        from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

        width, height = picture.size
        return plus.calculate_dimensions(area, width / height)

    def _condition_pictures(self, pipeline, references) -> Any:
        """What the editing pipeline hands its text encoder: Edit-Plus a list of pictures of
        about 384x384, Edit the one picture at about a megapixel."""
        processor = pipeline.image_processor
        if self._plus(pipeline):
            from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
                CONDITION_IMAGE_SIZE,
            )

            seen = []
            for picture in references:
                width, height = self._sizes(pipeline, picture, CONDITION_IMAGE_SIZE)
                seen.append(processor.resize(picture, height, width))
            return seen
        width, height = self._sizes(pipeline, references[0], 1024 * 1024)
        return processor.resize(references[0], height, width)

    def edit_latents_given(self, pipeline) -> bool:
        # Both editing pipelines read the pictures' sizes from PIL images and encode them
        # themselves: HalfSafe watches that encoding with a hook.
        return False

    def edit_pixels(self, pipeline, pictures) -> list[Any]:
        """Each reference as the editing pipeline hands it to the VAE's encoder: at about a
        megapixel in its proportions, in [-1, 1]."""
        processor = pipeline.image_processor
        area = 1024 * 1024  # Edit's, written in its call
        if self._plus(pipeline):
            from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

            area = plus.VAE_IMAGE_SIZE
        pixels = []
        for picture in pictures.references:
            width, height = self._sizes(pipeline, picture, area)
            if not self._plus(pipeline):
                picture = processor.resize(picture, height, width)
            pixels.append(processor.preprocess(picture, height, width))
        return pixels

    def edit_call(
        self, pipeline, embeds: dict[str, Any], batch: int, latents, pictures, size
    ) -> dict[str, Any]:
        # Edit-Plus takes one prompt per call (many images of it with num_images_per_prompt).
        import torch

        prompt = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in embeds.items()}
        references = list(pictures.references)
        return {
            **prompt,
            "image": references if self._plus(pipeline) else references[0],
            "num_images_per_prompt": batch,
        }

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        return patches_problem(self, pipeline, width, height)

    def text_to_image_problem(self, pipeline) -> str | None:
        if self.max_references(pipeline):  # its pipeline reads the picture's size first
            return "this is an editing model: give it the picture to edit."
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
