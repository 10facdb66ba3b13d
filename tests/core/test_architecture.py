"""Architecture detection and config inference on the key sets of real-size and small models.

Real-size key sets come from full-size pipelines built on the meta device (shapes only, no
memory) and written out under original-layout names, so every SD1.x, SD2.x and SDXL tensor
name and shape is checked without a download.
"""

from __future__ import annotations

import json

import pytest

from app.core import architecture as arch
from app.core import families
from app.core.families.sd import SD2_TEXT
from app.core.families.sdxl import SDXL_TEXT_1
from app.core.formats.layouts import count_indices
from app.core.models import config_folder
from app.core.paths import resource
from tests.support.model_files import build_random_pipeline, ldm_state_dict


@pytest.fixture(scope="module")
def real_shapes():
    shapes = {}
    for name in ("sd1", "sd2", "sdxl"):
        pipeline = build_random_pipeline(name, weights=False)
        shapes[name] = {k: tuple(v.shape) for k, v in ldm_state_dict(pipeline).items()}
    return shapes


def shipped(name: str, component: str) -> dict:
    return json.loads(resource("configs", name, component, "config.json").read_text())


UNET_FIELDS = (
    "in_channels",
    "out_channels",
    "block_out_channels",
    "layers_per_block",
    "down_block_types",
    "up_block_types",
    "cross_attention_dim",
    "attention_head_dim",
    "use_linear_projection",
    "norm_num_groups",
    "sample_size",
)


def test_sd1_real_key_set(real_shapes):
    detection = families.detect_architecture(
        real_shapes["sd1"], name="v1-5-pruned-emaonly.safetensors"
    )
    assert (detection.architecture, detection.supported) == ("sd1", True)
    assert (detection.prediction_type, detection.native_size) == ("epsilon", 512)
    assert detection.pipeline_class == "StableDiffusionPipeline" and detection.has_vae
    assert "768-wide text features" in detection.because
    assert "CLIP ViT-L (768 wide, 12 layers)" in detection.because
    unet = arch.infer_unet_config(real_shapes["sd1"], shipped("sd1", "unet"), sample_size=512)
    base = shipped("sd1", "unet")
    assert {f: unet[f] for f in UNET_FIELDS} == {f: base.get(f, False) for f in UNET_FIELDS}
    assert (
        unet["transformer_layers_per_block"] == 1
        and unet["mid_block_type"] == "UNetMidBlock2DCrossAttn"
    )
    text = arch.infer_text_encoder_config(
        real_shapes["sd1"], shipped("sd1", "text_encoder"), detection.text_encoders[0]
    )
    assert text == shipped("sd1", "text_encoder")
    vae = arch.infer_vae_config(real_shapes["sd1"], shipped("sd1", "vae"), sample_size=512)
    assert {k: v for k, v in vae.items() if k in shipped("sd1", "vae")} == {
        k: v for k, v in shipped("sd1", "vae").items() if k != "_diffusers_version"
    }


def test_sd2_real_key_set_drops_the_unused_last_text_layer(real_shapes):
    shapes = real_shapes["sd2"]
    assert count_indices(shapes, SD2_TEXT + "transformer.resblocks.") == 24
    detection = families.detect_architecture(shapes, name="v2-1_768-ema-pruned.safetensors")
    assert (detection.architecture, detection.prediction_type) == ("sd2", "v_prediction")
    assert (detection.native_size, detection.config_name) == (768, "sd2-v")
    assert "1024-wide text features" in detection.because and "768" in detection.because
    text = arch.infer_text_encoder_config(
        shapes, shipped("sd2", "text_encoder"), detection.text_encoders[0]
    )
    assert text == shipped("sd2", "text_encoder")  # 23 layers, 16 heads, gelu
    base = shipped("sd2-v", "unet")
    unet = arch.infer_unet_config(shapes, base, sample_size=768)
    assert {f: unet[f] for f in UNET_FIELDS} == {f: base[f] for f in UNET_FIELDS}
    assert unet["upcast_attention"] is True


