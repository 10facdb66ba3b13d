"""What only Anima does: diffusers runs it as a modular pipeline (HalfSafe's AnimaPipeline runs
its blocks), an LLM adapter (the text conditioner) sits between the text encoder and the
transformer and is governed by the denoiser's setting, the Cosmos transformer's padding-mask
channel is dropped (always zero), and ComfyUI's files keep the adapter inside the diffusion
model's file (llm_adapter.*) beside Cosmos's original layout."""

from __future__ import annotations

import json

import pytest
import torch

from app.core import generation, models
from app.core.checkpoint import write_safetensors
from app.core.errors import HalfSafeError
from app.core.families import family_of
from app.core.families.anima_pipeline import AnimaPipeline, without_padding_channel
from app.core.fixing import fix_candidates
from app.core.formats.layouts import to_original
from app.core.precision.words import fix_words
from tests.support import tiny_models
from tests.support.family_helpers import (
    FP16,
    check,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.model_files import save_split_files

PARTS = ("text_encoder", "text_conditioner", "transformer", "vae")
CONDITIONER_LAYER = "blocks.0.mlp.2"


def _planted(component: str, layer: str, factor: float) -> AnimaPipeline:
    pipeline = tiny_models.build_tiny_anima_pipeline()
    with torch.no_grad():
        getattr(pipeline, component).get_submodule(layer).weight.mul_(factor)
    return pipeline


# --- the padding-mask channel ---------------------------------------------------------------


def test_the_padding_channel_is_dropped_and_the_patches_embed_as_with_a_zero_mask():
    stored = tiny_models.tiny_anima_transformer(2)  # as its files keep it: 16 + 1 channels in
    folded = without_padding_channel(stored)
    latents = torch.randn(1, 16, 1, 8, 8, generator=torch.Generator().manual_seed(0))

    with torch.inference_mode():
        with_mask = stored.patch_embed(torch.cat([latents, torch.zeros(1, 1, 1, 8, 8)], dim=1))
        without = folded.patch_embed(latents)

    assert stored.config["concat_padding_mask"] and not folded.config["concat_padding_mask"]
    assert torch.equal(with_mask, without)
    kept, dropped = folded.state_dict(), stored.state_dict()
    assert set(kept) == set(dropped)
    for key, value in kept.items():  # everything else is the stored weights, untouched
        if key != "patch_embed.proj.weight":
            assert torch.equal(value, dropped[key]), key
    assert without_padding_channel(folded) is folded


def test_a_folder_as_diffusers_writes_it_loads_with_the_padding_channel_dropped(tmp_path):
    """The hub's form: modular_model_index.json naming AnimaModularPipeline, the transformer
    with its padding-mask channel, and no tokenizers of its own (an index may point them at
    another repository): the shipped ones stand in, and it computes as before."""
    pipeline = tiny_models.build_tiny_anima_pipeline()
    folder = tmp_path / "anima"
    pipeline.save_pretrained(folder)
    stored = tiny_models.tiny_anima_transformer(2)
    stored.save_pretrained(folder / "transformer")  # with the padding channel, as released
    for name in ("tokenizer", "t5_tokenizer"):
        for file in (folder / name).iterdir():
            file.unlink()
        (folder / name).rmdir()
    index = json.loads((folder / "modular_model_index.json").read_text())
    assert index["_class_name"] == "AnimaModularPipeline"

    model = models.load_model(str(folder))

    assert (model.architecture, model.format) == ("anima", "diffusers")
    loaded = model.pipeline
    assert isinstance(loaded, AnimaPipeline)
    assert loaded.transformer.config.concat_padding_mask is False
    folded = without_padding_channel(stored).state_dict()
    assert all(torch.equal(v, folded[k]) for k, v in loaded.transformer.state_dict().items())
    ids = loaded.t5_tokenizer("a red cat").input_ids
    assert ids == pipeline.t5_tokenizer("a red cat").input_ids


def test_a_modular_index_lists_only_the_parts_the_folder_holds(tmp_path):
    """An entry's class from its type hint where the folder was written without the part
    loaded; an entry kept in another subfolder or repository, or named as a path, is no part
    of the folder."""
    from app.core.models.folder import modular_components

    for name in ("text_encoder", "vae"):
        (tmp_path / name).mkdir()
    hint = {"type_hint": ["transformers", "Qwen3Model"], "subfolder": "text_encoder"}
    index = {
        "_class_name": "AnimaModularPipeline",
        "text_encoder": [None, None, hint],
        "vae": ["diffusers", "AutoencoderKLQwenImage", {"subfolder": "vae"}],
        "tokenizer": ["transformers", "Qwen2Tokenizer", {"subfolder": "tokenizer"}],
        "transformer": ["diffusers", "CosmosTransformer3DModel", {"subfolder": "other"}],
        "../vae": ["diffusers", "AutoencoderKLQwenImage", {"subfolder": "../vae"}],
    }

    assert modular_components(tmp_path, index) == {
        "_class_name": "AnimaModularPipeline",
        "text_encoder": ["transformers", "Qwen3Model"],
        "vae": ["diffusers", "AutoencoderKLQwenImage"],
    }


def test_a_folder_missing_a_part_is_refused_in_one_sentence(tmp_path):
    pipeline = tiny_models.build_tiny_anima_pipeline()
    folder = tmp_path / "anima"
    pipeline.save_pretrained(folder)
    for file in (folder / "text_conditioner").iterdir():
        file.unlink()
    (folder / "text_conditioner").rmdir()

    with pytest.raises(HalfSafeError) as caught:
        models.load_model(str(folder))

    assert "does not hold its text_conditioner" in str(caught.value)


def test_a_folder_whose_text_encoder_the_conditioner_cannot_read_is_refused(tmp_path):
    pipeline = tiny_models.build_tiny_anima_pipeline()
    pipeline.register_modules(text_encoder=tiny_models.tiny_qwen3(0, hidden=64))
    folder = tmp_path / "anima"
    pipeline.save_pretrained(folder)

    with pytest.raises(HalfSafeError) as caught:
        models.load_model(str(folder))

    assert str(caught.value).endswith(
        "its text encoder gives 64-wide states, but its text conditioner reads 32-wide ones."
    )


# --- ComfyUI's files --------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "net."])
def test_split_files_load_with_the_adapter_from_the_diffusion_models_file(tmp_path, prefix):
    pipeline = tiny_models.build_tiny_anima_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "anima-preview", prefix=prefix)
    assert set(written) == {"transformer", "text_encoder", "vae"}
    assert written["text_encoder"].name == "qwen_3_06b.safetensors"

    model = models.load_model(str(written["transformer"]))  # companions found beside it

    assert (model.format, model.architecture, model.prediction_type) == (
        "split_files",
        "anima",
        "flow",
    )
    assert model.detected_because.startswith("Anima: a Cosmos DiT in its original layout")
    assert f"its LLM adapter ({prefix}llm_adapter.) reading 32-wide" in model.detected_because
    assert model.pipeline.scheduler.config.shift == 3.0


