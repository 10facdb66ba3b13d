"""Saved health reports outlive the window: one per model and device, kept across restarts,
bounded, and a damaged file costs only itself (kept aside, said in one sentence). Also the
Fixes page's view of profiles.json: every fix listed, edited through the schema, forgotten."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from app.core.components import Verdict
from app.core.fixing import profiles
from app.core.health import saved
from app.core.library import LibraryEntry
from app.core.requests.library_check import models_to_check
from tests.support import reports

KEY = "a" * 64
OTHER = "b" * 64
DEVICE = reports.RTX_3060.name
TORCH = "2.test"


def _save(key: str = KEY, health=None, markdown: str = reports.MARKDOWN) -> saved.SavedReport:
    stored = saved.save_report(key, reports.result(health or reports.fixable(), markdown))
    assert stored is not None
    return stored


def _files() -> list[Path]:
    return sorted(saved.folder().glob("*.json"))


# Saving and reading back ----------------------------------------------------------------------


def test_a_saved_report_reads_back_with_its_verdict_headline_fix_and_markdown():
    health = reports.fixable()
    _save(health=health)
    listing = saved.saved_reports()
    assert listing.notes == []
    [back] = listing.reports
    assert (back.profile_key, back.device, back.model_name, back.source) == (
        KEY,
        DEVICE,
        "sdxl",
        "/models/sdxl.safetensors",
    )
    assert back.verdict is Verdict.FIXABLE
    assert back.headline == health.headline
    assert back.fix_summary == health.fix.summary  # type: ignore[union-attr]
    assert back.markdown == reports.MARKDOWN
    assert saved.last_report(KEY, DEVICE) == back
    assert saved.last_report(KEY) == back  # on whichever device checked it last
    assert saved.last_report(KEY, "Another GPU") is None
    assert saved.last_report(OTHER) is None


def test_a_saved_report_keeps_its_fixs_figure_as_numbers():
    """The pages say how close the fix came from the numbers, never from the summary's text;
    a report saved before they were kept reads back without them."""
    health = reports.fixable()
    quality = health.fix.quality  # type: ignore[union-attr]
    assert quality is not None
    _save(health=health)
    [back] = saved.saved_reports().reports
    assert back.fix_quality == quality
    path = saved._file(KEY, DEVICE)
    document = json.loads(path.read_text())
    del document["fix_quality_db"], document["fix_quality_threshold_db"]
    path.write_text(json.dumps(document))
    [older] = saved.saved_reports().reports
    assert older.fix_quality is None and older.headline == back.headline
    document["fix_quality_db"] = "47 dB"
    path.write_text(json.dumps(document))
    listing = saved.saved_reports()
    assert listing.reports == [] and "'fix_quality_db' is '47 dB'" in listing.notes[0]


def test_the_next_check_of_a_model_on_a_device_replaces_its_report_and_keeps_the_others():
    _save(health=reports.fixable())
    _save(OTHER, health=reports.report())
    again = _save(health=reports.report())
    assert len(_files()) == 2
    assert saved.last_report(KEY, DEVICE) == again
    assert again.verdict is Verdict.HEALTHY and again.fix_summary == ""
    assert [r.profile_key for r in saved.saved_reports().reports] == [KEY, OTHER]  # newest first


def test_a_model_without_a_profile_key_is_not_saved():
    assert saved.save_report("", reports.result(reports.fixable())) is None
    assert _files() == []


def test_forgetting_a_report_removes_only_it():
    _save()
    _save(OTHER)
    saved.forget_report(KEY, DEVICE)
    assert [r.profile_key for r in saved.saved_reports().reports] == [OTHER]


def test_reports_are_bounded_in_count_and_size(monkeypatch):
    monkeypatch.setattr(saved, "MAX_SAVED_REPORTS", 3)
    for number in range(5):
        _save(f"{number:064x}")
        os.utime(_files()[0], None)  # written times apart, as checks are
    kept = saved.saved_reports().reports
    assert len(kept) == 3 and len(_files()) == 3
    assert {r.profile_key for r in kept} >= {f"{4:064x}"}  # the newest is never the one to go

    huge = "x" * (saved.MAX_MARKDOWN_CHARS + 5000)
    back = _save(markdown=huge)
    assert back.markdown.startswith("x" * saved.MAX_MARKDOWN_CHARS + "\n")
    assert len(back.markdown) < len(huge) and back.markdown.endswith("was not saved.)\n")
    assert saved.last_report(KEY, DEVICE) == back
    # Wide characters that would pass the file's byte limit are cut further, not refused.
    monkeypatch.setattr(saved, "MAX_REPORT_BYTES", 300_000)
    wide = _save(markdown="\U0001f600" * saved.MAX_MARKDOWN_CHARS)
    assert os.path.getsize(saved._file(KEY, DEVICE)) <= saved.MAX_REPORT_BYTES
    assert saved.last_report(KEY, DEVICE) == wide and "was not saved" in wide.markdown


# Damage --------------------------------------------------------------------------------------


def _damage_first(write) -> Path:
    _save()
    _save(OTHER)
    path = saved._file(KEY, DEVICE)
    write(path)
    return path


@pytest.mark.parametrize(
    "write, problem",
    [
        (lambda p: p.write_text('{"profile_key": "' + KEY + '", "dev'), "not valid JSON"),
        (lambda p: p.write_bytes(b"\xff\xfe\x00garbage"), "not UTF-8"),
        (lambda p: p.write_text("[" * 10_000), "nested"),
        (lambda p: p.write_text(json.dumps([1, 2])), "not a JSON object"),
        (
            lambda p: p.write_text(p.read_text().replace('"fixable"', '"splendid"')),
            "'verdict' is 'splendid'",
        ),
        (
            lambda p: p.write_text(p.read_text().replace('"saved_at": ', '"saved_at": -')),
            "not a time",
        ),
        (lambda p: p.write_bytes(b" " * (saved.MAX_REPORT_BYTES + 1)), "more than"),
        (lambda p: (p.unlink(), p.mkdir()), "folder"),
    ],
    ids=["cut short", "not text", "deep", "a list", "verdict", "time", "too large", "a folder"],
)
def test_a_damaged_report_is_kept_aside_in_one_sentence_and_costs_only_itself(write, problem):
    path = _damage_first(write)
    listing = saved.saved_reports()
    assert [r.profile_key for r in listing.reports] == [OTHER]
    [note] = listing.notes
    assert str(path) in note and problem in note and "\n" not in note
    assert "kept as" in note and "the other saved reports are kept" in note
    aside = [p for p in saved.folder().iterdir() if p.name.startswith(path.name + ".damaged-")]
    assert len(aside) == 1
    # Said once: the next read finds nothing wrong, and the next check saves anew.
    assert saved.saved_reports().notes == []
    assert _save().verdict is Verdict.FIXABLE


def test_a_report_copied_under_another_models_name_is_refused():
    _save()
    copy = saved._file(OTHER, DEVICE)
    copy.write_bytes(saved._file(KEY, DEVICE).read_bytes())
    listing = saved.saved_reports()
    assert [r.profile_key for r in listing.reports] == [KEY]
    assert "filed under another model" in listing.notes[0]


def test_files_that_are_not_reports_are_left_alone():
    _save()
    stray = saved.folder() / "notes.txt"
    stray.write_text("mine")
    assert len(saved.saved_reports().reports) == 1 and stray.read_text() == "mine"


def _save_among_other_files(reports: int, others: int) -> set[str]:
    """`reports` saved reports with `others` files that are not reports written before, between
    and after them (a folder lists in creation order, its reverse or a hash order: every report
    lands somewhere in the middle of it). Returns the reports' model keys."""
    keys = set()
    stray = saved.folder() / "not-reports"
    between = others // (reports + 1)
    for number in range(others):
        if number % between == 0 and len(keys) < reports:
            keys.add(_save(f"{len(keys):064x}").profile_key)
        (saved.folder() / f"photo-{number:05}.jpg").write_bytes(b"")
    assert not stray.exists() and len(keys) == reports
    return keys


