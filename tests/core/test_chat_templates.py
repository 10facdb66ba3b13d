"""Chat templates and the upsampler's generation config: what a model folder's Jinja and decoding
settings can make HalfSafe do.

A folder's chat template renders within bounds (app/core/encoders/chat_templates.py): a
template that loops for ever, builds gigabytes or reaches for Python is refused in one sentence
naming its file, within a bounded number of steps and megabytes, while a real template renders
exactly as transformers renders it, on every call HalfSafe and diffusers make (FLUX.3's text
encoder and prompt upsampler, Flux.2 dev and Klein, Z-Image, Qwen-Image 2.1). The prompt
upsampler decodes greedily whatever its generation_config.json says. The folder cases run the
`halfsafe` command in a subprocess under a memory limit and a timeout (a regression would hang or
fill memory, never the test process).
"""

from __future__ import annotations

import functools
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from app.core.encoders import chat_templates
from app.core.encoders.chat_templates import MAX_TEMPLATE_STEPS, bound, render
from app.core.errors import BadFileError
from tests.support.cli_output import without_progress
from tests.support.hostile_templates import (
    FLUX3_TEMPLATE_FILES,
    GENERATION_CONFIGS,
    REPORTED,
    TEMPLATES,
    flux2_klein_folder,
    flux3_folder,
    write_generation_config,
    write_template,
)
from tests.support.refusals import assert_cannot_run, assert_sentence, refused, run_cli

MESSAGES = [
    {"role": "system", "content": [{"type": "text", "text": "Describe the picture."}]},
    {"role": "user", "content": [{"type": "text", "text": "a red cat"}]},
]
# What a render may hold at once: its text bound (4 million characters, up to 4 bytes each),
# with room for Jinja's own.
MEMORY = 64 << 20


