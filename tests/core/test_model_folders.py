"""Names that come from an image or a prompt (a `<lora:...>` tag, a VAE name) resolve only inside
the model folders: an absolute path, a `..` step or a link leading out is refused, in `explain`
and in `generate` alike, while a name inside a folder still works."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.core import explain, library, limits
from app.core.explain.explanation import _apply_image_loras
from app.core.explain.pixels import PixelFigures
from app.core.generation import GenerationRequest, generate
from app.core.lora import files as lora
from app.core.settings import PrecisionSettings
from tests.support.lora_files import kohya_lora, save_lora
from tests.support.tiny_models import build_tiny_sd_pipeline


@pytest.fixture
def folders(tmp_path) -> tuple[Path, Path]:
    """A model folder with a file inside, a subfolder and links in and out; and a folder
    outside it holding a file of the same name."""
    inside = tmp_path / "models"
    (inside / "styles").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (inside / "ink.safetensors").write_bytes(b"x")
    (inside / "styles" / "grain.safetensors").write_bytes(b"x")
    (outside / "secret.safetensors").write_bytes(b"x")
    os.symlink(outside / "secret.safetensors", inside / "linked.safetensors")
    os.symlink(outside, inside / "door")
    os.symlink(inside / "ink.safetensors", inside / "alias.safetensors")
    return inside, outside


def test_a_name_resolves_inside_its_folder(folders):
    inside, _ = folders
    find = limits.find_in_folders
    assert find("ink", [inside], (".safetensors",)) == inside / "ink.safetensors"
    assert find("styles/grain.safetensors", [inside]) == inside / "styles" / "grain.safetensors"
    assert find("styles\\grain.safetensors", [inside]) == inside / "styles" / "grain.safetensors"
    assert find("alias.safetensors", [inside]) == inside / "alias.safetensors"  # a link inside
    assert find("missing", [inside], (".safetensors",)) is None


@pytest.mark.parametrize(
    "name",
    [
        "ABSOLUTE",
        "../elsewhere/secret",
        "styles/../../elsewhere/secret",
        "linked",
        "door/secret",
        "~/secret",
        "C:\\elsewhere\\secret",
        "C:secret",
        "\\\\server\\share\\secret",
        "//server/share/secret",
    ],
)
def test_a_name_reaching_outside_the_folders_is_refused(folders, name):
    inside, outside = folders
    name = str(outside / "secret") if name == "ABSOLUTE" else name
    with pytest.raises(limits.OutsideFoldersError):
        limits.find_in_folders(name, [inside], (".safetensors",))


# generate: the prompt's LoRA tags ----------------------------------------------------------


@pytest.fixture
def lora_folders(home):
    """An A1111 install with models/Lora holding `ink`, and a valid LoRA outside every model
    folder, reachable by an absolute path, by `..` and by a link in models/Lora."""
    from tests.support.planted_sd import loaded

    pipeline = build_tiny_sd_pipeline()
    models = home / "stable-diffusion-webui" / "models"
    (models / "Stable-diffusion").mkdir(parents=True)
    (models / "Lora").mkdir()
    model = loaded(pipeline)
    model.source = str(models / "Stable-diffusion" / "model.safetensors")
    Path(model.source).write_bytes(b"")
    save_lora(kohya_lora(pipeline, seed=1), models / "Lora" / "ink.safetensors")
    outside = home / "Downloads"
    outside.mkdir()
    evil = save_lora(kohya_lora(pipeline, seed=2), outside / "evil.safetensors")
    os.symlink(evil, models / "Lora" / "linked.safetensors")
    return model, evil


def _outside_tags(evil: Path) -> list[str]:
    return [
        f"<lora:{evil.with_suffix('')}:1>",
        f"<lora:{evil}:1>",
        "<lora:../../../Downloads/evil:1>",
        "<lora:linked:1>",
    ]


def test_generate_uses_no_prompt_lora_outside_the_model_folders(tmp_path, lora_folders):
    model, evil = lora_folders
    tags = _outside_tags(evil)
    prompt = "a lighthouse " + " ".join(tags) + " <lora:ink:0.5>"
    applied = lora.load_requested(model, [], prompt=prompt)
    assert [(a.name, a.weight) for a in applied] == [("ink", 0.5)]
    assert len(model.lora_warnings) == len(tags)
    for tag, warning in zip(tags, model.lora_warnings, strict=True):
        name = tag.removeprefix("<lora:").removesuffix(":1>")
        assert warning == (
            f"The prompt's <lora:{name}> names a file outside your model folders: not used."
        )

    result = generate(
        model,
        GenerationRequest(prompt=prompt, steps=2, width=64, height=64, output_dir=str(tmp_path)),
        precision=PrecisionSettings(precision="fp32", nan_check=False),
        device="cpu",
    )
    assert all(warning in result.warnings for warning in model.lora_warnings)


def test_a_lora_typed_as_a_flag_may_still_be_anywhere(lora_folders):
    model, evil = lora_folders
    applied = lora.load_requested(model, [lora.LoraRequest(str(evil), 0.5)])
    assert [a.file.path for a in applied] == [evil] and model.lora_warnings == []


# explain: the image's LoRA tags and VAE ----------------------------------------------------


def test_explain_uses_no_image_lora_outside_the_model_folders(lora_folders):
    model, evil = lora_folders
    tags = _outside_tags(evil)
    record = explain.Record(made_by="a1111", prompt="a cat " + " ".join(tags) + " <lora:ink>")
    match = explain.ModelMatch(True, model.source, [], roots=library.library_roots())
    explanation = explain.Explanation("x.png", "a1111", "nan", record, PixelFigures(), match)
    _apply_image_loras(explanation, model)
    assert [a.name for a in model.loras] == ["ink"]
    refused = [n for n in explanation.notes if "outside your model folders" in n]
    assert len(refused) == len(tags), explanation.notes


def test_the_image_vae_is_not_looked_for_above_the_model_folders(home):
    """A damaged VAE in a folder above the library's folders is never the image's VAE; one in
    the install's VAE folder is."""
    comfy = home / "ComfyUI"
    checkpoints = comfy / "models" / "checkpoints" / "sd15"
    checkpoints.mkdir(parents=True)
    model = checkpoints / "plain.safetensors"
    model.write_bytes(b"")
    (comfy / "VAE").mkdir()
    (comfy / "VAE" / "kl-f8.safetensors").write_bytes(b"damaged")
    (home / "vae").mkdir()
    (home / "vae" / "kl-f8.safetensors").write_bytes(b"damaged")
    roots = library.library_roots()
    assert explain.find_vae("kl-f8.safetensors", str(model), [], roots) is None
    assert explain.find_vae("kl-f8.safetensors", str(model)) is None  # the library's, by default

    (comfy / "models" / "vae").mkdir()
    good = comfy / "models" / "vae" / "kl-f8.safetensors"
    good.write_bytes(b"x")
    roots = library.library_roots()
    assert explain.find_vae("kl-f8.safetensors", str(model), [str(good)], roots) == str(good)
    assert explain.find_vae("kl-f8.safetensors", str(model)) is None  # not beside the model


def test_an_image_vae_that_links_out_of_the_model_folders_is_passed_over(home):
    checkpoints = home / "ComfyUI" / "models" / "checkpoints"
    checkpoints.mkdir(parents=True)
    model = checkpoints / "plain.safetensors"
    model.write_bytes(b"")
    outside = home / "kl-f8.safetensors"
    outside.write_bytes(b"damaged")
    os.symlink(outside, checkpoints / "kl-f8.safetensors")
    link = str(checkpoints / "kl-f8.safetensors")
    assert explain.find_vae("kl-f8", str(model), [link]) is None
