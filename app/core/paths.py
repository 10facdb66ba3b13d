"""Where HalfSafe keeps its files: settings, caches, remembered profiles, outputs.

Each directory can be redirected with an environment variable, which is how tests and portable
installs keep the user's real folders untouched.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import platformdirs

APP_NAME = "HalfSafe"
# The folder holding app/: a checkout's root, or a frozen build's bundle (which keeps that
# layout). The shipped files live inside the package, so an installed wheel has them too.
TREE = Path(__file__).resolve().parent.parent.parent
RESOURCES = TREE / "app" / "resources"


def _dir(env_var: str, default: str) -> Path:
    """The folder, created if missing. A folder that cannot be created (a file holds its name,
    no permission) is returned anyway: that must not stop the app from starting, and the first
    read or write there fails with a sentence naming it."""
    path = Path(os.environ.get(env_var) or default)
    with contextlib.suppress(OSError):
        path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir() -> Path:
    """Settings live here (`HALFSAFE_CONFIG_DIR` overrides)."""
    return _dir("HALFSAFE_CONFIG_DIR", platformdirs.user_config_dir(APP_NAME, appauthor=False))


def data_dir() -> Path:
    """Remembered model profiles and the model library index (`HALFSAFE_DATA_DIR`)."""
    return _dir("HALFSAFE_DATA_DIR", platformdirs.user_data_dir(APP_NAME, appauthor=False))


def cache_dir() -> Path:
    """Self-test results and other data that can be rebuilt (`HALFSAFE_CACHE_DIR`)."""
    return _dir("HALFSAFE_CACHE_DIR", platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def default_output_dir() -> Path:
    """Where images go when the user has not chosen a folder (not created until first save)."""
    return Path(platformdirs.user_pictures_dir()) / APP_NAME


def resource(*parts: str) -> Path:
    """A file or folder shipped in `app/resources/`."""
    return RESOURCES.joinpath(*parts)
