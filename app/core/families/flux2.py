"""Flux.2 dev and Flux.2 Klein: a `transformer` (double and single blocks with shared
modulation) on 2x2 patches of a 32-channel latent normalised by the VAE's batch-norm statistics,
reading hidden states stacked from three layers of a Mistral 3 (dev) or Qwen3 (Klein) text
encoder; flow matching with Flux.2's empirical shift. Dev takes the guidance scale as an
embedding; Klein samples with real CFG, or without any when step-distilled.

Both edit with their own pipelines: the reference pictures, encoded by the VAE and normalised
by its batch-norm statistics, join the transformer's sequence after the noise, each at its own
time position. Klein also inpaints (a picture and a mask) with Flux2KleinInpaintPipeline."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from app.core import limits
from app.core.detection import Detection, pipeline_part_class
from app.core.encoders.mistral3 import MISTRAL3
from app.core.encoders.qwen3 import QWEN3
from app.core.encoders.vaes import FLUX2_VAE
from app.core.errors import HalfSafeError
from app.core.families.base import (
    Family,
    FamilyId,
    LatentFormat,
    ShiftedSigmas,
    input_channels_problem,
    patches_problem,
    prompt_tensors,
    transformer_width,
)
from app.core.families.capabilities import Editing
from app.core.formats.layouts import (
    Layout,
    Need,
    Row,
    Shapes,
    SplitModel,
    bounded,
    count_indices,
    reader,
    swapped,
    within_limits,
)
from app.core.images.pictures import Mode
from app.core.words import infotext

# The hidden states the reference pipelines stack (their `text_encoder_out_layers`): Mistral
# Small 3.1's layers 10, 20 and 30 of 40 for dev, Qwen3's 9, 18 and 27 of 36 for Klein.
DEV_LAYERS = (10, 20, 30)
KLEIN_LAYERS = (9, 18, 27)
MAX_SEQUENCE_LENGTH = 512  # tokens every prompt is padded to, as both pipelines do
PROBE_DEV_GUIDANCE = 4.0  # Flux2Pipeline's default guidance embedding
PROBE_KLEIN_CFG = 4.0  # Flux2KleinPipeline's default CFG scale (base models)

# AutoencoderKLFlux2: 32 channels; the preview fits its colours.
FLUX2_LATENT = LatentFormat(channels=32)

# How many reference pictures each pipeline edits. diffusers' Flux2Pipeline and
# Flux2KleinPipeline set no limit (they encode every picture given, a megapixel each at most);
# Black Forest Labs' documentation ("Reference Images per Model", docs.bfl.ai) names up to 4
# for Klein 4B and 9B and a recommended 6 at most for dev. Each one lengthens the transformer's
# sequence by up to 4,096 tokens.
DEV_REFERENCES = 6
KLEIN_REFERENCES = 4
# Flux2ImageProcessor.check_image_input, which Flux.2's pipelines call on every reference,
# refuses one whose long side is more than 8 times its short one (and a side under 64 px, which
# no job's size has).
REFERENCE_MAX_ASPECT = 8
REFERENCE_MAX_AREA = 1024 * 1024  # a larger reference is scaled down to this many pixels


def _stacked_hidden_states(encoder, input_ids, mask, layers: tuple[int, ...], device):
    """The encoder's hidden states after `layers`, side by side per token: (1, tokens,
    3 x width), as the reference pipelines build them. Only the last token's logits are
    asked of a causal LM (the pipelines discard them all; a 131k- or 151k-word head over
    512 tokens is most of the encoder's work otherwise)."""
    import torch

    extra = {"logits_to_keep": 1} if hasattr(encoder, "lm_head") else {}
    output = encoder(
        input_ids=input_ids.to(device),
        attention_mask=mask.to(device),
        output_hidden_states=True,
        use_cache=False,
        **extra,
    )
    states = output.hidden_states
    if len(states) <= max(layers):
        raise ValueError(
            f"its text encoder has {len(states) - 1} layers where Flux.2 reads the hidden "
            f"states after layers {', '.join(map(str, layers))}"
        )
    stacked = torch.stack([states[k] for k in layers], dim=1)  # (B, 3, tokens, width)
    batch, parts, tokens, width = stacked.shape
    return stacked.permute(0, 2, 1, 3).reshape(batch, tokens, parts * width)


def _normalised(latents, vae):
    """The VAE's latents in 2x2 patches (B, 4C, h, w) normalised by its batch-norm statistics
    in their own dtype, exactly as Flux.2's pipelines normalise a reference picture's
    (`_encode_vae_image`)."""
    import torch

    bn = vae.bn
    mean = bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
    std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    return (latents - mean) / std.to(latents.device, latents.dtype)


def _unpatchified(latents, vae, side: tuple[int, int] | None):
    import torch
    from diffusers import Flux2Pipeline

    batch, cells, channels = latents.shape
    if side is None:
        h = w = int(round(cells**0.5))
    else:
        h, w = side
    patches = latents.permute(0, 2, 1).reshape(batch, channels, h, w)
    bn = vae.bn
    mean = bn.running_mean.view(1, -1, 1, 1).to(patches.device, patches.dtype)
    std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    patches = patches * std.to(patches.device, patches.dtype) + mean
    return Flux2Pipeline._unpatchify_latents(patches)


# Black Forest Labs' key layout (ComfyUI: diffusion_models/flux2-dev.safetensors,
# flux-2-klein-4b.safetensors) --------------------------------------------------------------

# Flux.1's markers (double_blocks, img_in) are there too: the shared modulation marks Flux.2.
_FLUX2_MARKERS = (
    "double_blocks.0.img_attn.qkv.weight",
    "single_stream_modulation.lin.weight",
    "img_in.weight",
)
# Qwen3 widths of the released Klein models -> the text encoder file ComfyUI names.
_KLEIN_ENCODERS = {2560: "qwen_3_4b", 4096: "qwen_3_8b"}
DEV_TOKENIZER_MISSING = (
    "Flux.2 dev reads its prompt with Mistral's Tekken tokenizer, which HalfSafe does not ship "
    "and a split text encoder file does not carry, so this file cannot be run on its own; load "
    "Flux.2 dev from its diffusers folder (FLUX.2-dev, which holds its tokenizer) instead"
)


def _read_flux2(shapes: Shapes, prefix: str) -> SplitModel:
    w = reader(shapes, prefix)
    inner, in_channels = w("img_in.weight", 2)
    head = w("double_blocks.0.img_attn.norm.query_norm.scale", 1)[0]
    mlp = w("double_blocks.0.img_mlp.0.weight", 2)[0]
    if head < 8 or head % 4 or inner % head or mlp % 2 or in_channels % 4:
        raise ValueError(f"its blocks ({inner} wide, {head}-wide heads) are not Flux.2's")
    layers = count_indices(shapes, prefix + "double_blocks.")
    single = count_indices(shapes, prefix + "single_blocks.")
    latent = in_channels // 4
    bounded(
        ("number of double blocks", layers, limits.MAX_TRANSFORMER_DEPTH),
        ("number of single blocks", single, limits.MAX_TRANSFORMER_DEPTH),
        ("number of latent channels", latent, limits.MAX_IMAGE_CHANNELS),
    )
    config = {
        "_class_name": "Flux2Transformer2DModel",
        "patch_size": 1,
        "in_channels": in_channels,
        "out_channels": w("final_layer.linear.weight", 2)[0],
        "num_layers": layers,
        "num_single_layers": single,
        "attention_head_dim": head,
        "num_attention_heads": inner // head,
        "joint_attention_dim": w("txt_in.weight", 2)[1],
        "timestep_guidance_channels": w("time_in.in_layer.weight", 2)[1],
        "mlp_ratio": mlp // 2 / inner,  # SwiGLU: the gate and the value side by side
        # Rotary axes (time, height, width, text position): four equal quarters of a head.
        "axes_dims_rope": [head // 4] * 4,
        "guidance_embeds": prefix + "guidance_in.in_layer.weight" in shapes,
    }
    within_limits(config)
    text = config["joint_attention_dim"]
    dev = bool(config["guidance_embeds"])
    blocks = (
        f"a transformer in Black Forest Labs' layout ({prefix}double_blocks, single_blocks, "
        f"shared modulation) with {layers} double and {single} single blocks, {inner} wide, on "
        f"{latent}-channel latents in 2x2 patches, reading {text} values a token"
    )
    vae = Need(
        "vae",
        FLUX2_VAE,
        f"its {latent}-channel Flux.2 VAE (flux2-vae)",
        lambda c: c == latent,
        ("flux2", "flux-2"),
    )
    if dev:
        return SplitModel(
            table=_flux2_table,
            layout="flux2",
            title="Flux.2 dev",
            prefix=prefix,
            config=config,
            architecture="flux2-dev",
            because=(
                f"Flux.2 dev: {blocks} (three Mistral 3 hidden states) and a guidance embedding "
                "(guidance_in), as the guidance-distilled Flux.2 dev has; flow matching."
            ),
            needs=(
                Need(
                    "text_encoder",
                    MISTRAL3,
                    "its Mistral 3 Small text encoder (mistral_3_small_flux2)",
                    lambda width: 3 * width == text,
                    ("mistral",),
                ),
                vae,
            ),
            pipeline_class="Flux2Pipeline",
            configs="flux2",
            scheduler={},
            latent_channels=latent,
            unsupported=DEV_TOKENIZER_MISSING,
        )
    encoder = _KLEIN_ENCODERS.get(text // 3, "qwen_3")
    return SplitModel(
        table=_flux2_table,
        layout="flux2klein",
        title="Flux.2 Klein",
        prefix=prefix,
        config=config,
        architecture="flux2-klein",
        because=(
            f"Flux.2 Klein: {blocks} (three Qwen3 hidden states) and no guidance embedding; "
            "flow matching, with real CFG when the CFG scale is above 1 (whether it is "
            "step-distilled is not in the file)."
        ),
        needs=(
            Need(
                "text_encoder",
                QWEN3,
                f"its Qwen3 text encoder ({encoder})",
                lambda width: 3 * width == text,
                ("qwen_3", "qwen3"),
            ),
            vae,
        ),
        pipeline_class="Flux2KleinPipeline",
        configs="flux2",
        scheduler={},
        latent_channels=latent,
    )


def _weight(original: str, diffusers: str) -> Iterator[Row]:
    yield f"{original}.weight", (f"{diffusers}.weight",), "same"


def _flux2_table(config: Mapping[str, Any]) -> Iterator[Row]:
    """Black Forest Labs' Flux.2 names <-> diffusers' Flux2Transformer2DModel names. Every
    layer is bias-free; the modulation is shared by all double blocks (image and text) and all
    single blocks; a double block's attention keeps q, k, v fused, a single block its
    attention and MLP input fused as diffusers does too."""
    embed = "time_guidance_embed."
    yield from _weight("img_in", "x_embedder")
    yield from _weight("txt_in", "context_embedder")
    yield from _weight("time_in.in_layer", embed + "timestep_embedder.linear_1")
    yield from _weight("time_in.out_layer", embed + "timestep_embedder.linear_2")
    if config["guidance_embeds"]:
        yield from _weight("guidance_in.in_layer", embed + "guidance_embedder.linear_1")
        yield from _weight("guidance_in.out_layer", embed + "guidance_embedder.linear_2")
    for name in ("double_stream_modulation_img", "double_stream_modulation_txt"):
        yield from _weight(f"{name}.lin", f"{name}.linear")
    yield from _weight("single_stream_modulation.lin", "single_stream_modulation.linear")
    for i in range(config["num_layers"]):
        b, d = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        for side, parts, norms, out, ff in (
            ("img", ("to_q", "to_k", "to_v"), ("norm_q", "norm_k"), "to_out.0", "ff"),
            (
                "txt",
                ("add_q_proj", "add_k_proj", "add_v_proj"),
                ("norm_added_q", "norm_added_k"),
                "to_add_out",
                "ff_context",
            ),
        ):
            fused = tuple(f"{d}attn.{p}.weight" for p in parts)
            yield f"{b}{side}_attn.qkv.weight", fused, "cat"
            for bfl, ours in zip(("query_norm", "key_norm"), norms, strict=True):
                yield f"{b}{side}_attn.norm.{bfl}.scale", (f"{d}attn.{ours}.weight",), "same"
            yield from _weight(f"{b}{side}_attn.proj", f"{d}attn.{out}")
            yield from _weight(f"{b}{side}_mlp.0", f"{d}{ff}.linear_in")
            yield from _weight(f"{b}{side}_mlp.2", f"{d}{ff}.linear_out")
    for i in range(config["num_single_layers"]):
        b, d = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        yield from _weight(b + "linear1", d + "attn.to_qkv_mlp_proj")
        yield from _weight(b + "linear2", d + "attn.to_out")
        yield b + "norm.query_norm.scale", (d + "attn.norm_q.weight",), "same"
        yield b + "norm.key_norm.scale", (d + "attn.norm_k.weight",), "same"
    yield from _weight("final_layer.linear", "proj_out")
    # BFL's final modulation is (shift, scale), diffusers' (scale, shift); no bias.
    for original, names, _ in swapped("final_layer.adaLN_modulation.1", "norm_out.linear"):
        if original.endswith(".weight"):
            yield original, names, "swap"


LAYOUT = Layout("Flux.2-style transformer", _FLUX2_MARKERS, (), _read_flux2, _flux2_table)


@dataclass(frozen=True)
class _Flux2(Editing, ShiftedSigmas, Family):
    """What Flux.2 dev and Klein share: the transformer, the latent, the schedule."""

    latent = FLUX2_LATENT
    transformer_class = "Flux2Transformer2DModel"
    packed_channels = 4
    # The pipeline classes of this variant (text-to-image, and editing with references).
    pipelines: ClassVar[tuple[str, ...]] = ()
    layers: ClassVar[tuple[int, ...]] = ()

    denoiser: str = "transformer"
    sample_argument: str = "hidden_states"

    def owns(self, pipeline) -> bool:
        return super().owns(pipeline) and type(pipeline).__name__ in self.pipelines

    # -- the schedule: Flux.2's empirical shift, by image tokens and step count -------------

    def _sigmas(self, pipeline, steps: int, size: int) -> list[float]:
        import numpy as np
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        scheduler = self.make_scheduler("euler", pipeline, None)
        side = size // self.latent_factor(pipeline) // 2
        mu = compute_empirical_mu(side * side, steps)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps).tolist(), mu=mu)
        return [float(s) for s in scheduler.sigmas[:-1]]

    # -- the steps ---------------------------------------------------------------------------

    def _tokens(self, pipe, prompt: str):
        """(input_ids, attention_mask) of one prompt, padded to 512 as the pipeline pads."""
        raise NotImplementedError

    def _encode_one(self, pipe, prompt: str, device):
        encoder = pipe.text_encoder
        input_ids, mask = self._tokens(pipe, prompt)
        return _stacked_hidden_states(encoder, input_ids, mask, self.layers, device)

    def encoder_outputs(self, pipe, tensors: dict[str, Any]) -> dict[str, list[Any]]:
        return {"text_encoder": prompt_tensors(tensors)}

    def pipeline_embeds(self, embeds: dict[str, Any], batch: int) -> dict[str, Any]:
        # Flux.2's pipelines keep their latents in the embeddings' dtype: fp32 keeps the
        # sampler's latents in fp32 whatever the text encoder ran in (the transformer casts).
        import torch

        repeated = super().pipeline_embeds(embeds, batch)
        return {k: v.to(torch.float32) for k, v in repeated.items()}

    def denoiser_inputs(self, conditioning: dict[str, Any], size: int, device) -> dict[str, Any]:
        import torch
        from diffusers import Flux2Pipeline

        embeds = conditioning["prompt_embeds"]
        side = size // 16
        return {
            "encoder_hidden_states": embeds,
            "txt_ids": Flux2Pipeline._prepare_text_ids(embeds).to(device),
            "img_ids": Flux2Pipeline._prepare_latent_ids(torch.zeros(1, 1, side, side)).to(device),
        }

    def _velocity(self, call, conditioning, device):
        """The step's velocity from `call(embeds, guidance)` (one transformer call)."""
        raise NotImplementedError

    def probe_denoise(self, pipe, conditioning, size: int, device, timesteps) -> Any:
        """Flow-matching Euler steps through `timesteps` from seeded noise in the pipeline's
        normalised 2x2 patches, each step as the variant's pipeline runs it; returns the VAE's
        latents (1, 32, h, w)."""
        return self._probe(pipe, conditioning, size, device, timesteps, [])

    def probe_edit(self, pipe, conditioning, size: int, device, timesteps, references) -> Any:
        """As `probe_denoise`, with the references (the VAE's latents in 2x2 patches, as
        `encode_pixels` makes them) normalised and packed as the pipeline's
        `prepare_image_latents` does, after the noise in the transformer's sequence with the
        position ids it gives them (time 10, 20, ... one per reference, then row and column;
        the noise's time is 0); only the noise's part of the output steps."""
        return self._probe(pipe, conditioning, size, device, timesteps, references)

    def _probe(self, pipe, conditioning, size: int, device, timesteps, references) -> Any:
        import torch
        from diffusers import Flux2Pipeline

        transformer = pipe.transformer
        side = size // self.latent_factor(pipe) // 2
        generator = torch.Generator().manual_seed(0)
        noise = torch.randn((1, transformer.config.in_channels, side, side), generator=generator)
        latents = Flux2Pipeline._pack_latents(noise).to(device)
        tokens = latents.shape[1]
        normalised = [_normalised(r.to(device), pipe.vae).float() for r in references]
        sequence_tail = [Flux2Pipeline._pack_latents(r) for r in normalised]
        reference_ids = (
            [Flux2Pipeline._prepare_image_ids(normalised).to(device)] if normalised else []
        )
        sigmas = [float(t) / 1000.0 for t in timesteps] + [0.0]
        for sigma, following in zip(sigmas[:-1], sigmas[1:], strict=True):

            def call(embeds, guidance=None, sigma=sigma, latents=latents):
                inputs = self.denoiser_inputs({"prompt_embeds": embeds}, size, device)
                inputs["img_ids"] = torch.cat([inputs["img_ids"], *reference_ids], dim=1)
                return transformer(
                    hidden_states=torch.cat([latents, *sequence_tail], dim=1),
                    timestep=torch.full([1], sigma, device=device),
                    guidance=guidance,
                    **inputs,
                    return_dict=False,
                )[0].float()[:, :tokens]

            latents = latents + (following - sigma) * self._velocity(call, conditioning, device)
        return _unpatchified(latents, pipe.vae, (side, side))

    # -- pictures: the references an edit reads, Klein's inpainting picture ------------------

    def encode_pixels(self, vae, pixels):
        """Pixels (B, 3, H, W) in [-1, 1] -> the mode of the VAE encoder's distribution in 2x2
        patches (B, 4C, H/16, W/16), as Flux.2's pipelines make them before normalising:
        Klein's inpainting pipeline takes them so (it normalises them itself), an edit's probe
        normalises them as the editing pipeline does (`_normalised`)."""
        from diffusers import Flux2Pipeline

        z = vae.encode(pixels.to(vae.dtype)).latent_dist.mode()
        return Flux2Pipeline._patchify_latents(z)

    def edit_latents_given(self, pipeline) -> bool:
        # Flux2Pipeline and Flux2KleinPipeline take references as PIL pictures only (their
        # `check_image_input` refuses anything else) and encode them themselves: HalfSafe
        # watches that encoding with a hook on the VAE's encoder.
        return False

    def edit_pixels(self, pipeline, pictures) -> list[Any]:
        """Each reference as the editing pipeline hands it to the VAE's encoder: scaled down
        to a megapixel where it is larger, cropped to whole 16-px cells, in [-1, 1]."""
        processor = pipeline.image_processor
        cell = 2 * self.latent_factor(pipeline)
        pixels = []
        for picture in pictures.references:
            picture = _within_area(processor, picture)
            width, height = (side // cell * cell for side in picture.size)
            pixels.append(processor.preprocess(picture, height, width, resize_mode="crop"))
        return pixels

    def edit_call(
        self, pipeline, embeds: dict[str, Any], batch: int, latents, pictures, size
    ) -> dict[str, Any]:
        problem = reference_shape_problem(*size)
        if problem is not None:
            raise HalfSafeError(problem)
        return {**self.pipeline_embeds(embeds, batch), "image": list(pictures.references)}

    def size_problem(self, pipeline, width: int, height: int) -> str | None:
        return patches_problem(self, pipeline, width, height)

    def text_to_image_problem(self, pipeline) -> str | None:
        return input_channels_problem(pipeline, "latent_channels", 4)

    def noise(self, pipeline, seeds: list[int], height: int, width: int):
        """Seeded noise per image in the pipeline's 2x2 patches (B, 4C, h/2, w/2), drawn as
        Flux.2's pipelines draw theirs."""
        import torch

        factor = self.latent_factor(pipeline)
        channels = pipeline.transformer.config.in_channels
        h, w = height // (factor * 2), width // (factor * 2)
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        latents = [torch.randn((1, channels, h, w), generator=g) for g in generators]
        return torch.cat(latents), generators

    def image_latents(self, pipeline, latents, height: int, width: int):
        factor = self.latent_factor(pipeline) * 2
        if latents.dim() == 4:  # Klein hands back the VAE's latents already
            return latents
        return _unpatchified(latents, pipeline.vae, (height // factor, width // factor))

    def decode(self, vae, latents):
        """The VAE's own latents (the batch-norm statistics already undone) -> pixels."""
        return vae.decode(latents.to(vae.dtype)).sample

    def clamped_blocks(self, denoiser) -> list[Any]:
        # diffusers clips the fp16 text stream of each double block and the joint stream of
        # each single block to +-65504: an overflow there comes out saturated, not inf.
        return [*denoiser.transformer_blocks, *denoiser.single_transformer_blocks]


def _within_area(processor, picture):
    """A reference scaled down to a megapixel where it is larger, by the editing pipelines'
    own rule (their image processor's)."""
    width, height = picture.size
    if width * height > REFERENCE_MAX_AREA:
        return processor._resize_to_target_area(picture, REFERENCE_MAX_AREA)
    return picture


def reference_shape_problem(width: int, height: int) -> str | None:
    """Why Flux.2's editing pipelines would refuse references of width x height (each
    reference is read at the job's size), or None."""
    if max(width, height) > REFERENCE_MAX_ASPECT * min(width, height):
        return (
            f"Flux.2 edits reference pictures whose long side is at most {REFERENCE_MAX_ASPECT} "
            f"times the short one, not {width}x{height}: choose a size closer to square."
        )
    return None


def _blocks_words(transformer: Mapping[str, Any]) -> str:
    latent = int(transformer.get("in_channels", 128)) // 4
    return (
        f"a Flux2Transformer2DModel with {transformer.get('num_layers')} double and "
        f"{transformer.get('num_single_layers')} single blocks, {transformer_width(transformer)} "
        f"wide, on {latent}-channel latents in 2x2 patches"
    )


@dataclass(frozen=True)
class Flux2KleinFamily(_Flux2):
    """Flux.2 Klein (4B, 9B; base or step-distilled): a Qwen3 text encoder whose hidden states
    after layers 9, 18 and 27 (the prompt in Qwen3's chat form, no thinking) condition the
    transformer; no guidance embedding. The base models sample with real CFG (a second call
    on the negative prompt), the distilled ones (`is_distilled`) with none."""

    id = FamilyId("flux2klein")
    title = "Flux.2 Klein"
    architectures = {"flux2-klein": "Flux.2 Klein"}
    trainer_words = ((r"flux-?2.*klein", "flux2-klein"),)
    layout = LAYOUT  # the one layout both variants are kept in, told apart as it is read
    pipeline_class = "Flux2KleinPipeline"
    pipelines = ("Flux2KleinPipeline",)
    edit_pipelines = {"Flux2KleinPipeline": KLEIN_REFERENCES}
    # The inpainting pipeline takes the picture's latents in 2x2 patches (`encode_pixels`),
    # normalises them and reads them in its sequence as the first reference, and keeps what
    # the mask keeps.
    picture_pipelines = {Mode.INPAINT: "Flux2KleinInpaintPipeline"}
    companion_names = {"text_encoder": "qwen_3_4b", "vae": "flux2-vae"}
    layers = KLEIN_LAYERS

    def detect_folder(
        self,
        model_index: Mapping[str, Any],
        transformer: Mapping[str, Any],
        scheduler: Mapping[str, Any],
    ) -> Detection:
        distilled = bool(model_index.get("is_distilled"))
        sampling = (
            "step-distilled, so it samples without CFG"
            if distilled
            else "flow matching with real CFG"
        )
        because = (
            f"Flux.2 Klein: its Flux2KleinPipeline has {_blocks_words(transformer)}, no "
            f"guidance embedding, and a Qwen3 text encoder "
            f"({pipeline_part_class(model_index, 'text_encoder')}) whose hidden states from "
            f"three layers, {transformer.get('joint_attention_dim')} values a token, it reads; "
            f"{sampling}."
        )
        return Detection(
            "flux2-klein",
            True,
            "a Flux.2 Klein pipeline",
            because,
            "flow",
            1024,
            None,
            "Flux2KleinPipeline",
        )

    def _tokens(self, pipe, prompt: str):
        tokenizer = pipe.tokenizer
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=False,
        )
        inputs = tokenizer(
            text,
            return_tensors="pt",
            padding="max_length",
            truncation=True,
            max_length=MAX_SEQUENCE_LENGTH,
        )
        return inputs["input_ids"], inputs["attention_mask"]

    @staticmethod
    def distilled(pipe) -> bool:
        return bool(pipe.config.get("is_distilled", False))

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        tensors = {"prompt_embeds": self._encode_one(pipe, prompt, device)}
        if guidance and not self.distilled(pipe):
            tensors["negative_prompt_embeds"] = self._encode_one(pipe, negative, device)
        return tensors

    def _velocity(self, call, conditioning, device):
        cond = call(conditioning["prompt_embeds"])
        negative = conditioning.get("negative_prompt_embeds")
        if negative is None:  # distilled: the prompt's prediction alone
            return cond
        uncond = call(negative)
        return uncond + PROBE_KLEIN_CFG * (cond - uncond)

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        # Real CFG above 1 (a distilled model's pipeline ignores it, saying so).
        return {"guidance_scale": cfg}

    def editing_picture_problem(self, pipeline, mode: Mode) -> str | None:
        return None  # a picture alone is edited; with a mask, it is inpainted

    def sequence_latents(self, pipeline, mode: Mode, encoded, mask=None) -> list[Any] | None:
        # Flux2KleinInpaintPipeline reads the picture's latents (not those of the picture with
        # its hole) in its sequence as an edit's first reference (time 10, row, column),
        # normalised in fp32: the generation hands them over in fp32.
        if mode is Mode.INPAINT:
            return [encoded[0].float()]
        return super().sequence_latents(pipeline, mode, encoded, mask)


@dataclass(frozen=True)
class Flux2Family(_Flux2):
    """Flux.2 dev: a Mistral 3 (Small 3.1) text encoder whose hidden states after layers 10, 20
    and 30 (the prompt after Flux.2's system message) condition the transformer; guidance
    distilled, it takes the guidance scale as an embedding (one batch, no negative prompt)."""

    id = FamilyId("flux2")
    file_markers = (("single_stream_modulation.", "a Flux.2 model"),)
    title = "Flux.2"
    architectures = {"flux2": "Flux.2", "flux2-dev": "Flux.2 dev"}
    trainer_words = ((r"flux-?2", "flux2"),)
    layout = LAYOUT
    pipeline_class = "Flux2Pipeline"
    pipelines = ("Flux2Pipeline",)
    edit_pipelines = {"Flux2Pipeline": DEV_REFERENCES}
    companion_names = {"text_encoder": "mistral_3_small_flux2", "vae": "flux2-vae"}
    layers = DEV_LAYERS

    def detect_folder(
        self,
        model_index: Mapping[str, Any],
        transformer: Mapping[str, Any],
        scheduler: Mapping[str, Any],
    ) -> Detection:
        guidance = (
            "a guidance embedding, as the guidance-distilled Flux.2 dev has"
            if transformer.get("guidance_embeds", True)
            else "no guidance embedding"
        )
        because = (
            f"Flux.2 dev: its Flux2Pipeline has {_blocks_words(transformer)}, {guidance}, and a "
            f"Mistral 3 text encoder ({pipeline_part_class(model_index, 'text_encoder')}) whose "
            f"hidden states from three layers, {transformer.get('joint_attention_dim')} values a "
            "token, it reads; flow matching."
        )
        return Detection(
            "flux2-dev", True, "a Flux.2 dev pipeline", because, "flow", 1024, None, "Flux2Pipeline"
        )

    def _tokens(self, pipe, prompt: str):
        from diffusers.pipelines.flux2.pipeline_flux2 import format_input
        from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

        inputs = pipe.tokenizer.apply_chat_template(
            format_input([prompt], system_message=SYSTEM_MESSAGE),
            add_generation_prompt=False,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            padding="max_length",
            truncation=True,
            max_length=MAX_SEQUENCE_LENGTH,
        )
        return inputs["input_ids"], inputs["attention_mask"]

    def encode(self, pipe, prompt: str, negative: str, device, guidance: bool) -> dict[str, Any]:
        # Guidance-distilled: one batch, the negative prompt unused.
        return {"prompt_embeds": self._encode_one(pipe, prompt, device)}

    def _velocity(self, call, conditioning, device):
        import torch

        guidance = torch.full([1], PROBE_DEV_GUIDANCE, device=device)
        return call(conditioning["prompt_embeds"], guidance)

    def call_arguments(self, cfg: float) -> dict[str, Any]:
        return {"guidance_scale": cfg}  # the guidance embedding's scale; never a CFG batch

    def guidance_parameters(self, cfg: float) -> list[tuple[str, Any]]:
        # As Forge writes a guidance-distilled Flux's: no CFG batch, the embedding's scale.
        return [(infotext.CFG_SCALE.name, "1"), (infotext.DISTILLED_CFG_SCALE.name, f"{cfg:g}")]
