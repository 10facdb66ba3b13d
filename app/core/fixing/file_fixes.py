"""The share of a remembered fix that belongs to one file: the parts a file holds on its own.

A model's key covers every file it was loaded from (`identity.Identity`): a transformer file
and the text encoders and VAE beside it. A host that loads one of those files alone (ComfyUI's
diffusion-model and VAE loaders) can name only that file (`identity.file_key`). So a fix the
store keeps for the model is also kept, part by part, under the key of the file each part came
from, and a model with no fix of its own takes the parts its files have. Which files a model's
key is made of is noted by its loader for the process (`link_files`): every job on that model
runs in the process that loaded it.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from app.core.components import COMPONENTS, Role
from app.core.fixing.remembered_fix import RememberedFix

# A setting of one part that is no per-component precision setting: the VAE's fp32 switch; the
# attention backend and upcast, which a fix proved on the denoiser sets (its attention is where
# a kernel fault is found).
_PART_FLAGS = {
    Role.VAE: ("no_half_vae",),
    Role.DENOISER: ("attention_backend", "upcast_attention"),
}
_MODULE_LISTS = ("fp32_modules", "bf16_modules", "clamp_modules")
# Models are few in one process: the table stays as small as the models loaded.
_LINKED: dict[str, dict[str, str]] = {}
_LOCK = threading.Lock()


def link_files(profile_key: str, file_keys: Mapping[str, str]) -> None:
    """Note, for this process, that the model keyed `profile_key` has components of its own
    files: `file_keys` maps each such component ("transformer", "vae") to its file's key."""
    shared = {c: k for c, k in file_keys.items() if _role(c) in _PART_FLAGS and k}
    if shared:
        with _LOCK:
            _LINKED[profile_key] = shared


def linked(profile_key: str) -> dict[str, str]:
    """The components of the model keyed `profile_key` that have a file of their own, with
    that file's key (empty where none was noted)."""
    with _LOCK:
        return dict(_LINKED.get(profile_key, {}))


def _role(component: str) -> Role | None:
    found = COMPONENTS.get(component)
    return found.role if found else None


def part_settings(settings: Mapping[str, Any], component: str) -> dict[str, Any]:
    """The settings of a fix that belong to `component` (or to another component of the same
    role: a UNet's and a transformer's are one setting): its precision setting, its flags, and
    its layers in the module lists."""
    role = _role(component)
    if role is None or role not in _PART_FLAGS:
        return {}
    own = {c.setting for c in COMPONENTS.values() if c.role is role}
    share: dict[str, Any] = {}
    for name, value in settings.items():
        if name in _MODULE_LISTS:
            entries = [e for e in value if _role(str(e).partition(":")[0]) is role]
            if entries:
                share[name] = entries
        elif (name in own or name in _PART_FLAGS[role]) and value not in ("auto", False, None):
            share[name] = value
    return share


def _setting_role(component: str) -> Role | None:
    """The role whose setting and file govern `component`'s layers: the denoiser's for a part
    that borrows its setting (Anima's text conditioner, kept in the diffusion model's file)."""
    found = COMPONENTS.get(component)
    if found is None:
        return None
    return Role.DENOISER if found.borrows_setting else found.role


def text_encoder_settings(settings: Mapping[str, Any], upsampler: bool = True) -> dict[str, Any]:
    """The text encoders' share of a fix's settings (with a prompt upsampler's, where
    `upsampler`): their own precision settings (not one a part borrows from the denoiser), the
    switches of the layers their kinds keep wider (T5's feed-forward), and their layers in the
    module lists."""
    from app.core.encoders.kinds import OWN_ISLANDS

    roles = (Role.TEXT_ENCODER, Role.PROMPT_UPSAMPLER) if upsampler else (Role.TEXT_ENCODER,)
    own = {c.setting for c in COMPONENTS.values() if c.role in roles and not c.borrows_setting}
    own |= {island.setting for island in OWN_ISLANDS}
    share: dict[str, Any] = {}
    for name, value in settings.items():
        if name in _MODULE_LISTS:
            entries = [e for e in value or [] if _setting_role(str(e).partition(":")[0]) in roles]
            if entries:
                share[name] = entries
        elif name in own and value not in ("auto", None, False):
            share[name] = value
    return share


# The settings of a whole job, every part at once: a new fix for some parts stands in for them
# (`kept_beside` hands the others' share of everything in fp32 to those parts).
_WHOLE_JOB = ("no_half", "precision")


