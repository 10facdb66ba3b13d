"""The fixes the nodes prove, kept in HalfSafe's store of remembered fixes (`profiles.json`, the
file the desktop app reads and writes), under the keys the desktop uses: the model file's
identity as HalfSafe's own loader computes it, and the device as HalfSafe names it. A fix
proved by either is found by both."""

from __future__ import annotations

from pathlib import Path

from .host import COMPONENT, PREFIX, device_name, diffusion_model, halfsafe_name, halfsafe_names


def model_file(model) -> Path | None:
    """The file ComfyUI's loader read this MODEL from (its reload recipe names it)."""
    recipe = getattr(model, "cached_patcher_init", None)
    try:
        path = Path(recipe[1][0])  # type: ignore[index]
    except (TypeError, IndexError, KeyError):
        return None
    return path if path.is_file() else None


def profile_key(model, notes: list[str]) -> str | None:
    """The store's key for the file this MODEL was loaded from: the identity HalfSafe's loader
    gives the same file (`single_file.file_profile_key`; cached for the unchanged file, so only
    the first check of a file reads it whole). None, with a sentence in `notes`, where ComfyUI
    does not say which file it is or HalfSafe does not key that file on its own."""
    from app.core.errors import HalfSafeError
    from app.core.models.single_file import file_profile_key

    path = model_file(model)
    if path is None:
        notes.append("ComfyUI does not say which file this model was loaded from.")
        return None
    try:
        return file_profile_key(path)
    except HalfSafeError as error:
        problem = getattr(error, "problem", str(error))
        notes.append(f"HalfSafe's app does not load {path.name} alone ({problem.rstrip('.')}).")
    except OSError as error:
        notes.append(f"HalfSafe could not read {path} to name it: {error.strerror or error}.")
    return None


# The settings of a remembered fix that HalfSafe Fix applies to the MODEL; and those of the other
# components (text encoders, VAE), which are not the MODEL's to take.
APPLIED = ("unet_precision", "fp32_modules", "bf16_modules", "clamp_modules")
OTHER_PARTS = (
    "text_encoder_precision",
    "text_encoder_2_precision",
    "text_encoder_3_precision",
    "prompt_upsampler_precision",
    "vae_precision",
    "no_half_vae",
)


def fix_settings(model, fix: dict) -> dict:
    """A proved fix as HalfSafe's settings: islands as `fp32_modules`/`bf16_modules`
    (COMPONENT:PATH in HalfSafe's names where the model has them), a whole component as
    `unet_precision`, an attention switch as `attention_backend` (`attention.SETTING`)."""
    from .attention import SETTING

    switch = {"attention_backend": SETTING[fix["attention"]]} if fix.get("attention") else {}
    if fix.get("component"):
        return {"unet_precision": fix["component"], **switch}
    module = diffusion_model(model)
    names = halfsafe_names(model)
    settings: dict[str, list[str]] = {}
    for path, dtype in fix.get("islands", {}).items():
        named = halfsafe_name(names, module, path) or f"{PREFIX}.{path}"
        settings.setdefault(f"{dtype}_modules", []).append(f"{COMPONENT}:{named}")
    return {**settings, **switch}


def fix_from_settings(model, settings: dict, notes: list[str]) -> dict | None:
    """A remembered fix's settings as the nodes' fix, in ComfyUI's module paths: None, with a
    sentence in `notes`, where it needs what HalfSafe Fix cannot do in ComfyUI or names a
    layer this model does not have (then it is not this model's fix)."""
    from .attention import SETTING

    switches = {stored: backend for backend, stored in SETTING.items()}
    backend = settings.get("attention_backend")
    beyond = [
        k
        for k, v in settings.items()
        if k not in APPLIED + OTHER_PARTS and v and not (k == "attention_backend" and v in switches)
    ]
    if beyond:
        notes.append(
            f"The remembered fix needs {', '.join(beyond)}, which HalfSafe Fix cannot apply "
            "inside ComfyUI yet: it is not used."
        )
        return None
    if any(settings.get(k) not in (None, False, "auto") for k in OTHER_PARTS):
        notes.append("Its text encoders' and VAE's part is for their own loaders, not the MODEL.")
    fix: dict = {
        "component": None,
        "islands": {},
        "clamps": [],
        "attention": switches.get(str(backend)),
    }
    if settings.get("unet_precision") in ("fp32", "bf16"):
        fix["component"] = settings["unet_precision"]
    paths = _comfy_paths(model)
    for key in ("fp32_modules", "bf16_modules", "clamp_modules"):
        for entry in settings.get(key) or []:
            component, _, named = str(entry).partition(":")
            if component != COMPONENT:
                continue
            path = (
                named.removeprefix(PREFIX + ".")
                if named.startswith(PREFIX + ".")
                else paths.get(named)
            )
            if path is None:
                notes.append(
                    f"The remembered fix names {named}, a layer this model does not have: it "
                    "is not used."
                )
                return None
            if key == "clamp_modules":
                fix["clamps"].append(path)
            else:
                fix["islands"][path] = key.removesuffix("_modules")
    return fix if fix["component"] or fix["islands"] or fix["clamps"] or fix["attention"] else None


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


def remember(model, fix: dict, summary: str, made_at: dict, notes: list[str]) -> None:
    """Store a proved fix for this model file on this device (a sentence in `notes` when the
    file cannot be named or the store cannot be written)."""
    from app.core.fixing import profiles

    said: list[str] = []
    key = profile_key(model, said)
    if key is None:
        notes.append(f"The fix is not remembered: {' '.join(said)}")
        return
    profiles.remember_fix(
        key,
        device_name(model),
        fix_settings(model, fix),
        summary,
        "health check",
        made_at=made_at,
        parts=(COMPONENT,),
        warn=notes.append,
    )


def remembered(model, notes: list[str]) -> dict | None:
    """The fix remembered for this model file on this device, as the nodes' fix (None, with a
    sentence in `notes` where there is none to use)."""
    from app.core.fixing import profiles

    said: list[str] = []
    key = profile_key(model, said)
    if key is None:
        notes.append(f"No remembered fix: {' '.join(said)}")
        return None
    found = profiles.lookup(key, device_name(model))
    notes.extend(found.notes)
    if found.fix is None:
        return None
    fix = fix_from_settings(model, dict(found.fix.settings), notes)
    if fix is not None:
        fix["summary"] = found.fix.summary
    return fix
