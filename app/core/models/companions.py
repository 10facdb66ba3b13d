"""The companion text encoders and VAEs of a transformer file (CLIP, T5, Qwen3, Qwen2.5-VL,
Qwen3-VL, the Wan 2.1 VAE, Qwen-Image 2.1's VAE), built from their files by the shapes and key
maps of `encoders.py`."""

from __future__ import annotations

from pathlib import Path

from app.core import architecture as arch
from app.core import limits, paths
from app.core.checkpoint.reader import Checkpoint
from app.core.encoders import files as encoders
from app.core.errors import BadFileError, UnsupportedModelError
from app.core.formats.layouts import CLIP_PREFIX, CLIP_PROJECTION, Need
from app.core.models.assembly import assign, empty
from app.core.models.configs import read_json
from app.core.models.conversion import convert_text_encoder


def _qwen3_encoder(checkpoint: Checkpoint):
    """A Qwen3 text encoder file in transformers' layout (ComfyUI's qwen_3_4b.safetensors):
    the decoder's layers, read as a Qwen3Model (the LM head, if any, is not used). Returns
    (model, stored dtypes)."""
    import transformers

    path = checkpoint.path
    prefix = encoders.qwen3_prefix(checkpoint.shapes)
    try:
        if prefix is None:
            raise ValueError("it has no Qwen3 layers (embed_tokens, q_norm)")
        config = encoders.qwen3_config(checkpoint.shapes, prefix)
    except (KeyError, ValueError) as error:
        raise UnsupportedModelError(
            path, f"this Qwen3 text encoder cannot be built: {error}."
        ) from None
    keys = [k for k in checkpoint.shapes if k.startswith(prefix) and k != "lm_head.weight"]
    tensors = {k[len(prefix) :]: checkpoint.get(k) for k in keys}
    dtypes = [checkpoint.dtypes[k] for k in keys]
    model = empty(transformers.Qwen3Model, transformers.Qwen3Config(**config))
    return assign(path, model, tensors, "Qwen3 text encoder"), dtypes


def _qwen25_vl_encoder(checkpoint: Checkpoint):
    """A Qwen2.5-VL file as ComfyUI keeps it (qwen_2.5_vl_7b.safetensors: model.*, visual.*,
    lm_head), read as a Qwen2_5_VLForConditionalGeneration. Returns (model, stored dtypes)."""
    import transformers

    path = checkpoint.path
    try:
        config = encoders.qwen25_vl_config(checkpoint.shapes)
    except (KeyError, ValueError) as error:
        raise UnsupportedModelError(
            path, f"this Qwen2.5-VL text encoder cannot be built: {error}."
        ) from None
    tensors = {}
    for key in checkpoint.shapes:
        name = encoders.qwen25_vl_to_transformers(key)
        tensors[name if name is not None else key] = checkpoint.get(key)
    dtypes = list(checkpoint.dtypes.values())
    model = empty(
        transformers.Qwen2_5_VLForConditionalGeneration, transformers.Qwen2_5_VLConfig(**config)
    )
    return assign(path, model, tensors, "Qwen2.5-VL text encoder"), dtypes


def _qwen3_vl_encoder(checkpoint: Checkpoint, need: Need):
    """A Qwen3-VL file (model.language_model.*, model.visual.*, an LM head or not; or without
    the model. prefix), read as `need.reads` says: Krea 2's Qwen3VLModel (the LM head, if any,
    is not used) or Qwen-Image 2.1's Qwen3VLForConditionalGeneration. Returns (model, stored
    dtypes)."""
    import transformers

    path = checkpoint.path
    read = encoders.QWEN3_VL_READS[need.reads]
    prefix = encoders.qwen3_vl_prefix(checkpoint.shapes)
    try:
        if prefix is None:
            raise ValueError("it has no Qwen3-VL language model and vision tower")
        config = encoders.qwen3_vl_config(checkpoint.shapes, prefix, read)
    except (KeyError, ValueError) as error:
        raise UnsupportedModelError(
            path, f"this Qwen3-VL text encoder cannot be built: {error}."
        ) from None
    tensors, dtypes = {}, []
    for key in checkpoint.shapes:
        name = encoders.qwen3_vl_to_transformers(key, prefix, read)
        if name is not None:
            tensors[name] = checkpoint.get(key)
            dtypes.append(checkpoint.dtypes[key])
    embedding = "model.language_model.embed_tokens.weight"
    if read.keeps_lm_head and config["tie_word_embeddings"] and embedding in tensors:
        tensors["lm_head.weight"] = tensors[embedding]  # tied: the file keeps it once
    model = empty(getattr(transformers, read.model_class), transformers.Qwen3VLConfig(**config))
    return assign(path, model, tensors, "Qwen3-VL text encoder"), dtypes


def load_wan_vae_file(path: Path):
    """Qwen-Image's VAE file in the Wan 2.1 layout (qwen_image_vae.safetensors)."""
    import diffusers

    with Checkpoint(path, component="vae") as checkpoint:
        try:
            config = encoders.wan_vae_config(checkpoint.shapes)
        except (KeyError, ValueError) as error:
            raise UnsupportedModelError(path, f"this VAE cannot be built: {error}.") from None
        model = empty(diffusers.AutoencoderKLQwenImage.from_config, config)
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        try:
            state = encoders.wan_vae_to_diffusers(
                {k: checkpoint.get(k) for k in checkpoint.shapes},
                expected,
                config["num_res_blocks"],
            )
        except KeyError as error:
            raise BadFileError(
                path, f"the VAE is incomplete: {error.args[0]} is missing."
            ) from None
        dtypes = list(checkpoint.dtypes.values())
    return assign(path, model, state, "VAE"), dtypes


