"""The `halfsafe` subcommands: each runs core in-process, prints the result as text or, with
`--json`, as one JSON object, and returns the exit status."""

from __future__ import annotations

import argparse
import json
from typing import Any

from app.cli.arguments import effective_settings
from app.cli.exit_status import EXIT_OK, EXIT_PROBLEM
from app.core.settings import PrecisionSettings


def _print_json(document: dict[str, Any]) -> None:
    print(json.dumps(document, indent=2))


def _cmd_gpu(args: argparse.Namespace) -> int:
    from app.core import hardware

    report = hardware.hardware_report(self_test=args.self_test, retest=args.retest)
    if args.json:
        _print_json(report.to_json())
    else:
        print(hardware.format_report(report))
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    from app.core import causes, health

    values = effective_settings(args)
    report = causes.check_model(
        args.model,
        precision=PrecisionSettings.from_mapping(values),
        device=values["device"],
        size=args.size,
        steps=values["steps"],  # the probe covers the ends of the user's own sampler schedule
        scheduler=values["scheduler"],
        vae=args.vae,
        text_encoders=args.text_encoders,
        loras=args.loras,
        allow_pickle=args.allow_pickle,
    )
    if args.report:
        health.write_markdown_report(report, args.report)
    if args.json:
        _print_json(report.to_json())
    else:
        from app.cli.text import health_text

        print(health_text(report))
    return EXIT_OK if report.verdict == "healthy" else EXIT_PROBLEM


def _cmd_generate(args: argparse.Namespace) -> int:
    from app.core import generation

    values = effective_settings(args)
    result = generation.generate_from_cli(args.model, args, values)
    if args.json:
        _print_json(result.to_json())
    else:
        from app.cli.text import generation_text

        print(generation_text(result))
    return EXIT_OK if result.all_good else EXIT_PROBLEM


def _cmd_explain(args: argparse.Namespace) -> int:
    from app.core import explain

    values = effective_settings(args)
    explanation = explain.explain_image(args.image, device=values["device"])
    if args.json:
        _print_json(explanation.to_json())
    else:
        from app.cli.text import explain_text

        print(explain_text(explanation))
    return EXIT_PROBLEM if explanation.problem else EXIT_OK


COMMANDS = {
    "gpu": _cmd_gpu,
    "check": _cmd_check,
    "generate": _cmd_generate,
    "explain": _cmd_explain,
}
