"""What the window says: model parts, layers, numbers and settings in words a user can follow."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.core import hires, samplers
from app.core.components import COMPONENTS, FP16_MAX, Status
from app.core.precision import expected_dtypes
from app.core.words.durations import duration  # noqa: F401 - the pages say it as words.duration

FP16_LIMIT = FP16_MAX

COMPONENT_NAMES = {name: c.title for name, c in COMPONENTS.items()}
COMPONENT_ROLES = {name: c.does for name, c in COMPONENTS.items()}
# The colour of a component's status chip; its words are core's (`health.STATUS_WORDS`).
STATUS_LEVEL = {
    Status.OK: "good",
    Status.AT_RISK: "warn",
    Status.OVERFLOW: "bad",
    Status.NAN: "bad",
    Status.BROKEN_WEIGHTS: "bad",
}
CHOICE_NAMES = {
    "auto": "Auto",
    "fp16": "fp16 (half)",
    "bf16": "bf16 (brain float)",
    "fp32": "fp32 (full)",
    "autocast": "fp16 under autocast (AUTOMATIC1111's default)",
    "flash": "Flash attention",
    "efficient": "Memory-efficient",
    "cudnn": "cuDNN",
    "math": "Math (reference)",
    "classic": "Classic (diffusers)",
    "off": "Off: keep it and say why",
    "ask": "Ask me",
    # Every sampler and schedule, in AUTOMATIC1111's words ("DPM++ 2M SDE Karras").
    **{key: samplers.words(key) for key in samplers.KEYS},
    **{upscaler.key: upscaler.words for upscaler in hires.UPSCALERS},
}
FP16_WORDS = {
    "fast": "fast",
    "slow": "works, but slowly here",
    "unreliable": "unreliable here (known to give NaN)",
    "unsupported": "not supported",
}
BF16_WORDS = {
    "native": "native",
    "emulated": "emulated (slow)",
    "unsupported": "not supported",
}

_ORDINALS = (
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "sixth",
    "seventh",
    "eighth",
    "ninth",
    "tenth",
    "eleventh",
    "twelfth",
)

# Dotted-path parts, in the words a user can follow.
_CONTAINERS = {
    "down_blocks": "down-sampling block",
    "up_blocks": "up-sampling block",
    "resnets": "ResNet layer",
    "attentions": "attention layer",
    "transformer_blocks": "transformer block",
    "layers": "layer",
    "upsamplers": "upsampler",
    "downsamplers": "downsampler",
}
_SINGLES = {
    "mid_block": "the middle block",
    "encoder": "the encoder",
    "decoder": "the decoder",
    "text_model": "",
    "embeddings": "the embeddings",
    "final_layer_norm": "the final normalisation",
    "conv_in": "the input convolution",
    "conv_out": "the output convolution",
    "conv_norm_out": "the output normalisation",
    "post_quant_conv": "the convolution before the decoder",
    "quant_conv": "the convolution after the encoder",
    "time_embedding": "the timestep embedding",
    "add_embedding": "the size conditioning",
    "attn1": "self-attention",
    "attn2": "cross-attention (prompt)",
    "ff": "feed-forward",
    "norm1": "the first normalisation",
    "norm2": "the second normalisation",
    "norm3": "the third normalisation",
    "conv1": "the first convolution",
    "conv2": "the second convolution",
    "conv_shortcut": "the shortcut convolution",
    "proj_in": "the input projection",
    "proj_out": "the output projection",
    "to_q": "the query projection",
    "to_k": "the key projection",
    "to_v": "the value projection",
    "self_attn": "self-attention",
    "mlp": "the MLP",
    "fc1": "the first linear layer",
    "fc2": "the second linear layer",
    "q_proj": "the query projection",
    "k_proj": "the key projection",
    "v_proj": "the value projection",
    "out_proj": "the output projection",
    "layer_norm1": "the first normalisation",
    "layer_norm2": "the second normalisation",
    "net": "",
    "group_norm": "the group normalisation",
}


def ordinal(index: int) -> str:
    return _ORDINALS[index] if 0 <= index < len(_ORDINALS) else f"#{index + 1}"


def component_name(component: str) -> str:
    return COMPONENT_NAMES.get(component, component.replace("_", " ").capitalize())


def component_phrase(component: str) -> str:
    """'the VAE', 'the text encoder': a component's name inside a sentence."""
    name = component_name(component)
    return "the " + (name if name.isupper() or name == "UNet" else name.lower())