def test_a_cosmos_file_without_the_adapter_is_refused_in_one_sentence(tmp_path):
    transformer = tiny_models.build_tiny_anima_pipeline().transformer
    rows = family_of(tiny_models.build_tiny_anima_pipeline()).layout.table(  # type: ignore[union-attr]
        dict(transformer.config)
    )
    file = tmp_path / "diffusion_models" / "cosmos_predict2.safetensors"
    file.parent.mkdir(parents=True)
    write_safetensors(file, to_original(rows, transformer.state_dict()))

    with pytest.raises(HalfSafeError) as caught:
        models.load_model(str(file))

    assert "no LLM adapter (llm_adapter.*): it is not an Anima model" in str(caught.value)


# --- the text conditioner, governed by the denoiser's setting --------------------------------


def test_a_conditioner_overflow_in_a_generation_is_repaired_at_its_layer(tmp_path):
    request = generation.GenerationRequest(
        prompt="a red cat",
        negative_prompt="fog",
        steps=3,
        cfg=4.0,
        seed=3,
        width=64,
        height=64,
        output_dir=str(tmp_path),
    )
    model = in_memory(_planted("text_conditioner", CONDITIONER_LAYER, 1e6), "anima", "anima")

    result = generation.generate(model, request, precision=FP16, device="cpu")

    (image,) = result.images
    assert (image.status, image.component) == ("fixed", "text_conditioner")
    assert image.first_bad_module == CONDITIONER_LAYER
    assert image.step is None  # before the first step: once per prompt
    assert "text conditioner" in image.fixes_applied[0]
    assert image.non_finite == 0 and result.all_good


