"""Qwen-Image 2.1: a Qwen3-VL text encoder read through Qwen3-VL's processor, a single-stream
block-causal `transformer` on unpatched 64-channel latent cells, a residual causal VAE (16x, RGBA)
with per-channel latent statistics. The same pipeline draws from the prompt alone and edits
condition pictures: its text encoder sees them, and their latents lead the transformer's
sequence."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.core import limits
from app.core.detection import Detection, pipeline_part_class
from app.core.encoders.qwen3_vl import QWEN3_VL
from app.core.families.base import (
    Family,
    FamilyId,
    GenerationDefaults,
    LatentFormat,
    ShiftedSigmas,
    input_channels_problem,
    patches_problem,
    transformer_width,
)
from app.core.families.capabilities import Editing
from app.core.families.qwenimage21_vae import QWENIMAGE21_VAE
from app.core.families.vl_prompts import PipelinePrompts
from app.core.formats.layouts import (
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

# The VAE's 64 channels, normalised per channel; the preview fits its colours.
QWENIMAGE21_LATENT = LatentFormat(channels=64)
QWENIMAGE21_SIZE = 1024  # QwenImage21Pipeline's `output_resolution`
QWENIMAGE21_CELL = 16  # pixels per latent cell along a side (the pipeline's vae_scale_factor)
# How many condition pictures an edit takes: the model's documented limit (diffusers'
# QwenImage21Pipeline sets none; each picture adds a megapixel's latents to the sequence and its
# vision tokens to the prompt).
QWENIMAGE21_REFERENCES = 10


# Qwen-Image 2.1's own layout (ComfyUI: diffusion_models/qwen_image_2.1*.safetensors) -------
#
# diffusers' names but for each block's SwiGLU: the gate and up projections are one fused
# matrix, `img_mlp.gate_up`, the gate's rows first. Qwen-Image 1's files have per-block
# img_mod/txt_mod and a txt_norm, none of which 2.1 has (its modulation is one shared
# projection, its text goes through txt_in.text_norm).

_QWENIMAGE21_MARKERS = (
    "txt_in.text_norm.weight",
    "modulation.1.weight",
    "transformer_blocks.0.img_mlp.gate_up.weight",
)


def _read_qwenimage21(shapes: Shapes, prefix: str) -> SplitModel:
    w = reader(shapes, prefix)
    inner, in_channels = w("img_in.weight", 2)
    head = w("transformer_blocks.0.attn.norm_q.weight", 1)[0]
    if head < 16 or inner % head or head % 16:
        raise ValueError(f"its blocks ({inner} wide, {head}-wide heads) are not Qwen-Image 2.1's")
    fused = w("transformer_blocks.0.img_mlp.gate_up.weight", 2)[0]
    if fused % (2 * inner):
        raise ValueError(f"its feed-forward ({fused} rows) is not a whole multiple of {inner}")
    config = {
        "_class_name": "QwenImage21Transformer2DModel",
        "patch_size": 1,
        "in_channels": in_channels,
        "out_channels": w("proj_out.weight", 2)[0],
        "num_layers": count_indices(shapes, prefix + "transformer_blocks."),
        "attention_head_dim": head,
        "num_attention_heads": inner // head,
        "context_in_dim": w("txt_in.text_norm.weight", 1)[0],
        "mlp_ratio": fused // (2 * inner),
        # Rotary axes (frame, height, width) in Qwen-Image 2.1's proportions: 16, 56, 56 of 128.
        "axes_dims_rope": [head // 8, 7 * head // 16, 7 * head // 16],
        "causal_condition": True,  # its text modulated as at t = 0, which no tensor records
    }
    # Two sizes the shared transformer limits do not name: the text's width, the SwiGLU's.
    bounded(
        ("text width", config["context_in_dim"], limits.MAX_WIDTH),
        ("feed-forward width", fused // 2, limits.MAX_WIDTH),
    )
    within_limits(config)
    text_width = config["context_in_dim"]
    return SplitModel(
        table=_qwenimage21_table,
        layout="qwenimage21",
        title="Qwen-Image 2.1",
        prefix=prefix,
        config=config,
        architecture="qwenimage21",
        because=(
            f"Qwen-Image 2.1: a single-stream block-causal transformer file ({prefix}"
            f"transformer_blocks with fused img_mlp.gate_up, one shared modulation, "
            f"txt_in.text_norm) with {config['num_layers']} blocks, {inner} wide, on "
            f"{in_channels}-channel latent cells, reading {text_width}-wide Qwen3-VL hidden "
            "states; flow matching."
        ),
        needs=(
            Need(
                "text_encoder",
                QWEN3_VL,
                "its Qwen3-VL text encoder (qwen_3_vl_8b)",
                lambda width: width == text_width,
                ("qwen_3_vl", "qwen3_vl", "qwen3-vl", "qwen_3-vl", "qwen3vl"),
                reads="8b",
            ),
            Need(
                "vae",
                QWENIMAGE21_VAE,
                "its VAE (qwen_image_2.1_vae)",
                lambda c: c == in_channels,
                ("qwen_image_2", "qwen_image2", "qwenimage2", "qwen"),
            ),
        ),
        pipeline_class="QwenImage21Pipeline",
        configs="qwenimage21",
        scheduler={},
        native_size=QWENIMAGE21_SIZE,
        latent_channels=in_channels,
    )


def _qwenimage21_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Qwen-Image 2.1's original names <-> diffusers' QwenImage21Transformer2DModel names: the
    same but for each block's fused gate_up (gate rows, then up rows). No tensor has a bias."""
    names = [
        "time_text_embed.timestep_embedder.linear_1",
        "time_text_embed.timestep_embedder.linear_2",
        "txt_in.text_norm",
        "txt_in.in_layer",
        "txt_in.out_layer",
        "img_in",
        "modulation.1",
    ]
    for i in range(config["num_layers"]):
        b = f"transformer_blocks.{i}."
        names += [
            b + name
            for name in (
                "attn.to_q",
                "attn.to_k",
                "attn.to_v",
                "attn.to_out.0",
                "attn.norm_q",
                "attn.norm_k",
                "img_mlp.out",
            )
        ]
    names += ["norm_out.linear", "proj_out"]
    for name in names:
        yield f"{name}.weight", (f"{name}.weight",), "same"
    for i in range(config["num_layers"]):
        mlp = f"transformer_blocks.{i}.img_mlp."
        yield mlp + "gate_up.weight", (mlp + "gate_layer.weight", mlp + "proj.weight"), "cat"