def load_flux2_vae_file(path: Path, base: dict):
    """Flux.2's VAE file (flux2-vae.safetensors: the original or diffusers names, with its
    batch-norm statistics), read as an AutoencoderKLFlux2 on the shipped config `base`."""
    import diffusers
    import torch

    from app.core.models.conversion import _convert_vae

    statistics = ("bn.running_mean", "bn.running_var")
    with Checkpoint(path, component="vae") as checkpoint:
        try:
            config = arch.infer_vae_config(checkpoint.shapes, base, prefix="")
            limits.check_vae_config(config)
        except ValueError as error:
            raise UnsupportedModelError(path, f"this VAE cannot be built: {error}.") from None
        parts = ("encoder.", "decoder.", "quant_conv.", "post_quant_conv.")
        tensors = {k: checkpoint.get(k) for k in checkpoint.shapes if k.startswith(parts)}
        state = _convert_vae(tensors, "", config)
        for key in statistics:
            if key not in checkpoint.shapes:
                raise BadFileError(path, f"the VAE is incomplete: {key} is missing.")
            state[key] = checkpoint.get(key)
        # How many batches the statistics were gathered over: never used when sampling.
        counted = "bn.num_batches_tracked"
        state[counted] = (
            checkpoint.get(counted)
            if counted in checkpoint.shapes
            else torch.zeros((), dtype=torch.long)
        )
        dtypes = [checkpoint.dtypes[k] for k in [*tensors, *statistics]]
    model = empty(diffusers.AutoencoderKLFlux2.from_config, config)
    return assign(path, model, state, "VAE"), dtypes


def load_qwenimage21_vae_file(path: Path):
    """Qwen-Image 2.1's VAE file (diffusers' names), with the released VAE's latent statistics
    (resources/configs/qwenimage21/vae). Returns (model, stored dtypes)."""
    import diffusers

    released = read_json(paths.resource("configs", "qwenimage21", "vae", "config.json"))
    with Checkpoint(path, component="vae") as checkpoint:
        try:
            config = encoders.qwenimage21_vae_config(checkpoint.shapes, released)
        except (KeyError, ValueError) as error:
            raise UnsupportedModelError(path, f"this VAE cannot be built: {error}.") from None
        model = empty(diffusers.AutoencoderKLQwenImage21.from_config, config)
        state = {k: checkpoint.get(k) for k in checkpoint.shapes}
        dtypes = list(checkpoint.dtypes.values())
    return assign(path, model, state, "VAE"), dtypes


def load_text_encoder(checkpoint: Checkpoint, prefix: str, need: Need):
    """A text encoder under `prefix` of a file, as `need.kind` says: a CLIP or T5 in
    transformers' layout (a companion's own `clip_l.safetensors`, or the text_encoders.* of an
    SD3.x file), a Qwen3 or a Qwen2.5-VL file. Returns (model, stored dtypes)."""
    import transformers

    if need.kind == "qwen3":
        return _qwen3_encoder(checkpoint)
    if need.kind == "qwen25_vl":
        return _qwen25_vl_encoder(checkpoint)
    if need.kind == "qwen3_vl":
        return _qwen3_vl_encoder(checkpoint, need)
    path = checkpoint.path
    words = need.words.removeprefix("its ")
    shapes = {k[len(prefix) :]: v for k, v in checkpoint.shapes.items() if k.startswith(prefix)}
    layout = arch.TextEncoderLayout(need.component, CLIP_PREFIX, "hf")  # a CLIP's
    try:
        if need.kind == "t5":
            config = encoders.t5_config(shapes)
        else:
            folder, component = need.clip_config.split("/")
            base = read_json(paths.resource("configs", folder, component, "config.json"))
            config = arch.infer_text_encoder_config(shapes, base, layout)
        limits.check_text_encoder_config(config)
    except (KeyError, ValueError) as error:
        raise UnsupportedModelError(path, f"the {words} cannot be built: {error}.") from None
    if need.kind == "clip_projected" and CLIP_PROJECTION not in shapes:
        raise UnsupportedModelError(
            path,
            f"the {words} has no text projection ({prefix}{CLIP_PROJECTION}), which "
            "its pooled vector goes through.",
        )
    if need.kind == "t5":
        keys = list(shapes)
        model = empty(transformers.T5EncoderModel, transformers.T5Config(**config))
    else:
        projected = need.kind == "clip_projected"
        keys = [k for k in shapes if k.startswith(CLIP_PREFIX)]
        keys = [k for k in keys if not k.endswith("position_ids")]
        keys += [CLIP_PROJECTION] if projected else []
        model_class = (
            transformers.CLIPTextModelWithProjection if projected else transformers.CLIPTextModel
        )
        model = empty(model_class, transformers.CLIPTextConfig(**config))
    tensors = {k: checkpoint.get(prefix + k) for k in keys}
    dtypes = [checkpoint.dtypes[prefix + k] for k in keys]
    if need.kind == "t5":
        expected = model.state_dict()
        # Files differ in whether they repeat the tied token embedding under the encoder's name.
        if (
            "encoder.embed_tokens.weight" in expected
            and "encoder.embed_tokens.weight" not in tensors
        ):
            tensors["encoder.embed_tokens.weight"] = tensors["shared.weight"]
        state = {
            k: v for k, v in tensors.items() if k in expected or not k.startswith("encoder.embed")
        }
    else:
        state = convert_text_encoder(model, tensors, layout)
    return assign(path, model, state, words), dtypes
