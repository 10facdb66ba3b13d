"""The `halfsafe` subcommands: each runs core in-process, prints the result as text or, with
`--json`, as one JSON object, and returns the exit status."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from app.cli.arguments import effective_settings
from app.cli.exit_status import EXIT_OK, EXIT_PROBLEM
from app.cli.progress import progress_for
from app.cli.terminal import for_terminal
from app.core.errors import HalfSafeError
from app.core.hires import Hires
from app.core.images.canvas import MASK_BLUR_DEFAULT, PADDING_DEFAULT, Canvas
from app.core.images.pictures import STRENGTH_DEFAULT
from app.core.settings import PrecisionSettings

if TYPE_CHECKING:  # imported where a command runs: `halfsafe --version` stays instant
    from app.core.families.base import GenerationDefaults
    from app.core.generation import GenerationResult
    from app.core.models import LoadedModel
    from app.core.requests.records import CheckRequest, GenerateRequest


def _print_json(document: dict[str, Any]) -> None:
    print(json.dumps(document, indent=2))


def _print_text(text: str) -> None:
    """A report for the terminal, the names in it from files and arguments made safe to print
    (`terminal.for_terminal`)."""
    print(for_terminal(text))


def _cmd_gpu(args: argparse.Namespace) -> int:
    from app.core import hardware

    report = hardware.hardware_report(
        self_test=args.self_test, retest=args.retest, stat_budget_s=args.stat_budget
    )
    if args.json:
        _print_json(report.to_json())
    else:
        from app.cli.text import hardware_text

        _print_text(hardware_text(report))
    return EXIT_OK


def _cmd_advise(args: argparse.Namespace) -> int:
    from app.core import hardware
    from app.core.advice import advise_on, resolve_family
    from app.core.health.saved import saved_reports

    resolve_family(args.family)  # an unknown name is one sentence before any device is asked
    device = getattr(args, "device", None) or str(effective_settings(args)["device"])
    hardware.pick_device(device)  # a device that is not here is one sentence
    report = hardware.hardware_report(self_test=False)
    advice = advise_on(args.family, report, device, saved_reports().reports)
    if args.json:
        _print_json(advice.to_json())
    else:
        from app.cli.text import advice_text

        _print_text(advice_text(advice))
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    from app.core import health
    from app.core.requests import requested

    request = check_request(args, effective_settings(args))
    check_pictures(args, args.model)
    # Progress and the headline (what failed, where) go to stderr as the check runs; stdout
    # keeps the report alone (with --json, one JSON document).
    on_progress = progress_for(sys.stderr)
    try:
        run = health.QUICK if args.quick else None
        model = _load(args.model, args)
        report = requested.check(model, request, run=run, on_progress=on_progress)
    finally:
        on_progress.close()
    if args.report:
        health.write_markdown_report(report, args.report)
    if args.json:
        _print_json(report.to_json())
    else:
        from app.cli.text import health_text

        _print_text(health_text(report))
    return EXIT_OK if report.verdict == "healthy" else EXIT_PROBLEM


def check_request(args: argparse.Namespace, values: dict[str, Any]) -> CheckRequest:
    """`halfsafe check`'s flags laid over the saved settings (`values`), as the record the
    window's check sends: the LoRAs are exactly those the flags name."""
    from app.core.requests.records import CheckRequest

    return CheckRequest(
        precision=PrecisionSettings.from_mapping(values),
        device=values["device"],
        size=args.size,
        steps=values["steps"],
        scheduler=values["scheduler"],
        clip_skip=values["clip_skip"],
        loras=tuple(args.loras or ()),
        allow_pickle=args.allow_pickle,
        images=tuple(getattr(args, "images", None) or ()),
        mask=getattr(args, "mask", None),
        # The saved hires fix enlarges pixels: the VAE's encoder runs too, as the window asks.
        pixel_upscale=Hires(scale=values["hires_scale"], upscaler=values["hires_upscaler"]).pixels,
    )


def _load(source: str, args: argparse.Namespace) -> LoadedModel:
    """The model `source` names, with the VAE and text encoders the flags give in place of
    its own or those found beside it."""
    from app.core.models import load_model

    return load_model(
        source,
        vae=getattr(args, "vae", None),
        text_encoders=list(getattr(args, "text_encoders", None) or []),
        allow_pickle=bool(getattr(args, "allow_pickle", False)),
    )


