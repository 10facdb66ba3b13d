"""Prompts as AUTOMATIC1111 reads them: emphasis, BREAK, and prompts longer than CLIP's 77 tokens.

Users bring prompts written for A1111 (and Forge, SD.Next, ComfyUI's A1111-style nodes). Passed
to CLIP literally, `(cat:1.5)` is the characters "(", "cat", ":", "1.5", ")", and everything past
token 75 is cut off silently. Here they mean what they mean there:

- `(text)` multiplies the weight of `text` by 1.1, `[text]` divides it by 1.1, `(text:1.5)` sets
  the factor to 1.5; brackets nest and multiply; one left open is closed at the end of the prompt.
  `\\(`, `\\)`, `\\[`, `\\]` and `\\\\` are the literal characters.
- The prompt is cut into chunks of 75 tokens (a chunk that would end within 20 tokens after a
  comma ends at the comma instead), each wrapped in start/end tokens, padded to 77 and encoded
  alone; the chunks' hidden states lie one after the other along the sequence. `BREAK` ends a
  chunk early.
- Each chunk's hidden states are multiplied token by token by their weights, then rescaled so
  that the chunk's mean is what it was before weighting (A1111's "Original" emphasis).
- The prompt and the negative prompt are given the same number of chunks: the shorter is padded
  with encoded empty chunks (A1111 does the same with "pad prompt/negative prompt", and the
  diffusers pipelines need both the same length).
- SDXL: each text encoder weights its own hidden states; the pooled embedding comes from the
  first chunk of the encoder that has a projection.

The hidden states taken are the ones the diffusers pipeline itself takes (SD1/SD2: the encoder's
last hidden state, after its final norm; a diffusers SD2 text encoder is already cut to the
penultimate layer; SDXL: the penultimate hidden state), so a plain prompt of 75 tokens or fewer
encodes exactly as `pipe.encode_prompt` would.

Clip skip (A1111's "Clip skip: N", ComfyUI's CLIPSetLastLayer at -N) takes the hidden state N
layers from the end instead: SD1/SD2 then apply the encoder's final norm to it, as A1111 does;
SDXL counts from the end as well but never takes a layer later than the penultimate one it
always uses (Forge's rule, and ComfyUI's: "Clip skip: 2" on SDXL is SDXL's default, which is
also what A1111 runs, since it leaves SDXL's layer alone). The layers after the one taken are
not run (unless a pooled embedding reads the last layer, as SDXL's projecting encoder's does):
what they would compute is never read, so the check does not probe it either.

Why not a library: compel reads its own syntax (`word++`, `(word)1.5`), not A1111's; it cuts
long prompts blindly at 75 tokens and its weighting is not A1111's mean-restoring product, so a
user's A1111 prompt would still mean something else. sd_embed is not published on PyPI. The rules
above are small, and the tests pin them to hand-computed values.

torch is imported inside the functions that need it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from app.core.errors import HalfSafeError

CHUNK_TOKENS = 75  # tokens of prompt per chunk; the start and end tokens make it 77
COMMA_BACKTRACK = 20  # a chunk full within this many tokens after a comma ends at the comma
ROUND_FACTOR = 1.1
SQUARE_FACTOR = 1 / 1.1
# Past this the prompt is not a prompt: 32 chunks is 2,400 tokens, more than any front end
# encodes usefully, and it bounds the encoder's time and memory.
MAX_CHUNKS = 32
MAX_PROMPT_CHARACTERS = 32_000
# Brackets open at once. A1111 prompts nest a handful deep; the bound keeps parsing linear
# (each piece of text is weighed once per bracket around it).
MAX_NESTING = 50
MAX_CLIP_SKIP = 12  # A1111's slider; SD1's CLIP has 12 layers
BREAK = None  # the weight of a fragment that is a BREAK, not text

_PIECE = re.compile(
    r"""
    \\[()\[\]\\]                  # an escaped bracket or backslash: the character itself
  | \\                            # a lone backslash
  | \( | \[
  | :\s*([+-]?[.\d]+)\s*\)        # ':1.5)': closes a round group with an explicit weight
  | \) | \]
  | [^\\()\[\]:]+                 # plain text
  | :                             # a colon that sets no weight
    """,
    re.VERBOSE,
)
_BREAK = re.compile(r"\s*\bBREAK\b\s*", re.DOTALL)


class PromptError(HalfSafeError):
    """A prompt that cannot be encoded (far too long, or a weight too large to compute)."""


@dataclass(frozen=True)
class Fragment:
    """A run of prompt text with one weight; `weight is BREAK` marks a chunk break."""

    text: str
    weight: float | None

    @property
    def is_break(self) -> bool:
        return self.weight is BREAK


def parse_emphasis(prompt: str) -> list[Fragment]:
    """The prompt as (text, weight) fragments, A1111's emphasis rules applied.

    `"a (cat:1.5) [dog]"` -> `[("a ", 1.0), ("cat", 1.5), (" ", 1.0), ("dog", 0.909...)]`.
    Adjacent text of equal weight is merged; an empty prompt is one empty fragment. Unlike
    A1111, a BREAK inside brackets still breaks (A1111 then encodes the word "BREAK").
    """
    if len(prompt) > MAX_PROMPT_CHARACTERS:
        raise PromptError(
            f"The prompt is {len(prompt):,} characters long; HalfSafe reads prompts of up to "
            f"{MAX_PROMPT_CHARACTERS:,} characters."
        )
    pieces: list[list[Any]] = []  # [text, weight]; weight None for a BREAK
    round_open: list[int] = []
    square_open: list[int] = []

    def multiply(start: int, factor: float) -> None:
        for piece in pieces[start:]:
            if piece[1] is not BREAK:
                piece[1] *= factor

    for match in _PIECE.finditer(prompt):
        piece, weight = match.group(0), match.group(1)
        if piece.startswith("\\"):
            pieces.append([piece[1:], 1.0])
        elif piece in ("(", "[") and len(round_open) + len(square_open) >= MAX_NESTING:
            raise PromptError(
                f"The prompt's brackets nest more than {MAX_NESTING} deep; close some of them."
            )
        elif piece == "(":
            round_open.append(len(pieces))
        elif piece == "[":
            square_open.append(len(pieces))
        elif weight is not None and round_open and (factor := _number(weight)) is not None:
            multiply(round_open.pop(), factor)
        elif piece == ")" and round_open:
            multiply(round_open.pop(), ROUND_FACTOR)
        elif piece == "]" and square_open:
            multiply(square_open.pop(), SQUARE_FACTOR)
        else:
            for index, part in enumerate(_BREAK.split(piece)):
                if index:
                    pieces.append(["BREAK", BREAK])
                pieces.append([part, 1.0])
    for start in round_open:
        multiply(start, ROUND_FACTOR)
    for start in square_open:
        multiply(start, SQUARE_FACTOR)

    merged: list[list[Any]] = []
    for text, weight in pieces:
        if weight is not BREAK and not text:
            continue
        if merged and weight is not BREAK and merged[-1][1] == weight:
            merged[-1][0] += text
        else:
            merged.append([text, weight])
    for text, weight in merged:
        if weight is not BREAK and not math.isfinite(weight):
            raise PromptError(
                f"The prompt gives '{text.strip()[:40]}' a weight too large to compute."
            )
    return [Fragment(text, weight) for text, weight in merged] or [Fragment("", 1.0)]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # '1.2.3' or '.': A1111 would fail; here it stays text
        return None


@dataclass(frozen=True)
class Chunk:
    """77 token ids (start, 75 of the prompt or padding, end) and each token's weight."""

    tokens: tuple[int, ...]
    weights: tuple[float, ...]

    @property
    def weighted(self) -> bool:
        return any(w != 1.0 for w in self.weights)


