"""What only FLUX.3 (base and the 16-step distilled Klein) does, on tiny pipelines built in code:
diffusers runs it as modular pipelines only (HalfSafe's adapter runs its blocks), the two variants
are told apart by the folder's pipeline class and the transformer's flow map (its second timestep
embedder, ref_time_in in Black Forest Labs' files), the schedule's constant shift, CFG for the
base model only, the distilled transformer told the timestep each step jumps to, and BFL's files
as diffusers' converter reads them with their companions (qwen3_vl_4b, flux2-vae). A diffusers
folder, the health check with planted overflows in the transformer, the Qwen3-VL encoder and the
VAE, and generation repairing the transformer are every family's contract: test_families.py.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest
import torch

from app.core import families, generation, models
from app.core.checkpoint import write_safetensors
from app.core.errors import HalfSafeError
from app.core.families import FamilyId, family, family_of
from app.core.families.flux3 import LAYOUT, Flux3Family
from app.core.families.flux3_pipeline import Flux3DistilledPipeline, Flux3Pipeline
from app.core.families.flux3_recipe import FLUX3_SHIFT
from app.core.formats.layouts import to_original
from app.core.health.request import CheckRequest, CheckRun
from app.core.library.metadata import base_architecture
from app.core.models import split
from tests.support.family_helpers import (
    FP16,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.model_files import save_split_files
from tests.support.tiny_models import build_tiny_flux3_pipeline, tiny_flux3_transformer

BASE = cast(Flux3Family, family(FamilyId("flux3")))
KLEIN = family(FamilyId("flux3klein"))
ARCHITECTURE = {False: "flux3-base", True: "flux3-klein"}


def _original(transformer) -> dict[str, torch.Tensor]:
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    return to_original(LAYOUT.table(config), transformer.state_dict())


def _index(pipeline_class: str) -> dict:
    return {
        "_class_name": pipeline_class,
        "text_encoder": ["transformers", "Qwen3VLForConditionalGeneration"],
        "tokenizer": ["transformers", "Qwen3VLProcessor"],
        "transformer": ["diffusers", "Flux3Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"],
    }


# --- BFL's files ------------------------------------------------------------------------------


@pytest.mark.parametrize("distilled", [False, True], ids=["base", "distilled"])
def test_the_key_table_is_the_one_diffusers_reads_bfl_files_with(distilled):
    from diffusers.loaders.single_file_utils import (
        CHECKPOINT_KEY_NAMES,
        convert_flux3_transformer_checkpoint_to_diffusers,
    )

    transformer = tiny_flux3_transformer(1, distilled)
    original = _original(transformer)

    # The keys diffusers tells FLUX.3 and its distilled checkpoint by.
    assert CHECKPOINT_KEY_NAMES["flux3"][1] in original
    assert (CHECKPOINT_KEY_NAMES["flux3-distilled"][1] in original) is distilled
    # diffusers' own converter reads the file back into the same weights (the checkpoint's
    # model.diffusion_model. prefix dropped as its loader does), a training-only REPA head
    # beside them left out.
    saved = {k: v.clone() for k, v in original.items()}
    saved["repa_projectors.0.weight"] = torch.zeros(2, 2)
    theirs = convert_flux3_transformer_checkpoint_to_diffusers(saved)
    state = transformer.state_dict()
    assert set(theirs) == set(state)
    assert all(torch.equal(theirs[k], v) for k, v in state.items())
    # Read back from shapes, each variant is its own architecture, with its own sentence.
    model = split.read_model({k: tuple(v.shape) for k, v in original.items()})
    assert model is not None
    assert (model.architecture, model.config["flow_map"]) == (ARCHITECTURE[distilled], distilled)
    assert model.pipeline_class == (
        "Flux3DistilledModularPipeline" if distilled else "Flux3ModularPipeline"
    )
    said = "16 steps without CFG" if distilled else "flow matching with CFG (50 steps)"
    assert said in model.because and model.because.endswith(".")
    assert model.scheduler == {"shift": FLUX3_SHIFT, "use_dynamic_shifting": False}


def test_a_flux3_file_is_told_apart_from_flux2_files():
    from tests.support.tiny_models import tiny_flux2_transformer

    flux2 = family(FamilyId("flux2klein"))
    klein2 = tiny_flux2_transformer(0, guidance=False, text=96)
    assert flux2.layout is not None
    flux2_file = to_original(
        flux2.layout.table({**klein2.config, "_class_name": "Flux2Transformer2DModel"}),
        klein2.state_dict(),
    )
    flux3_file = _original(tiny_flux3_transformer(1, distilled=True))

    assert split.find_layout({k: tuple(v.shape) for k, v in flux2_file.items()}) == (
        "flux2klein",
        "",
    )
    # One layout for both FLUX.3 variants (named by the base model's), read as the distilled one.
    assert split.find_layout({k: tuple(v.shape) for k, v in flux3_file.items()}) == ("flux3", "")
    model = split.read_model({k: tuple(v.shape) for k, v in flux3_file.items()})
    assert model is not None and model.layout == "flux3klein"


@pytest.mark.slow  # about 20 s here: writing and reading a 151,669-token embedding
@pytest.mark.parametrize("distilled", [False, True], ids=["base", "distilled"])
def test_its_files_under_comfyuis_prefix_load_with_its_schedule(tmp_path, distilled):
    pipeline = build_tiny_flux3_pipeline(distilled=distilled)
    written = save_split_files(
        pipeline, tmp_path / "models", "flux-3-klein", prefix="model.diffusion_model."
    )
    assert written["text_encoder"].name == "qwen3_vl_4b.safetensors"
    assert written["vae"].name == "flux2-vae.safetensors"

    model = models.load_model(str(written["transformer"]))  # companions found beside it

    assert (model.format, model.architecture, model.prediction_type) == (
        "split_files",
        ARCHITECTURE[distilled],
        "flow",
    )
    assert type(model.pipeline) is type(pipeline)
    assert model.pipeline.scheduler.config.shift == FLUX3_SHIFT


def _outputs(pipeline, timesteps) -> list[torch.Tensor]:
    """The prompt's tensors, the latents denoised through `timesteps` and their pixels."""
    fam = family_of(pipeline)
    with torch.inference_mode():
        conditioning = fam.encode(pipeline, "a red cat", "fog", "cpu", True)
        latents = fam.probe_denoise(pipeline, conditioning, 64, "cpu", timesteps)
        pixels = fam.decode(pipeline.vae, latents)
    return [*(conditioning[k] for k in sorted(conditioning)), latents, pixels]


