"""HalfSafe Check's other parts inside ComfyUI: the VAE's decode and the text encoder's encode,
each run once as this ComfyUI runs it (in the dtype ComfyUI chose for it), recorded layer by
layer, the first bad layer named in ComfyUI's names and measured against an fp32 reference of
the same call; for the VAE, the cheapest fix proved against it (the overflowing layers kept
wider before the whole VAE in fp32), and HalfSafe Fix's VAE: a clone with that fix on."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from . import host

VAE_PREFIX = "first_stage_model"  # where ComfyUI's VAE holds its autoencoder
CLIP_PREFIX = "cond_stage_model"  # where ComfyUI's CLIP holds its text encoders
PROMPT = ""  # the text encoder's check encodes the empty prompt, as the denoiser's check does
# ... or, where the encoder answers the empty prompt without running a layer (zeros), this one.
SHORT_PROMPT = "a photo of a cat"
# The order of verdicts from best to worst: the check's overall verdict is its parts' worst.
VERDICTS = ("healthy", "fixable", "broken")


@dataclass
class PartOutcome:
    """What the check found in one part besides the diffusion model."""

    part: str  # "VAE" | "text encoder"
    verdict: str | None  # "healthy" | "fixable" | "broken"; None: not checked
    lines: list[str] = field(default_factory=list)
    first_bad_layer: str | None = None  # ComfyUI's name
    fix: dict | None = None  # {"islands": {path: dtype}, "component": dtype|None, ...}


def worst(verdicts) -> str | None:
    """The worst of `verdicts` (None where there is none)."""
    found = [v for v in verdicts if v in VERDICTS]
    return max(found, key=VERDICTS.index) if found else None


def overall(verdicts: dict[str, str | None]) -> str | None:
    """The check's verdict over its parts: the worst of theirs, but never "healthy" where a
    part connected could not be checked ("incomplete": nothing says it is sound)."""
    found = worst(verdicts.values())
    if found == "healthy" and any(v is None for v in verdicts.values()):
        return "incomplete"
    return found


def _dtype_name(dtype) -> str:
    return host._name(dtype)


def _finite(value) -> bool:
    import torch

    from app.core.run.probe import float_tensors

    return all(bool(torch.isfinite(t).all()) for t in float_tensors(value))


def _wide(dtype: str):
    import torch

    return torch.float32 if dtype == "fp32" else torch.bfloat16


def _island_dtypes(device) -> list[str]:
    """The dtypes an island is tried in, cheapest first: bf16 where the device computes it
    (CUDA with bf16), then fp32."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return ["bf16", "fp32"]
    return ["fp32"]


# --- the VAE ---------------------------------------------------------------------------------


def vae_module(vae):
    """The VAE's autoencoder as a torch module, or a NodeProblem for a VAE of another kind."""
    import torch

    module = getattr(vae, VAE_PREFIX, None)
    if not isinstance(module, torch.nn.Module):
        raise host.NodeProblem(
            f"HalfSafe cannot check this VAE ({type(vae).__name__}): it holds no autoencoder "
            "that ComfyUI's VAE loaders make."
        )
    for needed in ("patcher", "vae_dtype", "device", "latent_channels"):
        if not hasattr(vae, needed):
            raise host.NodeProblem(
                f"This ComfyUI's VAE has no {needed}, which HalfSafe's nodes need: update ComfyUI."
            )
    if getattr(vae, "latent_dim", 2) != 2 or not hasattr(module, "decode"):
        raise host.NodeProblem(
            "HalfSafe checks image VAEs (one picture from one latent); this VAE is another kind."
        )
    return module


def decode(vae, latent):
    """One decode of `latent` as ComfyUI's VAE makes it: the VAE loaded (with its patches), the
    latent in the VAE's own dtype on its device, its autoencoder's `decode`; the raw output
    (before ComfyUI maps it to 0..1)."""
    import torch

    mm, _, _ = host._api()
    memory = vae.memory_used_decode(latent.shape, vae.vae_dtype)
    mm.load_models_gpu([vae.patcher], memory_required=memory)
    with torch.no_grad():
        return vae.first_stage_model.decode(latent.to(device=vae.device, dtype=vae.vae_dtype))


