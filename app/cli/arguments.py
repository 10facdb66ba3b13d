"""The `halfsafe` command line: argparse, with the precision flags generated from the settings
schema, and the settings a command runs with (the saved ones, its flags laid over them)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from app import __version__
from app.cli.exit_status import EXIT_CANNOT_RUN
from app.cli.terminal import for_terminal
from app.core import hires, samplers
from app.core.images.canvas import (
    EXTEND_RANGE,
    MASK_BLUR_DEFAULT,
    MASK_BLUR_RANGE,
    PADDING_DEFAULT,
    PADDING_RANGE,
    SIDES,
)
from app.core.images.pictures import STRENGTH_DEFAULT
from app.core.settings import (
    FIELDS,
    SCHEMA,
    load_settings,
    parse_module_entries,
    parse_number,
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2, per the contract."""

    def error(self, message: str) -> NoReturn:
        line = f"halfsafe: {message} (see 'halfsafe {self._sub_name()}--help')"
        self.exit(EXIT_CANNOT_RUN, for_terminal(line, one_line=True) + "\n")

    def _sub_name(self) -> str:
        parts = self.prog.split()[1:]
        return " ".join(parts) + " " if parts else ""


def _add_precision_flags(parser: argparse.ArgumentParser) -> None:
    """Every model-loading command takes the schema's precision flags.

    Flags left out take the user's saved settings (`argparse.SUPPRESS` keeps them out of the
    namespace), so the command line overrides the settings file one flag at a time.
    """
    group = parser.add_argument_group("precision (defaults come from your saved settings)")
    group.add_argument(
        "--device",
        default=argparse.SUPPRESS,
        metavar="auto|cpu|cuda|cuda:N|mps|xpu",
        type=_validated("device"),
        help=FIELDS["device"].help,
    )
    for f in SCHEMA:
        if not f.cli:
            continue
        flag = "--" + f.flag_name
        if f.kind == "choice":
            group.add_argument(
                flag,
                dest=f.key,
                choices=f.choices,
                type=_with_aliases(f.key),
                default=argparse.SUPPRESS,
                help=f.help,
            )
        elif f.kind == "bool" and f.default is False:
            group.add_argument(
                flag,
                dest=f.key,
                action="store_const",
                const=True,
                default=argparse.SUPPRESS,
                help=f.help,
            )
        elif f.kind == "bool":
            group.add_argument(
                flag,
                dest=f.key,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=f.help,
            )
        elif f.kind == "modules":
            group.add_argument(
                flag,
                dest=f.key,
                metavar="COMPONENT:PATH[,PATH...]",
                action=_ModuleEntries,
                type=_module_entries,
                default=argparse.SUPPRESS,
                help=f.help + " Repeat the flag for another component.",
            )
        elif f.kind in ("int", "float"):
            group.add_argument(
                flag,
                dest=f.key,
                metavar="GB" if f.key == "max_vram_gb" else "N",
                type=_validated(f.key),
                default=argparse.SUPPRESS,
                help=f.help,
            )
    for flag, key, value in OTHER_TOOLS_FLAGS:
        group.add_argument(
            flag,
            dest=key,
            action="store_const",
            const=value,
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )
    group.add_argument(
        "--vae", metavar="PATH", help="a separate VAE file that replaces the model's"
    )
    from app.core.families.registry import companion_words  # the families' own names

    group.add_argument(
        "--text-encoder",
        metavar="PATH",
        dest="text_encoders",
        action="append",
        default=[],
        help=f"a text-encoder file for a split transformer file ({companion_words()}; repeat "
        "the flag); by default they are looked for in the sibling text_encoders/ or clip/ "
        "folder",
    )
    group.add_argument(
        "--allow-pickle",
        action="store_true",
        help="allow .ckpt/.pt/.bin pickle files (loaded with PyTorch's "
        "weights-only loader, never fully unpickled)",
    )


def _add_lora_flag(parser: argparse.ArgumentParser) -> None:
    """`--lora PATH[:WEIGHT]`, repeatable: LoRAs applied to the model for this command."""
    parser.add_argument(
        "--lora",
        metavar="PATH[:WEIGHT]",
        dest="loras",
        action="append",
        default=[],
        type=_lora_argument,
        help="a LoRA file to apply, at WEIGHT (default 1); repeat the flag for more. A prompt's "
        "<lora:name:weight> tags are read too",
    )


