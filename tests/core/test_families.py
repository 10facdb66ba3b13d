"""The contract every family in the registry keeps, in the spirit of diffusers'
PipelineTesterMixin: one row of data per family, and every family through the same tests. A
family added to `app.core.families` without its row (`tests/support/family_rows.py`) fails
`test_every_family_has_a_row`.

A row names the family's tiny pipeline (`tests/support/tiny_models.py`), what detection calls
it and why, the components the health check probes, where fp16 overflows are planted (each one
layer's weights scaled so that its output passes 65504 in fp16 and stays finite in fp32), and
the generations that must repair one. The contract is what the rest of HalfSafe relies on
without naming a family:

- the registry recognises the pipeline, its diffusers folder and (where the family keeps one)
  its transformer file in its own key layout; the latent format matches the VAE; an
  architecture name reads back to the family with a title;
- a diffusers folder saved to tmp loads back offline as that family, with identical weights,
  tokens and outputs (the prompt encoded, denoised and decoded as the check runs them);
- the health check of the healthy model in fp16 is healthy and probes every component;
- each planted overflow is found in its component at its layer, and the fix, verified against
  fp32, changes only that component; the check under the fix is healthy;
- generation with the NaN watch repairs a planted overflow, and the image is finite;
- the live preview of a generation is an RGB image of one pixel per latent cell (1/8 of the
  picture's size, 1/16 with Qwen-Image 2.1's VAE).

What only one family does (Flux's T5 island, Chroma told apart from Flux, SD3's three text
encoders, Z-Image's chat prompt, Qwen-Image's patch grid, split files and their companions)
is tested in that family's own file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from app.core import families, generation, health, models, samplers
from app.core.components import COMPONENTS, FP16_MAX
from app.core.errors import HalfSafeError
from app.core.families import (
    FAMILIES,
    FamilyId,
    architecture_title,
    family,
    family_of,
    family_of_architecture,
)
from app.core.formats.layouts import to_diffusers, to_original
from app.core.health.request import CheckRequest, CheckRun
from app.core.models import split
from app.core.settings import PrecisionSettings
from app.core.words.infotext import SETTING_KEYS
from tests.support import cost_oracle
from tests.support.family_helpers import (
    FP16,
    check,
    offline,  # noqa: F401 - an autouse fixture: no network
    same_weights,
)
from tests.support.family_rows import ROWS, Row, loaded, planted
from tests.support.golden import ROWS_WITHOUT_RECORDS, check_against_golden, cpu_bf16_class
from tests.support.model_files import save_split_files

# --- the rows ------------------------------------------------------------------------------


IDS = [f.id for f in FAMILIES]
NAMES = list(ROWS)  # a row's name: its family's id, "-variant" for a family's second row


def family_id(name: str) -> FamilyId:
    """The family of the row named `name`."""
    return FamilyId(name.split("-")[0])


def test_every_family_has_a_row():
    assert {family_id(name) for name in ROWS} == {f.id for f in FAMILIES}
    assert len(FAMILIES) == len(set(IDS))
    assert all(isinstance(f.id, FamilyId) and f.id in ROWS for f in FAMILIES)
    for name, row in ROWS.items():
        denoiser = family(family_id(name)).denoiser
        assert family_of_architecture(row.architecture) is family(family_id(name)), name
        assert row.components[-2:] == (denoiser, "vae"), name
        assert next(iter(row.plants.values())).component == denoiser, name
        assert {p.component for p in row.plants.values()} <= set(row.components), name
        assert any(r.plant.component == denoiser for r in row.repairs), name


def test_the_readmes_families_table_has_a_row_for_every_family_and_names_only_theirs():
    """README's table of families (the first column's `architecture` names) against the
    registry: a family added without its row, or a row naming an architecture no family has,
    fails here."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    header = "| family (`architecture`) |"
    lines = readme[readme.index(header) :].splitlines()[2:]  # past the header and rule
    rows = lines[: next((i for i, line in enumerate(lines) if not line.startswith("|")), None)]
    named = {
        code
        for row in rows
        for code in re.findall(r"`([^`]+)`", row.split("|")[1])
        if code != "-inpaint"  # the SD 1.x/2.x inpainting variants' suffix
    }
    known = {name for f in FAMILIES for name in f.architectures}
    assert named <= known, named - known
    for each in FAMILIES:
        assert named & set(each.architectures), f"{each.title} has no row in README's table"


