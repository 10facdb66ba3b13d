"""The fixes the nodes prove, kept in HalfSafe's store of remembered fixes (`profiles.json`, the
file the desktop app reads and writes), under the keys the desktop uses: the model file's
identity as HalfSafe's own loader computes it, and the device as HalfSafe names it. A fix
proved by either is found by both."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .host import COMPONENT, PREFIX, device_name, diffusion_model, halfsafe_name, halfsafe_names


def _loaded_from(patcher) -> Path | None:
    """The file ComfyUI's loader read a MODEL or a VAE's patcher from (its reload recipe
    names it first: the checkpoint, diffusion-model or VAE file)."""
    recipe = getattr(patcher, "cached_patcher_init", None)
    try:
        path = Path(recipe[1][0])  # type: ignore[index]
    except (TypeError, IndexError, KeyError):
        return None
    return path if path.is_file() else None


def model_file(model) -> Path | None:
    """The file ComfyUI's loader read this MODEL from."""
    return _loaded_from(model)


def vae_file(vae) -> Path | None:
    """The file ComfyUI's loader read this VAE from: a VAE file, or the checkpoint that carried
    it."""
    return _loaded_from(getattr(vae, "patcher", None))


def clip_file(clip) -> Path | None:
    """The single checkpoint ComfyUI's loader read this CLIP from; None for a CLIP of text
    encoder files of their own (its recipe names a list of them)."""
    return _loaded_from(getattr(clip, "patcher", None))


def profile_key(model, notes: list[str]) -> str | None:
    """The store's key for the file this MODEL was loaded from (`file_key`). None, with a
    sentence in `notes`, where ComfyUI does not say which file it is."""
    path = model_file(model)
    if path is None:
        notes.append("ComfyUI does not say which file this model was loaded from.")
        return None
    return file_key(path, notes)


def vae_key(vae, notes: list[str]) -> str | None:
    """The store's key for the file this VAE was loaded from (`file_key`), as `profile_key`."""
    path = vae_file(vae)
    if path is None:
        notes.append("ComfyUI does not say which file this VAE was loaded from.")
        return None
    return file_key(path, notes)


def file_key(path: Path, notes: list[str]) -> str | None:
    """The store's key for `path`: the identity HalfSafe's loader gives a checkpoint it loads
    alone (`single_file.file_profile_key`), so the fix is shared with the app; else, for a file
    the app loads only with others or not at all (a diffusion model's file with its text
    encoders and VAE in other files, a VAE file), the file's own identity
    (`identity.file_key`), under which the app keeps each part's share of the fixes of the
    models it loads from that file. Both are cached for the unchanged file, so only the first
    check of a file reads it whole. None, with a sentence in `notes`, for a file HalfSafe finds
    damaged or cannot read."""
    from app.core.errors import HalfSafeError, UnsupportedModelError
    from app.core.models.identity import file_key as own_key
    from app.core.models.single_file import file_profile_key

    try:
        try:
            return file_profile_key(path)
        except UnsupportedModelError:
            return own_key(path)
    except HalfSafeError as error:
        problem = getattr(error, "problem", str(error))
        notes.append(f"HalfSafe cannot name {path.name} ({problem.rstrip('.')}).")
    except OSError as error:
        notes.append(f"HalfSafe could not read {path} to name it: {error.strerror or error}.")
    return None


# The settings of a remembered fix that HalfSafe Fix applies to the MODEL; the VAE's, which it
# applies to its VAE; and the text encoders', which are not the nodes' to take.
APPLIED = ("unet_precision", "fp32_modules", "bf16_modules", "clamp_modules")
VAE_SETTINGS = ("vae_precision", "no_half_vae")
OTHER_PARTS = (
    "text_encoder_precision",
    "text_encoder_2_precision",
    "text_encoder_3_precision",
    "prompt_upsampler_precision",
)
MODULE_LISTS = ("fp32_modules", "bf16_modules", "clamp_modules")
VAE_COMPONENT = "vae"  # the VAE's component in a remembered fix (its settings' vae:PATH)


def _role(component: str):
    from app.core.components import COMPONENTS

    found = COMPONENTS.get(component)
    return found.role if found else None


def _is_denoiser(component: str) -> bool:
    from app.core.components import Role

    return _role(component) is Role.DENOISER


