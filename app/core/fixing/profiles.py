"""Remembered fixes: a verified fix stored per model, device and torch version.

A fix is stored only after it was proved by re-running the part that failed (health check or
generation repair). When the same model loads again on the same device and torch, the fix is
offered, and fields the user left on `auto` follow it.

`profiles.json` is saved state, kept with the care settings get and more. It is written
atomically under a lock file. It is read entry by entry, so that a damaged entry costs only
itself, and bounded before any JSON is parsed: only a regular file of at most
MAX_PROFILES_BYTES, each entry's extent and nesting found by a scan that never recurses. A file
with any damage is kept aside, never overwritten, once the entries that could be read are
safely written in its place (on a full or read-only disk it stays as it is, and its readable
entries are used); the one sentence that says so is returned as a note for the report. A fix
that cannot be stored (a full or read-only disk, a lock held too long) is one sentence for the
job's warnings, never an error that costs the job its result.

The fix itself, `RememberedFix`, is plain data in `remembered_fix` (re-exported here).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from app.core import paths
from app.core.components import PIPELINE_PARTS
from app.core.files import locked, replace_keeping_aside, write_atomic
from app.core.fixing import file_fixes
from app.core.fixing.remembered_fix import RememberedFix
from app.core.limits import read_regular
from app.core.settings import FIELDS, shown

PROFILES_FILE = "profiles.json"

# An entry is some 400 bytes: 4 MB holds ten thousand remembered fixes.
MAX_PROFILES_BYTES = 4 << 20
# One entry, as read back: an object of settings (one of which is a list) is 3 levels deep.
MAX_ENTRY_DEPTH = 8
MAX_ENTRY_CHARS = 64 << 10
MAX_SUMMARY_CHARS = 4000
MAX_PARTS = 16  # of a model's components named beside a fix
# Numbers of more digits than this are no time and no setting.
MAX_NUMBER_DIGITS = 20
# saved_at is seconds since 1970; a time past this (the year 5138) is damage.
LATEST_TIME = 1e11
VERIFIED_BY = ("health check", "generation repair")

log = logging.getLogger("halfsafe")


@dataclass(frozen=True)
class StoredFix:
    """One entry of the file, as the Fixes page lists it: the fix and whom it is for."""

    profile_key: str
    device: str
    torch_version: str
    fix: RememberedFix


@dataclass(frozen=True)
class StoredFixes:
    """Every fix the file holds, newest first, and a sentence when it was found damaged."""

    fixes: list[StoredFix]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Lookup:
    """The fix stored for one model on one device, and one sentence for each thing that was
    wrong with the file (empty when nothing was)."""

    fix: RememberedFix | None
    notes: list[str] = field(default_factory=list)


def _key(profile_key: str, device_name: str, torch_version: str) -> str:
    return f"{profile_key}|{device_name}|torch {torch_version}"


def _parts(key: str) -> tuple[str, str, str]:
    """(profile key, device name, torch version) of a well-formed entry's name. The profile key
    holds no "|" (a hex digest, or a demo's name); a device name may."""
    rest, _, torch_version = key.rpartition("|torch ")
    profile_key, _, device_name = rest.partition("|")
    return profile_key, device_name, torch_version


def _path() -> Path:
    return paths.data_dir() / PROFILES_FILE


def _torch_version() -> str:
    import torch

    return torch.__version__


def lookup(profile_key: str, device_name: str, torch_version: str | None = None) -> Lookup:
    """The fix stored for this model on this device and torch, if any, with a note when the
    file was damaged.

    Never raises for a bad file. A damaged file is moved aside (`profiles.json.damaged-<time>`)
    and the entries that could be read are written back, so the note is given once, by the
    read that found the damage.
    """
    contents, note = _read_repairing(_path())
    torch_version = torch_version or _torch_version()
    fix = _found(contents.fixes.get, profile_key, device_name, torch_version)
    return Lookup(fix, [note] if note else [])


def _found(
    fix_of: Callable[[str], RememberedFix | None],
    profile_key: str,
    device_name: str,
    torch_version: str,
) -> RememberedFix | None:
    """The fix stored for this model on this device and torch, the stored fixes read by their
    keys through `fix_of`."""
    fix = fix_of(_key(profile_key, device_name, torch_version))
    # The shares its own files keep, where it was loaded from several: the whole fix where it
    # has none of its own, else for the parts its own was not proved on (`file_fixes.beside`).
    # A share of this model's own fix is in it already.
    parts = {
        component: found
        for component, file_key in file_fixes.linked(profile_key).items()
        if (found := fix_of(_key(file_key, device_name, torch_version))) is not None
        and found.share_of != profile_key
    }
    return file_fixes.joined(parts) if fix is None else file_fixes.beside(fix, parts)


def remembered_fix(
    profile_key: str, device_name: str, torch_version: str | None = None
) -> RememberedFix | None:
    """The fix stored for this model on this device and torch, if any (see `lookup`)."""
    return lookup(profile_key, device_name, torch_version).fix


def remember_fix(
    profile_key: str,
    device_name: str,
    settings: dict[str, Any],
    summary: str,
    verified_by: str,
    torch_version: str | None = None,
    *,
    made_at: Mapping[str, Any] | None = None,
    parts: Collection[str] = (),
    warn: Callable[[str], None] | None = None,
    beside: Callable[[RememberedFix | None, RememberedFix], RememberedFix] | None = None,
) -> RememberedFix:
    """Store a verified fix: atomic write under the profiles lock; other models' entries are
    kept, and a damaged file is kept aside once the readable entries and this one are written
    in its place. Returns the fix.

    `beside(held, fix)`, where given, makes the fix stored from the one held for this model then
    (as `lookup` finds it, None for none) and this one, read under the same lock as the write:
    a fix another process stored meanwhile is not lost between a read and the write.

    Never raises for the disk: when the file cannot be written (full, read-only, locked by
    another program for LOCK_TIMEOUT_S) nothing saved is touched, and one sentence naming the
    file and the reason goes to `warn` (a job's warnings; logged when there is no `warn`); the
    fix is then only not remembered for the next job. Raises ValueError for a setting that is
    not valid or `verified_by` not one of VERIFIED_BY (an entry the file would refuse when read
    back). `made_at`: the precision it was proved at, as settings (`RememberedFix.made_at`);
    `parts`: the model's components (`RememberedFix.parts`)."""
    for key, value in {**settings, **(made_at or {})}.items():
        FIELDS[key].validate(value)
    if verified_by not in VERIFIED_BY:
        raise ValueError(f"a fix is verified by {' or '.join(VERIFIED_BY)}, not {verified_by!r}")
    fix = RememberedFix(
        dict(settings),
        summary,
        verified_by,
        time.time(),
        made_at=dict(made_at or {}),
        parts=tuple(p for p in parts if p in PIPELINE_PARTS),
    )
    torch_version = torch_version or _torch_version()
    key = _key(profile_key, device_name, torch_version)

    def store(entries: dict[str, dict[str, Any]]) -> None:
        nonlocal fix
        if beside is not None:
            held = _found(
                lambda k: _readable(entries.get(k)), profile_key, device_name, torch_version
            )
            fix = beside(held, fix)
            for name, value in {**fix.settings, **fix.made_at}.items():
                FIELDS[name].validate(value)
            fix = replace(fix, parts=tuple(p for p in fix.parts if p in PIPELINE_PARTS))
        if verified_by != "health check" and _proved_by_check(entries.get(key), fix):
            return  # the same fix, proved against fp32 by the check: that proof stays
        entries[key] = _entry(fix)
        # Each part's share also under its own file's key, for a host that loads that file.
        for component, file_key in file_fixes.linked(profile_key).items():
            share = file_fixes.part_fix(fix, component)
            if share is not None:
                share = replace(share, share_of=profile_key)
                entries[_key(file_key, device_name, torch_version)] = _entry(share)

    try:
        _change(store)
    except OSError as error:
        sentence = _unsaved_words(_path(), error)
        if warn is None:
            log.warning("%s", sentence)
        else:
            warn(sentence)
    return fix


def _proved_by_check(entry: Any, fix: RememberedFix) -> bool:
    """Whether a stored entry is `fix` (the same settings, a layer list in any order, proved at
    the same precision) as the health check proved it: a generation that makes an image with it
    again proves less (it compares nothing with fp32), so it does not replace that record."""
    if not isinstance(entry, dict) or entry.get("verified_by") != "health check":
        return False

    def settled(settings: Any) -> Any:
        if not isinstance(settings, dict):
            return None
        return {
            k: sorted(map(str, v)) if isinstance(v, list | tuple) else v
            for k, v in settings.items()
        }

    same_settings = settled(entry.get("settings")) == settled(fix.settings)
    same_place = not fix.made_at or entry.get("made_at", {}) in ({}, fix.made_at)
    return same_settings and same_place


def _unsaved_words(path: Path, error: OSError) -> str:
    """The sentence for a fix that could not be stored in `path`."""
    return (
        f"The fix was not remembered for the next job: {path} could not be written "
        f"({_reason(error)}); the files already saved are as they were."
    )


def _reason(error: OSError) -> str:
    return str(error.strerror or error)


def forget_fix(profile_key: str, device_name: str, torch_version: str | None = None) -> None:
    """Drop the fix stored for this model on this device and torch, if any. Raises OSError when
    the file cannot be written (nothing saved is touched then)."""
    key = _key(profile_key, device_name, torch_version or _torch_version())

    def forget(entries: dict[str, dict[str, Any]]) -> None:
        entries.pop(key, None)
        for name in _shares_of(entries, key):  # its parts' shares under their files' keys
            entries.pop(name)

    _change(forget)


def _shares_of(entries: Mapping[str, Any], key: str) -> list[str]:
    """The names of the entries that are a part's share of the fix stored as `key` (for the
    same device and torch), kept under the part's own file's key."""
    model, device, torch_version = _parts(key)
    return [
        name
        for name, entry in entries.items()
        if isinstance(entry, dict)
        and entry.get("share_of") == model
        and _parts(name)[1:] == (device, torch_version)
    ]


def stored_fixes() -> StoredFixes:
    """Every fix the file holds, for every model, device and torch, newest first (the Fixes
    page's list; no torch is imported). A damaged file is handled as `lookup` handles it."""
    contents, note = _read_repairing(_path())
    fixes = [StoredFix(*_parts(key), fix) for key, fix in contents.fixes.items()]
    fixes.sort(key=lambda stored: stored.fix.saved_at, reverse=True)
    return StoredFixes(fixes, [note] if note else [])


def change_fix(stored: StoredFix, settings: dict[str, Any], summary: str) -> RememberedFix:
    """Replace the settings of a stored fix by hand (the Fixes page's Edit): validated through
    the schema, stamped `edited_at`, its verification and time kept. Raises ValueError for a
    bad setting or an empty fix, KeyError when the fix is no longer stored, and OSError when the
    file cannot be written (nothing saved is touched then)."""
    if not settings:
        raise ValueError("a fix with no settings left is no fix (Forget removes it)")
    checked = {}
    for name, value in settings.items():
        if name not in FIELDS:
            raise ValueError(f"{shown(name)} is not a setting")
        checked[name] = FIELDS[name].validate(value)
    fix = replace(stored.fix, settings=checked, summary=summary, edited_at=time.time())
    key = _key(stored.profile_key, stored.device, stored.torch_version)
    changed: list[str] = []

    def edit(entries: dict[str, dict[str, Any]]) -> None:
        if key in entries:
            entries[key] = {**entries[key], **_entry(fix)}
            changed.append(key)
            for name in _shares_of(entries, key):  # each part's share follows the edit
                held = _fix_from(entries[name]) if not _entry_problem(name, entries[name]) else None
                part = held.parts[0] if held is not None and held.parts else None
                share = file_fixes.part_fix(fix, part) if part is not None else None
                if share is None:
                    entries.pop(name)
                else:
                    entries[name] = _entry(replace(share, share_of=stored.profile_key))

    _change(edit)
    if not changed:
        raise KeyError("this fix is no longer remembered")
    return fix


def _entry(fix: RememberedFix) -> dict[str, Any]:
    """A fix as the file holds it; `edited_at` only once it was edited (the file of a fix
    never edited reads as it always did)."""
    entry = asdict(fix)
    if fix.edited_at is None:
        del entry["edited_at"]
    if not fix.made_at:
        del entry["made_at"]
    if fix.parts:
        entry["parts"] = list(fix.parts)
    else:
        del entry["parts"]
    if fix.share_of is None:
        del entry["share_of"]
    return entry


# Reading ----------------------------------------------------------------------------------


@dataclass
class _Contents:
    """What could be read from the file."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)  # as written back
    fixes: dict[str, RememberedFix] = field(default_factory=dict)  # those this version uses
    problems: list[str] = field(default_factory=list)  # phrases: "entry 3: 'saved_at' is ..."


def _read(path: Path) -> _Contents:
    """The file's entries, each checked alone, and what was wrong with the rest."""
    if not os.path.lexists(path):
        return _Contents()
    try:
        raw = read_regular(path, MAX_PROFILES_BYTES)
    except OSError as error:
        return _Contents(problems=[_file_problem(error)])
    # A byte that is not UTF-8 becomes a lone surrogate, which fails only the entry it is in.
    text = raw.decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")
    contents = _Contents()
    seen: dict[str, int] = {}
    for number, key, value, problem in _scan(text, contents.problems):
        if problem is None:
            problem = _entry_problem(key, value)
        if problem is None and key in seen:
            problem = "a second entry for the same model, device and torch"
            contents.entries.pop(key, None)  # which of the two is right cannot be told
            contents.fixes.pop(key, None)
        seen[key] = number
        if problem is not None or not isinstance(value, dict):
            contents.problems.append(f"entry {number}: {problem}")
            continue
        contents.entries[key] = value
        fix = _fix_from(value)
        if fix is not None:
            contents.fixes[key] = fix
    return contents


def _file_problem(error: OSError) -> str:
    reason = error.strerror or str(error)
    if reason.startswith("it is"):  # limits' own words: "it is a named pipe (FIFO), ..."
        return reason
    return f"it cannot be read ({reason})"


_SPACE = re.compile(r"[ \t\r\n]*")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# What an entry's extent depends on: strings (whose brackets do not count), brackets, and a
# quote that opens a string never closed.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}"]', re.DOTALL)
_BAD_BYTE = re.compile("[\udc80-\udcff]")
# json.dumps(indent=2) starts each entry on a line of its own, indented by two spaces: where
# reading resumes after damage between entries.
_NEXT_ENTRY = '\n  "'


def _skip(text: str, position: int) -> int:
    """Where the white space at `position` ends."""
    space = _SPACE.match(text, position)
    return space.end() if space else position


def _scan(text: str, problems: list[str]) -> Iterator[tuple[int, str, Any, str | None]]:
    """(number, key, value, problem) for each entry of the top-level object in `text`, decoded
    one by one; damage between entries is added to `problems` and reading resumes at the next
    entry's line."""
    position = _skip(text, 0)
    if not text.startswith("{", position):
        problems.append("it does not hold a JSON object")
        return
    position += 1
    number = 0
    while True:
        position = _skip(text, position)
        if position >= len(text):
            problems.append("it ends in the middle (it was cut short)")
            return
        if text[position] == "}":
            if text[position + 1 :].strip():
                problems.append("it has text after its end")
            return
        number += 1
        start = position
        key, value, position, problem = _one_entry(text, position)
        if problem is None:
            yield number, key, value, None
            position = _skip(text, position)
            if text.startswith(",", position):
                position += 1
                continue
            if text.startswith("}", position) or position >= len(text):
                continue
            problems.append(f"a stray character after entry {number}")
        else:
            yield number, key, None, problem
        resume = text.find(_NEXT_ENTRY, start + 1)
        if resume < 0:
            return
        position = resume + 1


def _one_entry(text: str, position: int) -> tuple[str, Any, int, str | None]:
    """The key and decoded value of the entry at `position`, where it ends, and its problem."""
    quoted = _STRING.match(text, position)
    if quoted is None:
        return "", None, position, "its name is not a quoted string"
    try:
        key = _decode(quoted.group())
    except ValueError as error:
        return "", None, position, f"its name is damaged ({error})"
    position = _skip(text, quoted.end())
    if not text.startswith(":", position):
        return key, None, position, "its name is not followed by a colon"
    position = _skip(text, position + 1)
    if not text.startswith("{", position):
        return key, None, position, "it is not a JSON object"
    end, problem = _object_end(text, position)
    if problem is not None:
        return key, None, position, problem
    try:
        return key, _decode(text[position:end]), end, None
    except ValueError as error:
        return key, None, end, str(error)


def _object_end(text: str, start: int) -> tuple[int, str | None]:
    """Where the object at `start` ends, found by counting brackets outside strings (before
    json sees it, and without recursion), or the reason it cannot be read."""
    depth = 0
    for token in _TOKENS.finditer(text, start):
        if token.end() - start > MAX_ENTRY_CHARS:
            return start, f"it is longer than {MAX_ENTRY_CHARS:,} characters"
        mark = token.group()
        if mark in ("{", "["):
            depth += 1
            if depth > MAX_ENTRY_DEPTH:
                return start, f"it is nested more than {MAX_ENTRY_DEPTH} levels deep"
        elif mark in ("}", "]"):
            depth -= 1
            if depth == 0:
                return token.end(), None
        elif mark == '"':
            return start, "it ends in the middle of a text (it was cut short)"
    return start, "it ends in the middle (it was cut short)"


def _decode(text: str) -> Any:
    """JSON text of a bounded extent, refusing what no HalfSafe writes: NaN or Infinity, numbers
    of dozens of digits, a name given twice in one object, bytes that were not UTF-8."""
    if _BAD_BYTE.search(text):
        raise ValueError("it holds bytes that are not UTF-8 text")
    try:
        return json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            object_pairs_hook=_unique_names,
        )
    except json.JSONDecodeError as error:
        # json's messages end in " at" before a position that is the entry's, not the file's.
        return _raise(f"it is not valid JSON: {error.msg.lower().removesuffix(' at')}")
    except RecursionError:  # cannot happen after _object_end's count; refused all the same
        return _raise(f"it is nested more than {MAX_ENTRY_DEPTH} levels deep")


