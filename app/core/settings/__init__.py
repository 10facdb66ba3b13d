"""The one settings schema: every option declared once, with its persistence.

The settings panel, the CLI's precision flags and the settings file are all generated from
`SCHEMA`. Loading is forgiving field by field: a damaged file costs the user the damaged fields,
never the rest, and the damaged file is kept aside. Saving is atomic, keeps a `.bak`, and holds
a lock file so that two processes saving at once never lose each other's changes.

One responsibility per module, each importing only those before it:
  validation  Field and the checking of a value: types, bounds, devices, folders, module
              entries, numbers of any length, a bad value quoted short
  schema      SCHEMA and FIELDS: every option with its choices, default, words and group
  values      PrecisionSettings (one job's precision choices) and Settings (the user's)
  file        the settings file: load, save, update, what damage cost

This package must stay cheap to import (no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.lazy import lazy_exports

if TYPE_CHECKING:
    from app.core.settings.file import (
        ALL_RESET,
        FIELDS_RESET,
        FOLDER_UNUSABLE,
        MAX_SETTINGS_BYTES,
        RESTORED_BACKUP,
        SCHEMA_VERSION,
        SETTINGS_FILE,
        LoadResult,
        load_settings,
        save_settings,
        settings_path,
        update_settings,
    )
    from app.core.settings.schema import (
        ATTENTION_BACKENDS,
        AUTO_FIX_CHOICES,
        DTYPE_CHOICES,
        FIELDS,
        GROUPS,
        PRECISION_CHOICES,
        SCHEDULERS,
        SCHEMA,
        defaults,
    )
    from app.core.settings.validation import (
        DEVICE_PATTERN,
        MAX_MODULE_ENTRIES,
        MAX_MODULE_PATH,
        MAX_NUMBER_DIGITS,
        MODULE_PATH,
        Field,
        modules_by_component,
        parse_module_entries,
        parse_number,
        shown,
    )
    from app.core.settings.values import PRECISION_KEYS, PrecisionSettings, Settings

__all__ = [
    "ALL_RESET",
    "ATTENTION_BACKENDS",
    "AUTO_FIX_CHOICES",
    "DEVICE_PATTERN",
    "DTYPE_CHOICES",
    "FIELDS",
    "FIELDS_RESET",
    "FOLDER_UNUSABLE",
    "GROUPS",
    "MAX_MODULE_ENTRIES",
    "MAX_MODULE_PATH",
    "MAX_NUMBER_DIGITS",
    "MAX_SETTINGS_BYTES",
    "MODULE_PATH",
    "PRECISION_CHOICES",
    "PRECISION_KEYS",
    "RESTORED_BACKUP",
    "SCHEDULERS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SETTINGS_FILE",
    "Field",
    "LoadResult",
    "PrecisionSettings",
    "Settings",
    "defaults",
    "load_settings",
    "modules_by_component",
    "parse_module_entries",
    "parse_number",
    "save_settings",
    "settings_path",
    "shown",
    "update_settings",
]

if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            ".file": [
                "ALL_RESET",
                "FIELDS_RESET",
                "FOLDER_UNUSABLE",
                "MAX_SETTINGS_BYTES",
                "RESTORED_BACKUP",
                "SCHEMA_VERSION",
                "SETTINGS_FILE",
                "LoadResult",
                "load_settings",
                "save_settings",
                "settings_path",
                "update_settings",
            ],
            ".schema": [
                "ATTENTION_BACKENDS",
                "AUTO_FIX_CHOICES",
                "DTYPE_CHOICES",
                "FIELDS",
                "GROUPS",
                "PRECISION_CHOICES",
                "SCHEDULERS",
                "SCHEMA",
                "defaults",
            ],
            ".validation": [
                "DEVICE_PATTERN",
                "MAX_MODULE_ENTRIES",
                "MAX_MODULE_PATH",
                "MAX_NUMBER_DIGITS",
                "MODULE_PATH",
                "Field",
                "modules_by_component",
                "parse_module_entries",
                "parse_number",
                "shown",
            ],
            ".values": ["PRECISION_KEYS", "PrecisionSettings", "Settings"],
        },
    )
