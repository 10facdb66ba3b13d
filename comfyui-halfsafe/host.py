"""ComfyUI's MODEL as a host of HalfSafe's check: one denoiser call at the precision ComfyUI runs
it, its named modules in ComfyUI's names (and HalfSafe's where the model has them), and fixes
put on a clone through ComfyUI's own patching (object patches of the islands, or the compute
dtype of the whole component)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

PREFIX = "diffusion_model"  # where ComfyUI's BaseModel holds the denoiser
COMPONENT = "unet"  # the component a remembered fix names (its settings' COMPONENT:PATH)


class NodeProblem(Exception):
    """One sentence for the node's output: what could not be done with this input."""


@dataclass
class DenoiserCall:
    """The inputs of one call of the diffusion model as ComfyUI makes it, caught at the
    model's own forward (after ComfyUI's `apply_model` cast and shaped them)."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    sigma: float = 0.0
    output: Any = None  # what `apply_model` returned (the denoised latent)
    text: str = "clip"  # "clip": the CLIP's empty prompt; "zeros": zeros of the model's widths


def _api():
    try:
        import comfy.model_management as mm
        import comfy.samplers as samplers
        import comfy.utils as utils
    except ImportError as error:  # not inside ComfyUI
        raise NodeProblem(f"HalfSafe's nodes run inside ComfyUI; {error}.") from error
    return mm, samplers, utils


def diffusion_model(model):
    """The MODEL's denoiser as a torch module, or a NodeProblem for a MODEL of another kind."""
    import torch

    base = getattr(model, "model", None)
    module = getattr(base, PREFIX, None)
    if not isinstance(module, torch.nn.Module) or not hasattr(model, "clone"):
        raise NodeProblem(
            f"HalfSafe cannot check this MODEL ({type(model).__name__}): it holds no diffusion "
            "model that ComfyUI's loaders make."
        )
    for needed in ("add_object_patch", "model_dtype", "load_device"):
        if not hasattr(model, needed):
            raise NodeProblem(
                f"This ComfyUI's MODEL has no {needed}, which HalfSafe's nodes need: update "
                "ComfyUI."
            )
    return module


def precision(model) -> dict[str, str]:
    """What ComfyUI stores the denoiser's weights in and what it computes in, as read from the
    model (a manual cast computes in another dtype than the weights are stored in)."""
    stored = model.model_dtype()
    cast = getattr(model.model, "manual_cast_dtype", None)
    compute = cast if cast is not None else stored
    found = {
        "stored": _name(stored),
        "compute": _name(compute),
        "manual_cast": str(cast is not None),
    }
    low_bit = low_bit_layers(model)
    if low_bit:  # the model's dtype is that of its plain weights: say what the rest holds
        found["low_bit"] = ", ".join(f"{n} layers in {form}" for form, n in low_bit.items())
    return found


# ComfyUI's quantized layouts (comfy.quant_ops), as the report names them.
LAYOUT_WORDS = {
    "TensorCoreFP8Layout": "fp8 with a scale",
    "TensorCoreFP8E4M3Layout": "fp8 with a scale",
    "TensorCoreFP8E5M2Layout": "fp8 (e5m2) with a scale",
    "TensorCoreMXFP8Layout": "MXFP8",
    "TensorCoreNVFP4Layout": "NVFP4",
    "TensorWiseINT8Layout": "int8 with a scale",
    "TensorCoreConvRotW4A4Layout": "ConvRot",
}


def low_bit_layers(model) -> dict[str, int]:
    """The diffusion model's weights ComfyUI holds quantized, counted by their form in words
    (`LAYOUT_WORDS`, else the layout's own name), and those held in a plain fp8 dtype."""
    import torch

    quantized = _quantized_tensor_class()
    counts: dict[str, int] = {}
    for name, weight in diffusion_model(model).named_parameters():
        if not name.endswith("weight"):
            continue
        if quantized is not None and isinstance(weight, quantized):
            layout = getattr(weight, "layout_cls", None)
            layout = getattr(layout, "__name__", layout) or type(weight).__name__
            form = LAYOUT_WORDS.get(str(layout), str(layout))
            params = getattr(weight, "params", None)
            rotated = params.get("convrot") if isinstance(params, dict) else None
            if rotated is None:
                rotated = getattr(params, "convrot", False)
            if rotated and form == LAYOUT_WORDS["TensorWiseINT8Layout"]:
                form = "int8 ConvRot"
        elif weight.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            form = _name(weight.dtype)
        else:
            continue
        counts[form] = counts.get(form, 0) + 1
    return counts


_SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def _name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    return _SHORT.get(name, name)


def load(model) -> None:
    """Load (and patch) the MODEL the way ComfyUI does before sampling."""
    mm, _, _ = _api()
    mm.load_models_gpu([model])


def put_back(model) -> None:
    """`model`'s own layers in the diffusion model its clones share, after a clone of it (a fix
    tried, a part checked with a fix on, a run sampled again) was loaded last. That clone's
    object patches (its layers kept wider) stay in the shared model after it is gone: ComfyUI
    hands its loaded entry to `model`, the clone's parent, and takes them out only when a job
    loads `model` again. Loading it here, as that job would, gives the MODEL passed in its own
    layers back at once and lets the copies go. Nothing is loaded where no clone of it is."""
    mm, _, _ = _api()
    loaded = [m.model for m in mm.current_loaded_models]
    if any(other is not None and model.is_clone(other) for other in loaded):
        mm.load_models_gpu([model])


def one_call(model, width: int, height: int, steps: int, seed: int, clip=None) -> DenoiserCall:
    """Run one denoiser call of `model` as ComfyUI's sampler makes it (the first step's sigma
    of `steps` on the normal schedule, the seed's noise, the empty prompt or zeros for the
    text), catching the diffusion model's own inputs."""
    import torch

    mm, samplers, _ = _api()
    base = model.model
    module = diffusion_model(model)
    shape = latent_shape(base, width, height)
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    sigma = samplers.calculate_sigmas(base.model_sampling, "normal", max(1, steps))[0]
    device = model.load_device
    x = base.model_sampling.noise_scaling(sigma, noise, torch.zeros(shape)).to(device)
    context, pooled = check_text(base, clip)
    text = "clip" if clip is not None else "zeros"
    conds = base.extra_conds(
        cross_attn=context,
        pooled_output=pooled,
        width=width,
        height=height,
        device=device,
        noise=x,
    )
    kwargs = {k: v.process_cond(batch_size=1, device=device).cond for k, v in conds.items()}
    call = DenoiserCall(sigma=float(sigma), text=text)

    def catch(_module, args, kw):
        if not call.args:
            call.args, call.kwargs = args, dict(kw)

    handle = module.register_forward_pre_hook(catch, with_kwargs=True)
    try:
        with torch.no_grad():
            call.output = base.apply_model(x, sigma.reshape(1).to(device), **kwargs)
    finally:
        handle.remove()
    if not call.args:
        raise NodeProblem("ComfyUI's apply_model never called the diffusion model.")
    del mm
    return call