def _token_id(tokenizer, token: str) -> int | None:
    """`token`'s id in `tokenizer`'s vocabulary, None where it has none: a token it lacks
    converts to the unknown token's id, which converts back to another token. (Asking for the
    whole vocabulary builds a dict of CLIP's 49,408 tokens: 50 ms a prompt on a 2.5 GHz CPU.)"""
    found = tokenizer.convert_tokens_to_ids(token)
    return found if found is not None and tokenizer.convert_ids_to_tokens(found) == token else None


def chunk_prompt(prompt: str, tokenizer) -> list[Chunk]:
    """Tokenise `prompt` into A1111's 77-token chunks for `tokenizer` (a CLIP tokenizer).

    Padding after the first end token is the tokenizer's own pad token (`<|endoftext|>` for
    SD1's CLIP, `!` for OpenCLIP), as the diffusers pipelines pad. Raises PromptError past
    MAX_CHUNKS.
    """
    fragments = parse_emphasis(prompt)
    texts = [f.text for f in fragments if not f.is_break]
    ids = iter(
        tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    )
    comma = _token_id(tokenizer, ",</w>")
    start, end = tokenizer.bos_token_id, tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end

    chunks: list[Chunk] = []
    tokens: list[int] = []
    weights: list[float] = []
    last_comma = -1

    def close() -> None:
        nonlocal tokens, weights, last_comma
        if len(chunks) >= MAX_CHUNKS:
            raise PromptError(
                f"The prompt is longer than {MAX_CHUNKS * CHUNK_TOKENS:,} tokens "
                f"({MAX_CHUNKS} chunks of {CHUNK_TOKENS}); shorten it."
            )
        filler = CHUNK_TOKENS - len(tokens)
        body = [start, *tokens, end, *([pad] * filler)] if filler else [start, *tokens, end]
        chunks.append(Chunk(tuple(body), (1.0, *weights, *([1.0] * (filler + 1)))))
        tokens, weights, last_comma = [], [], -1

    for fragment in fragments:
        if fragment.is_break:
            close()
            continue
        for token in next(ids):
            if token == comma:
                last_comma = len(tokens)
            elif (
                len(tokens) == CHUNK_TOKENS
                and last_comma != -1
                and len(tokens) - last_comma <= COMMA_BACKTRACK
            ):
                cut = last_comma + 1
                carried = tokens[cut:], weights[cut:]
                tokens, weights = tokens[:cut], weights[:cut]
                close()
                tokens, weights = list(carried[0]), list(carried[1])
            if len(tokens) == CHUNK_TOKENS:
                close()
            tokens.append(token)
            weights.append(fragment.weight if fragment.weight is not None else 1.0)
    if tokens or not chunks:
        close()
    return chunks


