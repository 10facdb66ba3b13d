"""The wrong part for a model is a cause of its own: a text encoder, a VAE or a LoRA of another
family (or size) is refused at load, before anything runs, in one sentence naming both files and
what each belongs to, never taken for an overflow; the right part still loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from app.core import architecture as arch
from app.core import models
from app.core.checkpoint import write_safetensors
from app.core.errors import UnsupportedModelError, WrongPartError
from app.core.lora import files as lora
from app.core.lora.files import LoraRequest
from app.core.requests import requested
from tests.support.cli_output import without_progress
from tests.support.family_helpers import offline  # noqa: F401 - an autouse fixture: no network
from tests.support.model_files import _ldm_vae, save_single_file, save_split_files
from tests.support.tiny_models import (
    build_tiny_flux_pipeline,
    build_tiny_qwenimage_pipeline,
    build_tiny_sd3_pipeline,
    build_tiny_sd_pipeline,
    build_tiny_sdxl_pipeline,
    build_tiny_zimage_pipeline,
    tiny_text_encoder,
    tiny_vae,
)

ROOT = Path(__file__).resolve().parents[2]
SD_FAMILIES = "Stable Diffusion 1.x/2.x's or SDXL's"


def one_line(message: str) -> bool:
    return "\n" not in message and message.endswith(".") and message.count(". ") == 0


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(WrongPartError) as caught:
        call(*args, **kwargs)
    message = str(caught.value)
    assert one_line(message), message
    return message


def sd_vae_file(path: Path) -> Path:
    """A 4-channel SD VAE file in the original layout (as vae-ft-mse-840000 is kept)."""
    vae = tiny_vae(7)
    state = _ldm_vae(vae.state_dict(), len(vae.config["block_out_channels"]))
    return write_safetensors(path, {k.removeprefix(arch.VAE): v for k, v in state.items()})


def vae_folder(path: Path, scaling_factor: float) -> Path:
    """A diffusers VAE folder whose config states its latent scale (SD's 0.18215, SDXL's
    0.13025)."""
    tiny_vae(7, scaling_factor=scaling_factor).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny models as users keep them, written once."""
    root = tmp_path_factory.mktemp("parts")
    written: dict[str, Any] = {
        "flux": save_split_files(build_tiny_flux_pipeline(), root / "flux", "flux1-tiny"),
        "zimage": save_split_files(build_tiny_zimage_pipeline(), root / "zimage", "z_image"),
        "qwenimage": save_split_files(
            build_tiny_qwenimage_pipeline(), root / "qwenimage", "qwen_image"
        ),
    }
    written["sd1"] = save_single_file(build_tiny_sd_pipeline(), root / "sd15-tiny.safetensors")
    written["sd_vae"] = sd_vae_file(root / "sd_vae.safetensors")
    written["sdxl_vae"] = vae_folder(root / "sdxl-vae", 0.13025)
    written["sd_vae_folder"] = vae_folder(root / "sd-vae-ft-mse", 0.18215)
    return written


# --- text encoders ----------------------------------------------------------------------------


def test_a_qwen25_vl_given_to_a_z_image_transformer_names_both_and_both_families(files):
    qwen25 = files["qwenimage"]["text_encoder"]

    message = refused(
        models.load_model, str(files["zimage"]["transformer"]), text_encoders=[str(qwen25)]
    )

    assert message == (
        f"{qwen25}: this is a 64-wide Qwen2.5-VL text encoder (Qwen-Image's), but the Z-Image "
        "transformer z_image.safetensors needs its Qwen3 text encoder (qwen_3_4b)."
    )


def test_the_right_qwen3_given_to_the_z_image_transformer_loads(files):
    model = models.load_model(
        str(files["zimage"]["transformer"]), text_encoders=[str(files["zimage"]["text_encoder"])]
    )
    assert model.companions["text_encoder"] == str(files["zimage"]["text_encoder"])