# Qwen-Image 2.1 Turbo: the accelerated checkpoint, its weights named and shaped as the base
# model's. diffusers 0.42.1 runs it (QwenImage21TurboModularPipeline) with the base model's
# schedule in 8 steps by default, without guidance: 8 steps at CFG scale 1 here. Only a file's
# name tells it.
TURBO = "qwenimage21-turbo"
TURBO_DEFAULTS = GenerationDefaults(8, 1.0, "Qwen-Image 2.1 Turbo's")


def _named_qwenimage21(model: SplitModel, file_name: str) -> SplitModel:
    """Turbo where the file's name says so ("qwen_image_2.1_turbo_int8_convrot"): nothing in
    its weights tells it from the base model."""
    stem = file_name.lower().rsplit(".", 1)[0]
    if "turbo" not in re.sub(r"[^a-z0-9]+", " ", stem).split():
        return model
    what = model.because.removeprefix("Qwen-Image 2.1: ")
    because = (
        "Qwen-Image 2.1 Turbo, as the file's name says (its weights have the base model's "
        f"names and shapes; {TURBO_DEFAULTS.words()}): {what}"
    )
    return replace(model, architecture=TURBO, title="Qwen-Image 2.1 Turbo", because=because)


LAYOUT = Layout(
    "Qwen-Image 2.1-style transformer",
    _QWENIMAGE21_MARKERS,
    (),
    _read_qwenimage21,
    _qwenimage21_table,
    _named_qwenimage21,
)


