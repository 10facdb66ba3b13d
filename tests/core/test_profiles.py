"""Remembered fixes survive a damaged profiles.json: what can be read is kept, the damaged file
is kept aside and named, and nothing in the file can hang or crash a check."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from app.core.fixing import profiles
from app.core.health.request import CheckRequest, CheckRun

TORCH = "2.test"
DEVICE = "Test CPU"
SEEDED = 5
NEW = "model-new"


def seed() -> Path:
    """Five remembered fixes, written as HalfSafe writes them; returns the file."""
    for number in range(SEEDED):
        profiles.remember_fix(
            f"model{number}",
            DEVICE,
            {"vae_precision": "fp32", "upcast_attention": True},
            f"The VAE overflowed ({number}); run it in fp32.",
            "health check",
            torch_version=TORCH,
        )
    path = profiles._path()
    assert len(json.loads(path.read_text())) == SEEDED
    return path


def usable() -> set[str]:
    """The seeded models whose fix is still offered, by model name."""
    found = set()
    for name in [f"model{n}" for n in range(SEEDED)] + [NEW]:
        if profiles.remembered_fix(name, DEVICE, TORCH) is not None:
            found.add(name)
    return found


def entry_span(text: str, number: int) -> tuple[int, int]:
    """Where the text of seeded entry `number` (its value, an object) starts and ends."""
    start = text.index(f'"model{number}|')
    start = text.index("{", start)
    return start, text.index("\n  }", start) + 4


def in_entry(number: int, old: str, new: str):
    """Damage: replace `old` by `new` inside one entry only."""

    def damage(path: Path) -> None:
        text = path.read_text()
        start, end = entry_span(text, number)
        assert old in text[start:end]
        path.write_text(text[:start] + text[start:end].replace(old, new, 1) + text[end:])

    return damage


def raw_in_entry(number: int, old: bytes, new: bytes):
    def damage(path: Path) -> None:
        text = path.read_text()
        start, end = entry_span(text, number)
        data = path.read_bytes()
        head, middle, tail = data[:start], data[start:end], data[end:]
        path.write_bytes(head + middle.replace(old, new, 1) + tail)

    return damage


def truncated(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: entry_span(text, 3)[0] + 20])  # cut inside the fourth entry


def stray_between(path: Path) -> None:
    text = path.read_text()
    end = entry_span(text, 1)[1]
    path.write_text(text[: end + 1] + "\x01" + text[end + 1 :])  # after "},"


def stray_in_entry(path: Path) -> None:
    text = path.read_text()
    start, _ = entry_span(text, 2)
    path.write_text(text[: start + 10] + "}" + text[start + 10 :])


def deep_in_entry(path: Path) -> None:
    in_entry(2, '"summary": "The', '"summary": ' + "[" * 100_000 + "]" * 100_000 + ', "x": "')(path)


def duplicate_entry(path: Path) -> None:
    text = path.read_text()
    start, end = entry_span(text, 2)
    name_at = text.rindex('"model2|', 0, start)
    copy = text[name_at:end]
    path.write_text(text[:end] + ",\n  " + copy + text[end:])


def replaced_by(content: bytes):
    def damage(path: Path) -> None:
        path.write_bytes(content)

    return damage


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def folder(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("kept")


def link_loop(path: Path) -> None:
    path.unlink()
    other = path.with_name("loop")
    os.symlink(other, path)
    os.symlink(path, other)


def huge(path: Path) -> None:
    with path.open("a") as file:  # valid JSON, padded past any real profiles file
        file.write(" " * (profiles.MAX_PROFILES_BYTES + 1))


ALL = {f"model{n}" for n in range(SEEDED)}
DAMAGE = {
    # name: (damage, the seeded fixes that can still be read)
    "truncated": (truncated, ALL - {"model3", "model4"}),
    "stray byte between entries": (stray_between, ALL),
    "stray byte inside an entry": (stray_in_entry, ALL - {"model2"}),
    "settings not an object": (in_entry(1, '"settings": {', '"settings": "fp32", "x": {'), None),
    "setting out of its choices": (in_entry(1, '"fp32"', '"fp64"'), None),
    "setting of the wrong type": (in_entry(1, "true", '"yes"'), None),
    "summary a number": (in_entry(1, '"summary": "The', '"summary": 5, "x": "'), None),
    "verified_by unknown": (in_entry(1, '"health check"', '"a friend"'), None),
    "saved_at as text": (in_entry(1, '"saved_at": ', '"saved_at": "yesterday", "x": '), None),
    "saved_at NaN": (in_entry(1, '"saved_at": ', '"saved_at": NaN, "x": '), None),
    "saved_at infinite": (in_entry(1, '"saved_at": ', '"saved_at": 1e999, "x": '), None),
    "saved_at of 5000 digits": (
        in_entry(1, '"saved_at": ', f'"saved_at": {"9" * 5000}, "x": '),
        None,
    ),
    "saved_at negative": (in_entry(1, '"saved_at": ', '"saved_at": -1, "x": '), None),
    "name given twice in an entry": (
        in_entry(1, '"summary": "', '"summary": "a", "summary": "'),
        None,
    ),
    "entry given twice": (duplicate_entry, ALL - {"model2"}),
    "deep nesting in an entry": (deep_in_entry, ALL - {"model2"}),
    "deep nesting": (replaced_by(b"[" * 1_000_000), set()),
    "not UTF-8": (raw_in_entry(1, b"overflowed", b"overfl\xff\xfeowed"), None),
    "top-level list": (replaced_by(b"[1, 2, 3]\n"), set()),
    "empty": (replaced_by(b""), set()),
    "huge file": (huge, set()),
    "FIFO": (fifo, set()),
    "folder": (folder, set()),
    "symlink loop": (link_loop, set()),
}


def survivors(name: str) -> set[str]:
    expected = DAMAGE[name][1]
    return ALL - {"model1"} if expected is None else expected


def guarded(function, timeout: float = 20.0):
    """Run `function` on a thread; fail (never hang) if it is still blocked after `timeout`."""
    outcome: list = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(function())
        except BaseException as error:  # noqa: BLE001 - handed to the test below
            failure.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still blocked after {timeout} s"
    if failure:
        raise failure[0]
    return outcome[0]


def kept_aside(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.damaged-*"))


def snapshot(path: Path) -> tuple[str, bytes | None]:
    """What the damaged thing is, and its bytes when it is a file, to compare with the copy."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return "link", os.readlink(path).encode()
    if stat.S_ISREG(mode):
        return "file", path.read_bytes()
    return ("folder" if stat.S_ISDIR(mode) else "fifo"), None


def needs(name: str) -> None:
    if name == "FIFO" and not hasattr(os, "mkfifo"):
        pytest.skip("FIFOs are a POSIX thing")


@pytest.mark.parametrize("name", DAMAGE)
def test_a_save_after_damage_keeps_every_fix_that_could_be_read(name):
    needs(name)
    path = seed()
    DAMAGE[name][0](path)
    before = snapshot(path)

    guarded(
        lambda: profiles.remember_fix(
            NEW, DEVICE, {"vae_precision": "bf16"}, "new", "generation repair", torch_version=TORCH
        )
    )

    expected = survivors(name)
    assert guarded(usable) == expected | {NEW}
    assert len(json.loads(path.read_text())) == len(expected) + 1
    [aside] = kept_aside(path)  # the damaged file, as it was: never overwritten
    assert snapshot(aside) == before


@pytest.mark.parametrize("name", DAMAGE)
def test_damage_is_named_once_in_one_sentence_and_costs_only_itself(name):
    needs(name)
    path = seed()
    DAMAGE[name][0](path)
    before = snapshot(path)

    found = guarded(lambda: profiles.lookup("model0", DEVICE, TORCH))

    expected = survivors(name)
    assert (found.fix is not None) == ("model0" in expected)
    [note] = found.notes
    [aside] = kept_aside(path)
    assert note.startswith(f"{path} was damaged (")
    assert note.endswith(f"kept as {aside}.")
    if expected:
        assert f"the {len(expected)} remembered fix" in note
    else:
        assert "no remembered fix could be read" in note
    assert note.count(". ") == 0 and "\n" not in note and len(note) < 600
    assert snapshot(aside) == before
    # Written back: the next read is clean and says nothing more.
    assert guarded(lambda: profiles.lookup("model0", DEVICE, TORCH)).notes == []
    assert guarded(usable) == expected


def test_the_problem_in_the_note_names_the_entry_and_the_field():
    path = seed()
    in_entry(1, '"saved_at": ', '"saved_at": "yesterday", "x": ')(path)
    [note] = profiles.lookup("model0", DEVICE, TORCH).notes
    assert "entry 2: 'saved_at' is 'yesterday', not a time" in note


def test_each_damage_is_kept_in_its_own_file():
    path = seed()
    truncated(path)
    profiles.lookup("model0", DEVICE, TORCH)
    first = kept_aside(path)
    replaced_by(b"{oops")(path)
    profiles.lookup("model0", DEVICE, TORCH)
    second = kept_aside(path)
    assert len(first) == 1 and len(second) == 2
    assert first[0].read_bytes() != second[1].read_bytes()
    assert b"model0" in first[0].read_bytes()


def test_an_entry_of_a_newer_halfsafe_is_kept_but_not_used():
    path = seed()
    in_entry(1, '"vae_precision": "fp32"', '"vae_precision": "fp32", "future_option": 3')(path)
    assert profiles.lookup("model1", DEVICE, TORCH) == profiles.Lookup(None, [])
    profiles.remember_fix(NEW, DEVICE, {"vae_precision": "bf16"}, "new", "health check", TORCH)
    saved = json.loads(path.read_text())
    assert len(saved) == SEEDED + 1
    assert saved[f"model1|{DEVICE}|torch {TORCH}"]["settings"]["future_option"] == 3
    assert kept_aside(path) == []


def test_forgetting_a_fix_keeps_the_others():
    seed()
    profiles.forget_fix("model3", DEVICE, TORCH)
    assert usable() == ALL - {"model3"}


def test_a_check_and_the_model_summary_name_the_damaged_file():
    from app.core import health
    from app.core.models import load_model
    from app.core.models.summary import summarise
    from app.core.settings import PrecisionSettings

    path = seed()
    truncated(path)
    model = load_model("demo")
    summary = summarise(model, "cpu")  # the GUI's first read of the file says it
    [note] = summary.profile_notes
    assert note.startswith(f"{path} was damaged")

    fifo(path)
    report = health.check_loaded(
        model,
        CheckRequest(precision=PrecisionSettings(precision="fp32"), device="cpu", size=64),
        run=CheckRun(measure_cost=False),
    )
    assert any(n.startswith(f"{path} was damaged (it is a named pipe") for n in report.notes)
    assert len(kept_aside(path)) == 2


def test_a_json_problem_is_named_without_a_dangling_position():
    from app.core.fixing import profiles

    with pytest.raises(ValueError) as caught:
        profiles._decode('{"summary": "a\x01b"}')
    assert str(caught.value) == "it is not valid JSON: invalid control character"


PROVED_AT = {"precision": "fp16", "vae_precision": "fp16", "no_half": False, "no_half_vae": False}


def test_the_precision_a_fix_was_proved_at_is_kept_and_read_back():
    path = seed()
    fix = profiles.remember_fix(
        NEW, DEVICE, {"vae_precision": "fp32"}, "new", "health check", TORCH, made_at=PROVED_AT
    )
    assert fix.made_at == PROVED_AT and fix.proved_at() == PROVED_AT
    assert json.loads(path.read_text())[f"{NEW}|{DEVICE}|torch {TORCH}"]["made_at"] == PROVED_AT
    assert profiles.remembered_fix(NEW, DEVICE, TORCH) == fix
    # A fix saved before the precision was kept reads as it did, taken to be for fp16.
    older = profiles.remembered_fix("model1", DEVICE, TORCH)
    assert older is not None and older.made_at == {}
    assert "made_at" not in json.loads(path.read_text())[f"model1|{DEVICE}|torch {TORCH}"]
    assert older.proved_at()["precision"] == "fp16" and older.proved_at()["no_half"] is False


def test_a_damaged_proved_at_costs_only_its_entry():
    path = seed()
    in_entry(2, '"saved_at"', '"made_at": {"precision": "fp17"}, "saved_at"')(path)
    assert usable() == ALL - {"model2"}
    assert kept_aside(path) != []
    with pytest.raises(ValueError):
        profiles.remember_fix(
            NEW, DEVICE, {"vae_precision": "fp32"}, "new", "health check", made_at={"no_half": 3}
        )


