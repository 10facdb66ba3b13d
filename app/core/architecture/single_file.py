"""Which model a single-file checkpoint holds, from its tensor names and shapes: SD1.x, SD2.x
(either text encoder layout) and SDXL with their variants, and in one sentence what any other
file is (a LoRA, an embedding, a VAE, another architecture's model).
"""

from __future__ import annotations

from collections.abc import Mapping

from app.core.architecture.configs import infer_text_encoder_config
from app.core.architecture.keys import (
    _TOKEN_EMBEDDING,
    SD1_TEXT,
    SD2_TEXT,
    SDXL_REFINER_TEXT,
    SDXL_TEXT_1,
    SDXL_TEXT_2,
    Shapes,
    _count_layers,
    _cross_attention_dim,
    _hf_prefix,
    _prefix_checker,
    _shape,
)
from app.core.architecture.prediction_type import read_prediction
from app.core.detection import UNET, VAE, Detection, TextEncoderLayout
from app.core.families import architecture_title
from app.core.families.registry import file_layout_words


def detect_architecture(
    shapes: Shapes,
    *,
    metadata: Mapping[str, str] | None = None,
    name: str = "",
    sidecar_config: str | None = None,
) -> Detection:
    """Decide which model a single-file checkpoint holds, from its tensor names and shapes.

    `metadata` is the safetensors `__metadata__`, `name` the file name, `sidecar_config` the
    text of an A1111-style `.yaml` beside the file; they only inform the prediction type,
    which the weights do not record. Never raises: an unknown file gives an unsupported
    Detection that names what it looks like.
    """
    metadata = metadata or {}
    keys = list(shapes)
    foreign = _foreign_model(keys, shapes)
    if foreign is not None:
        return foreign

    has = _prefix_checker(keys)
    if not has(UNET):
        return _not_a_full_checkpoint(keys, shapes)

    cross = _cross_attention_dim(shapes, UNET)
    in_channels = _shape(shapes, UNET + "input_blocks.0.0.weight", 1)
    has_vae = has(VAE + "decoder.") and has(VAE + "encoder.")
    label_emb = (UNET + "label_emb.0.0.weight") in shapes
    cross_words = f"{cross}-wide text features" if cross else "no text features"

    if has(SDXL_TEXT_1) and has(SDXL_TEXT_2):
        family = "sdxl"
        encoders = (
            TextEncoderLayout("text_encoder", _hf_prefix(keys, SDXL_TEXT_1), "hf"),
            TextEncoderLayout("text_encoder_2", SDXL_TEXT_2, "openclip"),
        )
        why = (
            f"its UNet takes {cross_words} plus size embeddings (label_emb) and it carries "
            f"two text encoders, {_clip_words(shapes, encoders[0])} and "
            f"{_clip_words(shapes, encoders[1])}"
        )
    elif has(SDXL_REFINER_TEXT) and not has(SDXL_TEXT_2):
        return Detection(
            "sdxl-refiner",
            False,
            "an SDXL refiner",
            "it has the SDXL refiner's single OpenCLIP text encoder "
            "(conditioner.embedders.0.model) and a UNet with "
            f"{cross_words}; HalfSafe runs base models, not refiners.",
        )
    elif has(SD2_TEXT):
        family = "sd2"
        encoders = (_sd2_encoder(shapes, SD2_TEXT, "openclip"),)
        why = (
            f"its UNet takes {cross_words} from an {_clip_words(shapes, encoders[0])} text "
            f"encoder (cond_stage_model.model), as SD2.x does{_penultimate_words(encoders[0])}"
        )
    elif has(SD1_TEXT) and _sd2_in_clip_layout(shapes, _hf_prefix(keys, SD1_TEXT), cross):
        family = "sd2"
        encoders = (_sd2_encoder(shapes, _hf_prefix(keys, SD1_TEXT), "hf"),)
        why = (
            f"its UNet takes {cross_words} from an OpenCLIP-sized "
            f"{_clip_words(shapes, encoders[0])} text encoder stored under transformers names "
            f"(cond_stage_model.transformer), as SD2.x does{_penultimate_words(encoders[0])}"
        )
    elif has(SD1_TEXT):
        family = "sd1"
        encoders = (TextEncoderLayout("text_encoder", _hf_prefix(keys, SD1_TEXT), "hf"),)
        why = (
            f"its UNet takes {cross_words} from a {_clip_words(shapes, encoders[0])} text "
            "encoder (cond_stage_model.transformer), as SD1.x does"
        )
    else:
        guess = "SDXL" if label_emb else ("SD2.x" if cross == 1024 else "SD1.x")
        return Detection(
            "unet-only",
            False,
            f"a {guess} UNet without its text encoder",
            f"it holds a {guess}-shaped UNet ({UNET}*) but no text encoder, like the "
            "files ComfyUI keeps in models/diffusion_models; HalfSafe needs a full "
            "checkpoint with text encoder, UNet and VAE.",
        )

    variant = ""
    if in_channels == 9:
        variant = "-inpaint"
        why += (
            ", and its UNet takes 9 input channels (latents, mask and masked image), so it is "
            "an inpainting model"
        )
    elif in_channels not in (None, 4):
        looks = {
            8: "an InstructPix2Pix model",
            5: "an SD2 depth-to-image model",
            7: "an SD x4 upscaler",
        }.get(in_channels, f"a UNet with {in_channels} input channels")
        return Detection(
            f"{family}-in{in_channels}",
            False,
            looks,
            f"{why}, but its UNet takes {in_channels} input channels where a "
            "text-to-image model takes 4.",
        )

    stated = read_prediction(family, keys, metadata, name, sidecar_config)
    prediction, prediction_why = stated.kind, stated.because
    native = {"sd1": 512, "sdxl": 1024}.get(family) or (
        768 if prediction == "v_prediction" else 512
    )
    config = "sd2-v" if family == "sd2" and prediction == "v_prediction" else family
    pipeline_class = {
        "sd1": "StableDiffusionPipeline",
        "sd2": "StableDiffusionPipeline",
        "sdxl": "StableDiffusionXLPipeline",
    }[family]
    if variant:
        pipeline_class = pipeline_class.replace("Pipeline", "InpaintPipeline")
    because = (
        f"{architecture_title(family)}{' inpainting' if variant else ''}: {why}; {prediction_why}."
    )
    notes: tuple[str, ...] = ()
    if not has_vae:
        notes = ("The file has no VAE (first_stage_model); a separate VAE is needed.",)
    return Detection(
        family + variant,
        True,
        f"a {architecture_title(family)}{' inpainting' if variant else ''} checkpoint",
        because,
        prediction,
        native,
        config,
        pipeline_class,
        encoders,
        has_vae,
        notes=notes,
        zero_terminal_snr=stated.zero_terminal_snr,
        prediction_decided=stated.decided,
        prediction_because=prediction_why,
    )


