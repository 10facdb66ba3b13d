"""The tokenizers HalfSafe ships in app/resources/tokenizers, built offline: CLIP's BPE, T5's
SentencePiece, and Qwen2's byte-level BPE with Qwen2.5's or Qwen3's chat template, or in
Qwen3-VL's processor.

transformers is imported inside the functions that build them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
    """T5's SentencePiece vocabulary (shipped in app/resources/tokenizers/t5, Apache-2.0)."""
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
    """Qwen2/Qwen2.5's byte-level BPE (shipped in app/resources/tokenizers/qwen2, Apache-2.0), with
    Qwen2.5's chat template: Qwen-Image's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        str(resource("tokenizers", "qwen2")), local_files_only=True, trust_remote_code=False
    )


def qwen3_tokenizer():
    """The same BPE with Qwen3's chat template (no default system prompt): the tokenizer
    ZImagePipeline expects. The turn markers <|im_start|> and <|im_end|> have the same ids in
    both; the prompt format uses no other special token."""
    tokenizer = qwen2_tokenizer()
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer


# Qwen3-VL's chat format as Qwen-Image 2.1 reads it: each turn's text (a string, or the text
# parts of a list of parts, an image part as its vision placeholder) between the turn markers,
# and the assistant's opening when asked for.
QWEN3_VL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}"
    "{%- elif part['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3-VL's image preprocessing (its preprocessor_config.json): 16-px patches merged 2x2,
# two frames per temporal patch, pixels scaled to [-1, 1].
QWEN3_VL_IMAGES: dict[str, Any] = {
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
}


def qwen3_vl_processor(
    tokenizer=None, images: Mapping[str, Any] | None = None, chat_template: str | None = None
):
    """Qwen3-VL's processor (Qwen-Image 2.1's): the Qwen BPE (`tokenizer`, by default the
    shipped one), its images through transformers' PIL image processor (`images`: that
    processor's settings, by default Qwen3-VL's) and Qwen3-VL's chat format.

    transformers' Qwen3VLProcessor also holds a video processor, which exists only with
    torchvision; HalfSafe does not ship torchvision and never passes a video. The processor is
    built with Qwen3-VL's video processor's settings all the same (saved with a folder, read
    back by `qwen3_vl_processor_from`), its class check for that one part relaxed where
    torchvision is missing. Nothing else about the processor changes."""
    from transformers import Qwen2VLImageProcessorPil, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_processing_utils import VideoProcessorMixin

    settings = {k: v for k, v in (images or QWEN3_VL_IMAGES).items() if not k.endswith("_type")}
    image_processor = Qwen2VLImageProcessorPil(**settings)
    processor = Qwen3VLProcessor.__new__(Qwen3VLProcessor)
    checked = processor.check_argument_for_proper_class

    def check(argument_name: str, argument):
        if argument_name == "video_processor" and isinstance(argument, VideoProcessorMixin):
            return type(argument)
        return checked(argument_name, argument)

    processor.check_argument_for_proper_class = check  # this instance only, while it is built
    try:
        processor.__init__(
            image_processor=image_processor,
            tokenizer=tokenizer if tokenizer is not None else qwen2_tokenizer(),
            video_processor=Qwen3VLVideoProcessor(),
            chat_template=chat_template or QWEN3_VL_CHAT_TEMPLATE,
        )
    finally:
        del processor.check_argument_for_proper_class
    return processor
