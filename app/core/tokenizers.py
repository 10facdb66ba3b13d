"""The tokenizers HalfSafe ships in resources/tokenizers, built offline: CLIP's BPE, T5's
SentencePiece, and Qwen2's byte-level BPE with Qwen2.5's or Qwen3's chat template.

transformers is imported inside the functions that build them.
"""

from __future__ import annotations

from app.core.paths import resource


def clip_tokenizer(pad_token: str = "<|endoftext|>"):
    """CLIP's real BPE tokenizer from the shipped vocabulary (SD1 pads with <|endoftext|>,
    SD2 and SDXL's second encoder with "!")."""
    from transformers import CLIPTokenizer

    folder = resource("tokenizers", "clip")
    return CLIPTokenizer(
        str(folder / "vocab.json"),
        str(folder / "merges.txt"),
        pad_token=pad_token,
        model_max_length=77,
    )


def t5_tokenizer():
    """T5's SentencePiece vocabulary (shipped in resources/tokenizers/t5, Apache-2.0)."""
    from transformers import T5TokenizerFast  # pyright: ignore[reportAttributeAccessIssue]

    return T5TokenizerFast(tokenizer_file=str(resource("tokenizers", "t5", "tokenizer.json")))


# The chat template Z-Image's Qwen3 tokenizer applies: a user turn and the assistant's opening,
# no default system prompt; with enable_thinking false an empty think block follows (Qwen3's
# format). ZImagePipeline asks for the thinking form, so the prompt reads
# "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n".
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def qwen2_tokenizer():
    """Qwen2/Qwen2.5's byte-level BPE (shipped in resources/tokenizers/qwen2, Apache-2.0), with
    Qwen2.5's chat template: Qwen-Image's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        str(resource("tokenizers", "qwen2")), local_files_only=True
    )


def qwen3_tokenizer():
    """The same BPE with Qwen3's chat template (no default system prompt): the tokenizer
    ZImagePipeline expects. The turn markers <|im_start|> and <|im_end|> have the same ids in
    both; the prompt format uses no other special token."""
    tokenizer = qwen2_tokenizer()
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer
