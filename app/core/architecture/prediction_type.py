"""The prediction type a checkpoint states (v_pred and ztsnr markers, training metadata,
ModelSpec, an A1111 `.yaml` beside it), or the guess from its name and family that
`app.core.models.prediction` tests with the UNet itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Prediction:
    """What a denoiser predicts and how we know it."""

    kind: str  # "epsilon" | "v_prediction"
    zero_terminal_snr: bool  # trained on a zero-terminal-SNR schedule (Illustrious/NoobAI v)
    because: str  # words completing "...; ", e.g. "v-prediction because the file carries ..."
    decided: bool  # by something the file or its .yaml states; False: a guess to test


def read_prediction(
    family: str, keys: list[str], metadata: Mapping[str, str], name: str, sidecar_config: str | None
) -> Prediction:
    """The prediction type from what the file states, or the guess a test pass should check.

    Weights cannot tell epsilon from v-prediction, so this reads markers in order: the empty
    `v_pred` and `ztsnr` tensors NoobAI/kohya/ComfyUI write, training metadata (kohya's
    ss_v_parameterization and ss_zero_terminal_snr, ModelSpec), an A1111 `.yaml` beside the
    file. Without one, the file name and then the family's usual choice give an undecided
    guess (`decided=False`) that `app.core.models.prediction` tests with the UNet itself.
    """
    keyset = set(keys)
    zsnr_flag = metadata.get("ss_zero_terminal_snr", "").strip().lower()
    zsnr = "ztsnr" in keyset or zsnr_flag == "true"
    zsnr_words = ""
    if "ztsnr" in keyset:
        zsnr_words = ", with zero-terminal-SNR noise (its ztsnr marker)"
    elif zsnr:
        zsnr_words = ", with zero-terminal-SNR noise (ss_zero_terminal_snr)"

    def stated(kind: str, why: str) -> Prediction:
        return Prediction(kind, zsnr, f"{_words(kind)} {why}{zsnr_words}", True)

    if "v_pred" in keyset or "edm_vpred.sigma_max" in keyset:
        return stated("v_prediction", "because the file carries a v_pred marker")
    flag = metadata.get("ss_v_parameterization", "").strip().lower()
    if flag in ("true", "false"):
        kind = "v_prediction" if flag == "true" else "epsilon"
        return stated(kind, "per its training metadata (ss_v_parameterization)")
    spec = metadata.get("modelspec.prediction_type", "").strip().lower()
    if spec.startswith(("v", "eps")):
        kind = "v_prediction" if spec.startswith("v") else "epsilon"
        return stated(kind, "per its ModelSpec metadata")
    if metadata.get("modelspec.architecture", "").strip().lower().endswith("-v"):
        return stated("v_prediction", "per its ModelSpec architecture")
    if sidecar_config is not None:
        if re.search(r"parameterization:\s*[\"']?v[\"']?\s*$", sidecar_config, re.MULTILINE):
            return stated("v_prediction", "per the .yaml config beside it")
        return stated("epsilon", "per the .yaml config beside it")

    def guess(kind: str, why: str) -> Prediction:
        return Prediction(kind, zsnr, f"{_words(kind)} {why}{zsnr_words}", False)

    lowered = name.lower()
    if re.search(r"(^|[^a-z0-9])v[-_ ]?pred", lowered):
        return guess("v_prediction", "because its name says v-pred")
    if family == "sd2":
        if "768" in lowered:
            return guess(
                "v_prediction", "because its name says 768 (SD2's 768 models are v-prediction)"
            )
        if "512" in lowered or "base" in lowered:
            return guess("epsilon", "because its name marks it as a 512/base model")
        return guess(
            "v_prediction",
            "assumed, as most SD2.x models are 768-v "
            "(put '512' in the name or an A1111 .yaml beside it if it is an epsilon model)",
        )
    return guess("epsilon", "as usual for this family")


def _words(kind: str) -> str:
    return "v-prediction" if kind == "v_prediction" else "epsilon prediction"