_FOREIGN = (
    # (key fragment, architecture, plain words)
    ("joint_blocks.", "sd3", "a Stable Diffusion 3 model"),
    ("double_blocks.", "flux", "a Flux model"),
    ("double_stream_blocks.", "hidream", "a HiDream model"),
    ("single_stream_modulation.", "flux2", "a Flux.2 model"),
    ("clip_txt_mapper.", "stable-cascade", "a Stable Cascade model"),
    ("down_blocks.1.0.channelwise.", "stable-cascade", "a Stable Cascade model"),
    ("motion_modules.", "animatediff", "an AnimateDiff motion module"),
    ("control_model.", "controlnet", "a ControlNet"),
    ("input_hint_block.", "controlnet", "a ControlNet"),
    ("controlnet_cond_embedding.", "controlnet", "a ControlNet"),
    ("adaLN_modulation.", "dit", "a diffusion transformer (DiT family)"),
    ("cap_embedder.", "lumina", "a Lumina model"),
    ("head.modulation", "wan", "a Wan video model"),
)


def _foreign_model(keys: list[str], shapes: Shapes) -> Detection | None:
    if any(
        (
            "lora_up" in k
            or "lora_down" in k
            or "lora_A." in k
            or "lora_B." in k
            or k.startswith(("lora_unet_", "lora_te"))
            or ".hada_w1" in k
            or ".lokr_w1" in k
        )
        for k in keys
    ):
        return Detection(
            "lora",
            False,
            "a LoRA (an add-on for a base model)",
            "its tensors are low-rank adapter pairs (lora_up/lora_down), not a "
            "full model; load a base checkpoint and apply the LoRA there.",
        )
    if keys and all(
        k in ("emb_params", "clip_l", "clip_g", "name", "step") or k.startswith("string_to_")
        for k in keys
    ):
        return Detection(
            "embedding",
            False,
            "a textual-inversion embedding",
            "it holds only token embeddings (emb_params or clip_l/clip_g), which "
            "extend a model's vocabulary; they are not a model.",
        )
    for fragment, arch, words in _FOREIGN:
        if any(fragment in k for k in keys):
            return Detection(
                arch,
                False,
                words,
                f"it has {arch}-style tensors ({fragment}*), which SD1.x, SD2.x "
                "and SDXL checkpoints never have, and is in none of the transformer layouts "
                f"HalfSafe reads ({file_layout_words()}).",
            )
    return None


