"""The original Stable Diffusion checkpoint layout read from tensor names and shapes: its keys,
each component's config, the prediction type a file states, and what a file that is no model
is. The families decide which of them a file or folder holds (`families.detect_architecture`,
`families.detect_from_configs`) and say in one sentence why.

Everything here works on `{name: shape}` from a file's header, so it is cheap (no torch, no
tensor data) and the model library can use it too. Config inference starts from the architecture's shipped diffusers config and replaces
every value the shapes determine (widths, blocks, layers, attention and context dims, input
channels), so that inpainting variants, distilled UNets with fewer blocks and small test models
load as well. Attention head counts are not stored in weights: they follow the architecture's
rule (64-wide heads for SD2/SDXL and CLIP, 8 heads for SD1.x UNets).

One responsibility per module, each importing only those before it:
  keys              the original layout's key prefixes; prefix checks, widths, layer counts
  configs           a diffusers config per component from the shapes; shape_problem
  prediction_type   the prediction type a file states, or the guess to test
  single_file       what a file that is no family's checkpoint is (a LoRA, a VAE, ...)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.lazy import lazy_exports

if TYPE_CHECKING:
    from app.core.architecture.configs import (
        infer_text_encoder_config,
        infer_unet_config,
        infer_vae_config,
        shape_problem,
    )
    from app.core.architecture.keys import (
        Shapes,
    )
    from app.core.architecture.prediction_type import Prediction, read_prediction
    from app.core.architecture.single_file import not_a_full_checkpoint, other_file
    from app.core.detection import UNET, VAE, Detection, TextEncoderLayout

__all__ = [
    "UNET",
    "VAE",
    "Detection",
    "Prediction",
    "Shapes",
    "TextEncoderLayout",
    "infer_text_encoder_config",
    "infer_unet_config",
    "infer_vae_config",
    "not_a_full_checkpoint",
    "other_file",
    "read_prediction",
    "shape_problem",
]

if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            ".configs": [
                "infer_text_encoder_config",
                "infer_unet_config",
                "infer_vae_config",
                "shape_problem",
            ],
            ".keys": ["Shapes"],
            ".prediction_type": ["Prediction", "read_prediction"],
            ".single_file": ["not_a_full_checkpoint", "other_file"],
            "app.core.detection": ["UNET", "VAE", "Detection", "TextEncoderLayout"],
        },
    )