def test_the_conditioners_wider_run_moves_what_its_setting_governs():
    """A whole-component fix of the text conditioner is the denoiser's setting: the candidate
    runs the transformer wider too, as that setting will, and says so."""
    report = check(
        in_memory(_planted("text_conditioner", CONDITIONER_LAYER, 1e6), "anima", "anima")
    )
    assert report.fix is not None
    whole = [c for c in report.fix.candidates if c.kind == "component_fp32"]

    assert report.fix.plan.dtypes["transformer"] == "fp16"  # the layers' fix is chosen
    (fp32,) = whole
    assert fp32.settings == {"unet_precision": "fp32"}
    assert fp32.candidate is not None
    plan = fp32.candidate.plan
    assert (plan.dtypes["text_conditioner"], plan.dtypes["transformer"]) == ("fp32", "fp32")
    assert plan.effective_settings()["unet_precision"] == "fp32"
    assert (
        fix_candidates.FixCandidate(plan, fp32.settings).words
        == "run the text conditioner and transformer in fp32"
    )
    assert fix_words({"unet_precision": "bf16"}) == "run the UNet in bf16"


def test_a_text_encoder_overflow_is_the_text_encoders_and_the_conditioner_it_fed_is_ok():
    report = check(in_memory(_planted("text_encoder", "layers.0.mlp.down_proj", 1e8), "a", "anima"))

    assert report.components["text_encoder"].status == "nan"
    conditioner = report.components["text_conditioner"]
    assert (conditioner.status, conditioner.fed_by) == ("ok", "text_encoder")
    assert any("text conditioner was fed non-finite input" in n for n in report.notes)


# --- image-to-image ---------------------------------------------------------------------------


def test_image_to_image_runs_the_last_part_of_the_schedule_from_the_picture():
    """diffusers' image-to-image blocks: the last `strength` of the steps, from the picture's
    latents noised to where they start (the less strength, the nearer the picture)."""
    pipeline = tiny_models.build_tiny_anima_pipeline()
    family = family_of(pipeline)
    generator = torch.Generator().manual_seed(0)
    pixels = torch.rand(1, 3, 64, 64, generator=generator) * 2 - 1
    with torch.inference_mode():
        picture = family.encode_pixels(pipeline.vae, pixels)
        tensors = family.encode(pipeline, "a red cat", "fog", "cpu", True)
        distances, steps = {}, {}
        for strength in (0.25, 1.0):
            seen: list[int] = []
            latents = pipeline(
                tensors["prompt_embeds"],
                tensors["negative_prompt_embeds"],
                height=64,
                width=64,
                num_inference_steps=8,
                generator=[torch.Generator().manual_seed(1)],
                image=picture,
                strength=strength,
                callback_on_step_end=lambda _p, i, _t, _d, seen=seen: seen.append(i) or {},
            ).images
            steps[strength] = len(seen)
            distances[strength] = float((latents[:, :, 0] - picture).abs().mean())

    assert steps == {0.25: 2, 1.0: 8}
    assert distances[0.25] < distances[1.0]


def test_an_image_to_image_job_repairs_a_transformer_overflow(tmp_path):
    from PIL import Image

    path = tmp_path / "input.png"
    Image.new("RGB", (64, 64), (200, 40, 40)).save(path)
    request = generation.GenerationRequest(
        prompt="a red cube",
        negative_prompt="fog",
        steps=4,
        cfg=4.0,
        seed=3,
        width=64,
        height=64,
        images=[str(path)],
        strength=0.5,
        output_dir=str(tmp_path / "out"),
    )
    model = in_memory(_planted("transformer", "transformer_blocks.0.ff.net.2", 1e6), "i", "anima")

    result = generation.generate(model, request, precision=FP16, device="cpu")

    (image,) = result.images
    assert (image.status, image.component, image.step) == ("fixed", "transformer", 1)
    assert image.first_bad_module == "transformer_blocks.0.ff.net.2"
    assert "Denoising strength: 0.5" in image.parameters


