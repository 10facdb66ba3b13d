"""The family conformance rows, one per family (tests/core/test_families.py runs every family
through the same tests): the family's tiny pipeline (`tests/support/tiny_models.py`), what
detection calls it and why, the components the health check probes, where fp16 overflows are
planted (each one layer's weights scaled so that its output passes 65504 in fp16 and stays
finite in fp32), and the generations that must repair one; and a row's pipeline held in memory
as a loaded model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from app.core.families import FamilyId
from tests.support import tiny_models
from tests.support.family_helpers import in_memory


@dataclass(frozen=True)
class KnownFix:
    """A fix HalfSafe knows for an overflow (a candidate of this `kind`): the check must find it
    verified, with these settings and these layers wider, and choose it."""

    kind: str
    settings: Mapping[str, Any]
    islands: Mapping[str, str]


@dataclass(frozen=True)
class Plant:
    """`layer` of `component` with its weights scaled by `factor`: past fp16, finite in fp32."""

    component: str
    layer: str
    factor: float
    known: KnownFix | None = None
    # What the fp16 run shows: "overflow" (past 65504) or "nan" (the inf went on through a
    # norm or an attention's softmax).
    status: str = "overflow"
    # Whether the component's own output passes 65504 (False where a final norm brings it
    # back in range: the Qwen text encoders'), so that its headroom is below 1.
    output_past_fp16: bool = True


@dataclass(frozen=True)
class Repair:
    """A generation at `cfg` that must find `plant` with the NaN watch and repair it."""

    plant: Plant
    cfg: float


@dataclass(frozen=True)
class Row:
    build: Callable[[], Any]  # () -> the family's tiny pipeline
    architecture: str  # what detection calls that pipeline
    prediction: str  # the prediction type a loaded model of it has
    components: tuple[str, ...]  # what the health check probes, in run order
    # How detection describes its diffusers folder: the sentence's start, then phrases in it.
    because: tuple[str, ...]
    plants: Mapping[str, Plant]  # the denoiser's first
    repairs: tuple[Repair, ...]
    sampler: str  # the PNG's sampler and guidance for a request at {cfg}
    slow_folder: bool = False  # writing and reading its folder takes many seconds here
    slow_checks: bool = False  # its planted checks take minutes here (40 blocks to walk)
    # Components run in fp32 when fp16 is asked for, as the model's own config says (SDXL's
    # original VAE asks for it through `force_upcast`).
    fp32: tuple[str, ...] = ()
    # Its tiny pipeline as its files can hold it, where `build`'s parts are narrower than any
    # file's fixed widths (Qwen2.5-VL's heads are 128 wide).
    build_files: Callable[[], Any] | None = None
    # What its diffusers folder is detected as, and how, where only a file's name tells the
    # variant (Qwen-Image 2.1 Turbo's weights and pipeline are the base model's).
    folder: tuple[str, tuple[str, ...]] | None = None

    def folder_architecture(self) -> str:
        return self.folder[0] if self.folder else self.architecture

    def folder_because(self) -> tuple[str, ...]:
        return self.folder[1] if self.folder else self.because


VAE_LAYER = "decoder.up_blocks.0.resnets.0.conv1"  # every family's VAE decoder has it
UNET_FF = "down_blocks.0.attentions.0.transformer_blocks.0.ff.net.0.proj"
CLIP_MLP = "encoder.layers.0.mlp.fc1"
T5_WO = "encoder.block.{}.layer.1.DenseReluDense.wo"
# The known T5 fix: only the feed-forward output projection of each block in fp32.
T5_ISLAND = KnownFix(
    "t5_feed_forward",
    {"t5_fp32_feed_forward": True},
    {T5_WO.format(0): "fp32", T5_WO.format(1): "fp32"},  # the tiny T5s have two blocks
)
FLUX_DOUBLE = "transformer_blocks.0.ff.net.2"
FLUX_SINGLE = "single_transformer_blocks.1.proj_out"
MMDIT_BLOCK = "transformer_blocks.0.ff.net.2"
ZIMAGE_BLOCK = "layers.0.feed_forward.w2"
QWENIMAGE_BLOCK = "transformer_blocks.0.img_mlp.net.2"
QWENIMAGE21_BLOCK = "transformer_blocks.0.img_mlp.out"
KREA2_BLOCK = "transformer_blocks.0.ff.down"

SD_PLANTS = {
    "unet": Plant("unet", UNET_FF, 1e5),
    "text_encoder": Plant("text_encoder", CLIP_MLP, 1e5),
    "vae": Plant("vae", VAE_LAYER, 1e6),
}
SDXL_PLANTS = {"unet": Plant("unet", UNET_FF, 1e5)}
FLUX_PLANTS = {
    "double_block": Plant("transformer", FLUX_DOUBLE, 1e5),
    "single_block": Plant("transformer", FLUX_SINGLE, 1e5),
    "t5": Plant("text_encoder_2", T5_WO.format(0), 1e5, T5_ISLAND),
    "vae": Plant("vae", VAE_LAYER, 1e6),
}
CHROMA_PLANTS = {
    "double_block": Plant("transformer", FLUX_DOUBLE, 1e6),
    "single_block": Plant("transformer", FLUX_SINGLE, 1e6),
    "t5": Plant("text_encoder", T5_WO.format(0), 1e5, T5_ISLAND),
    "vae": Plant("vae", VAE_LAYER, 1e6),
}
SD3_PLANTS = {
    "joint_block": Plant("transformer", MMDIT_BLOCK, 1e6, status="nan"),
    "t5": Plant("text_encoder_3", T5_WO.format(0), 1e5, T5_ISLAND),
    "vae": Plant("vae", VAE_LAYER, 1e6),
}
ZIMAGE_PLANTS = {
    "joint_block": Plant("transformer", ZIMAGE_BLOCK, 1e6, status="nan"),
    "qwen3": Plant("text_encoder", "layers.0.mlp.down_proj", 1e6, output_past_fp16=False),
    "vae": Plant("vae", VAE_LAYER, 1e6),
}
QWENIMAGE_PLANTS = {
    "block": Plant("transformer", QWENIMAGE_BLOCK, 1e6),
    "qwen25_vl": Plant(
        "text_encoder",
        "model.language_model.layers.0.mlp.down_proj",
        1e6,
        output_past_fp16=False,
    ),
    "vae": Plant("vae", VAE_LAYER, 1e6),
}
FLUX2_DOUBLE = "transformer_blocks.0.ff.linear_out"
FLUX2_SINGLE = "single_transformer_blocks.1.attn.to_out"
# A single block's layers all sit inside its attention (the MLP's input fused with q, k, v):
# an island there is that whole attention.
FLUX2_PLANTS = {
    "double_block": Plant("transformer", FLUX2_DOUBLE, 1e6, status="nan"),
    "single_block": Plant("transformer", FLUX2_SINGLE, 1e6),
    "mistral3": Plant(
        "text_encoder",
        "model.language_model.layers.0.mlp.down_proj",
        1e6,
        output_past_fp16=False,
    ),
    "vae": Plant("vae", VAE_LAYER, 1e6),
}
FLUX2_KLEIN_PLANTS = {
    **{name: plant for name, plant in FLUX2_PLANTS.items() if name != "mistral3"},
    "qwen3": Plant("text_encoder", "model.layers.0.mlp.down_proj", 1e6, output_past_fp16=False),
}
QWENIMAGE21_PLANTS = {
    "block": Plant("transformer", QWENIMAGE21_BLOCK, 1e6, status="nan"),
    "qwen3_vl": Plant(
        "text_encoder",
        "model.language_model.layers.0.mlp.down_proj",
        1e6,
        output_past_fp16=False,
    ),
    "vae": Plant("vae", VAE_LAYER, 1e6, status="nan"),
}
KREA2_PLANTS = {
    # The inf reaches the next block's norm: NaN.
    "block": Plant("transformer", KREA2_BLOCK, 1e6, status="nan"),
    "qwen3_vl": Plant(
        "text_encoder",
        "language_model.layers.0.mlp.down_proj",
        1e6,
        output_past_fp16=False,
    ),
    "vae": Plant("vae", VAE_LAYER, 1e6),
}
ANIMA_BLOCK = "transformer_blocks.0.ff.net.2"
# Anima 2.9B's last block, past the 28 of Anima 2B: a loader of 28 would never run it.
ANIMA_LAST_BLOCK = Plant("transformer", "transformer_blocks.39.ff.net.2", 1e6, status="nan")
ANIMA_PLANTS = {
    # The inf reaches the next block's norm: NaN.
    "block": Plant("transformer", ANIMA_BLOCK, 1e6, status="nan"),
    # Anima reads the prompt's own tokens, no chat format: smaller activations than Z-Image's.
    "qwen3": Plant("text_encoder", "layers.0.mlp.down_proj", 1e8, status="nan"),
    # The inf reaches the conditioner's next norm: NaN.
    "conditioner": Plant("text_conditioner", "blocks.0.mlp.2", 1e6, status="nan"),
    "vae": Plant("vae", VAE_LAYER, 1e6),
}
# FLUX.3: the image's per-mode block's feed-forward output (the inf reaches the joint blocks'
# norm: NaN), a joint single block's; Qwen3-VL's first MLP (FLUX.3 reads inner layers' states,
# no final norm between: they overflow too).
FLUX3_MODE_BLOCK = "mode_blocks.image.0.ff.linear_out"
FLUX3_SINGLE = "single_transformer_blocks.1.ff.linear_out"
FLUX3_PLANTS = {
    "mode_block": Plant("transformer", FLUX3_MODE_BLOCK, 1e6, status="nan"),
    # The inf reaches the next single block's norm: NaN.
    "single_block": Plant("transformer", FLUX3_SINGLE, 1e6, status="nan"),
    "qwen3_vl": Plant(
        "text_encoder",
        "model.language_model.layers.0.mlp.down_proj",
        1e6,
        output_past_fp16=False,
    ),
    "vae": Plant("vae", VAE_LAYER, 1e6),
}
FLOW = "Sampler: Euler, CFG scale: {cfg:g}"

ROWS: dict[str, Row] = {
    "sd": Row(
        tiny_models.build_tiny_sd_pipeline,
        "sd1",
        "epsilon",
        ("text_encoder", "unet", "vae"),
        ("Stable Diffusion 1.x",),
        SD_PLANTS,
        (Repair(SD_PLANTS["unet"], 7.0),),
        "Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: {cfg:g}",
    ),
    "sdxl": Row(
        tiny_models.build_tiny_sdxl_pipeline,
        "sdxl",
        "epsilon",
        ("text_encoder", "text_encoder_2", "unet", "vae"),
        ("SDXL",),
        SDXL_PLANTS,
        (Repair(SDXL_PLANTS["unet"], 7.0),),
        "Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: {cfg:g}",
        fp32=("vae",),
    ),
    "flux": Row(
        tiny_models.build_tiny_flux_pipeline,
        "flux-dev",
        "flow",
        ("text_encoder", "text_encoder_2", "transformer", "vae"),
        (
            "Flux.1 dev",
            "FluxTransformer2DModel with 1 double and 2 single blocks",
            "a guidance embedding",
        ),
        FLUX_PLANTS,
        (Repair(Plant("transformer", FLUX_SINGLE, 1e6), 3.5),),
        # As Forge writes Flux's: no CFG batch, the guidance embedding's scale beside it.
        "Sampler: Euler, CFG scale: 1, Distilled CFG Scale: {cfg:g}",
    ),
    "chroma": Row(
        tiny_models.build_tiny_chroma_pipeline,
        "chroma",
        "flow",
        ("text_encoder", "transformer", "vae"),
        ("Chroma: its ChromaPipeline", "a T5 text encoder only"),
        CHROMA_PLANTS,
        (Repair(CHROMA_PLANTS["single_block"], 5.0),),
        FLOW,
    ),
    "sd3": Row(
        tiny_models.build_tiny_sd3_pipeline,
        "sd3",
        "flow",
        ("text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"),
        ("SD3.5 Large-shaped", "2 joint blocks", "CLIP-L, CLIP-G and T5 text encoders"),
        SD3_PLANTS,
        (Repair(SD3_PLANTS["joint_block"], 4.5),),
        FLOW,
        slow_folder=True,  # about 20 s here: writing and reading five components
    ),
    # Z-Image Turbo, and Z-Image Base (its own row: its own scheduler, defaults and probe).
    "zimage": Row(
        tiny_models.build_tiny_zimage_pipeline,
        "zimage-turbo",
        "flow",
        ("text_encoder", "transformer", "vae"),
        (
            "Z-Image Turbo: its ZImagePipeline",
            "a Qwen3 text encoder",
            "its scheduler shifts the schedule by 3, as Z-Image Turbo's does",
        ),
        ZIMAGE_PLANTS,
        # Without CFG, as Turbo samples; with it, as some ask of it.
        (Repair(ZIMAGE_PLANTS["joint_block"], 1.0), Repair(ZIMAGE_PLANTS["joint_block"], 4.0)),
        FLOW,
    ),
    "zimage-base": Row(
        lambda: tiny_models.build_tiny_zimage_pipeline(base=True),
        "zimage-base",
        "flow",
        ("text_encoder", "transformer", "vae"),
        (
            "Z-Image Base: its ZImagePipeline",
            "a Qwen3 text encoder",
            "its scheduler shifts the schedule by 6, as Z-Image Base's does",
        ),
        ZIMAGE_PLANTS,
        # At its own CFG 4 (the negative prompt's branch runs), and without CFG.
        (Repair(ZIMAGE_PLANTS["joint_block"], 4.0), Repair(ZIMAGE_PLANTS["joint_block"], 1.0)),
        FLOW,
    ),
    "qwenimage": Row(
        tiny_models.build_tiny_qwenimage_pipeline,
        "qwenimage",
        "flow",
        ("text_encoder", "transformer", "vae"),
        ("Qwen-Image: its QwenImagePipeline", "a Qwen2.5-VL text encoder"),
        QWENIMAGE_PLANTS,
        # Its causal 3D VAE is repaired as any VAE is: the same latents decoded again.
        (Repair(QWENIMAGE_PLANTS["block"], 4.0), Repair(QWENIMAGE_PLANTS["vae"], 4.0)),
        FLOW,
        slow_folder=True,  # about 10 s here: saving and loading a 151,669-token embedding
        build_files=lambda: tiny_models.build_tiny_qwenimage_pipeline(text_width=128),
    ),
    "flux2": Row(
        tiny_models.build_tiny_flux2_pipeline,
        "flux2-dev",
        "flow",
        ("text_encoder", "transformer", "vae"),
        (
            "Flux.2 dev: its Flux2Pipeline",
            "Flux2Transformer2DModel with 1 double and 2 single blocks",
            "on 32-channel latents",
            "a guidance embedding",
            "a Mistral 3 text encoder (Mistral3ForConditionalGeneration)",
        ),
        FLUX2_PLANTS,
        (Repair(FLUX2_PLANTS["single_block"], 4.0),),
        # As Forge writes a guidance-distilled Flux's: the embedding's scale beside CFG 1.
        "Sampler: Euler, CFG scale: 1, Distilled CFG Scale: {cfg:g}",
    ),
    "flux2klein": Row(
        tiny_models.build_tiny_flux2_klein_pipeline,
        "flux2-klein",
        "flow",
        ("text_encoder", "transformer", "vae"),
        (
            "Flux.2 Klein: its Flux2KleinPipeline",
            "no guidance embedding",
            "a Qwen3 text encoder (Qwen3ForCausalLM)",
            "real CFG",
        ),
        FLUX2_KLEIN_PLANTS,
        # Real CFG (the base model's), and without it.
        (
            Repair(FLUX2_KLEIN_PLANTS["double_block"], 4.0),
            Repair(FLUX2_KLEIN_PLANTS["single_block"], 1.0),
        ),
        FLOW,
        slow_folder=True,  # saving and loading a 151,669-token embedding
    ),
    "qwenimage21": Row(
        tiny_models.build_tiny_qwenimage21_pipeline,
        "qwenimage21",
        "flow",
        ("text_encoder", "transformer", "vae"),
        ("Qwen-Image 2.1: its QwenImage21Pipeline", "a Qwen3-VL text encoder"),
        QWENIMAGE21_PLANTS,
        # Sampled without CFG by default, with it when asked; its VAE repaired as any VAE is.
        (
            Repair(QWENIMAGE21_PLANTS["block"], 1.0),
            Repair(QWENIMAGE21_PLANTS["block"], 4.0),
            Repair(QWENIMAGE21_PLANTS["vae"], 1.0),
        ),
        FLOW,
        slow_folder=True,  # saving and loading a 151,669-token embedding, as Qwen-Image's
    ),
    # Qwen-Image 2.1 Turbo: the base model's transformer and pipeline, run at Turbo's 8 steps
    # without CFG (diffusers' Turbo blocks sample the base model's shifted grid, one call a
    # step). Its files are told by their name; a diffusers folder of it is the base model's.
    "qwenimage21-turbo": Row(
        tiny_models.build_tiny_qwenimage21_pipeline,
        "qwenimage21-turbo",
        "flow",
        ("text_encoder", "transformer", "vae"),
        ("Qwen-Image 2.1 Turbo, as the file's name says", "8 steps at CFG scale 1"),
        {"block": QWENIMAGE21_PLANTS["block"]},
        (Repair(QWENIMAGE21_PLANTS["block"], 1.0),),
        FLOW,
        slow_folder=True,  # saving and loading a 151,669-token embedding, as Qwen-Image's
        folder=("qwenimage21", ("Qwen-Image 2.1: its QwenImage21Pipeline",)),
    ),
    "krea2": Row(
        # Read where Krea 2 reads its 36-layer encoder, as its transformer file is run.
        lambda: tiny_models.build_tiny_krea2_pipeline(released_taps=True),
        "krea2",
        "flow",
        ("text_encoder", "transformer", "vae"),
        ("Krea 2: its Krea2Pipeline", "reading 12 layers of a Qwen3-VL text encoder"),
        KREA2_PLANTS,
        # Without guidance (as Turbo samples) and with it (the base model's CFG 5.5).
        (Repair(KREA2_PLANTS["block"], 1.0), Repair(KREA2_PLANTS["block"], 5.5)),
        FLOW,
        slow_folder=True,  # saving and loading a 151,669-token embedding, as Qwen-Image's
    ),
    FamilyId("anima"): Row(
        tiny_models.build_tiny_anima_pipeline,
        "anima",
        "flow",
        ("text_encoder", "text_conditioner", "transformer", "vae"),
        (
            "Anima: its AnimaModularPipeline",
            "a Cosmos DiT (CosmosTransformer3DModel) with 2 blocks, 32 wide",
            "a text conditioner (AnimaTextConditioner) over a Qwen3 text encoder (Qwen3Model)",
        ),
        ANIMA_PLANTS,
        # With CFG (Anima's recommended 4-5) and without it.
        (Repair(ANIMA_PLANTS["block"], 4.0), Repair(ANIMA_PLANTS["block"], 1.0)),
        FLOW,
        slow_folder=True,  # saving and loading a 151,669-token embedding, as Z-Image's
    ),
    # Anima 2.9B: the same blocks, 40 of them (the count read from the file, never assumed).
    "anima-2.9b": Row(
        lambda: tiny_models.build_tiny_anima_pipeline(layers=40),
        "anima",
        "flow",
        ("text_encoder", "text_conditioner", "transformer", "vae"),
        (
            "Anima: its AnimaModularPipeline",
            "a Cosmos DiT (CosmosTransformer3DModel) with 40 blocks, 32 wide",
        ),
        # Its last block's: the walk through all 40 (the first block's plant is Anima's own).
        {"last_block": ANIMA_LAST_BLOCK},
        (Repair(ANIMA_LAST_BLOCK, 4.0),),
        FLOW,
        slow_folder=True,  # saving and loading a 151,669-token embedding, as Anima's
        slow_checks=True,
    ),
    FamilyId("flux3"): Row(
        tiny_models.build_tiny_flux3_pipeline,
        "flux3-base",
        "flow",
        ("text_encoder", "transformer", "vae"),
        (
            "FLUX.3 base: its Flux3ModularPipeline",
            "a Flux3Transformer2DModel with 1 per-mode and 2 single blocks, 64 wide",
            "8 layers of a Qwen3-VL text encoder (Qwen3VLForConditionalGeneration)",
            "real CFG (50 steps, CFG 3.5)",
        ),
        FLUX3_PLANTS,
        # With CFG (the blocks' default 3.5) and without it.
        (Repair(FLUX3_PLANTS["mode_block"], 3.5), Repair(FLUX3_PLANTS["single_block"], 1.0)),
        FLOW,
        slow_folder=True,  # saving and loading a 151,669-token embedding
    ),
    FamilyId("flux3klein"): Row(
        lambda: tiny_models.build_tiny_flux3_pipeline(distilled=True),
        "flux3-klein",
        "flow",
        ("text_encoder", "transformer", "vae"),
        (
            "FLUX.3 Klein: its Flux3DistilledModularPipeline",
            "a flow map, told the timestep each step jumps to; 16 steps without CFG",
        ),
        FLUX3_PLANTS,
        # No CFG whatever is asked: one call a step, and the PNG says CFG 1.
        (Repair(FLUX3_PLANTS["mode_block"], 1.0), Repair(FLUX3_PLANTS["single_block"], 4.0)),
        "Sampler: Euler, CFG scale: 1",
        slow_folder=True,  # saving and loading a 151,669-token embedding
    ),
}


def loaded(pipeline, name: str, key: str):
    row = ROWS[name]
    return in_memory(pipeline, f"{name}-{key}", row.architecture, row.prediction)


def planted(name: str, plant: Plant):
    """A fresh tiny pipeline of the row with `plant` in it."""
    pipeline = ROWS[name].build()
    with torch.no_grad():
        getattr(pipeline, plant.component).get_submodule(plant.layer).weight.mul_(plant.factor)
    return pipeline


def family_model(family_id):
    """The family's row's tiny pipeline, held in memory as a loaded model of the family."""
    row = ROWS[family_id]
    return in_memory(row.build(), family_id, row.architecture, row.prediction)
