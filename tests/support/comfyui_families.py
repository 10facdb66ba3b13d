"""Planted transformer files of the families ComfyUI v0.29 loads only at (some of) their released
widths: Krea 2, Anima, Qwen-Image, Z-Image and Chroma, written by HalfSafe's layouts from
diffusers' classes in the key layout of the released files, shaped as ComfyUI's detection reads
them (comfy/model_detection.py, comfy/supported_models.py):

- Krea 2: every width is read from the file (heads from the query's rows / 128; the text
  fusion's 20 heads and its 2 + 2 blocks are fixed): tiny.
- Anima: the DiT's width is read; its depth and heads are fixed only at the released 2048 (28
  blocks of 16 heads), else 10 blocks of 16 heads; the LLM adapter is fixed at 1024 wide and 6
  blocks deep: ten 256-wide blocks beside the released-size adapter.
- Qwen-Image: the depth is counted; the width is fixed at 24 heads of 128 and the text at 3584.
- Z-Image: loads as Z-Image only at 3840 wide (30 heads), with two refiner blocks of each kind.
- Chroma: its blocks are 3072 wide (the approximator's output) and its approximator 5120 wide
  and 5 layers deep.

The families fixed at their released width get one or two blocks of it, in fp16 (a few hundred
MB to two GB). Planted: one attention's query projection scaled so that its output passes
fp16's range (65504) while its weights and fp32 hold it, as in comfyui_dits.py.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.comfyui_dits import PLANT_SCALE, save_transformer_file


@dataclass(frozen=True)
class FamilyFile:
    family: str  # HalfSafe's family id, for the file's layout
    planted: str  # the layer scaled, in diffusers' names
    comfyui_layer: str  # the same layer in ComfyUI's module names (its diffusion model's)
    island: str  # the module whose fp32 copy closes the overflow, in ComfyUI's names
    model: str  # ComfyUI's model class for the file (its BaseModel's name)


FAMILY_FILES = {
    "krea2": FamilyFile(
        "krea2", "transformer_blocks.0.attn.to_q", "blocks.0.attn.wq", "blocks.0.attn", "Krea2"
    ),
    "anima": FamilyFile(
        "anima",
        "transformer_blocks.0.attn1.to_q",
        "blocks.0.self_attn.q_proj",
        "blocks.0.self_attn",
        "Anima",
    ),
    "qwenimage": FamilyFile(
        "qwenimage",
        "transformer_blocks.0.attn.to_q",
        "transformer_blocks.0.attn.to_q",
        "transformer_blocks.0.attn",
        "QwenImage",
    ),
    "zimage": FamilyFile(
        "zimage",
        "layers.0.attention.to_q",
        "layers.0.attention.qkv",
        "layers.0.attention",
        "Lumina2",
    ),
    "chroma": FamilyFile(
        "chroma",
        "transformer_blocks.0.attn.to_q",
        "double_blocks.0.img_attn.qkv",
        "double_blocks.0",
        "Chroma",
    ),
}


@contextmanager
def _built_in(dtype):
    """Modules built while inside hold their weights in `dtype` (a released width's blocks in
    fp16 take half the memory and time fp32's would)."""
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _krea2():
    from diffusers import Krea2Transformer2DModel

    return Krea2Transformer2DModel(
        in_channels=64,  # 16 latent channels in 2x2 patches
        num_layers=2,
        attention_head_dim=128,  # ComfyUI counts heads as the query's rows / 128
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=768,  # ComfyUI's SwiGLU: int(2 * 256 / 3) * 4, to a multiple of 128
        timestep_embed_dim=256,
        text_hidden_dim=160,  # ComfyUI fixes the text fusion's heads at 20: 8 wide here
        num_text_layers=3,
        text_num_attention_heads=20,
        text_num_key_value_heads=20,
        text_intermediate_size=512,  # int(2 * 160 / 3) * 4, to a multiple of 128
        num_layerwise_text_blocks=2,
        num_refiner_text_blocks=2,
        axes_dims_rope=(32, 48, 48),
    )


def _anima():
    from diffusers import CosmosTransformer3DModel

    from app.core.families.anima_pipeline import without_padding_channel

    transformer = CosmosTransformer3DModel(
        in_channels=16,
        out_channels=16,
        num_attention_heads=16,  # ComfyUI's MiniTrainDIT off the released widths: 16 heads,
        attention_head_dim=16,
        num_layers=10,  # 10 blocks
        text_embed_dim=1024,  # the adapter's output, fixed
        adaln_lora_dim=256,
        max_size=(128, 240, 240),
        patch_size=(1, 2, 2),
        rope_scale=(1.0, 4.0, 4.0),
        concat_padding_mask=True,
        extra_pos_embed_type=None,
    )
    return without_padding_channel(transformer)  # as HalfSafe runs it; its layout adds it back


def _anima_adapter():
    from diffusers import AnimaTextConditioner

    return AnimaTextConditioner()  # the released adapter's shape, which ComfyUI fixes


def _qwenimage():
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=1,
        attention_head_dim=128,
        num_attention_heads=24,
        joint_attention_dim=3584,
        axes_dims_rope=(16, 56, 56),
    )


