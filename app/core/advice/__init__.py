"""Which file of a model family runs on this device: each stored form the family is published
in, what the device does with it, the memory it needs and whether a check proved it here.

  sizes       the size projection per family and form, judged on a card and in RAM
  device_use  what a device does with each form, from its hardware report
  advise      the record `halfsafe advise` and the Models page show, one sentence per form
"""

from __future__ import annotations

from app.core.advice.advise import (
    FamilyAdvice,
    FormAdvice,
    advise,
    advise_on,
    architecture_choices,
    family_names,
    resolve_family,
)

__all__ = [
    "FamilyAdvice",
    "FormAdvice",
    "advise",
    "advise_on",
    "architecture_choices",
    "family_names",
    "resolve_family",
]
