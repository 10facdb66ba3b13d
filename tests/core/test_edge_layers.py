"""Overflows at a model's edges: the layers outside its repeated blocks (the embedders of text,
time, image and guidance, and the final projection), where a fix search places its islands and
guards layer by layer rather than block by block.

A part the check computes wider than it is stored (a bf16 or quantised file checked in fp16)
computes each layer from its stored weights, cast for the length of the layer's forward
(`layerwise.compute_in`). The fix search counts the work of a call of each verified candidate
on fake tensors (`step_work.module_flops`) and keeps a candidate's copy that holds little of its
own for the runs that time it (`PlacedPipeline.keeping_variants`): the copy must come out of
the count, and out of any call that raised, holding its stored weights. An island at an
embedder holds little of its own, so its copy is the one kept and run again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from app.core import health, models
from app.core.components import FP16_MAX, Verdict
from app.core.hardware.dtype_speed import DtypeSpeed
from app.core.health import step_work
from app.core.health.request import CheckRequest, CheckRun
from app.core.precision import PrecisionPlan, placement
from app.core.run import timing
from app.core.settings import PrecisionSettings
from tests.support.family_helpers import (
    FP16,
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.family_rows import ROWS
from tests.support.model_files import save_single_file, save_split_files
from tests.support.quantised_transformers import CASES, quantised_set, written_weights
from tests.support.tiny_models import build_tiny_sd_pipeline


def _unet_inputs(unet) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "sample": torch.randn(2, unet.config.in_channels, 8, 8, generator=generator),
        "timestep": torch.tensor(500.0),
        "encoder_hidden_states": torch.randn(
            2, 77, unet.config.cross_attention_dim, generator=generator
        ),
    }


@pytest.fixture
def computed_wider():
    """A tiny UNet stored in bf16, placed as a fix search places it for an fp16 run: kept as
    stored, each layer computing in fp16; and its stored weights by name."""
    pipeline = build_tiny_sd_pipeline().to(torch.bfloat16)
    plan = PrecisionPlan(device="cpu", dtypes={"unet": "fp16"}, compute_in_place=True)
    unet = placement.PlacedPipeline(pipeline, plan, components=["unet"])["unet"]
    assert unet.conv_in.weight.dtype == torch.bfloat16 and unet.dtype == torch.float16
    return unet, dict(unet.named_parameters())


def _as_stored(unet, stored) -> None:
    """Every parameter of `unet` is the stored tensor it held before, unchanged in kind."""
    now = dict(unet.named_parameters())
    assert now.keys() == stored.keys()
    changed = [
        name
        for name, tensor in now.items()
        if tensor is not stored[name] or tensor.dtype != torch.bfloat16 or tensor.is_meta
    ]
    assert changed == []


def test_counting_the_work_of_a_part_computing_wider_leaves_its_weights_as_stored(computed_wider):
    unet, stored = computed_wider
    inputs = _unet_inputs(unet)
    with torch.inference_mode():
        before = unet(**inputs).sample

        flops = step_work.module_flops(unet, lambda m: m(**inputs))

        _as_stored(unet, stored)
        after = unet(**inputs).sample
    assert before.dtype == torch.float16 and torch.equal(after, before)
    # The count itself ran: a 3x3 convolution's work on the CFG batch at the latent's 8x8.
    conv = unet.conv_in
    assert flops["conv_in"]["conv"] == 2 * 2 * conv.out_channels * conv.in_channels * 9 * 8 * 8


def test_a_layer_whose_forward_raised_still_holds_its_stored_weights(computed_wider):
    unet, stored = computed_wider
    inputs = _unet_inputs(unet)
    with torch.inference_mode():
        before = unet(**inputs).sample
        with pytest.raises(RuntimeError):
            unet.conv_in(torch.zeros(1, unet.config.in_channels + 1, 8, 8))  # a wrong width

        _as_stored(unet, stored)
        assert torch.equal(unet(**inputs).sample, before)


# --- the whole check, every family ------------------------------------------------------------

# Each family's edges in its denoiser (a row of test_families.py): the embedders of text, time,
# image and guidance it has (the first linear of each two-layer embedder: where an overflow of
# its path starts) and its final projection.
EDGES: dict[str, dict[str, str]] = {
    "sd": {"time": "time_embedding.linear_1", "image": "conv_in", "final": "conv_out"},
    "sdxl": {"text": "add_embedding.linear_1", "image": "conv_in", "final": "conv_out"},
    "flux": {
        "text": "context_embedder",
        "pooled": "time_text_embed.text_embedder.linear_1",
        "time": "time_text_embed.timestep_embedder.linear_1",
        "guidance": "time_text_embed.guidance_embedder.linear_1",
        "image": "x_embedder",
        "final": "proj_out",
    },
    "chroma": {
        "text": "context_embedder",
        "time": "distilled_guidance_layer.in_proj",
        "image": "x_embedder",
        "final": "proj_out",
    },
    "sd3": {
        "text": "context_embedder",
        "pooled": "time_text_embed.text_embedder.linear_1",
        "time": "time_text_embed.timestep_embedder.linear_1",
        "image": "pos_embed.proj",
        "final": "proj_out",
    },
    "zimage": {
        "text": "cap_embedder.1",
        "time": "t_embedder.mlp.0",
        "image": "all_x_embedder.2-1",
        "final": "all_final_layer.2-1.linear",
    },
    "qwenimage": {
        "text": "txt_in",
        "time": "time_text_embed.timestep_embedder.linear_1",
        "image": "img_in",
        "final": "proj_out",
    },
    "flux2": {
        "text": "context_embedder",
        "time": "time_guidance_embed.timestep_embedder.linear_1",
        "guidance": "time_guidance_embed.guidance_embedder.linear_1",
        "image": "x_embedder",
        "final": "proj_out",
    },
    "flux2klein": {
        "text": "context_embedder",
        "time": "time_guidance_embed.timestep_embedder.linear_1",
        "image": "x_embedder",
        "final": "proj_out",
    },
    "qwenimage21": {
        "text": "txt_in.in_layer",
        "time": "time_text_embed.timestep_embedder.linear_1",
        "image": "img_in",
        "final": "proj_out",
    },
    "krea2": {
        "text": "txt_in.linear_1",
        "time": "time_embed.linear_1",
        "image": "img_in",
        "final": "final_layer.linear",
    },
    "anima": {
        "time": "time_embed.t_embedder.linear_1",
        "image": "patch_embed.proj",
        "final": "proj_out",
    },
    "flux3": {
        "text": "context_embedder",
        "time": "timestep_embedder.linear_1",
        "image": "x_embedders.image",
        "final": "proj_out",
    },
    "flux3klein": {
        "text": "context_embedder",
        "time": "timestep_embedder.linear_1",
        "target_time": "target_timestep_embedder.linear_1",
        "image": "x_embedders.image",
        "final": "proj_out",
    },
}
# The stored forms, beside each family's files in bf16 (split files where it keeps its
# transformer in a file of its own, else its single file): the single files of those that have
# them, and the quantised transformer files of test_quantized_2026 (their blocks quantised, the
# edges in bf16, as released files keep them). Not the diffusers folder beside a family's own
# files: test_families holds each family's folder to the same outputs as the model it was
# written from, so its check would answer as the own files' does (Flux.2 dev's folder is its
# own form, swept with its edges).
SINGLE_FILE = ("sd", "sdxl", "sd3")
QUANTISED = {  # family row -> (its case in test_quantized_2026, the forms written for it)
    "flux3klein": (
        "flux3-klein",
        ("fp8-comfy_quant", "gguf-Q8_0", "nvfp4-comfy", "int8-comfy_quant", "int8-convrot"),
    ),
    "flux2klein": ("flux2-klein", ("fp8-scaled", "nvfp4-modelopt")),
    "qwenimage21": ("qwenimage21", ("fp8-metadata", "int8-convrot")),
    "krea2": ("krea2", ("int8-comfy_quant", "int8-convrot")),
}
# An overflow planted at an edge carries the layer's output to this, four times fp16's largest:
# past it in fp16 by far whatever the prompt's small differences between runs, in range in bf16
# and fp32 by far.
PLANTED_PEAK = 4 * FP16_MAX
_PEAKS: dict[str, dict[str, float]] = {}
# Flux.2 dev's own files are refused (README): its folder is its form.
FOLDER_ONLY = ("flux2",)


def _build(name: str):
    """Row `name`'s tiny pipeline as its files can hold it (`Row.build_files`)."""
    row = ROWS[name]
    return (row.build_files or row.build)()


