"""4-bit integer weights of LLM exports that HalfSafe cannot read, told by their tensors' names
and refused in one sentence naming the file, the format and a tensor.

- GPTQ (`<layer>.qweight`: eight 4-bit values packed in each int32, `qzeros`, `scales`, and the
  input-channel order `g_idx`), and AWQ's export of the same packing (AutoAWQ: no `g_idx`).
  transformers reads them only through its GPTQ and AWQ integrations, which need optimum and
  gptqmodel or autoawq; HalfSafe installs none of them.
- comfy-kitchen's W4A8 (`asym_w4a8_int8`, ComfyUI's `*_w4a8` encoders and models): per layer
  `weight` (int8 [N, K/2]: two 4-bit codes a byte), `weight_s_rel` (fp8 [N, K/16]: a scale per
  group of 16), `weight_s_channel` (fp32 [N]) and `weight_codebook` (fp32 [16]), rotated by
  ConvRot in groups of 256. Only comfy-kitchen decodes it, and HalfSafe reads no weights
  through comfy-kitchen (an optional companion it only compares kernels with).

Names only: no tensor is read. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from app.core.errors import BadFileError

W4A8_SUFFIXES = (".weight_s_rel", ".weight_s_channel", ".weight_codebook")

_GPTQ = (
    "GPTQ (4-bit integers packed eight to an int32, with zero points, group scales and a "
    "channel order), which HalfSafe cannot read: transformers decodes it only with optimum and "
    "gptqmodel, which HalfSafe does not use; check a bf16, fp8, int8 or NVFP4 file of the same "
    "model instead."
)
_AWQ = (
    "AWQ (4-bit integers packed eight to an int32, with zero points and group scales), which "
    "HalfSafe cannot read: transformers decodes it only with autoawq, which HalfSafe does not "
    "use; check a bf16, fp8, int8 or NVFP4 file of the same model instead."
)

# {name}: the tensor; {value}: a config's quantization_config, shortened; completing
# "<file>: ...".
INT4_WORDS = {
    "gptq": "tensor '{name}' is stored as " + _GPTQ,
    "gptq_or_awq": (
        "tensor '{name}' is stored as GPTQ or AWQ (4-bit integers packed eight to an int32, "
        "with zero points and group scales), which HalfSafe cannot read: transformers decodes "
        "them only with optimum and gptqmodel or autoawq, which HalfSafe does not use; check "
        "a bf16, fp8, int8 or NVFP4 file of the same model instead."
    ),
    "w4a8": (
        "tensor '{name}' is stored as W4A8 (comfy-kitchen's asym_w4a8_int8: 4-bit codes from "
        "a codebook with fp8 group scales, rotated by ConvRot), which HalfSafe cannot read: "
        "only comfy-kitchen decodes it, and HalfSafe reads no weights through comfy-kitchen; "
        "check a bf16, fp8, int8 or NVFP4 file of the same model instead."
    ),
    "gptq_config": "its quantization_config says the weights are stored as " + _GPTQ,
    "awq_config": "its quantization_config says the weights are stored as " + _AWQ,
    "other_config": (
        "its quantization_config says the weights are quantized by {value}, which HalfSafe "
        "does not load (transformers and diffusers read such folders only through that "
        "method's own package); check a bf16, fp8, int8 or NVFP4 file of the same model instead."
    ),
    "bad_config": (
        "its quantization_config is {value}, where transformers and diffusers read a table of "
        "settings that names its quant_method, so the folder cannot be loaded."
    ),
}
# quant_method as transformers and diffusers write it -> the words above.
_CONFIG_METHODS = {"gptq": "gptq_config", "awq": "awq_config"}


def refuse_int4(path: Path, dtypes: Mapping[str, str]) -> None:
    """Raise BadFileError naming the first GPTQ, AWQ or W4A8 weight of a safetensors file
    (`dtypes`: its tensors' names); return for a file that holds none."""
    names = sorted(dtypes)
    for name in names:
        if name.endswith(W4A8_SUFFIXES):
            weight = name[: name.rindex(".weight_")] + ".weight"
            raise BadFileError(path, INT4_WORDS["w4a8"].format(name=weight))
    for name in names:
        if name.endswith(".qweight") and dtypes[name] in ("I32", "U32", "I8", "U8"):
            base = name.removesuffix("qweight")
            if base + "g_idx" in dtypes:
                raise BadFileError(path, INT4_WORDS["gptq"].format(name=name))
            if base + "qzeros" in dtypes or base + "scales" in dtypes:
                raise BadFileError(path, INT4_WORDS["gptq_or_awq"].format(name=name))


def refuse_quantization_config(path: Path, config: Mapping[str, object]) -> None:
    """Raise BadFileError naming `path` (a component's config.json) when it has a
    `quantization_config`: GPTQ and AWQ (a table with that quant_method, or the bare name) in
    the words of their tensors, any other method by its name, and a value that is not a table
    naming a quant_method as damage. Before any loader sees it: transformers and diffusers
    would import that method's package (optimum, autoawq, bitsandbytes, ...), which HalfSafe
    does not install, and end in an ImportError; and a layer quantized so cannot take the
    precision a fix gives it."""
    if "quantization_config" not in config:
        return
    value = config["quantization_config"]
    method = value.get("quant_method") if isinstance(value, Mapping) else value
    if isinstance(method, str) and method.strip().lower() in _CONFIG_METHODS:
        raise BadFileError(path, INT4_WORDS[_CONFIG_METHODS[method.strip().lower()]])
    shown = repr(method if isinstance(value, Mapping) and isinstance(method, str) else value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    if not isinstance(value, Mapping) or not isinstance(method, str):
        raise BadFileError(path, INT4_WORDS["bad_config"].format(value=shown))
    raise BadFileError(path, INT4_WORDS["other_config"].format(value=shown))
