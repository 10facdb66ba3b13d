"""`halfsafe generate` on the command line: the model's native size when no size is given, and
progress lines with an ETA when the output is not a terminal."""

from __future__ import annotations

import io
import json

import pytest

from app.cli import main
from app.cli.arguments import build_parser, effective_settings
from app.cli.commands import cli_image_size
from app.cli.progress import ProgressLines, RedrawnLine
from app.core.health.check import Headline


def _size(*flags: str, native: int = 128) -> tuple[int, int]:
    args = build_parser().parse_args(["generate", "demo", *flags])
    return cli_image_size(args, effective_settings(args), native)


def test_without_a_size_the_model_native_size_is_used():
    assert _size() == (128, 128)
    assert _size(native=1024) == (1024, 1024)


def test_a_size_the_user_gave_wins_and_the_other_side_is_native():
    assert _size("--width", "256", "--height", "192") == (256, 192)
    assert _size("--width", "256") == (256, 128)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_every_few_seconds_with_an_eta():
    stream, clock = io.StringIO(), Clock()
    report = ProgressLines(stream, interval=5.0, clock=clock)
    report("Denoising", 0, 25)
    for step in range(1, 26):
        clock.now += 1.0  # one second a step
        report("Denoising", step, 25)
    clock.now += 0.5
    report("Done", 1, 1)
    lines = stream.getvalue().splitlines()
    # Every 5 s, not every step, and nothing in the first 5 s.
    assert lines[0] == "halfsafe: Denoising: 5 of 25, 5 s so far, about 20 s left"
    assert lines[1] == "halfsafe: Denoising: 10 of 25, 10 s so far, about 15 s left"
    assert len(lines) == 6
    assert lines[-1] == "halfsafe: Done: 1 of 1, 26 s so far"


def test_a_quick_run_prints_no_progress():
    stream, clock = io.StringIO(), Clock()
    report = ProgressLines(stream, interval=5.0, clock=clock)
    for step in range(4):
        clock.now += 1.0
        report("Denoising", step, 4)
    report("Done", 1, 1)
    assert stream.getvalue() == ""


HEADLINE = Headline("The VAE went NaN/Inf in fp16, first at decoder.conv_out; proving a fix.")


def test_a_headline_is_printed_at_once_even_in_a_quick_run():
    stream, clock = io.StringIO(), Clock()
    report = ProgressLines(stream, interval=5.0, clock=clock)
    report("Checking the VAE", 2, 3)
    clock.now += 1.0
    report(HEADLINE, 0, 0)
    assert stream.getvalue() == f"halfsafe: {HEADLINE}\n"
    clock.now += 1.0
    report("Trying a fix: run the VAE in fp32", 0, 4)  # still quiet: the first 5 s
    assert stream.getvalue().count("\n") == 1


def test_on_a_terminal_the_headline_stays_above_the_redrawn_line():
    stream = io.StringIO()
    report = RedrawnLine(stream)
    report("Checking the VAE", 2, 3)
    report(HEADLINE, 0, 0)
    report("Trying a fix: run the VAE in fp32", 1, 4)
    report.close()
    # The redrawn line is cleared and the headline ends with a newline, so it stays.
    assert f"\r\033[Khalfsafe: {HEADLINE}\n" in stream.getvalue()
    assert stream.getvalue().endswith("\r\033[K")


@pytest.mark.slow  # a demo check in fp16 that proves its fix: a minute on 2 CPU cores
def test_check_json_keeps_stdout_one_document_and_says_the_finding_first(capsys):
    status = main(["check", "demo-overflow", "--precision", "fp16", "--size", "64", "--json"])
    captured = capsys.readouterr()
    assert status == 1
    document = json.loads(captured.out)  # one JSON document, nothing else on stdout
    assert document["verdict"] == "fixable" and document["fix"]["verified"]
    finding = next(line for line in captured.err.splitlines() if "went NaN/Inf" in line)
    assert finding.startswith("halfsafe: The VAE went NaN/Inf in fp16")
    assert "decoder.up_blocks.0.resnets.0.conv1" in finding


@pytest.mark.slow
def test_generate_demo_without_a_size_makes_a_native_image_and_logs_progress(
    tmp_path, capsys, monkeypatch
):
    from app.cli import progress

    class EveryCall(progress.ProgressLines):
        def __init__(self, stream) -> None:
            super().__init__(stream, interval=0.0)

    monkeypatch.setattr(progress, "ProgressLines", EveryCall)
    status = main(
        ["generate", "demo", "--prompt", "a cat", "--steps", "2", "--json", "--out", str(tmp_path)]
    )
    captured = capsys.readouterr()
    assert status == 0
    document = json.loads(captured.out)
    from PIL import Image

    with Image.open(document["images"][0]["path"]) as image:
        assert image.size == (128, 128)
    assert "halfsafe: " in captured.err and " so far" in captured.err


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0.4, "0 s"),
        (59.4, "59 s"),
        (59.6, "1 min 00 s"),
        (299.6, "5 min 00 s"),
        (3725, "1 h 02 min"),
    ],
)
def test_a_duration_is_rounded_before_it_is_split(seconds, said):
    """A progress line said '4 min 60 s so far' for 299.6 s: the seconds were rounded after the
    minutes were taken."""
    from app.core.words.durations import duration

    assert duration(seconds) == said