def test_a_clip_l_given_where_sd3_takes_its_clip_g_says_it_fits_the_clip_l(tmp_path):
    # CLIP-L's and CLIP-G's pooled vectors (24 + 40) make the transformer's 64, as 768 + 1280
    # make SD3's 2048: a CLIP-L is too narrow where the CLIP-G goes.
    pipeline = build_tiny_sd3_pipeline()
    pipeline.register_modules(
        text_encoder=tiny_text_encoder(2, projection=24),
        text_encoder_2=tiny_text_encoder(4, projection=40, activation="gelu"),
    )
    written = save_split_files(pipeline, tmp_path / "models", "sd35-tiny")
    clip_l = written["text_encoder"]
    copy = tmp_path / "clip_g_maybe.safetensors"
    copy.write_bytes(clip_l.read_bytes())

    message = refused(
        models.load_model, str(written["transformer"]), text_encoders=[str(clip_l), str(copy)]
    )

    assert message == (
        f"{copy}: this is a 32-wide CLIP text encoder (Flux.1's or Stable Diffusion 3.x's), but "
        "the SD3.5 Large transformer sd35-tiny.safetensors needs its CLIP-G text encoder "
        "(clip_g) (it fits its CLIP-L text encoder (clip_l), already given as "
        "clip_l.safetensors)."
    )
    # With the CLIP-G given instead, the same call loads.
    model = models.load_model(
        str(written["transformer"]), text_encoders=[str(clip_l), str(written["text_encoder_2"])]
    )
    assert model.companions["text_encoder_2"] == str(written["text_encoder_2"])


def test_a_sibling_text_encoder_of_another_family_is_named_not_used(tmp_path):
    # A Qwen2.5-VL saved under the Qwen3's usual name, in the Z-Image's text_encoders/.
    written = save_split_files(build_tiny_zimage_pipeline(), tmp_path / "models", "z_image")
    other = save_split_files(build_tiny_qwenimage_pipeline(), tmp_path / "other", "qwen_image")
    written["text_encoder"].unlink()
    impostor = written["text_encoder"].parent / "qwen_3_4b_fp8.safetensors"
    impostor.write_bytes(other["text_encoder"].read_bytes())

    with pytest.raises(UnsupportedModelError) as caught:  # UnsupportedModelError: missing
        models.load_model(str(written["transformer"]))

    message = str(caught.value)
    assert "needs its Qwen3 text encoder (qwen_3_4b)" in message
    assert (
        f"(passed over: {impostor} (a 64-wide Qwen2.5-VL text encoder, Qwen-Image's))."
    ) in message
    assert one_line(message)


def test_an_anima_folder_holding_a_qwen3_vl_text_encoder_names_it_before_diffusers_runs(tmp_path):
    """FLUX.3's kind of text encoder (a Qwen3-VL) saved in an Anima folder's text_encoder/,
    the index still declaring its Qwen3: the folder's config says what it is, and the sentence
    names it, where diffusers would fail inside on the config it cannot read."""
    import shutil

    from tests.support.tiny_models import build_tiny_anima_pipeline, tiny_qwen3_vl

    folder = tmp_path / "anima"
    build_tiny_anima_pipeline().save_pretrained(folder)
    shutil.rmtree(folder / "text_encoder")
    tiny_qwen3_vl(0, hidden=32).save_pretrained(folder / "text_encoder")

    message = refused(models.load_model, str(folder))

    assert message == (
        f"{folder / 'text_encoder'}: this is a 32-wide Qwen3-VL text encoder (FLUX.3's, "
        "Qwen-Image 2.1's or Krea 2's), but the Anima model anima needs a Qwen3 text encoder."
    )


# --- VAEs -------------------------------------------------------------------------------------


def test_a_4_channel_sd_vae_given_to_a_flux_transformer_is_refused_before_loading(files):
    message = refused(
        models.load_model, str(files["flux"]["transformer"]), vae=str(files["sd_vae"])
    )

    assert message == (
        f"{files['sd_vae']}: this is a 4-channel VAE ({SD_FAMILIES}), but the Flux.1 transformer "
        "flux1-tiny.safetensors needs its 16-channel VAE (ae)."
    )


def test_a_sibling_sd_vae_beside_a_flux_transformer_is_named_in_the_missing_sentence(tmp_path):
    written = save_split_files(build_tiny_flux_pipeline(), tmp_path / "models", "flux1-tiny")
    written["vae"].unlink()
    sd_vae = sd_vae_file(written["vae"].parent / "ae_sd.safetensors")

    with pytest.raises(UnsupportedModelError) as caught:
        models.load_model(str(written["transformer"]))

    message = str(caught.value)
    assert "needs its 16-channel VAE (ae)" in message
    assert f"(passed over: {sd_vae} (a 4-channel VAE, {SD_FAMILIES}))." in message
    assert one_line(message)


