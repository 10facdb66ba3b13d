"""The stored forms a model is published in, as people download them (bf16, fp8, int8 ConvRot,
NVFP4, GGUF Q8_0/Q4_0/Q4_K), and the form a loaded model's files were stored in, read from the
stored types its quantised files hold (`quantized.summary`)."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.formats.weight_findings import StoredQuantization


@dataclass(frozen=True)
class StoredForm:
    """One stored form: its key (JSON and saved reports), how people name it, the bytes a
    quantised matrix weight holds in it (None: 16 bits, as every weight), and the stored types
    (`quantized.Quantization.types`) that mark a file of it."""

    key: str
    words: str
    bytes_per_weight: float | None
    types: tuple[str, ...]


BF16 = "bf16"
FORMS: tuple[StoredForm, ...] = (
    StoredForm(BF16, "bf16 or fp16 (16 bits)", None, ()),
    StoredForm("fp8", "fp8", 1.0, ("F8_E4M3", "F8_E5M2")),
    # int8 values and one scale per output row: what fp8 holds.
    StoredForm("int8-convrot", "int8 ConvRot", 1.0, ("INT8_CONVROT",)),
    # Two E2M1 values a byte and an fp8 scale per 16: 9/16 of a byte, as Q4_0.
    StoredForm("nvfp4", "NVFP4", 9 / 16, ("NVFP4",)),
    StoredForm("gguf-q8_0", "GGUF Q8_0", 34 / 32, ("Q8_0",)),
    StoredForm("gguf-q4_0", "GGUF Q4_0", 18 / 32, ("Q4_0",)),
    # 144 bytes per block of 256 weights: Q4_0's 9/16 of a byte.
    StoredForm("gguf-q4_k", "GGUF Q4_K", 144 / 256, ("Q4_K",)),
)
BY_KEY = {form.key: form for form in FORMS}
# Where a file mixes stored types, the one that keeps the fewest bits names it (an NVFP4 file
# keeps some layers in fp8; a Q4_K file some in Q8_0 or F16).
_FEWEST_BITS_FIRST = ("nvfp4", "gguf-q4_k", "gguf-q4_0", "int8-convrot", "gguf-q8_0", "fp8")


def stored_form(quantization: StoredQuantization | None) -> str:
    """The key of the form a model's files store it in: bf16 where nothing is quantised; ""
    where its quantised types are none of the published forms (plain int8, Q5_K, ...)."""
    if quantization is None:
        return BF16
    types = {t.upper() for t in quantization.types}
    # However a reader spells rotated int8 (INT8_CONVROT, ...), it is ConvRot's.
    types |= {"INT8_CONVROT" for t in types if "CONVROT" in t}
    for key in _FEWEST_BITS_FIRST:
        if types & set(BY_KEY[key].types):
            return key
    return ""