def reference_decode(vae, latent):
    """The same decode in fp32 from the stored weights, one layer widened at a time (as the
    diffusion model's reference), recorded."""
    import torch

    from app.core.fixing.module_check import recorded_call
    from app.core.precision.layerwise import each_layer_in_fp32

    module = vae.first_stage_model
    wide = latent.to(device=vae.device, dtype=torch.float32)
    with each_layer_in_fp32([module]):
        return recorded_call(module, lambda: module.decode(wide))


def vae_latent(model, vae, size: tuple, clip, model_fix) -> tuple:
    """The latent the VAE's check decodes, and where it came from: the diffusion model's own
    prediction of the denoised latent in its one-call check (with its proved fix on, where it
    has one), in the VAE's scale; else seeded noise of the latent's shape, in the model's
    latent scale."""
    import torch

    width, height, steps, seed = size
    base = model.model
    latent_format = base.latent_format
    down = int(getattr(latent_format, "spacial_downscale_ratio", 8))
    channels = int(latent_format.latent_channels)
    if channels == int(vae.latent_channels):
        denoised = _denoised(model, size, clip, model_fix)
        if isinstance(denoised, torch.Tensor) and _finite(denoised):
            latent = base.process_latent_out(denoised.float().cpu())
            said = "the diffusion model's denoised prediction of its checked call"
            return latent, said + (" (with its fix on)" if model_fix else "")
    shape = (1, int(vae.latent_channels), max(1, height // down), max(1, width // down))
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    if channels == shape[1]:
        return latent_format.process_out(noise), "seeded noise in the model's latent scale"
    return noise, "seeded noise (the model's latents are not this VAE's)"


def _denoised(model, size: tuple, clip, model_fix):
    """The diffusion model's denoised latent of the check's call, on a clone with its fix on
    (None where the model cannot make that call)."""
    try:
        runs = model.clone()
        if model_fix:
            host.apply_fix(runs, model_fix)
        host.load(runs)
        width, height, steps, seed = size
        return host.one_call(runs, width, height, steps, seed, clip).output
    except host.NodeProblem:
        return None


def vae_clone(vae):
    """A VAE that shares `vae`'s autoencoder and weights but has its own patcher: what ComfyUI's
    own nodes do to retarget a VAE (it has no clone), so patches on it leave `vae` as it is."""
    clone = copy.copy(vae)
    clone.patcher = vae.patcher.clone()
    return clone


def apply_vae_fix(vae, fix: dict) -> str:
    """Put the VAE part of a fix on `vae` (a clone): each island an object patch (a copy of that
    layer alone in the wider dtype), or the whole VAE computing in fp32 through ComfyUI's own
    compute-dtype patch, each layer's stored weights cast for its call, nothing copied whole.
    Returns what was done, in words."""
    from app.core.fixing.module_check import island_copy

    module = vae_module(vae)
    said = []
    if fix.get("component"):
        wide = _wide(fix["component"])
        vae.patcher.set_model_compute_dtype(wide)
        vae.vae_dtype = wide
        said.append(f"the VAE computes in {fix['component']}")
    for path, dtype in (fix.get("islands") or {}).items():
        try:
            layer = module.get_submodule(path)
        except AttributeError as error:
            raise host.NodeProblem(
                f"The VAE has no layer {VAE_PREFIX}.{path} to keep wider."
            ) from error
        vae.patcher.add_object_patch(path, island_copy(layer, _wide(dtype)))
    if fix.get("islands"):
        said.append(
            f"{len(fix['islands'])} VAE layer(s) kept wider ({host.named(fix['islands'], VAE_PREFIX)})"
        )
    return "; ".join(said) or "nothing to change in the VAE"


def fixed_vae(vae, fix: dict) -> tuple:
    """A clone of `vae` with the fix's VAE part on, and what was done in words."""
    clone = vae_clone(vae)
    return clone, apply_vae_fix(clone, fix)


def check_vae(model, vae, size: tuple, clip=None, model_fix=None) -> PartOutcome:
    """Check the VAE's decode as ComfyUI runs it (`vae` is never changed: trials run on
    clones) and prove the cheapest fix against an fp32 reference of the same decode. `size`:
    the check's (width, height, steps, seed)."""
    from app.core.components import FP16_MAX
    from app.core.fixing.layer_islands import overflow_islands
    from app.core.fixing.module_check import closed_islands, recorded_call

    module = vae_module(vae)
    latent, source = vae_latent(model, vae, size, clip, model_fix)
    seen = recorded_call(module, lambda: decode(vae, latent))
    dtype = _dtype_name(vae.vae_dtype)
    shape = "x".join(str(n) for n in latent.shape)
    outcome = PartOutcome(
        "VAE",
        "broken",
        [f"The VAE computing in {dtype}, one decode of {source}, a {shape} latent."],
    )
    if seen.finite:
        outcome.verdict = "healthy"
        outcome.lines.append(_healthy_words(seen.probe, dtype, FP16_MAX))
        return outcome
    first = seen.first_bad_layer
    if first:
        outcome.first_bad_layer = f"{VAE_PREFIX}.{first}"
        outcome.lines.append(f"First bad layer: {outcome.first_bad_layer}.")
    else:
        outcome.lines.append("Its output went non-finite with no layer to name (its input was).")
    reference = reference_decode(vae, latent)
    if not reference.finite:
        outcome.lines.append("Broken: even fp32 gives non-finite output; no precision fix.")
        return outcome
    islands = closed_islands(reference.probe, overflow_islands(reference.probe, module) or [""])
    tried: list[str] = []
    candidates = [
        {"islands": dict.fromkeys(islands, d), "component": None}
        for d in _island_dtypes(vae.device)
        if islands != [""]
    ]
    candidates.append({"islands": {}, "component": "fp32"})
    for fix in candidates:
        quality = _trial(vae, fix, latent, reference.output)
        words = _fix_words(fix)
        if quality.passed:
            fix["summary"] = f"{words} (verified fix, {quality.words()})."
            fix["quality"] = quality.to_json()
            outcome.verdict, outcome.fix = "fixable", fix
            outcome.lines += [f"Tried: {t}." for t in tried] + [f"Fixable: {fix['summary']}"]
            outcome.lines.append("Connect the VAE to HalfSafe Fix to apply it.")
            return outcome
        tried.append(f"{words}: {quality.words()}")
    outcome.lines += [f"Tried: {t}." for t in tried]
    outcome.lines.append("Broken: no precision fix of the VAE matched its fp32 reference.")
    return outcome


def _trial(vae, fix: dict, latent, reference):
    from app.core.fixing.quality import compare

    trial, _ = fixed_vae(vae, fix)
    return compare(decode(trial, latent), reference)


def _fix_words(fix: dict) -> str:
    if fix.get("component"):
        return f"Run the whole VAE in {fix['component']}"
    dtypes = set(fix["islands"].values())
    paths = ", ".join(f"{VAE_PREFIX}.{p}" for p in fix["islands"])
    return f"Keep {len(fix['islands'])} VAE layer(s) in {'/'.join(sorted(dtypes))}: {paths}"


def _healthy_words(probe, dtype: str, fp16_max: float) -> str:
    if dtype != "fp16":
        peak = probe.max_abs
        over = ", past fp16's range: it would overflow in fp16" if peak > fp16_max else ""
        return f"Healthy: every layer stayed finite in {dtype} (largest value {peak:.3g}{over})."
    peak = probe.half_max_abs or probe.max_abs
    headroom = fp16_max / peak if peak else math.inf
    return f"Healthy: every layer stayed finite (headroom {headroom:.3g}x fp16's range)."


# --- the text encoder ------------------------------------------------------------------------


def clip_module(clip):
    """The CLIP's text encoders as a torch module, or a NodeProblem for a CLIP of another kind."""
    import torch

    module = getattr(clip, CLIP_PREFIX, None)
    if not isinstance(module, torch.nn.Module):
        raise host.NodeProblem(
            f"HalfSafe cannot check this CLIP ({type(clip).__name__}): it holds no text encoder "
            "that ComfyUI's loaders make."
        )
    for needed in ("tokenize", "encode_from_tokens", "patcher"):
        if not hasattr(clip, needed):
            raise host.NodeProblem(
                f"This ComfyUI's CLIP has no {needed}, which HalfSafe's nodes need: update ComfyUI."
            )
    return module


def clip_precision(module, computed: set[str]) -> dict[str, str]:
    """What the text encoder's weights are stored in and what its layers computed in: the
    dtypes they handed out in an encode (`computed`; "" where no layer ran). Not the compute
    dtype ComfyUI patches into a CLIP (fp32): most of its text encoders cast their weights to
    it, but Lens's GPT-OSS computes in the dtype it stores."""
    stored = sorted({_dtype_name(p.dtype) for p in module.parameters() if p.is_floating_point()})
    compute = "/".join(sorted(computed))
    return {"stored": "/".join(stored) or "none", "compute": compute}


@contextmanager
def _layer_dtypes(module) -> Iterator[set[str]]:
    """The dtypes that the layers of `module` computed in while open: the dtype of each output
    of a layer holding weights that took a floating input (an embedding's lookup is no
    computation)."""
    import torch

    from app.core.hooks import Hooks

    found: set[str] = set()

    def seen(_layer, args, output) -> None:
        took = any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args)
        if took and isinstance(output, torch.Tensor) and output.is_floating_point():
            found.add(_dtype_name(output.dtype))

    with Hooks() as hooks:
        for layer in module.modules():
            if next(layer.parameters(recurse=False), None) is not None:
                hooks.after(layer, seen)
        yield found


@contextmanager
def _computing_in_fp32(module) -> Iterator[None]:
    """`module` with every submodule that holds the dtype it computes in (a `dtype` of its own,
    as Lens's GPT-OSS encoder keeps its activations in) told fp32 while open, put back after:
    with its weights widened layer by layer, an encode that is the one `--fp32-text-enc` makes."""
    import torch

    held = [
        (layer, layer.__dict__["dtype"])
        for layer in module.modules()
        if layer.__dict__.get("dtype") in (torch.float16, torch.bfloat16)
    ]
    try:
        for layer, _ in held:
            layer.__dict__["dtype"] = torch.float32
        yield
    finally:
        for layer, dtype in held:
            layer.__dict__["dtype"] = dtype


def fixed_clip(clip, fix: dict):
    """A clone of `clip` whose text encoder computes in fp32, the text-encoder fix the check
    proves (its fp32 reference): an object patch for each submodule that keeps the dtype it
    computes in (Lens's GPT-OSS keeps its activations in its stored fp16), told fp32, which
    ComfyUI puts on when it loads this clone and takes off for any other; each layer casts its
    stored weights to its input for the call, as ComfyUI's ops and this code do. Nothing is
    copied. Returns (the clone, what was done in words)."""
    import torch

    if fix.get("component") != "fp32" or fix.get("islands"):
        raise host.NodeProblem("HalfSafe Fix applies only the whole text encoder in fp32.")
    clone = clip.clone()
    held = [
        name
        for name, layer in clip_module(clone).named_modules()
        if layer.__dict__.get("dtype") in (torch.float16, torch.bfloat16)
    ]
    prefix = _patch_prefix(clone)
    for name in held:
        clone.patcher.add_object_patch(
            ".".join(p for p in (prefix, name, "dtype") if p), torch.float32
        )
    if not held:
        return clone, "the text encoder already computes in fp32 here: nothing to change"
    return clone, f"the text encoder computes in fp32 ({len(held)} of its modules told so)"


def _patch_prefix(clip) -> str:
    """Where the text encoder `clip_module` finds sits under the CLIP's patched model."""
    module = clip_module(clip)
    for name, child in clip.patcher.model.named_modules():
        if child is module:
            return name
    raise host.NodeProblem("The CLIP's text encoder is not inside its patched model.")


def _encoded(module, clip, prompt: str):
    """One encode of `prompt` with `clip`, recorded, and the dtypes its layers computed in."""
    from app.core.fixing.module_check import recorded_call

    tokens = clip.tokenize(prompt)
    with _layer_dtypes(module) as computed:
        seen = recorded_call(module, lambda: clip.encode_from_tokens(tokens, return_pooled=True))
    return seen, computed


def check_text_encoder(clip) -> PartOutcome:
    """Encode the empty prompt with `clip` as ComfyUI does, recorded (a short prompt instead
    where the encoder answers the empty one without running a layer); the first bad layer and
    whether an fp32 encode is finite. Its fix, where there is one, is the whole encoder in fp32
    (`fixed_clip`): most of ComfyUI's text encoders compute in fp32 already (so a layer kept
    wider changes nothing there; what is left is the weights' stored dtype)."""
    from app.core.components import FP16_MAX
    from app.core.precision.layerwise import each_layer_in_fp32

    module = clip_module(clip)
    runs = clip.clone()
    prompt = PROMPT
    seen, computed = _encoded(module, runs, prompt)
    if not seen.probe.modules:  # an encoder that answers the empty prompt without its layers
        prompt = SHORT_PROMPT
        seen, computed = _encoded(module, runs, prompt)
    dtypes = clip_precision(module, computed)
    which = "the empty prompt" if prompt == PROMPT else f"the prompt {prompt!r}"
    computing = f", computing in {dtypes['compute']}" if dtypes["compute"] else ""
    outcome = PartOutcome(
        "text encoder",
        "broken",
        [f"The text encoder stored in {dtypes['stored']}{computing}, one encode of {which}."],
    )
    if not seen.probe.modules:  # nothing ran: no evidence either way, so no verdict
        outcome.verdict = None
        outcome.lines.append(
            "Not checked: its encode ran none of its layers, even for a prompt with words."
        )
        return outcome
    if seen.finite:
        outcome.verdict = "healthy"
        outcome.lines.append(
            _healthy_words(seen.probe, dtypes["compute"] or dtypes["stored"], FP16_MAX)
        )
        return outcome
    first = seen.first_bad_layer
    if first:
        outcome.first_bad_layer = f"{CLIP_PREFIX}.{first}"
        outcome.lines.append(f"First bad layer: {outcome.first_bad_layer}.")
    else:
        outcome.lines.append("Its output went non-finite with no layer to name.")
    with each_layer_in_fp32([module]), _computing_in_fp32(module):
        reference, wide = _encoded(module, runs, prompt)
    if wide != {"fp32"}:  # a layer that computed narrower: no fp32 reference to speak of
        outcome.lines.append(
            "Broken as ComfyUI runs it; no fix verified: with its weights in fp32 its layers "
            f"still computed in {'/'.join(sorted(wide)) or 'nothing'}, so no fp32 reference ran."
        )
        return outcome
    if not reference.finite:
        outcome.lines.append("Broken: even fp32 gives non-finite output; no precision fix.")
        return outcome
    fix = {"islands": {}, "component": "fp32"}
    fix["summary"] = (
        "Run the whole text encoder in fp32 (verified: it is the fp32 reference): connect the "
        "CLIP to HalfSafe Fix, or start ComfyUI with --fp32-text-enc."
    )
    outcome.verdict, outcome.fix = "fixable", fix
    outcome.lines.append(f"Fixable: {fix['summary']}")
    return outcome


# --- the report ------------------------------------------------------------------------------


@dataclass
class Checked:
    """The whole check's report: every part's lines, the overall verdict, the VAE's fix."""

    text: str
    verdict: str | None
    vae_fix: dict | None = None
    text_encoder_fix: dict | None = None


def check_parts(model, outcome, size: tuple, clip, vae, one_sentence) -> Checked:
    """The diffusion model's `outcome` with the VAE's and the text encoder's checks after it
    (each where connected; a part that could not run is `one_sentence(error)`, the others are
    kept), and the line that lists every part's verdict and the worst."""
    lines = [outcome.text]
    verdicts: dict[str, str | None] = {"diffusion model": outcome.verdict}
    vae_fix = text_encoder_fix = None
    runs = (
        ("VAE", vae, lambda: check_vae(model, vae, size, clip, outcome.fix)),
        ("text encoder", clip, lambda: check_text_encoder(clip)),
    )
    for part, given, run in runs:
        if given is None:
            continue
        title = part[0].upper() + part[1:]
        try:
            found = run()
        except Exception as error:  # noqa: BLE001 - one part that could not run is said alone
            verdicts[part] = None
            lines.append(f"{title}: {one_sentence(error)}")
            continue
        verdicts[part] = found.verdict
        lines.append(f"{title}: " + "\n".join(found.lines))
        if part == "VAE":
            vae_fix = found.fix
        else:
            text_encoder_fix = found.fix
    missing = [name for name, given in (("VAE", vae), ("CLIP", clip)) if given is None]
    lines.append(summary_line(verdicts, missing))
    return Checked("\n".join(lines), overall(verdicts), vae_fix, text_encoder_fix)


def summary_line(verdicts: dict[str, str | None], not_connected: list[str]) -> str:
    """The last line of the report: each part checked with its verdict, and the worst."""
    checked = ", ".join(f"{part} {v or 'not checked'}" for part, v in verdicts.items())
    line = f"Checked: {checked}."
    if not_connected:
        line += f" Not connected: {' and '.join(not_connected)}."
    verdict = overall(verdicts)
    return line + (f" Overall: {verdict}." if verdict else "")
