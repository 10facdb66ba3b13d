"""LoRA files: reading them safely, scanning their weights, applying them at a weight, and the
`<lora:name:weight>` prompt syntax of AUTOMATIC1111.

A LoRA is as untrusted as a checkpoint: it is opened through `checkpoint.Checkpoint` (the
safetensors header validated before any tensor is read, pickles refused unless allowed and then
read only by PyTorch's weights-only loader) and its tensors are scanned before anything runs.
Keys in the layouts users have are accepted: kohya / A1111 (`lora_unet_*`, `lora_te*_*` with
`.lora_down`, `.lora_up`, `.alpha`), diffusers and PEFT (`*.lora_A.weight`, `*.lora_B.weight`,
`*.lora.down.weight`). diffusers' `load_lora_weights` converts them and peft wraps the model's
layers; each LoRA stays a separate adapter, never merged into the weights, so its weight can
change (or the LoRA be switched off) between runs without reloading or rounding the model.

Every layer runs at `weight * alpha / rank` of its own, as AUTOMATIC1111 and ComfyUI run it
(alpha is the layer's `.alpha` tensor, the rank when it has none). HalfSafe applies the alphas
itself (`adapter_factors`, `_load_adapter`): diffusers files some kohya alphas under names that
match no layer (the attention layers of SD and SDXL) and reads none from PEFT-layout files, so
those layers would run at the file's most common alpha.

torch and diffusers are imported inside the functions that need them. What the user asks for,
`LoraRequest`, is plain data in `lora.request` (re-exported here); whether a LoRA fits the model
it is applied to is `lora.fit`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.core import limits
from app.core.checkpoint import Checkpoint, one_torch_thread, tensor_is_finite
from app.core.errors import BadFileError, HalfSafeError
from app.core.lora.fit import (
    LoraFit,
    check_made_for,
    counting_layers,
    loaded_model_words,
    refuse_told,
)
from app.core.lora.request import LoraRequest

if TYPE_CHECKING:
    import torch

# A LoRA's weight: A1111 lets users type anything, but past these the LoRA is not a style but
# a different model, and a check of it says nothing useful.
MIN_WEIGHT = -10.0
MAX_WEIGHT = 10.0
MAX_LORAS = 16
# A LoRA's factors are small: trained ones stay under a few units per element, and the product
# up @ down scaled by alpha/rank is a small correction to a layer's weights. A factor element
# past this is not training but damage (or a deliberately hostile file).
ABSURD_ELEMENT = 1e4
# A layer's alpha scales its whole delta (alpha / rank). Trained LoRAs use 1 up to their rank
# (at most a few hundred), so an alpha past ABSURD_ELEMENT, or NaN/Inf, makes the layer's
# strength meaningless at any weight: the LoRA is damaged. A negative alpha within the bound is
# run as A1111 and ComfyUI run it (it reverses the layer, as a negative weight does); zero
# switches the layer off.
LORA_SUFFIXES = (".safetensors", ".sft", ".pt", ".ckpt", ".bin", ".pth")
# Where A1111, Forge, ComfyUI and SD.Next keep LoRAs, relative to a models folder.
LORA_FOLDERS = ("Lora", "lora", "LoRA", "loras", "Loras", "LyCORIS")

_TAG = re.compile(r"<lora:([^:>]+)(?::([^:>]*))?(?::[^>]*)?>", re.IGNORECASE)
_KEY_MARKERS = (".lora_down.", ".lora_up.", ".lora_A.", ".lora_B.", ".lora.down.", ".lora.up.")
# A layer's (down, up) factor key endings, per layout; its alpha is `<layer>.alpha`.
_FACTORS = (
    (".lora_down.weight", ".lora_up.weight"),
    (".lora_A.weight", ".lora_B.weight"),
    (".lora.down.weight", ".lora.up.weight"),
)


@dataclass
class LoraFile:
    """A LoRA read and scanned: its tensors (on the CPU, as stored), where they are bad, and the
    A1111 short hash (`Lora hashes` in PNG parameters)."""

    path: Path
    name: str
    layout: str  # "kohya" | "diffusers"
    tensors: dict[str, torch.Tensor] = field(repr=False)
    non_finite: list[str]
    absurd: list[tuple[str, float]]  # (tensor, largest |element|) past ABSURD_ELEMENT
    short_hash: str | None
    # The safetensors header's __metadata__ (a trainer's ss_* and modelspec.* keys).
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def absurd_alphas(self) -> list[tuple[str, float]]:
        """(alpha tensor, |alpha|) for each layer whose alpha is past ABSURD_ELEMENT."""
        return [(name, peak) for name, peak in self.absurd if name.endswith(".alpha")]

    @property
    def damaged(self) -> list[str]:
        """The tensors that make this LoRA wrong at any weight: those holding NaN/Inf, and
        alphas past ABSURD_ELEMENT. A LoRA with any is dropped, never run at a lower weight."""
        return self.non_finite + [name for name, _ in self.absurd_alphas]

    def damage_words(self) -> str | None:
        """What is damaged, completing "The LoRA <name> ...", naming the first tensor."""
        if self.non_finite:
            more = f" and {len(self.non_finite) - 1} more" if len(self.non_finite) > 1 else ""
            return f"holds NaN or Inf values in {self.non_finite[0]}{more}"
        if self.absurd_alphas:
            name, _ = self.absurd_alphas[0]
            return (
                f"has the alpha {float(self.tensors[name].float()):.3g} in {name} (trained "
                f"LoRAs use 1 up to their rank; past {ABSURD_ELEMENT:g} no weight makes sense)"
            )
        return None

    def problems(self) -> str | None:
        """One sentence on what is wrong with the weights, None when nothing is."""
        if (damage := self.damage_words()) is not None:
            return f"The LoRA {self.name} {damage}: its weights are damaged."
        if self.absurd:
            name, peak = self.absurd[0]
            return (
                f"The LoRA {self.name} holds absurdly large values in {name} (|x| up to "
                f"{peak:.3g}; trained LoRAs stay under a few units): expect overflow."
            )
        return None


@dataclass
class AppliedLora:
    """One LoRA loaded into a pipeline as a peft adapter, at the weight the user asked for.
    `layers` is how many layers the LoRA holds as diffusers converts it for the model, and
    `layers_applied` how many of them the model has (None where not counted); `fit_note` is
    the sentence that says so when some are missing."""

    file: LoraFile
    adapter: str
    weight: float
    layers: int | None = None
    layers_applied: int | None = None
    fit_note: str | None = None

    @property
    def name(self) -> str:
        return self.file.name

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.file.path),
            "weight": self.weight,
            "hash": self.file.short_hash,
            "non_finite": list(self.file.non_finite),
            "absurd": [name for name, _ in self.file.absurd],
        }


# --- the command line and the prompt -----------------------------------------------------------


def parse_lora_argument(text: str) -> LoraRequest:
    """`PATH` or `PATH:WEIGHT` (the weight after the last colon, so a Windows drive letter or a
    colon inside a path survives). Raises ValueError with a short reason."""
    head, sep, tail = text.rpartition(":")
    if sep and head:
        try:
            weight = float(tail)
        except ValueError:
            pass
        else:
            return LoraRequest(head, check_weight(weight, head))
    return LoraRequest(text, 1.0)


def check_weight(weight: float, name: str) -> float:
    if not math.isfinite(weight) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise ValueError(
            f"the weight of LoRA {name} must be between {MIN_WEIGHT:g} and {MAX_WEIGHT:g}, "
            f"not {weight:g}"
        )
    return float(weight)


def prompt_loras(prompt: str) -> tuple[str, list[LoraRequest]]:
    """A1111's `<lora:name:weight>` tags: the prompt without them (what the text encoder reads),
    and the LoRAs they name (weight 1 when left out). A tag with a weight that is not a number
    gets one sentence (HalfSafeError)."""
    found: list[LoraRequest] = []
    for match in _TAG.finditer(prompt):
        name, weight_text = match.group(1).strip(), (match.group(2) or "1").strip()
        try:
            weight = float(weight_text)
            found.append(LoraRequest(name, check_weight(weight, name)))
        except ValueError as error:
            message = (
                str(error)
                if "between" in str(error)
                else f"the weight {weight_text!r} of LoRA {name} is not a number"
            )
            raise HalfSafeError(f"In the prompt's <lora:{name}:...> tag, {message}.") from None
    return _TAG.sub("", prompt), found


def strip_tags(prompt: str) -> str:
    """The prompt the text encoder reads: LoRA tags removed (as A1111 does)."""
    return _TAG.sub("", prompt)


def prompt_with_tags(prompt: str, loras: Sequence[AppliedLora]) -> str:
    """The prompt as A1111 records it: every LoRA that ran as a `<lora:name:weight>` tag (those
    already in the prompt are left where the user put them)."""
    named = {Path(r.path).name.lower() for r in prompt_loras_quiet(prompt)}
    extra = [
        f"<lora:{a.name}:{_weight_text(a.weight)}>" for a in loras if a.name.lower() not in named
    ]
    if not extra:
        return prompt
    return (prompt.rstrip() + " " if prompt.strip() else "") + " ".join(extra)


def prompt_loras_quiet(prompt: str) -> list[LoraRequest]:
    with contextlib.suppress(HalfSafeError):
        return prompt_loras(prompt)[1]
    return []


def lora_hashes(loras: Sequence[AppliedLora]) -> str | None:
    """A1111's `Lora hashes` value: `name: shorthash, name2: shorthash`."""
    parts = [f"{a.name}: {a.file.short_hash}" for a in loras if a.file.short_hash]
    return ", ".join(parts) or None


