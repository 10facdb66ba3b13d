"""Z-Image (Turbo and Base): a Qwen3 text encoder, a single-stream `transformer` that takes lists,
Flux's 16-channel VAE. Turbo and Base are told apart by their schedulers (a folder) or a file's
name; each has its own steps and CFG scale."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.core import limits
from app.core.detection import Detection, pipeline_part_class
from app.core.encoders.qwen3 import QWEN3
from app.core.encoders.vaes import VAE
from app.core.families.base import (
    Family,
    FamilyId,
    GenerationDefaults,
    ShiftedSigmas,
    input_channels_problem,
    patches_problem,
    prompt_tensors,
)
from app.core.families.flux import FLUX_LATENT
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
from app.core.images.pictures import Mode

# Turbo and Base -----------------------------------------------------------------------------

# Z-Image Turbo (distilled: few steps, no CFG) and Z-Image Base (the undistilled model, with CFG)
# share every weight's name and shape, their transformer configs and model_index.json. What
# differs in their released folders is the scheduler: Base shifts the flow-matching sigmas by 6
# (Tongyi-MAI/Z-Image's scheduler_config.json), Turbo by 3 (Tongyi-MAI/Z-Image-Turbo's).
TURBO = "zimage-turbo"
BASE = "zimage-base"
LEGACY = "zimage"  # both models' name before they were told apart: saved state is keyed by it
TURBO_SHIFT = 3.0
BASE_SHIFT = 6.0
# Turbo: 9 steps without CFG, as diffusers' Z-Image Turbo example runs it (guidance 0: CFG 1).
TURBO_DEFAULTS = GenerationDefaults(9, 1.0, "Z-Image Turbo's")
# Base: CFG 4, the model card's (it recommends 3 to 5) and Civitai's; 28 steps, the fewest the
# card recommends (28 to 50; Civitai's default is 20).
BASE_DEFAULTS = GenerationDefaults(28, 4.0, "Z-Image Base's")
_TITLES = {TURBO: "Z-Image Turbo", BASE: "Z-Image Base"}


def shift_variant(shift: float) -> str:
    """Turbo or Base by the scheduler's shift: the one whose released shift is nearer."""
    return BASE if shift > (TURBO_SHIFT + BASE_SHIFT) / 2 else TURBO


def _scheduler_shift(scheduler: Mapping[str, Any]) -> float | None:
    """The shift a scheduler config states (FlowMatchEulerDiscreteScheduler's default 1 where
    it names none); None without a config, or with a shift that is no number."""
    if not scheduler:
        return None
    shift = scheduler.get("shift", 1.0)
    if isinstance(shift, bool) or not isinstance(shift, (int, float)):
        return None
    return float(shift)


def variant(pipeline) -> str:
    """Whether a loaded Z-Image pipeline is Turbo or Base, by its scheduler's shift: the one
    thing that tells them apart in a folder, and what a transformer file is built with."""
    shift = _scheduler_shift(dict(pipeline.scheduler.config))
    return shift_variant(shift) if shift is not None else TURBO


def _name_says(file_name: str) -> str | None:
    """Turbo or Base as a file's name says it ("z_image_turbo_bf16", "zimage-base-fp8"), None
    where it says neither."""
    stem = file_name.lower().rsplit(".", 1)[0]
    words = set(re.sub(r"[^a-z0-9]+", " ", stem.replace("zimage", "zimage ")).split())
    if "turbo" in words:
        return TURBO
    if "base" in words:
        return BASE
    return None


# Z-Image's original layout (ComfyUI: diffusion_models/z_image_turbo_bf16.safetensors) ------


_ZIMAGE_MARKERS = (
    "layers.0.attention.qkv.weight",
    "cap_embedder.1.weight",
    "noise_refiner.0.attention.qkv.weight",
)
# Rotary table lengths (frame/caption index, height, width), which no tensor records: room for
# Z-Image's 512 caption tokens and 1024 patches a side, as its released config allows.
ZIMAGE_AXES_LENS = (1536, 512, 512)


