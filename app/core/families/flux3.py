"""FLUX.3, base and the 16-step distilled Klein: a Qwen3-VL text encoder read at eight of its
layers, a `Flux3Transformer2DModel` (per-mode blocks for the text and the image, then joint single
blocks, every layer modulated per token) on 2x2 patches of Flux.2's 32-channel latent normalised
by its VAE's batch-norm statistics; flow matching with a constant shift of 6.93. The base model
samples with real CFG (50 steps, CFG 3.5 by default); the distilled one is a flow map, told at
each step the timestep it jumps to (16 steps, no CFG). diffusers runs both as modular pipelines
only: HalfSafe runs diffusers' blocks through a small adapter (`flux3_pipeline`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from app.core import limits
from app.core.detection import Detection, pipeline_part_class
from app.core.encoders.qwen3_vl import QWEN3_VL
from app.core.encoders.vaes import FLUX2_VAE
from app.core.families.base import (
    Family,
    FamilyId,
    FlowMatching,
    GenerationDefaults,
    input_channels_problem,
    patches_problem,
    prompt_tensors,
    transformer_width,
)
from app.core.families.capabilities import Editing
from app.core.families.flux2 import FLUX2_LATENT, _normalised
from app.core.families.flux3_recipe import (
    BASE_CFG,
    BASE_STEPS,
    DISTILLED_STEPS,
    FLUX3_SHIFT,
    TEXT_LAYERS,
)
from app.core.formats.layouts import (
    Layout,
    Need,
    Row,
    Shapes,
    SplitModel,
    bounded,
    count_indices,
    reader,
    within_limits,
)
from app.core.words import infotext

# The Qwen3-VL layers FLUX.3 reads (8 of the 4B's 36), each as wide as the encoder.
TEXT_LAYER_COUNT = len(TEXT_LAYERS)
# The reference pictures an edit reads at most (diffusers' FLUX.3 prompt upsampler's "at most
# 10"; its denoising blocks set no limit). Each lengthens the transformer's sequence by as many
# tokens as the picture has 16-px cells.
MAX_REFERENCES = 10


# Black Forest Labs' key layout, as diffusers' single-file converter reads it
# (`convert_flux3_transformer_checkpoint_to_diffusers`) ------------------------------------------

# The per-token modulation of the early streams marks FLUX.3 (diffusers' "flux3" key names);
# a second timestep embedder (ref_time_in) marks the distilled flow map.
_FLUX3_MARKERS = (
    "early_stream_modulations.image.lin.weight",
    "txt_mode_blocks.0.q_proj.weight",
    "emb_in.image.weight",
)
DISTILLED_MARKER = "ref_time_in.in_layer.weight"
# The token modes: the noisy image, the reference pictures, the text.
_IMAGE_MODES = ("image", "image_cond")
_MODES = (*_IMAGE_MODES, "txt")
# Inside each per-mode and joint block: BFL's name -> diffusers'.
_BLOCK_NAMES = (
    ("q_proj.weight", "attn.to_q.weight"),
    ("k_proj.weight", "attn.to_k.weight"),
    ("v_proj.weight", "attn.to_v.weight"),
    ("attn_out.weight", "attn.to_out.0.weight"),
    ("norm.query_norm.scale", "attn.norm_q.weight"),
    ("norm.key_norm.scale", "attn.norm_k.weight"),
    ("mlp_in.weight", "ff.linear_in.weight"),
    ("mlp_out.weight", "ff.linear_out.weight"),
)
# ComfyUI's name for the text encoder file (Krea 2 reads the same Qwen3-VL-4B) and the VAE's.
TEXT_ENCODER_FILE = "qwen3_vl_4b"
VAE_FILE = "flux2-vae"


def _read_flux3(shapes: Shapes, prefix: str) -> SplitModel:
    w = reader(shapes, prefix)
    inner, in_channels = w("emb_in.image.weight", 2)
    cond_channels = w("emb_in.image_cond.weight", 2)[1]
    head = w("txt_mode_blocks.0.norm.query_norm.scale", 1)[0]
    mlp = w("txt_mode_blocks.0.mlp_in.weight", 2)[0]
    if head < 8 or head % 4 or inner % head or mlp % 2 or in_channels % 4:
        raise ValueError(f"its blocks ({inner} wide, {head}-wide heads) are not FLUX.3's")
    layers = count_indices(shapes, prefix + "txt_mode_blocks.")
    single = count_indices(shapes, prefix + "single_blocks.")
    text = w("txt_in.weight", 2)[1]
    if text % TEXT_LAYER_COUNT:
        raise ValueError(
            f"it reads {text} values a token, not {TEXT_LAYER_COUNT} text-encoder layers' worth"
        )
    latent = in_channels // 4
    bounded(
        ("number of per-mode blocks", layers, limits.MAX_TRANSFORMER_DEPTH),
        ("number of single blocks", single, limits.MAX_TRANSFORMER_DEPTH),
        ("number of latent channels", latent, limits.MAX_IMAGE_CHANNELS),
    )
    distilled = prefix + DISTILLED_MARKER in shapes
    config = {
        "_class_name": "Flux3Transformer2DModel",
        "in_channels": in_channels,
        "cond_in_channels": cond_channels,
        "num_layers": layers,
        "num_single_layers": single,
        "attention_head_dim": head,
        "num_attention_heads": inner // head,
        "joint_attention_dim": text,
        "timestep_channels": w("time_in.in_layer.weight", 2)[1],
        "mlp_ratio": mlp // 2 / inner,  # SwiGLU: the gate and the value side by side
        # Rotary axes (time, height, width, text position): four equal quarters of a head.
        "axes_dims_rope": [head // 4] * 4,
        "flow_map": distilled,
    }
    within_limits(config)
    width = text // TEXT_LAYER_COUNT
    blocks = (
        f"a transformer in Black Forest Labs' layout ({prefix}txt_mode_blocks, "
        f"content_mode_blocks, single_blocks, per-token modulation) with {layers} per-mode and "
        f"{single} single blocks, {inner} wide, on {latent}-channel latents in 2x2 patches, "
        f"reading {TEXT_LAYER_COUNT} layers of {width}-wide Qwen3-VL hidden states"
    )
    sampling = (
        f"and a second timestep embedder ({prefix}ref_time_in), as the distilled flow map "
        f"has; {DISTILLED_STEPS} steps without CFG."
        if distilled
        else f"and no second timestep embedder; flow matching with CFG ({BASE_STEPS} steps)."
    )
    return SplitModel(
        table=_flux3_table,
        layout="flux3klein" if distilled else "flux3",
        title="FLUX.3 Klein" if distilled else "FLUX.3",
        prefix=prefix,
        config=config,
        architecture="flux3-klein" if distilled else "flux3-base",
        because=f"{'FLUX.3 Klein' if distilled else 'FLUX.3 base'}: {blocks}, {sampling}",
        needs=(
            Need(
                "text_encoder",
                QWEN3_VL,
                f"its Qwen3-VL text encoder ({TEXT_ENCODER_FILE})",
                lambda found: found == width,
                ("qwen3_vl", "qwen3-vl", "qwen_3_vl", "qwen3vl"),  # qwen3vl_4b_int8_convrot
                reads="4b-generation",
            ),
            Need(
                "vae",
                FLUX2_VAE,
                f"its {latent}-channel Flux.2 VAE ({VAE_FILE})",
                lambda c: c == latent,
                ("flux2", "flux-2"),
            ),
        ),
        pipeline_class=("Flux3DistilledModularPipeline" if distilled else "Flux3ModularPipeline"),
        # Flux.2's VAE config; FLUX.3's flow matching, shifted by a constant 6.93.
        configs="flux2",
        scheduler={"shift": FLUX3_SHIFT, "use_dynamic_shifting": False},
        latent_channels=latent,
    )


def _weight(original: str, diffusers: str) -> Iterator[Row]:
    yield original, (diffusers,), "same"


def _flux3_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Black Forest Labs' FLUX.3 names <-> diffusers' Flux3Transformer2DModel names, as
    diffusers' converter renames them: every layer bias-free; a modulation per token mode for
    the early and the joint blocks; the per-mode blocks of the image modes under
    content_mode_blocks, the text's under txt_mode_blocks; the final modulation's halves
    swapped (BFL's shift, scale; diffusers' scale, shift). A file's training-only REPA heads
    (repa_projectors.*) are not read."""
    for mode in _IMAGE_MODES:
        yield from _weight(f"emb_in.{mode}.weight", f"x_embedders.{mode}.weight")
    yield from _weight("txt_in.weight", "context_embedder.weight")
    embedders = [("time_in", "timestep_embedder")]
    if config.get("flow_map"):
        embedders.append(("ref_time_in", "target_timestep_embedder"))
    for original, diffusers in embedders:
        yield from _weight(f"{original}.in_layer.weight", f"{diffusers}.linear_1.weight")
        yield from _weight(f"{original}.out_layer.weight", f"{diffusers}.linear_2.weight")
    for stream in ("early_stream_modulations", "single_stream_modulations"):
        for mode in _MODES:
            yield from _weight(f"{stream}.{mode}.lin.weight", f"{stream}.{mode}.linear.weight")
    blocks = [
        (f"content_mode_blocks.{mode}.", f"mode_blocks.{mode}.", config["num_layers"])
        for mode in _IMAGE_MODES
    ]
    blocks.append(("txt_mode_blocks.", "txt_mode_blocks.", config["num_layers"]))
    blocks.append(("single_blocks.", "single_transformer_blocks.", config["num_single_layers"]))
    for original, diffusers, count in blocks:
        for i in range(count):
            for mine, theirs in _BLOCK_NAMES:
                yield from _weight(f"{original}{i}.{mine}", f"{diffusers}{i}.{theirs}")
    yield from _weight("final_layer.image.linear.weight", "proj_out.weight")
    yield "final_layer.image.adaLN_modulation.1.weight", ("norm_out.linear.weight",), "swap"


