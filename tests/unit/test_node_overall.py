"""The ComfyUI check's overall verdict over its parts (`parts.overall`, `parts.summary_line`):
the worst part's, but never "healthy" where a part connected could not be checked."""

from __future__ import annotations

from tests.support.node_package import node_module


def _parts():
    return node_module("parts")


def test_a_part_not_checked_makes_a_healthy_check_incomplete():
    parts = _parts()
    verdicts = {"diffusion model": "healthy", "VAE": None}
    assert parts.overall(verdicts) == "incomplete"
    assert parts.summary_line(verdicts, ["CLIP"]) == (
        "Checked: diffusion model healthy, VAE not checked. Not connected: CLIP. "
        "Overall: incomplete."
    )


def test_a_fault_found_still_leads_and_every_part_checked_keeps_its_verdict():
    parts = _parts()
    assert parts.overall({"diffusion model": "fixable", "VAE": None}) == "fixable"
    assert parts.overall({"diffusion model": "healthy", "VAE": "healthy"}) == "healthy"
    assert parts.overall({"diffusion model": "healthy", "text encoder": "broken"}) == "broken"
