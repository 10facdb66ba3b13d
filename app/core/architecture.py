"""Which model a checkpoint holds, and each component's config, read from tensor names and shapes.

Everything here works on `{name: shape}` from a file's header, so it is cheap (no torch, no
tensor data) and the model library can use it too. Detection says in one sentence why it
decided; config inference starts from the architecture's shipped diffusers config and replaces
every value the shapes determine (widths, blocks, layers, attention and context dims, input
channels), so that inpainting variants, distilled UNets with fewer blocks and small test models
load as well. Attention head counts are not stored in weights: they follow the architecture's
rule (64-wide heads for SD2/SDXL and CLIP, 8 heads for SD1.x UNets).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.detection import UNET, VAE, Detection, TextEncoderLayout
from app.core.families import FAMILIES, architecture_title
from app.core.families.registry import families_words
from app.core.layouts import count_indices

Shapes = Mapping[str, tuple[int, ...]]

SD1_TEXT = "cond_stage_model.transformer."
SD2_TEXT = "cond_stage_model.model."
SDXL_TEXT_1 = "conditioner.embedders.0.transformer."
SDXL_TEXT_2 = "conditioner.embedders.1.model."
SDXL_REFINER_TEXT = "conditioner.embedders.0.model."

SUPPORTED = ("sd1", "sd2", "sdxl")
CONFIG_NAMES = ("sd1", "sd2", "sd2-v", "sdxl")


# Detection ---------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Prediction:
    """What a denoiser predicts and how we know it."""

    kind: str  # "epsilon" | "v_prediction"
    zero_terminal_snr: bool  # trained on a zero-terminal-SNR schedule (Illustrious/NoobAI v)
    because: str  # words completing "...; ", e.g. "v-prediction because the file carries ..."
    decided: bool  # by something the file or its .yaml states; False: a guess to test


def read_prediction(
    family: str, keys: list[str], metadata: Mapping[str, str], name: str, sidecar_config: str | None
) -> Prediction:
    """The prediction type from what the file states, or the guess a test pass should check.

    Weights cannot tell epsilon from v-prediction, so this reads markers in order: the empty
    `v_pred` and `ztsnr` tensors NoobAI/kohya/ComfyUI write, training metadata (kohya's
    ss_v_parameterization and ss_zero_terminal_snr, ModelSpec), an A1111 `.yaml` beside the
    file. Without one, the file name and then the family's usual choice give an undecided
    guess (`decided=False`) that `app.core.prediction` tests with the UNet itself.
    """
    keyset = set(keys)
    zsnr_flag = metadata.get("ss_zero_terminal_snr", "").strip().lower()
    zsnr = "ztsnr" in keyset or zsnr_flag == "true"
    zsnr_words = ""
    if "ztsnr" in keyset:
        zsnr_words = ", with zero-terminal-SNR noise (its ztsnr marker)"
    elif zsnr:
        zsnr_words = ", with zero-terminal-SNR noise (ss_zero_terminal_snr)"

    def stated(kind: str, why: str) -> Prediction:
        return Prediction(kind, zsnr, f"{_words(kind)} {why}{zsnr_words}", True)

    if "v_pred" in keyset or "edm_vpred.sigma_max" in keyset:
        return stated("v_prediction", "because the file carries a v_pred marker")
    flag = metadata.get("ss_v_parameterization", "").strip().lower()
    if flag in ("true", "false"):
        kind = "v_prediction" if flag == "true" else "epsilon"
        return stated(kind, "per its training metadata (ss_v_parameterization)")
    spec = metadata.get("modelspec.prediction_type", "").strip().lower()
    if spec.startswith(("v", "eps")):
        kind = "v_prediction" if spec.startswith("v") else "epsilon"
        return stated(kind, "per its ModelSpec metadata")
    if metadata.get("modelspec.architecture", "").strip().lower().endswith("-v"):
        return stated("v_prediction", "per its ModelSpec architecture")
    if sidecar_config is not None:
        if re.search(r"parameterization:\s*[\"']?v[\"']?\s*$", sidecar_config, re.MULTILINE):
            return stated("v_prediction", "per the .yaml config beside it")
        return stated("epsilon", "per the .yaml config beside it")

    def guess(kind: str, why: str) -> Prediction:
        return Prediction(kind, zsnr, f"{_words(kind)} {why}{zsnr_words}", False)

    lowered = name.lower()
    if re.search(r"(^|[^a-z0-9])v[-_ ]?pred", lowered):
        return guess("v_prediction", "because its name says v-pred")
    if family == "sd2":
        if "768" in lowered:
            return guess(
                "v_prediction", "because its name says 768 (SD2's 768 models are v-prediction)"
            )
        if "512" in lowered or "base" in lowered:
            return guess("epsilon", "because its name marks it as a 512/base model")
        return guess(
            "v_prediction",
            "assumed, as most SD2.x models are 768-v "
            "(put '512' in the name or an A1111 .yaml beside it if it is an epsilon model)",
        )
    return guess("epsilon", "as usual for this family")


def _words(kind: str) -> str:
    return "v-prediction" if kind == "v_prediction" else "epsilon prediction"


def detect_from_configs(
    model_index: Mapping[str, Any], unet: Mapping[str, Any], scheduler: Mapping[str, Any]
) -> Detection:
    """Decide the architecture of a diffusers folder from its model_index.json and configs
    (`unet` is the denoiser's config: the UNet's, or a DiT's `transformer`).

    A UNet config must have passed `limits.check_unet_config` (its sizes are numbers).
    """
    class_name = str(model_index.get("_class_name", ""))
    if "transformer" in model_index:
        for family in FAMILIES:
            if family.pipeline_class == class_name:
                return family.detect_folder(model_index, unet)
    cross = unet.get("cross_attention_dim")
    cross = cross[0] if isinstance(cross, list) else cross
    in_channels = unet.get("in_channels", 4)
    prediction = scheduler.get("prediction_type", "epsilon")
    sample = unet.get("sample_size") or 64
    size = int(max(sample) if isinstance(sample, list) else sample) * 8
    if "text_encoder_2" in model_index and unet.get("addition_embed_type") == "text_time":
        family, why = (
            "sdxl",
            (
                f"its {class_name} has two text encoders and a UNet with {cross}-wide "
                "text features and text/time embeddings"
            ),
        )
    elif class_name.startswith("StableDiffusion") and "text_encoder_2" not in model_index:
        family = "sd2" if cross == 1024 else "sd1"
        why = f"its {class_name} has one text encoder and a UNet with {cross}-wide text features"
        if family == "sd1" and cross != 768:
            why += " (a non-standard width, treated as SD1.x)"
    else:
        looks = f"a {class_name or 'pipeline of unknown type'}"
        return Detection(
            class_name or "unknown",
            False,
            looks,
            f"its model_index.json names {class_name or 'no pipeline class'}; "
            f"HalfSafe runs {families_words()} pipelines.",
        )
    variant = "-inpaint" if in_channels == 9 else ""
    if in_channels not in (4, 9):
        return Detection(
            f"{family}-in{in_channels}",
            False,
            f"a UNet with {in_channels} input channels",
            f"{why}, but its UNet takes {in_channels} input channels where a "
            "text-to-image model takes 4.",
        )
    because = (
        f"{architecture_title(family)}{' inpainting' if variant else ''}: {why}; "
        f"{_words(prediction)} per its scheduler config."
    )
    return Detection(
        family + variant,
        True,
        f"a {architecture_title(family)} pipeline",
        because,
        prediction,
        size,
        None,
        class_name,
        zero_terminal_snr=bool(scheduler.get("rescale_betas_zero_snr")),
        prediction_because=f"{_words(prediction)} per its scheduler config",
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
                "HalfSafe reads (Flux.1, Chroma, SD3.x, Z-Image, Qwen-Image).",
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


_TOKEN_EMBEDDING = {"hf": "embeddings.token_embedding.weight", "openclip": "token_embedding.weight"}


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


def _prefix_checker(keys: list[str]):
    prefixes: set[str] = set()
    for k in keys:
        parts = k.split(".")
        for n in range(1, min(len(parts), 5)):
            prefixes.add(".".join(parts[:n]) + ".")
    return lambda prefix: prefix in prefixes


def _hf_prefix(keys: list[str], prefix: str) -> str:
    """CLIP in transformers layout sits under `text_model.`; very old files lack that level."""
    return (
        prefix + "text_model."
        if any(k.startswith(prefix + "text_model.") for k in keys)
        else prefix
    )


def _cross_attention_dim(shapes: Shapes, prefix: str) -> int | None:
    for key, shape in shapes.items():
        if key.startswith(prefix) and key.endswith(".attn2.to_k.weight") and len(shape) == 2:
            return shape[1]
    return None


def _shape(shapes: Shapes, key: str, dim: int) -> int | None:
    shape = shapes.get(key)
    return shape[dim] if shape is not None and len(shape) > dim else None


def _clip_words(shapes: Shapes, encoder: TextEncoderLayout) -> str:
    """ "CLIP ViT-L (768 wide, 12 layers)" or, for other widths, "CLIP (32 wide, 2 layers)"."""
    kind = "CLIP" if encoder.layout == "hf" else "OpenCLIP"
    try:
        hidden = infer_text_encoder_config(shapes, {}, encoder)["hidden_size"]
    except ValueError:
        return f"{kind} (unreadable)"
    model = {768: " ViT-L", 1024: " ViT-H", 1280: " ViT-bigG"}.get(hidden, "")
    return f"{kind}{model} ({hidden} wide, {_count_layers(shapes, encoder)} layers)"


def _count_layers(shapes: Shapes, encoder: TextEncoderLayout) -> int:
    pattern = "encoder.layers." if encoder.layout == "hf" else "transformer.resblocks."
    return count_indices(shapes, encoder.prefix + pattern)


# Config inference --------------------------------------------------------------------------


def shape_problem(shapes: Shapes, detection: Detection) -> str | None:
    """Why the loader would refuse a supported checkpoint's shapes, in words that complete
    "this looks like ..., but", or None when every component's config can be inferred and
    stays within real models' sizes. Headers only, so the model library can say it up front.
    """
    from app.core import limits

    try:
        for encoder in detection.text_encoders:
            limits.check_text_encoder_config(infer_text_encoder_config(shapes, {}, encoder))
        limits.check_unet_config(infer_unet_config(shapes, {}, prefix=detection.unet_prefix))
        if detection.has_vae:
            limits.check_vae_config(infer_vae_config(shapes, {}, prefix=detection.vae_prefix))
    except ValueError as error:
        return str(error)
    return None


def _weight_shape(shapes: Shapes, prefix: str, name: str, ndim: int, words: str):
    """The shape of one weight that config inference reads, which must exist and have `ndim`
    dimensions (a scalar or 1-D tensor where a matrix belongs is a damaged file, not an
    IndexError)."""
    shape = shapes.get(prefix + name)
    if shape is None:
        raise ValueError(f"the {words} has no {name}, so its layout is unknown")
    if len(shape) != ndim:
        raise ValueError(
            f"the {words} weight {name} has shape {list(shape)} where a {ndim}-D tensor belongs"
        )
    return shape


def _unet_heads(channels: int, sd1_style: bool) -> int:
    if sd1_style and channels % 8 == 0:
        return 8
    if channels >= 128 and channels % 64 == 0:
        return channels // 64
    return next(h for h in (8, 4, 2, 1) if channels % h == 0)


def _norm_groups(widths: list[int], base: int) -> int:
    return next(g for g in (base, 32, 16, 8, 4, 2, 1) if all(w % g == 0 for w in widths))


def infer_unet_config(
    shapes: Shapes,
    base: Mapping[str, Any],
    *,
    prefix: str = UNET,
    sample_size: int | None = None,
    pooled_text_dim: int | None = None,
) -> dict[str, Any]:
    """A UNet2DConditionModel config for the original-layout UNet under `prefix`.

    Raises ValueError with a plain sentence when the layout is not one diffusers can build
    (uneven blocks per level, unknown block kinds).
    """
    blocks: dict[tuple[str, int, int], set[str]] = {}
    for key in shapes:
        if not key.startswith(prefix):
            continue
        parts = key[len(prefix) :].split(".")
        if (
            parts[0] in ("input_blocks", "output_blocks")
            and len(parts) > 3
            and parts[1].isdigit()
            and parts[2].isdigit()
        ):
            blocks.setdefault((parts[0], int(parts[1]), int(parts[2])), set()).add(
                ".".join(parts[3:])
            )
        elif parts[0] == "middle_block" and len(parts) > 2 and parts[1].isdigit():
            blocks.setdefault(("middle_block", 0, int(parts[1])), set()).add(".".join(parts[2:]))

    def w(name: str, ndim: int) -> tuple[int, ...]:
        return _weight_shape(shapes, prefix, name, ndim, "UNet")

    def depth(kind: str, i: int, j: int) -> int:
        rest = blocks.get((kind, i, j), set())
        return len({r.split(".")[1] for r in rest if r.startswith("transformer_blocks.")})

    conv_in = w("input_blocks.0.0.weight", 4)
    levels: list[dict[str, Any]] = [{"resnets": 0, "channels": None, "depths": []}]
    inputs = sorted({i for (kind, i, _j) in blocks if kind == "input_blocks" and i >= 1})
    for i in inputs:
        rest = blocks.get(("input_blocks", i, 0), set())
        if "op.weight" in rest:
            levels.append({"resnets": 0, "channels": None, "depths": []})
            continue
        level = levels[-1]
        level["resnets"] += 1
        level["channels"] = w(f"input_blocks.{i}.0.out_layers.3.weight", 4)[0]
        level["depths"].append(depth("input_blocks", i, 1))
    if any(level["resnets"] == 0 for level in levels):
        raise ValueError("a UNet level has no residual blocks")
    per_level = {level["resnets"] for level in levels}
    if len(per_level) != 1:
        raise ValueError(
            "its UNet levels have different numbers of blocks, which diffusers cannot build"
        )
    layers = per_level.pop()
    down_depths = []
    for level in levels:
        if len(set(level["depths"])) != 1:
            raise ValueError("a UNet level mixes blocks with and without attention")
        down_depths.append(level["depths"][0])

    outputs = sorted({i for (kind, i, _j) in blocks if kind == "output_blocks"})
    if len(outputs) != len(levels) * (layers + 1):
        raise ValueError(
            f"its UNet has {len(outputs)} output blocks where {len(levels)} levels of "
            f"{layers} blocks need {len(levels) * (layers + 1)}"
        )
    up_depths = [depth("output_blocks", u * (layers + 1), 1) for u in range(len(levels))]
    if up_depths != down_depths[::-1]:
        raise ValueError("its UNet's up path does not mirror its down path")

    config = copy.deepcopy(dict(base))
    for key in ("_diffusers_version", "_name_or_path"):
        config.pop(key, None)
    channels = [level["channels"] for level in levels]
    sd1_style = not isinstance(base.get("attention_head_dim"), list)
    config.update(
        in_channels=conv_in[1],
        out_channels=w("out.2.weight", 4)[0],
        conv_in_kernel=conv_in[2],
        conv_out_kernel=w("out.2.weight", 4)[2],
        block_out_channels=channels,
        layers_per_block=layers,
        down_block_types=["CrossAttnDownBlock2D" if d else "DownBlock2D" for d in down_depths],
        up_block_types=["CrossAttnUpBlock2D" if d else "UpBlock2D" for d in down_depths[::-1]],
        attention_head_dim=[_unet_heads(c, sd1_style) for c in channels],
        norm_num_groups=_norm_groups(channels, int(base.get("norm_num_groups", 32))),
    )
    if sd1_style and len(set(config["attention_head_dim"])) == 1:
        config["attention_head_dim"] = config["attention_head_dim"][0]
    depths = [max(d, 1) for d in down_depths]
    config["transformer_layers_per_block"] = depths if any(d > 1 for d in depths) else 1

    mid = {j for (kind, _i, j) in blocks if kind == "middle_block"}
    if not mid:
        config["mid_block_type"] = None
    elif mid == {0, 1, 2} and depth("middle_block", 0, 1):
        config["mid_block_type"] = "UNetMidBlock2DCrossAttn"
        if depth("middle_block", 0, 1) != depths[-1]:
            raise ValueError("its UNet's middle block depth differs from its last level's")
    else:
        raise ValueError("its UNet's middle block has an unknown layout")

    cross = _cross_attention_dim(shapes, prefix)
    if cross is not None:
        config["cross_attention_dim"] = cross
        proj_in = next(
            (
                s
                for k, s in shapes.items()
                if k.startswith(prefix) and k.endswith(".proj_in.weight")
            ),
            None,
        )
        if proj_in is None:
            raise ValueError("its UNet has cross-attention but no proj_in weights")
        config["use_linear_projection"] = len(proj_in) == 2

    time_dim = w("time_embed.0.weight", 2)[0]
    config["time_embedding_dim"] = None if time_dim == channels[0] * 4 else time_dim
    label = shapes.get(prefix + "label_emb.0.0.weight")
    if label is not None:
        in_dim = w("label_emb.0.0.weight", 2)[1]
        pooled = (
            pooled_text_dim
            if pooled_text_dim is not None
            else in_dim - 6 * int(base.get("addition_time_embed_dim") or 256)
        )
        time_embed = (in_dim - pooled) / 6
        if time_embed <= 0 or time_embed != int(time_embed):
            raise ValueError(
                f"its UNet's size embedding takes {in_dim} inputs, which does not "
                f"fit a {pooled}-wide pooled text embedding"
            )
        config.update(
            addition_embed_type="text_time",
            projection_class_embeddings_input_dim=in_dim,
            addition_time_embed_dim=int(time_embed),
        )
    else:
        config.update(addition_embed_type=None, projection_class_embeddings_input_dim=None)
    if sample_size is not None:
        config["sample_size"] = sample_size // 8
    return config


def infer_vae_config(
    shapes: Shapes, base: Mapping[str, Any], *, prefix: str = VAE, sample_size: int | None = None
) -> dict[str, Any]:
    """An AutoencoderKL config for the VAE under `prefix`, in original or diffusers layout."""
    diffusers_layout = (prefix + "encoder.down_blocks.0.resnets.0.conv1.weight") in shapes
    down = "encoder.down_blocks." if diffusers_layout else "encoder.down."
    block = ".resnets." if diffusers_layout else ".block."

    def w(name: str, ndim: int = 4) -> tuple[int, ...]:
        return _weight_shape(shapes, prefix, name, ndim, "VAE")

    levels = count_indices(shapes, prefix + down)
    if levels == 0:
        raise ValueError("the VAE has no encoder blocks")
    channels = [w(f"{down}{i}{block}0.conv2.weight")[0] for i in range(levels)]
    layers = count_indices(shapes, f"{prefix}{down}0{block}")
    config = copy.deepcopy(dict(base))
    for key in ("_diffusers_version", "_name_or_path"):
        config.pop(key, None)
    mid_attention = "mid_block.attentions.0." if diffusers_layout else "mid.attn_1."
    config.update(
        in_channels=w("encoder.conv_in.weight")[1],
        out_channels=w("decoder.conv_out.weight")[0],
        latent_channels=w("decoder.conv_in.weight")[1],
        block_out_channels=channels,
        layers_per_block=layers,
        down_block_types=["DownEncoderBlock2D"] * levels,
        up_block_types=["UpDecoderBlock2D"] * levels,
        norm_num_groups=_norm_groups(channels, int(base.get("norm_num_groups", 32))),
        use_quant_conv=(prefix + "quant_conv.weight") in shapes,
        use_post_quant_conv=(prefix + "post_quant_conv.weight") in shapes,
        mid_block_add_attention=any(
            k.startswith(prefix + "encoder." + mid_attention) for k in shapes
        ),
    )
    if sample_size is not None:
        config["sample_size"] = sample_size
    return config


def _text_heads(hidden: int) -> int:
    if hidden >= 128 and hidden % 64 == 0:
        return hidden // 64
    return next(h for h in (4, 2, 1) if hidden % h == 0)


def infer_text_encoder_config(
    shapes: Shapes, base: Mapping[str, Any], encoder: TextEncoderLayout
) -> dict[str, Any]:
    """A CLIPTextConfig dict for one text encoder of a single file."""
    p = encoder.prefix

    def w(name: str, ndim: int = 2) -> tuple[int, ...]:
        return _weight_shape(shapes, p, name, ndim, "text encoder")

    config = copy.deepcopy(dict(base))
    for key in ("_name_or_path", "transformers_version"):
        config.pop(key, None)
    if encoder.layout == "hf":
        vocab, hidden = w("embeddings.token_embedding.weight")
        positions = w("embeddings.position_embedding.weight")[0]
        intermediate = w("encoder.layers.0.mlp.fc1.weight")[0]
        layers = count_indices(shapes, p + "encoder.layers.")
        projection = shapes.get(p.removesuffix("text_model.") + "text_projection.weight")
        projection_dim = projection[0] if projection and len(projection) == 2 else None
        if encoder.drop_last_layer:
            layers -= 1
    else:
        vocab, hidden = w("token_embedding.weight")
        positions = w("positional_embedding")[0]
        intermediate = w("transformer.resblocks.0.mlp.c_fc.weight")[0]
        layers = count_indices(shapes, p + "transformer.resblocks.")
        projection = shapes.get(p + "text_projection")
        projection_dim = projection[1] if projection and len(projection) == 2 else None
        if encoder.drop_last_layer:
            layers -= 1
    if layers < 1:
        raise ValueError("the text encoder has no layers")
    config.update(
        vocab_size=vocab,
        hidden_size=hidden,
        max_position_embeddings=positions,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=_text_heads(hidden),
    )
    if projection_dim is not None and not encoder.drop_last_layer:  # SD2 never uses its projection
        config["projection_dim"] = projection_dim
    return config