@pytest.mark.parametrize(
    ("name", "metadata", "sidecar", "expected"),
    [
        ("v2-1_512-ema-pruned.safetensors", {}, None, ("epsilon", 512, "sd2")),
        ("my-finetune.safetensors", {}, None, ("v_prediction", 768, "sd2-v")),
        (
            "my-finetune.safetensors",
            {"ss_v_parameterization": "False"},
            None,
            ("epsilon", 512, "sd2"),
        ),
        (
            "model-512.safetensors",
            {"ss_v_parameterization": "True"},
            None,
            ("v_prediction", 768, "sd2-v"),
        ),
        (
            "model.safetensors",
            {"modelspec.prediction_type": "epsilon"},
            None,
            ("epsilon", 512, "sd2"),
        ),
        (
            "model.safetensors",
            {"modelspec.architecture": "stable-diffusion-v2-768-v"},
            None,
            ("v_prediction", 768, "sd2-v"),
        ),
        (
            "model.safetensors",
            {},
            'model:\n  params:\n    parameterization: "v"\n',
            ("v_prediction", 768, "sd2-v"),
        ),
        (
            "model-768.safetensors",
            {},
            "model:\n  params:\n    linear_start: 0.00085\n",
            ("epsilon", 512, "sd2"),
        ),
    ],
)
def test_sd2_prediction_type_markers(real_shapes, name, metadata, sidecar, expected):
    detection = families.detect_architecture(
        real_shapes["sd2"], metadata=metadata, name=name, sidecar_config=sidecar
    )
    assert (detection.prediction_type, detection.native_size, detection.config_name) == expected


def test_v_pred_marker_tensor_makes_sdxl_v_prediction(real_shapes):
    shapes = {**real_shapes["sdxl"], "v_pred": (0,)}
    detection = families.detect_architecture(shapes)
    assert (detection.architecture, detection.prediction_type) == ("sdxl", "v_prediction")
    lora = families.detect_architecture({"lora_unet_down_blocks_0.lora_down.weight": (4, 320)})
    assert not lora.supported and lora.family_id == ""  # no family runs a LoRA alone
    assert "v_pred marker" in detection.because


def test_sdxl_real_key_set(real_shapes):
    shapes = real_shapes["sdxl"]
    detection = families.detect_architecture(shapes, name="sd_xl_base_1.0.safetensors")
    assert (detection.architecture, detection.native_size) == ("sdxl", 1024)
    assert detection.family_id == "sdxl"  # the family that recognised it, not its words
    assert detection.pipeline_class == "StableDiffusionXLPipeline"
    assert [e.component for e in detection.text_encoders] == ["text_encoder", "text_encoder_2"]
    assert "OpenCLIP ViT-bigG (1280 wide, 32 layers)" in detection.because
    text_2 = arch.infer_text_encoder_config(
        shapes, shipped("sdxl", "text_encoder_2"), detection.text_encoders[1]
    )
    assert text_2 == shipped("sdxl", "text_encoder_2")
    base = shipped("sdxl", "unet")
    unet = arch.infer_unet_config(shapes, base, sample_size=1024, pooled_text_dim=1280)
    assert {f: unet[f] for f in UNET_FIELDS} == {f: base[f] for f in UNET_FIELDS}
    assert unet["transformer_layers_per_block"] == [1, 2, 10]
    assert unet["addition_time_embed_dim"] == 256
    assert unet["projection_class_embeddings_input_dim"] == 2816


def test_inpainting_variant(real_shapes):
    shapes = dict(real_shapes["sd1"])
    shapes[arch.UNET + "input_blocks.0.0.weight"] = (320, 9, 3, 3)
    detection = families.detect_architecture(shapes)
    assert (detection.architecture, detection.supported) == ("sd1-inpaint", True)
    assert detection.pipeline_class == "StableDiffusionInpaintPipeline"
    assert "9 input channels" in detection.because
    unet = arch.infer_unet_config(shapes, shipped("sd1", "unet"))
    assert unet["in_channels"] == 9 and unet["out_channels"] == 4


@pytest.mark.parametrize(
    ("channels", "words"), [(8, "InstructPix2Pix"), (5, "depth-to-image"), (7, "x4 upscaler")]
)
def test_other_input_channel_counts_are_named_and_unsupported(real_shapes, channels, words):
    shapes = dict(real_shapes["sd2"])
    shapes[arch.UNET + "input_blocks.0.0.weight"] = (320, channels, 3, 3)
    detection = families.detect_architecture(shapes)
    assert not detection.supported and words in detection.looks_like