def describe_module(component: str, path: str | None) -> str:
    """'up_blocks.2.resnets.1.conv2' in the VAE -> 'the second convolution of the second
    ResNet layer of the third up-sampling block of the decoder, in the VAE'."""
    if not path:
        return ""
    parts = path.split(".")
    phrases: list[str] = []
    i = 0
    while i < len(parts):
        part = parts[i]
        nxt = parts[i + 1] if i + 1 < len(parts) else None
        if part in _CONTAINERS and nxt is not None and nxt.isdigit():
            phrases.append(f"the {ordinal(int(nxt))} {_CONTAINERS[part]}")
            i += 2
            continue
        if part == "to_out":
            phrases.append("the attention output")
            i += 2 if nxt is not None and nxt.isdigit() else 1
            continue
        if part.isdigit():
            phrases.append(f"part {int(part) + 1}")
        elif part in _SINGLES:
            if _SINGLES[part]:
                phrases.append(_SINGLES[part])
        else:
            phrases.append(f"'{part}'")
        i += 1
    if not phrases:
        return component_phrase(component)
    # Innermost first reads naturally: "the second convolution of the third up-sampling block".
    sentence = " of ".join(reversed(phrases))
    return f"{sentence}, in {component_phrase(component)}"


def short_block(module: str) -> str:
    """A chart label: 'decoder.up_blocks.2' -> 'dec up 2'."""
    text = module
    for long, short in (
        ("decoder.", "dec "),
        ("encoder.", "enc "),
        ("text_model.", ""),
        ("down_blocks.", "down "),
        ("up_blocks.", "up "),
        ("mid_block", "mid"),
        ("layers.", "layer "),
        ("conv_norm_out", "norm out"),
        ("post_quant_conv", "post quant"),
        ("time_embedding", "time emb"),
        ("final_layer_norm", "final norm"),
        ("embeddings", "embed"),
        ("_", " "),
    ):
        text = text.replace(long, short)
    return re.sub(r"\s+", " ", text).strip()


def big_number(value: float | None) -> str:
    if value is None:
        return "unknown"
    if value != value or value in (float("inf"), float("-inf")):
        return "infinite"
    if value >= 1e6 or (0 < value < 0.01):
        return f"{value:.2e}"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def fed_by_words(fed_by: str) -> str:
    """The chip of a component fed non-finite input by an earlier one (not its own fault)."""
    return f"Fed non-finite input by {component_phrase(fed_by)}"


# What a model predicts, in the words a user knows it by.
PREDICTION_WORDS = {
    "epsilon": "epsilon (noise) prediction",
    "v_prediction": "v-prediction",
    "sample": "sample prediction",
    "flow": "flow matching",
}


def prediction_words(kind: str) -> str:
    return PREDICTION_WORDS.get(kind, f"{kind.replace('_', '-')} prediction")


def megabytes(value: float | None) -> str:
    if value is None:
        return "not measured"
    if value >= 1024:
        return f"{value / 1024:.2f} GB"
    return f"{value:,.0f} MB"


def file_size(num_bytes: int | None) -> str:
    if num_bytes is None:
        return ""
    size = float(num_bytes)
    for unit in ("bytes", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:,.0f} {unit}" if unit == "bytes" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


def milliseconds(value: float | None) -> str:
    return "not measured" if value is None else f"{value:,.0f} ms"


def choice_name(value: str) -> str:
    return CHOICE_NAMES.get(value, value)


def setting_value(key: str, value: Any) -> str:
    """A setting's value as the settings panel would show it."""
    from app.core.settings import FIELDS

    field = FIELDS.get(key)
    if isinstance(value, bool):
        return "on" if value else "off"
    if field is not None and field.kind == "choice":
        return choice_name(str(value))
    if field is not None and field.kind == "modules":
        count = len(value or [])
        return f"{count} layer{'s' if count != 1 else ''}" + (
            f" ({', '.join(value)})" if count else ""
        )
    return str(value)


