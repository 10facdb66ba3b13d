"""Other image tools' words for HalfSafe's precision settings: the one table that says which flag
or setting of AUTOMATIC1111, Forge, ComfyUI, SwarmUI, SD.Next and InvokeAI does what a HalfSafe
fix does, so `explain` can give the fix in the terms of the tool that made the image; and the
parts each tool already runs wider than fp16 unless told otherwise.

Plain data and lookups; no torch. Each tool's entry notes where its flags come from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.settings.values import SettingValue

# What `made_by` can be (DESIGN.md, `halfsafe explain --json`).
MADE_BY = ("a1111", "forge", "comfyui", "invokeai", "swarmui", "sdnext", "halfsafe", "unknown")


@dataclass(frozen=True)
class Tool:
    name: str  # as its users call it
    how: str  # where its flags and settings go, one sentence


TOOLS: dict[str, Tool] = {
    "a1111": Tool(
        "AUTOMATIC1111 web UI",
        "Add the flags to COMMANDLINE_ARGS in webui-user.bat (webui-user.sh on Linux and macOS) "
        "and restart the web UI; the settings are in Settings > Stable Diffusion.",
    ),
    "forge": Tool(
        "Stable Diffusion WebUI Forge",
        "Add the flags to COMMANDLINE_ARGS in webui-user.bat (webui-user.sh on Linux and macOS) "
        "and restart Forge; the settings are in Settings > Stable Diffusion.",
    ),
    "comfyui": Tool(
        "ComfyUI",
        "Add the flags to the command that starts ComfyUI (python main.py ..., or the "
        "run_nvidia_gpu.bat line of the portable build) and restart it.",
    ),
    "swarmui": Tool(
        "SwarmUI",
        "SwarmUI runs ComfyUI underneath: add the flags to ExtraArgs in Server > Backends > "
        "ComfyUI Self-Starting, save, and restart the backend.",
    ),
    "sdnext": Tool(
        "SD.Next",
        "Set these in Settings > Compute Settings (the VAE's under Settings > Variational Auto "
        "Encoder; they are saved in config.json) and apply; SD.Next reloads the model.",
    ),
    "invokeai": Tool(
        "InvokeAI",
        "Set the VAE precision in the generation panel's advanced settings; other settings "
        "go in invokeai.yaml in InvokeAI's root folder, read at start.",
    ),
    "halfsafe": Tool(
        "HalfSafe",
        "Add the flags to the halfsafe command, or apply the fix in Settings.",
    ),
}


@dataclass(frozen=True)
class Term:
    """One tool's way to get one HalfSafe setting: flags to start it with and/or its own
    settings to change. `note` says where the tool's switch is wider than HalfSafe's."""

    flags: tuple[str, ...] = ()
    settings: Mapping[str, SettingValue] = field(default_factory=dict)
    note: str = ""


# Sources, per tool:
#   a1111:    AUTOMATIC1111/stable-diffusion-webui modules/cmd_args.py (--no-half,
#             --no-half-vae, --upcast-sampling) and modules/shared_options.py (`upcast_attn`,
#             shown as "Upcast cross attention layer to float32").
#   forge:    lllyasviel/stable-diffusion-webui-forge backend/args.py (--vae-in-fp32,
#             --vae-in-bf16, --unet-in-bf16, --clip-in-fp32, --all-in-fp32,
#             --force-upcast-attention, the backend Forge 2 brought in August 2024). A1111's
#             `upcast_attn` is still listed in Forge's Settings, but the code that read it is
#             commented out (modules/sd_hijack_optimizations.py): it does nothing there.
#             Forge Classic (Haoming02/sd-webui-forge-classic, ldm_patched/modules/
#             args_parser.py) has no --force-upcast-attention: it upcasts attention unless
#             started with --disable-attention-upcast.
#   comfyui:  comfyanonymous/ComfyUI comfy/cli_args.py (--fp32-vae, --bf16-vae, --fp16-vae,
#             --fp32-unet, --bf16-unet, --fp32-text-enc, --force-fp32,
#             --force-upcast-attention).
#   swarmui:  mcmonkeyprojects/SwarmUI passes ExtraArgs to its self-started ComfyUI: ComfyUI's.
#   sdnext:   vladmandic/sdnext modules/ui_definitions.py (`no_half_vae` under Variational Auto
#             Encoder; `no_half` and `cuda_dtype` with FP32/FP16/BF16 under Compute Settings;
#             both read in modules/devices.py). Its `upcast_attn` is a hidden legacy option
#             (modules/shared_legacy.py) that nothing reads: SD.Next has no attention upcast.
#   invokeai: invoke-ai/InvokeAI the "VAE Precision" generation setting (fp16/fp32, the
#             latents-to-image node's `fp32`) and invokeai.yaml `precision`
#             (auto, float16, bfloat16, float32).
_A1111_NO_HALF = Term(("--no-half",), note="runs every part in fp32, the only such switch")
_COMFY_FP32 = Term(("--force-fp32",), note="runs every part in fp32")
_SDNEXT_NO_HALF = Term(settings={"no_half": True}, note="runs every part in fp32")
_INVOKE_FP32 = Term(settings={"precision": "float32"}, note="runs every part in fp32")
_FORGE_FP32 = Term(("--all-in-fp32",), note="runs every part in fp32")

TERMS: dict[tuple[str, Any], dict[str, Term]] = {
    ("vae_precision", "fp32"): {
        "a1111": Term(("--no-half-vae",)),
        "forge": Term(("--vae-in-fp32",)),
        "comfyui": Term(("--fp32-vae",)),
        "swarmui": Term(("--fp32-vae",)),
        "sdnext": Term(settings={"no_half_vae": True}),
        "invokeai": Term(settings={"vae_precision": "fp32"}),
    },
    ("vae_precision", "bf16"): {
        "a1111": Term(
            ("--no-half-vae",), note="A1111 has no bf16 VAE; this runs it in fp32, wider still"
        ),
        "forge": Term(("--vae-in-bf16",)),
        "comfyui": Term(("--bf16-vae",)),
        "swarmui": Term(("--bf16-vae",)),
        "sdnext": Term(
            settings={"no_half_vae": True},
            note="no bf16 VAE switch; this runs it in fp32, wider still",
        ),
        "invokeai": Term(
            settings={"vae_precision": "fp32"},
            note="no bf16 VAE; this runs it in fp32, wider still",
        ),
    },
    ("no_half_vae", True): {
        "a1111": Term(("--no-half-vae",)),
        "forge": Term(("--vae-in-fp32",)),
        "comfyui": Term(("--fp32-vae",)),
        "swarmui": Term(("--fp32-vae",)),
        "sdnext": Term(settings={"no_half_vae": True}),
        "invokeai": Term(settings={"vae_precision": "fp32"}),
    },
    ("unet_precision", "fp32"): {
        "a1111": _A1111_NO_HALF,
        "forge": _FORGE_FP32,
        "comfyui": Term(("--fp32-unet",)),
        "swarmui": Term(("--fp32-unet",)),
        "sdnext": _SDNEXT_NO_HALF,
        "invokeai": _INVOKE_FP32,
    },
    ("unet_precision", "bf16"): {
        "a1111": _A1111_NO_HALF,
        "forge": Term(("--unet-in-bf16",)),
        "comfyui": Term(("--bf16-unet",)),
        "swarmui": Term(("--bf16-unet",)),
        "sdnext": Term(settings={"cuda_dtype": "BF16"}, note="every part in bf16"),
        "invokeai": Term(settings={"precision": "bfloat16"}, note="every part in bf16"),
    },
    ("text_encoder_precision", "fp32"): {
        "a1111": _A1111_NO_HALF,
        "forge": Term(("--clip-in-fp32",)),
        "comfyui": Term(("--fp32-text-enc",)),
        "swarmui": Term(("--fp32-text-enc",)),
        "sdnext": _SDNEXT_NO_HALF,
        "invokeai": _INVOKE_FP32,
    },
    ("text_encoder_2_precision", "fp32"): {
        "a1111": _A1111_NO_HALF,
        "forge": Term(("--clip-in-fp32",)),
        "comfyui": Term(("--fp32-text-enc",)),
        "swarmui": Term(("--fp32-text-enc",)),
        "sdnext": _SDNEXT_NO_HALF,
        "invokeai": _INVOKE_FP32,
    },
    ("upcast_attention", True): {
        "a1111": Term(settings={"upcast_attn": True}),
        "forge": Term(
            ("--force-upcast-attention",),
            note="Forge 2's flag; Forge Classic upcasts attention already unless started with "
            "--disable-attention-upcast",
        ),
        "comfyui": Term(("--force-upcast-attention",)),
        "swarmui": Term(("--force-upcast-attention",)),
        "sdnext": Term(
            settings={"no_half": True},
            note="no attention upcast switch; this runs every part in fp32",
        ),
        "invokeai": Term(settings={"precision": "float32"}, note="no attention upcast switch"),
    },
    ("no_half", True): {
        "a1111": Term(("--no-half",)),
        "forge": _FORGE_FP32,
        "comfyui": _COMFY_FP32,
        "swarmui": _COMFY_FP32,
        "sdnext": Term(settings={"no_half": True}),
        "invokeai": Term(settings={"precision": "float32"}),
    },
    ("precision", "fp32"): {
        "a1111": Term(("--no-half",)),
        "forge": _FORGE_FP32,
        "comfyui": _COMFY_FP32,
        "swarmui": _COMFY_FP32,
        "sdnext": Term(settings={"no_half": True}),
        "invokeai": Term(settings={"precision": "float32"}),
    },
}
# text_encoder_2 bf16 and text_encoder bf16: no tool has a switch narrower than fp32 for them.
for _key in ("text_encoder_precision", "text_encoder_2_precision"):
    TERMS[(_key, "bf16")] = TERMS[(_key, "fp32")]

# Each tool's own label for its setting, shown with the setting's key.
SETTING_WORDS = {
    ("a1111", "upcast_attn"): "Upcast cross attention layer to float32",
    ("sdnext", "no_half"): "Force full precision (--no-half)",
    ("sdnext", "no_half_vae"): "Variational Auto Encoder: Full precision (--no-half-vae)",
    ("sdnext", "cuda_dtype"): "Device precision type",
    ("invokeai", "vae_precision"): "VAE Precision",
    ("invokeai", "precision"): "precision (invokeai.yaml)",
}


@dataclass(frozen=True)
class Default:
    """A part of the model that a tool runs wider than fp16 unless told otherwise: a NaN there
    is unlikely, and the switch for it helps only when that default was changed."""

    does: str  # completes "{tool} ...": what it runs by default
    unless: str  # completes "unless ...": what changes the default
    families: tuple[str, ...] = ()  # only for these model families; () for every one


# Sources, per entry:
#   forge:    backend/memory_management.py: VAE_DTYPES is [bfloat16, float32] on an NVIDIA GPU
#             of compute capability 8 or more with bf16, [float32] elsewhere; vae_dtype() picks
#             fp16 only for --vae-in-fp16 (backend/args.py).
#   comfyui:  comfy/sd.py: an SD or SDXL VAE's working_dtypes are [bfloat16, float32];
#             comfy/model_management.py vae_dtype() picks fp16 only for --fp16-vae.
#             comfy/supported_models.py: SD20 (SD 2.x) sets attn_precision float32, which
#             --dont-upcast-attention turns off.
#   swarmui:  its ComfyUI backend, ComfyUI's defaults.
#   sdnext:   modules/processing_vae.py upcasts an fp16 VAE to fp32 while it decodes when the
#             VAE's config says force_upcast (diffusers' default, and SDXL's original VAE) or
#             `no_half_vae` is on; Settings > Variational Auto Encoder > "VAE upcasting"
#             (`diffusers_vae_upcast`) set to false turns force_upcast off.
#   invokeai: the generation panel's VAE Precision defaults to fp32
#             (invokeai/frontend/web/src/features/controlLayers/store/types.ts).
# AUTOMATIC1111 runs the VAE in fp16 (it redoes it in fp32 after a NaN only when "Automatically
# revert VAE to 32-bit floats" is on), so it has no entry.
_COMFY_VAE = "runs the VAE of SD and SDXL models in bf16 (fp32 on GPUs without bf16), never fp16"
_COMFY_SD2 = "runs SD 2.x attention in fp32 by itself (its SD 2.x model settings)"
WIDE_BY_DEFAULT: dict[tuple[str, str], Default] = {
    ("forge", "vae"): Default(
        "runs the VAE in bf16 (fp32 on GPUs without bf16), never fp16",
        "it is started with --vae-in-fp16",
    ),
    ("comfyui", "vae"): Default(_COMFY_VAE, "it is started with --fp16-vae"),
    ("swarmui", "vae"): Default(_COMFY_VAE, "--fp16-vae is in its ExtraArgs"),
    ("comfyui", "attention"): Default(
        _COMFY_SD2, "it is started with --dont-upcast-attention", ("sd2",)
    ),
    ("swarmui", "attention"): Default(
        _COMFY_SD2, "--dont-upcast-attention is in its ExtraArgs", ("sd2",)
    ),
    ("sdnext", "vae"): Default(
        "decodes with the VAE upcast to fp32 (diffusers' force_upcast, kept while "
        '"VAE upcasting" is at default)',
        '"VAE upcasting" is set to false',
    ),
    ("invokeai", "vae"): Default(
        "decodes with VAE Precision fp32, its default", "VAE Precision was set to fp16"
    ),
}


def wide_by_default(tool: str, part: str, family: str | None) -> Default | None:
    """What `tool` runs `part` ("vae", "attention") in by default when that is wider than fp16,
    for a model of `family` ("sdxl", "sd2", or None when unknown); None when it is fp16."""
    default = WIDE_BY_DEFAULT.get((tool, part))
    if default is None or (default.families and family not in default.families):
        return None
    return default


@dataclass(frozen=True)
class ToolFix:
    """A HalfSafe fix in one tool's terms."""

    tool: str
    flags: list[str]
    settings: dict[str, SettingValue]
    how: str
    notes: list[str]
    covered: bool  # every changed setting has a term in this tool

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "flags": self.flags, "settings": self.settings, "how": self.how}