def _weight_text(weight: float) -> str:
    return f"{weight:g}"


class OutsideModelFoldersError(HalfSafeError):
    """A prompt's `<lora:...>` tag names a file outside the model folders; it is not used."""


def find_lora(
    name: str, model_source: str | None = None, roots: Sequence[Path] | None = None
) -> Path:
    """The file a prompt's `<lora:name>` means: `name` (a LoRA suffix added unless it has one,
    subfolders allowed) in the model's folder or the Lora folders beside it, then in the
    library's folders (`roots`, default `library.library_roots()`) and the Lora folders
    beside them.

    A prompt may come from an image, so the name resolves only inside those folders
    (`limits.find_in_folders`): an absolute path, a `..` step or a link leading elsewhere
    raises OutsideModelFoldersError; a name no folder has raises HalfSafeError. Paths the user
    typed (--lora, the GUI's list) are not looked up here and may point anywhere."""
    suffixes = ("", *LORA_SUFFIXES) if name.lower().endswith(LORA_SUFFIXES) else LORA_SUFFIXES
    try:
        found = limits.find_in_folders(name, _lora_folders(model_source, roots), suffixes)
    except limits.OutsideFoldersError:
        shown = name if len(name) <= 200 else name[:197] + "..."
        raise OutsideModelFoldersError(
            f"The prompt's <lora:{shown}> names a file outside your model folders: not used."
        ) from None
    if found is None:
        raise HalfSafeError(
            f"The LoRA {name} named in the prompt was not found beside the model or in the "
            "library's Lora folders (give its path with --lora)."
        )
    return found