def fix_settings(model, fix: dict, notes: list[str] | None = None) -> dict:
    """A proved fix's diffusion-model part as HalfSafe's settings: islands as
    `fp32_modules`/`bf16_modules` (COMPONENT:PATH in HalfSafe's names where the model has
    them: an SD UNet's through ComfyUI's own map, a transformer file's through its layout's
    key table, `_layout_names`), a whole component as `unet_precision`, an attention switch as
    `attention_backend` (`attention.SETTING`). Where HalfSafe's names hold the island in a
    wider module, a sentence in `notes` says so."""
    from .attention import SETTING

    switch = {"attention_backend": SETTING[fix["attention"]]} if fix.get("attention") else {}
    if fix.get("component"):
        return {"unet_precision": fix["component"], **switch}
    module = diffusion_model(model)
    names = halfsafe_names(model)
    islands = fix.get("islands") or {}
    layout = None if names or not islands else _layout_names(model)
    mapped = None if layout is None else _translated(islands, layout.to_diffusers)
    settings: dict = {}
    if mapped is not None and not mapped.missing:  # else kept in ComfyUI's names
        if notes is not None:
            notes.extend(_widened_words(mapped, "HalfSafe's app"))
        if mapped.component:
            settings["unet_precision"] = mapped.component
        for path, dtype in mapped.islands.items():
            settings.setdefault(f"{dtype}_modules", []).append(f"{TRANSFORMER}:{path}")
        return {**settings, **switch}
    for path, dtype in islands.items():
        named = halfsafe_name(names, module, path) or f"{PREFIX}.{path}"
        settings.setdefault(f"{dtype}_modules", []).append(f"{COMPONENT}:{named}")
    return {**settings, **switch}


def fix_from_settings(model, settings: dict, notes: list[str]) -> dict | None:
    """A remembered fix's diffusion-model part as the nodes' fix, in ComfyUI's module paths:
    None, with a sentence in `notes`, where it needs what HalfSafe Fix cannot do in ComfyUI or
    names a layer this model does not have (then it is not this model's fix)."""
    from .attention import SETTING

    switches = {stored: backend for backend, stored in SETTING.items()}
    backend = settings.get("attention_backend")
    beyond = [
        k
        for k, v in settings.items()
        if k not in APPLIED + VAE_SETTINGS + OTHER_PARTS
        and v
        and not (k == "attention_backend" and v in switches)
    ]
    if beyond:
        notes.append(
            f"The remembered fix needs {', '.join(beyond)}, which HalfSafe Fix cannot apply "
            "inside ComfyUI yet: it is not used."
        )
        return None
    if any(settings.get(k) not in (None, False, "auto") for k in OTHER_PARTS):
        notes.append("Its text encoders' part is for their own loaders, not the MODEL.")
    fix: dict = {
        "component": None,
        "islands": {},
        "clamps": [],
        "attention": switches.get(str(backend)),
    }
    if settings.get("unet_precision") in ("fp32", "bf16"):
        fix["component"] = settings["unet_precision"]
    paths = _comfy_paths(model)
    theirs: dict[str, str] = {}  # layers named as ComfyUI does not: name -> dtype or "clamp"
    for key in MODULE_LISTS:
        for entry in settings.get(key) or []:
            component, _, named = str(entry).partition(":")
            if not _is_denoiser(component):
                continue
            path = (
                named.removeprefix(PREFIX + ".")
                if named.startswith(PREFIX + ".")
                else paths.get(named)
            )
            wanted = "clamp" if key == "clamp_modules" else key.removesuffix("_modules")
            if path is None:
                held = theirs.get(named)
                theirs[named] = wanted if held in (None, "clamp") else _wider(held, wanted)
            elif key == "clamp_modules":
                fix["clamps"].append(path)
            else:
                fix["islands"][path] = _wider(fix["islands"].get(path), wanted)
    if theirs and not _from_layout(model, theirs, fix, notes):
        return None
    return fix if fix["component"] or fix["islands"] or fix["clamps"] or fix["attention"] else None


