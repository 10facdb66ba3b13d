"""Quantized weights kept as their files store them (`StoredTensor`): GGUF blocks and fp8 bytes
stay in memory as written, read as the values they mean, and a component placed in any
precision holds its stored bytes, computing as a copy in that precision would."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from app.core import models
from app.core.checkpoint.stored import (
    StoredTensor,
    _gguf_decoders,
    from_fp8,
    from_gguf,
    gguf_decodable,
)
from app.core.formats import layouts, quantized
from app.core.formats.quantized import TORCH_DECODED_GGUF
from app.core.models import split
from app.core.precision import PrecisionPlan
from app.core.precision.placement import PlacedPipeline, tensor_bytes
from tests.support.family_helpers import offline  # noqa: F401 - an autouse fixture: no network
from tests.support.quantized_files import UNET_LAYER, flux_gguf, sd1_file

# The types the gguf package also encodes; the others are decoded from random blocks.
ENCODED = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@pytest.mark.parametrize("type_name", sorted(_gguf_decoders()))
def test_every_gguf_type_kept_as_stored_reads_as_the_gguf_packages_decoding(type_name):
    kind = GGMLQuantizationType[type_name]
    block, block_bytes = GGML_QUANT_SIZES[kind]
    rows, width = 6, 2 * block if block > 1 else 64
    if type_name in ENCODED:
        values = np.random.default_rng(1).standard_normal((rows, width)).astype(np.float32)
        raw = quantize(values, kind)
    else:  # random blocks: their scales are any fp16 values, NaN and Inf included
        raw = np.random.default_rng(1).integers(0, 256, (rows, width // block * block_bytes))
        raw = raw.astype(np.uint8)
    with np.errstate(all="ignore"):
        expected = torch.from_numpy(dequantize(raw, kind)).to(torch.bfloat16)

    weight = from_gguf(torch.from_numpy(raw.copy()).reshape(-1), type_name, (rows, width))

    assert gguf_decodable(type_name) and weight.dtype == torch.bfloat16
    assert weight.packed.numel() == raw.size  # the file's bytes, nothing decoded held
    got = weight.decoded()
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())


def test_the_types_kept_as_stored_are_those_diffusers_decodes_in_torch():
    # The report says which types were dequantised when loaded from this list, without torch.
    assert set(_gguf_decoders()) == TORCH_DECODED_GGUF
    stored = quantized.summary([quantized.Quantization("gguf", ["F32", "IQ2_XS", "Q4_K"], "x")])
    assert stored is not None and stored.dequantized_on_load == ("IQ2_XS",)


def test_a_gguf_transformer_keeps_its_blocks_as_stored_and_reads_as_their_values(tmp_path):
    _, _, path = flux_gguf(tmp_path, GGMLQuantizationType.Q4_0)

    transformer = models.load_model(str(path)).pipeline.transformer

    stored = {n: p for n, p in transformer.named_parameters() if isinstance(p, StoredTensor)}
    assert "transformer_blocks.0.attn.to_q.weight" in stored  # split from the fused qkv rows
    assert {p.codec for p in stored.values()} == {"Q4_0"}
    # What a weight means is what the gguf package decodes from the file, put in diffusers'
    # layout by plain tensor operations (the rows split and swapped on decoded values).
    reader = GGUFReader(path)
    decoded = {
        t.name: torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
        .reshape(tuple(reversed([int(d) for d in t.shape])))
        .to(torch.bfloat16)
        for t in reader.tensors
    }
    model = split.read_model({k: tuple(v.shape) for k, v in decoded.items()}, path.name)
    expected = {k: tuple(v.shape) for k, v in transformer.state_dict().items()}
    meant = layouts.to_diffusers(model.rows(), decoded, expected, model.prefix)
    state = transformer.state_dict()
    for key, value in meant.items():
        got = state[key]
        got = got.decoded() if isinstance(got, StoredTensor) else got
        assert torch.equal(got, value), key
    # Held as stored: Q4_0 is 4.5 bits a weight, bf16 would be 16.
    stored_values = sum(p.numel() for p in stored.values())
    assert tensor_bytes(transformer) < 0.4 * sum(p.numel() * 2 for p in transformer.parameters())
    assert sum(p.packed.numel() for p in stored.values()) == stored_values * 18 // 32


# The tiny Q8_0 transformer holds 0.35 MiB as stored, 1.3 MiB in fp32.
@pytest.mark.parametrize(
    "budget_mb", [None, 0.5, 0.001], ids=["resident", "under-a-budget", "streamed"]
)
def test_a_stored_transformer_placed_in_any_precision_holds_its_stored_bytes_and_computes_as_a_copy(
    tmp_path, budget_mb
):
    _, _, path = flux_gguf(tmp_path, GGMLQuantizationType.Q8_0)
    transformer = models.load_model(str(path)).pipeline.transformer
    source = SimpleNamespace(transformer=transformer)
    # The same values as plain tensors, as loading made them before.
    plain = models.load_model(str(path)).pipeline.transformer
    for module in plain.modules():
        for name, tensor in list(module.named_parameters(recurse=False)):
            if isinstance(tensor, StoredTensor):
                setattr(module, name, torch.nn.Parameter(tensor.decoded(), requires_grad=False))
    config = transformer.config
    generator = torch.Generator().manual_seed(0)
    inputs = {
        "hidden_states": torch.randn(1, 16, config.in_channels, generator=generator),
        "encoder_hidden_states": torch.randn(1, 8, config.joint_attention_dim, generator=generator),
        "pooled_projections": torch.randn(1, config.pooled_projection_dim, generator=generator),
        "timestep": torch.tensor([0.5]),
        "guidance": torch.tensor([3.5]),
        "img_ids": torch.zeros(16, 3),
        "txt_ids": torch.zeros(8, 3),
    }
    island = "transformer_blocks.0.ff.net.2"
    for dtypes, islands in (("fp32", {}), ("fp16", {island: "fp32"}), ("bf16", {})):
        plan = PrecisionPlan(
            device="cpu", dtypes={"transformer": dtypes}, memory_budget_mb=budget_mb
        )
        plan = plan.with_modules("transformer", islands) if islands else plan
        with torch.inference_mode():  # as a job places its stages
            placed = PlacedPipeline(source, plan)
            # The plain values placed resident: what every placement must compute.
            resident = dataclasses.replace(plan, memory_budget_mb=None)
            wide = PlacedPipeline(SimpleNamespace(transformer=plain), resident)
        module = placed["transformer"]

        # The stored bytes are shared with the loaded model, whatever the dtype: a copy costs
        # only the plain tensors (norms, biases) it holds in that dtype.
        weight = module.transformer_blocks[0].ff.net[2].weight
        assert isinstance(weight, StoredTensor)
        if budget_mb is None:  # under the budget, fp32 computes from the bf16 it places
            assert weight.dtype == DTYPES[islands.get(island, dtypes)]
        if budget_mb == 0.001:  # streamed: a placeholder until its block runs
            assert weight.packed.device.type == "meta"
            assert placed.streamed["transformer"].blocks == 6  # 2 double + 4 single blocks
        else:
            assert weight.packed.data_ptr() == plain_data_ptr(transformer, island)
        extra = tensor_bytes(module, shared_with=transformer)
        assert extra <= tensor_bytes(wide["transformer"], shared_with=plain) / 3
        with torch.inference_mode():
            got = module(**inputs).sample
            want = wide["transformer"](**inputs).sample
        assert torch.equal(got, want), dtypes
        placed.release()
        wide.release()


def plain_data_ptr(transformer, layer: str) -> int:
    return transformer.get_submodule(layer).weight.packed.data_ptr()


def test_fp8_weights_stay_fp8_with_their_scale(tmp_path):
    path, stored, exact, _ = sd1_file(tmp_path)

    unet = models.load_model(str(path)).pipeline.unet

    weight = unet.get_submodule("down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q").weight
    assert isinstance(weight, StoredTensor) and weight.packed.dtype == torch.float8_e4m3fn
    assert weight.scale is not None and weight.scale.numel() == 1
    assert tensor_bytes(unet) < 0.6 * sum(p.numel() * 2 for p in unet.parameters())
    # A weight reshaped on the way into diffusers' layout (a 1x1 convolution read as a linear
    # layer) holds its decoded values: the same numbers.
    proj_in = unet.down_blocks[0].attentions[0].proj_in.weight
    assert torch.allclose(
        proj_in.reshape(-1).float(), exact[UNET_LAYER].reshape(-1), rtol=2**-8, atol=1e-12
    )


def test_a_stored_weight_cannot_be_changed_in_place_and_slices_stay_stored():
    values = torch.randn(8, 32)
    scale = values.abs().amax(1) / 448
    weight = from_fp8((values / scale[:, None]).to(torch.float8_e4m3fn), scale)

    with pytest.raises(TypeError, match="cannot be changed in place"):
        weight.add_(1)
    with pytest.raises(TypeError, match="cannot be changed in place"):
        torch.nn.Parameter(weight, requires_grad=False).data.copy_(values)

    top, bottom = torch.split(weight, [3, 5])
    swapped = torch.cat([bottom, top])
    assert isinstance(swapped, StoredTensor) and swapped.scale is not None
    assert swapped.scale.numel() == 8
    assert torch.equal(swapped.decoded(), torch.cat([weight.decoded()[3:], weight.decoded()[:3]]))
    assert torch.equal((weight * 2), weight.decoded() * 2)  # any other operation: the values
    wide = weight.to(torch.float32)
    assert isinstance(wide, StoredTensor) and wide.packed is weight.packed
    with torch.inference_mode():  # where `.to()` reaches the tensor whole
        assert isinstance(weight.to(torch.float16), StoredTensor)
        assert isinstance(torch.nn.Parameter(weight.to("cpu"), requires_grad=False), StoredTensor)
    assert "fp8" in repr(weight) and "computes in float32" in repr(wide)


def test_swapping_a_stored_weights_dtype_for_a_forward_decodes_nothing(monkeypatch):
    # How a layer computing wider than it stores swaps its weight (`tensor.data = ...`): torch
    # asks whether the two are shallow-copy compatible, which decoded both (twice the decoding
    # of every layer a budget made compute wider or stream).
    from app.core.checkpoint import stored

    values = torch.randn(8, 32)
    scale = values.abs().amax(1) / 448
    weight = from_fp8((values / scale[:, None]).to(torch.float8_e4m3fn), scale)
    parameter = torch.nn.Parameter(weight, requires_grad=False)
    decoded = []
    real = stored._decode
    monkeypatch.setattr(stored, "_decode", lambda *a: decoded.append(1) or real(*a))

    with torch.inference_mode():
        kept = parameter.data
        parameter.data = parameter.data.to(torch.float32)
        assert parameter.dtype == torch.float32
        parameter.data = kept
    assert decoded == [] and parameter.dtype == weight.dtype


def test_a_gguf_tensor_kept_as_stored_is_a_view_of_the_files_map_not_a_copy(tmp_path):
    """A copy held each tensor's bytes twice while a model loaded (the copy and the map's
    pages): the blocks are the file's own bytes, read twice the same memory."""
    from app.core.checkpoint import Checkpoint

    _, _, path = flux_gguf(tmp_path, GGMLQuantizationType.Q4_0)
    with Checkpoint(path) as checkpoint:
        name = next(n for n, t in checkpoint._gguf.types.items() if t == "Q4_0")
        first, second = checkpoint.get(name), checkpoint.get(name)
    assert isinstance(first, StoredTensor) and isinstance(second, StoredTensor)
    assert first.packed.data_ptr() == second.packed.data_ptr()
    written = np.fromfile(path, dtype=np.uint8)
    info = checkpoint._gguf.infos[name]
    expected = written[info.start : info.start + info.nbytes]
    assert np.array_equal(first.packed.reshape(-1).numpy(), expected)