def _lora_folders(model_source: str | None, roots: Sequence[Path] | None) -> Iterator[Path]:
    """The folders a prompt's LoRA names resolve in: the model's own folder, the Lora folders
    in it and up to two folders above it (A1111 keeps models/Stable-diffusion/<sub>/x beside
    models/Lora), then every library folder and the Lora folders in it and beside it."""
    folders: list[Path] = []
    lora_parents: list[Path] = []
    if model_source:
        model = Path(model_source).expanduser()
        if model.is_file():
            folders.append(model.parent)
            lora_parents += list(model.parents)[:3]
    if roots is None:
        with contextlib.suppress(HalfSafeError, OSError):
            from app.core.library import library_roots

            roots = library_roots()
    for folder in roots or []:  # models/Stable-diffusion beside models/Lora
        folders.append(folder)
        lora_parents += [folder, folder.parent]
    candidates = [*folders, *(p / sub for p in lora_parents for sub in LORA_FOLDERS)]
    seen: set[Path] = set()
    for folder in candidates:
        if folder not in seen and folder.is_dir():
            seen.add(folder)
            yield folder


# --- reading and scanning ----------------------------------------------------------------------


def read_lora(path: str | Path, *, allow_pickle: bool = False) -> LoraFile:
    """Open a LoRA file, read every tensor and scan it: NaN/Inf, and elements past
    `ABSURD_ELEMENT` (each named). Raises BadFileError with one sentence for a file that is not
    a readable LoRA (malformed header, refused pickle, keys of no known LoRA layout)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise BadFileError(path, "the LoRA does not exist (no such file).")
    if path.is_dir():
        raise BadFileError(path, "a LoRA is one file, not a folder.")
    with Checkpoint(path, allow_pickle=allow_pickle) as checkpoint:
        keys = checkpoint.keys()
        if not any(marker in key for key in keys for marker in _KEY_MARKERS):
            raise BadFileError(
                path,
                "the file holds no LoRA weights (no lora_down/lora_up or lora_A/lora_B "
                "tensors), so it is not a LoRA.",
            )
        tensors: dict[str, Any] = {}
        non_finite: list[str] = []
        absurd: list[tuple[str, float]] = []
        with one_torch_thread():
            for key in keys:
                tensor = checkpoint.get(key)
                if not tensor.is_floating_point():
                    raise BadFileError(
                        path, f"the tensor {key} is not floating point, so it is no LoRA weight."
                    )
                if key.endswith(".alpha") and tensor.numel() != 1:
                    raise BadFileError(
                        path, f"the alpha {key} holds {tensor.numel()} numbers, not one."
                    )
                tensors[key] = tensor
                if not tensor_is_finite(tensor):
                    non_finite.append(key)
                elif tensor.numel() and (peak := float(tensor.abs().max())) > ABSURD_ELEMENT:
                    absurd.append((key, peak))
        checkpoint.check_unchanged()
        short_hash = _short_hash(checkpoint)
        metadata = dict(checkpoint.metadata)
    layout = "kohya" if any(k.startswith("lora_") for k in keys) else "diffusers"
    return LoraFile(
        path=path,
        name=_display_name(path),
        layout=layout,
        tensors=tensors,
        non_finite=non_finite,
        absurd=absurd,
        short_hash=short_hash,
        metadata=metadata,
    )


def _display_name(path: Path) -> str:
    name = path.name
    for suffix in LORA_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _short_hash(checkpoint: Checkpoint) -> str | None:
    """A1111's LoRA short hash: the first 12 hex digits of the sha256 of a safetensors file's
    data section (the header left out, so editing metadata keeps the hash; A1111 calls it the
    addnet hash). Pickles get the sha256 of the whole file."""
    try:
        with open(checkpoint.path, "rb") as handle:
            if checkpoint.header is not None:
                handle.seek(checkpoint.header.data_start)
            digest = hashlib.sha256()
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()[:12]


# --- applying --------------------------------------------------------------------------------


def apply_loras(
    pipeline,
    files: Sequence[tuple[LoraFile, float]],
    *,
    model: str = "this model",
    source: str | Path | None = None,
) -> list[AppliedLora]:
    """Load each LoRA into `pipeline` (in place) as its own peft adapter and activate them all
    at their weights. A file whose keys fit no layer of the model (`model`, its words in the
    sentence: "the SDXL model x.safetensors"; `source`, its file) gets one sentence naming it
    (BadFileError); one of whose layers the model has only some runs with those, its `fit_note`
    saying how many, unless the family it was made for can be told and is another
    (`refuse_told`). On any failure every adapter added here is removed again."""
    if len(files) > MAX_LORAS:
        raise HalfSafeError(f"At most {MAX_LORAS} LoRAs can be applied at once, not {len(files)}.")
    if not hasattr(pipeline, "load_lora_weights"):
        raise HalfSafeError(
            f"This model ({type(pipeline).__name__}) does not take LoRAs in HalfSafe yet."
        )
    applied: list[AppliedLora] = []
    before = set(_adapters(pipeline))
    taken = set(before)  # names given out here, those of a load that failed half-way included
    try:
        for index, (lora, weight) in enumerate(files):
            adapter = f"lora{index}_{re.sub(r'[^A-Za-z0-9_]', '_', lora.name)[:40]}"
            while adapter in taken:
                adapter += "_"
            taken.add(adapter)
            fit = LoraFit()
            try:
                _load_adapter(pipeline, lora, adapter, fit)
            except HalfSafeError:
                raise
            except Exception as error:  # noqa: BLE001 - any loader failure is this file's problem
                loaded = [part for part, names in _listed(pipeline).items() if adapter in names]
                raise BadFileError(lora.path, fit.refusal(model, error, loaded)) from None
            if adapter not in _adapters(pipeline) or not fit.applied:
                raise BadFileError(lora.path, fit.refusal(model))
            note = fit.note(lora.name, model)
            if note is not None:
                refuse_told(lora, pipeline, fit, model, source)
            applied.append(AppliedLora(lora, adapter, weight, fit.offered, fit.applied, note))
        use_weights(pipeline, applied)
    except BaseException:
        remove_loras(pipeline, [a.adapter for a in applied] + _new_adapters(pipeline, before))
        raise
    return applied


def reapply(pipeline, loras: Sequence[AppliedLora]) -> None:
    """Load `loras` into another pipeline (a fresh load of the same model) under the same
    adapter names, at their weights, so that the same `AppliedLora` list drives both."""
    for applied in loras:
        _load_adapter(pipeline, applied.file, applied.adapter)
    use_weights(pipeline, loras)


def _load_adapter(pipeline, lora: LoraFile, adapter: str, fit: LoraFit | None = None) -> None:
    """Load `lora` as the peft adapter `adapter` with every layer at its own alpha / rank; how
    much of it the model took goes into `fit`.

    diffusers is handed factors without alphas, so peft runs every layer at 1 (checked here:
    a layer that would not gets one sentence, HalfSafeError, rather than a strength the file
    does not give); then every layer of the adapter is set to the file's most common
    alpha / rank, which peft multiplies by the LoRA's weight after the layer's factors, as it
    did before; a layer whose own alpha / rank differs carries the ratio in its factors.
    Where diffusers' converter folds alphas into the factors itself, it is handed each layer's
    rank as its alpha, so that it scales by exactly 1 and nothing is scaled twice."""
    factors, common = adapter_factors(
        lora.tensors, ranks_as_alphas=_converter_folds(pipeline, lora)
    )
    fit = fit if fit is not None else LoraFit()
    with _quiet_loaders(), counting_layers(pipeline, fit):
        pipeline.load_lora_weights(factors, adapter_name=adapter)
    from peft.tuners.lora import LoraLayer

    layers = [
        (name, module)
        for component in getattr(pipeline, "components", {}).values()
        if hasattr(component, "named_modules")
        for name, module in component.named_modules()
        if isinstance(module, LoraLayer) and adapter in module.scaling
    ]
    for name, module in layers:
        if module.scaling[adapter] != 1.0 or module.use_rslora.get(adapter, False):
            raise HalfSafeError(
                f"The LoRA {lora.name} could not be applied at the strength its file gives "
                f"(its layer {name} would run at {module.scaling[adapter]:g} times its factors)."
            )
    for _, module in layers:
        # peft's set_scale makes the scaling weight * lora_alpha / r from these.
        module.lora_alpha[adapter] = common * module.r[adapter]
        module.scaling[adapter] = common
    fit.applied = len(layers)


def _converter_folds(pipeline, lora: LoraFile) -> bool:
    """Whether diffusers converts this file for this pipeline with a converter that folds each
    layer's alpha / rank into the factors itself, so that its alphas never reach peft: Flux's
    kohya (sd-scripts), "mixture" and ComfyUI converters, which diffusers picks for any file
    with a `.lora_down.weight` key. The mixture converter refuses a layer without its alpha."""
    from diffusers.loaders import FluxLoraLoaderMixin

    return isinstance(pipeline, FluxLoraLoaderMixin) and any(
        ".lora_down.weight" in key for key in lora.tensors
    )


def adapter_factors(
    tensors: dict[str, Any], *, ranks_as_alphas: bool = False
) -> tuple[dict[str, Any], float]:
    """The LoRA's tensors as HalfSafe hands them to diffusers, and the scale its adapter runs
    at: the most common alpha / rank of its layers (alpha = rank where a layer has none). Each
    layer whose own alpha / rank differs has the ratio folded into its factors, so that
    up' @ down' * common = up @ down * alpha / rank; every alpha is left out, or with
    `ranks_as_alphas` (for a converter that needs the alphas and folds them itself) set to the
    layer's rank, so that the converter's own alpha / rank is exactly 1. The ratio is split
    between the factors by a power of two (exact on `up`), keeping both in range. The input is
    not changed; unscaled factors are shared, not copied."""
    import torch

    layers: list[tuple[str, str, float]] = []  # (down key, up key, alpha / rank)
    out = dict(tensors)
    for down_key in tensors:
        for down_end, up_end in _FACTORS:
            if not down_key.endswith(down_end):
                continue
            layer = down_key[: -len(down_end)]
            up_key, alpha_key = layer + up_end, layer + ".alpha"
            down, alpha = tensors[down_key], tensors.get(alpha_key)
            if up_key not in tensors or down.ndim < 2 or down.shape[0] == 0:
                break  # a malformed layer is the loader's to refuse
            rank = down.shape[0]
            if ranks_as_alphas:
                out[alpha_key] = torch.tensor(float(rank))
            else:
                out.pop(alpha_key, None)
            layers.append((down_key, up_key, 1.0 if alpha is None else float(alpha) / rank))
            break
    usable = [scale for _, _, scale in layers if math.isfinite(scale) and scale != 0.0]
    common = Counter(usable).most_common(1)[0][0] if usable else 1.0
    for down_key, up_key, scale in layers:
        ratio = scale / common
        if ratio == 1.0:
            continue
        up_share = (
            2.0 ** round(math.log2(abs(ratio)) / 2) if math.isfinite(ratio) and ratio else 1.0
        )
        out[up_key] = tensors[up_key].to(torch.float32) * up_share
        out[down_key] = tensors[down_key].to(torch.float32) * (ratio / up_share)
    return out, common


def use_weights(pipeline, loras: Sequence[AppliedLora], weights: dict[str, float] | None = None):
    """Make exactly `loras` active, each at `weights[adapter]` (default: its own weight); the
    pipeline's other adapters are off. An empty list switches LoRAs off entirely."""
    weights = weights or {}
    if not loras:
        if _adapters(pipeline):
            pipeline.disable_lora()
        return
    pipeline.enable_lora()
    pipeline.set_adapters(
        [a.adapter for a in loras], [weights.get(a.adapter, a.weight) for a in loras]
    )