def _cmd_generate(args: argparse.Namespace) -> int:
    values = effective_settings(args)
    result = generate_from_cli(args.model, args, values)
    if args.json:
        _print_json(result.to_json())
    else:
        from app.cli.text import generation_text

        _print_text(generation_text(result))
    return EXIT_OK if result.all_good else EXIT_PROBLEM


def generate_from_cli(source: str, args, values: dict[str, Any]) -> GenerationResult:
    """`halfsafe generate`: load `source`, build the request from the flags laid over the saved
    settings (`values`), and generate. Progress goes to stderr: a line redrawn in place on a
    terminal, a plain line with the ETA every few seconds otherwise (a log file or a CI job)."""
    from app.core.encoders.prompts import parse_emphasis
    from app.core.generation import rescue_unsaved
    from app.core.images.finished import ImageSaveError
    from app.core.requests import requested

    for text in (getattr(args, "prompt", "") or "", values.get("negative_prompt", "")):
        parse_emphasis(text)  # a prompt that cannot be read is refused before the model loads
    check_pictures(args, source)
    _check_size_flags(args, values)
    model = _load(source, args)
    defaults = requested.model_defaults(model)
    request = generate_request(args, values, model.native_size, defaults)
    given = vars(args)
    if defaults is not None and not ("steps" in given and "cfg" in given):
        generation = request.generation
        line = (
            f"halfsafe: {generation.steps} steps at CFG scale {generation.cfg:g}, as "
            f"{defaults.whose} defaults apply where --steps and --cfg are not given."
        )
        print(for_terminal(line, one_line=True), file=sys.stderr)
    on_progress = progress_for(sys.stderr)
    try:
        return requested.generate(model, request, on_progress=on_progress)
    except ImageSaveError as error:
        raise rescue_unsaved(error) from None
    finally:
        on_progress.close()


def generate_request(
    args, values: dict[str, Any], native_size: int, defaults: GenerationDefaults | None = None
) -> GenerateRequest:
    """`halfsafe generate`'s flags laid over the saved settings (`values`), as the record the
    window's Generate sends. Without --width/--height the image is the model's native size
    (`native_size`: the demo's 128 px, SDXL's 1024), not the saved 512; without --steps and
    --cfg, the model's own (`defaults`: Z-Image Turbo's 9 steps at CFG 1) where it states them."""
    from app.core.generation import GenerationRequest
    from app.core.requests.records import GenerateRequest

    width, height = cli_image_size(args, values, native_size)
    given = vars(args)  # a flag not given is absent (argparse.SUPPRESS)
    steps, cfg = values["steps"], values["cfg"]
    if defaults is not None:
        steps = steps if "steps" in given else defaults.steps
        cfg = cfg if "cfg" in given else defaults.cfg
    images = list(getattr(args, "images", None) or [])
    args_strength = getattr(args, "strength", None)
    generation = GenerationRequest(
        prompt=getattr(args, "prompt", "") or "",
        negative_prompt=values.get("negative_prompt", ""),
        steps=steps,
        cfg=cfg,
        seed=values["seed"],
        width=width,
        height=height,
        batch=values["batch"],
        scheduler=values["scheduler"],
        output_dir=getattr(args, "out", None) or values.get("output_folder") or None,
        images=images,
        mask=getattr(args, "mask", None),
        strength=STRENGTH_DEFAULT if args_strength is None else args_strength,
        canvas=cli_canvas(args),
        clip_skip=values["clip_skip"],
        hires=Hires(
            scale=values["hires_scale"],
            steps=values["hires_steps"],
            denoise=values["hires_denoise"],
            upscaler=values["hires_upscaler"],
        ),
        step_cache=values["step_cache"],
        prompt_cache=values["prompt_cache"],
        upsample_prompt=values["upsample_prompt"],
    )
    return GenerateRequest(
        generation=generation,
        precision=PrecisionSettings.from_mapping(values),
        device=values.get("device", "auto"),
        loras=tuple(getattr(args, "loras", None) or ()),
        allow_pickle=bool(getattr(args, "allow_pickle", False)),
    )


def _check_size_flags(args, values: dict[str, Any]) -> None:
    """A final picture past HalfSafe's bound (`--width` by `--height`, the hires fix's upscale
    included) refused before the model loads; a side left out is the model's and is checked
    with the request once it is known."""
    width, height = getattr(args, "width", None), getattr(args, "height", None)
    if width and height:
        upscale = Hires(scale=values["hires_scale"], upscaler=values["hires_upscaler"])
        upscale.checked().checked_size(int(width), int(height))