def setting_value_on(key: str, value: Any, device_kind: str | None) -> str:
    """`setting_value`, in the words that fit the device: on a CPU the "flash" backend is
    PyTorch's fused CPU kernel, not the FlashAttention GPU library people know by that name."""
    if key == "attention_backend" and device_kind == "cpu" and value == "flash":
        return "PyTorch's fused CPU kernel"
    return setting_value(key, value)


def setting_label(key: str) -> str:
    from app.core.settings import FIELDS

    field = FIELDS.get(key)
    return field.label if field else key.replace("_", " ")


def settings_listed(settings: Mapping[str, Any] | None) -> str:
    """Settings as the Settings page names them, label by label: {'vae_precision': 'fp32'} ->
    'VAE precision: fp32 (full)'. A fix is said with `fix_short`, never this."""
    if not settings:
        return ""
    return "; ".join(f"{setting_label(k)}: {setting_value(k, v)}" for k, v in settings.items())


def fix_short(settings: Mapping[str, Any] | None, components: Sequence[str] = ()) -> str:
    """What a fix does, short enough for a table cell, in the one words a fix is said with
    (`precision.words.fix_words`): {'fp32_modules': ['vae:a', 'vae:b']} -> 'Keep 2 VAE layers
    in fp32'; {'vae_precision': 'fp32'} -> 'Run the VAE in fp32'. `components`, the model's
    where known, say the denoiser it has ('Run the transformer in bf16')."""
    from app.core.precision.words import fix_words

    return first_upper(fix_words(settings, components))


def precision_summary(
    values: Mapping[str, Any],
    recommended: Mapping[str, Any] | None = None,
    parts: Sequence[str] = (),
) -> str:
    """'fp16, VAE in fp32, attention upcast to fp32' for the status bar and captions: what
    `values` give each of `parts` (the loaded model's; the usual ones when none is known),
    as far as the settings and this computer's recommendation decide it (core's
    `expected_dtypes`), in the one words table of `precision.words`."""
    from app.core.precision.words import USUAL_PARTS, settings_words

    expected = expected_dtypes(values, recommended)
    dtypes = {
        part: expected[COMPONENTS[part].setting]
        for part in parts or USUAL_PARTS
        if part in COMPONENTS and COMPONENTS[part].setting in expected
    }
    return settings_words(values, dtypes)


def job_ran_words(result: Any, parts: Sequence[str] = ()) -> str:
    """The status bar's words for what a finished generation (`GenerationResult`) ran with:
    the job's precision (made again with a fix said as such: where that fix stands now, the
    image's banner says), and a repair after it as a repair, once per repair: 'fp16
    everywhere; repaired after: keep 2 VAE layers in bf16'. A repair is no setting: the next
    job at the same settings repairs again."""
    said = precision_summary(result.settings, parts=parts)
    if result.job_fix is not None:
        said += " (made again with a fix)"
    repairs = dict.fromkeys(fix for image in result.images for fix in image.fixes_applied)
    if repairs:
        said += "; repaired after: " + ", ".join(repairs)
    return said


def architecture_name(architecture: str | None) -> str:
    # Imported here: the family registry imports every family's module, which the window
    # needs only once a model is listed or loaded, not to show itself.
    from app.core.families import architecture_title

    return architecture_title(architecture)


def first_upper(text: str) -> str:
    """'goes NaN' -> 'Goes NaN' (str.capitalize would lower the rest: 'Goes nan')."""
    return text[:1].upper() + text[1:]


def first_lower(text: str) -> str:
    """'Keep 1 VAE layer in fp32' -> 'keep 1 VAE layer in fp32', inside a sentence; a first
    word in capitals ('T5 feed-forward ...', 'VAE precision') is left as it is."""
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


# Where a wrapped line may break inside a name without spaces (a layer path, a file name).
# A separator between two digits is part of a number (4.2, 8,192) and never breaks.
_BREAK_AFTER = re.compile(r"((?<!\d)[._/\\:,]|[._/\\:,](?!\d))(?=\S)")


def breakable(text: str) -> str:
    """`text` with a zero-width break opportunity after each dot, underscore, slash, colon and
    comma, so a long layer path such as decoder.up_blocks.0.resnets.0.conv1 wraps in a narrow
    window instead of widening it (display only: the characters shown do not change)."""
    return _BREAK_AFTER.sub("\\1\u200b", text)
