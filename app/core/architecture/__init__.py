"""Which model a checkpoint holds, and each component's config, read from tensor names and shapes.

Everything here works on `{name: shape}` from a file's header, so it is cheap (no torch, no
tensor data) and the model library can use it too. Detection says in one sentence why it
decided; config inference starts from the architecture's shipped diffusers config and replaces
every value the shapes determine (widths, blocks, layers, attention and context dims, input
channels), so that inpainting variants, distilled UNets with fewer blocks and small test models
load as well. Attention head counts are not stored in weights: they follow the architecture's
rule (64-wide heads for SD2/SDXL and CLIP, 8 heads for SD1.x UNets).

One responsibility per module, each importing only those before it:
  keys              the original layout's key prefixes; prefix checks, widths, layer counts
  configs           a diffusers config per component from the shapes; shape_problem
  prediction_type   the prediction type a file states, or the guess to test
  single_file       detect_architecture: what a single-file checkpoint is
  diffusers_folder  detect_from_configs: what a diffusers folder is
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
    from app.core.architecture.diffusers_folder import detect_from_configs
    from app.core.architecture.keys import (
        CONFIG_NAMES,
        SD1_TEXT,
        SD2_TEXT,
        SDXL_REFINER_TEXT,
        SDXL_TEXT_1,
        SDXL_TEXT_2,
        SUPPORTED,
        Shapes,
    )
    from app.core.architecture.prediction_type import Prediction, read_prediction
    from app.core.architecture.single_file import detect_architecture
    from app.core.detection import UNET, VAE, Detection, TextEncoderLayout

__all__ = [
    "CONFIG_NAMES",
    "SD1_TEXT",
    "SD2_TEXT",
    "SDXL_REFINER_TEXT",
    "SDXL_TEXT_1",
    "SDXL_TEXT_2",
    "SUPPORTED",
    "UNET",
    "VAE",
    "Detection",
    "Prediction",
    "Shapes",
    "TextEncoderLayout",
    "detect_architecture",
    "detect_from_configs",
    "infer_text_encoder_config",
    "infer_unet_config",
    "infer_vae_config",
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
            ".diffusers_folder": ["detect_from_configs"],
            ".keys": [
                "CONFIG_NAMES",
                "SD1_TEXT",
                "SD2_TEXT",
                "SDXL_REFINER_TEXT",
                "SDXL_TEXT_1",
                "SDXL_TEXT_2",
                "SUPPORTED",
                "Shapes",
            ],
            ".prediction_type": ["Prediction", "read_prediction"],
            ".single_file": ["detect_architecture"],
            "app.core.detection": ["UNET", "VAE", "Detection", "TextEncoderLayout"],
        },
    )
