"""The components table is the one schema of a model's parts: every per-component precision
setting is declared once (`components.COMPONENT_SETTINGS`) and the settings page, the CLI
flag, the PNG's key, a device's recommendation, the resolved plan and the effective settings
all follow from it. Each test walks every component, so a part added to the table (a fourth
text encoder) without its place in one of them fails here."""

from __future__ import annotations

import dataclasses

import pytest

from app.core.components import COMPONENT_SETTING, COMPONENT_SETTINGS, COMPONENTS, SETTING_FOLLOWS
from app.core.hardware.classify import assess
from app.core.hardware.records import DeviceInfo
from app.core.precision import resolve_plan
from app.core.settings import PrecisionSettings
from app.core.settings.schema import DTYPE_CHOICES, FIELDS
from app.core.words import infotext

NAMES = list(COMPONENTS)


def follower(name: str) -> str | None:
    return SETTING_FOLLOWS.get(COMPONENTS[name].setting)


SETTINGS = [setting.key for setting in COMPONENT_SETTINGS]


@pytest.mark.parametrize("name", NAMES)
def test_every_component_is_governed_by_a_setting_of_the_table(name):
    assert COMPONENTS[name].setting in COMPONENT_SETTING


@pytest.mark.parametrize("key", SETTINGS)
def test_each_setting_is_a_field_with_its_words_and_a_flag(key):
    setting, field = COMPONENT_SETTING[key], FIELDS[key]
    assert (field.label, field.help, field.group) == (setting.label, setting.help, "Precision")
    assert field.choices == DTYPE_CHOICES and field.default == "auto" and field.cli
    assert field.flag_name == key.replace("_", "-")
    assert key in {f.name for f in dataclasses.fields(PrecisionSettings)}


@pytest.mark.parametrize("key", SETTINGS)
def test_each_setting_is_written_to_the_png_and_read_back(key):
    values = [(infotext.STEPS, 20), (infotext.SEED, 7), *infotext.setting_values({key: "bf16"})]
    written = infotext.write("a cat", "", values)
    assert f"{COMPONENT_SETTING[key].png}: bf16" in written
    back = infotext.parse(written).settings(infotext.SETTING_KEYS)
    assert back[key] == "bf16"


@pytest.mark.parametrize("key", SETTINGS)
@pytest.mark.parametrize("card", [(7, 5), (8, 6)], ids=["turing", "ampere"])
def test_each_setting_is_recommended_for_a_device_with_a_reason(key, card):
    device = assess(DeviceInfo(kind="cuda", index=0, name="a GPU", capability=card), quirks=())
    assert device.recommended[key] in DTYPE_CHOICES[1:]
    assert device.reasons[key]


@pytest.mark.parametrize("name", [n for n in NAMES if COMPONENTS[n].part_of is None])
def test_each_components_setting_puts_it_in_that_dtype_and_auto_follows_its_base(name):
    key = COMPONENTS[name].setting
    others = [n for n in NAMES if COMPONENTS[n].part_of is None]
    plan = resolve_plan(
        PrecisionSettings(precision="fp16", **{key: "fp32"}), device="cpu", components=others
    )
    assert plan.dtypes[name] == "fp32"
    # It and the parts whose setting follows it (the second and third text encoders the first).
    governed = {n for n in others if key in (COMPONENTS[n].setting, follower(n))}
    assert all(plan.dtypes[n] == "fp16" for n in others if n not in governed)
    follows = SETTING_FOLLOWS.get(key)
    if follows is not None:  # auto follows the setting it follows, not the base
        plan = resolve_plan(
            PrecisionSettings(precision="fp16", **{follows: "bf16"}),
            device="cpu",
            components=others,
        )
        assert plan.dtypes[name] == "bf16"