def test_the_parts_a_fix_was_proved_on_are_kept_and_read_back():
    """A Flux model's fix says its transformer wherever it is shown, the model loaded or not."""
    path = seed()
    parts = ("text_encoder", "text_encoder_2", "transformer", "vae")
    fix = profiles.remember_fix(
        NEW, DEVICE, {"unet_precision": "bf16"}, "new", "health check", TORCH, parts=parts
    )
    assert fix.parts == parts
    assert json.loads(path.read_text())[f"{NEW}|{DEVICE}|torch {TORCH}"]["parts"] == list(parts)
    assert profiles.remembered_fix(NEW, DEVICE, TORCH) == fix
    older = profiles.remembered_fix("model1", DEVICE, TORCH)  # saved before parts were kept
    assert older is not None and older.parts == ()
    assert "parts" not in json.loads(path.read_text())[f"model1|{DEVICE}|torch {TORCH}"]


@pytest.mark.parametrize(
    "parts", ['"transformer"', "[1]", '["x"' + ', "x"' * 40 + "]", '["' + "t" * 200 + '"]']
)
def test_damaged_parts_cost_only_their_entry_and_a_newer_component_is_left_out(parts):
    path = seed()
    in_entry(2, '"saved_at"', f'"parts": {parts}, "saved_at"')(path)
    assert usable() == ALL - {"model2"}
    assert kept_aside(path) != []
    path = seed()
    in_entry(2, '"saved_at"', '"parts": ["transformer", "hypernetwork"], "saved_at"')(path)
    assert usable() == ALL
    fix = profiles.remembered_fix("model2", DEVICE, TORCH)
    assert fix is not None and fix.parts == ("transformer",)


def test_a_generation_proving_a_checked_fix_again_keeps_the_checks_proof():
    """The check compared the fix with fp32; an image made with it again compares nothing: the
    check's record stays (the Fixes page keeps showing its figure). A different fix from a
    generation replaces it as before."""
    path = seed()
    layers = {"fp32_modules": ["vae:decoder.conv_in", "vae:decoder.up_blocks.0.resnets.0.conv1"]}
    checked = profiles.remember_fix(
        NEW, DEVICE, layers, "keep 2 VAE layers in fp32", "health check", TORCH, made_at=PROVED_AT
    )
    again = {"fp32_modules": layers["fp32_modules"][::-1]}
    profiles.remember_fix(
        NEW, DEVICE, again, "keep 2 VAE layers", "generation repair", TORCH, made_at=PROVED_AT
    )
    assert profiles.remembered_fix(NEW, DEVICE, TORCH) == checked
    other = {"vae_precision": "fp32"}
    profiles.remember_fix(NEW, DEVICE, other, "the VAE in fp32", "generation repair", TORCH)
    replaced = profiles.remembered_fix(NEW, DEVICE, TORCH)
    assert replaced is not None and replaced.verified_by == "generation repair"
    assert replaced.settings == other
    assert len(json.loads(path.read_text())) == SEEDED + 1


@pytest.mark.parametrize("upsampler", [False, True], ids=["sd1", "with_prompt_upsampler"])
def test_the_app_records_a_jobs_precision_as_the_check_records_its_plan(upsampler):
    """The check remembers a fix at its plan's precision (`PrecisionPlan.dtype_settings`); the
    app, remembering the same fix after an image made with it came out finite, records the
    job's precision from the settings the job recorded (`dtype_settings_of`), which name every
    part's precision, the prompt upsampler's too. For a model without an upsampler that extra
    key made the two records differ, so the generation's weaker proof replaced the check's (the
    Fixes page lost its figure)."""
    from app.core.generation.records import settings_of
    from app.core.precision import PrecisionPlan
    from app.core.precision.plan import dtype_settings_of
    from app.core.settings import PrecisionSettings

    parts = ["text_encoder", "unet", "vae", *(["prompt_upsampler"] if upsampler else [])]
    plan = PrecisionPlan(device="cpu", dtypes=dict.fromkeys(parts, "fp16"))
    job_settings = settings_of(plan, PrecisionSettings(precision="fp16"))  # as a job records
    assert "prompt_upsampler_precision" in job_settings
    assert dtype_settings_of(job_settings, parts) == plan.dtype_settings()

    seed()
    layers = {"bf16_modules": ["vae:decoder.conv_in"]}
    checked = profiles.remember_fix(
        NEW,
        DEVICE,
        layers,
        "keep 1 VAE layer in bf16",
        "health check",
        TORCH,
        made_at=plan.dtype_settings(),
    )
    profiles.remember_fix(
        NEW,
        DEVICE,
        layers,
        "keep 1 VAE layer in bf16",
        "generation repair",
        TORCH,
        made_at=dtype_settings_of(job_settings, parts),
    )
    assert profiles.remembered_fix(NEW, DEVICE, TORCH) == checked