def test_a_qwen_image_vae_given_to_a_flux_transformer_is_refused(files):
    wan = files["qwenimage"]["vae"]

    message = refused(models.load_model, str(files["flux"]["transformer"]), vae=str(wan))

    assert message == (
        f"{wan}: this is a 16-channel VAE in the Wan 2.1 layout, but the Flux.1 transformer "
        "flux1-tiny.safetensors needs its 16-channel VAE (ae)."
    )


def test_a_flux_vae_given_to_an_sd_checkpoint_is_refused_before_loading(files):
    ae = files["flux"]["vae"]

    message = refused(models.load_model, str(files["sd1"]), vae=str(ae))

    assert message.startswith(f"{ae}: this is a 16-channel VAE (")
    assert "Flux.1's" in message
    assert message.endswith(
        "but the Stable Diffusion 1.x checkpoint sd15-tiny.safetensors needs a 4-channel VAE."
    )


def test_an_sdxl_vae_folder_given_to_an_sd15_checkpoint_is_refused_by_its_latent_scale(files):
    message = refused(models.load_model, str(files["sd1"]), vae=str(files["sdxl_vae"]))

    assert message == (
        f"{files['sdxl_vae']}: this is a 4-channel VAE with a latent scale of 0.13025 (SDXL's), "
        "but the Stable Diffusion 1.x checkpoint sd15-tiny.safetensors needs a 4-channel VAE "
        "with a latent scale of 0.18215."
    )


def test_an_sd_vae_folder_given_to_an_sd15_checkpoint_loads(files):
    model = models.load_model(str(files["sd1"]), vae=str(files["sd_vae_folder"]))
    assert model.pipeline.vae.config.scaling_factor == pytest.approx(0.18215)


def test_a_flux_folder_with_a_4_channel_vae_is_refused_at_load(tmp_path):
    folder = tmp_path / "flux-tiny"
    build_tiny_flux_pipeline().save_pretrained(folder)
    for file in (folder / "vae").iterdir():
        file.unlink()
    tiny_vae(7).save_pretrained(folder / "vae")

    message = refused(models.load_model, str(folder))

    assert message == (
        f"{folder / 'vae'}: this is a 4-channel VAE with a latent scale of 0.18215 "
        "(Stable Diffusion 1.x/2.x's), but the Flux.1 dev model flux-tiny needs a "
        "16-channel VAE."
    )


def test_a_flux_folder_whose_t5_is_a_clip_is_refused_at_load(tmp_path):
    folder = tmp_path / "flux-tiny"
    pipeline = build_tiny_flux_pipeline()
    pipeline.save_pretrained(folder)
    for file in (folder / "text_encoder_2").iterdir():
        file.unlink()
    pipeline.text_encoder.save_pretrained(folder / "text_encoder_2")
    index = (folder / "model_index.json").read_text()
    (folder / "model_index.json").write_text(index.replace('"T5EncoderModel"', '"CLIPTextModel"'))

    message = refused(models.load_model, str(folder))

    assert message == (
        f"{folder / 'text_encoder_2'}: this is a 32-wide CLIP text encoder (Flux.1's or "
        "Stable Diffusion 3.x's), but the Flux.1 dev model flux-tiny needs a T5 text encoder."
    )


def test_an_sdxl_vae_given_to_an_sd_folder_is_refused_and_the_sd_one_loads(tmp_path, files):
    folder = tmp_path / "sd15-tiny"
    build_tiny_sd_pipeline().save_pretrained(folder)

    message = refused(models.load_model, str(folder), vae=str(files["sdxl_vae"]))

    assert message.startswith(f"{files['sdxl_vae']}: this is a 4-channel VAE with a latent")
    assert "but the Stable Diffusion 1.x model sd15-tiny needs" in message
    assert models.load_model(str(folder), vae=str(files["sd_vae_folder"])).vae is not None


# --- LoRAs ------------------------------------------------------------------------------------

RANK = 4
LAYERS = ("to_q", "to_k", "q_proj", "k_proj", "v_proj", "out_proj")


def kohya_lora(path: Path, parts: dict[str, torch.nn.Module]) -> Path:
    """A kohya-layout LoRA (lora_unet_*, lora_te*_*) over the attention projections of each
    `prefix: module`."""
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for prefix, module in parts.items():
        for name, layer in module.named_modules():
            if isinstance(layer, torch.nn.Linear) and name.endswith(LAYERS):
                key = prefix + name.replace(".", "_")
                tensors[f"{key}.lora_down.weight"] = torch.randn(
                    RANK, layer.in_features, generator=generator
                )
                tensors[f"{key}.lora_up.weight"] = torch.zeros(layer.out_features, RANK)
                tensors[f"{key}.alpha"] = torch.tensor(float(RANK))
    return write_safetensors(path, tensors)


