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

# {name}: the tensor; completing "<file>: ...".
INT4_WORDS = {
    "gptq": (
        "tensor '{name}' is stored as GPTQ (4-bit integers packed eight to an int32, with "
        "zero points, group scales and a channel order), which HalfSafe cannot read: "
        "transformers decodes it only with optimum and gptqmodel, which HalfSafe does not use; "
        "check a bf16, fp8, int8 or NVFP4 file of the same model instead."
    ),
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
}


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