def kept_beside(
    settings: Mapping[str, Any], proved: Collection[str], held_parts: Collection[str] = ()
) -> dict[str, Any]:
    """What a stored fix's `settings` keep beside a new fix proved for the parts `proved`: a
    new fix for a part replaces that part's own share (its precision setting, its own switch,
    its layers), and nothing else already saved is lost:
    - every other part's share, the layers of the VAE's encoder among them where only its
      decode was proved (`components.runs_layer`);
    - every switch every part runs under (attention upcast, another kernel, CUDA's reduced
      precision sums off), which a fix found for any part may have set, the group each fix sets
      kept whole;
    - everything in fp32 (`no_half`) as each other part of `held_parts` (the stored fix's
      parts) in fp32.
    A setting left at its default is not kept, but a switch turned off is: it overrides the
    user's own."""
    from app.core.components import runs_layer
    from app.core.encoders.kinds import OWN_ISLANDS
    from app.core.fixing.job_plans import SHARED_SWITCHES

    roles = {_role(p) for p in proved}
    owned = {c.setting for c in COMPONENTS.values() if c.role in roles and not c.borrows_setting}
    owned |= {flag for role in roles if role is Role.VAE for flag in _PART_FLAGS[role]}
    if Role.TEXT_ENCODER in roles:
        owned |= {island.setting for island in OWN_ISLANDS}
    encoder_proved = Role.VAE_ENCODER in roles

    def kept_layer(entry: str) -> bool:
        component, _, path = entry.partition(":")
        role = _setting_role(component)
        if role is Role.VAE and not encoder_proved and not runs_layer("vae", path):
            return True  # the encoder's layer: only the VAE's decode was proved
        return role not in roles

    kept: dict[str, Any] = {}
    for name, value in settings.items():
        if name in _MODULE_LISTS:
            entries = [e for e in value or [] if kept_layer(str(e))]
            if entries:
                kept[name] = entries
        elif name in _WHOLE_JOB or name in owned or value in ("auto", None):
            continue
        elif value is not False or name in SHARED_SWITCHES:
            kept[name] = value
    if settings.get("no_half") is True:
        for part in held_parts:
            found = COMPONENTS.get(part)
            if found is not None and found.role not in roles and not found.borrows_setting:
                kept.setdefault(found.setting, "fp32")
    return kept


def join(settings: dict[str, Any], more: Mapping[str, Any], first_wins: bool = False) -> None:
    """Add `more` (another part's settings) to `settings`: each layer list holds both lists'
    layers once, in order; any other setting set in both takes `more`'s value, or keeps
    `settings`' own where `first_wins`."""
    for name, value in more.items():
        if name in _MODULE_LISTS and isinstance(value, list):
            settings[name] = list(dict.fromkeys([*(settings.get(name) or []), *value]))
        elif first_wins:
            settings.setdefault(name, value)
        else:
            settings[name] = value


def part_fix(fix: RememberedFix, component: str) -> RememberedFix | None:
    """`fix` cut to the share of `component` (None where it has none)."""
    share = part_settings(fix.settings, component)
    if not share:
        return None
    return replace(fix, settings=share, parts=(component,))


def beside(own: RememberedFix, parts: Mapping[str, RememberedFix]) -> RememberedFix:
    """A model's own fix with the shares its files keep (component -> the fix stored under its
    file's key) for the components it was not proved on (a check of the whole model proves
    every part, and one it found sound needs nothing); `own` where there are none, and for a
    fix that does not say which parts it was proved on."""
    extra = {
        c: f for c, f in parts.items() if own.parts and c not in own.parts and not part_fix(own, c)
    }
    more = joined(extra)
    if more is None:
        return own
    settings: dict[str, Any] = dict(own.settings)
    join(settings, more.settings, first_wins=True)
    return replace(
        own,
        settings=settings,
        summary=" ".join(dict.fromkeys([own.summary, more.summary])),
        parts=tuple(dict.fromkeys([*own.parts, *more.parts])),
    )


def joined(parts: Mapping[str, RememberedFix]) -> RememberedFix | None:
    """One fix of the shares the files of a model's components keep (component -> the fix
    stored under its file's key), each cut to that component's share; None where none has one.
    """
    shares = {c: f for c, f in ((c, part_fix(f, c)) for c, f in parts.items()) if f is not None}
    if not shares:
        return None
    settings: dict[str, Any] = {}
    made_at: dict[str, Any] = {}  # each was proved at its own precision; their settings join
    for share in shares.values():
        join(settings, share.settings)
        made_at.update(share.made_at)
    first = next(iter(shares.values()))
    summary = " ".join(dict.fromkeys(s.summary for s in shares.values()))
    return replace(
        first,
        settings=settings,
        summary=summary,
        saved_at=max(s.saved_at for s in shares.values()),
        made_at=made_at,
        parts=tuple(shares),
    )