@dataclass(frozen=True)
class QwenImage21Family(Editing, PipelinePrompts, ShiftedSigmas, Family):
    """Qwen-Image 2.1: a Qwen3-VL text encoder whose last layer's hidden states before its final
    norm (the prompt's tokens after its system instruction, in Qwen3-VL's chat format) condition
    a single-stream `transformer`. Text and image share one sequence, causal over the text and
    bidirectional inside the image; each 2x2 group of latent cells takes one slot of the text
    encoder's sequence, and the text's tokens are modulated as at t = 0, which lets the pipeline
    keep their keys and values after the first step (`use_kv_cache`: HalfSafe's prompt cache,
    off unless asked, see `prompt_cache_arguments`). Flow matching on the
    64-channel cells of a 16x VAE, sigmas shifted by the image's sequence length, or the model's
    own `sample_sigmas` where its folder sets them. Real CFG is optional (`true_cfg_scale`, 1:
    none, the model's default): the negative prompt's prediction is not rescaled. Every block
    clips its fp16 output to +-65504, so an overflow there comes out finite and wrong."""

    id = FamilyId("qwenimage21")
    title = "Qwen-Image 2.1"
    architectures = {"qwenimage21": "Qwen-Image 2.1", TURBO: "Qwen-Image 2.1 Turbo"}
    trainer_words = (
        (r"qwen-?image-?2-?1-?turbo", TURBO),
        (r"qwen-?image-?2-?1", "qwenimage21"),
    )
    latent = QWENIMAGE21_LATENT
    transformer_class = "QwenImage21Transformer2DModel"
    layout = LAYOUT
    pipeline_class = "QwenImage21Pipeline"
    takes_prompt_cache = True  # the pipeline's `use_kv_cache` (`prompt_cache_arguments`)
    # The one pipeline also edits: a picture given alone is a condition picture.
    edit_pipelines = {"QwenImage21Pipeline": QWENIMAGE21_REFERENCES}
    companion_names = {"text_encoder": "qwen_3_vl_8b", "vae": "qwen_image_2.1_vae"}

    def detect_folder(
        self,
        model_index: Mapping[str, Any],
        transformer: Mapping[str, Any],
        scheduler: Mapping[str, Any],
    ) -> Detection:
        sigmas = model_index.get("sample_sigmas")
        schedule = (
            f"its own {len(sigmas)}-step sigmas"
            if isinstance(sigmas, list) and sigmas
            else "sigmas shifted by the image's size"
        )
        because = (
            f"Qwen-Image 2.1: its QwenImage21Pipeline has a single-stream block-causal "
            f"QwenImage21Transformer2DModel with {transformer.get('num_layers')} blocks, "
            f"{transformer_width(transformer)} wide, on {transformer.get('in_channels', 64)}-"
            f"channel latent cells, a Qwen3-VL text encoder "
            f"({pipeline_part_class(model_index, 'text_encoder')}) whose "
            f"{transformer.get('context_in_dim')}-wide hidden states it reads, and a 16x VAE; "
            f"flow matching with {schedule}."
        )
        return Detection(
            "qwenimage21",
            True,
            "a Qwen-Image 2.1 pipeline",
            because,
            "flow",
            QWENIMAGE21_SIZE,
            None,
            "QwenImage21Pipeline",
        )

    def generation_defaults(self, architecture: str) -> GenerationDefaults | None:
        return TURBO_DEFAULTS if architecture == TURBO else None

    def folder_parts(self, folder: Path) -> dict[str, Any]:
        """Its processor, built from the folder's processor/ files (diffusers' own loader asks
        transformers for Qwen3-VL's video processor, which needs torchvision)."""
        return {"processor": processor_from_folder(folder / "processor")}

    denoiser: str = "transformer"
    sample_argument: str = "hidden_states"

    def latent_factor(self, pipeline) -> int:
        return 2 ** (len(pipeline.vae.config.dim_mult) - 1)

    def prompt_embeds(self, pipe, text: str, device) -> tuple[Any, Any]:
        embeds, mask, _ = pipe.encode_prompt(prompt=text, device=device, num_images_per_prompt=1)
        return embeds, mask

    def denoiser_inputs(
        self,
        conditioning: dict[str, Any],
        size: int,
        device,
        prefix: str = "",
        references: tuple[tuple[int, int], ...] = (),
    ) -> dict[str, Any]:
        """One transformer call on a `size`-px square picture for one prompt (`prefix`
        "negative_" for the negative one): the prompt's hidden states and mask, the grids of
        the condition pictures (`references`: each one's latent (height, width)) and of the
        picture, and which slots of the joint sequence are pictures' (the prompt's vision
        tokens where an edit's encoder read pictures, then one per 2x2 cells of the picture
        drawn, as QwenImage21Pipeline appends them)."""
        import torch

        embeds = conditioning[prefix + "prompt_embeds"]
        side = size // QWENIMAGE21_CELL
        text = conditioning.get(prefix + "image_pad_mask")
        if text is None:  # from the prompt alone: no slot of the text is a picture's
            text = torch.zeros(embeds.shape[:2], dtype=torch.bool, device=embeds.device)
        slots = torch.ones(embeds.shape[0], side * side // 4, dtype=torch.bool, device=device)
        grids = [(1, h, w) for h, w in references] + [(1, side, side)]
        return {
            "encoder_hidden_states": embeds,
            "encoder_hidden_states_mask": conditioning.get(prefix + "prompt_embeds_mask"),
            "img_shapes": [grids] * embeds.shape[0],
            "img_mask": torch.cat([text.to(device), slots], dim=1),
        }

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps`, each a transformer call on the prompt
        and one on the negative prompt (the whole joint sequence each time: the text's tokens
        are checked at every step), stepped with the prompt's prediction as the model samples
        by default (no CFG); returns the latents (1, 64, h, w)."""
        return self._probe(pipe, conditioning, size, device, timesteps, [])

    def probe_edit(self, pipe, conditioning, size: int, device, timesteps, references) -> Any:
        """As `probe_denoise`, with each condition picture's latents (as `encode_pixels` makes
        them) flattened into cells ahead of the noise in the transformer's sequence, its grid
        in `img_shapes`, as QwenImage21Pipeline runs an edit; only the noise's part of the
        output steps."""
        return self._probe(pipe, conditioning, size, device, timesteps, references)

    def _probe(self, pipe, conditioning, size: int, device, timesteps, references) -> Any:
        import torch
        from diffusers import QwenImage21Pipeline

        transformer = pipe.transformer
        side = size // self.latent_factor(pipe)
        channels = transformer.config.in_channels
        generator = torch.Generator().manual_seed(0)
        noise = torch.randn((1, 1, channels, side, side), generator=generator)
        latents = QwenImage21Pipeline._pack_latents(noise, 1, channels, side, side).to(device)
        cells = latents.shape[1]
        grids = tuple((int(r.shape[-2]), int(r.shape[-1])) for r in references)
        leading = [
            QwenImage21Pipeline._pack_latents(r.to(device).float(), 1, channels, h, w)
            for r, (h, w) in zip(references, grids, strict=True)
        ]
        calls = [
            self.denoiser_inputs(conditioning, size, device, prefix, grids)
            for prefix in ("", "negative_")
        ]
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            t = torch.full([1], sigma, device=device)
            sequence = torch.cat([*leading, latents], dim=1)
            cond, _ = (
                transformer(hidden_states=sequence, timestep=t, **call, return_dict=False)[0][
                    :, -cells:
                ].float()
                for call in calls
            )
            latents = latents + (following - sigma) * cond
        return self.image_latents(pipe, latents, size, size)

    # -- editing: condition pictures, read by the text encoder and the VAE -------------------

    def _as_read(self, picture):
        """A condition picture as QwenImage21Pipeline reads it: in RGBA (opaque where it had
        no alpha), and the (width, height) of about a megapixel in its proportions, in whole
        cells, that it is resized to for both the text encoder and the VAE."""
        from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_dimensions

        rgba = picture if picture.mode == "RGBA" else picture.convert("RGBA")
        area = QWENIMAGE21_SIZE * QWENIMAGE21_SIZE
        width, height, _ = calculate_dimensions(area, rgba.size[0] / rgba.size[1])
        return rgba, (width, height)

    def encode_edit(
        self, pipe, prompt: str, negative: str, device, guidance: bool, references
    ) -> dict[str, Any]:
        """The prompt with the condition pictures, as the pipeline encodes them: each picture
        resized as it resizes them, named "<image n>" in Qwen3-VL's chat template, its vision
        tokens in the prompt's hidden states; `image_pad_mask` says which of those tokens are
        the pictures' (the transformer's joint sequence needs it)."""
        seen = []
        for picture in references:
            rgba, (width, height) = self._as_read(picture)
            seen.append(pipe.image_processor.resize(rgba, width=width, height=height))
        tensors: dict[str, Any] = {}
        texts = [("", prompt)] + ([("negative_", negative)] if guidance else [])
        for prefix, text in texts:
            embeds, mask, pads = pipe.encode_prompt(
                prompt=text, image=seen, device=device, num_images_per_prompt=1
            )
            tensors[prefix + "prompt_embeds"] = embeds
            if mask is not None:  # None: every token counts
                tensors[prefix + "prompt_embeds_mask"] = mask
            tensors[prefix + "image_pad_mask"] = pads
        return tensors

    def edit_latents_given(self, pipeline) -> bool:
        # QwenImage21Pipeline takes condition pictures as pictures only (its text encoder must
        # see them) and encodes them itself: HalfSafe watches that encoding with a hook.
        return False

    def edit_pixels(self, pipeline, pictures) -> list[Any]:
        """Each condition picture as the pipeline hands it to the VAE's encoder: RGBA at about
        a megapixel in its proportions, in [-1, 1], (1, 4, H, W)."""
        pixels = []
        for picture in pictures.references:
            rgba, (width, height) = self._as_read(picture)
            pixels.append(pipeline.image_processor.preprocess(rgba, width=width, height=height))
        return pixels

    def probed_references(self, pipeline, pictures) -> list[Any]:
        # Each picture's vision tokens in the prompt stand for its latent cells in the
        # transformer's sequence (a slot per 2x2 cells): the check reads the pictures at the
        # size its text encoder saw them, as the pipeline does.
        return self.edit_pixels(pipeline, pictures)

    def edit_call(
        self, pipeline, embeds: dict[str, Any], batch: int, latents, pictures, size
    ) -> dict[str, Any]:
        """The prompt as the watched stage encoded it, and the pictures. The pipeline's call
        takes no `image_pad_mask`, and refuses encoded prompts beside pictures without one, so
        this job's pipeline (the stage's own copy) is handed its encoding instead of making
        it again: its `encode_prompt` gives back each prompt's tensors with their mask."""
        prompts = {k: v for k, v in embeds.items() if not k.endswith("image_pad_mask")}
        given = self.pipeline_embeds(prompts, batch)
        pads = {
            id(given[prefix + "prompt_embeds"]): embeds[prefix + "image_pad_mask"]
            for prefix in ("", "negative_")
            if prefix + "prompt_embeds" in given
        }
        object.__setattr__(pipeline, "encode_prompt", _EncodedPrompt(pipeline, pads))
        # The size it reads the pictures at, named: the one `_as_read` reads them at.
        return {
            **given,
            "image": list(pictures.references),
            "output_resolution": QWENIMAGE21_SIZE,
        }

    def encode_pixels(self, vae, pixels):
        """A condition picture (1, 4, H, W) as one frame through the VAE's encoder, the mode
        of its distribution normalised per channel as the pipeline does (and `decode` undoes)."""
        import torch

        z = vae.encode(pixels.to(vae.dtype).unsqueeze(2)).latent_dist.mode()[:, :, 0]
        channels = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, device=z.device).view(1, channels, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=z.device).view(1, channels, 1, 1)
        return (z.float() - mean) / std

    def _sigmas(self, pipeline, steps: int, size: int) -> list[float]:
        """The sigmas QwenImage21Pipeline runs: its folder's `sample_sigmas` where set (their
        count is then the number of steps), else linear from 1 to 1/steps; shifted by the
        number of latent cells (not of 2x2 patches, as the other families count)."""
        import numpy as np
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        scheduler = self.make_scheduler("euler", pipeline, None)
        config = scheduler.config
        side = size // self.latent_factor(pipeline)
        mu = calculate_shift(
            side * side,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        own = getattr(pipeline.config, "sample_sigmas", None)
        sigmas = list(own) if own else np.linspace(1.0, 1 / steps, steps).tolist()
        scheduler.set_timesteps(sigmas=sigmas, mu=mu)
        return [float(s) for s in scheduler.sigmas[:-1]]

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        return patches_problem(self, pipeline, width, height)

    def text_to_image_problem(self, pipeline) -> str | None:
        return input_channels_problem(pipeline, "z_dim", 1)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        """Seeded noise per image with the pipeline's frame axis of one, flattened into
        (1, cells, 64) as QwenImage21Pipeline packs it."""
        import torch
        from diffusers import QwenImage21Pipeline

        factor = self.latent_factor(pipeline)
        channels = pipeline.transformer.config.in_channels
        h, w = 2 * (height // (factor * 2)), 2 * (width // (factor * 2))
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        pack = QwenImage21Pipeline._pack_latents
        packed = [
            pack(torch.randn((1, 1, channels, h, w), generator=g), 1, channels, h, w)
            for g in generators
        ]
        return torch.cat(packed), generators

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        # Real CFG when a negative prompt is given (cfg > 1).
        return {"true_cfg_scale": cfg}

    def prompt_cache_arguments(self, on: bool) -> dict[str, Any]:
        # The pipeline's key/value cache of the text (and reference pictures): kept at the first
        # step, reused by every later one, only where the transformer's `causal_condition` makes
        # them the same at every step (the pipeline checks). Off, every step runs the whole
        # joint sequence; the text is a few hundred tokens beside the picture's thousands, so
        # the cache saves a few percent of a step. A NaN it holds repeats in every later step:
        # an image that goes non-finite with it on is made again without it (`repair`), and the
        # NaN watch keeps a failing call without the cache, which it re-runs computing them.
        return {"use_kv_cache": on}

    def image_latents(self, pipeline, latents, height: int, width: int):
        from diffusers import QwenImage21Pipeline

        factor = self.latent_factor(pipeline)
        frames = QwenImage21Pipeline._unpack_latents(latents, height, width, factor)
        return frames[:, :, 0]  # (B, C, h, w): the one frame

    def clamped_blocks(self, denoiser) -> list[Any]:
        # diffusers clips each block's fp16 output to +-65504.
        return list(denoiser.transformer_blocks)

    def decode(self, vae, latents):
        """Undo the per-channel normalisation and decode the one frame: (B, 4, H, W), RGBA in
        [-1, 1] as the VAE makes it (the alpha is saved with the picture)."""
        import torch

        channels = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, device=latents.device).view(1, channels, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=latents.device).view(1, channels, 1, 1)
        z = (latents.float() * std + mean).unsqueeze(2)
        return vae.decode(z.to(vae.dtype)).sample[:, :, 0]


class _EncodedPrompt:
    """A stand-in for a QwenImage21Pipeline's `encode_prompt` that hands back prompts already
    encoded with their pictures (keyed by the tensor the call passes), with the mask of which
    tokens are the pictures'."""

    def __init__(self, pipeline, pads: dict[int, Any]) -> None:
        self._encode = type(pipeline).encode_prompt.__get__(pipeline)
        self._pads = pads

    def __call__(self, *, prompt_embeds=None, image=None, **options):
        pads = self._pads.get(id(prompt_embeds))
        if pads is None:  # not one of this job's prompts: as the pipeline would
            return self._encode(prompt_embeds=prompt_embeds, image=image, **options)
        return self._encode(prompt_embeds=prompt_embeds, image_pad_mask=pads, **options)


def processor_from_folder(folder: Path):
    """Qwen3-VL's processor from a pipeline folder's processor/ files: the tokenizer there, its
    image processor's settings (processor_config.json as transformers saves it, or an older
    preprocessor_config.json) and its chat template (chat_template.jinja or .json), which it
    renders within bounds (`chat_templates.bound`: a hostile one is refused naming its file).
    Raises ValueError or OSError naming what is missing or malformed."""
    from transformers import AutoTokenizer

    from app.core.encoders.chat_templates import bound
    from app.core.encoders.tokenizers import qwen3_vl_processor

    images: Any = None
    combined, older = folder / "processor_config.json", folder / "preprocessor_config.json"
    if combined.is_file():
        images = limits.read_json_object(combined).get("image_processor")
    elif older.is_file():
        images = limits.read_json_object(older)
    if not isinstance(images, dict):
        raise ValueError(f"{folder} has no image processor settings")
    template = None
    if (folder / "chat_template.jinja").is_file():
        raw = limits.read_regular(folder / "chat_template.jinja", limits.MAX_CONFIG_BYTES)
        template = raw.decode("utf-8")
    elif (folder / "chat_template.json").is_file():
        template = limits.read_json_object(folder / "chat_template.json").get("chat_template")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"the chat template in {folder} is not text")
    tokenizer = AutoTokenizer.from_pretrained(
        str(folder), local_files_only=True, trust_remote_code=False
    )
    return bound(qwen3_vl_processor(tokenizer, images, template), folder)
