"""Other image tools' words for HalfSafe's precision settings: the one table that says which flag
or setting of AUTOMATIC1111, Forge, ComfyUI, SwarmUI, SD.Next and InvokeAI does what a HalfSafe
fix does, so `explain` can give the fix in the terms of the tool that made the image.

Plain data and one lookup; no torch. Each tool's entry notes where its flags come from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
        "Set these in Settings > Compute Settings (they are saved in config.json) and apply; "
        "SD.Next reloads the model.",
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
    settings: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""


# Sources, per tool:
#   a1111:    AUTOMATIC1111/stable-diffusion-webui modules/cmd_args.py (--no-half,
#             --no-half-vae, --upcast-sampling) and modules/shared_options.py (`upcast_attn`,
#             shown as "Upcast cross attention layer to float32").
#   forge:    lllyasviel/stable-diffusion-webui-forge backend/args.py (--vae-in-fp32,
#             --vae-in-bf16, --unet-in-bf16, --clip-in-fp32, --all-in-fp32); `upcast_attn`
#             kept from A1111's settings.
#   comfyui:  comfyanonymous/ComfyUI comfy/cli_args.py (--fp32-vae, --bf16-vae, --fp16-vae,
#             --fp32-unet, --bf16-unet, --fp32-text-enc, --force-fp32,
#             --force-upcast-attention).
#   swarmui:  mcmonkeyprojects/SwarmUI passes ExtraArgs to its self-started ComfyUI: ComfyUI's.
#   sdnext:   vladmandic/sdnext modules/shared.py compute settings (`no_half`, `no_half_vae`,
#             `upcast_attn`, `cuda_dtype` with FP32/FP16/BF16).
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
        "forge": Term(settings={"upcast_attn": True}),
        "comfyui": Term(("--force-upcast-attention",)),
        "swarmui": Term(("--force-upcast-attention",)),
        "sdnext": Term(settings={"upcast_attn": True}),
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

# A1111's own words for its `upcast_attn` setting, shown with the setting's key.
SETTING_WORDS = {
    ("a1111", "upcast_attn"): "Upcast cross attention layer to float32",
    ("forge", "upcast_attn"): "Upcast cross attention layer to float32",
    ("sdnext", "upcast_attn"): "Upcast attention layer",
    ("sdnext", "no_half"): "Full precision for model (--no-half)",
    ("sdnext", "no_half_vae"): "Full precision for VAE (--no-half-vae)",
    ("sdnext", "cuda_dtype"): "Device precision type",
    ("invokeai", "vae_precision"): "VAE Precision",
    ("invokeai", "precision"): "precision (invokeai.yaml)",
}


@dataclass(frozen=True)
class ToolFix:
    """A HalfSafe fix in one tool's terms."""

    tool: str
    flags: list[str]
    settings: dict[str, Any]
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