def remove_loras(pipeline, adapters: Sequence[str]) -> None:
    names = [a for a in dict.fromkeys(adapters) if a in _adapters(pipeline)]
    if names:
        pipeline.delete_adapters(names)


def _adapters(pipeline) -> list[str]:
    return sorted({name for names in _listed(pipeline).values() for name in names})


def _listed(pipeline) -> dict[str, list[str]]:
    """The adapters each part of the pipeline holds, by part."""
    try:
        return dict(pipeline.get_list_adapters())
    except (ValueError, AttributeError):
        return {}


def _new_adapters(pipeline, before: set[str]) -> list[str]:
    return [a for a in _adapters(pipeline) if a not in before]


@contextlib.contextmanager
def _quiet_loaders() -> Iterator[None]:
    """transformers reports the text encoder's own weights as 'missing' from a LoRA and draws
    a progress bar, diffusers says when a LoRA has no text-encoder part, and logs a load that
    failed (with peft's list of every layer it lacks) as an error: noise to a user, who gets
    the refusal's one sentence instead."""
    import logging as levels_of

    import diffusers
    import transformers

    loggers = (transformers.utils.logging, diffusers.utils.logging)
    levels = [logging.get_verbosity() for logging in loggers]
    bars = transformers.utils.logging.is_progress_bar_enabled()
    for logging in loggers:
        logging.set_verbosity(levels_of.CRITICAL)
    transformers.utils.logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            # peft warns that a second adapter is "multiple adapters": that is the design here.
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        for logging, level in zip(loggers, levels, strict=True):
            logging.set_verbosity(level)
        if bars:
            transformers.utils.logging.enable_progress_bar()