def _from_layout(model, theirs: dict[str, str], fix: dict, notes: list[str]) -> bool:
    """Add to `fix` the layers a remembered fix names in diffusers' names (`theirs`: each
    layer's dtype, or "clamp"), in ComfyUI's names through the key table of the layout
    the model's file is in; False, with a sentence in `notes`, where one of them is not a layer
    of this model (then the fix is not this model's), or is a clamp: a clamp holds a layer's
    values to fp16's range for the code after it, which ComfyUI's layout computes with its own
    code (the tiny Flux.1's query clamped in ComfyUI stays as wrong as without it)."""
    layout = _layout_names(model)
    module = diffusion_model(model)
    clamps = [named for named, wanted in theirs.items() if wanted == "clamp"]
    islands = {named: wanted for named, wanted in theirs.items() if wanted != "clamp"}
    mapped = None if layout is None else _translated(islands, layout.to_original)
    missing = list(islands) if mapped is None else list(mapped.missing)
    if mapped is not None:
        missing += [p for p in mapped.islands if not _has(module, p)]
    if clamps and layout is not None:
        notes.append(
            f"The remembered fix clamps {clamps[0]}, proved with what HalfSafe's app computes "
            "after that layer, which ComfyUI's code computes otherwise: it is not used. "
            "HalfSafe Check proves a fix as ComfyUI runs the model."
        )
        return False
    missing += clamps
    if missing:
        notes.append(
            f"The remembered fix names {missing[0]}, a layer this model does not have: it is "
            "not used."
        )
        return False
    if mapped is not None:
        notes.extend(_widened_words(mapped, "ComfyUI"))
        _merged(fix["islands"], mapped.islands)
        if mapped.component:
            fix["component"] = _wider(fix["component"], mapped.component)
            fix["islands"] = _beyond(fix["islands"], fix["component"])
    return True