def _add_picture_flags(parser: argparse.ArgumentParser, *, strength: bool) -> None:
    """`--image`, `--mask` (and for generate `--strength`): image-to-image, inpainting and
    editing. The check takes the pictures to probe the path such a job runs, the VAE's
    encoder included."""
    parser.add_argument(
        "--image",
        metavar="PATH",
        dest="images",
        action="append",
        default=[],
        help="start from this picture (image-to-image; with --mask, inpainting); for an "
        "editing model, a picture to edit: repeat the flag for each reference where the "
        "model takes several (docs/cli.md says how many each takes); for a control model "
        "(Flux.1 Depth, Canny), the depth map or edge picture it follows",
    )
    parser.add_argument(
        "--mask",
        metavar="PATH",
        help="inpainting mask for --image: white is painted again, black is kept",
    )
    if strength:
        parser.add_argument(
            "--strength",
            metavar="0..1",
            type=_strength,
            default=None,  # given or not: a strength without a picture is refused
            help=f"how much of --image is drawn again (default {STRENGTH_DEFAULT:g}; 1 redraws "
            "all of it)",
        )
        _add_canvas_flags(parser)


def _add_canvas_flags(parser: argparse.ArgumentParser) -> None:
    """Inpainting's layout (`canvas.Canvas`): the mask's blur, only the masked area, and
    outpainting by extending the canvas."""
    parser.add_argument(
        "--mask-blur",
        metavar="PX",
        type=_pixels(MASK_BLUR_RANGE),
        default=None,
        help=f"inpainting: blur the mask's edge by PX pixels to blend the result into the "
        f"picture (default {MASK_BLUR_DEFAULT}; 0 keeps a hard edge)",
    )
    parser.add_argument(
        "--only-masked",
        action="store_true",
        help="inpainting: draw only the mask's box, at --width x --height, and paste it back "
        "into the picture at its own size (A1111's 'Inpaint area: Only masked')",
    )
    parser.add_argument(
        "--masked-padding",
        metavar="PX",
        type=_pixels(PADDING_RANGE),
        default=None,
        help=f"with --only-masked: pixels of the picture drawn around the mask's box "
        f"(default {PADDING_DEFAULT})",
    )
    parser.add_argument(
        "--extend",
        metavar="SIDE=PX,...",
        type=_extension,
        default=None,
        help="outpainting: extend --image's canvas by PX pixels on each SIDE named (left, "
        "top, right, bottom; e.g. right=256,bottom=128) and draw the new area; a --mask is "
        "optional",
    )


def _pixels(bounds: tuple[int, int]):
    """A flag's type: a whole number of pixels within `bounds`."""

    def read(text: str) -> int:
        try:
            value = parse_number(text, "int")
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        if not bounds[0] <= value <= bounds[1]:
            raise argparse.ArgumentTypeError(
                f"{value} is not from {bounds[0]} to {bounds[1]} pixels"
            )
        return int(value)

    return read


def _extension(text: str) -> tuple[int, int, int, int]:
    """`right=256,bottom=128` as (left, top, right, bottom)."""
    sides = dict.fromkeys(SIDES, 0)
    for part in text.split(","):
        side, equals, number = part.strip().partition("=")
        side = side.strip().lower()
        if not equals or side not in sides:
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r} is not SIDE=PX, with SIDE one of {', '.join(SIDES)}"
            )
        sides[side] = _pixels(EXTEND_RANGE)(number.strip())
    if not any(sides.values()):
        raise argparse.ArgumentTypeError("every side is 0 pixels: nothing would be extended")
    left, top, right, bottom = (sides[side] for side in SIDES)
    return (left, top, right, bottom)


def _sampler(text: str) -> str:
    """A sampler setting from its key or a tool's words; the sentence naming the closest one
    HalfSafe runs when it runs none of that name, or not with that schedule."""
    key, unrun = samplers.read(text)
    if key is None:
        raise argparse.ArgumentTypeError(
            samplers.refusal(text) or f"{text!r} is not a sampler HalfSafe knows"
        )
    if unrun is not None:
        raise argparse.ArgumentTypeError(unrun)
    return key


def _upscaler(text: str) -> str:
    """A hires upscaler from its key or a tool's words; the sentence naming the closest one
    HalfSafe runs when it runs none of that name."""
    key = hires.key_for(text)
    if key is None:
        raise argparse.ArgumentTypeError(hires.refusal(text))
    return key


