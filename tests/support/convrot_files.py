"""int8 ConvRot files: the families written so (Z-Image beside the newest), each family's tiny
pipeline built once a session, and a Z-Image file whose rotation, not its input, overflows
fp16."""

from __future__ import annotations

import torch

from app.core.checkpoint import Checkpoint, write_safetensors
from app.core.checkpoint.stored import hadamard
from tests.support.quantised_transformers import CASES, Case, quantised_set, written_weights
from tests.support.tiny_models import build_tiny_zimage_pipeline

# The families whose October templates ship int8 ConvRot files, as quantised_transformers.py
# writes them, and Z-Image beside them.
ZIMAGE = Case(
    build_tiny_zimage_pipeline,
    "z_image_turbo",
    "zimage-turbo",
    "",
    ("layers.", "noise_refiner.", "context_refiner."),
    "",
    (),
    ("layers.0.feed_forward.w1.weight", "layers.0.feed_forward.w1"),
)
FAMILIES = {
    "flux3-klein": CASES["flux3-klein"],
    "qwenimage21": CASES["qwenimage21"],
    "krea2": CASES["krea2"],
    "zimage": ZIMAGE,
}


def rotation_overflowing_zimage(root):
    """Z-Image as int8 ConvRot (groups of 16) whose timestep embedding, the input of every
    block's modulation, is 20,000 times the signs of one row of H in its first group: rotated,
    80,000, past fp16's range, while the layers' products stay 0 (that column of their stored
    rows is 0). fp16 holds the input; only the rotation the tool makes overflows."""
    pipeline = build_pipeline("zimage")
    weights = written_weights(pipeline)
    embedding = torch.zeros(64)
    embedding[:16] = 20000.0 * torch.sign(hadamard(16)[3])
    mlp = weights["t_embedder.mlp.2.weight"]
    weights["t_embedder.mlp.2.weight"] = torch.zeros_like(mlp)
    weights["t_embedder.mlp.2.bias"] = embedding.to(torch.bfloat16)
    final = weights["final_layer.adaLN_modulation.1.weight"]  # bf16, not rotated: kept quiet
    weights["final_layer.adaLN_modulation.1.weight"] = torch.zeros_like(final)
    written = quantised_set(root, pipeline, ZIMAGE, "int8-convrot", weights)
    with Checkpoint(written.path) as checkpoint:
        tensors = {k: checkpoint._stored(k).clone() for k in checkpoint.header.tensors}  # type: ignore[union-attr]
    modulations = [k for k in written.rotated if "adaLN_modulation.0" in k]
    for key in modulations:
        tensors[key][:, 3] = 0
    write_safetensors(written.path, tensors)
    return written, weights, modulations


_BUILT: dict[str, object] = {}


def build_pipeline(name: str):
    """Each family's tiny pipeline, built once per test session (the tests never change it)."""
    if name not in _BUILT:
        _BUILT[name] = FAMILIES[name].build()
    return _BUILT[name]