# --- folders ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pipeline_class", "flow_map"),
    [("Flux3ModularPipeline", True), ("Flux3DistilledModularPipeline", False)],
)
def test_a_folder_whose_pipeline_and_transformer_disagree_is_refused_in_one_sentence(
    pipeline_class, flow_map
):
    transformer = dict(tiny_flux3_transformer(1, flow_map).config)

    detection = families.detect_from_configs(_index(pipeline_class), transformer, {})

    assert not detection.supported
    assert detection.because.startswith(f"its {pipeline_class} runs the ")
    assert "diffusers' blocks cannot run it." in detection.because


@pytest.mark.slow  # saving and loading a 151,669-token embedding
def test_a_folder_without_its_processor_or_scheduler_loads_with_the_shipped_ones(tmp_path):
    """The hub's index may point the processor at another repository, and diffusers' blocks
    build the scheduler from their spec: the shipped Qwen3-VL processor and FLUX.3's own
    shift stand in, and it computes as before."""
    pipeline = build_tiny_flux3_pipeline(distilled=True)
    folder = tmp_path / "flux3"
    pipeline.save_pretrained(folder)
    for file in (folder / "tokenizer").iterdir():
        file.unlink()
    (folder / "tokenizer").rmdir()

    model = models.load_model(str(folder))

    assert isinstance(model.pipeline, Flux3DistilledPipeline)
    assert model.pipeline.scheduler.config.shift == FLUX3_SHIFT
    ids = model.pipeline.tokenizer.tokenizer("a red cat").input_ids
    assert ids == pipeline.tokenizer.tokenizer("a red cat").input_ids
    timesteps = [1000.0, 500.0]
    for a, b in zip(
        _outputs(pipeline, timesteps), _outputs(model.pipeline, timesteps), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # saving a 151,669-token embedding
def test_a_folder_missing_a_part_is_refused_in_one_sentence(tmp_path):
    folder = tmp_path / "flux3"
    build_tiny_flux3_pipeline().save_pretrained(folder)
    for file in (folder / "text_encoder").iterdir():
        file.unlink()
    (folder / "text_encoder").rmdir()

    with pytest.raises(HalfSafeError) as caught:
        models.load_model(str(folder))

    assert "this FLUX.3 folder does not hold its text_encoder" in str(caught.value)


def test_the_prompt_is_read_as_diffusers_text_encoder_step_reads_it():
    """The same hidden states as diffusers' step makes with the whole generation model (HalfSafe
    runs its inner model: the LM head's logits are never read), padded to a multiple of 80."""
    from diffusers.modular_pipelines.flux3.encoders import Flux3TextEncoderStep

    pipeline = build_tiny_flux3_pipeline()
    with torch.inference_mode():
        mine = pipeline.encode_prompt("a red cat", "cpu")
        theirs = Flux3TextEncoderStep._get_qwen3_vl_prompt_embeds(
            pipeline.text_encoder, pipeline.tokenizer, "a red cat", device=torch.device("cpu")
        )

    assert mine.shape == (1, 80, 8 * 32)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


@pytest.mark.slow  # saving a 151,669-token embedding
def test_a_folder_declaring_another_class_for_a_part_is_refused_in_one_sentence(tmp_path):
    import json

    folder = tmp_path / "flux3"
    build_tiny_flux3_pipeline().save_pretrained(folder)
    index_file = folder / "modular_model_index.json"
    index = json.loads(index_file.read_text())
    index["transformer"][1] = "Flux2Transformer2DModel"
    index["transformer"][2]["type_hint"] = ["diffusers", "Flux2Transformer2DModel"]
    index_file.write_text(json.dumps(index))

    with pytest.raises(HalfSafeError) as caught:
        models.load_model(str(folder))

    # The folder's checks build nothing: FLUX.3's blocks take a Flux3Transformer2DModel there.
    assert str(caught.value) == (
        f"{folder / 'transformer'}: modular_model_index.json declares this a "
        "Flux2Transformer2DModel, but the FLUX.3 base model flux3 needs a Flux3Transformer2DModel."
    )


def test_trainers_words_name_each_variant():
    assert base_architecture("flux-3-image-klein-base") == "flux3-base"
    assert base_architecture("FLUX.3") == "flux3-base"
    assert base_architecture("flux-3-image-klein") == "flux3-klein"
    assert base_architecture("flux3_distilled/lora") == "flux3-klein"


# --- the schedule, the guidance, the flow map ------------------------------------------------


def test_the_probed_timesteps_are_the_schedule_the_blocks_run():
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipeline = build_tiny_flux3_pipeline()
    model = in_memory(pipeline, "flux3-schedule", "flux3-base")
    reference = FlowMatchEulerDiscreteScheduler(shift=FLUX3_SHIFT)  # as the blocks' spec makes it
    reference.set_timesteps(sigmas=np.linspace(1.0, 1 / 20, 20).tolist())
    assert reference.sigmas is not None
    sigmas = [float(s) for s in reference.sigmas[:-1]]

    picked = BASE.probe_timesteps(model, 20, "euler", 64)

    expected = {sigmas[0], sigmas[10], sigmas[-1]}
    assert picked == sorted((round(s * 1000.0, 2) for s in expected), reverse=True)
    assert picked == BASE.probe_timesteps(model, 20, "euler", 1024)  # a constant shift


def _calls(pipeline, cfg: float, steps: int) -> list[dict]:
    """The transformer's calls in a generation at `cfg`: each one's timestep and target."""
    seen: list[dict] = []

    def record(_module, _args, kwargs):
        target = kwargs.get("target_timestep")
        seen.append(
            {
                "timestep": float(kwargs["timestep"][0]),
                "target": None if target is None else float(target[0]),
                "tokens": kwargs["encoder_hidden_states"].shape[1],
            }
        )

    fam = family_of(pipeline)
    handle = pipeline.transformer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        with torch.inference_mode():
            embeds = fam.encode(pipeline, "a red cat", "a long blurry foggy picture", "cpu", True)
            latents, generators = fam.noise(pipeline, [1], 64, 64)
            pipeline(
                **embeds,
                height=64,
                width=64,
                latents=latents,
                num_inference_steps=steps,
                generator=generators,
                **fam.call_arguments(cfg),
            )
    finally:
        handle.remove()
    return seen


def test_the_base_model_makes_a_second_call_for_cfg_and_none_at_cfg_one():
    pipeline = build_tiny_flux3_pipeline()

    assert len(_calls(pipeline, 1.0, 3)) == 3
    guided = _calls(pipeline, 3.5, 3)
    assert len(guided) == 6
    assert all(call["target"] is None for call in guided)  # not a flow map


def test_the_distilled_model_is_told_each_steps_next_timestep_and_takes_no_cfg():
    pipeline = build_tiny_flux3_pipeline(distilled=True)

    calls = _calls(pipeline, 4.0, 3)  # a CFG scale asked for is not run

    assert len(calls) == 3
    targets = [call["target"] for call in calls]
    assert targets[:-1] == [call["timestep"] for call in calls[1:]]
    assert targets[-1] == 0.0
    assert KLEIN.guidance_parameters(4.0) == [("CFG scale", "1")]


def test_a_generation_of_each_variant_is_made_with_the_nan_watch(tmp_path):
    """A healthy generation at the variant's own settings: an image, not a blank."""
    for distilled in (False, True):
        pipeline = build_tiny_flux3_pipeline(distilled=distilled)
        request = generation.GenerationRequest(
            prompt="a red cat",
            steps=2,
            cfg=1.0 if distilled else 3.5,
            seed=4,
            width=64,
            height=64,
            output_dir=str(tmp_path),
        )
        model = in_memory(pipeline, f"flux3-{distilled}", ARCHITECTURE[distilled])

        result = generation.generate(model, request, precision=FP16, device="cpu")

        (image,) = result.images
        assert image.status == "ok"
        assert np.asarray(image.image.convert("RGB"), dtype=np.float32).std() > 0


def test_a_size_off_the_patch_grid_is_one_sentence(tmp_path):
    model = in_memory(build_tiny_flux3_pipeline(distilled=True), "flux3-size", "flux3-klein")
    request = generation.GenerationRequest(
        prompt="a red cat", steps=2, cfg=1.0, seed=1, width=72, height=64, output_dir=str(tmp_path)
    )

    with pytest.raises(HalfSafeError) as caught:
        generation.generate(model, request, precision=FP16, device="cpu")

    assert "multiples of 16 px, not 72x64" in str(caught.value)


def test_the_adapters_are_told_apart_by_the_registry():
    assert isinstance(build_tiny_flux3_pipeline(), Flux3Pipeline)
    assert family_of(build_tiny_flux3_pipeline()) is BASE
    assert family_of(build_tiny_flux3_pipeline(distilled=True)) is KLEIN


def test_a_bfl_file_without_its_text_encoder_is_named_in_one_sentence(tmp_path):
    transformer = tiny_flux3_transformer(1, distilled=True)
    file = tmp_path / "diffusion_models" / "flux-3-klein.safetensors"
    file.parent.mkdir(parents=True)
    write_safetensors(file, _original(transformer))

    with pytest.raises(HalfSafeError) as caught:
        models.load_model(str(file))

    assert "Qwen3-VL text encoder (qwen3_vl_4b)" in str(caught.value)


# --- editing: reference pictures in the transformer's sequence -------------------------------


@pytest.fixture
def references(tmp_path):
    """Two 64 px pictures of seeded colours."""
    from PIL import Image

    rng = np.random.RandomState(0)
    paths = []
    for index in range(2):
        path = tmp_path / f"ref{index}.png"
        Image.fromarray((rng.rand(64, 64, 3) * 255).astype(np.uint8)).save(path)
        paths.append(str(path))
    return paths


def _edit_check(model, images):
    from app.core import health

    return health.check_loaded(
        model,
        CheckRequest(precision=FP16, device="cpu", size=64, images=tuple(images)),
        run=CheckRun(remember=False, measure_cost=False),
    )


def _edit_request(tmp_path, images, cfg: float = 3.5):
    return generation.GenerationRequest(
        prompt="make the cube red",
        steps=2,
        cfg=cfg,
        seed=3,
        width=64,
        height=64,
        images=list(images),
        output_dir=str(tmp_path / "out"),
    )


@pytest.mark.parametrize("distilled", [False, True], ids=["base", "distilled"])
def test_a_healthy_model_is_checked_on_the_edit_path_in_fp16(distilled, references):
    model = in_memory(
        build_tiny_flux3_pipeline(distilled=distilled), "edit", ARCHITECTURE[distilled]
    )

    report = _edit_check(model, references)

    assert list(report.components) == ["text_encoder", "vae_encoder", "transformer", "vae"]
    assert report.verdict == "healthy"
    assert family_of(model.pipeline).max_references(model.pipeline) == 10


@pytest.mark.parametrize("distilled", [False, True], ids=["base", "distilled"])
def test_a_planted_transformer_overflow_in_an_edit_is_found_at_its_layer_and_fixed(
    distilled, references
):
    layer = "mode_blocks.image_cond.0.ff.linear_out"  # the references' own per-mode block
    pipeline = build_tiny_flux3_pipeline(distilled=distilled)
    with torch.no_grad():
        pipeline.transformer.get_submodule(layer).weight.mul_(1e6)
    model = in_memory(pipeline, "edit-planted", ARCHITECTURE[distilled])

    report = _edit_check(model, references)

    assert report.verdict == "fixable"
    assert {n for n, c in report.components.items() if c.status.failed} == {"transformer"}
    assert report.components["transformer"].first_bad_module == layer
    fix = report.fix
    assert fix is not None and fix.verified and fix.quality is not None and fix.quality.passed
    tested, fixed = report.plan, fix.plan
    assert {
        c
        for c in tested.dtypes
        if tested.dtypes[c] != fixed.dtypes[c] or tested.islands(c) != fixed.islands(c)
    } == {"transformer"}


def test_an_edit_reads_each_reference_in_the_sequence_and_changes_the_picture(tmp_path, references):
    pipeline = build_tiny_flux3_pipeline(distilled=True)
    model = in_memory(pipeline, "edit-gen", "flux3-klein")
    seen: list[tuple] = []

    def record(_module, _args, kwargs):
        ids = kwargs.get("image_cond_ids")
        states = kwargs.get("image_cond_hidden_states")
        seen.append((None, None) if ids is None else (states.shape[1], ids[:, 3].unique().tolist()))

    handle = pipeline.transformer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        edited = generation.generate(
            model, _edit_request(tmp_path, references, cfg=1.0), precision=FP16, device="cpu"
        ).images[0]
    finally:
        handle.remove()
    drawn = generation.generate(
        model,
        generation.GenerationRequest(
            prompt="make the cube red",
            steps=2,
            cfg=1.0,
            seed=3,
            width=64,
            height=64,
            output_dir=str(tmp_path / "drawn"),
        ),
        precision=FP16,
        device="cpu",
    ).images[0]

    # Each 64 px reference is 4x4 cells of 2x2 latent patches, told apart as -1 and -2.
    assert seen == [(32, [-2.0, -1.0])] * 2
    assert edited.status == "ok" and "Mode: edit" in edited.parameters
    pixels = np.asarray(edited.image.convert("RGB"), dtype=np.float32)
    assert np.isfinite(pixels).all()
    assert not np.array_equal(pixels, np.asarray(drawn.image.convert("RGB"), dtype=np.float32))


# --- on a GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("distilled", [False, True], ids=["base", "distilled"])
def test_on_cuda_a_planted_overflow_is_found_fixed_and_repaired_in_fp16(tmp_path, distilled):
    """fp16 on CUDA (its attention kernels, the QK norms diffusers would keep in fp32): the
    healthy model is healthy, a planted overflow in the image's per-mode block is found at its
    layer and fixed, and a generation repairs it."""
    from app.core import health

    def checked(pipeline):
        return health.check_loaded(
            in_memory(pipeline, "cuda", ARCHITECTURE[distilled]),
            CheckRequest(precision=FP16, device="cuda", size=64),
            run=CheckRun(remember=False, measure_cost=False),
        )

    assert checked(build_tiny_flux3_pipeline(distilled=distilled)).verdict == "healthy"
    layer = "mode_blocks.image.0.ff.linear_out"

    def planted():
        pipeline = build_tiny_flux3_pipeline(distilled=distilled)
        with torch.no_grad():
            pipeline.transformer.get_submodule(layer).weight.mul_(1e6)
        return pipeline

    report = checked(planted())
    assert report.verdict == "fixable" and report.fix is not None and report.fix.verified
    assert report.components["transformer"].first_bad_module == layer
    request = generation.GenerationRequest(
        prompt="a red cat",
        steps=3,
        cfg=1.0 if distilled else 3.5,
        seed=3,
        width=64,
        height=64,
        output_dir=str(tmp_path),
    )
    model = in_memory(planted(), "cuda-generate", ARCHITECTURE[distilled])
    (image,) = generation.generate(model, request, precision=FP16, device="cuda").images
    assert (image.status, image.component, image.first_bad_module) == (
        "fixed",
        "transformer",
        layer,
    )


@pytest.mark.slow  # about 20 s here: writing and reading a 151,669-token embedding
@pytest.mark.parametrize("distilled", [False, True], ids=["base", "distilled"])
def test_comfyuis_october_file_names_are_found_and_assembled(tmp_path, distilled):
    """ComfyUI's FLUX.3 Klein templates download diffusion_models/flux3-image-klein(-base)-
    int8-convrot, text_encoders/qwen3vl_4b_int8_convrot and vae/flux2-vae: here with bf16
    weights at those names (the int8 ConvRot form is read where quantized files are), the same
    model assembled from them."""
    pipeline = build_tiny_flux3_pipeline(distilled=distilled)
    written = save_split_files(pipeline, tmp_path / "models", "flux-3-klein")
    stem = "flux3-image-klein-int8-convrot" if distilled else "flux3-image-klein-base-int8-convrot"
    transformer = written["transformer"].rename(
        written["transformer"].with_name(stem + ".safetensors")
    )
    encoder = written["text_encoder"].rename(
        written["text_encoder"].with_name("qwen3vl_4b_int8_convrot.safetensors")
    )

    # Another file of the same shapes sorts before it: the name says which is the encoder.
    (encoder.parent / "a_copy.safetensors").write_bytes(encoder.read_bytes())

    model = models.load_model(str(transformer))

    assert (model.format, model.architecture) == ("split_files", ARCHITECTURE[distilled])
    assert model.companions["text_encoder"] == str(encoder)
    assert model.companions["vae"] == str(written["vae"])
    state = pipeline.transformer.state_dict()
    assert all(torch.equal(v, model.pipeline.transformer.state_dict()[k]) for k, v in state.items())
