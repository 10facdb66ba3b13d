"""Every kind of fix HalfSafe proposes runs on every path a model takes: text-to-image,
image-to-image, inpainting, an edit, a control picture (each with the VAE's encoder), under
layers kept in fp32 or bf16, fp16 outputs clamped, and a component in fp32.

A fix that works for text-to-image but breaks the next image-to-image job is the worst kind of
fix, so each job here must make a finite picture, and every placed component must still be in
the dtypes its plan placed it in when the job ends: a job that quietly widens a component it
was told to run in fp16 would make a picture its record does not describe (diffusers'
`from_pipe` casts every component of the pipeline it is given to one dtype).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch
from PIL import Image

from app.core import generation
from app.core.families import FamilyId
from app.core.images.pictures import Mode
from app.core.precision import placement
from app.core.settings import PrecisionSettings
from tests.support import tiny_models
from tests.support.edit_checks import smaller_qwenimage21_pictures  # noqa: F401 - a fixture
from tests.support.family_helpers import (
    in_memory,
    offline,  # noqa: F401 - an autouse fixture: no network
)
from tests.support.family_rows import ROWS, VAE_LAYER


@dataclass(frozen=True)
class Path:
    """A model and the pictures its job starts from: (picture, mask) indices into `pictures`."""

    build: Callable[[], object]
    architecture: str
    mode: Mode
    pictures: int = 0  # how many input pictures
    mask: bool = False
    slow: bool = True


def _row(family_id: FamilyId, variant: str = ""):
    name = family_id + variant
    row = ROWS[name]
    return lambda: in_memory(row.build(), name, row.architecture, row.prediction)


def _tiny(builder: Callable[[], object], architecture: str):
    return lambda: in_memory(builder(), architecture, architecture)


PATHS = {
    "sd-text": Path(_row(FamilyId("sd")), "sd1", Mode.TEXT, slow=False),
    "sd-img2img": Path(_row(FamilyId("sd")), "sd1", Mode.IMAGE, 1, slow=False),
    "sd-inpaint": Path(_row(FamilyId("sd")), "sd1", Mode.INPAINT, 1, True, slow=False),
    "sdxl-img2img": Path(_row(FamilyId("sdxl")), "sdxl", Mode.IMAGE, 1),
    "sdxl-inpaint": Path(_row(FamilyId("sdxl")), "sdxl", Mode.INPAINT, 1, True),
    "flux-img2img": Path(_row(FamilyId("flux")), "flux-dev", Mode.IMAGE, 1),
    "flux-inpaint": Path(_row(FamilyId("flux")), "flux-dev", Mode.INPAINT, 1, True),
    "chroma-img2img": Path(_row(FamilyId("chroma")), "chroma", Mode.IMAGE, 1),
    "sd3-img2img": Path(_row(FamilyId("sd3")), "sd3", Mode.IMAGE, 1),
    "sd3-inpaint": Path(_row(FamilyId("sd3")), "sd3", Mode.INPAINT, 1, True),
    "zimage-img2img": Path(_row(FamilyId("zimage")), "zimage-turbo", Mode.IMAGE, 1),
    "zimage-base-img2img": Path(_row(FamilyId("zimage"), "-base"), "zimage-base", Mode.IMAGE, 1),
    "qwenimage-img2img": Path(_row(FamilyId("qwenimage")), "qwenimage", Mode.IMAGE, 1),
    "qwenimage-inpaint": Path(_row(FamilyId("qwenimage")), "qwenimage", Mode.INPAINT, 1, True),
    "klein-inpaint": Path(_row(FamilyId("flux2klein")), "flux2-klein", Mode.INPAINT, 1, True),
    "klein-edit": Path(_row(FamilyId("flux2klein")), "flux2-klein", Mode.EDIT, 2),
    "flux2-edit": Path(_row(FamilyId("flux2")), "flux2-dev", Mode.EDIT, 2),
    "qwenimage21-edit": Path(_row(FamilyId("qwenimage21")), "qwenimage21", Mode.EDIT, 2),
    "kontext-edit": Path(
        _tiny(tiny_models.build_tiny_flux_kontext_pipeline, "flux-kontext"), "", Mode.EDIT, 1
    ),
    "qwen-edit": Path(
        _tiny(lambda: tiny_models.build_tiny_qwenimage_edit_pipeline(plus=False), "qwenimage-edit"),
        "",
        Mode.EDIT,
        1,
    ),
    "flux-fill": Path(
        _tiny(tiny_models.build_tiny_flux_fill_pipeline, "flux-fill"), "", Mode.INPAINT, 1, True
    ),
    "flux-control": Path(
        _tiny(tiny_models.build_tiny_flux_control_pipeline, "flux-control"), "", Mode.CONTROL, 1
    ),
}


def _denoiser(pipeline) -> str:
    return "unet" if getattr(pipeline, "unet", None) is not None else "transformer"


def _first_weighted(module, prefix: str) -> str:
    """The first layer with a weight under `prefix` (the VAE encoder's first conv)."""
    return next(
        name
        for name, layer in module.named_modules()
        if name.startswith(prefix) and isinstance(getattr(layer, "weight", None), torch.Tensor)
    )


def _denoiser_layer(pipeline) -> str:
    """A linear layer inside the denoiser's first block, as the conformance rows plant."""
    denoiser = getattr(pipeline, _denoiser(pipeline))
    return next(
        name
        for name, layer in denoiser.named_modules()
        if isinstance(layer, torch.nn.Linear) and ("blocks.0." in name or "layers.0." in name)
    )


def _fix(kind: str, pipeline) -> PrecisionSettings:
    """The settings of one kind of fix on this pipeline, the rest of it in fp16."""
    denoiser = _denoiser(pipeline)
    vae_layers = (VAE_LAYER, _first_weighted(pipeline.vae, "encoder."))
    block = f"{denoiser}:{_denoiser_layer(pipeline)}"
    if kind == "fp32 layers":
        return PrecisionSettings(
            precision="fp16", fp32_modules=(*(f"vae:{v}" for v in vae_layers), block)
        )
    if kind == "bf16 layers":
        return PrecisionSettings(
            precision="fp16", bf16_modules=(*(f"vae:{v}" for v in vae_layers), block)
        )
    if kind == "clamps":
        return PrecisionSettings(
            precision="fp16", clamp_modules=(*(f"vae:{v}" for v in vae_layers), block)
        )
    assert kind == "VAE in fp32"
    return PrecisionSettings(precision="fp16", vae_precision="fp32")


KINDS = ("fp32 layers", "bf16 layers", "clamps", "VAE in fp32")


@pytest.fixture
def pictures(tmp_path):
    """Two 64 px pictures of seeded colours and a mask whose middle is white."""
    rng = np.random.RandomState(0)
    paths = []
    for index in range(2):
        path = tmp_path / f"picture{index}.png"
        Image.fromarray((rng.rand(64, 64, 3) * 255).astype(np.uint8)).save(path)
        paths.append(str(path))
    mask = np.zeros((64, 64), np.uint8)
    mask[16:48, 16:48] = 255
    mask_path = tmp_path / "mask.png"
    Image.fromarray(mask).save(mask_path)
    return paths, str(mask_path)


@pytest.fixture
def placements(monkeypatch):
    """Every component copy placed during the test: its name, the module, the dtype its plan
    gives the component, and the dtype of each of its weights as placed."""
    placed: list[tuple[str, torch.nn.Module, str, dict[str, torch.dtype]]] = []
    apply = placement.PlacedPipeline.apply

    def recording(self, plan, components=None):
        apply(self, plan, components)
        for name, (_, module) in self._placed.items():
            if not any(module is seen[1] for seen in placed):
                dtypes = {n: p.dtype for n, p in module.named_parameters()}
                placed.append((name, module, plan.dtypes[name], dtypes))

    monkeypatch.setattr(placement.PlacedPipeline, "apply", recording)
    return placed


def _cases():
    for key, path in PATHS.items():
        for kind in KINDS:
            marks = [pytest.mark.slow] if path.slow or kind != KINDS[0] else []
            yield pytest.param(key, kind, id=f"{key}-{kind.replace(' ', '-')}", marks=marks)


# Qwen-Image 2.1 reads each picture at a reduced area here (`QWENIMAGE21_EDIT_SIZE`).
@pytest.mark.usefixtures("smaller_qwenimage21_pictures")
@pytest.mark.parametrize(("path_key", "kind"), list(_cases()))
def test_every_kind_of_fix_runs_on_every_path_in_the_dtypes_it_names(
    path_key, kind, pictures, placements, tmp_path
):
    path = PATHS[path_key]
    model = path.build()
    settings = replace(_fix(kind, model.pipeline), auto_fix="off")
    images, mask = pictures
    request = generation.GenerationRequest(
        prompt="a red cube",
        steps=2,
        cfg=3.5,
        seed=3,
        width=64,
        height=64,
        images=images[: path.pictures],
        mask=mask if path.mask else None,
        output_dir=str(tmp_path / "out"),
    )
    if path.mode in (Mode.IMAGE, Mode.INPAINT) and path_key != "flux-fill":
        request.strength = 0.5
    result = generation.generate(model, request, precision=settings, device="cpu")
    assert result.to_json()["mode"] == path.mode.value
    assert [image.status for image in result.images] == ["ok"], result.images[0].message
    assert placements, "no component was placed"
    for name, module, _, dtypes in placements:
        changed = sorted(n for n, p in module.named_parameters() if p.dtype != dtypes[n])
        assert not changed, f"the job changed {len(changed)} weights of {name}: {changed[:3]}"
    # The fix really ran: the layer it names in the dtype it names, the rest in the VAE's own
    # (fp16, or fp32 where the model's config asks for it: SDXL's original VAE).
    vae = [(planned, dtypes) for name, _, planned, dtypes in placements if name == "vae"]
    assert vae, "the VAE was never placed"
    planned, dtypes = vae[-1]
    own = {"fp16": torch.float16, "fp32": torch.float32}[planned]
    layer = {
        "fp32 layers": torch.float32,
        # A layer is kept wider, never narrower: in an fp32 VAE it stays fp32.
        "bf16 layers": torch.bfloat16 if own == torch.float16 else own,
        "clamps": own,
        "VAE in fp32": torch.float32,
    }[kind]
    assert dtypes[f"{VAE_LAYER}.weight"] == layer
    assert dtypes["decoder.conv_in.weight"] == own