def _zimage():
    from diffusers import ZImageTransformer2DModel

    return ZImageTransformer2DModel(
        dim=3840,
        n_layers=2,  # ComfyUI reads fp16's permission from the last block but one
        n_refiner_layers=2,
        n_heads=30,
        n_kv_heads=30,
        cap_feat_dim=64,  # read from the file
        axes_dims=[32, 48, 48],
        axes_lens=[1536, 512, 512],
    )


def _chroma():
    from diffusers import ChromaTransformer2DModel

    return ChromaTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=128,
        num_attention_heads=24,
        joint_attention_dim=64,  # read from the file
        axes_dims_rope=(16, 56, 56),
    )


BUILDERS: dict[str, Callable[[], Any]] = {
    "krea2": _krea2,
    "anima": _anima,
    "qwenimage": _qwenimage,
    "zimage": _zimage,
    "chroma": _chroma,
}


def family_transformer(family: str, seed: int = 0):
    """The `family` transformer in the shape above, its weights drawn in fp16 from `seed`."""
    import torch

    torch.manual_seed(seed)
    with _built_in(torch.float16):
        transformer = BUILDERS[family]().eval().requires_grad_(False)
    return transformer


def family_adapter(seed: int = 1):
    """Anima's LLM adapter at the released shape ComfyUI fixes, its weights drawn in fp16."""
    import torch

    torch.manual_seed(seed)
    with _built_in(torch.float16):
        return _anima_adapter().eval().requires_grad_(False)


def write_family_file(family: str, folder: str | Path, planted: bool) -> Path:
    """A `family` transformer file in fp16 under `folder`, with its query projection planted
    past fp16's range or not."""
    transformer = family_transformer(family)
    if planted:
        _plant(family, transformer)
    return _saved(family, transformer, Path(folder), planted)


def write_family_files(
    family: str, folder: str | Path, planted_in: str | Path | None = None
) -> tuple[Path, Path, dict[str, Any]]:
    """`write_family_file`'s healthy file under `folder`, then its planted one under
    `planted_in` (else `folder`), both from one transformer drawn once (a released width's
    draw is most of the time its files take). Returns the planted and the healthy file, and
    the transformer's config with its class's name."""
    transformer = family_transformer(family)
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    healthy = _saved(family, transformer, Path(folder), False)
    _plant(family, transformer)
    planted = _saved(family, transformer, Path(planted_in or folder), True)
    return planted, healthy, config


def _plant(family: str, transformer) -> None:
    import torch

    layer = transformer.get_submodule(FAMILY_FILES[family].planted)
    assert isinstance(layer, torch.nn.Linear)
    layer.weight.mul_(PLANT_SCALE)


def _saved(family: str, transformer, folder: Path, planted: bool) -> Path:
    from app.core.checkpoint import write_safetensors

    name = f"{family}_{'planted' if planted else 'healthy'}.safetensors"
    path = save_transformer_file(transformer, folder / name)
    if family == "anima":  # the LLM adapter beside the DiT, as Anima's file keeps it
        from safetensors.torch import load_file

        adapter = family_adapter()
        state = load_file(str(path))
        state.update({f"llm_adapter.{k}": v.half() for k, v in adapter.state_dict().items()})
        write_safetensors(path, state)
    return path


# The tiny text encoder and VAE the desktop loads beside a released-width file, the encoder as
# wide as the file reads its text: Z-Image's and Chroma's read its width (64 here); Qwen-Image's
# text input is fixed at Qwen2.5-VL 7B's 3584 (one layer here: 1.3 B parameters, nearly all its
# vocabulary's and LM head's, in fp16 as Comfy-Org's file).
DESKTOP_COMPANIONS = {
    "zimage": ("build_tiny_zimage_pipeline", "tiny_qwen3", {"hidden": 64}),
    "chroma": ("build_tiny_chroma_pipeline", "tiny_t5", {"hidden": 64}),
    "qwenimage": ("build_tiny_qwenimage_pipeline", "tiny_qwen25_vl", {"hidden": 3584, "layers": 1}),
}


def write_desktop_folder(family: str, folder: str | Path) -> tuple[Path, Path, Path]:
    """`write_family_files` under `folder`, the planted file in a ComfyUI models folder there
    (its diffusion_models/) with the companions the desktop loads it with
    (`DESKTOP_COMPANIONS`) in their folders; and beside them, the planted transformer's config
    with its class's name (for the layout's layer names), as JSON. Returns the planted file,
    the healthy one and the config's path."""
    import json

    from tests.support import tiny_models
    from tests.support.model_files import save_split_files

    models = Path(folder) / "models"
    (models / "diffusion_models").mkdir(parents=True, exist_ok=True)
    planted, healthy, config = write_family_files(family, folder, models / "diffusion_models")
    builder, encoder, sizes = DESKTOP_COMPANIONS[family]
    pipeline = getattr(tiny_models, builder)()
    pipeline.text_encoder = getattr(tiny_models, encoder)(2, **sizes)
    if family == "qwenimage":
        pipeline.text_encoder.half()
    save_split_files(pipeline, models, companions_only=True)
    written = Path(folder) / f"{family}_planted_config.json"
    written.write_text(json.dumps(config), encoding="utf-8")
    return planted, healthy, written