def cli_canvas(args) -> Canvas:
    """Inpainting's layout from `--mask-blur`, `--only-masked`, `--masked-padding` and
    `--extend` (the defaults where a flag is not given)."""
    blur = getattr(args, "mask_blur", None)
    padding = getattr(args, "masked_padding", None)
    return Canvas(
        mask_blur=MASK_BLUR_DEFAULT if blur is None else blur,
        only_masked=bool(getattr(args, "only_masked", False)),
        padding=PADDING_DEFAULT if padding is None else padding,
        extend=getattr(args, "extend", None) or (0, 0, 0, 0),
    )


def cli_image_size(args, values: dict[str, Any], native_size: int) -> tuple[int, int]:
    """Width and height for `halfsafe generate`: a flag the user gave wins; a side left out
    follows the input picture's proportions, or without a picture is the model's native size
    (a square model picture, never the saved 512 that made the 128 px demo take minutes)."""
    width = getattr(args, "width", None)
    height = getattr(args, "height", None)
    native = int(native_size) if native_size else int(values["width"])
    images = getattr(args, "images", None) or []
    if images:
        from app.core.images.pictures import picture_size

        return picture_size(images[0], native, width, height, cli_canvas(args).extend)
    return (int(width) if width else native, int(height) if height else native)


def check_pictures(args, source: str) -> None:
    """The input pictures and mask given by flags refused in one sentence (a missing,
    truncated or damaged file, one of another kind than PNG, JPEG or WebP, a mask that is
    black all over, a mask without a picture, more pictures than any model of `source`'s
    family takes) before a model is loaded: each is decoded in full here. Exactly how many
    pictures the model takes is known once it is (Qwen-Image-Edit one, Edit Plus three)."""
    from app.core.images.pictures import check_flags, check_picture_files
    from app.core.models.references import check_picture_count

    images = list(getattr(args, "images", None) or [])
    mask = getattr(args, "mask", None)
    check_flags(images, mask)
    if getattr(args, "strength", None) is not None and not images:
        raise HalfSafeError(
            "--strength is how much of an input picture is drawn again: give the picture "
            "with --image."
        )
    extends = getattr(args, "extend", None) is not None
    if extends and not images:
        raise HalfSafeError("--extend extends an input picture's canvas: give it with --image.")
    for flag, given in (
        ("--mask-blur", getattr(args, "mask_blur", None) is not None),
        ("--only-masked", bool(getattr(args, "only_masked", False))),
        ("--masked-padding", getattr(args, "masked_padding", None) is not None),
    ):
        if given and mask is None and not extends:
            raise HalfSafeError(
                f"{flag} lays out an inpainting job: give the picture with --image and the "
                "mask with --mask (or extend the canvas with --extend)."
            )
    if getattr(args, "masked_padding", None) is not None and not getattr(
        args, "only_masked", False
    ):
        raise HalfSafeError("--masked-padding is the room around --only-masked's box: give both.")
    check_picture_count(source, images)
    check_picture_files(images, mask)


def _cmd_explain(args: argparse.Namespace) -> int:
    from app.core import explain

    values = effective_settings(args)
    explanation = explain.explain_image(
        args.image, device=values["device"], model=args.model, remake=args.remake, log=args.log
    )
    if args.json:
        _print_json(explanation.to_json())
    else:
        from app.cli.text import explain_text

        if explanation.node_fix is not None:  # the workflow to drop in, beside the image
            explanation.node_fix.save_beside(explanation.path)
        _print_text(explain_text(explanation))
    return EXIT_PROBLEM if explanation.problem else EXIT_OK


def _cmd_comfyui(args: argparse.Namespace) -> int:
    """`halfsafe comfyui install [PATH]`: HalfSafe's nodes into a ComfyUI's custom_nodes."""
    from app.core.comfyui.install import install_nodes

    installed = install_nodes(args.path)
    if args.json:
        _print_json(installed.to_json())
    else:
        _print_text(installed.words)
    return EXIT_OK


COMMANDS = {
    "gpu": _cmd_gpu,
    "advise": _cmd_advise,
    "check": _cmd_check,
    "generate": _cmd_generate,
    "explain": _cmd_explain,
    "comfyui": _cmd_comfyui,
}