def _each(rows: Mapping[str, Row], what: Callable[[Row], Mapping[str, Any]]):
    """pytest params of (row name, item) for every row's items, named row-item; slow where
    the row's checks are."""
    return [
        pytest.param(
            key, item, id=f"{key}-{name}", marks=[pytest.mark.slow] if row.slow_checks else []
        )
        for key, row in rows.items()
        for name, item in what(row).items()
    ]


PLANTED = _each(ROWS, lambda row: row.plants)
REPAIRED = _each(
    ROWS,
    lambda row: {f"{r.plant.component}-cfg{r.cfg:g}": r for r in row.repairs},
)
FOLDERS = [
    pytest.param(i, id=i, marks=[pytest.mark.slow] if row.slow_folder else [])
    for i, row in ROWS.items()
]
# The rows whose family keeps its transformer as a file of its own.
SPLIT = [
    pytest.param(i, id=i, marks=[pytest.mark.slow] if row.slow_folder else [])
    for i, row in ROWS.items()
    if family(family_id(i)).layout is not None
]


@pytest.fixture(scope="module", params=NAMES)
def built(request):
    """(family, its tiny pipeline, the row's name), built once per row for this module; the
    tests that use it leave its weights alone (the ones that plant a fault build their own)."""
    return family(family_id(request.param)), ROWS[request.param].build(), request.param


def asked(row: Row) -> dict[str, str]:
    """The dtype each component runs in when fp16 is asked for."""
    return {c: "fp32" if c in row.fp32 else "fp16" for c in row.components}


# --- recognition ---------------------------------------------------------------------------


def test_the_registry_recognises_the_familys_pipeline(built):
    expected, pipeline, row_name = built
    assert family_of(pipeline) is expected
    assert [f for f in FAMILIES if f.owns(pipeline)] == [expected]  # no other family claims it


def test_the_latent_format_is_the_vaes(built):
    expected, pipeline, row_name = built
    config = pipeline.vae.config
    channels = config.get("latent_channels") or config.get("z_dim")
    assert expected.latent.channels == channels
    factors = expected.latent.rgb_factors
    assert factors is None or len(factors) == channels


def test_an_architecture_name_reads_back_to_its_family_with_a_title(built):
    expected, _, row_name = built
    name = ROWS[row_name].architecture
    assert family_of_architecture(name) is expected
    assert architecture_title(name) not in ("", name)
    for own in expected.architectures:
        assert family_of_architecture(own) is expected


def test_a_diffusers_folder_of_the_family_is_detected_as_it(built):
    expected, pipeline, row_name = built
    denoiser = getattr(pipeline, expected.denoiser)
    # The class its folder names (Anima's adapter writes diffusers' modular pipeline's).
    named = getattr(type(pipeline), "folder_class_name", type(pipeline).__name__)
    index: dict[str, Any] = {"_class_name": named}
    for name, part in pipeline.components.items():
        if part is not None:
            index[name] = [type(part).__module__.split(".")[0], type(part).__name__]
    scheduler = dict(pipeline.scheduler.config)

    detection = families.detect_from_configs(index, dict(denoiser.config), scheduler)

    assert detection.supported, detection.because
    assert detection.architecture == ROWS[row_name].folder_architecture()  # a variant told apart
    assert family_of_architecture(detection.architecture) is expected
    assert (
        detection.family_id == expected.id and families.family_of_detection(detection) is expected
    )
    assert detection.pipeline_class == named
    assert detection.because.endswith(".")