def _raise(problem: str) -> Any:
    raise ValueError(problem)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"it holds {name}, which is not a number")


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_NUMBER_DIGITS:
        raise ValueError(f"it holds a number of {digits} digits")
    return int(text)


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"it holds {shown(text)}, a number too large for any setting or time")
    return number


def _unique_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    names: dict[str, Any] = {}
    for name, value in pairs:
        if name in names:
            raise ValueError(f"it names '{shown(name)[1:-1]}' twice")
        names[name] = value
    return names


def _entry_problem(key: str, entry: Any) -> str | None:
    """What is wrong with one decoded entry, or None when it is well formed."""
    if len(key) > 1000 or "|torch " not in key:
        return f"its name {shown(key)} is not a model, device and torch version"
    if not isinstance(entry, dict):
        return "it is not a JSON object"
    settings = entry.get("settings")
    if not isinstance(settings, dict) or not settings:
        return "'settings' is not an object of settings"
    summary = entry.get("summary")
    if not isinstance(summary, str) or len(summary) > MAX_SUMMARY_CHARS:
        return f"'summary' is {shown(summary)}, not a sentence"
    if entry.get("verified_by") not in VERIFIED_BY:
        return f"'verified_by' is {shown(entry.get('verified_by'))}"
    saved_at = entry.get("saved_at")
    if not _is_time(saved_at):
        return f"'saved_at' is {shown(saved_at)}, not a time"
    edited_at = entry.get("edited_at")
    if edited_at is not None and not _is_time(edited_at):
        return f"'edited_at' is {shown(edited_at)}, not a time"
    made_at = entry.get("made_at", {})
    if not isinstance(made_at, dict):
        return "'made_at' is not an object of settings"
    parts = entry.get("parts", [])
    if (
        not isinstance(parts, list)
        or len(parts) > MAX_PARTS
        or not all(isinstance(p, str) and len(p) <= 100 for p in parts)
    ):
        return f"'parts' is {shown(parts)}, not a list of a model's components"
    share_of = entry.get("share_of")
    if share_of is not None and (not isinstance(share_of, str) or len(share_of) > 1000):
        return f"'share_of' is {shown(share_of)}, not a model's key"
    for name, value in (*settings.items(), *made_at.items()):
        if name not in FIELDS:
            continue  # a setting of a newer HalfSafe: the entry is kept for it, not used here
        try:
            FIELDS[name].validate(value)
        except ValueError as error:
            return f"setting '{name}': {error}"
    return None