def test_missing_vae_is_noted(real_shapes):
    shapes = {k: v for k, v in real_shapes["sd1"].items() if not k.startswith(arch.VAE)}
    detection = families.detect_architecture(shapes)
    assert detection.supported and not detection.has_vae and detection.notes


def test_old_clip_layout_without_text_model_level(real_shapes):
    shapes = {
        k.replace("cond_stage_model.transformer.text_model.", "cond_stage_model.transformer."): v
        for k, v in real_shapes["sd1"].items()
    }
    detection = families.detect_architecture(shapes)
    assert detection.architecture == "sd1"
    assert detection.text_encoders[0].prefix == "cond_stage_model.transformer."
    text = arch.infer_text_encoder_config(shapes, {}, detection.text_encoders[0])
    assert (text["hidden_size"], text["num_hidden_layers"]) == (768, 12)


def _refiner(shapes_sdxl):
    shapes = {}
    for key, shape in shapes_sdxl.items():
        if key.startswith(SDXL_TEXT_1):
            continue
        shapes[key.replace("conditioner.embedders.1.", "conditioner.embedders.0.")] = shape
    return shapes


def test_unsupported_families_are_named(real_shapes):
    cases = {
        "an SDXL refiner": _refiner(real_shapes["sdxl"]),
        "a LoRA": {
            "lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight": (4, 320),
            "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight": (320, 4),
        },
        "a textual-inversion embedding": {"emb_params": (2, 768)},
        "a standalone VAE": {
            k.removeprefix(arch.VAE): v
            for k, v in real_shapes["sd1"].items()
            if k.startswith(arch.VAE)
        },
        "a Stable Diffusion 3 model": {
            "model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight": (3, 3)
        },
        "a Flux model": {"double_blocks.0.img_attn.qkv.weight": (3, 3)},
        "a ControlNet": {"control_model.input_hint_block.0.weight": (16, 3, 3, 3)},
        "a UNet in diffusers layout": {
            "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight": (320, 768),
            "up_blocks.0.resnets.0.conv1.weight": (1, 1, 3, 3),
        },
        "UNet without its text encoder": {
            k: v for k, v in real_shapes["sd1"].items() if k.startswith(arch.UNET)
        },
        "a text encoder on its own": {"text_model.embeddings.token_embedding.weight": (49408, 768)},
        "not a Stable Diffusion checkpoint": {"foo.weight": (2, 2)},
    }
    for words, shapes in cases.items():
        detection = families.detect_architecture(shapes)
        assert not detection.supported, words
        assert words in detection.looks_like, (words, detection.looks_like)
        assert detection.because.endswith(".") and "\n" not in detection.because


def test_demo_shaped_unet_with_fewer_blocks(real_shapes):
    from tests.support.tiny_models import build_tiny_sd_pipeline

    pipeline = build_tiny_sd_pipeline()
    shapes = {k: tuple(v.shape) for k, v in ldm_state_dict(pipeline).items()}
    detection = families.detect_architecture(shapes)
    assert detection.architecture == "sd1"
    unet = arch.infer_unet_config(shapes, shipped("sd1", "unet"))
    original = pipeline.unet.config

    def plain(value):
        return list(value) if isinstance(value, (list, tuple)) else value

    for field in (
        "block_out_channels",
        "layers_per_block",
        "down_block_types",
        "up_block_types",
        "cross_attention_dim",
        "in_channels",
        "out_channels",
    ):
        assert plain(unet[field]) == plain(original[field]), field
    assert unet["layers_per_block"] == 1 and len(unet["block_out_channels"]) == 3


def test_unet_without_middle_block_is_inferred():
    from diffusers import UNet2DConditionModel

    from tests.support.model_files import _ldm_unet

    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        norm_num_groups=32,
        cross_attention_dim=32,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        mid_block_type=None,
    )
    shapes = {
        k: tuple(v.shape) for k, v in _ldm_unet(unet.state_dict(), unet.config, arch.UNET).items()
    }
    config = arch.infer_unet_config(shapes, shipped("sd1", "unet"))
    assert config["mid_block_type"] is None
    assert config["block_out_channels"] == [32, 64] and config["layers_per_block"] == 1


