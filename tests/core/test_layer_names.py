"""A transformer's layers in its original layout (the names ComfyUI's modules have) and in
diffusers' (HalfSafe's), both ways, from the layout's key table: a fused layer is its parts, a
part is the fused layer (wider), a module with code between its layers is its counterpart or
the block holding it (wider). On the tiny transformers ComfyUI's detection reads (Flux.1,
Flux.2 Klein, SD3.5), and, for the widening, a check that the wider set computes at least as
close to fp32 as the set it stands for."""

from __future__ import annotations

import pytest
import torch

from app.core.families.registry import family_of_denoiser
from app.core.formats.layer_names import WHOLE, LayerNames
from tests.support.comfyui_dits import PLANT_SCALE, TINY_DITS, tiny_transformer


def names_of(transformer) -> LayerNames:
    family = family_of_denoiser(transformer)
    assert family is not None and family.layout is not None
    config = {**transformer.config, "_class_name": type(transformer).__name__}
    return LayerNames(family.layout.table(config))


@pytest.fixture(scope="module")
def flux():
    transformer = tiny_transformer("flux")
    return transformer, names_of(transformer)


def test_a_fused_layer_is_its_parts_and_a_part_is_the_fused_layer_wider(flux):
    _, names = flux
    qkv = names.to_diffusers("double_blocks.0.img_attn.qkv")
    assert qkv is not None and not qkv.widened
    assert qkv.paths == tuple(f"transformer_blocks.0.attn.to_{p}" for p in "kqv")
    part = names.to_original("transformer_blocks.0.attn.to_q")
    assert part is not None and part.widened
    assert part.paths == ("double_blocks.0.img_attn.qkv",)
    # A single block's one input layer is its attention's projections and its MLP's.
    single = names.to_diffusers("single_blocks.0.linear1")
    assert single is not None and not single.widened
    assert "single_transformer_blocks.0.proj_mlp" in single.paths and len(single.paths) == 4


def test_a_module_with_code_between_its_layers_is_its_counterpart_or_its_block(flux):
    _, names = flux
    # A block computes the same in both layouts.
    assert names.to_diffusers("double_blocks.0").paths == ("transformer_blocks.0",)
    assert not names.to_diffusers("double_blocks.0").widened
    assert names.to_original("single_transformer_blocks.1").paths == ("single_blocks.1",)
    # ComfyUI's attention op runs in its block's own code, not in a module of its own.
    attention = names.to_original("transformer_blocks.0.attn")
    assert attention.paths == ("double_blocks.0",) and attention.widened
    assert names.to_original("single_transformer_blocks.0.attn").paths == ("single_blocks.0",)
    # A feed-forward of exactly the same layers is its counterpart, not a list of them.
    feed_forward = names.to_diffusers("double_blocks.0.img_mlp")
    assert feed_forward.paths == ("transformer_blocks.0.ff",) and not feed_forward.widened
    # Outside every block, no smaller module is known to hold its code: the whole model.
    assert names.to_original("norm_out").paths == (WHOLE,)
    assert names.to_diffusers("no_such.layer") is None


@pytest.mark.parametrize("family", sorted(TINY_DITS))
def test_every_module_maps_onto_modules_holding_all_its_layers(family):
    """Each module of diffusers' model with weights, mapped to the original layout and back:
    modules this model has, holding every layer of the module (or the whole model)."""
    transformer = tiny_transformer(family)
    names = names_of(transformer)
    for path, module in transformer.named_modules():
        if not path or next(module.parameters(), None) is None:
            continue
        mapped = names.to_original(path)
        assert mapped is not None, path
        assert all(p == WHOLE or _holds(names.original_layers, p) for p in mapped.paths)
        if WHOLE in mapped.paths:
            continue
        back = [q for p in mapped.paths for q in names.to_diffusers(p).paths]
        if WHOLE in back:
            continue
        for again in back:
            transformer.get_submodule(again)  # a module this model has
        own = {n.rpartition(".")[0] for n, _ in module.named_parameters(prefix=path)}
        assert all(any(_within(layer, b) for b in back) for layer in own), path


def _holds(layers, path: str) -> bool:
    return any(_within(layer, path) for layer in layers)


def _within(layer: str, path: str) -> bool:
    return layer == path or layer.startswith(path + ".")


def test_an_island_widened_by_the_mapping_computes_at_least_as_close_to_fp32():
    """The check's verified island set (the planted attention, in bf16), and the set ComfyUI's
    layout keeps for it, mapped back: its block, in fp32. Both against fp32, in fp16."""
    from app.core.fixing.module_check import island_copy
    from app.core.fixing.quality import compare

    transformer = tiny_transformer("flux")
    with torch.no_grad():
        transformer.get_submodule(TINY_DITS["flux"].planted).weight.mul_(PLANT_SCALE)
    names = names_of(transformer)
    verified = "transformer_blocks.0.attn"
    (block,) = names.to_original(verified).paths
    wider = names.to_diffusers(block).paths
    assert wider == ("transformer_blocks.0",)

    torch.manual_seed(1)
    tokens, words = 16, 8
    inputs = {
        "hidden_states": torch.randn(1, tokens, 64),
        "encoder_hidden_states": torch.randn(1, words, 32),
        "pooled_projections": torch.randn(1, 32),
        "timestep": torch.tensor([1.0]),
        "guidance": torch.tensor([3.5]),
        "img_ids": torch.zeros(tokens, 3),
        "txt_ids": torch.zeros(words, 3),
    }

    def run(dtype, islands=(), wide=torch.bfloat16):
        model = tiny_transformer("flux").to(dtype)
        model.load_state_dict(transformer.state_dict())
        for path in islands:
            parent, _, leaf = path.rpartition(".")
            copy = island_copy(model.get_submodule(path), wide)
            setattr(model.get_submodule(parent), leaf, copy)
        cast = {k: v.to(dtype) if k not in ("img_ids", "txt_ids") else v for k, v in inputs.items()}
        with torch.no_grad():
            return model(**cast, return_dict=False)[0].float()

    reference = run(torch.float32)
    assert compare(run(torch.float16), reference).value < 0  # the planted fault
    proved = compare(run(torch.float16, [verified]), reference)
    widened = compare(run(torch.float16, wider, torch.float32), reference)
    assert proved.passed and widened.passed
    assert widened.value >= proved.value
    # The same wider set in bf16, which keeps fewer digits than the fp16 it replaces, is
    # further from fp32: a widened island is kept in fp32, never in bf16.
    assert compare(run(torch.float16, wider), reference).value < proved.value