def test_a_transformer_file_in_the_familys_layout_is_read_as_it(built):
    """The layout's key table maps both ways with identical tensors, and a file in it is told
    apart from every other family's (Chroma carries all of Flux.1's keys, and more)."""
    expected, pipeline, row_name = built
    if expected.layout is None:
        assert expected.transformer_class is None  # a UNet family: single files, see models
        return
    transformer = pipeline.transformer
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    state = transformer.state_dict()

    original = to_original(expected.layout.table(config), state)
    model = split.read_model({k: tuple(v.shape) for k, v in original.items()})

    assert model is not None and model.layout == expected.id
    assert family_of_architecture(model.architecture) is expected
    assert set(expected.companion_names) == {n.component for n in model.needs}
    back = to_diffusers(model.rows(), original, {k: tuple(v.shape) for k, v in state.items()})
    assert set(back) == set(state)
    assert all(torch.equal(back[k], v) for k, v in state.items())
    # What the file cannot hold (rotary axes, flags) is read as the family sets it, and the
    # family's tiny model is built that way: read back, it computes as the same transformer.
    # (`sample_size` only names a default image size; the family's real one is read.)
    for key, value in model.config.items():
        if key not in ("_class_name", "sample_size"):
            kept = transformer.config[key]
            if key == "out_channels" and kept is None:  # None: as many as it takes in
                kept = transformer.config["in_channels"]
            assert _plain(value) == _plain(kept), f"{key}: read {value}, built with {kept}"


