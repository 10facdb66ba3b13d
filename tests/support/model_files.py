"""Model files for tests and benchmarks, written in code: a pipeline as one single file in the
original (LDM / A1111) layout, a transformer pipeline as split files the way ComfyUI keeps them
(SD3.x also as one Stability AI file), the original-layout state dict behind both, and
full-size pipelines of a shipped config with random weights to write and load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core import architecture as arch
from app.core.checkpoint import one_torch_thread, write_safetensors
from app.core.checkpoint.assembly import empty, torch_dtype
from app.core.encoders.clip import CLIP_PREFIX
from app.core.encoders.qwen25_vl import qwen25_vl_to_file
from app.core.encoders.vaes import wan_vae_to_original
from app.core.families import family_of
from app.core.families.sd import SD1_TEXT, SD2_TEXT
from app.core.families.sd3 import SD3_INSIDE
from app.core.families.sdxl import SDXL_TEXT_1, SDXL_TEXT_2
from app.core.formats.layouts import to_original
from app.core.models.configs import config_folder, read_json

# Writing single files ----------------------------------------------------------------------


def save_single_file(
    pipeline, path: str | Path, *, dtype: str | None = None, architecture: str | None = None
) -> Path:
    """Write a pipeline as one `.safetensors` in the original (LDM / A1111) key layout.

    `dtype` ("fp16", "bf16", "fp32") converts floating weights; None keeps them. `architecture`
    ("sd1", "sd2", "sdxl") picks the text-encoder layout; by default SDXL when the pipeline has
    a second text encoder, SD2 when its text encoder uses gelu (OpenCLIP), else SD1. For SD2 an
    unused last text-encoder block of zeros is written, as the original files carry one block
    more than the model reads. Returns the path written.
    """
    tensors = ldm_state_dict(pipeline, architecture=architecture)
    if dtype is not None:
        target = torch_dtype(dtype)
        tensors = {k: (v.to(target) if v.is_floating_point() else v) for k, v in tensors.items()}
    return write_safetensors(path, tensors)


# Transformer files by pipeline class, the names users' companion files have, and where an
# all-in-one file (Stability AI's SD3.x) keeps each component.
def save_split_files(
    pipeline,
    root: str | Path,
    name: str = "model",
    *,
    prefix: str = "",
    single_file: bool = False,
    companions_only: bool = False,
) -> dict[str, Path]:
    """Write a Flux, Chroma, SD3, Z-Image, Qwen-Image, Flux.2 Klein, Qwen-Image 2.1, Krea 2 or
    Anima pipeline as ComfyUI keeps it under `root` (its models folder): the transformer in its
    original layout (Black Forest Labs', Stability AI's, Z-Image's, Krea's, Cosmos's with
    Anima's LLM adapter beside it; Qwen-Image's keeps diffusers' names; under `prefix`) in
    diffusion_models/, the text encoders in text_encoders/
    in the layout their files use (clip_l, clip_g, t5xxl; qwen_3_4b under Qwen3ForCausalLM's
    names, Flux.2 Klein's without its LM head; qwen_2.5_vl_7b under model.*, visual.*;
    qwen_3_vl_8b under transformers' names), the VAE in vae/ in the original layout
    (Qwen-Image's: Wan 2.1's; Flux.2's with its batch-norm statistics). With `single_file`
    (SD3), everything goes into one checkpoints/ file as Stability AI ships it
    (model.diffusion_model.*, text_encoders.*.transformer.*, first_stage_model.*). Returns the
    paths by component ("transformer" for the one file). With `companions_only`, the text
    encoders and the VAE alone (beside a transformer file written otherwise)."""
    root = Path(root)
    transformer = pipeline.transformer
    family = family_of(pipeline)
    assert family.layout is not None, f"{family.title} transformers have no file layout"
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    rows = family.layout.table(config)
    if single_file:
        prefix = arch.UNET
    tensors: dict[str, dict[str, Any]] = {
        "transformer": {
            prefix + k: v for k, v in to_original(rows, transformer.state_dict()).items()
        }
    }
    if companions_only:
        assert not single_file, "a single file holds the transformer"
        tensors = {}
    conditioner = getattr(pipeline, "text_conditioner", None)
    if (
        conditioner is not None and not companions_only
    ):  # Anima's LLM adapter, inside its transformer's file
        tensors["transformer"].update(
            {f"{prefix}llm_adapter.{k}": v for k, v in conditioner.state_dict().items()}
        )
    for component, stem in family.companion_names.items():
        part = getattr(pipeline, component)
        state = part.state_dict()
        kind = type(part).__name__
        if kind in ("Qwen3VLForConditionalGeneration", "AutoencoderKLQwenImage21"):
            pass  # Qwen-Image 2.1's files keep transformers' and diffusers' names
        elif kind == "AutoencoderKLQwenImage":
            state = wan_vae_to_original(state, part.config.num_res_blocks)
        elif component == "vae":  # Flux.2's keeps its batch-norm statistics (bn.*) as they are
            statistics = {k: v for k, v in state.items() if k.startswith("bn.")}
            convolutions = {k: v for k, v in state.items() if k not in statistics}
            levels = len(part.config.block_out_channels)
            state = {k.removeprefix(arch.VAE): v for k, v in _ldm_vae(convolutions, levels).items()}
            state.update(statistics)
        elif kind == "Qwen3ForCausalLM":  # Flux.2 Klein's, as qwen_3_4b holds it: no LM head
            state = {k: v for k, v in state.items() if k != "lm_head.weight"}
        elif kind == "Qwen3Model":
            state = {"model." + k: v for k, v in state.items()}
        elif kind == "Qwen2_5_VLForConditionalGeneration":
            state = {qwen25_vl_to_file(k): v for k, v in state.items()}
        elif kind == "Qwen3VLModel":  # as Qwen3VLForConditionalGeneration saves it
            state = {"model." + k: v for k, v in state.items()}
        elif stem == "t5xxl":
            state = {k: v for k, v in state.items() if k != "encoder.embed_tokens.weight"}
        else:  # transformers' original CLIP names, as the files users download hold them
            state = {
                k if k.startswith((CLIP_PREFIX, "text_projection")) else CLIP_PREFIX + k: v
                for k, v in state.items()
            }
        if single_file:
            inside = SD3_INSIDE[component]
            tensors["transformer"].update({inside + k: v for k, v in state.items()})
        else:
            tensors[component] = state
    folders = {"transformer": "checkpoints" if single_file else "diffusion_models", "vae": "vae"}
    written = {}
    for component, state in tensors.items():
        stem = name if component == "transformer" else family.companion_names[component]
        file = root / folders.get(component, "text_encoders") / f"{stem}.safetensors"
        file.parent.mkdir(parents=True, exist_ok=True)
        write_safetensors(file, {k: v.contiguous() for k, v in state.items()})
        written[component] = file
    return written


def ldm_state_dict(pipeline, *, architecture: str | None = None) -> dict[str, Any]:
    """The pipeline's weights under original-layout names (views, nothing copied where possible)."""
    components = pipeline.components
    family = architecture or (
        "sdxl"
        if components.get("text_encoder_2") is not None
        else "sd2"
        if getattr(components["text_encoder"].config, "hidden_act", "") == "gelu"
        else "sd1"
    )
    out: dict[str, Any] = {}
    unet = components["unet"]
    out.update(_ldm_unet(unet.state_dict(), unet.config, arch.UNET))
    out.update(
        _ldm_vae(components["vae"].state_dict(), len(components["vae"].config.block_out_channels))
    )
    if family == "sdxl":
        out.update(_ldm_clip_hf(components["text_encoder"], SDXL_TEXT_1))
        out.update(_ldm_open_clip(components["text_encoder_2"], SDXL_TEXT_2, extra_layer=False))
    elif family == "sd2":
        out.update(_ldm_open_clip(components["text_encoder"], SD2_TEXT, extra_layer=True))
    else:
        out.update(_ldm_clip_hf(components["text_encoder"], SD1_TEXT))
    return out


_RESNET_TO_LDM = (
    ("norm1", "in_layers.0"),
    ("conv1", "in_layers.2"),
    ("time_emb_proj", "emb_layers.1"),
    ("norm2", "out_layers.0"),
    ("conv2", "out_layers.3"),
    ("conv_shortcut", "skip_connection"),
)


def _ldm_unet(state: dict[str, Any], config, prefix: str) -> dict[str, Any]:
    layers = config.layers_per_block
    up_has_attention = {
        int(k.split(".")[1]) for k in state if k.startswith("up_blocks.") and ".attentions." in k
    }
    top = {
        "time_embedding.linear_1": "time_embed.0",
        "time_embedding.linear_2": "time_embed.2",
        "conv_in": "input_blocks.0.0",
        "conv_norm_out": "out.0",
        "conv_out": "out.2",
        "add_embedding.linear_1": "label_emb.0.0",
        "add_embedding.linear_2": "label_emb.0.2",
    }
    out = {}
    for key, tensor in state.items():
        parts = key.split(".")
        head = ".".join(parts[:2])
        if parts[0] in top:
            name = top[parts[0]] + "." + ".".join(parts[1:])
        elif head in top:
            name = top[head] + "." + ".".join(parts[2:])
        elif parts[0] in ("down_blocks", "up_blocks"):
            block, kind, index, rest = int(parts[1]), parts[2], int(parts[3]), parts[4:]
            first = 1 + block * (layers + 1) if parts[0] == "down_blocks" else block * (layers + 1)
            group = "input_blocks" if parts[0] == "down_blocks" else "output_blocks"
            if kind == "resnets":
                name = f"{group}.{first + index}.0.{_rename(rest, _RESNET_TO_LDM)}"
            elif kind == "attentions":
                name = f"{group}.{first + index}.1.{'.'.join(rest)}"
            elif kind == "downsamplers":
                name = f"{group}.{first + layers}.0.op.{'.'.join(rest[1:])}"
            elif kind == "upsamplers":
                slot = 2 if block in up_has_attention else 1
                name = f"{group}.{first + layers}.{slot}.conv.{'.'.join(rest[1:])}"
            else:
                raise ValueError(f"unexpected UNet weight {key}")
        elif parts[0] == "mid_block":
            kind, index, rest = parts[1], int(parts[2]), parts[3:]
            if kind == "resnets":
                name = f"middle_block.{index * 2}.{_rename(rest, _RESNET_TO_LDM)}"
            else:
                name = f"middle_block.1.{'.'.join(rest)}"
        else:
            raise ValueError(f"unexpected UNet weight {key}")
        out[prefix + name] = tensor
    return out


def _rename(parts: list[str], table) -> str:
    name = ".".join(parts)
    for new, old in table:
        if name.startswith(new + "."):
            return old + name[len(new) :]
    return name


def _ldm_vae(state: dict[str, Any], levels: int) -> dict[str, Any]:
    out = {}
    attention = (
        ("group_norm", "norm"),
        ("to_q", "q"),
        ("to_k", "k"),
        ("to_v", "v"),
        ("to_out.0", "proj_out"),
    )
    for key, tensor in state.items():
        parts = key.split(".")
        side = parts[0]
        if side in ("quant_conv", "post_quant_conv") or parts[1] in ("conv_in", "conv_out"):
            name = key
        elif parts[1] == "conv_norm_out":
            name = f"{side}.norm_out.{parts[2]}"
        elif parts[1] == "mid_block" and parts[2] == "resnets":
            name = f"{side}.mid.block_{int(parts[3]) + 1}." + _rename(
                parts[4:], (("conv_shortcut", "nin_shortcut"),)
            )
        elif parts[1] == "mid_block" and parts[2] == "attentions":
            name = f"{side}.mid.attn_1.{_rename(parts[4:], attention)}"
            if tensor.ndim == 2:
                tensor = tensor.reshape(*tensor.shape, 1, 1)
        elif parts[1] in ("down_blocks", "up_blocks"):
            level = int(parts[2]) if side == "encoder" else levels - 1 - int(parts[2])
            where = "down" if side == "encoder" else "up"
            if parts[3] == "resnets":
                name = f"{side}.{where}.{level}.block.{parts[4]}." + _rename(
                    parts[5:], (("conv_shortcut", "nin_shortcut"),)
                )
            else:
                sampler = "downsample" if side == "encoder" else "upsample"
                name = f"{side}.{where}.{level}.{sampler}.{'.'.join(parts[5:])}"
        else:
            raise ValueError(f"unexpected VAE weight {key}")
        out[arch.VAE + name] = tensor
    return out


def _ldm_clip_hf(model, prefix: str) -> dict[str, Any]:
    out = {}
    for key, tensor in model.state_dict().items():
        if key.endswith("position_ids"):
            continue
        if key == "text_projection.weight":
            out[prefix + key] = tensor
            continue
        out[prefix + "text_model." + key.removeprefix("text_model.")] = tensor
    return out


def _ldm_open_clip(model, prefix: str, *, extra_layer: bool) -> dict[str, Any]:
    import torch

    state = {
        k.removeprefix("text_model."): v
        for k, v in model.state_dict().items()
        if not k.endswith("position_ids")
    }
    out = {
        prefix + "token_embedding.weight": state.pop("embeddings.token_embedding.weight"),
        prefix + "positional_embedding": state.pop("embeddings.position_embedding.weight"),
        prefix + "ln_final.weight": state.pop("final_layer_norm.weight"),
        prefix + "ln_final.bias": state.pop("final_layer_norm.bias"),
    }
    projection = state.pop("text_projection.weight", None)
    hidden = out[prefix + "token_embedding.weight"].shape[1]
    if projection is not None:
        out[prefix + "text_projection"] = projection.T
    else:
        out[prefix + "text_projection"] = torch.eye(
            hidden, dtype=out[prefix + "ln_final.weight"].dtype
        )
    layers = model.config.num_hidden_layers
    names = (
        ("layer_norm1", "ln_1"),
        ("layer_norm2", "ln_2"),
        ("mlp.fc1", "mlp.c_fc"),
        ("mlp.fc2", "mlp.c_proj"),
        ("self_attn.out_proj", "attn.out_proj"),
    )
    for n in range(layers):
        layer = f"encoder.layers.{n}."
        block = f"{prefix}transformer.resblocks.{n}."
        for kind in ("weight", "bias"):
            out[block + f"attn.in_proj_{kind}"] = torch.cat(
                [state.pop(f"{layer}self_attn.{p}_proj.{kind}") for p in "qkv"]
            )
        for key in [k for k in state if k.startswith(layer)]:
            out[block + _rename(key[len(layer) :].split("."), names)] = state.pop(key)
    if state:
        raise ValueError(f"unexpected text encoder weight {next(iter(state))}")
    if extra_layer:
        template = f"{prefix}transformer.resblocks.{layers - 1}."
        for key in [k for k in out if k.startswith(template)]:
            out[f"{prefix}transformer.resblocks.{layers}." + key[len(template) :]] = (
                torch.zeros_like(out[key])
            )
    return out


# Random full-size models (tests and benchmarks) --------------------------------------------


def _fill_from_pool(model, pool) -> None:
    """Give every parameter real storage in the pool's dtype: norms 1/0, the rest tiled from
    `pool` (shifted between tensors so equal-shaped weights differ)."""
    import torch

    offset = 0
    for module in model.modules():
        norm = isinstance(module, (torch.nn.GroupNorm, torch.nn.LayerNorm))
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            flat = torch.empty(param.numel(), dtype=pool.dtype)
            if norm:
                flat.fill_(1.0 if name == "weight" else 0.0)
            done = 0
            while not norm and done < flat.numel():
                start = offset % pool.numel()
                take = min(flat.numel() - done, pool.numel() - start)
                flat[done : done + take] = pool[start : start + take]
                done += take
                offset += take + 7
            module._parameters[name] = torch.nn.Parameter(
                flat.view(param.shape), requires_grad=False
            )


def build_random_pipeline(
    config_name: str = "sd1", *, dtype: str = "fp16", seed: int = 0, weights: bool = True
):
    """A full-size pipeline of a shipped config with random weights, built straight in `dtype`.

    Normalisation layers get weight 1 and bias 0; every other weight is filled from a pool of
    N(0, 0.02) samples (one random draw per call, tiled), which keeps building an SDXL-size
    model to seconds. An untrained model with realistic sizes, for load tests and benchmarks.
    `weights=False` leaves the parameters on the meta device (shapes only, no memory).
    """
    import diffusers
    import torch
    import transformers

    folder = config_folder(config_name)
    target = torch_dtype(dtype)
    generator = torch.Generator().manual_seed(seed)
    pool = torch.randn(1 << 20, generator=generator).mul_(0.02).to(target)

    def materialise(model):
        if not weights:
            return model.eval()
        with one_torch_thread():  # plain copies; a second thread only waits (see checkpoint)
            _fill_from_pool(model, pool)
        return model.eval()

    def text_encoder(name: str):
        config = read_json(folder / name / "config.json")
        model_class = getattr(transformers, config["architectures"][0])
        return materialise(empty(model_class, model_class.config_class(**config)))

    components: dict[str, Any] = {
        "unet": materialise(
            empty(
                diffusers.UNet2DConditionModel.from_config,
                read_json(folder / "unet" / "config.json"),
            )
        ),
        "vae": materialise(
            empty(diffusers.AutoencoderKL.from_config, read_json(folder / "vae" / "config.json"))
        ),
        "text_encoder": text_encoder("text_encoder"),
        "tokenizer": transformers.CLIPTokenizer.from_pretrained(
            folder / "tokenizer", local_files_only=True
        ),
    }
    scheduler_config = read_json(folder / "scheduler" / "scheduler_config.json")
    components["scheduler"] = getattr(diffusers, scheduler_config["_class_name"]).from_config(
        scheduler_config
    )
    if (folder / "text_encoder_2").is_dir():
        components["text_encoder_2"] = text_encoder("text_encoder_2")
        components["tokenizer_2"] = transformers.CLIPTokenizer.from_pretrained(
            folder / "tokenizer_2", local_files_only=True
        )
        return diffusers.StableDiffusionXLPipeline(**components, add_watermarker=False)
    components.update(safety_checker=None, feature_extractor=None)
    return diffusers.StableDiffusionPipeline(**components, requires_safety_checker=False)
