"""Hostile chat templates and generation configs, and the tiny folders that carry them.

A chat template is Jinja code that a model folder ships (tokenizer/chat_template.jinja, a
processor's, tokenizer_config.json's "chat_template"); a generation config (generation_config.json)
sets how a model decodes. Each case here is text written in code; the builders put it in a tiny
FLUX.3 or Flux.2 Klein folder (tests/support/tiny_models.py) saved as diffusers saves one.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

# name: (template, words the refusal must say)
TEMPLATES: dict[str, tuple[str, str]] = {
    "three nested range(100000) loops": (
        "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
        "{% endfor %}{% endfor %}{% endfor %}",
        "steps",
    ),
    "the same loops over one range kept in a variable": (
        "{% set r = range(100000) %}{% for a in r %}{% for b in r %}{% for c in r %}"
        "{% endfor %}{% endfor %}{% endfor %}",
        "steps",
    ),
    "a string of two billion characters": ("{{ 'x' * 2000000000 }}", "characters"),
    "a string centred in two billion": ("{{ 'x'|center(2000000000) }}", "characters"),
    "a string padded by its own method": ("{{ 'x'.rjust(2000000000) }}", "characters"),
    "a format field two billion wide": ("{{ '{:>2000000000}'.format(1) }}", "wider"),
    "a printf field two billion wide": ("{{ '%2000000000d' % 1 }}", "wider"),
    "a string doubled 64 times in a namespace": (
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s }}",
        "characters",
    ),
    "a list of megabyte strings grown item by item": (
        "{% set ns = namespace(l=[], s='x' * 1000000) %}{% for i in range(20000) %}"
        "{% set ns.l = ns.l + [ns.s ~ i] %}{% endfor %}",
        "characters",
    ),
    "a string replaced into itself": (
        "{% set s = 'x' * 100000 %}{{ s|replace('x', s) }}",
        "characters",
    ),
    "a list of lists summed": ("{{ ([[1] * 1000] * 1000)|sum(start=[]) }}", "lists"),
    "a literal written 100000 times": (
        "{% for i in range(100000) %}" + "y" * 100_000 + "{% endfor %}",
        "characters",
    ),
    "a macro calling itself twice, 60 deep": (
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
        "{{ f(60) }}",
        "steps",
    ),
    "a megabyte searched 100000 times": (
        "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% if 'y' in s %}{% endif %}"
        "{% endfor %}",
        "steps",
    ),
    "a number of a hundred million digits": ("{{ 10 ** 100000000 }}", "bits"),
    "a macro without end": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "deeper"),
    "a reach for Python's classes": (
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "sandbox forbids",
    ),
    "a reach through a helper's globals": ("{{ cycler.__init__.__globals__ }}", "sandbox forbids"),
    "a template that includes a file": ("{% include '/etc/passwd' %}", "error"),
    "a template that is not Jinja": ("{% for %}", "not valid Jinja"),
}

# The reported pair: the loops that run for ever, and the string that grows to gigabytes.
REPORTED = ("three nested range(100000) loops", "a string of two billion characters")

# The files of a FLUX.3 folder whose chat template a check renders.
FLUX3_TEMPLATE_FILES = (
    "tokenizer/chat_template.jinja",
    "prompt_upsampler_processor/chat_template.jinja",
)

# name: (settings written into prompt_upsampler/generation_config.json)
GENERATION_CONFIGS: dict[str, dict[str, object]] = {
    "100000 beams": {"num_beams": 100_000},
    "contrastive search": {"penalty_alpha": 0.6, "top_k": 4},
    "a million tokens at least": {"min_new_tokens": 1_000_000, "min_length": 1_000_000},
    "sampling, penalties and a generate of its own": {
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "repetition_penalty": 1.3,
        "no_repeat_ngram_size": 2,
        "num_return_sequences": 4,
        "custom_generate": "a/repository",
        "watermarking_config": {"greenlist_ratio": 0.5},
    },
}


def flux3_folder(path: Path, upsampler: bool = True) -> Path:
    """The tiny distilled FLUX.3 (with its prompt upsampler where `upsampler`) as a folder."""
    return _copied(path, "flux3", upsampler)


def flux2_klein_folder(path: Path) -> Path:
    """The tiny distilled Flux.2 Klein as a folder: diffusers reads its tokenizer (and chat
    template, in tokenizer_config.json) from it."""
    return _copied(path, "flux2_klein", False)


def _copied(path: Path, model: str, upsampler: bool) -> Path:
    """A copy at `path` of the folder `_saved` wrote once in this process (two of Qwen's
    151,669-token tokenizers took seconds to save, for every test that changes one file)."""
    import shutil

    shutil.copytree(_saved(model, upsampler), path)
    return path


@functools.cache
def _saved(model: str, upsampler: bool) -> Path:
    import atexit
    import shutil
    import tempfile

    from tests.support.tiny_models import (
        build_tiny_flux2_klein_pipeline,
        build_tiny_flux3_pipeline,
    )

    folder = Path(tempfile.mkdtemp(prefix=f"halfsafe-{model}-"))
    atexit.register(shutil.rmtree, folder, True)
    if model == "flux3":
        pipeline = build_tiny_flux3_pipeline(distilled=True, upsampler=upsampler)
    else:
        pipeline = build_tiny_flux2_klein_pipeline(distilled=True)
    pipeline.save_pretrained(folder / "model")
    return folder / "model"


def write_template(folder: Path, file: str, template: str) -> Path:
    """Put `template` where `file` (relative to the model folder) holds its chat template."""
    target = folder / file
    if target.name == "tokenizer_config.json":
        config = json.loads(target.read_text(encoding="utf-8"))
        config["chat_template"] = template
        target.write_text(json.dumps(config), encoding="utf-8")
    else:
        target.write_text(template, encoding="utf-8")
    return target


def write_generation_config(folder: Path, settings: dict[str, object]) -> Path:
    """Add `settings` to the upsampler's generation_config.json."""
    target = folder / "prompt_upsampler" / "generation_config.json"
    config = json.loads(target.read_text(encoding="utf-8"))
    config.update(settings)
    target.write_text(json.dumps(config), encoding="utf-8")
    return target