def edge_peaks(name: str) -> dict[str, float]:
    """The largest output of each edge of row `name` in an fp32 check of its tiny model (the
    check's own prompt, steps and size), measured once."""
    if name not in _PEAKS:
        row = ROWS[name]
        pipeline = _build(name)
        denoiser = getattr(pipeline, row.components[-2])
        peaks: dict[str, float] = {}

        def record(layer: str):
            def seen(_module, _args, output) -> None:
                peak = float(output.detach().abs().max())
                peaks[layer] = max(peaks.get(layer, 0.0), peak)

            return seen

        handles = [
            denoiser.get_submodule(layer).register_forward_hook(record(layer))
            for layer in EDGES[name].values()
        ]
        model = in_memory(pipeline, f"{name}-fp32", row.architecture, row.prediction)
        health.check_loaded(
            model,
            CheckRequest(precision=PrecisionSettings(precision="fp32"), device="cpu", size=64),
            run=CheckRun(remember=False, measure_cost=False),
        )
        for handle in handles:
            handle.remove()
        assert set(peaks) == set(EDGES[name].values()), name  # every edge ran
        _PEAKS[name] = peaks
    return _PEAKS[name]


def planted_at_edge(name: str, layer: str):
    """Row `name`'s tiny pipeline in bf16, as its files are downloaded, with `layer` of its
    denoiser scaled (weight and bias: its output scales alike) until its output reaches
    `PLANTED_PEAK` on the check's inputs."""
    row = ROWS[name]
    factor = PLANTED_PEAK / edge_peaks(name)[layer]
    pipeline = _build(name)
    edge = getattr(pipeline, row.components[-2]).get_submodule(layer)
    with torch.no_grad():
        for tensor in (edge.weight, getattr(edge, "bias", None)):
            if tensor is not None:
                tensor.mul_(factor)
    return pipeline.to(torch.bfloat16)