@pytest.fixture(scope="module")
def sd_model(files):
    return models.load_model(str(files["sd1"]))


def test_an_sdxl_lora_on_an_sd15_model_is_refused_and_the_model_is_untouched(sd_model, tmp_path):
    sdxl = build_tiny_sdxl_pipeline()
    path = kohya_lora(
        tmp_path / "sdxl_style.safetensors",
        {
            "lora_unet_": sdxl.unet,
            "lora_te1_text_model_": sdxl.text_encoder,
            "lora_te2_text_model_": sdxl.text_encoder_2,
        },
    )

    message = refused(
        requested.use_loras, sd_model, [LoraRequest(str(path))], "", allow_pickle=False
    )

    assert message == (
        f"{path}: this is a LoRA (SDXL's), but the Stable Diffusion 1.x model "
        "sd15-tiny.safetensors needs a LoRA made for Stable Diffusion 1.x/2.x."
    )
    assert lora._adapters(sd_model.pipeline) == [] and not getattr(sd_model, "loras", [])


def test_a_unet_only_lora_for_other_text_widths_is_refused(sd_model, tmp_path):
    path = kohya_lora(
        tmp_path / "xl_unet.safetensors", {"lora_unet_": build_tiny_sdxl_pipeline().unet}
    )

    message = refused(
        requested.use_loras, sd_model, [LoraRequest(str(path))], "", allow_pickle=False
    )

    assert message == (
        f"{path}: this is a LoRA for a UNet reading 64-wide text, but the Stable Diffusion 1.x "
        "model sd15-tiny.safetensors needs a LoRA for 32-wide text, as its UNet reads."
    )
    assert lora._adapters(sd_model.pipeline) == []


def test_a_flux_lora_on_an_sdxl_model_names_both_families(tmp_path):
    sdxl = save_single_file(build_tiny_sdxl_pipeline(), tmp_path / "sdxl-tiny.safetensors")
    model = models.load_model(str(sdxl))
    path = write_safetensors(
        tmp_path / "flux_style.safetensors",
        {
            "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": torch.randn(RANK, 64),
            "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": torch.zeros(192, RANK),
            "lora_unet_double_blocks_0_img_attn_qkv.alpha": torch.tensor(float(RANK)),
        },
    )

    message = refused(requested.use_loras, model, [LoraRequest(str(path))], "", allow_pickle=False)

    assert message == (
        f"{path}: this is a LoRA (Flux.1's, Chroma's, Flux.2's or Flux.2 Klein's), but the SDXL model "
        "sdxl-tiny.safetensors needs a LoRA made for SDXL."
    )


def partly_fitting_lora(pipeline, path: Path, base_model: str) -> Path:
    """Two layers under names the pipeline's transformer has, four under names no family's
    has (so the key set tells nothing), and the base model kohya's trainer writes."""
    tensors: dict[str, torch.Tensor] = {}
    names = [f"transformer_blocks.0.attn.{n}" for n in ("to_q", "to_k")]
    names += [f"transformer_blocks.0.norm_out_{i}" for i in range(4)]
    layer = pipeline.transformer.get_submodule(names[0])
    for name in names:
        tensors[f"transformer.{name}.lora_A.weight"] = torch.randn(RANK, layer.in_features)
        tensors[f"transformer.{name}.lora_B.weight"] = torch.zeros(layer.out_features, RANK)
    return write_safetensors(path, tensors, {"ss_base_model_version": base_model})


def test_a_lora_whose_metadata_names_another_family_is_refused_where_it_fits_in_part(tmp_path):
    """The metadata tells what the key set does not (Flux.1), so the two layers that happen to
    match Qwen-Image's are no fit: refused in one sentence, the model untouched."""
    from tests.support.planted_sd import loaded

    pipeline = build_tiny_qwenimage_pipeline()
    model = loaded(pipeline, "qwen-image")
    model.architecture, model.source = "qwenimage", str(tmp_path / "qwen-image.safetensors")
    path = partly_fitting_lora(pipeline, tmp_path / "style.safetensors", "flux1")

    message = refused(requested.use_loras, model, [LoraRequest(str(path))], "", allow_pickle=False)

    assert message == (
        f"{path}: this is a LoRA (Flux.1's), but the Qwen-Image model qwen-image.safetensors "
        "needs a LoRA made for Qwen-Image (only 2 of its 6 layers exist there)."
    )
    assert lora._adapters(pipeline) == [] and not getattr(model, "loras", [])


