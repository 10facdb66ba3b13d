"""A custom node for the server tests only (test_server.py links it into the server's
custom_nodes beside HalfSafe's): the text and the empty latent HalfSafe Check feeds a model
without a CLIP, as a sampler's inputs. It stands in for the text encoder, whose released
configs are too large to load on a test machine's CPU (T5-XXL, Qwen2.5-VL 7B); the sampler,
the model and HalfSafe's nodes are ComfyUI's and HalfSafe's own.

Zeros of the model's own text width (HalfSafe Check's `host._text`, found through the package
ComfyUI loaded), and a latent of zeros shaped as HalfSafe Check's call shapes it."""

from __future__ import annotations

import sys


def _halfsafe_host():
    for module in list(sys.modules.values()):
        mappings = getattr(module, "NODE_CLASS_MAPPINGS", None)
        if isinstance(mappings, dict) and "HalfSafeCheck" in mappings and hasattr(module, "host"):
            return module.host
    raise RuntimeError("HalfSafe's node package is not loaded in this ComfyUI")


class HalfSafeTestZeroText:
    CATEGORY = "HalfSafe/tests"
    RETURN_TYPES = ("CONDITIONING", "LATENT")
    FUNCTION = "inputs"

    @classmethod
    def INPUT_TYPES(cls):
        size = {"default": 64, "min": 16, "max": 1024, "step": 8}
        return {"required": {"model": ("MODEL",), "width": ("INT", size), "height": ("INT", size)}}

    def inputs(self, model, width, height):
        import torch

        host = _halfsafe_host()
        base = model.model
        context, pooled = host.check_text(base)
        extra = {"pooled_output": pooled} if pooled is not None else {}
        shape = host.latent_shape(base, width, height)
        return ([[context, extra]], {"samples": torch.zeros(shape)})


NODE_CLASS_MAPPINGS = {"HalfSafeTestZeroText": HalfSafeTestZeroText}
