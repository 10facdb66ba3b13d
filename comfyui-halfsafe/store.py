"""The fixes the nodes prove, kept in HalfSafe's store of remembered fixes (`profiles.json`, the
file the desktop app reads and writes), per model file and device."""

from __future__ import annotations

from pathlib import Path

from .host import COMPONENT, PREFIX, device_name, diffusion_model, halfsafe_name, halfsafe_names

# The name the content digest of a file is cached under for the nodes (the desktop caches its
# own, taken over the tensors its loader uses, under the architecture it detected).
NODE_WORDS = "comfyui"


def model_file(model) -> Path | None:
    """The file ComfyUI's loader read this MODEL from (its reload recipe names it)."""
    recipe = getattr(model, "cached_patcher_init", None)
    try:
        path = Path(recipe[1][0])  # type: ignore[index]
    except (TypeError, IndexError, KeyError):
        return None
    return path if path.is_file() else None


def profile_key(path: Path) -> str:
    """The store's key for a model file: the digest of its tensors (cached for the unchanged
    file, so only the first check of a file reads it whole)."""
    from app.core.checkpoint import scan_weights
    from app.core.models.identity import Identity

    identity = Identity(NODE_WORDS, NODE_WORDS, [path], [path])
    scan = scan_weights(path, identify=True) if identity.needed else None
    return identity.profile_key(scan)  # type: ignore[arg-type]


def fix_settings(model, fix: dict) -> dict:
    """A proved fix as HalfSafe's settings: islands as `fp32_modules`/`bf16_modules`
    (COMPONENT:PATH in HalfSafe's names where the model has them), a whole component as
    `unet_precision`."""
    if fix.get("component"):
        return {"unet_precision": fix["component"]}
    module = diffusion_model(model)
    names = halfsafe_names(model)
    settings: dict[str, list[str]] = {}
    for path, dtype in fix.get("islands", {}).items():
        named = halfsafe_name(names, module, path) or f"{PREFIX}.{path}"
        settings.setdefault(f"{dtype}_modules", []).append(f"{COMPONENT}:{named}")
    return settings


def fix_from_settings(model, settings: dict) -> dict | None:
    """A remembered fix's settings back as the nodes' fix (ComfyUI's module paths)."""
    component = settings.get("unet_precision")
    if component in ("fp32", "bf16"):
        return {"component": component, "islands": {}}
    module = diffusion_model(model)
    names = halfsafe_names(model)
    theirs = {}
    for path, _ in module.named_modules():
        named = halfsafe_name(names, module, path) if path else None
        if named:
            theirs.setdefault(named, path)
    islands: dict[str, str] = {}
    for dtype in ("fp32", "bf16"):
        for entry in settings.get(f"{dtype}_modules") or []:
            component, _, named = str(entry).partition(":")
            if component != COMPONENT:
                continue
            path = (
                named.removeprefix(PREFIX + ".")
                if named.startswith(PREFIX + ".")
                else theirs.get(named)
            )
            if path is None:
                return None  # a layer this model does not have: not this model's fix
            islands[path] = dtype
    return {"component": None, "islands": islands} if islands else None


def remember(model, fix: dict, summary: str, made_at: dict, notes: list[str]) -> None:
    """Store a proved fix for this model file on this device (a sentence in `notes` when the
    file is unknown or the store cannot be written)."""
    from app.core.fixing import profiles

    path = model_file(model)
    if path is None:
        notes.append("The fix is not remembered: ComfyUI does not say which file this model is.")
        return
    profiles.remember_fix(
        profile_key(path),
        device_name(model),
        fix_settings(model, fix),
        summary,
        "health check",
        made_at=made_at,
        parts=(COMPONENT,),
        warn=notes.append,
    )


def remembered(model, notes: list[str]) -> dict | None:
    """The fix remembered for this model file on this device, as the nodes' fix."""
    from app.core.fixing import profiles

    path = model_file(model)
    if path is None:
        notes.append("No remembered fix: ComfyUI does not say which file this model is.")
        return None
    found = profiles.lookup(profile_key(path), device_name(model))
    notes.extend(found.notes)
    if found.fix is None:
        return None
    fix = fix_from_settings(model, dict(found.fix.settings))
    if fix is not None:
        fix["summary"] = found.fix.summary
    return fix
