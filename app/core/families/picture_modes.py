"""What a family does with the pictures a job starts from, by mode: whether a loaded model runs
the mode at all (`picture_problem`), whether its pipeline encodes the pictures itself
(`encodes_its_pictures`), and its pipeline for the mode on the same placed components
(`picture_pipeline`, `pipeline_sharing`).

These are `Family`'s defaults, the same for every family; a family whose models differ overrides
the method of that name on its class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.families.capabilities import Editing, controls, editing, references
from app.core.images.pictures import Mode

if TYPE_CHECKING:
    from app.core.families.base import Family


def picture_problem(family: Family, pipeline, mode: Mode) -> str | None:
    """Why `family`'s loaded `pipeline` cannot make pictures in `mode` (None: it can)."""
    if mode is Mode.TEXT:
        return family.text_to_image_problem(pipeline)
    if mode is Mode.CONTROL:
        return (
            None
            if controls(family, pipeline)
            else f"this {family.title} model follows no control picture."
        )
    if controls(family, pipeline):  # a picture alone is its control picture (`mode_of`)
        if mode is Mode.INPAINT:
            return (
                "this is a control model: it takes no mask; give only the control picture "
                "(a depth map or an edge picture)."
            )
        return None
    if mode is Mode.EDIT:
        return (
            None
            if references(family, pipeline)
            else (
                f"this {family.title} model does not edit pictures (an editing model such as "
                "Flux.1 Kontext, Qwen-Image-Edit or Flux.2 does)."
            )
        )
    if references(family, pipeline):
        return editing(family).editing_picture_problem(pipeline, mode)
    if mode not in family.picture_pipelines:
        return f"HalfSafe does not run {mode.words} for {family.title} models."
    if mode is Mode.IMAGE:  # an inpainting model's denoiser takes a mask beside the picture
        problem = family.text_to_image_problem(pipeline)
        return f"{problem[:-1]}; give it a mask to inpaint." if problem else None
    return None


def encodes_its_pictures(family: Family, pipeline, mode: Mode) -> bool:
    """Whether the pipeline of a job of `mode` runs the VAE's encoder on the pictures itself
    (the generation watches that encoder with hooks), rather than taking latents that
    HalfSafe's own encoder stage made: an edit whose pipeline takes no latents of its
    references (`Editing.edit_latents_given`)."""
    return (
        mode is Mode.EDIT
        and isinstance(family, Editing)
        and not family.edit_latents_given(pipeline)
    )


def picture_pipeline(family: Family, pipe, mode: Mode, latent_channels: int):
    """`family`'s pipeline for `mode`, on the same (placed) components as `pipe`, each left in
    its dtype (`pipeline_sharing`), taking the picture as latents of `latent_channels` channels.
    Some of diffusers' picture pipelines build their image processor for 4-channel latents
    whatever the VAE, and would resize 16-channel latents as if they were a picture: theirs is
    told the truth."""
    import diffusers

    if mode is Mode.EDIT:  # an editing model's own pipeline is the one that edits
        return pipe
    picture = pipeline_sharing(getattr(diffusers, family.picture_pipelines[mode]), pipe)
    processor = getattr(picture, "image_processor", None)
    config = getattr(processor, "config", None)
    if (
        processor is not None
        and config is not None
        and config.get("vae_latent_channels") != latent_channels
    ):
        picture.image_processor = type(processor).from_config(
            config, vae_latent_channels=latent_channels
        )
    return picture


def pipeline_sharing(pipeline_class, pipe):
    """A `pipeline_class` pipeline on `pipe`'s own component objects and options, each
    component left in the dtype and on the device it has.

    diffusers' `from_pipe` does the same and then casts every component to one dtype (fp32
    unless told another): on a placed pipeline that would turn its fp16 components into fp32
    in place, so the job would run in a precision its record does not name, and a module
    island's guards (which remember the dtype of the layer they guard) would feed fp16 into
    layers that had become fp32."""
    modules, options = pipeline_class._get_signature_keys(pipeline_class)
    components = pipe.components
    config = dict(pipe.config)
    arguments = {name: components[name] for name in modules if name in components}
    for name in options:
        # An option a pipeline made by `from_pipe` did not take is kept as "_<name>".
        for key in (name, "_" + name):
            if key in config:
                arguments[name] = config[key]
                break
    return pipeline_class(**arguments)