def test_uneven_unet_levels_are_reported_in_words(real_shapes):
    shapes = {
        k: v
        for k, v in real_shapes["sd1"].items()
        if not k.startswith(arch.UNET + "input_blocks.2.")
    }
    with pytest.raises(ValueError, match="different numbers of blocks"):
        arch.infer_unet_config(shapes, shipped("sd1", "unet"))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("sd1", ("sd1", "epsilon", 512)),
        ("sd2", ("sd2", "epsilon", 512)),
        ("sd2-v", ("sd2", "v_prediction", 768)),
        ("sdxl", ("sdxl", "epsilon", 1024)),
    ],
)
def test_folder_detection_on_shipped_configs(name, expected):
    folder = config_folder(name)
    index = json.loads((folder / "model_index.json").read_text())
    unet = json.loads((folder / "unet" / "config.json").read_text())
    scheduler = json.loads((folder / "scheduler" / "scheduler_config.json").read_text())
    detection = families.detect_from_configs(index, unet, scheduler)
    assert (detection.architecture, detection.prediction_type, detection.native_size) == expected
    assert detection.supported and detection.because.endswith(".")


def test_folder_detection_names_other_pipelines():
    detection = families.detect_from_configs(
        {"_class_name": "HiDreamImagePipeline", "transformer": ["diffusers", "X"]}, {}, {}
    )
    assert not detection.supported and "HiDreamImagePipeline" in detection.because


def test_folder_detection_tells_flux_dev_from_schnell_by_the_guidance_embedding():
    index = {"_class_name": "FluxPipeline", "transformer": ["diffusers", "X"]}
    config = {"num_layers": 19, "num_single_layers": 38, "attention_head_dim": 128}
    config |= {"num_attention_heads": 24, "in_channels": 64}
    dev = families.detect_from_configs(index, {**config, "guidance_embeds": True}, {})
    schnell = families.detect_from_configs(index, {**config, "guidance_embeds": False}, {})
    assert (dev.architecture, schnell.architecture) == ("flux-dev", "flux-schnell")
    assert dev.supported and dev.prediction_type == "flow" and dev.native_size == 1024
    assert "19 double and 38 single blocks, 3072 wide" in dev.because
    assert "guidance embedding, as the guidance-distilled Flux.1 dev" in dev.because
    assert "no guidance embedding" in schnell.because


def test_shipped_tokenizers_pad_as_the_originals():
    for name, pads in {
        "sd1": ["<|endoftext|>"],
        "sd2": ["!"],
        "sd2-v": ["!"],
        "sdxl": ["<|endoftext|>", "!"],
    }.items():
        folders = ["tokenizer", "tokenizer_2"][: len(pads)]
        for folder, pad in zip(folders, pads, strict=True):
            config = json.loads(
                resource("configs", name, folder, "tokenizer_config.json").read_text()
            )
            assert config["pad_token"] == pad and config["model_max_length"] == 77


def test_folder_detection_of_zimage_and_qwenimage_says_why():
    zimage = families.detect_from_configs(
        {"_class_name": "ZImagePipeline", "transformer": ["diffusers", "X"]}
        | {"text_encoder": ["transformers", "Qwen3Model"]},
        {"n_layers": 30, "n_refiner_layers": 2, "dim": 3840, "cap_feat_dim": 2560},
        {},
    )
    qwen = families.detect_from_configs(
        {"_class_name": "QwenImagePipeline", "transformer": ["diffusers", "X"]}
        | {"text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"]},
        {"num_layers": 60, "num_attention_heads": 24, "attention_head_dim": 128},
        {},
    )
    assert (zimage.architecture, qwen.architecture) == ("zimage-turbo", "qwenimage")
    assert (
        "its scheduler config, the one thing that tells Turbo from Base, is missing"
        in zimage.because
    )
    assert zimage.supported and qwen.supported and zimage.prediction_type == "flow"
    assert "30 main and 2+2 refiner blocks, 3840 wide" in zimage.because
    assert "Qwen3 text encoder (Qwen3Model) whose 2560-wide hidden states" in zimage.because
    assert "60 blocks, 3072 wide, on 16-channel latents" in qwen.because
    assert "Qwen2.5-VL text encoder (Qwen2_5_VLForConditionalGeneration)" in qwen.because
