"""FLUX.3's prompt upsampler as HalfSafe runs it: a Qwen3.5 LLM (transformers'
`Qwen3_5ForConditionalGeneration`, black-forest-labs' 9B fine-tune) that writes the user's short
prompt out as the detailed caption the model was trained on, by greedy generation from
diffusers' chat (the text-to-image system prompt diffusers ships, the request as the user's
turn, thinking off), as diffusers' `Flux3Text2ImagePromptUpsampleStep` does; for an edit, its
image-conditioned chat (the reference pictures, prepared as diffusers prepares them, then the
instruction), as `Flux3ImageConditionedPromptUpsampleStep` does. The health check
generates a bounded number of tokens (`health.stages.UPSAMPLER_CHECK_TOKENS`) and compares each
step's raw logits; a job generates the caption in full (`JOB_NEW_TOKENS`, diffusers' bound).

Imported only where a FLUX.3 model runs its upsampler: it imports transformers and diffusers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers.modular_pipelines.flux3.prompt_upsampler import (
    I2I_SCAFFOLD,
    MAX_NEW_TOKENS,
    SYSTEM_PROMPTS,
    prepare_references,
)
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from app.core import limits
from app.core.errors import BadFileError

# A job's bound: diffusers' (its upsampler's captions run 100 to 350 words).
JOB_NEW_TOKENS = MAX_NEW_TOKENS


# The token ids a generation_config.json may set that HalfSafe's decoding reads, and the most
# ids that end a caption (Qwen3.5 names two).
TOKEN_SETTINGS = ("eos_token_id", "pad_token_id", "bos_token_id")
MAX_END_TOKENS = 16


def decoding_config(folder: Path, config: Mapping[str, Any], vocabulary: int) -> GenerationConfig:
    """How HalfSafe decodes with the upsampler of `folder` (its prompt_upsampler/ subfolder):
    greedily, one beam, no sampling, as diffusers' upsampling blocks ask. Of the folder's
    generation_config.json (or, without one, its model `config`) only the token ids that end,
    pad and begin a caption are read, each a token of the model's `vocabulary`; every other
    setting there (sampling, beams, penalties, contrastive search, lengths, a generate function
    of its own) is ignored, since HalfSafe never decodes by it. Raises BadFileError naming the
    file where a token id is not one of the model's."""
    file = folder / "generation_config.json"
    stored: Mapping[str, Any] = config.get("text_config") or config
    source = folder / "config.json"
    if limits.is_regular_file(file):
        try:
            stored, source = limits.read_json_object(file), file
        except (OSError, ValueError) as error:
            reason = error.strerror if isinstance(error, OSError) else str(error)
            raise BadFileError(file, f"{reason or error}.") from None
    ids: dict[str, Any] = {}
    for name in TOKEN_SETTINGS:
        value = stored.get(name)
        listed = value if isinstance(value, list) and name == "eos_token_id" else [value]
        if value is None:
            continue
        if len(listed) > MAX_END_TOKENS or not all(_token(v, vocabulary) for v in listed):
            raise BadFileError(
                source,
                f"its {name} is not a token id of this model (whole numbers from 0 to "
                f"{vocabulary - 1}, at most {MAX_END_TOKENS} of them).",
            )
        ids[name] = value
    return GenerationConfig(do_sample=False, num_beams=1, **ids)


def _token(value: Any, vocabulary: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocabulary


@dataclass
class Upsampled:
    """One generation: the caption, the new token ids (1, n), each step's raw logits
    (1, n, vocab) in fp32, before any processor touched them (what the check compares; None
    where not kept: a job's 3,584 steps of Qwen3.5's 248,320-wide rows would be 3.5 GB), and
    whether every step's logits were finite."""

    text: str
    tokens: Any
    logits: Any
    finite: bool = True


class _Watch(LogitsProcessor):
    """Folds whether each step's logits held NaN or Inf into one device flag, read once at the
    end (no host sync a token)."""

    def __init__(self) -> None:
        self.bad: Any = None

    def __call__(self, input_ids, scores):
        bad = ~torch.isfinite(scores).all()
        self.bad = bad if self.bad is None else self.bad | bad
        return scores


class _Forced(LogitsProcessor):
    """Makes greedy generation pick `tokens` (1-D) in order from the prompt's end (`start`):
    the check's re-runs take the reference's tokens, so each step's logits are compared on the
    same text whatever a near tie picked. The raw logits stay the model's own."""

    def __init__(self, tokens, start: int) -> None:
        self.tokens = tokens
        self.start = start

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.start
        if step >= len(self.tokens):
            return scores
        forced = torch.full_like(scores, -torch.inf)
        forced[:, int(self.tokens[step])] = 0.0
        return forced


def chat_inputs(processor, prompt: str, device, references=()) -> Any:
    """The request in diffusers' text-to-image chat or, with `references` (RGB PIL images),
    its image-conditioned one, tokenised, on `device`."""
    content: list[dict[str, Any]] = [{"type": "text", "text": prompt}]
    mode = "t2i"
    if references:
        mode = "i2i"
        scaffold = I2I_SCAFFOLD[False].format(instruction=prompt)
        content = [{"type": "image", "image": image} for image in prepare_references(references)]
        content.append({"type": "text", "text": scaffold})
    messages = [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPTS[mode]}]},
        {"role": "user", "content": content},
    ]
    # The chat template reads `enable_thinking`; transformers also hands it to the processor's
    # call and warns, on every prompt, that the processor ignores it.
    with _quiet_transformers():
        return _templated(processor, messages).to(device)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' warnings off (errors still said); the level is process-wide: the engine
    runs one job at a time."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _templated(processor, messages) -> Any:
    return processor.apply_chat_template(
        messages,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        enable_thinking=False,
    )


@torch.no_grad()
def generate(
    model,
    processor,
    prompt: str,
    device,
    max_new_tokens: int,
    forced=None,
    logits: bool = True,
    references=(),
) -> Upsampled:
    """At most `max_new_tokens` tokens of the caption for `prompt` (an edit's instruction with
    its `references`), greedily (`forced`: the new tokens to take instead, 1-D), in the model's
    placed dtype, each step's raw logits kept where `logits`. Runs on the calling thread; one
    host sync at the end."""
    inputs = chat_inputs(processor, prompt, device, references)
    start = inputs["input_ids"].shape[1]
    watch = _Watch()
    steer = [watch] + ([_Forced(forced, start)] if forced is not None else [])
    out = model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        output_logits=logits,
        return_dict_in_generate=True,
        logits_processor=LogitsProcessorList(steer),
    )
    tokens = out.sequences[:, start:]
    text = processor.decode(tokens[0], skip_special_tokens=True).strip()
    kept = torch.stack(list(out.logits), dim=1).float() if logits else None
    return Upsampled(text, tokens, kept, watch.bad is None or not bool(watch.bad))