# --- on a GPU -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_watch_adds_no_host_sync_to_the_blocks_loop(tmp_path):
    """Under `set_sync_debug_mode("warn")`, the synchronising calls between the end of the
    first step and the end of the last: the watched generation makes no more than diffusers'
    blocks with a callback that only marks the step."""
    import warnings

    from app.core.precision import PlacedPipeline, backend_flags, resolve_plan

    steps = 6
    model = in_memory(tiny_models.build_tiny_anima_pipeline(), "sync", "anima")

    def count_inside(run) -> int:
        marks: list[int] = []
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")

            def mark() -> None:
                marks.append(sum("synchronizing" in str(r.message) for r in records))

            torch.cuda.set_sync_debug_mode("warn")
            try:
                run(mark)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        assert len(marks) == steps
        return marks[-1] - marks[0]

    def watched(mark) -> None:
        def progress(stage, step, total):
            if stage == "Generating":
                mark()

        request = generation.GenerationRequest(
            prompt="a lighthouse at dusk",
            steps=steps,
            cfg=4.0,
            seed=1,
            width=64,
            height=64,
            output_dir=str(tmp_path),
        )
        result = generation.generate(
            model, request, precision=FP16, device="cuda", on_progress=progress
        )
        assert result.images[0].status == "ok"

    def plain(mark) -> None:
        plan = resolve_plan(FP16, device="cuda", components=list(PARTS))
        placed = PlacedPipeline(model.pipeline, plan)
        pipe = placed.pipeline()
        family = family_of(pipe)
        with backend_flags(plan), torch.inference_mode():
            tensors = family.encode(pipe, "a lighthouse at dusk", "", "cuda", True)
            pipe(
                tensors["prompt_embeds"],
                tensors["negative_prompt_embeds"],
                height=64,
                width=64,
                num_inference_steps=steps,
                guidance_scale=4.0,
                callback_on_step_end=lambda *_: mark() or {},
            )
        placed.release()

    assert count_inside(watched) <= count_inside(plain)


def test_scaled_fp8_files_dequantise_in_the_transformer_and_its_adapter(tmp_path):
    """ComfyUI's scaled fp8 form (`scale_weight`s and the `scaled_fp8` marker) of the
    diffusion model's file: the transformer's and the LLM adapter's matrices read through the
    one dequantising path, the scales not taken for weights of the adapter."""
    from app.core.checkpoint import Checkpoint
    from tests.support.quantized_files import close_to, fp8_scaled

    pipeline = tiny_models.build_tiny_anima_pipeline()
    written = save_split_files(pipeline, tmp_path / "models", "anima-fp8")
    with Checkpoint(written["transformer"]) as checkpoint:
        tensors = {k: checkpoint.get(k).clone() for k in checkpoint.shapes}
    stored, exact = fp8_scaled(tensors)
    write_safetensors(written["transformer"], stored)

    model = models.load_model(str(written["transformer"]))

    assert model.quantization is not None and model.quantization.to_json()["format"] == "fp8_scaled"
    assert model.weights.bad_quantized == [] and model.weights.non_finite == []
    adapter = model.pipeline.text_conditioner.state_dict()
    key = "blocks.0.mlp.2.weight"
    close_to(adapter[key], exact["llm_adapter." + key], tensors["llm_adapter." + key].float())
    block = model.pipeline.transformer.state_dict()["transformer_blocks.0.ff.net.2.weight"]
    close_to(block, exact["blocks.0.mlp.layer2.weight"], tensors["blocks.0.mlp.layer2.weight"])
    report = check(model)
    assert report.verdict == "healthy"


def test_a_gguf_diffusion_model_file_loads_with_its_adapter_within_quantisation_error(tmp_path):
    """city96's form: the diffusion model's file as GGUF Q8_0 (the adapter's matrices too),
    the companions as they are."""
    from gguf import GGMLQuantizationType

    from tests.support.quantized_files import STEP, gguf_split_set

    pipeline, _, path = gguf_split_set(
        tmp_path, tiny_models.build_tiny_anima_pipeline(), GGMLQuantizationType.Q8_0, name="anima"
    )

    model = models.load_model(str(path))

    assert (model.format, model.architecture) == ("split_files", "anima")
    assert model.quantization is not None and model.quantization.to_json()["format"] == "gguf"
    for part in ("transformer", "text_conditioner"):
        state = getattr(model.pipeline, part).state_dict()
        for key, reference in getattr(pipeline, part).state_dict().items():
            bound = reference.abs().max() * STEP["Q8_0"] + 1e-6
            assert (state[key].float() - reference).abs().max() <= bound * 1.05, (part, key)
    assert check(model).verdict == "healthy"