def _not_a_full_checkpoint(keys: list[str], shapes: Shapes) -> Detection:
    has = _prefix_checker(keys)
    if has("encoder.down.") and has("decoder.up.") or has(VAE + "encoder.") and not has(UNET):
        return Detection(
            "vae",
            False,
            "a standalone VAE",
            "it holds only a VAE (encoder/decoder tensors) and no UNet; pass it "
            "with --vae next to a model instead.",
        )
    if has("encoder.down_blocks.") and has("decoder.up_blocks."):
        return Detection(
            "vae",
            False,
            "a standalone VAE in diffusers layout",
            "it holds only a VAE (diffusers layout) and no UNet; pass it with "
            "--vae next to a model instead.",
        )
    if has("down_blocks.") and has("up_blocks.") and any(".attn2.to_k.weight" in k for k in keys):
        return Detection(
            "diffusers-unet",
            False,
            "a UNet in diffusers layout",
            "it holds only a diffusers-layout UNet (down_blocks/up_blocks), one "
            "component of a diffusers folder; open the whole folder instead.",
        )
    if has("text_model.") or has("transformer.resblocks."):
        return Detection(
            "text-encoder",
            False,
            "a text encoder on its own",
            "it holds only a CLIP text encoder, not a diffusion model.",
        )
    sample = ", ".join(sorted(keys)[:2])
    return Detection(
        "unknown",
        False,
        "not a Stable Diffusion checkpoint",
        f"none of its {len(keys)} tensors (e.g. {sample}) has the names of an "
        "SD1.x, SD2.x or SDXL checkpoint.",
    )


def _sd2_encoder(shapes: Shapes, prefix: str, layout: str) -> TextEncoderLayout:
    """SD2's text encoder, keeping every block the file has unless it holds the full tower.

    SD2 conditions on the output of OpenCLIP ViT-H's 23rd of 24 blocks (then the final norm).
    Original files carry all 24 blocks and the text projection; diffusers' converter writes
    only the 23 blocks diffusers runs and no projection. ViT-H's depth decides for real sizes;
    for other sizes the projection tells a full tower from a converted one.
    """
    probe = TextEncoderLayout("text_encoder", prefix, layout)
    layers = _count_layers(shapes, probe)
    width = _shape(shapes, prefix + _TOKEN_EMBEDDING[layout], 1)
    if width == 1024 and layers in (23, 24):
        full = layers == 24
    elif layout == "hf":
        full = (prefix.removesuffix("text_model.") + "text_projection.weight") in shapes
    else:
        full = (prefix + "text_projection") in shapes
    return TextEncoderLayout("text_encoder", prefix, layout, drop_last_layer=full and layers > 1)


def _penultimate_words(encoder: TextEncoderLayout) -> str:
    if encoder.drop_last_layer:
        return " (its last block is unused: SD2 reads the penultimate layer)"
    return " (the file holds only the blocks SD2 reads, all of them used)"


def _sd2_in_clip_layout(shapes: Shapes, prefix: str, cross: int | None) -> bool:
    """A converted SD2 file can store OpenCLIP under transformers names, where SD1's CLIP sits.

    Real SD2 text features are 1024 wide (SD1's 768); at other sizes SD2's UNet gives itself
    away by linear attention projections (SD1's are 1x1 convolutions).
    """
    width = _shape(shapes, prefix + _TOKEN_EMBEDDING["hf"], 1)
    if cross == 1024 and width == 1024:
        return True
    if cross in (768, None) or width != cross:
        return False
    proj_in = next(
        (s for k, s in shapes.items() if k.startswith(UNET) and k.endswith(".proj_in.weight")),
        None,
    )
    return proj_in is not None and len(proj_in) == 2


def _clip_words(shapes: Shapes, encoder: TextEncoderLayout) -> str:
    """ "CLIP ViT-L (768 wide, 12 layers)" or, for other widths, "CLIP (32 wide, 2 layers)"."""
    kind = "CLIP" if encoder.layout == "hf" else "OpenCLIP"
    try:
        hidden = infer_text_encoder_config(shapes, {}, encoder)["hidden_size"]
    except ValueError:
        return f"{kind} (unreadable)"
    model = {768: " ViT-L", 1024: " ViT-H", 1280: " ViT-bigG"}.get(hidden, "")
    return f"{kind}{model} ({hidden} wide, {_count_layers(shapes, encoder)} layers)"