def latent_shape(base, width: int, height: int) -> tuple[int, ...]:
    """The shape of one picture's latent for ComfyUI's `base` model at width x height."""
    latent = base.latent_format
    down = int(getattr(latent, "spacial_downscale_ratio", 8))
    shape = (1, int(latent.latent_channels), max(1, height // down), max(1, width // down))
    if getattr(latent, "latent_dimensions", 2) == 3:  # video latents: one frame, as ComfyUI's
        shape = (*shape[:2], 1, *shape[2:])  # sampler makes an image's (fix_empty_latent_channels)
    return shape


# Where ComfyUI's model configs (`unet_config`) keep the width of the text a denoiser reads (its
# token features) and of the pooled vector beside it, by the config's shape: the first whose
# text key the config holds gives the widths of the zeros a check uses without a CLIP. A pooled
# key of None: the model reads no pooled vector without its CLIP's. A text key "A*B": the
# product of both (a text read at B wide from each of A layers of its encoder).
TEXT_WIDTHS: tuple[tuple[str, str | None], ...] = (
    ("context_in_dim", "vec_in_dim"),  # double/single-stream transformers in BFL's layout
    ("context_embedder_config.params.in_features", "adm_in_channels"),  # MMDiT
    ("cap_feat_dim", None),  # NextDiT
    ("txtlayers*txtdim", None),  # single-stream DiTs fusing their encoder's layers
    ("crossattn_emb_channels", None),  # Cosmos DiTs (their text adapter's output)
    ("context_dim", None),  # UNets
)
# Where a denoiser whose config keeps no text width reads its text: the input layer whose
# `in_features` is that width (an MMDiT with a fixed text width keeps it only there).
TEXT_INPUTS = ("txt_in",)
TEXT_TOKENS = 77  # tokens of zeros: one CLIP prompt's length


def _config_value(config: dict, path: str):
    value: Any = config
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def text_widths(config: dict) -> tuple[int, int | None] | None:
    """The widths (text features, pooled vector or None) of the zeros a check feeds a model of
    this `unet_config` without a CLIP; None where the config keeps no text width."""
    for text_key, pooled_key in TEXT_WIDTHS:
        factors = [_config_value(config, key) for key in text_key.split("*")]
        width = math.prod(int(f) for f in factors) if all(factors) else None
        if width:
            pooled = _config_value(config, pooled_key) if pooled_key else None
            return int(width), (int(pooled) if pooled else None)
    return None


def check_text(base, clip=None) -> tuple[Any, Any]:
    """The text a check feeds the model: the empty prompt through `clip`, or without one the
    zeros (context, pooled vector or None) at the widths the model reads."""
    import torch

    if clip is not None:
        tokens = clip.tokenize("")
        context, pooled = clip.encode_from_tokens(tokens, return_pooled=True)
        return context, pooled
    widths = text_widths(base.model_config.unet_config) or _input_width(base)
    if widths is None:
        raise NodeProblem("Connect the CLIP to HalfSafe Check: this model needs its text.")
    width, pooled = widths
    pooled = pooled or _adm_pooled_width(base)
    return torch.zeros(1, TEXT_TOKENS, width), (torch.zeros(1, pooled) if pooled else None)


def _adm_pooled_width(base) -> int | None:
    """The pooled vector's width a UNet with an ADM input (`adm_in_channels`: SDXL's 2816) reads
    beside the embeddings the model adds to it (SDXL's size and crop): the ADM's width less
    what the model's own `encode_adm` makes of an empty pooled vector. None for a model that
    reads no pooled vector there."""
    import torch

    adm = base.model_config.unet_config.get("adm_in_channels")
    if not adm:
        return None
    try:
        rest = base.encode_adm(pooled_output=torch.zeros(1, 0), width=64, height=64, device="cpu")
    except Exception:  # an ADM made otherwise (unCLIP's noise augmentation, a class label)
        return None
    if not isinstance(rest, torch.Tensor) or rest.shape[-1] >= adm:
        return None
    return int(adm - rest.shape[-1])


def _input_width(base) -> tuple[int, None] | None:
    """The text width of a denoiser whose config keeps none, read from its text input layer."""
    module = getattr(base, PREFIX, None)
    for path in TEXT_INPUTS:
        width = getattr(getattr(module, path, None), "in_features", None)
        if isinstance(width, int) and width > 0:
            return width, None
    return None


@contextmanager
def counting_calls(module) -> Iterator[None]:
    """Count each call of the diffusion model `module` (or of a copy of it: the same class)
    into the running `app.core.work` record, under the dtype its input latent came in."""
    import torch

    from app.core import work

    kind = type(module)

    def count(called, args):
        if type(called) is not kind:
            return
        counted = work.counted()
        floats = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        if counted is not None and floats:
            counted.call(COMPONENT, _name(floats[0].dtype), recorder=None, timed=False)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        yield
    finally:
        handle.remove()


def run_call(model, call: DenoiserCall):
    """The diffusion model of `model` (loaded with its patches) called with the caught inputs."""
    import torch

    load(model)
    with torch.no_grad():
        return diffusion_model(model)(*call.args, **call.kwargs)


def apply_islands(model, islands: dict[str, str]) -> None:
    """Put an island copy of each layer (its path in the diffusion model -> "fp32"|"bf16") on
    `model` (a clone) as ComfyUI object patches: only those layers are copied, in that dtype.
    A layer whose weights ComfyUI holds quantized (scaled fp8, int8, int8 ConvRot) is computed
    there as a plain torch layer from its weights dequantized by ComfyUI's own code."""
    import torch

    from app.core.fixing.module_check import island_copy

    module = diffusion_model(model)
    for path, dtype in islands.items():
        try:
            layer = _as_loaded(model, module, path)
        except AttributeError as error:
            raise NodeProblem(f"The model has no layer {PREFIX}.{path} to keep wider.") from error
        wide = torch.float32 if dtype == "fp32" else torch.bfloat16
        island = island_copy(layer, wide, rebuild=_named(dequantized_layer, path))
        _unpatched(model, path, island)
        model.add_object_patch(f"{PREFIX}.{path}", island)


def _as_loaded(model, module, path: str):
    """The layer at `path` as the file loaded it: the original where an earlier job's object
    patch (another fix's copy of it) sits in the shared model now."""
    kept = getattr(model, "object_patches_backup", None) or {}
    original = kept.get(f"{PREFIX}.{path}")  # a container layer with no children is falsy
    return original if original is not None else module.get_submodule(path)


def _unpatched(model, path: str, island) -> None:
    """`island`'s weights as the file holds them, and ready to take this model's own patches
    (its LoRAs) when ComfyUI loads it. The model ComfyUI's clones share may still hold an
    earlier job's patches, merged into its weights in place (their originals in the clones'
    shared `backup`), and the copy would keep them, marked patched, so that this model's own
    were never put on: a LoRA changed or removed since stayed in the layers kept wider."""
    import torch

    backup = getattr(model, "backup", None) or {}
    with torch.no_grad():
        for name, param in island.named_parameters():
            held = backup.get(f"{PREFIX}.{path}.{name}")
            weight = getattr(held, "weight", None)
            if weight is not None and weight.shape == param.shape:
                param.data = weight.to(device=param.device, dtype=param.dtype)
    for part in island.modules():
        if hasattr(part, "comfy_patched_weights"):
            del part.comfy_patched_weights


def _named(rebuild, path: str):
    """`rebuild` whose NodeProblem names the island's path, not the inner module's object."""

    def named(module, dtype):
        try:
            return rebuild(module, dtype)
        except NodeProblem as problem:
            raise NodeProblem(f"{PREFIX}.{path}: {problem}") from problem

    return named


# Parameters of ComfyUI's quantized layers that scale their inputs for a low-bit matmul; a
# layer computed wide from its dequantized weight has no use for them.
ACTIVATION_SCALES = ("input_scale",)


def _quantized_tensor_class():
    """ComfyUI's class of weights held in a quantized layout (None where it has none)."""
    try:
        from comfy.quant_ops import QuantizedTensor
    except ImportError:
        return None
    return QuantizedTensor


def dequantized_layer(layer, dtype):
    """A plain torch Linear (or Embedding) in `dtype` computing what ComfyUI's quantized
    `layer` computes, without its low-bit arithmetic: the weight dequantized by ComfyUI's own
    code into fp32 (the scale applied, int8 ConvRot's rotation undone), then cast to `dtype`,
    and the bias. None for a layer whose own weights are plain tensors, which a cast widens;
    a NodeProblem for weights held in a layout this cannot dequantize (a tensor of another
    kind: GGUF's, say)."""
    import torch

    quantized = _quantized_tensor_class()
    own = {n: p for n, p in layer._parameters.items() if p is not None}
    odd = sorted(
        n
        for n, p in own.items()
        if type(p) not in (torch.Tensor, torch.nn.Parameter)
        and not (quantized is not None and isinstance(p, quantized))
    )
    if odd:
        kind = type(own[odd[0]]).__name__
        raise NodeProblem(
            f"its {odd[0]} is held as {kind}, a layout HalfSafe cannot widen yet; run the "
            "whole diffusion model wider instead."
        )
    weight = own.get("weight")
    if quantized is None or not isinstance(weight, quantized):
        return None
    if any(isinstance(p, quantized) for n, p in own.items() if n != "weight"):
        raise NodeProblem("it holds quantized tensors besides its weight.")
    wide = weight.to(torch.float32).dequantize().to(dtype)
    bias = own.get("bias")
    if isinstance(layer, torch.nn.Embedding) and wide.ndim == 2:
        plain = torch.nn.Embedding(
            wide.shape[0], wide.shape[1], padding_idx=layer.padding_idx, _weight=wide
        )
    elif wide.ndim == 2 and set(own) <= {"weight", "bias", *ACTIVATION_SCALES}:
        # Made on the meta device: no weights of its own drawn, only the dequantized ones.
        plain = torch.nn.Linear(wide.shape[1], wide.shape[0], bias=bias is not None, device="meta")
        plain.weight = torch.nn.Parameter(wide, requires_grad=False)
        if bias is not None:
            plain.bias = torch.nn.Parameter(bias.to(dtype), requires_grad=False)
    else:
        raise NodeProblem(
            f"its quantized weight is {wide.ndim}-dimensional, a layer HalfSafe cannot widen yet."
        )
    return plain.requires_grad_(False)


def apply_clamps(model, paths: list[str]) -> None:
    """Hold the fp16 outputs of the layers at `paths` (in the diffusion model) to fp16's range
    while `model` (a clone) calls its diffusion model, as HalfSafe's clamp fix does: hooks put
    on for each call of this clone only, through ComfyUI's own wrapper of the model's call
    (APPLY_MODEL: every model calls through it, where some never call the DIFFUSION_MODEL one),
    nothing copied."""
    import comfy.patcher_extension as extension

    from app.core.hooks import Hooks

    module = diffusion_model(model)
    for path in paths:
        try:
            module.get_submodule(path)
        except AttributeError as error:
            raise NodeProblem(f"The model has no layer {PREFIX}.{path} to clamp.") from error

    def clamped(executor, *args, **kwargs):
        root = executor.class_obj.diffusion_model
        with Hooks() as hooks:
            hooks.after_each((root.get_submodule(p) for p in paths), _clamp)
            return executor(*args, **kwargs)

    model.add_wrapper_with_key(extension.WrappersMP.APPLY_MODEL, "halfsafe_clamps", clamped)


def _clamp(_module, _args, output):
    """An fp16 output held to +-65504 (inf saturates, NaN stays)."""
    import torch

    from app.core.components import FP16_MAX

    def held(value):
        if isinstance(value, torch.Tensor) and value.dtype == torch.float16:
            return value.clamp(-FP16_MAX, FP16_MAX)
        return value

    return tuple(map(held, output)) if isinstance(output, tuple) else held(output)


NOTHING = "nothing to change"  # `apply_fix`'s words for a fix with no diffusion-model part


def apply_fix(model, fix: dict) -> str:
    """Put `fix` (the nodes' fix: a whole-model compute dtype, islands, clamps) on `model`, a
    clone; returns what was done, in words."""
    said = []
    if fix.get("component"):
        apply_component(model, fix["component"])
        said.append(f"the diffusion model computes in {fix['component']}")
    if fix.get("islands"):
        apply_islands(model, fix["islands"])
        said.append(f"{len(fix['islands'])} layer(s) kept wider ({named(fix['islands'])})")
    if fix.get("clamps"):
        apply_clamps(model, fix["clamps"])
        said.append(f"{len(fix['clamps'])} layer(s) clamped to fp16's range")
    return "; ".join(said) or NOTHING


def named(islands: dict[str, str], prefix: str = PREFIX, most: int = 4) -> str:
    """The first `most` islands with the dtype each is kept in, in ComfyUI's names."""
    shown = [f"{prefix}.{path} in {dtype}" for path, dtype in list(islands.items())[:most]]
    more = len(islands) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def apply_component(model, dtype: str) -> None:
    """The whole denoiser computing in `dtype` through ComfyUI's own compute-dtype patch."""
    import torch

    model.set_model_compute_dtype(torch.float32 if dtype == "fp32" else torch.bfloat16)


def halfsafe_names(model) -> dict[str, str]:
    """ComfyUI module path -> HalfSafe's (diffusers') for the SD UNets ComfyUI maps; empty
    where ComfyUI keeps no such map (a DiT keeps one name in both here)."""
    _, _, utils = _api()
    config = getattr(model.model.model_config, "unet_config", {})
    try:
        weights = utils.unet_to_diffusers(config)  # diffusers key -> ComfyUI key
    except (KeyError, TypeError, IndexError):
        return {}
    names: dict[str, str] = {}
    for theirs, ours in weights.items():
        for suffix in (".weight", ".bias"):
            if theirs.endswith(suffix) and ours.endswith(suffix):
                names[ours.removesuffix(suffix)] = theirs.removesuffix(suffix)
    return names


def halfsafe_name(names: dict[str, str], module, path: str) -> str | None:
    """HalfSafe's name of ComfyUI's module `path`: its own weight's, or for a module without
    one (an attention, a block) the name its first weight's parent gets, less that child."""
    if path in names:
        return names[path]
    try:
        inner = module.get_submodule(path)
    except AttributeError:
        return None
    for child, _ in inner.named_parameters():
        owner = child.rpartition(".")[0]
        if not owner:
            continue
        mapped = names.get(f"{path}.{owner}")
        if mapped and mapped.endswith("." + owner):
            return mapped.removesuffix("." + owner)
    return None


def device_name(model) -> str:
    """The device the model runs on, named as the desktop names it in HalfSafe's store."""
    import torch

    from app.core.hardware.devices import describe_device

    return describe_device(torch.device(model.load_device)).name
