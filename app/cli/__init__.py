"""The `halfsafe` command: starts the GUI, or runs core in-process for headless use.

Exit status: 0 all good; 1 the command ran and found a problem; 2 it could not run. A problem
the user can act on is one plain line on stderr; `--debug` adds the traceback.

`arguments` builds the command line, `commands` runs each subcommand, `text` renders core's
results for the terminal; no terminal text lives in core.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings
from collections.abc import Sequence

from app.cli.arguments import build_parser
from app.cli.commands import COMMANDS
from app.cli.exit_status import EXIT_CANNOT_RUN, EXIT_OK
from app.cli.terminal import for_terminal
from app.core.errors import HalfSafeError
from app.core.memory import free_large_blocks_promptly


def quiet_libraries() -> None:
    """diffusers and transformers log advice meant for their developers; users see ours."""
    for var in ("DIFFUSERS_VERBOSITY", "TRANSFORMERS_VERBOSITY"):
        os.environ.setdefault(var, "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def keep_library_warnings_off_the_terminal() -> None:
    """Python warnings from libraries (PyTorch's "Detected pickle protocol 4", diffusers'
    deprecations) are advice for their developers: the user gets HalfSafe's sentence instead.
    HalfSafe's own warnings still show, one line each; `--debug` shows everything. Call inside
    `warnings.catch_warnings()`, which puts the filters and `showwarning` back afterwards."""
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module=r"app(\.|$)")

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(for_terminal(f"halfsafe: {message}", one_line=True), file=sys.stderr)

    warnings.showwarning = show


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        return gui_main(argv)
    quiet_libraries()
    with warnings.catch_warnings():
        if not args.debug:
            keep_library_warnings_off_the_terminal()
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Run one headless command; a HalfSafeError becomes one line on stderr and exit 2."""
    free_large_blocks_promptly()  # a job's tensors leave no resident holes behind
    try:
        return COMMANDS[args.command](args)
    except HalfSafeError as error:
        if args.debug:
            traceback.print_exc()
        print(for_terminal(f"halfsafe: {error}", one_line=True), file=sys.stderr)
        return EXIT_CANNOT_RUN
    except KeyboardInterrupt:
        print("halfsafe: interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`halfsafe gpu --json | head`): not an error of ours.
        sys.stderr.close()
        return EXIT_OK


def gui_main(argv: Sequence[str] | None = None) -> int:
    """Start the desktop app (the `halfsafe-gui` entry point opens no console on Windows)."""
    from app.ui.application import run_gui

    return run_gui(list(argv or []))