def emphasise(hidden, chunks: list[Chunk]):
    """Multiply each chunk's hidden states (n, 77, d) token by token by its weights, then
    restore each chunk's mean (A1111's "Original" emphasis). Computed in fp32, returned in the
    input's dtype; an unweighted chunk is returned untouched."""
    import torch

    if not any(c.weighted for c in chunks):
        return hidden
    weights = torch.tensor([c.weights for c in chunks], dtype=torch.float32, device=hidden.device)
    z = hidden.float()
    before = z.mean(dim=(1, 2), keepdim=True)
    weighted = z * weights[..., None]
    after = weighted.mean(dim=(1, 2), keepdim=True)
    restored = weighted * (before / after)
    keep = torch.tensor([not c.weighted for c in chunks], device=hidden.device)
    return torch.where(keep[:, None, None], z, restored).to(hidden.dtype)


def _padded(chunk_lists: list[list[Chunk]], tokenizer) -> list[list[Chunk]]:
    """Every prompt given as many chunks as the longest, with empty chunks at the end."""
    longest = max(len(chunks) for chunks in chunk_lists)
    empty = chunk_prompt("", tokenizer)[0]
    return [chunks + [empty] * (longest - len(chunks)) for chunks in chunk_lists]


def _run_encoder(encoder, tokenizer, prompts: list[str], device, layer: int, final_norm: bool):
    """Encode each prompt's chunks in one batch: (hidden (p, 77k, d), pooled (p, e) or None).

    `layer` counts hidden states from the end (1: the last); `final_norm` applies the encoder's
    final norm to it (SD1/SD2: layer 1 is then the encoder's own last output, as the diffusers
    pipeline takes it; SDXL takes layer 2 without the norm).
    """
    import torch

    layers = encoder.config.num_hidden_layers
    if layer > layers:
        raise PromptError(
            f"Clip skip {layer} is more layers than this text encoder has ({layers}); "
            f"use 1 to {layers}."
        )
    chunk_lists = _padded([chunk_prompt(p, tokenizer) for p in prompts], tokenizer)
    count = len(chunk_lists[0])
    flat = [chunk for chunks in chunk_lists for chunk in chunks]
    ids = torch.tensor([c.tokens for c in flat], dtype=torch.long, device=device)
    mask = None
    if getattr(encoder.config, "use_attention_mask", False):
        first_end = (ids == tokenizer.eos_token_id).int().argmax(dim=1, keepdim=True)
        mask = (torch.arange(ids.shape[1], device=device)[None] <= first_end).long()
    own_output = layer == 1 and final_norm
    with _layers_read(encoder, layer):
        output = encoder(ids, attention_mask=mask, output_hidden_states=not own_output)
    if own_output:
        hidden = output[0]
    else:
        hidden = output.hidden_states[-layer]
        if final_norm:
            hidden = _final_norm(encoder)(hidden)
    hidden = emphasise(hidden, flat)
    hidden = hidden.reshape(len(prompts), count * hidden.shape[1], hidden.shape[2])
    pooled = output[0] if output[0].ndim == 2 else None
    if pooled is not None:
        pooled = pooled.reshape(len(prompts), count, -1)[:, 0]  # from the first chunk
    return hidden, pooled


def _pooled(encoder) -> bool:
    """Whether the encoder's first output is a pooled embedding read from its last layer (a
    projecting CLIP: SDXL's second encoder), so that every layer is read whatever the layer
    taken for the hidden states."""
    return hasattr(encoder, "text_projection")


