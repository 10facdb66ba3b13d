"""The message of an explanation, in words: what the image is (its status, said with the
evidence its pixels and record give), where its model was looked for when it was not found, and
what the health check at the image's settings says, with the fix in the terms of the tool that
made it. The sentences of the findings themselves are `findings.FINDING_WORDS`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from app.core.errors import WrongVariant
from app.core.explain import checkers, findings, next_steps, runtime, suspects
from app.core.explain.findings import FINDING_WORDS
from app.core.explain.matching import ModelMatch
from app.core.explain.next_steps import NextSteps
from app.core.explain.records import Record
from app.core.words.tools import TOOLS

if TYPE_CHECKING:
    from app.core.explain.explanation import Explanation


def _status_words(explanation: Explanation) -> str:
    tool = TOOLS.get(explanation.made_by)
    by = f"made by {tool.name}" if tool else "whose maker is unknown"
    checker = explanation.record.safety_checker
    if explanation.status == "nan":
        words = (
            f"This image ({by}) is NaN-black: every pixel is exactly 0, which is what a NaN "
            "becomes when the image is saved. Most often a value overflowed somewhere in the "
            "model, which only a check of the model proves: a tool that blanks an image it "
            "will not show writes the same pixels."
        )
        if checker is not None:
            words += " " + FINDING_WORDS["checker_recorded"].format(checker=checker.words())
        return words
    if findings.made_so(explanation):
        return findings.made_so_words(explanation, by)
    if explanation.status in ("nan_zeroed", "flat"):
        return findings.flat_words(explanation, by, tool.name if tool else "the tool that made it")
    remade = explanation.remade
    if remade is not None and remade.verdict == "pass_noise":
        return f"This image ({by}) has a box of noise. {remade.words} {findings.pass_words(explanation)}"
    if explanation.status == "noise_region" or explanation.pixels.noise_region:
        return findings.region_words(explanation, by)
    if explanation.status in ("saturated", "noise", "unclaimed"):
        return findings.signature_words(explanation, by)
    if explanation.status in suspects.LOOKS:
        words = [findings.look_words(explanation, by)]
        if remade is not None:
            words.append(remade.words)
        words.append(
            suspects.words(explanation.status, explanation.look_causes, explanation.record.run)
        )
        return " ".join(w for w in words if w)
    if explanation.status == "safety_checker" and checker is not None:
        return FINDING_WORDS["checker_by_elimination"].format(by=by, checker=checker.words())
    if explanation.status == "safety_checker":
        return (
            f"This image ({by}) was blanked by the model's safety checker; nothing overflowed, "
            "so no precision setting changes it."
        )
    if explanation.status == "inverted" and explanation.remade is not None:
        return f"This image ({by}) has inverted colours. {explanation.remade.words}"
    if explanation.status == "black":
        return (
            f"This image ({by}) is very dark but not NaN-black: its pixels are finite and not "
            "all zero, so nothing overflowed; it is a dark picture (try another seed or prompt)."
        )
    if explanation.made_by == "halfsafe" and explanation.record.halfsafe_status == "fixed":
        return (
            f"This image ({by}) is not black: it went non-finite while it was made, and "
            "HalfSafe's NaN watch repaired that part and made it again before it was saved. "
            "The image's record names the repair; whether a fix is remembered for the model "
            "is on the Fixes page."
        )
    matched = explanation.remade is not None and explanation.remade.verdict == "matches"
    said = f" {explanation.remade.words}" if matched and explanation.remade else ""
    return f"This image ({by}) is not black: nothing to fix.{said}"


def _not_found_words(record: Record, model: ModelMatch, steps: NextSteps | None) -> str:
    """Where the model was looked for; then, for an image whose tool is known, what such images
    from that tool usually are and its switches to try (`next_steps`), said as likely."""
    wanted = record.model or record.unet
    if wanted is None and record.model_hash is None:
        unnamed = "The image does not say which model made it, so the check could not run."
        return f"{unnamed} {next_steps.words(steps)}" if steps else unnamed
    named = wanted or f"with hash {record.model_hash}"
    where = "; ".join(model.looked_in) or "no model folders"
    if steps is None:
        return (
            f"Its model ({named}) was not found in {where}; add the folder that holds it in "
            "Settings > Model folders, then explain the image again."
        )
    return (
        f"Its model ({named}) was not found in {where}, so the health check could not "
        f"reproduce the image. {next_steps.words(steps)}"
    )


def _headline(report) -> str:
    # The check ran at the image's settings, not the user's own.
    return report.headline.replace("at your settings", "at the image's settings")


def _check_words(explanation: Explanation) -> str:
    report = explanation.check
    assert report is not None  # said only of an explanation whose check ran
    if report.verdict == "fixable" and explanation.tool_fix is not None:
        fix = explanation.tool_fix
        if fix.tool == "halfsafe":  # its flags are the whole fix, in its own words
            return (
                f"The health check reproduced it: {_headline(report)} The fix, as flags: "
                f"{' '.join(explanation.halfsafe_flags)}."
            )
        tool = TOOLS[fix.tool].name
        if explanation.node_fix is not None:  # HalfSafe's nodes, the flags their fallback
            return (
                f"The health check reproduced it: {_headline(report)} "
                f"{explanation.node_fix.words}. In HalfSafe: "
                f"{' '.join(explanation.halfsafe_flags)}."
            )
        parts = []
        if fix.flags:
            parts.append("start it with " + " ".join(fix.flags))
        if fix.settings:
            parts.append(
                "set " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in fix.settings.items())
            )
        return (
            f"The health check reproduced it: {_headline(report)} In {tool}, "
            + " and ".join(parts)
            + f". In HalfSafe: {' '.join(explanation.halfsafe_flags)}."
        )
    if report.verdict == "broken":
        return f"The health check says: {_headline(report)} No precision setting fixes it."
    if explanation.status == "noise":
        record = explanation.record
        vae = f"its VAE ({record.vae})" if record.vae else "the VAE it used"
        return FINDING_WORDS["noise_healthy"].format(vae=vae)
    if explanation.status == "safety_checker":
        switch = checkers.turn_off_words(explanation.made_by)
        words = FINDING_WORDS["checker_healthy"].format(device=report.device.name, switch=switch)
        return f"{words} {_headline(report)}"
    record = explanation.record
    suspect = ""
    if explanation.cause is not None:  # a comfy-kitchen kernel compared wrong here
        suspect = f" {explanation.cause.summary}"
    if record.attention:  # the tool ran a kernel this check did not
        suspect = (
            " The image's workflow ran SageAttention, which this check does not: it is the "
            "likely cause (see the note)."
        )
    if record.caches:  # the tool cached steps; this check computed every one
        nodes = runtime.cache_nodes(record.caches)
        first = record.caches[0].node
        suspect += " " + runtime.RUNTIME_WORDS["cache_suspect"].format(nodes=nodes, first=first)
    tool = TOOLS.get(explanation.made_by)
    if tool is not None and explanation.made_by != "halfsafe":
        suspect += " " + runtime.state_words(explanation.made_by, tool.name, record.version)
    if record.device_name == report.device.name:
        return (
            "The health check at the image's settings did not overflow on this device "
            f"({report.device.name}), the one that made the image: the same settings run "
            "finite now, so it was not the model at these settings but a fault that strikes "
            "at random or a part gone bad in memory (making it again is the test). "
            f"{_headline(report)}{suspect}"
        )
    return (
        "The health check at the image's settings did not overflow on this device "
        f"({report.device.name}); the image's GPU may differ. {_headline(report)}{suspect}"
    )


def _config_variant_words(explanation: Explanation, variant: WrongVariant) -> str:
    def said(value: int | tuple[int, ...]) -> str:
        if isinstance(value, int):
            unit = "layer" if "layer" in variant.where else "block"
            return f"{value} {unit}{'s' if value != 1 else ''}"
        return f"{variant.where} {'x'.join(str(d) for d in value)}"

    return FINDING_WORDS["variant_config"].format(
        path=explanation.model.path,
        counts=(
            f"{said(variant.in_file)} in the weights, {said(variant.in_config)} in the config "
            f"({variant.config})"
        ),
    )