def test_every_report_is_listed_among_ten_thousand_other_files():
    keys = _save_among_other_files(20, 10_000)
    listing = saved.saved_reports()
    assert {r.profile_key for r in listing.reports} == keys
    assert listing.notes == []


def test_a_folder_too_full_to_look_through_says_reports_may_be_missing(monkeypatch):
    monkeypatch.setattr(saved, "MAX_FOLDER_ENTRIES", 100)
    keys = _save_among_other_files(5, 300)
    listing = saved.saved_reports()
    assert {r.profile_key for r in listing.reports} <= keys
    [note] = listing.notes
    assert note.startswith("Some saved reports may not be listed: ")
    assert str(saved.folder()) in note and "more than 100 files" in note
    assert note.count(". ") == 0 and "\n" not in note


def test_reports_past_the_bound_are_said_not_listed(monkeypatch):
    for number in range(3):
        _save(f"{number:064x}")
        os.utime(_files()[0], None)
    monkeypatch.setattr(saved, "MAX_SAVED_REPORTS", 2)  # a newer HalfSafe kept more
    listing = saved.saved_reports()
    assert len(listing.reports) == 2
    assert listing.notes == [
        f"1 older saved report in {saved.folder()} is not listed: only the newest 2 are."
    ]


# The fixes in profiles.json, as the Fixes page lists and edits them ---------------------------

LAYERS = ["vae:decoder.up_blocks.0.resnets.0.conv1", "vae:decoder.up_blocks.0.resnets.0.norm2"]