@contextmanager
def _layers_read(encoder, layer: int) -> Iterator[None]:
    """The encoder runs only up to the layer taken (`layer` from the end), unless its pooled
    embedding reads the last: each layer after it hands its input on untouched, so what would
    overflow there (the last layer, under a clip skip that never reads it) is never computed,
    costs no time and turns up in no probe. The layers stay in place (transformers records the
    hidden states by hooks on them), and their own `forward` is back after the run."""
    stack = _layer_stack(encoder)
    if layer == 1 or _pooled(encoder) or stack is None:
        yield
        return
    unread = list(stack.layers)[len(stack.layers) - layer + 1 :]
    # Not a `Hooks` set: a forward hook runs once the forward has run and a pre-hook can only
    # change its inputs, so neither can skip it; the layer's `forward` is swapped instead, and
    # hooks on the layer itself still run. A forward of a module's own (an offloading hook's
    # wrapper) is put back as it was.
    own = [module.__dict__.get("forward") for module in unread]
    for module in unread:
        module.forward = _passed_on
    try:
        yield
    finally:
        for module, forward in zip(unread, own, strict=True):
            if forward is None:
                del module.forward
            else:
                module.forward = forward


def _passed_on(hidden_states, *args, **kwargs):
    """A layer that is not read: its input, as it came."""
    return hidden_states


def _layer_stack(encoder):
    """The module holding a CLIP text encoder's `layers` (its `encoder`), or None."""
    import torch

    model = getattr(encoder, "text_model", encoder)
    stack = getattr(model, "encoder", None)
    return stack if isinstance(getattr(stack, "layers", None), torch.nn.ModuleList) else None


def _final_norm(encoder):
    """A CLIP text encoder's final norm (transformers 5 keeps it on the model; older releases
    and the projecting model under `text_model`)."""
    norm = getattr(encoder, "final_layer_norm", None)
    return norm if norm is not None else encoder.text_model.final_layer_norm


def clip_options(clip_skip: int) -> dict[str, int]:
    """`Family.encode`'s keyword for a clip skip (none at 1, every family's own layer)."""
    return {"clip_skip": clip_skip} if clip_skip > 1 else {}


def encode_sd(
    pipe, prompt: str, negative: str, device, guidance: bool, clip_skip: int = 1
) -> dict[str, Any]:
    """SD1/SD2: `prompt_embeds` (1, 77k, d) and, with guidance, `negative_prompt_embeds`;
    `clip_skip` as A1111's "Clip skip" (1: the last layer)."""
    prompts = [prompt, negative] if guidance else [prompt]
    hidden, _ = _run_encoder(pipe.text_encoder, pipe.tokenizer, prompts, device, clip_skip, True)
    tensors = {"prompt_embeds": hidden[:1]}
    if guidance:
        tensors["negative_prompt_embeds"] = hidden[1:]
    return tensors


def encode_sdxl(
    pipe, prompt: str, negative: str, device, guidance: bool, clip_skip: int = 1
) -> dict[str, Any]:
    """SDXL: both encoders' penultimate hidden states side by side (or an earlier layer's, with
    `clip_skip` past 2), and the pooled embedding of the projecting encoder; the negative ones
    too with guidance (an SDXL refiner has only the second encoder)."""
    import torch

    prompts = [prompt, negative] if guidance else [prompt]
    pairs = [
        (getattr(pipe, "tokenizer", None), getattr(pipe, "text_encoder", None)),
        (getattr(pipe, "tokenizer_2", None), getattr(pipe, "text_encoder_2", None)),
    ]
    hidden_parts: list[Any] = []
    pooled: Any = None
    for tokenizer, encoder in pairs:
        if encoder is None or tokenizer is None:
            continue
        layer = max(clip_skip, 2)
        hidden, encoder_pooled = _run_encoder(encoder, tokenizer, prompts, device, layer, False)
        hidden_parts.append(hidden)
        if encoder_pooled is not None:
            pooled = encoder_pooled
    if len({h.shape[1] for h in hidden_parts}) > 1:  # never with SDXL's two CLIP tokenizers
        raise PromptError(
            "This model's two text encoders cut the prompt into different numbers of "
            f"{CHUNK_TOKENS}-token chunks; shorten it to {CHUNK_TOKENS} tokens."
        )
    hidden = torch.cat([h.to(hidden_parts[-1].dtype) for h in hidden_parts], dim=-1)
    tensors = {"prompt_embeds": hidden[:1], "pooled_prompt_embeds": pooled[:1]}
    if guidance:
        tensors["negative_prompt_embeds"] = hidden[1:]
        tensors["negative_pooled_prompt_embeds"] = pooled[1:]
    return tensors