def written(root: Path, name: str, layer: str, form: str) -> str:
    """Row `name`'s model with `layer` planted, written under `root` in `form`: its path."""
    row = ROWS[name]
    pipeline = planted_at_edge(name, layer)
    if form == "folder":
        pipeline.save_pretrained(root / name)
        return str(root / name)
    if form == "single_file" and name in ("sd", "sdxl"):
        return str(save_single_file(pipeline, root / f"{name}.safetensors"))
    if form in ("split_files", "single_file"):
        one = form == "single_file"  # SD3's: everything in one file, as Stability AI ships it
        files = save_split_files(pipeline, root / "models", row.architecture, single_file=one)
        return str(files["transformer"])
    case = CASES[QUANTISED[name][0]]
    return str(quantised_set(root, pipeline, case, form, written_weights(pipeline)).path)


def checked_as_asked(path: str, whole: bool = True):
    """The check a user runs on the file: fp16, its fix searched, verified and priced; not
    `whole`, stopped at the proved fix (`halfsafe check --quick`)."""
    return health.check_loaded(
        models.load_model(path),
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=whole, complete_table=whole),
    )


# The dtype table of a device on which every dtype runs at one rate (GFLOP/s and G weights/s):
# fixed, so that nothing depends on this machine's speeds, and slow enough that the tiny
# models' predicted work stands for their calls (`step_work.EXPLAINED`); no prediction tells two
# candidates apart, so the search times them.
LEVEL = DtypeSpeed(
    "level",
    {
        dtype: dict.fromkeys(("matmul", "conv", "matmul_weights", "conv_weights", "cast"), 1e-3)
        for dtype in ("fp16", "bf16", "fp32")
    },
)