def load_requested(
    model,
    requests: Sequence[LoraRequest],
    *,
    allow_pickle: bool = False,
    prompt: str = "",
) -> list[AppliedLora]:
    """Make `model` run exactly the LoRAs of `requests` (flags, the GUI's list) and of the
    prompt's `<lora:...>` tags, each at its weight, and record them on the model
    (`model.loras`). A LoRA already loaded from the same file is reused (only its weight
    changes); one no longer asked for is removed. A LoRA named twice keeps the first weight.
    A tag naming a file outside the model folders is not used; its sentence is kept in
    `model.lora_warnings`, as is the sentence for a LoRA of which the model has only some
    layers (`AppliedLora.fit_note`); one of which it has none is refused. Every file is read
    and scanned before the model is touched, so a bad one changes nothing."""
    wanted = list(requests)
    refused: list[str] = []
    _, tagged = prompt_loras(prompt)
    for tag in tagged:
        try:
            wanted.append(LoraRequest(str(find_lora(tag.path, model.source)), tag.weight))
        except OutsideModelFoldersError as error:
            refused.append(str(error))
    if len(wanted) > MAX_LORAS:
        raise HalfSafeError(f"At most {MAX_LORAS} LoRAs can be applied at once, not {len(wanted)}.")
    current: dict[Path, AppliedLora] = {
        a.file.path.resolve(): a for a in getattr(model, "loras", [])
    }
    chosen: list[tuple[Path, float, LoraFile | None]] = []
    seen: set[Path] = set()
    for request in wanted:
        path = Path(request.path).expanduser()
        key = path.resolve()
        if key in seen:
            continue
        seen.add(key)
        file = None if key in current else read_lora(path, allow_pickle=allow_pickle)
        chosen.append((key, request.weight, file))
    new = [(file, weight) for _, weight, file in chosen if file is not None]
    for file, _ in new:
        check_made_for(file, model)
    words = loaded_model_words(model)
    added = iter(apply_loras(model.pipeline, new, model=words, source=model.source) if new else [])
    result: list[AppliedLora] = []
    for key, weight, file in chosen:
        result.append(next(added) if file is not None else replace(current[key], weight=weight))
    remove_loras(model.pipeline, [a.adapter for k, a in current.items() if k not in seen])
    model.loras = result
    model.lora_warnings = refused + [a.fit_note for a in result if a.fit_note]
    use_weights(model.pipeline, result)
    return result
