"""SD2's text encoder read from single files: every block the file has, penultimate semantics.

SD2 conditions on OpenCLIP's penultimate layer: the text runs through every block but the
tower's last one, then the final norm. Original files carry the whole tower (the last block
unused, plus a projection); diffusers' converter writes only the blocks SD2 runs. The reference
below runs the file's own weights through OpenCLIP's residual blocks by hand.
"""

from __future__ import annotations

import pytest
import torch

from app.core.checkpoint import write_safetensors
from app.core.families.sd import SD1_TEXT, SD2_TEXT, _sd2_encoder
from app.core.formats.layouts import count_indices
from app.core.models import load_model
from tests.support.checkpoint_files import tiny_sd2
from tests.support.model_files import ldm_state_dict

BLOCKS = SD2_TEXT + "transformer.resblocks."
HEADS = 4  # tiny_sd2's text encoder: 64 wide, 64 // 16 heads


def by_hand(tensors: dict[str, torch.Tensor], ids: torch.Tensor, blocks: int) -> torch.Tensor:
    """OpenCLIP's text tower run over its first `blocks` residual blocks, then ln_final."""
    p = SD2_TEXT
    x = tensors[p + "token_embedding.weight"][ids] + tensors[p + "positional_embedding"]
    width = x.shape[-1]

    def norm(x, name):
        return torch.nn.functional.layer_norm(
            x, (width,), tensors[name + ".weight"], tensors[name + ".bias"], eps=1e-5
        )

    for n in range(blocks):
        b = f"{BLOCKS}{n}."
        q, k, v = (
            torch.nn.functional.linear(
                norm(x, b + "ln_1"),
                tensors[b + "attn.in_proj_weight"],
                tensors[b + "attn.in_proj_bias"],
            )
            .unflatten(-1, (3, HEADS, width // HEADS))
            .permute(2, 0, 3, 1, 4)
        )
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        attended = attended.transpose(1, 2).flatten(-2)
        x = x + torch.nn.functional.linear(
            attended, tensors[b + "attn.out_proj.weight"], tensors[b + "attn.out_proj.bias"]
        )
        hidden = torch.nn.functional.linear(
            norm(x, b + "ln_2"), tensors[b + "mlp.c_fc.weight"], tensors[b + "mlp.c_fc.bias"]
        )
        x = x + torch.nn.functional.linear(
            torch.nn.functional.gelu(hidden),
            tensors[b + "mlp.c_proj.weight"],
            tensors[b + "mlp.c_proj.bias"],
        )
    return norm(x, p + "ln_final")


def tower_blocks(tensors) -> int:
    return count_indices({k: tuple(v.shape) for k, v in tensors.items()}, BLOCKS)


@pytest.fixture(scope="module")
def pipeline():
    return tiny_sd2(seed=3)


def full_tower(pipeline) -> dict[str, torch.Tensor]:
    """The original layout: every block the model reads, one more (real weights, unused by
    SD2), and the text projection."""
    tensors = dict(ldm_state_dict(pipeline, architecture="sd2"))
    last = tower_blocks(tensors) - 1
    generator = torch.Generator().manual_seed(7)
    for key in [k for k in tensors if k.startswith(f"{BLOCKS}{last}.")]:
        shape = tensors[key].shape
        tensors[key] = torch.randn(shape, generator=generator) * 0.3 + (
            1.0 if key.endswith(("ln_1.weight", "ln_2.weight")) else 0.0
        )
    return tensors


def converted(pipeline) -> dict[str, torch.Tensor]:
    """What diffusers' converter writes for SD2: only the blocks SD2 runs, no projection."""
    tensors = dict(ldm_state_dict(pipeline, architecture="sd2"))
    last = tower_blocks(tensors) - 1
    return {
        k: v
        for k, v in tensors.items()
        if not k.startswith(f"{BLOCKS}{last}.") and k != SD2_TEXT + "text_projection"
    }


def embeddings(model, prompt: str) -> torch.Tensor:
    pipe = model.pipeline
    ids = pipe.tokenizer(prompt, padding="max_length", max_length=77, return_tensors="pt")
    with torch.no_grad():
        return pipe.text_encoder(ids.input_ids)[0], ids.input_ids


def test_converted_sd2_file_keeps_every_block_it_has(tmp_path, pipeline):
    tensors = converted(pipeline)
    blocks = tower_blocks(tensors)
    assert blocks == pipeline.text_encoder.config.num_hidden_layers == 2
    path = write_safetensors(tmp_path / "sd2-converted.safetensors", tensors)
    model = load_model(str(path))
    assert model.architecture == "sd2"
    assert model.pipeline.text_encoder.config.num_hidden_layers == blocks
    assert "the blocks SD2 reads, all of them used" in model.detected_because
    hidden, ids = embeddings(model, "a red cube on a table")
    reference = by_hand(tensors, ids, blocks)
    assert torch.allclose(hidden, reference, atol=1e-5)
    # Dropping a block, as HalfSafe used to, gives other embeddings.
    assert (by_hand(tensors, ids, blocks - 1) - reference).abs().max() > 0.1


def test_full_tower_sd2_file_reads_the_penultimate_layer(tmp_path, pipeline):
    tensors = full_tower(pipeline)
    blocks = tower_blocks(tensors)
    assert blocks == 3 and SD2_TEXT + "text_projection" in tensors
    path = write_safetensors(tmp_path / "sd2-original.safetensors", tensors)
    model = load_model(str(path))
    assert model.pipeline.text_encoder.config.num_hidden_layers == blocks - 1
    assert "SD2 reads the penultimate layer" in model.detected_because
    hidden, ids = embeddings(model, "a red cube on a table")
    penultimate = by_hand(tensors, ids, blocks - 1)
    assert torch.allclose(hidden, penultimate, atol=1e-5)
    assert (by_hand(tensors, ids, blocks) - penultimate).abs().max() > 0.1  # the last is real


def test_converted_and_original_files_give_the_same_embeddings(tmp_path, pipeline):
    original = write_safetensors(tmp_path / "original.safetensors", full_tower(pipeline))
    convert = write_safetensors(tmp_path / "converted.safetensors", converted(pipeline))
    a, _ = embeddings(load_model(str(original)), "an astronaut riding a horse")
    b, _ = embeddings(load_model(str(convert)), "an astronaut riding a horse")
    assert torch.equal(a, b)


def test_real_size_depth_decides_full_or_converted():
    """ViT-H has 24 blocks: 24 in a file is the full tower, 23 the converted one."""
    width = 1024

    def shapes(blocks: int, projection: bool) -> dict[str, tuple[int, ...]]:
        out = {SD2_TEXT + "token_embedding.weight": (49408, width)}
        out.update({f"{BLOCKS}{n}.ln_1.weight": (width,) for n in range(blocks)})
        if projection:
            out[SD2_TEXT + "text_projection"] = (width, width)
        return out

    assert _sd2_encoder(shapes(24, True), SD2_TEXT, "openclip").drop_last_layer
    assert _sd2_encoder(shapes(24, False), SD2_TEXT, "openclip").drop_last_layer
    assert not _sd2_encoder(shapes(23, False), SD2_TEXT, "openclip").drop_last_layer
    assert not _sd2_encoder(shapes(23, True), SD2_TEXT, "openclip").drop_last_layer


def test_sd2_text_encoder_under_transformers_names_is_sd2_with_every_layer(tmp_path, pipeline):
    """A converted SD2 file may store OpenCLIP under cond_stage_model.transformer with
    transformers' names, where SD1's CLIP sits: still SD2, every layer kept."""
    tensors = ldm_state_dict(pipeline, architecture="sd1")  # CLIP layout for the text encoder
    assert any(k.startswith(SD1_TEXT + "text_model.encoder.layers.1.") for k in tensors)
    path = write_safetensors(tmp_path / "sd2-hf-names.safetensors", tensors)
    model = load_model(str(path))
    assert model.architecture == "sd2"
    assert model.pipeline.text_encoder.config.num_hidden_layers == 2
    assert model.pipeline.text_encoder.config.hidden_act == "gelu"  # SD2's, not SD1's quick_gelu
    hidden, ids = embeddings(model, "a red cube on a table")
    with torch.no_grad():
        expected = pipeline.text_encoder(ids)[0]
    assert torch.allclose(hidden, expected, atol=1e-5)