# The bounded environment -------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(TEMPLATES))
def test_a_hostile_template_is_refused_in_one_sentence_within_its_bounds(tmp_path, case):
    """Each refused for what it does, in steps counted the same on any machine; what builds
    text or numbers is refused before it holds more than the bound (memory traced)."""
    template, words = TEMPLATES[case]
    file = tmp_path / "tokenizer" / "chat_template.jinja"
    traced = words != "steps"  # tracing slows Jinja's calls; a bound on steps is one on work
    if traced:
        tracemalloc.start()
    try:
        error = refused(render, template, file, messages=MESSAGES, add_generation_prompt=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert_sentence(error, file, words)
    assert peak < MEMORY, f"{peak / 2**20:.0f} MB held while refusing it"


def test_steps_are_counted_the_same_on_any_machine(tmp_path):
    """The bound is steps, not seconds: a template one step under it renders, whatever the
    machine's speed; one step over is refused."""
    file = tmp_path / "chat_template.jinja"
    # A step a turn, and a few to make the range, start the loop and write the "x".
    fits = "{% for i in range(" + str(MAX_TEMPLATE_STEPS - 10) + ") %}{% endfor %}x"
    over = "{% for i in range(" + str(MAX_TEMPLATE_STEPS) + ") %}{% endfor %}x"
    assert render(fits, file) == "x"
    assert "steps" in str(refused(render, over, file))


def test_what_a_template_reaches_is_plain_data(tmp_path):
    """A picture, a tensor or any object in a message is its type's name to the template:
    no method of it can be called (some write files)."""
    picture = Image.new("RGB", (8, 8))
    seen = render(
        "{{ messages[0].content[0].image }} {{ messages[0].content[0].image.save }}",
        tmp_path / "chat_template.jinja",
        messages=[{"role": "user", "content": [{"type": "image", "image": picture}]}],
    )
    assert seen == "<Image> "


# Real templates render as transformers renders them ------------------------------------------


def _equal(made, expected) -> None:
    if isinstance(expected, (str, list)):
        assert made == expected
        return
    assert made.keys() == expected.keys()
    for key in expected:
        if torch.is_tensor(expected[key]):
            assert torch.equal(made[key], expected[key]), key
        else:
            assert made[key] == expected[key], key


class _unbounded:  # noqa: N801 - reads as the object it stands for
    """The same tokenizer or processor with transformers' own apply_chat_template."""

    def __init__(self, bounded) -> None:
        self.apply_chat_template = functools.partial(type(bounded).apply_chat_template, bounded)
        self._bounded = bounded

    def __getattr__(self, name: str):
        return getattr(self._bounded, name)

    def __call__(self, *args, **kwargs):
        return self._bounded(*args, **kwargs)


def _reference() -> Image.Image:
    noise = np.random.RandomState(0).rand(64, 64, 3) * 255
    return Image.fromarray(noise.astype(np.uint8))


def test_the_flux3_calls_lay_out_prompts_as_transformers_does(tmp_path):
    """FLUX.3's text encoder (diffusers' step: the prompt's text) and its prompt upsampler
    (HalfSafe's chat: the request alone, and with a reference picture: ids, pixels, grid)."""
    from app.core.encoders.tokenizers import qwen3_vl_processor
    from app.core.families.flux3_upsampler import chat_inputs

    bounded = bound(qwen3_vl_processor(), tmp_path)
    plain = _unbounded(bounded)
    assert isinstance(bounded.apply_chat_template, chat_templates.BoundedChat)
    prompt = [{"role": "user", "content": "a red cat"}]
    options = {"tokenize": False, "add_generation_prompt": True}
    _equal(
        bounded.apply_chat_template(prompt, **options), plain.apply_chat_template(prompt, **options)
    )
    cpu = torch.device("cpu")
    for references in ((), (_reference(),)):
        _equal(
            chat_inputs(bounded, "a red cat", cpu, references),
            chat_inputs(plain, "a red cat", cpu, references),
        )


@pytest.mark.parametrize("thinking", [False, True], ids=["Flux.2 Klein", "Z-Image"])
def test_the_qwen3_calls_lay_out_prompts_as_transformers_does(tmp_path, thinking):
    """Flux.2 Klein's (thinking off) and Z-Image's (thinking on) text, and tokenised with
    padding as a batch of two."""
    from app.core.encoders.tokenizers import qwen3_tokenizer

    bounded = bound(qwen3_tokenizer(), tmp_path)
    plain = _unbounded(bounded)
    prompt = [{"role": "user", "content": "a red cat"}]
    batch = [prompt, [{"role": "user", "content": "a blue dog on a hill"}]]
    for conversation, options in (
        (prompt, {"tokenize": False}),
        (batch, {"tokenize": False}),
        (batch, {"return_tensors": "pt", "padding": "max_length", "max_length": 32}),
    ):
        options = {**options, "add_generation_prompt": True, "enable_thinking": thinking}
        _equal(
            bounded.apply_chat_template(conversation, **options),
            plain.apply_chat_template(conversation, **options),
        )


def test_the_flux2_dev_and_qwenimage21_calls_lay_out_prompts_as_transformers_does(tmp_path):
    """Flux.2 dev's batch of system and user turns, tokenised and padded (its stand-in
    tokenizer with Mistral 3's chat format), and Qwen-Image 2.1's system turn (whose length the
    pipeline drops, read when the pipeline is built)."""
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    from app.core.encoders.tokenizers import qwen3_vl_processor
    from tests.support.tiny_models import mistral3_stand_in_tokenizer

    bounded = bound(mistral3_stand_in_tokenizer(), tmp_path)
    plain = _unbounded(bounded)
    conversation = format_input(["a red cat"], system_message=SYSTEM_MESSAGE)
    options = {
        "add_generation_prompt": False,
        "return_dict": True,
        "return_tensors": "pt",
        "padding": "max_length",
        "truncation": True,
        "max_length": 64,
    }
    _equal(
        bounded.apply_chat_template(conversation, **options),
        plain.apply_chat_template(conversation, **options),
    )
    bounded = bound(qwen3_vl_processor(), tmp_path)
    plain = _unbounded(bounded)
    system = [{"role": "system", "content": [{"type": "text", "text": "Comprehend the prompt."}]}]
    _equal(
        bounded.apply_chat_template(system, tokenize=True, return_dict=False),
        plain.apply_chat_template(system, tokenize=True, return_dict=False),
    )


def test_a_folder_processor_renders_through_the_bounds(tmp_path):
    """Qwen3-VL's processor read from a folder (FLUX.3's tokenizer/ and
    prompt_upsampler_processor/, Qwen-Image 2.1's processor/) carries the bounds, and names the
    file its template came from."""
    from app.core.encoders.tokenizers import qwen3_vl_processor
    from app.core.families.qwenimage21 import processor_from_folder

    folder = tmp_path / "tokenizer"
    qwen3_vl_processor().save_pretrained(folder)
    file = write_template(folder.parent, "tokenizer/chat_template.jinja", TEMPLATES[REPORTED[0]][0])

    processor = processor_from_folder(folder)

    error = refused(
        processor.apply_chat_template,
        [{"role": "user", "content": "a red cat"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert_sentence(error, file, "steps")


# The prompt upsampler's generation config ------------------------------------------------------

VOCABULARY = 1000


@pytest.mark.parametrize("case", sorted(GENERATION_CONFIGS))
def test_the_upsampler_decodes_greedily_whatever_its_generation_config_says(tmp_path, case):
    from app.core.families.flux3_upsampler import decoding_config

    (tmp_path / "generation_config.json").write_text(
        json.dumps({**GENERATION_CONFIGS[case], "eos_token_id": [7, 9]})
    )

    config = decoding_config(tmp_path, {}, VOCABULARY)

    assert config.to_diff_dict() | {"transformers_version": None} == {
        "do_sample": False,
        "num_beams": 1,
        "eos_token_id": [7, 9],
        "transformers_version": None,
    }


@pytest.mark.parametrize(
    "value", [VOCABULARY, -1, "2", 2.0, True, [1] * 17, [[1]]], ids=lambda v: repr(v)[:12]
)
def test_an_end_token_outside_the_vocabulary_is_one_sentence(tmp_path, value):
    from app.core.families.flux3_upsampler import decoding_config

    file = tmp_path / "generation_config.json"
    file.write_text(json.dumps({"eos_token_id": value}))

    with pytest.raises(BadFileError) as caught:
        decoding_config(tmp_path, {}, VOCABULARY)
    assert_sentence(caught.value, file, "eos_token_id is not a token id of this model")


def test_without_a_generation_config_the_models_end_tokens_are_read(tmp_path):
    from app.core.families.flux3_upsampler import decoding_config

    config = decoding_config(tmp_path, {"text_config": {"eos_token_id": 5}}, VOCABULARY)
    assert config.eos_token_id == 5 and config.num_beams == 1 and not config.do_sample


# Whole folders, through the command --------------------------------------------------------


def _check(folder: Path):
    return run_cli(
        "check", str(folder), "--device", "cpu", "--size", "64", memory_gib=6, timeout=600
    )


@pytest.mark.slow  # saving a tiny FLUX.3 (two 151,669-token vocabularies), then checking it
@pytest.mark.parametrize("file", FLUX3_TEMPLATE_FILES)
@pytest.mark.parametrize("case", REPORTED)
def test_a_flux3_folder_with_a_hostile_chat_template_is_refused_by_the_check(tmp_path, file, case):
    folder = flux3_folder(tmp_path / "flux3")
    template, words = TEMPLATES[case]
    target = write_template(folder, file, template)

    assert_cannot_run(_check(folder), target, words)


@pytest.mark.slow  # saving a tiny FLUX.3, then checking it
@pytest.mark.parametrize("case", ["100000 beams", "contrastive search"])
def test_a_flux3_upsampler_is_checked_greedily_whatever_its_generation_config(tmp_path, case):
    folder = flux3_folder(tmp_path / "flux3")
    write_generation_config(folder, GENERATION_CONFIGS[case])

    result = _check(folder)

    assert result.returncode == 0, without_progress(result.stderr)[-2000:]
    assert "Verdict: Healthy" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # saving a tiny Flux.2 Klein, then checking it
def test_a_flux2_klein_folder_with_a_hostile_chat_template_is_refused_by_the_check(tmp_path):
    """diffusers reads this folder's tokenizer: its template is bounded all the same."""
    folder = flux2_klein_folder(tmp_path / "klein")
    names = [p.name for p in (folder / "tokenizer").iterdir()]
    file = "chat_template.jinja" if "chat_template.jinja" in names else "tokenizer_config.json"
    template, words = TEMPLATES[REPORTED[0]]
    target = write_template(folder, f"tokenizer/{file}", template)

    assert_cannot_run(_check(folder), target, words)
