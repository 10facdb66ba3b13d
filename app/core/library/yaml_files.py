"""The tools' small YAML files (ComfyUI's extra_model_paths.yaml, InvokeAI's invokeai.yaml),
read within bounds: size, aliases and nesting checked on the parser's events before anything
is built; a file that cannot be read is a row naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core import limits
from app.core.library.entries import LibraryEntry

# ComfyUI's extra_model_paths.yaml is a few KB; anything past this is not one.
MAX_YAML_BYTES = 64 << 10
# Sections of one extra_model_paths.yaml, and folders one key may name.
MAX_YAML_SECTIONS = 64
MAX_YAML_PATHS = 64
# Nesting of such a file: ComfyUI's is two levels (sections of keys), InvokeAI's three.
MAX_YAML_DEPTH = 16


def _read_yaml(file: Path) -> tuple[Any, list[LibraryEntry]]:
    """A tool's small YAML settings file: (document, []) or (None, [a row naming the file and
    the problem]); (None, []) when there is no such file.

    A file over MAX_YAML_BYTES is refused unread. Its events are then walked before anything
    is built (`_check_yaml_events`): aliases are refused, because merge keys (`<<: [*a, *a]`)
    copy what they name while the document is built, so a few hundred bytes of nested aliases
    cost minutes and gigabytes; so is nesting past MAX_YAML_DEPTH. Only then does the safe
    loader run (no tags, no code)."""
    import yaml

    if not file.exists():
        return None, []
    try:
        raw = limits.read_regular(file, MAX_YAML_BYTES)
        problem = _check_yaml_events(raw)
        if problem is not None:
            return None, [_file_problem(file, problem)]
        return yaml.load(raw, Loader=yaml.SafeLoader), []  # noqa: S506 - the safe loader
    except (limits.FileTooLargeError, limits.NotRegularFileError) as error:
        return None, [_file_problem(file, str(error.strerror))]
    except OSError as error:
        return None, [_file_problem(file, f"it cannot be read ({error.strerror or error})")]
    except RecursionError:
        return None, [_file_problem(file, "it is nested too deeply to be a real one")]
    except (yaml.YAMLError, ValueError, TypeError) as error:
        return None, [_file_problem(file, f"it is not valid YAML ({_yaml_problem(error)})")]


def _check_yaml_events(raw: bytes) -> str | None:
    """Why a small YAML file must not be built (aliases, nesting past MAX_YAML_DEPTH), or None.
    Walks the parser's events, which take time and memory in proportion to the file."""
    import yaml

    depth = 0
    for event in yaml.parse(raw, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            return (
                "it uses YAML aliases (*name), which a file of model folders does not need and "
                "which can expand to billions of entries, so it is not read"
            )
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                return f"it is nested too deeply to be a real one (over {MAX_YAML_DEPTH} levels)"
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return None


def _yaml_problem(error: Exception) -> str:
    """What PyYAML found wrong, and where, in a few words (its own text runs to lines)."""
    problem = getattr(error, "problem", None) or type(error).__name__
    mark = getattr(error, "problem_mark", None)
    where = f" on line {mark.line + 1}" if mark is not None else ""
    return f"{str(problem)[:160]}{where}"


def _file_problem(file: Path, reason: str) -> LibraryEntry:
    return LibraryEntry(str(file), None, None, 0, f"{file}: {reason}.", format="config")