def test_a_flux_lora_that_fits_chroma_in_part_runs_there_with_its_note(tmp_path):
    """Chroma was made from Flux.1 and runs its LoRAs: one that fits only in part is applied
    with the note saying how many layers, not refused as another family's."""
    from tests.support.planted_sd import loaded
    from tests.support.tiny_models import build_tiny_chroma_pipeline

    pipeline = build_tiny_chroma_pipeline()
    model = loaded(pipeline, "chroma")
    model.architecture, model.source = "chroma", str(tmp_path / "chroma.safetensors")
    path = partly_fitting_lora(pipeline, tmp_path / "flux_style.safetensors", "flux1")

    requested.use_loras(model, [LoraRequest(str(path))], "", allow_pickle=False)

    (applied,) = model.loras
    assert (applied.layers, applied.layers_applied) == (6, 2)
    (note,) = model.lora_warnings
    assert note.startswith("Only 2 of the 6 layers of the LoRA flux_style exist in the Chroma")


def test_the_right_lora_still_applies(sd_model, tmp_path):
    sd = build_tiny_sd_pipeline()
    path = kohya_lora(
        tmp_path / "sd_style.safetensors",
        {"lora_unet_": sd.unet, "lora_te_text_model_": sd.text_encoder},
    )

    requested.use_loras(sd_model, [LoraRequest(str(path))], "", allow_pickle=False)

    assert [a.name for a in sd_model.loras] == ["sd_style"]
    assert len(lora._adapters(sd_model.pipeline)) == 1
    requested.use_loras(sd_model, [], "", allow_pickle=False)


# --- through the `halfsafe` command -----------------------------------------------------------


def halfsafe(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_refused(done: subprocess.CompletedProcess, *names: str) -> str:
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    err = without_progress(done.stderr)
    assert "Traceback" not in done.stderr
    assert err.count("\n") == 1 and err.startswith("halfsafe: "), err
    line = err.strip()
    for name in names:
        assert name in line, line
    assert "overflow" not in line.lower()
    return line


def test_check_with_a_4_channel_vae_on_a_flux_transformer_exits_2_naming_both(files):
    done = halfsafe("check", str(files["flux"]["transformer"]), "--vae", str(files["sd_vae"]))

    line = assert_refused(done, "sd_vae.safetensors", "flux1-tiny.safetensors")
    assert line.endswith(
        f"this is a 4-channel VAE ({SD_FAMILIES}), but the Flux.1 transformer "
        "flux1-tiny.safetensors needs its 16-channel VAE (ae)."
    )


def test_generate_with_a_qwen25_vl_for_z_image_exits_2_naming_both(files):
    done = halfsafe(
        "generate",
        str(files["zimage"]["transformer"]),
        "--text-encoder",
        str(files["qwenimage"]["text_encoder"]),
        "--steps",
        "1",
    )

    line = assert_refused(done, "qwen_2.5_vl_7b.safetensors", "z_image.safetensors")
    assert "(Qwen-Image's), but the Z-Image transformer" in line


def test_check_with_an_sdxl_lora_on_an_sd15_checkpoint_exits_2_naming_both(files, tmp_path):
    sdxl = build_tiny_sdxl_pipeline()
    path = kohya_lora(
        tmp_path / "sdxl_style.safetensors",
        {
            "lora_unet_": sdxl.unet,
            "lora_te1_text_model_": sdxl.text_encoder,
            "lora_te2_text_model_": sdxl.text_encoder_2,
        },
    )

    done = halfsafe("check", str(files["sd1"]), "--lora", str(path))

    line = assert_refused(done, "sdxl_style.safetensors", "sd15-tiny.safetensors")
    assert "(SDXL's), but the Stable Diffusion 1.x model" in line


def test_check_with_an_sdxl_vae_folder_on_an_sd15_checkpoint_exits_2(files):
    done = halfsafe("check", str(files["sd1"]), "--vae", str(files["sdxl_vae"]))

    line = assert_refused(done, "sdxl-vae", "sd15-tiny.safetensors")
    assert "latent scale of 0.13025 (SDXL's)" in line