def _plain(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def test_a_pipeline_of_no_family_is_refused_naming_every_family_there_is():
    detection = families.detect_from_configs({"_class_name": "WanPipeline"}, {}, {})

    assert not detection.supported and "WanPipeline" in detection.because
    assert all(f.title in detection.because for f in FAMILIES)


# --- a diffusers folder, saved and loaded back ---------------------------------------------


def _outputs(expected, pipeline, timesteps) -> list[Any]:
    """What the health check computes from the pipeline in fp32: the prompt's tensors, the
    latents denoised through `timesteps` from seeded noise, and their pixels."""
    with torch.inference_mode():
        conditioning = expected.encode(pipeline, "a red cat", "fog", "cpu", True)
        latents = expected.probe_denoise(pipeline, conditioning, 64, "cpu", timesteps)
        pixels = expected.decode(pipeline.vae, latents)
    return [*(conditioning[k] for k in sorted(conditioning)), latents, pixels]


@pytest.mark.class_free
@pytest.mark.parametrize("name", FOLDERS)
def test_a_diffusers_folder_loads_back_offline_as_its_family_with_identical_outputs(tmp_path, name):
    row = ROWS[name]
    expected = family(family_id(name))
    pipeline = row.build()
    pipeline.save_pretrained(tmp_path / name)

    model = models.load_model(str(tmp_path / name))

    assert (model.architecture, model.format, model.prediction_type) == (
        row.folder_architecture(),
        "diffusers",
        row.prediction,
    )
    start, *phrases = row.folder_because()
    assert model.detected_because.startswith(start), model.detected_because
    assert all(p in model.detected_because for p in phrases), model.detected_because
    assert family_of(model.pipeline) is expected
    same_weights(pipeline, model.pipeline, row.components)
    tokenizers = [n for n, part in pipeline.components.items() if n.startswith("tokenizer")]
    for name in tokenizers:
        mine, theirs = getattr(pipeline, name), getattr(model.pipeline, name)
        if hasattr(mine, "image_processor"):  # a processor as the tokenizer (FLUX.3's Qwen3-VL)
            mine, theirs = mine.tokenizer, theirs.tokenizer
        assert mine("a red cat").input_ids == theirs("a red cat").input_ids, name
    timesteps = expected.probe_timesteps(model, 2, "euler", 64)
    mine = _outputs(expected, pipeline, timesteps)
    theirs = _outputs(expected, model.pipeline, timesteps)
    # The same numbers up to float rounding (weights read from the file sit at other addresses,
    # and the matrix kernels pick their path by alignment); a wrong config is off by far more.
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.class_free
@pytest.mark.parametrize("name", SPLIT)
def test_its_files_as_comfyui_keeps_them_load_offline_with_identical_weights_and_outputs(
    tmp_path, name
):
    """The transformer in its family's layout in diffusion_models/, each companion in the
    layout its kind's files use in text_encoders/ and vae/ (`Need.kind`): found beside it by
    their contents, read as their kinds, the same model."""
    row = ROWS[name]
    expected = family(family_id(name))
    pipeline = (row.build_files or row.build)()
    # The file's name carries the variant where nothing in its tensors does (Z-Image Base).
    written = save_split_files(pipeline, tmp_path / "models", row.architecture)
    assert set(written) == {"transformer", *expected.companion_names}
    shapes = models.read_safetensors_header(written["transformer"]).shapes()
    read = split.read_model(shapes, written["transformer"].name)
    assert read is not None and read.architecture == row.architecture
    if row.folder is not None:  # told by the file's name alone, which it says
        start, *phrases = row.because
        assert read.because.startswith(start) and all(p in read.because for p in phrases)
    if read.unsupported is not None:  # refused before anything is read, in one sentence
        with pytest.raises(HalfSafeError, match="cannot be run on its own"):
            models.load_model(str(written["transformer"]))
        return

    model = models.load_model(str(written["transformer"]))

    assert (model.format, model.architecture, model.prediction_type) == (
        "split_files",
        row.architecture,
        row.prediction,
    )
    assert family_of(model.pipeline) is expected
    assert set(model.companions) == set(expected.companion_names)
    parts = ["transformer", *expected.companion_names]
    parts += ["text_conditioner"] if getattr(pipeline, "text_conditioner", None) else []
    for part in parts:
        mine, theirs = getattr(pipeline, part), getattr(model.pipeline, part)
        if type(mine) is not type(theirs):  # a causal LM read as its model (Flux.2 Klein's)
            mine = mine.model
        same_weights(SimpleNamespace(part=mine), SimpleNamespace(part=theirs), ["part"])
    # The prompt's tensors and the denoised latents; the VAE's latent scale is no tensor, so a
    # file's VAE decodes with its family's published one (`same_weights` covers its weights).
    timesteps = expected.probe_timesteps(model, 2, "euler", 64)
    for a, b in zip(
        _outputs(expected, pipeline, timesteps)[:-1],
        _outputs(expected, model.pipeline, timesteps)[:-1],
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# --- the health check ----------------------------------------------------------------------


@pytest.mark.class_free
def test_the_healthy_model_is_healthy_in_fp16_and_every_component_is_probed(built):
    expected, pipeline, row_name = built
    row = ROWS[row_name]
    model = loaded(pipeline, row_name, "healthy")

    report = check(model)

    assert report.verdict == "healthy" and report.fix is None
    assert list(report.components) == list(row.components) == expected.components(pipeline)
    for name, component in report.components.items():
        assert component.status == "ok", name
        assert component.first_bad_module is None, name
        assert 0 < component.max_abs < FP16_MAX, name
        assert component.headroom == pytest.approx(FP16_MAX / component.max_abs), name
    tested = report.to_json()["tested"]
    assert {c: tested[c] for c in row.components} == asked(row)
    # The denoiser is probed at the first, middle and last step of the user's schedule.
    assert report.timesteps == expected.probe_timesteps(
        model, health.DEFAULT_STEPS, health.DEFAULT_SCHEDULER, 64
    )
    assert len(report.timesteps) == 3 and report.timesteps == sorted(report.timesteps)[::-1]
    if row.prediction == "flow":
        assert report.timesteps[0] == 1000.0  # sigma 1: pure noise


@pytest.mark.parametrize(("name", "plant"), PLANTED)
def test_a_planted_overflow_is_found_and_only_what_failed_is_fixed_resident_or_streamed(
    monkeypatch, name, plant
):
    component, layer = plant.component, plant.layer

    # The check in fp16 answers as its golden record (tests/golden/; test_golden_reports.py
    # holds the record's other precisions), its fix's cost the injected oracle's.
    (key,) = [k for k, p in ROWS[name].plants.items() if p is plant]
    cost_oracle.inject(monkeypatch)
    report = health.check_loaded(
        loaded(planted(name, plant), name, key),
        CheckRequest(precision=FP16, device="cpu", size=64),
        run=CheckRun(remember=False, measure_cost=True),
    )
    if name not in ROWS_WITHOUT_RECORDS:
        check_against_golden(report, f"{name}-{key}", "fp16")

    assert report.verdict == "fixable"
    assert list(report.components) == list(ROWS[name].components)
    failed = {n for n, c in report.components.items() if c.status in ("overflow", "nan")}
    assert failed == {component}
    assert all(c.status == "ok" for n, c in report.components.items() if n != component)
    bad = report.components[component]
    assert (bad.status, bad.first_bad_module) == (plant.status, layer)
    # The fix's run measured the true magnitude, in fp32 or bf16.
    assert bad.headroom is not None and (bad.headroom < 1) is plant.output_past_fp16
    fix = report.fix
    assert fix.verified is True and fix.quality is not None and fix.quality.passed
    tested, fixed = report.plan, fix.plan
    changed = {
        c
        for c in tested.dtypes
        if tested.dtypes[c] != fixed.dtypes[c] or tested.islands(c) != fixed.islands(c)
    }
    assert changed == {component}
    # The component wider, or only some of its layers, the overflowing one among them (alone,
    # or inside the whole attention that holds it).
    assert fixed.dtypes[component] in ("bf16", "fp32") or any(
        layer == island or layer.startswith(island + ".") for island in fixed.islands(component)
    )
    assert set(report.to_json()["fix"]["modules"]) <= {component}
    if plant.known is not None:  # the fix HalfSafe knows for it is found and verified...
        (known,) = [c for c in fix.candidates if c.kind == plant.known.kind]
        assert known.verified and known.settings == plant.known.settings
        assert known.candidate.plan.islands(component) == plant.known.islands
        # ...and chosen: those layers wider, the rest of the component in fp16.
        assert fix.settings == plant.known.settings
        assert (fixed.dtypes[component], fixed.islands(component)) == ("fp16", plant.known.islands)

    # The CPU's bf16 class changes what is asked above (the fix's layers kept in bf16 or in
    # fp32); the second pass, as on a CPU without native bf16 (installer/run-tests.sh), ends
    # here, and the run under the fix and the streamed check below are the first pass's.
    if cpu_bf16_class() == "emulated":
        return

    # Proof by re-running: the whole check under the fix's settings is healthy.
    settings = PrecisionSettings.from_mapping({**FP16.to_dict(), **fix.settings})
    again = check(loaded(planted(name, plant), name, "again"), settings)
    assert again.verdict == "healthy"

    # Streamed block by block (a budget below any part's stored bytes): the same layer and fix.
    # Every component streams whichever holds the plant, so the family's first plant (its
    # denoiser's) stands for its others.
    if plant is not next(iter(ROWS[name].plants.values())):
        return
    streamed = check(loaded(planted(name, plant), name, "streamed"), STREAMED)
    assert plant.component in streamed.to_json()["memory"]["streamed"]  # a block at a time
    assert streamed.verdict == "fixable"
    for part, resident in report.components.items():
        got = streamed.components[part]
        assert (got.status, got.first_bad_module) == (resident.status, resident.first_bad_module)
    assert streamed.fix.verified and streamed.fix.settings == fix.settings


# Less than any tiny component holds as stored: every component streams block by block.
STREAMED = dataclasses.replace(FP16, max_vram_gb=0.0001)


# --- generation ----------------------------------------------------------------------------


def _setting_label(component: str) -> str:
    """The PNG parameters' name for the precision setting that governs `component`."""
    setting = COMPONENTS[component].setting
    return next(key.name for key in SETTING_KEYS if key.setting == setting)


@pytest.mark.parametrize(("name", "repair"), REPAIRED)
def test_generation_with_the_nan_watch_repairs_a_planted_overflow(tmp_path, name, repair):
    row, expected, plant = ROWS[name], family(family_id(name)), repair.plant
    request = generation.GenerationRequest(
        prompt="a red cat",
        negative_prompt="fog",
        steps=3,
        cfg=repair.cfg,
        seed=3,
        width=64,
        height=64,
        output_dir=str(tmp_path),
    )

    result = generation.generate(
        loaded(planted(name, plant), name, "generate"),
        request,
        precision=FP16,
        device="cpu",
    )

    (image,) = result.images
    assert (image.status, image.component) == ("fixed", plant.component)
    # The denoiser's overflow is seen at the step it happened; a VAE's after the last.
    assert image.step == (1 if plant.component == expected.denoiser else None)
    assert image.first_bad_module == plant.layer
    assert len(image.fixes_applied) == 1
    assert COMPONENTS[plant.component].words in image.fixes_applied[0]
    assert image.non_finite == 0 and result.all_good is True
    pixels = np.asarray(image.image.convert("RGB"), dtype=np.float32)
    assert image.image.size == (64, 64) and pixels.std() > 0  # a picture, not a blank
    # Everything but what was repaired ran as asked, and the PNG says so.
    text = image.parameters
    for name, dtype in asked(row).items():
        if name != plant.component:
            assert image.settings[COMPONENTS[name].setting] == dtype, name
            assert f"{_setting_label(name)}: {dtype}" in text, name
    assert f"NaN component: {plant.component}" in text
    assert row.sampler.format(cfg=repair.cfg) in text
    # A flow-matching family samples with its own Euler: the sampler setting is said not to apply.
    foreign = expected.sampler_words(request.scheduler) != samplers.words(request.scheduler)
    assert any("does not apply" in w for w in result.warnings) is foreign
    assert json.loads(json.dumps(result.to_json()))["images"][0]["status"] == "fixed"


@pytest.mark.class_free
def test_a_healthy_generation_is_ok_with_previews_of_its_pictures_shape(built, tmp_path):
    expected, pipeline, row_name = built
    row = ROWS[row_name]
    request = generation.GenerationRequest(
        prompt="a red cat",
        negative_prompt="fog",
        steps=4,
        cfg=row.repairs[0].cfg,
        seed=5,
        width=64,
        height=96,  # not square: the preview keeps the picture's orientation
        output_dir=str(tmp_path),
    )
    previews = []

    result = generation.generate(
        loaded(pipeline, row_name, "preview"),
        request,
        precision=FP16,
        device="cpu",
        on_preview=lambda step, image: previews.append((step, image)),
    )

    assert [e.status for e in result.images] == ["ok"]
    assert previews and all(step < request.steps for step, _ in previews)
    factor = expected.latent_factor(pipeline)  # 8, or 16 for Qwen-Image 2.1's VAE
    for _, image in previews:
        assert (image.mode, image.size) == ("RGB", (64 // factor, 96 // factor))


# The rows whose model states its own steps and CFG scale (Turbo's few steps without CFG).
DEFAULTED = [
    pytest.param(
        i,
        id=i,
        marks=[pytest.mark.slow] if defaults.steps > 10 else [],
    )
    for i, row in ROWS.items()
    if (defaults := families.generation_defaults(row.architecture)) is not None
]


@pytest.mark.parametrize("name", DEFAULTED)
def test_a_job_without_steps_or_cfg_runs_the_models_own_schedule(tmp_path, name):
    """Where the model states its steps and CFG scale, a job that gives none runs them: one
    prediction a step without CFG, two with it, as the PNG says."""
    from app.core.requests import requested

    row = ROWS[name]
    model = loaded(row.build(), name, "defaults")
    defaults = requested.model_defaults(model)
    assert defaults is not None
    request = generation.GenerationRequest(
        prompt="a red cat",
        negative_prompt="fog",
        steps=defaults.steps,
        cfg=defaults.cfg,
        seed=5,
        width=64,
        height=64,
        output_dir=str(tmp_path),
    )
    denoiser = getattr(model.pipeline, family(family_id(name)).denoiser)
    batches = []  # how many latents each denoiser call predicts

    def count(_module, args, kwargs, _output):
        latents = args[0] if args else kwargs["hidden_states"]
        batches.append(len(latents) if isinstance(latents, list) else latents.shape[0])

    hook = denoiser.register_forward_hook(count, with_kwargs=True)
    try:
        result = generation.generate(model, request, precision=FP16, device="cpu")
    finally:
        hook.remove()

    assert [e.status for e in result.images] == ["ok"]
    # A prediction a step, two with CFG (its negative branch: batched, or a call of its own).
    assert sum(batches) == defaults.steps * (2 if defaults.cfg > 1 else 1)
    assert len(batches) in (defaults.steps, sum(batches))
    text = result.images[0].parameters
    assert f"Steps: {defaults.steps}," in text
    assert row.sampler.format(cfg=defaults.cfg) in text


# Pixels per tile of what each family's denoiser works on: a UNet's latent cell, or a 2x2
# patch of latent cells (16 px; 32 px with Qwen-Image 2.1's 16x VAE).
TILE = {FamilyId("sd"): 8, FamilyId("sdxl"): 8, FamilyId("qwenimage21"): 32}


def test_a_picture_is_made_at_the_size_asked_for_or_refused_in_one_sentence(built, tmp_path):
    """72 px is a multiple of a latent cell but not of a 2x2 patch: a UNet family draws it;
    a patch family's pipeline would silently draw 64 px (Flux) or fail to pack a picture's
    latents, so HalfSafe refuses it before anything runs, in one sentence."""
    expected, pipeline, row_name = built
    request = generation.GenerationRequest(
        prompt="a red cat",
        steps=2,
        cfg=ROWS[row_name].repairs[0].cfg,
        seed=5,
        width=72,
        height=64,
        output_dir=str(tmp_path),
    )
    model = loaded(pipeline, row_name, "size")
    tile = TILE.get(expected.id, 16)

    if tile == 8:
        result = generation.generate(model, request, precision=FP16, device="cpu")
        assert [image.image.size for image in result.images] == [(72, 64)]
        return
    with pytest.raises(HalfSafeError) as caught:
        generation.generate(model, request, precision=FP16, device="cpu")
    assert str(caught.value) == (
        f"{model.name}: this model makes pictures whose sides are multiples of {tile} px, "
        "not 72x64."
    )


def test_the_families_read_from_files_of_their_own_are_named_from_the_registry():
    from app.core.families.registry import file_layout_words

    words = file_layout_words()
    for each in FAMILIES:
        sharing = [f for f in FAMILIES if f.layout is not None and f.layout is each.layout]
        if each.layout is not None:
            assert any(f.title in words for f in sharing), each.title
        else:
            assert each.title not in words, each.title


def test_the_text_encoder_flags_help_names_each_layouts_companions_from_the_registry():
    """The families whose transformer files run, each with its text-encoder files' names, come
    from the registry: a family added with its layout is in `--text-encoder`'s help."""
    from app.cli.arguments import build_parser
    from app.core.families.registry import companion_words

    said = companion_words()
    for each in FAMILIES:
        stems = [s for part, s in each.companion_names.items() if part.startswith("text_")]
        # A layout two variants share is named by the first in the registry (FLUX.3 base's
        # names the distilled Klein's files too).
        first = next((f for f in FAMILIES if each.layout and f.layout is each.layout), None)
        if each.layout is not None and stems and each.title != "Flux.2" and first is each:
            assert f"{each.title}: " in said and stems[-1] in said, each.title
    assert "Flux.2: " not in said  # dev's files are refused; its layout is Klein's
    check = build_parser()._subparsers._group_actions[0].choices["check"]  # type: ignore[union-attr]
    help_text = " ".join(check.format_help().split())
    assert "Krea 2: qwen3_vl_4b" in help_text