def in_tool_terms(tool: str, settings: Mapping[str, Any], halfsafe_flags: list[str]) -> ToolFix:
    """The fix `settings` (HalfSafe setting -> value, as a health check's fix holds them) in
    `tool`'s flags and settings. For HalfSafe itself, or a tool this table does not know, the
    fix is HalfSafe's own `halfsafe_flags`. Settings that turn a switch off (reduced-precision
    sums) have no counterpart in the other tools and are named in `notes`."""
    if tool not in TOOLS or tool == "halfsafe":
        return ToolFix(
            "halfsafe", list(halfsafe_flags), dict(settings), TOOLS["halfsafe"].how, [], True
        )
    flags: list[str] = []
    tool_settings: dict[str, Any] = {}
    notes: list[str] = []
    covered = True
    for key, value in settings.items():
        # A list (layer-level settings: fp32_modules, ...) has no counterpart in other tools.
        term = None if isinstance(value, list) else TERMS.get((key, value), {}).get(tool)
        if term is None:
            covered = False
            notes.append(f"{TOOLS[tool].name} has no switch for HalfSafe's {key} = {value}.")
            continue
        flags.extend(f for f in term.flags if f not in flags)
        tool_settings.update(term.settings)
        if term.note:
            notes.append(
                f"{' '.join(term.flags) or _settings_words(tool, term.settings)}: {term.note}."
            )
    # The narrowest switch wins: --no-half already covers --no-half-vae and --upcast-sampling.
    if tool == "a1111" and "--no-half" in flags:
        flags = ["--no-half", *(f for f in flags if f not in ("--no-half", "--no-half-vae"))]
    return ToolFix(tool, flags, tool_settings, TOOLS[tool].how, notes, covered)


def _settings_words(tool: str, settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} = {value}" for key, value in settings.items())


def setting_words(tool: str, key: str) -> str:
    """How `tool` labels its setting `key` in its own window ('' when it is the key itself)."""
    return SETTING_WORDS.get((tool, key), "")