@pytest.fixture
def as_a_user_runs_it(monkeypatch):
    """The fix search as on a user's computer: the work of a call counted from the device's
    dtype table (the suite leaves it out elsewhere, tests/conftest.py), the candidates timed,
    each in one round (every kept copy run again as three rounds run it, in a third of the
    time)."""
    monkeypatch.setattr(step_work, "device_speed", lambda device: LEVEL)
    monkeypatch.setattr(timing, "COST_ROUNDS", 1)


def assert_found_and_fixed(report, name: str, layer: str) -> None:
    denoiser = ROWS[name].components[-2]
    assert report.verdict is Verdict.FIXABLE
    bad = report.components[denoiser]
    assert bad.status in ("overflow", "nan") and bad.first_bad_module == layer
    assert report.fix is not None and report.fix.verified


def _own_form(name: str) -> str:
    if name in FOLDER_ONLY:
        return "folder"
    return "single_file" if name in ("sd", "sdxl") else "split_files"


# The overflow HalfSafe's users met in FLUX.3 Klein's files: in the text embedder (BFL's
# txt_in), in bf16 split files and in ComfyUI's int8 ConvRot download.
DEFAULT = [
    pytest.param("flux3klein", "context_embedder", form, id=f"flux3klein-text-{label}")
    for form, label in (("split_files", "bf16"), ("int8-convrot", "convrot"))
]


def _every_edge():
    """Every edge of every family in its own files, slow but for the default cases."""
    ran = {(p.values[0], p.values[1], p.values[2]) for p in DEFAULT}
    for name, edges in EDGES.items():
        for kind, layer in edges.items():
            if (name, layer, _own_form(name)) not in ran:
                yield pytest.param(
                    name,
                    layer,
                    _own_form(name),
                    id=f"{name}-{kind}",
                    marks=pytest.mark.slow,
                )


def _every_form():
    """Every other form of each family: each form with an edge of its own (the edges taken in
    turn, so that over a family's forms most of its edges meet one), slow."""
    for name, edges in EDGES.items():
        forms = ["single_file"] if name == "sd3" else []
        forms += list(QUANTISED.get(name, ("", ()))[1])
        kinds = list(edges)
        # (counted from 1, where a folder case came first: each form keeps the edge it met)
        for index, form in enumerate(forms, start=0 if name in FOLDER_ONLY else 1):
            kind = kinds[index % len(kinds)]
            if (name, edges[kind], form) in {tuple(p.values) for p in DEFAULT}:
                kind = kinds[(index + 1) % len(kinds)]
            yield pytest.param(
                name,
                edges[kind],
                form,
                id=f"{name}-{kind}-{form}",
                marks=pytest.mark.slow,
            )


@pytest.mark.usefixtures("as_a_user_runs_it")
@pytest.mark.parametrize(("name", "layer", "form"), [*DEFAULT, *_every_edge(), *_every_form()])
def test_an_overflow_at_an_edge_is_found_and_its_fix_verified_in_every_form(
    tmp_path, name, layer, form
):
    # The default cases run the whole check; the others ask what the form changes, the layer
    # found and its fix proved, and stop there (the table and the price are the same code in
    # every form).
    whole = (name, layer, form) in {tuple(p.values) for p in DEFAULT}
    report = checked_as_asked(written(tmp_path, name, layer, form), whole)

    assert_found_and_fixed(report, name, layer)