def _is_time(value: Any) -> bool:
    """Seconds since 1970 that a HalfSafe could have written."""
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= LATEST_TIME
    )


def _readable(entry: Any) -> RememberedFix | None:
    """The fix in an entry of the file as read under the lock (None: none, or not one this
    version reads)."""
    try:
        return _fix_from(entry) if isinstance(entry, dict) else None
    except (KeyError, TypeError, ValueError):
        return None


def _fix_from(entry: dict[str, Any]) -> RememberedFix | None:
    """The fix in a well-formed entry; None when it holds a setting this version does not know
    (half of a fix is not a verified fix)."""
    settings = entry["settings"]
    if any(name not in FIELDS for name in settings):
        return None
    return RememberedFix(
        {name: FIELDS[name].validate(value) for name, value in settings.items()},
        entry["summary"],
        entry["verified_by"],
        float(entry["saved_at"]),
        None if entry.get("edited_at") is None else float(entry["edited_at"]),
        # a precision setting of a newer HalfSafe it was proved at is left out, not the fix
        {
            name: FIELDS[name].validate(value)
            for name, value in entry.get("made_at", {}).items()
            if name in FIELDS
        },
        # a component of a newer HalfSafe is left out: the words fall back for it
        tuple(p for p in entry.get("parts", []) if p in PIPELINE_PARTS),
        entry.get("share_of"),
    )