LAYOUT = Layout("FLUX.3-style transformer", _FLUX3_MARKERS, (), _read_flux3, _flux3_table)


def _blocks_words(transformer: Mapping[str, Any]) -> str:
    latent = int(transformer.get("in_channels", 128)) // 4
    return (
        f"a Flux3Transformer2DModel with {transformer.get('num_layers')} per-mode and "
        f"{transformer.get('num_single_layers')} single blocks, {transformer_width(transformer)} "
        f"wide, on {latent}-channel latents in 2x2 patches"
    )


@dataclass(frozen=True)
class _Flux3(Editing, FlowMatching, Family):
    """What FLUX.3 base and the distilled Klein share: the transformer class, the text encoder
    and how a prompt is read, the latent, the schedule's constant shift. A variant is told by its
    pipeline (`Flux3Pipeline` or `Flux3DistilledPipeline`) and, in a file or folder, by the
    transformer's flow map (the second timestep embedder)."""

    latent = FLUX2_LATENT
    transformer_class = "Flux3Transformer2DModel"
    packed_channels = 4
    layout = LAYOUT  # the one layout both variants are kept in, told apart as it is read
    companion_names = {"text_encoder": TEXT_ENCODER_FILE, "vae": VAE_FILE}
    # HalfSafe's pipeline class of the variant (its adapter over diffusers' blocks).
    adapter: ClassVar[str] = ""
    distilled: ClassVar[bool] = False

    denoiser: str = "transformer"
    sample_argument: str = "hidden_states"

    def owns(self, pipeline) -> bool:
        return super().owns(pipeline) and type(pipeline).__name__ == self.adapter

    def generation_defaults(self, architecture: str) -> GenerationDefaults | None:
        # The steps and CFG diffusers' blocks run each variant at by default.
        if self.distilled:
            return GenerationDefaults(DISTILLED_STEPS, 1.0, f"{self.title}'s")
        return GenerationDefaults(BASE_STEPS, BASE_CFG, f"{self.title}'s")

    def detect_folder(
        self,
        model_index: Mapping[str, Any],
        transformer: Mapping[str, Any],
        scheduler: Mapping[str, Any],
    ) -> Detection:
        architecture = next(iter(self.architectures))
        flow_map = bool(transformer.get("flow_map", False))
        if flow_map != self.distilled:
            has = "is" if flow_map else "is not"
            return Detection(
                architecture,
                False,
                f"a {self.pipeline_class} folder",
                f"its {self.pipeline_class} runs the "
                f"{'distilled' if self.distilled else 'base'} FLUX.3, but its transformer {has} "
                "a flow map (flow_map in its config: the distilled model's second timestep "
                "embedder), so diffusers' blocks cannot run it.",
            )
        sampling = (
            f"a flow map, told the timestep each step jumps to; {DISTILLED_STEPS} steps without CFG"
            if self.distilled
            else f"flow matching with real CFG ({BASE_STEPS} steps, CFG {BASE_CFG:g})"
        )
        because = (
            f"{self.architectures[architecture]}: its {self.pipeline_class} has "
            f"{_blocks_words(transformer)}, reading {TEXT_LAYER_COUNT} layers of a Qwen3-VL "
            f"text encoder ({pipeline_part_class(model_index, 'text_encoder')}), "
            f"{transformer.get('joint_attention_dim')} values a token; {sampling}."
        )
        return Detection(
            architecture,
            True,
            f"a {self.title} pipeline",
            because,
            "flow",
            1024,
            None,
            self.pipeline_class,
        )

    def load_folder(
        self, folder: Path, components: Mapping[str, Any], dtypes: Mapping[str, Any]
    ) -> Any:
        """diffusers loads FLUX.3 only as a modular pipeline: its parts are built one by one
        and put in HalfSafe's adapter (`flux3_folder.load`)."""
        from app.core.families.flux3_folder import load

        return load(folder, components, dtypes, self.distilled)

    def pipeline_from_parts(self, components: dict[str, Any]) -> Any:
        """FLUX.3's parts from its transformer file and companions (Qwen3-VL's processor as
        the tokenizer) in HalfSafe's adapter of the variant."""
        from app.core.families.flux3_pipeline import Flux3DistilledPipeline, Flux3Pipeline

        parts = dict(components)
        parts["tokenizer"] = parts.pop("processor")
        pipeline = Flux3DistilledPipeline if self.distilled else Flux3Pipeline
        return pipeline(**parts)

    # -- the steps ---------------------------------------------------------------------------

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        """The prompt as diffusers' text encoder step reads it (`Flux3Pipeline.encode_prompt`),
        and with `guidance` the negative prompt for the base model (the distilled one reads
        none)."""
        tensors = {"prompt_embeds": pipe.encode_prompt(prompt, device)}
        if guidance and not self.distilled:
            tensors["negative_prompt_embeds"] = pipe.encode_prompt(negative, device)
        return tensors

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        return {"text_encoder": prompt_tensors(tensors)}

    def upsample(
        self, pipe, prompt: str, device, max_new_tokens: int | None, forced=None, references=()
    ) -> Any:
        """diffusers' prompt upsampling (`Flux3Pipeline.upsample_prompt`: text-to-image, or
        image-conditioned with `references`; by default at most the pipeline's
        `upsampler_new_tokens`, diffusers' 3,584)."""
        bound = max_new_tokens or pipe.upsampler_new_tokens
        kept = bool(max_new_tokens)  # the check's logits; a job's would be gigabytes
        return pipe.upsample_prompt(prompt, device, bound, forced, kept, references)

    def _sigmas(self, pipeline, steps: int) -> list[float]:
        """The sigmas FLUX.3's blocks run: linear from 1 to 1/steps, shifted by the
        scheduler's constant shift."""
        import numpy as np

        scheduler = self.make_scheduler("euler", pipeline, None)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps).tolist())
        return [float(s) for s in scheduler.sigmas[:-1]]

    def probe_timesteps(self, model, steps: int, scheduler: str, size: int) -> list[float]:
        """The first, middle and last timestep (sigma x 1000) of the schedule the blocks run
        at the user's step count (its shift is constant: the same at every size)."""
        sigmas = self._sigmas(model.pipeline, max(2, steps))
        picked = {sigmas[0], sigmas[len(sigmas) // 2], sigmas[-1]}
        return sorted((round(s * 1000.0, 2) for s in picked), reverse=True)

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """diffusers' FLUX.3 denoising blocks through `timesteps`, from seeded noise: the base
        model with CFG on the prompt and the empty negative prompt (both conditionings are
        checked), the distilled one on the prompt, told each step's next timestep (0 after the
        last); the sigmas are given as they are (a copy of the scheduler without its shift), so
        the blocks step exactly through them. Returns the VAE's latents (1, 32, h, w)."""
        return self._probe(pipe, conditioning, size, device, timesteps, [])

    def _probe(self, pipe, conditioning, size: int, device, timesteps, references) -> Any:
        import torch

        side = size // self.latent_factor(pipe) // 2
        channels = pipe.transformer.config.in_channels
        generator = torch.Generator().manual_seed(0)
        noise = torch.randn((1, channels, side, side), generator=generator)
        scheduler = type(pipe.scheduler).from_config(
            pipe.scheduler.config, shift=1.0, use_dynamic_shifting=False
        )
        tokens = pipe(
            conditioning["prompt_embeds"],
            conditioning.get("negative_prompt_embeds"),
            height=size,
            width=size,
            latents=noise.to(device),
            guidance_scale=BASE_CFG,
            sigmas=[float(t) / 1000.0 for t in timesteps],
            scheduler=scheduler,
            image_cond_latents=references,
        ).images
        return self.image_latents(pipe, tokens, size, size)

    def probe_edit(self, pipe, conditioning, size: int, device, timesteps, references) -> Any:
        """As `probe_denoise`, with the references (the VAE's latents in 2x2 patches, as
        `encode_pixels` makes them) normalised by the VAE's batch-norm statistics as diffusers'
        encoder step does, and read in the transformer's sequence beside the noise by diffusers'
        image-conditioned blocks."""
        normalised = [_normalised(r.to(device), pipe.vae) for r in references]
        return self._probe(pipe, conditioning, size, device, timesteps, normalised)

    # -- editing: reference pictures in the transformer's sequence ---------------------------

    def encode_pixels(self, vae, pixels):
        """Pixels (B, 3, H, W) in [-1, 1] -> the mode of the VAE encoder's distribution in 2x2
        patches (B, 4C, H/16, W/16), before the batch-norm normalisation (done where they are
        read: `edit_call`, `probe_edit`)."""
        from diffusers import Flux2Pipeline

        z = vae.encode(pixels.to(vae.dtype)).latent_dist.mode()
        return Flux2Pipeline._patchify_latents(z)

    def edit_call(
        self, pipeline, embeds: dict[str, Any], batch: int, latents, pictures, size
    ) -> dict[str, Any]:
        """The prompt for `batch` images and the references' latents (HalfSafe's watched
        encoder made them, at the job's size), normalised as diffusers' encoder step leaves
        them."""
        normalised = [_normalised(r, pipeline.vae) for r in latents]
        return {**self.pipeline_embeds(embeds, batch), "image_cond_latents": normalised}

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        return patches_problem(self, pipeline, width, height)

    def text_to_image_problem(self, pipeline) -> str | None:
        return input_channels_problem(pipeline, "latent_channels", 4)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        """Seeded noise per image in normalised 2x2 patches (B, 4C, h/2, w/2), drawn in fp32 as
        diffusers' latent step draws it (it packs them into tokens)."""
        import torch

        factor = self.latent_factor(pipeline) * 2
        channels = pipeline.transformer.config.in_channels
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        latents = [
            torch.randn((1, channels, height // factor, width // factor), generator=g)
            for g in generators
        ]
        return torch.cat(latents), generators

    def image_latents(self, pipeline, latents, height: int, width: int):
        """The blocks' latent tokens (B, cells, 4C) -> the VAE's latents (B, C, h, w): back on
        their grid, the batch-norm normalisation undone, the 2x2 patches unpacked (as diffusers'
        unpack and decode steps do)."""
        from app.core.families.flux2 import _unpatchified

        factor = self.latent_factor(pipeline) * 2
        if latents.dim() == 4:
            return latents
        return _unpatchified(latents, pipeline.vae, (height // factor, width // factor))

    def decode(self, vae, latents):
        """The VAE's own latents (the batch-norm statistics already undone) -> pixels."""
        return vae.decode(latents.to(vae.dtype)).sample


@dataclass(frozen=True)
class Flux3Family(_Flux3):
    """FLUX.3 base: flow matching with real CFG (a second call on the negative prompt), 50
    steps and CFG 3.5 by diffusers' blocks' default."""

    id = FamilyId("flux3")
    title = "FLUX.3"
    architectures = {"flux3-base": "FLUX.3 base"}
    # Not the distilled Klein's words ("flux-3-image-klein"; its base is "...-klein-base").
    trainer_words = ((r"flux-?3(?!.*(klein(?!-base)|distill))", "flux3-base"),)
    pipeline_class = "Flux3ModularPipeline"
    adapter = "Flux3Pipeline"
    edit_pipelines = {"Flux3Pipeline": MAX_REFERENCES}

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        return {"guidance_scale": cfg}  # real CFG above 1


@dataclass(frozen=True)
class Flux3KleinFamily(_Flux3):
    """FLUX.3 Klein, step-distilled: a flow map (its transformer takes the timestep each step
    jumps to as well), 16 steps by default and no CFG: one call a step, on the prompt alone."""

    id = FamilyId("flux3klein")
    title = "FLUX.3 Klein"
    architectures = {"flux3-klein": "FLUX.3 Klein"}
    trainer_words = ((r"flux-?3.*(klein|distill)", "flux3-klein"),)
    pipeline_class = "Flux3DistilledModularPipeline"
    adapter = "Flux3DistilledPipeline"
    edit_pipelines = {"Flux3DistilledPipeline": MAX_REFERENCES}
    distilled = True

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        return {}  # no CFG: the adapter makes one call a step whatever the scale

    def guidance_parameters(self, cfg: float) -> list[tuple[str, Any]]:
        return [(infotext.CFG_SCALE.name, "1")]  # what it ran with: no CFG