def _strength(text: str) -> float:
    try:
        value = parse_number(text, "float")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value:g} is not more than 0 and at most 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not 0 <= value <= 600:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 600 seconds")
    return value


def _lora_argument(text: str):
    from app.core.lora.files import parse_lora_argument

    try:
        return parse_lora_argument(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


# Flags of AUTOMATIC1111 (and Forge, SD.Next) and ComfyUI, accepted as those tools spell them
# and hidden from --help: each sets the HalfSafe setting that does the same thing.
OTHER_TOOLS_FLAGS: tuple[tuple[str, str, Any], ...] = (
    # A1111 --upcast-sampling: the UNet keeps fp16 weights, the sampler's latents stay fp32
    # and attention is computed in fp32. HalfSafe always samples in fp32 (latents are cast
    # at the UNet's door), so the part that is a setting here is upcast attention.
    ("--upcast-sampling", "upcast_attention", True),
    # ComfyUI
    ("--force-fp32", "no_half", True),
    ("--fp32-vae", "vae_precision", "fp32"),
    ("--bf16-vae", "vae_precision", "bf16"),
    ("--fp16-vae", "vae_precision", "fp16"),
    ("--fp32-unet", "unet_precision", "fp32"),
    ("--bf16-unet", "unet_precision", "bf16"),
    ("--fp16-unet", "unet_precision", "fp16"),
    ("--fp32-text-enc", "text_encoder_precision", "fp32"),
    ("--bf16-text-enc", "text_encoder_precision", "bf16"),
    ("--fp16-text-enc", "text_encoder_precision", "fp16"),
    ("--force-upcast-attention", "upcast_attention", True),
    ("--dont-upcast-attention", "upcast_attention", False),
)
# Values other tools give a HalfSafe flag. A1111's --precision says whether autocast is on,
# not the weights' dtype (that is --no-half): `full` turns autocast off and leaves fp16
# weights, so `--precision full` alone is plain fp16 and `--precision full --no-half` is fp32,
# in A1111 as here. (A1111 modules/devices.py: autocast() is a no-op when precision is full.)
VALUE_ALIASES: dict[str, dict[str, str]] = {
    "precision": {"full": "fp16", "half": "fp16"},
}


def _with_aliases(key: str):
    """A choice flag's value with other tools' spellings mapped to HalfSafe's (argparse checks
    the result against the schema's choices)."""

    def parse(text: str) -> str:
        return VALUE_ALIASES.get(key, {}).get(text, text)

    return parse


def _module_entries(text: str) -> list[str]:
    try:
        return parse_module_entries(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class _ModuleEntries(argparse.Action):
    """A repeatable COMPONENT:PATH[,PATH...] flag: every use adds its entries, and the whole
    list is checked against the schema field (count, length, component names)."""

    def __call__(self, parser, namespace, values, option_string=None):
        entries = [*(getattr(namespace, self.dest, None) or []), *(values or [])]
        try:
            setattr(namespace, self.dest, FIELDS[self.dest].validate(entries))
        except ValueError as error:
            parser.error(f"argument {option_string}: {error}")


def _on_off(text: str) -> bool:
    """A switch's flag: on or off."""
    words = {"on": True, "off": False}
    if text.strip().lower() not in words:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is neither on nor off")
    return words[text.strip().lower()]


def _validated(key: str):
    """A flag's value checked against the schema field `key`, so the bounds live in one place.

    Every failure is an ArgumentTypeError with a short reason: argparse would otherwise quote
    the whole value (an integer of thousands of digits) or let an overflow out as a traceback.
    """

    def parse(text: str) -> Any:
        f = FIELDS[key]
        try:
            value = parse_number(text, f.kind) if f.kind in ("int", "float") else text
            return f.validate(value)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


# What MODEL may be, for the commands that load one.
_MODEL_HELP = (
    "a diffusers folder, a .safetensors checkpoint (.ckpt/.pt only with "
    "--allow-pickle), 'demo' for the built-in demo model (it draws simple coloured shapes), "
    "or 'demo-overflow', the same with a VAE that overflows in fp16"
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="halfsafe", description="Make half precision safe for Stable Diffusion.")
    parser.add_argument("--version", action="version", version=f"halfsafe {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for add in (_add_gpu, _add_advise, _add_check, _add_generate, _add_explain, _add_comfyui):
        add(sub)
    return parser


def _add_gpu(sub) -> None:
    """`halfsafe gpu`: the devices and the self-test."""
    gpu = sub.add_parser("gpu", help="this machine's devices and what they can do in fp16/bf16")
    gpu.add_argument("--json", action="store_true", help="print the report as JSON")
    gpu.add_argument(
        "--no-self-test",
        dest="self_test",
        action="store_false",
        help="skip the on-device self-test (use a cached result if there is one)",
    )
    gpu.add_argument("--retest", action="store_true", help="run the self-test even if cached")
    gpu.add_argument(
        "--stat-budget",
        metavar="SECONDS",
        type=_seconds,
        default=None,
        help="seconds per device for the statistical self-test, which counts rare faults "
        "(NaN, zeros, wrong results) over many calls (default: 10 on a GPU, 1 on a CPU; "
        "0 skips it; a cached count is reused unless this is given)",
    )


def _add_advise(sub) -> None:
    """`halfsafe advise FAMILY`: which stored form runs on this device."""
    advise = sub.add_parser(
        "advise", help="which stored form of a model family runs on this device, and its needs"
    )
    advise.add_argument(
        "family",
        metavar="FAMILY",
        help="a family or architecture name as the README's Families table gives it "
        "(sdxl, flux-dev, flux2-klein, qwenimage21, ...)",
    )
    advise.add_argument("--json", action="store_true", help="print the advice as JSON")
    advise.add_argument(
        "--device",
        default=argparse.SUPPRESS,
        metavar="auto|cpu|cuda|cuda:N|mps|xpu",
        type=_validated("device"),
        help="the device to advise for (default: your saved device setting)",
    )


def _add_check(sub) -> None:
    """`halfsafe check MODEL`: the health check."""
    check = sub.add_parser("check", help="model health check: which part overflows, and the fix")
    check.add_argument("model", metavar="MODEL", help=_MODEL_HELP)
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    size = FIELDS["width"]
    check.add_argument(
        "--size",
        # The probe is an image: the same bounds as the width and height settings.
        type=_validated("width"),
        metavar="PX",
        help=f"image size to probe at, {size.minimum:g} to {size.maximum:g} and a multiple of "
        f"{size.step} (default: the model's native size)",
    )
    check.add_argument(
        "--clip-skip",
        dest="clip_skip",
        type=_validated("clip_skip"),
        default=argparse.SUPPRESS,
        help=FIELDS["clip_skip"].help,
    )
    check.add_argument("--report", metavar="FILE.md", help="also write a Markdown report")
    check.add_argument(
        "--quick",
        action="store_true",
        help="stop once the fix is proved: the other candidate fixes are not tried for the "
        "table, and the fix is not timed against no-half",
    )
    _add_picture_flags(check, strength=False)
    _add_lora_flag(check)
    _add_precision_flags(check)


def _add_generate(sub) -> None:
    """`halfsafe generate MODEL`: images with the NaN watch."""
    gen = sub.add_parser("generate", help="generate images with the NaN watch")
    gen.add_argument("model", metavar="MODEL", help=_MODEL_HELP)
    gen.add_argument("--json", action="store_true", help="print the result as JSON")
    gen.add_argument("--prompt", default="", help="what to draw")
    for key in (
        "negative_prompt",
        "steps",
        "cfg",
        "seed",
        "width",
        "height",
        "batch",
        "clip_skip",
        "hires_scale",
        "hires_steps",
        "hires_denoise",
        "step_cache",
    ):
        gen.add_argument(
            "--" + key.replace("_", "-"),
            dest=key,
            type=_validated(key),
            default=argparse.SUPPRESS,
            help=FIELDS[key].help,
        )
    gen.add_argument(
        "--prompt-cache",
        dest="prompt_cache",
        metavar="on|off",
        type=_on_off,
        default=argparse.SUPPRESS,
        help=FIELDS["prompt_cache"].help + " Default: off (or your saved setting).",
    )
    gen.add_argument(
        "--upsample-prompt",
        dest="upsample_prompt",
        metavar="on|off",
        type=_on_off,
        default=argparse.SUPPRESS,
        help=FIELDS["upsample_prompt"].help + " Default: on (or your saved setting).",
    )
    gen.add_argument(
        "--scheduler",
        "--sampler",
        metavar="SAMPLER",
        type=_sampler,
        default=argparse.SUPPRESS,
        help=f"{FIELDS['scheduler'].help} A key ({', '.join(s.key for s in samplers.SAMPLERS)}, "
        f"with _{', _'.join(s.key for s in samplers.SCHEDULES)} for a schedule: "
        "dpmpp_2m_sde_karras) or AUTOMATIC1111's or ComfyUI's words ('DPM++ 2M SDE Karras').",
    )
    gen.add_argument(
        "--hires-upscaler",
        dest="hires_upscaler",
        metavar="UPSCALER",
        type=_upscaler,
        default=argparse.SUPPRESS,
        help=f"{FIELDS['hires_upscaler'].help} A key ({', '.join(hires.KEYS)}) or A1111's or "
        "ComfyUI's words ('Latent (nearest-exact)', 'Lanczos').",
    )
    gen.add_argument("--out", metavar="PATH", help="output folder (default: your settings)")
    gen.add_argument(
        "--auto-fix",
        dest="auto_fix",
        choices=("off", "auto"),
        default=argparse.SUPPRESS,
        # The setting's third choice, ask, is the window's offer: a command has no one to ask.
        help="when an image goes NaN; off: keep the broken image and say why; auto: repair only "
        "the part that failed (for a VAE, decode the same latents again) and remember the fix",
    )
    gen.add_argument(
        "--no-nan-check",
        dest="nan_check",
        action="store_const",
        const=False,
        default=argparse.SUPPRESS,
        help="turn the NaN watch off for this run",
    )
    gen.add_argument(  # AUTOMATIC1111's spelling
        "--disable-nan-check",
        dest="nan_check",
        action="store_const",
        const=False,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )
    _add_picture_flags(gen, strength=True)
    _add_lora_flag(gen)
    _add_precision_flags(gen)


def _add_explain(sub) -> None:
    """`halfsafe explain IMAGE`: why an image came out black."""
    explain = sub.add_parser(
        "explain", help="why an image (made by HalfSafe or another tool) came out black"
    )
    explain.add_argument(
        "image",
        metavar="IMAGE",
        help="a PNG made by A1111, Forge, SD.Next, ComfyUI, SwarmUI, InvokeAI or HalfSafe",
    )
    explain.add_argument("--json", action="store_true", help="print the explanation as JSON")
    explain.add_argument(
        "--device",
        default=argparse.SUPPRESS,
        metavar="auto|cpu|cuda|cuda:N|mps|xpu",
        type=_validated("device"),
        help="where the health check runs (default: your settings)",
    )
    explain.add_argument(
        "--model",
        metavar="MODEL",
        help="the model that made the image (a file, a folder or a built-in demo), for an image "
        "that names none or one HalfSafe cannot find: it is checked in place of a search",
    )
    explain.add_argument(
        "--remake",
        action="store_true",
        help="make the image again from its record with its model and compare: tells a "
        "picture whose colours were inverted after it was made (a warm decode) from one the "
        "model makes so",
    )
    explain.add_argument(
        "--log",
        metavar="PATH",
        help="the log of the tool that made the image (ComfyUI's console output saved to a "
        "file): read for its version and a loader's unexpected-key warnings",
    )


def _add_comfyui(sub) -> None:
    """`halfsafe comfyui install [PATH]`: HalfSafe's nodes into a ComfyUI."""
    comfyui = sub.add_parser("comfyui", help="HalfSafe's nodes inside ComfyUI")
    actions = comfyui.add_subparsers(
        dest="action", metavar="ACTION", required=True, parser_class=_Parser
    )
    install = actions.add_parser(
        "install",
        help="copy HalfSafe's node package into a ComfyUI's custom_nodes folder and say how to "
        "install HalfSafe's core into that ComfyUI's Python",
    )
    install.add_argument(
        "path",
        metavar="PATH",
        nargs="?",
        help="the ComfyUI folder (a source or portable install, or ComfyUI Desktop's folder; "
        "default: the one HalfSafe finds)",
    )
    install.add_argument("--json", action="store_true", help="print what was done as JSON")


def effective_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The saved settings with this command's flags laid over them."""
    loaded = load_settings()
    for warning in loaded.warnings:
        print(for_terminal(f"halfsafe: {warning}", one_line=True), file=sys.stderr)
    values = loaded.settings.to_dict()
    values.update({k: v for k, v in vars(args).items() if k in FIELDS})
    return values