def _remember(key: str = KEY, device: str = DEVICE, settings=None) -> profiles.RememberedFix:
    return profiles.remember_fix(
        key,
        device,
        settings or {"fp32_modules": LAYERS},
        "2 VAE layers in fp32",
        "health check",
        torch_version=TORCH,
    )


def test_every_stored_fix_is_listed_with_its_model_device_and_torch():
    first = _remember()
    second = _remember(OTHER, "Device | with a bar", {"vae_precision": "fp32"})
    listing = profiles.stored_fixes()
    assert listing.notes == []
    assert [(s.profile_key, s.device, s.torch_version, s.fix) for s in listing.fixes] == [
        (OTHER, "Device | with a bar", TORCH, second),
        (KEY, DEVICE, TORCH, first),
    ]


def test_an_edited_fix_is_validated_by_the_schema_and_read_back_as_edited():
    _remember()
    [stored] = profiles.stored_fixes().fixes
    with pytest.raises(ValueError, match="COMPONENT:PATH"):
        profiles.change_fix(stored, {"fp32_modules": ["decoder.conv_in"]}, "bad")
    with pytest.raises(ValueError, match="not a component"):
        profiles.change_fix(stored, {"fp32_modules": ["paint:decoder.conv_in"]}, "bad")
    with pytest.raises(ValueError, match="no fix"):
        profiles.change_fix(stored, {}, "empty")
    assert profiles.remembered_fix(KEY, DEVICE, TORCH) == stored.fix  # nothing changed

    edited = profiles.change_fix(stored, {"fp32_modules": LAYERS[:1]}, "1 VAE layer in fp32")
    again = profiles.remembered_fix(KEY, DEVICE, TORCH)
    assert again == edited and again is not None
    assert again.settings == {"fp32_modules": LAYERS[:1]}
    assert again.edited_at is not None and again.saved_at == stored.fix.saved_at
    assert again.verified_by == "health check"


def test_editing_a_fix_forgotten_meanwhile_says_so():
    _remember()
    [stored] = profiles.stored_fixes().fixes
    profiles.forget_fix(KEY, DEVICE, TORCH)
    with pytest.raises(KeyError):
        profiles.change_fix(stored, {"fp32_modules": LAYERS[:1]}, "1 VAE layer in fp32")
    assert profiles.stored_fixes().fixes == []


def test_a_fix_verified_by_anything_else_is_refused_before_it_can_damage_the_file():
    with pytest.raises(ValueError, match="verified by"):
        profiles.remember_fix(KEY, DEVICE, {"vae_precision": "fp32"}, "s", "generation", TORCH)
    _remember()
    assert profiles.lookup(KEY, DEVICE, TORCH).notes == []


def test_an_edited_at_that_is_no_time_costs_only_its_entry():
    _remember()
    _remember(OTHER)
    path = profiles._path()
    assert "edited_at" not in path.read_text()  # a fix never edited is written as it always was
    stored = next(s for s in profiles.stored_fixes().fixes if s.profile_key == KEY)
    profiles.change_fix(stored, {"fp32_modules": LAYERS[:1]}, "1 VAE layer in fp32")
    text = path.read_text()
    path.write_text(re.sub(r'"edited_at": [0-9.e+]+', '"edited_at": "yesterday"', text))
    listing = profiles.stored_fixes()
    assert [s.profile_key for s in listing.fixes] == [OTHER]
    assert "'edited_at' is 'yesterday'" in listing.notes[0]


# Which library rows a run checks --------------------------------------------------------------


def test_a_run_checks_the_librarys_models_and_says_why_it_skips_the_others():
    entries = [
        LibraryEntry("/m/good.safetensors", "sd1", "fp16", 10, supported=True, vae="/m/v.pt"),
        LibraryEntry("/m/vae.safetensors", "vae", "fp16", 10, supported=True, role="vae"),
        LibraryEntry("/m/broken.safetensors", None, None, 10, error="broken: cut short."),
        LibraryEntry("/m/old.ckpt", None, None, 10, format="pickle"),
        LibraryEntry("/m/flux.safetensors", "flux", "bf16", 10, missing="No T5 was found."),
        LibraryEntry("/m/odd.safetensors", "other", "fp16", 10),
    ]
    models = models_to_check(entries)
    assert [(m.name, m.vae) for m in models] == [
        ("good.safetensors", "/m/v.pt"),
        ("broken.safetensors", None),
        ("old.ckpt", None),
        ("flux.safetensors", None),
        ("odd.safetensors", None),
    ]
    problems = [m.problem for m in models]
    assert problems[0] is None
    assert problems[1] == "broken: cut short." and problems[3] == "No T5 was found."
    assert "pickle" in (problems[2] or "") and "odd.safetensors" in (problems[4] or "")