# Writing ----------------------------------------------------------------------------------


def _read_repairing(path: Path) -> tuple[_Contents, str | None]:
    """Read the file; if it is damaged, write back what could be read and keep the damaged file
    aside (under the lock, so a save by another process is never lost). Returns the note to
    show."""
    contents = _read(path)
    if not contents.problems:
        return contents, None
    try:
        with locked(path):
            contents = _read(path)  # another process may have repaired it meanwhile
            if not contents.problems:
                return contents, None
            target = _repair(path, contents.entries)
    except OSError as error:
        return contents, _note(path, contents, None, error)
    return contents, None if target is None else _note(path, contents, target, None)


def _repair(path: Path, entries: dict[str, dict[str, Any]]) -> Path | None:
    """Write `entries` (the readable ones, perhaps changed) in place of the damaged file, which
    is kept aside only once they are safely on disk (also a FIFO, a folder or a link loop, which
    are moved). Returns where the damaged file is kept; raises OSError with the damaged file
    left in place when the new one cannot be written. Call under the lock."""
    return replace_keeping_aside(path, _text(entries))


def _note(path: Path, contents: _Contents, target: Path | None, error: OSError | None) -> str:
    """One sentence: what was wrong with the file, what was kept and where the file went."""
    problem = contents.problems[0]
    if len(contents.problems) > 1:
        problem += f", and {len(contents.problems) - 1} more"
    count = len(contents.fixes)
    if count == 0:
        kept = "no remembered fix could be read"
    elif count == 1:
        kept = "the 1 remembered fix that could be read is {}"
    else:
        kept = f"the {count} remembered fixes that could be read are {{}}"
    if target is not None:
        return (
            f"{path} was damaged ({problem}); {kept.format('kept')}, and the file as it was is "
            f"kept as {target}."
        )
    reason = _reason(error) if error is not None else "unknown reason"
    return (
        f"{path} is damaged ({problem}); {kept.format('used')}, and the file is left as it is "
        f"because a repaired copy could not be written in its place ({reason})."
    )