def _read_zimage(shapes: Shapes, prefix: str) -> SplitModel:
    w = reader(shapes, prefix)
    dim, patch_values = w("x_embedder.weight", 2)
    head = w("layers.0.attention.q_norm.weight", 1)[0]
    rows = w("layers.0.attention.qkv.weight", 2)[0]
    if patch_values % 4 or head < 8 or dim % head or head % 8:
        raise ValueError(f"its blocks ({dim} wide, {head}-wide heads) are not Z-Image's")
    heads = dim // head
    kv_heads, rest = divmod(rows // head - heads, 2)
    if rows % head or rest or kv_heads < 1:
        raise ValueError(f"its fused attention ({rows} rows) does not split into {heads} heads")
    layers = count_indices(shapes, prefix + "layers.")
    refiners = count_indices(shapes, prefix + "noise_refiner.")
    latent = patch_values // 4
    bounded(
        ("number of blocks", layers, limits.MAX_TRANSFORMER_DEPTH),
        ("number of refiner blocks", refiners, limits.MAX_TRANSFORMER_DEPTH),
        ("width", dim, limits.MAX_TRANSFORMER_WIDTH),
        ("number of attention heads", heads, limits.MAX_HEADS),
        ("number of latent channels", latent, limits.MAX_IMAGE_CHANNELS),
    )
    config = {
        "_class_name": "ZImageTransformer2DModel",
        "all_patch_size": [2],
        "all_f_patch_size": [1],
        "in_channels": latent,
        "dim": dim,
        "n_layers": layers,
        "n_refiner_layers": refiners,
        "n_heads": heads,
        "n_kv_heads": kv_heads,
        "qk_norm": True,
        "cap_feat_dim": w("cap_embedder.1.weight", 2)[1],
        # Rotary axes (frame, height, width) in Z-Image's proportions: 32, 48, 48 of 128.
        "axes_dims": [head // 4, 3 * head // 8, 3 * head // 8],
        "axes_lens": list(ZIMAGE_AXES_LENS),
    }
    within_limits(config)
    text_width = config["cap_feat_dim"]
    return SplitModel(
        table=_zimage_table,
        layout="zimage",
        title="Z-Image",
        prefix=prefix,
        config=config,
        architecture=TURBO,
        because=(
            f"Z-Image Turbo: a single-stream transformer in its original layout ({prefix}layers, "
            f"noise_refiner, context_refiner, cap_embedder) with {layers} main and "
            f"{refiners}+{refiners} refiner blocks, {dim} wide, on {latent}-channel latents in "
            f"2x2 patches, reading {text_width}-wide Qwen3 hidden states; flow matching; {_UNTOLD}"
        ),
        needs=(
            Need(
                "text_encoder",
                QWEN3,
                "its Qwen3 text encoder (qwen_3_4b)",
                lambda width: width == text_width,
                ("qwen_3", "qwen3"),
            ),
            Need(
                "vae",
                VAE,
                f"its {latent}-channel VAE (Flux's ae)",
                lambda c: c == latent,
                ("ae", "flux"),
            ),
        ),
        pipeline_class="ZImagePipeline",
        configs="flux",  # Flux.1's VAE; the schedule as Z-Image Turbo's: a fixed shift of 3
        scheduler={"use_dynamic_shifting": False, "shift": TURBO_SHIFT},
        latent_channels=latent,
    )


# What a transformer file's detection says when its name tells neither model.
_UNTOLD = (
    "nothing in such a file tells Turbo from Base (their weights have the same names and "
    "shapes) and its name says neither, so it is read as Turbo, as InvokeAI registers such "
    "files (a file named for Base, z_image_base_bf16, is read as Base)."
)


def _named_zimage(model: SplitModel, file_name: str) -> SplitModel:
    """Turbo or Base as the file's name says (its weights cannot tell): Base samples with its
    own scheduler shift, 6."""
    said = _name_says(file_name)
    if said is None:
        return model
    what = model.because.removeprefix("Z-Image Turbo: ").removesuffix("; " + _UNTOLD) + "."
    because = (
        f"{_TITLES[said]}, as the file's name says (nothing in the file tells Turbo from Base: "
        f"their weights have the same names and shapes): {what}"
    )
    if said == TURBO:
        return replace(model, because=because)
    return replace(
        model,
        architecture=BASE,
        because=because,
        scheduler={**model.scheduler, "shift": BASE_SHIFT},
    )


def _zimage_block(b: str, modulated: bool) -> Iterator[Row]:
    parts = tuple(f"{b}attention.to_{x}.weight" for x in "qkv")
    yield b + "attention.qkv.weight", parts, "cat"
    yield b + "attention.out.weight", (b + "attention.to_out.0.weight",), "same"
    yield b + "attention.q_norm.weight", (b + "attention.norm_q.weight",), "same"
    yield b + "attention.k_norm.weight", (b + "attention.norm_k.weight",), "same"
    for name in (
        "feed_forward.w1",
        "feed_forward.w2",
        "feed_forward.w3",
        "attention_norm1",
        "ffn_norm1",
        "attention_norm2",
        "ffn_norm2",
    ):
        yield f"{b}{name}.weight", (f"{b}{name}.weight",), "same"
    if modulated:  # the context refiner has no timestep modulation
        yield from linear(b + "adaLN_modulation.0", b + "adaLN_modulation.0")


def _zimage_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Z-Image's original names <-> diffusers' ZImageTransformer2DModel names: the attention's
    fused qkv (no bias), its out and q/k norms renamed, the patch embedder and final layer
    under the (2x2 patch, 1 frame) key diffusers keeps them by."""
    for name in ("x_pad_token", "cap_pad_token", "cap_embedder.0.weight"):
        yield name, (name,), "same"
    yield from linear("cap_embedder.1", "cap_embedder.1")
    yield from linear("t_embedder.mlp.0", "t_embedder.mlp.0")
    yield from linear("t_embedder.mlp.2", "t_embedder.mlp.2")
    yield from linear("x_embedder", "all_x_embedder.2-1")
    yield from linear("final_layer.linear", "all_final_layer.2-1.linear")
    yield from linear("final_layer.adaLN_modulation.1", "all_final_layer.2-1.adaLN_modulation.1")
    for i in range(config["n_refiner_layers"]):
        yield from _zimage_block(f"noise_refiner.{i}.", modulated=True)
        yield from _zimage_block(f"context_refiner.{i}.", modulated=False)
    for i in range(config["n_layers"]):
        yield from _zimage_block(f"layers.{i}.", modulated=True)


LAYOUT = Layout(
    "Z-Image-style transformer",
    _ZIMAGE_MARKERS,
    (),
    _read_zimage,
    _zimage_table,
    _named_zimage,
)


@dataclass(frozen=True)
class ZImageFamily(ShiftedSigmas, Family):
    """Z-Image (Turbo and Base): a Qwen3 text encoder whose second-to-last hidden states, the
    prompt's tokens only in the chat format, condition a single-stream `transformer` (refiner
    blocks for the noise and the caption, then joint blocks) on 2x2 patches of Flux's
    16-channel latent, by flow matching. The transformer takes lists (one latent and one
    caption per image) and predicts the negative velocity. CFG is optional: Turbo samples
    without it (CFG scale 1), Base with it (CFG 4); the pipeline's `guidance_scale` is the
    user's CFG scale minus 1 (prompt + s x (prompt - negative))."""

    id = FamilyId("zimage")
    title = "Z-Image"
    # The family's own name first: the one saved state and records written before Turbo and
    # Base were told apart name both by; read back, it is a Z-Image of either kind.
    architectures = {LEGACY: "Z-Image", TURBO: _TITLES[TURBO], BASE: _TITLES[BASE]}
    trainer_words = (
        (r"z-?image-?turbo", TURBO),
        (r"z-?image-?base", BASE),
        (r"z-?image", LEGACY),
    )
    latent = FLUX_LATENT
    transformer_class = "ZImageTransformer2DModel"
    layout = LAYOUT
    pipeline_class = "ZImagePipeline"
    companion_names = {"text_encoder": "qwen_3_4b", "vae": "ae"}
    # Not inpainting: diffusers 0.42.1's ZImageInpaintPipeline encodes the picture it is given
    # again whatever it is, so it cannot take the watched encoder's latents.
    picture_pipelines = {Mode.IMAGE: "ZImageImg2ImgPipeline"}

    def detect_folder(
        self,
        model_index: Mapping[str, Any],
        transformer: Mapping[str, Any],
        scheduler: Mapping[str, Any],
    ) -> Detection:
        shift = _scheduler_shift(scheduler)
        which = shift_variant(shift) if shift is not None else TURBO
        if shift is None:
            told = (
                "its scheduler config, the one thing that tells Turbo from Base, is missing or "
                "states no shift it can be read by, so it is read as Turbo"
            )
        else:
            released = shift in (TURBO_SHIFT, BASE_SHIFT)
            told = (
                f"its scheduler shifts the schedule by {shift:g}, "
                f"{'as' if released else 'nearer'} {_TITLES[which]}'s "
                f"{'does' if released else 'than the other'} (Turbo's by {TURBO_SHIFT:g}, "
                f"Base's by {BASE_SHIFT:g}; nothing else in the folder tells them apart)"
            )
        because = (
            f"{_TITLES[which]}: its ZImagePipeline has a single-stream ZImageTransformer2DModel "
            f"with {transformer.get('n_layers')} main and {transformer.get('n_refiner_layers')}+"
            f"{transformer.get('n_refiner_layers')} refiner blocks, {transformer.get('dim')} wide, "
            f"on {transformer.get('in_channels', 16)}-channel latents in 2x2 patches, and a Qwen3 "
            f"text encoder ({pipeline_part_class(model_index, 'text_encoder')}) whose "
            f"{transformer.get('cap_feat_dim')}-wide hidden states it reads; flow matching; "
            f"{told}."
        )
        return Detection(
            which,
            True,
            f"a {_TITLES[which]} pipeline",
            because,
            "flow",
            1024,
            None,
            "ZImagePipeline",
        )

    def generation_defaults(self, architecture: str) -> GenerationDefaults | None:
        # The old name says neither model: the saved settings apply.
        return {TURBO: TURBO_DEFAULTS, BASE: BASE_DEFAULTS}.get(architecture)

    def profile_name(self, architecture: str) -> str:
        # Fixes and reports saved before Turbo and Base were told apart are keyed by "zimage".
        return LEGACY if architecture in self.architectures else architecture

    denoiser: str = "transformer"
    sample_argument: str = "x"
    timestep_argument: str = "t"
    max_sequence_length: int = 512  # Qwen3 tokens, the reference pipeline's default

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        embeds, negative_embeds = pipe.encode_prompt(
            prompt=prompt,
            device=device,
            do_classifier_free_guidance=guidance,
            negative_prompt=negative,
            max_sequence_length=self.max_sequence_length,
        )
        # Each a list of (tokens, width), one per prompt: kept as (1, tokens, width) tensors.
        tensors = {"prompt_embeds": embeds[0][None]}
        if negative_embeds:
            tensors["negative_prompt_embeds"] = negative_embeds[0][None]
        return tensors

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        return {"text_encoder": prompt_tensors(tensors)}

    def pipeline_embeds(self, embeds: dict[str, Any], batch: int) -> dict[str, Any]:
        # ZImagePipeline takes one (tokens, width) tensor per image, in a list.
        return {k: [v[0]] * batch for k, v in embeds.items()}

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps` on the path the model's images take at
        its own CFG scale: Base's, one transformer call on the prompt and the empty negative
        prompt together, stepped with CFG 4 (both conditionings checked); Turbo's, one call on
        the prompt alone, as it samples without CFG. Returns the latents (1, 16, h, w)."""
        import torch

        transformer = pipe.transformer
        side = size // self.latent_factor(pipe)
        generator = torch.Generator().manual_seed(0)
        channels = transformer.config.in_channels
        latents = torch.randn((1, channels, side, side), generator=generator).to(device)
        guidance = self.call_arguments(self._defaults(pipe).cfg)["guidance_scale"]
        captions = [conditioning["prompt_embeds"][0]]
        if guidance > 0:
            captions.append(conditioning["negative_prompt_embeds"][0])
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):
            frame = latents[0].unsqueeze(1)  # (C, 1, h, w): one frame
            out = transformer(
                [frame] * len(captions),
                torch.full([len(captions)], 1.0 - sigma, device=device),
                captions,
                return_dict=False,
            )[0]
            prediction = out[0].float()
            if guidance > 0:
                prediction = prediction + guidance * (prediction - out[1].float())
            velocity = -prediction.squeeze(1)[None]
            latents = latents + (following - sigma) * velocity
        return latents

    def _defaults(self, pipe) -> GenerationDefaults:
        return BASE_DEFAULTS if variant(pipe) == BASE else TURBO_DEFAULTS

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        return patches_problem(self, pipeline, width, height)

    def text_to_image_problem(self, pipeline) -> str | None:
        return input_channels_problem(pipeline, "latent_channels", 1)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        import torch

        factor = self.latent_factor(pipeline)
        channels = pipeline.transformer.config.in_channels
        h, w = 2 * (height // (factor * 2)), 2 * (width // (factor * 2))
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        latents = [torch.randn((1, channels, h, w), generator=g) for g in generators]
        return torch.cat(latents), generators

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        return {"guidance_scale": max(cfg - 1.0, 0.0)}