def _has(module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


# --- a transformer file's layers in diffusers' names ------------------------------------------

TRANSFORMER = "transformer"  # HalfSafe's component of a transformer file's model
_WIDER = ("bf16", "fp32")  # the wider of two island dtypes is the later


@dataclass
class _Translated:
    """Islands (path -> "fp32"|"bf16") in the other layout's names; the whole model's dtype
    where one of them is held by no smaller module there; the layers the table does not map;
    and each layer that the other layout computes only together with more beside it (its name
    and the modules kept wider for it)."""

    islands: dict[str, str]
    component: str | None
    missing: list[str]
    widened: list[tuple[str, tuple[str, ...]]]


def _layout_names(model):
    """The names of this model's layers in diffusers' layout and its original one
    (`layer_names.LayerNames`), where ComfyUI loaded it from a transformer file in a layout
    HalfSafe reads and built its modules under that layout's names; else None."""
    from app.core.checkpoint import Checkpoint
    from app.core.errors import HalfSafeError
    from app.core.formats.layer_names import LayerNames
    from app.core.models.transformer_files import split_model

    path = model_file(model)
    if path is None:
        return None
    try:
        with Checkpoint(path) as checkpoint:
            read = split_model(path, checkpoint.shapes)
    except (HalfSafeError, OSError, ValueError):
        return None
    if read is None:
        return None
    names = LayerNames(read.rows())
    held = {path for path, _ in diffusion_model(model).named_modules()}
    return names if names.original_layers <= held else None


def _translated(islands: dict[str, str], mapping) -> _Translated | None:
    """`islands` through `mapping` (`LayerNames.to_diffusers` or `to_original`), an island
    the other layout holds only with more beside it in fp32; None where it maps none of
    them."""
    from app.core.formats.layer_names import WHOLE

    found = _Translated({}, None, [], [])
    for path, dtype in islands.items():
        mapped = mapping(path)
        if mapped is None:
            found.missing.append(path)
            continue
        if mapped.widened:  # more layers than proved: in fp32, which keeps more than fp16
            found.widened.append((path, mapped.paths))
            dtype = "fp32"
        if WHOLE in mapped.paths:
            found.component = _wider(found.component, dtype)
        else:
            _merged(found.islands, dict.fromkeys(mapped.paths, dtype))
    if found.component:
        found.islands = _beyond(found.islands, found.component)
    if len(found.missing) == len(islands):
        return None
    return found


def _wider(one: str | None, other: str) -> str:
    return other if one is None else max(one, other, key=_WIDER.index)


def _beyond(islands: dict[str, str], component: str) -> dict[str, str]:
    """The islands still wider than the whole model computing in `component`."""
    return {p: d for p, d in islands.items() if _WIDER.index(d) > _WIDER.index(component)}


def _merged(islands: dict[str, str], more: dict[str, str]) -> dict[str, str]:
    """`islands` with `more` added (in place): a layer named twice, or inside another, is kept
    in the wider dtype of the two, once, by its outermost module."""
    for path, dtype in more.items():
        islands[path] = _wider(islands.get(path), dtype)
    for path in sorted(islands, key=len):
        outer = next((o for o in islands if path.startswith(o + ".")), None)
        if outer is not None:
            islands[outer] = _wider(islands[outer], islands.pop(path))
    return islands


def _widened_words(mapped: _Translated, where: str) -> list[str]:
    """One sentence for each layer `where` computes only with more beside it."""
    from app.core.formats.layer_names import WHOLE

    said = []
    for path, paths in mapped.widened:
        kept = "the whole diffusion model" if WHOLE in paths else ", ".join(paths)
        said.append(
            f"{where} computes {path} only together with more beside it: {kept} is kept in "
            "fp32 for it, more than the proved fix and at least as close to fp32 (bf16 keeps "
            "fewer digits than fp16, so more layers in bf16 would not be)."
        )
    return said


def _comfy_paths(model) -> dict[str, str]:
    """HalfSafe's name of each module of the diffusion model -> ComfyUI's path."""
    module = diffusion_model(model)
    names = halfsafe_names(model)
    paths: dict[str, str] = {}
    for path, _ in module.named_modules():
        named = halfsafe_name(names, module, path) if path else None
        if named:
            paths.setdefault(named, path)
    return paths


# --- the VAE's part --------------------------------------------------------------------------

# ComfyUI's image VAE (its `Encoder`/`Decoder`) in HalfSafe's (diffusers') names: a level's
# blocks and its resampler, the middle's two blocks and attention, and the leaves named apart.
_LEVEL = re.compile(r"^(encoder\.down|decoder\.up)\.(\d+)(?=\.|$)")
_IN_LEVEL = (
    (re.compile(r"^\.block\.(\d+)"), r".resnets.\1"),
    (re.compile(r"^\.attn\.(\d+)"), r".attentions.\1"),
    (re.compile(r"^\.(up|down)sample(?=\.|$)"), r".\1samplers.0"),
)
_MIDDLE = (
    (re.compile(r"\.mid\.block_([12])(?=\.|$)"), lambda m: f".mid_block.resnets.{int(m[1]) - 1}"),
    (re.compile(r"\.mid\.attn_1(?=\.|$)"), lambda m: ".mid_block.attentions.0"),
)
_LEAVES = {"nin_shortcut": "conv_shortcut", "norm_out": "conv_norm_out"}
_ATTENTION_LEAVES = {
    "q": "to_q",
    "k": "to_k",
    "v": "to_v",
    "proj_out": "to_out.0",
    "norm": "group_norm",
}
_NO_COUNTERPART = ("swish", "dropout", "regularization")


def vae_names(module) -> dict[str, str]:
    """ComfyUI path -> HalfSafe's name of each layer of an image VAE's autoencoder (`module`);
    empty for a VAE of another kind (its layers are then stored in ComfyUI's names)."""
    import torch

    decoder = getattr(module, "decoder", None)
    levels = getattr(decoder, "up", None)
    if not isinstance(levels, torch.nn.ModuleList) or not hasattr(decoder, "mid"):
        return {}
    names = {}
    for path, _ in module.named_modules():
        named = _vae_name(path, len(levels)) if path else None
        if named:
            names[path] = named
    return names


def _vae_name(path: str, levels: int) -> str | None:
    if any(part in _NO_COUNTERPART for part in path.split(".")):
        return None
    level = _LEVEL.match(path)
    if level:
        index = int(level[2])
        if level[1] == "decoder.up":  # ComfyUI counts the decoder's levels from the smallest
            index = levels - 1 - index
        stem = level[1].replace(".up", ".up_blocks").replace(".down", ".down_blocks")
        rest = path[level.end() :]
        for pattern, replacement in _IN_LEVEL:
            rest = pattern.sub(replacement, rest, count=1)
        path = f"{stem}.{index}{rest}"
    for pattern, replacement in _MIDDLE:
        path = pattern.sub(replacement, path)
    parts = path.split(".")
    in_attention = "attentions" in parts
    leaves = _ATTENTION_LEAVES if in_attention and parts[-1] in _ATTENTION_LEAVES else _LEAVES
    parts[-1] = leaves.get(parts[-1], parts[-1])
    return ".".join(parts)


def vae_fix_settings(vae, fix: dict) -> dict:
    """A proved VAE fix as HalfSafe's settings: its islands as `fp32_modules`/`bf16_modules`
    (vae:PATH in HalfSafe's names where the VAE has them, else in ComfyUI's), the whole VAE
    as `vae_precision`."""
    from .parts import VAE_PREFIX

    if fix.get("component"):
        return {"vae_precision": fix["component"]}
    names = vae_names(vae.first_stage_model)
    settings: dict[str, list[str]] = {}
    for path, dtype in (fix.get("islands") or {}).items():
        named = names.get(path) or f"{VAE_PREFIX}.{path}"
        settings.setdefault(f"{dtype}_modules", []).append(f"{VAE_COMPONENT}:{named}")
    return settings


def vae_fix_from_settings(vae, settings: dict, notes: list[str]) -> dict | None:
    """A remembered fix's VAE part as the nodes' VAE fix, in ComfyUI's module paths (None where
    it has none); None, with a sentence in `notes`, where it names a layer this VAE does not
    have (then it is not this VAE's fix)."""
    from .parts import VAE_PREFIX

    fix: dict = {"islands": {}, "component": None}
    if settings.get("no_half_vae") is True:
        fix["component"] = "fp32"
    elif settings.get("vae_precision") in ("fp32", "bf16"):
        fix["component"] = settings["vae_precision"]
    paths = {named: path for path, named in vae_names(vae.first_stage_model).items()}
    for key in ("fp32_modules", "bf16_modules"):
        for entry in settings.get(key) or []:
            component, _, named = str(entry).partition(":")
            if component != VAE_COMPONENT:
                continue
            if named.startswith(VAE_PREFIX + "."):
                path = named.removeprefix(VAE_PREFIX + ".")
            else:
                path = paths.get(named)
            if path is None:
                notes.append(
                    f"The remembered fix names the VAE layer {named}, which this VAE does not "
                    "have: its VAE part is not used."
                )
                return None
            fix["islands"][path] = key.removesuffix("_modules")
    return fix if fix["component"] or fix["islands"] else None


# --- the text encoders' part -----------------------------------------------------------------

TEXT_ENCODER_PART = "text_encoder"  # the part's name in the nodes' fix and a stored entry


def _text_encoder_components(path: Path) -> list[str]:
    """The text encoders (HalfSafe's component names) HalfSafe reads in the checkpoint `path`,
    from its header alone; none where HalfSafe does not load it."""
    from app.core.checkpoint import Checkpoint
    from app.core.errors import HalfSafeError
    from app.core.families.registry import detect_architecture

    try:
        with Checkpoint(path) as checkpoint:
            detection = detect_architecture(
                checkpoint.shapes, metadata=checkpoint.metadata, name=path.name
            )
    except (HalfSafeError, OSError, ValueError):
        return []
    return [layout.component for layout in detection.text_encoders] if detection.supported else []


def text_encoder_fix_settings(path: Path) -> dict:
    """The text-encoder fix HalfSafe Check proves (the CLIP's every encoder in fp32) as
    HalfSafe's settings for the checkpoint `path`: each of its text encoders' precision; empty
    where HalfSafe reads no text encoder in it."""
    from app.core.components import COMPONENTS

    return {COMPONENTS[c].setting: "fp32" for c in _text_encoder_components(path)}


def text_encoder_fix_from_settings(settings: dict, path: Path, notes: list[str]) -> dict | None:
    """A remembered fix's text-encoder share as the nodes' fix for the CLIP of the checkpoint
    `path`: the whole CLIP in fp32, the one fix HalfSafe Fix puts on a CLIP, which holds every
    narrower one (a layer or one of its encoders kept wider, bf16); None where the share is
    empty."""
    from app.core.fixing.file_fixes import text_encoder_settings

    share = text_encoder_settings(settings, upsampler=False)
    if not share:
        return None
    if share != text_encoder_fix_settings(path):
        notes.append(
            "The remembered fix keeps part of the text encoder wider; HalfSafe Fix runs the "
            "whole CLIP in fp32, which holds it."
        )
    return {"islands": {}, "component": "fp32"}


# --- remembering -----------------------------------------------------------------------------


def remember(
    model, fix: dict, summary: str, made_at: dict, notes: list[str], vae=None, clip=None
) -> None:
    """Store a proved fix for this model file on this device, its VAE part (`fix["vae"]`)
    for the file `vae` was loaded from (the checkpoint that carried it, or a VAE file), and its
    text-encoder part (`fix["text_encoder"]`) for the checkpoint `clip` was loaded from: one
    entry where they are one file. A part this check did not prove keeps what that file's
    entry held for it. A sentence in `notes` when a file cannot be named or the store cannot
    be written."""
    from .parts import _dtype_name

    wanted: dict[tuple[str, str], dict] = {}
    if any(fix.get(k) for k in ("component", "islands", "clamps", "attention")):
        said: list[str] = []
        key = profile_key(model, said)
        if key is None:
            notes.append(f"The fix is not remembered: {' '.join(said)}")
        else:
            place = wanted.setdefault((key, device_name(model)), _empty_entry())
            settings = fix_settings(model, fix, notes)
            named = [e for k in MODULE_LISTS for e in settings.get(k, [])]
            part = TRANSFORMER if any(e.startswith(TRANSFORMER + ":") for e in named) else COMPONENT
            _add(place, settings, summary, made_at, part)
    if fix.get("vae") and vae is not None:
        said = []
        key = vae_key(vae, said)
        if key is None:
            notes.append(f"The VAE's fix is not remembered: {' '.join(said)}")
        else:
            place = wanted.setdefault((key, _device_words(vae.device)), _empty_entry())
            proved_at = {"vae_precision": _dtype_name(vae.vae_dtype)}
            _add(
                place,
                vae_fix_settings(vae, fix["vae"]),
                fix["vae"]["summary"],
                proved_at,
                VAE_COMPONENT,
            )
    if fix.get(TEXT_ENCODER_PART) and clip is not None:
        _remember_text_encoder(model, clip, fix[TEXT_ENCODER_PART], wanted, notes)
    for (key, device), entry in wanted.items():
        _store(key, device, entry, notes)


def _remember_text_encoder(model, clip, part: dict, wanted: dict, notes: list[str]) -> None:
    """Add the text-encoder part to the entry of the checkpoint `clip` came from, under the
    device the model runs on (the desktop keys a checkpoint's every part by it)."""
    path = clip_file(clip)
    if path is None:
        notes.append(
            "The text encoder's fix is not remembered: HalfSafe keys it by the checkpoint "
            "that carries the CLIP, and this CLIP came from text-encoder files of their own."
        )
        return
    said: list[str] = []
    key = file_key(path, said)
    settings = text_encoder_fix_settings(path) if key else {}
    if not settings:
        why = " ".join(said) or f"HalfSafe reads no text encoder in {path.name}."
        notes.append(f"The text encoder's fix is not remembered: {why}")
        return
    place = wanted.setdefault((key, device_name(model)), _empty_entry())
    _add(place, settings, part["summary"], {}, TEXT_ENCODER_PART)


def _empty_entry() -> dict:
    return {"settings": {}, "summaries": [], "made_at": {}, "parts": []}


def _add(entry: dict, settings: dict, summary: str, made_at: dict, component: str) -> None:
    from app.core.fixing.file_fixes import join

    join(entry["settings"], settings)
    entry["summaries"].append(summary)
    entry["made_at"].update(made_at)
    entry["parts"].append(component)


def _kept_parts(kept: dict, proved: list[str], held: tuple[str, ...]) -> list[str]:
    """The parts a kept share speaks for, one name a role: the stored entry's own name for it
    (a transformer, a prompt upsampler), else the nodes' ("unet", "vae", "text_encoder")."""
    from app.core.fixing import file_fixes

    def share(part: str) -> dict:
        if _role(part) is _role(TEXT_ENCODER_PART):
            return file_fixes.text_encoder_settings({**kept}, upsampler=False)
        return file_fixes.part_settings(kept, part)

    named = {_role(p) for p in proved}
    found: list[str] = []
    for part in (*held, COMPONENT, VAE_COMPONENT, TEXT_ENCODER_PART):
        role = _role(part)
        upsampler = part == "prompt_upsampler" and kept.get("prompt_upsampler_precision")
        if role not in named and (upsampler or share(part)):
            named.add(role)
            found.append(part)
    return found


def _store(key: str, device: str, entry: dict, notes: list[str]) -> None:
    """Write `entry` under this file and device, keeping what was stored there beside the parts
    it proves (`file_fixes.kept_beside`), read under the lock the write takes."""
    from dataclasses import replace

    from app.core.fixing import file_fixes, profiles
    from app.core.precision.words import fix_words

    proved = list(entry["parts"])

    def beside(held, fix):
        if held is None:
            return fix
        # Every share of the stored entry but those of the parts proved now (the new fix's own
        # values win where both set one): nothing already saved is lost.
        kept = file_fixes.kept_beside(held.settings, proved, held.parts)
        kept = {k: v for k, v in kept.items() if k in MODULE_LISTS or k not in fix.settings}
        if not kept:
            return fix
        settings = dict(fix.settings)
        file_fixes.join(settings, kept)
        # Said from the share itself: the held summary also speaks of the parts replaced.
        summary = f"{fix.summary} Kept from the fix remembered before: {fix_words(kept)}."
        return replace(
            fix,
            settings=settings,
            summary=summary,
            made_at={**held.made_at, **fix.made_at},
            parts=(*fix.parts, *_kept_parts(kept, proved, held.parts)),
        )

    profiles.remember_fix(
        key,
        device,
        dict(entry["settings"]),
        " ".join(dict.fromkeys(entry["summaries"])),
        "health check",
        made_at=dict(entry["made_at"]),
        parts=tuple(proved),
        warn=notes.append,
        beside=beside,
    )


def _device_words(device) -> str:
    import torch

    from app.core.hardware.devices import describe_device

    return describe_device(torch.device(device)).name


def remembered(model, notes: list[str], vae=None, clip=None) -> dict | None:
    """The fix remembered for this model file on this device, as the nodes' fix, with its VAE
    part (`fix["vae"]`) where `vae` is given and a fix is remembered for the file it was
    loaded from, and its text-encoder part (`fix["text_encoder"]`) where `clip` is given and
    one is remembered for the checkpoint it came from (None, with a sentence in `notes`, where
    there is none to use). Without them, only the diffusion model's part."""
    from app.core.fixing import file_fixes, profiles

    fix = None
    said: list[str] = []
    key = profile_key(model, said)
    if key is None:
        notes.append(f"No remembered fix: {' '.join(said)}")
    else:
        found = profiles.lookup(key, device_name(model))
        notes.extend(found.notes)
        if found.fix is not None:
            fix = fix_from_settings(model, dict(found.fix.settings), notes)
            if fix is not None:
                fix["summary"] = found.fix.summary
            if vae is None and file_fixes.part_settings(found.fix.settings, VAE_COMPONENT):
                notes.append(
                    "The remembered fix has a VAE part: connect the VAE to HalfSafe Fix to "
                    "apply it."
                )
            if clip is None and file_fixes.text_encoder_settings(
                found.fix.settings, upsampler=False
            ):
                notes.append(
                    "The remembered fix has a text-encoder part: connect the CLIP to "
                    "HalfSafe Fix to apply it."
                )
    for name, given, find in (
        ("vae", vae, _remembered_vae),
        (TEXT_ENCODER_PART, clip, lambda c, n: _remembered_text_encoder(model, c, n)),
    ):
        part = find(given, notes) if given is not None else None
        if part is None:
            continue
        fix = fix or {"component": None, "islands": {}, "clamps": [], "attention": None}
        fix.setdefault("summary", part["summary"])
        fix[name] = part
    return fix


def _remembered_text_encoder(model, clip, notes: list[str]) -> dict | None:
    """The text-encoder part of the fix remembered for the checkpoint `clip` came from (None
    where there is none, or the CLIP came from files of its own)."""
    from app.core.fixing import profiles

    path = clip_file(clip)
    if path is None:
        return None
    said: list[str] = []
    key = file_key(path, said)
    if key is None:
        notes.append(f"No remembered fix for the text encoder: {' '.join(said)}")
        return None
    found = profiles.lookup(key, device_name(model))
    if found.fix is None:
        return None
    part = text_encoder_fix_from_settings(dict(found.fix.settings), path, notes)
    if part is not None:
        part["summary"] = found.fix.summary
    return part


def _remembered_vae(vae, notes: list[str]) -> dict | None:
    """The VAE part of the fix remembered for the file `vae` was loaded from (None where there
    is none to use)."""
    from app.core.fixing import profiles

    said: list[str] = []
    key = vae_key(vae, said)
    if key is None:
        notes.append(f"No remembered fix for the VAE: {' '.join(said)}")
        return None
    found = profiles.lookup(key, _device_words(vae.device))
    notes.extend(n for n in found.notes if n not in notes)
    if found.fix is None:
        return None
    part = vae_fix_from_settings(vae, dict(found.fix.settings), notes)
    if part is not None:
        part["summary"] = found.fix.summary
    return part