def _change(edit: Callable[[dict[str, dict[str, Any]]], object]) -> None:
    """Read, edit and write the entries under the lock. A damaged file is kept aside once the
    readable entries, edited, are written in its place. Raises OSError when the file cannot be
    written (a full or read-only disk, the lock held too long); nothing saved is touched then."""
    path = _path()
    with locked(path):
        contents = _read(path)
        entries = dict(contents.entries)
        edit(entries)
        if contents.problems:
            target = _repair(path, entries)
            if target is not None:
                log.warning("%s", _note(path, contents, target, None))
        elif entries != contents.entries:
            write_atomic(path, _text(entries))


def _text(entries: dict[str, dict[str, Any]]) -> str:
    """The file's text for `entries`; past MAX_PROFILES_BYTES the oldest fixes make room (a
    file that large would be refused when read back)."""
    ordered = sorted(entries.items(), key=lambda item: item[1].get("saved_at", 0), reverse=True)
    text = _dumps(dict(ordered))
    while len(text.encode("utf-8")) > MAX_PROFILES_BYTES and ordered:
        ordered = ordered[: max(1, len(ordered) * 9 // 10)] if len(ordered) > 1 else []
        text = _dumps(dict(ordered))
    return text


def _dumps(entries: dict[str, dict[str, Any]]) -> str:
    return json.dumps(entries, indent=2, sort_keys=True) + "\n"
