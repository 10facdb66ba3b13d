"""LoadedModel: a loaded pipeline and what HalfSafe knows about it, whichever loader built it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.core.formats.weight_findings import StoredQuantization, WeightScan


@dataclass
class LoadedModel:
    """A loaded pipeline and what HalfSafe knows about it."""

    pipeline: Any  # diffusers StableDiffusion(XL)Pipeline on CPU, weights in stored dtype
    source: str  # what the user gave (path or "demo")
    name: str  # file/folder stem, "demo" for the demo
    format: str  # "diffusers" | "single_file" | "demo"
    architecture: str  # "sd1" | "sd2" | "sdxl", "-inpaint" variants
    prediction_type: str  # "epsilon" | "v_prediction"
    native_size: int  # 512 / 768 / 1024 (demo: its own small size)
    stored_dtype: str  # "fp16" | "bf16" | "fp32" | "mixed"
    model_hash: str | None  # AUTOMATIC1111 short hash (first 10 hex of the file's sha256)
    profile_key: str  # identity of the weights (see `identity.Identity`): remembered fixes use it
    weights: WeightScan
    detected_because: str  # one sentence: why we think it is this architecture
    vae: str | None = None  # the separate VAE file or folder loaded in place of the model's
    zero_terminal_snr: bool = False  # its scheduler rescales betas to zero terminal SNR
    prediction_because: str = ""  # how the prediction type is known (part of detected_because)
    loras: list[Any] = field(default_factory=list)  # lora.AppliedLora, in the order applied
    lora_warnings: list[str] = field(default_factory=list)  # prompt tags refused, a sentence each
    # How its files store the weights when any is fp8 or GGUF (quantized.summary), else None.
    quantization: StoredQuantization | None = None
    # A split transformer file's text-encoder and VAE files, by component (what a damaged
    # weight of that component is blamed on), and what the loader has to say about them.
    companions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # The live preview's latent colours (`preview.colours_for`) by the VAE's dtype, found on
    # the first preview; None where the VAE gave nothing to fit them to.
    preview_colours: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def components(self) -> tuple[str, ...]:
        """The model's components its pipeline holds ("unet", "vae", ...), in run order."""
        from app.core.components import PIPELINE_PARTS

        return tuple(n for n in PIPELINE_PARTS if getattr(self.pipeline, n, None) is not None)
