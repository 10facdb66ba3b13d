"""A step's cost predicted from its work: the operations each module runs, counted on fake
tensors, split by the dtype each computes in under a plan, priced with the device's dtype table
(measured once, cached beside the self-test). Counts and an injected table, never a timing."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from app.core import hardware
from app.core.hardware import dtype_speed, selftest_cache
from app.core.health.step_work import (
    module_flops,
    plan_flops,
    plan_seconds,
    plan_work,
    predicted_ms,
)
from tests.support.tiny_models import build_tiny_sd_pipeline

LAYER = "down_blocks.0.resnets.0.conv1"
# A device whose fp32 runs at half its fp16 rate, and bf16 at fp16's (as an Ampere GPU's).
SPEED = dtype_speed.DtypeSpeed(
    "test",
    {
        "fp16": {"matmul": 100.0, "conv": 100.0},
        "bf16": {"matmul": 100.0, "conv": 100.0},
        "fp32": {"matmul": 50.0, "conv": 50.0},
    },
)


@pytest.fixture(scope="module")
def unet_flops():
    unet = build_tiny_sd_pipeline().unet
    channels, context = unet.config.in_channels, unet.config.cross_attention_dim

    def call(module):
        return module(
            torch.randn(2, channels, 8, 8), torch.tensor(500.0), torch.randn(2, 77, context)
        )

    return unet, module_flops(unet, call)


def test_the_work_of_a_call_is_counted_per_module_without_running_it(unet_flops):
    unet, flops = unet_flops
    conv = unet.get_submodule(LAYER)
    # A 3x3 convolution on the CFG batch at the latent's 8x8: 2 * N * Cout * Cin * 9 * H * W.
    expected = 2 * 2 * conv.out_channels * conv.in_channels * 9 * 8 * 8
    weights = float(conv.weight.numel())
    assert flops[LAYER] == {"matmul": 0.0, "conv": float(expected), "conv_weights": weights}
    assert flops[""]["conv"] > flops[LAYER]["conv"] and flops[""]["matmul"] > 0
    # The weights of every linear and convolution layer, counted in each module that holds it.
    block = LAYER.rsplit(".", 1)[0]
    layers = [m for m in unet.get_submodule(block).modules() if isinstance(m, torch.nn.Conv2d)]
    assert flops[block]["conv_weights"] == sum(m.weight.numel() for m in layers)
    linear = sum(m.weight.numel() for m in unet.modules() if isinstance(m, torch.nn.Linear))
    assert flops[""]["matmul_weights"] == linear
    assert all(p.device.type == "cpu" and not p.is_meta for p in unet.parameters())


def test_the_work_is_split_by_the_dtype_each_layer_computes_in(unet_flops):
    _, flops = unet_flops
    whole = flops[""]
    islands = {LAYER: "fp32", LAYER.rsplit(".", 1)[0]: "fp32", LAYER + ".x": "bf16"}
    split = plan_flops(flops, "fp16", islands)
    block = flops[LAYER.rsplit(".", 1)[0]]  # the resnet holding the layer: the outer island
    assert split[("fp32", "conv")] == block["conv"]
    assert split[("fp16", "conv")] == whole["conv"] - block["conv"]
    assert split[("fp32", "conv_weights")] == block["conv_weights"]
    assert sum(v for (_, k), v in split.items() if k in ("matmul", "conv")) == pytest.approx(
        whole["matmul"] + whole["conv"]
    )


def test_a_part_computed_from_weights_stored_narrower_casts_them_each_call(unet_flops):
    """A bf16 plan of a part stored in fp16 on a CPU (a copy of the same width is not made) or
    a check's plan computing from the stored weights: each layer's weights are cast at every
    call; a copy in the plan's dtype casts none, and the layers already in the stored dtype
    none either."""
    _, flops = unet_flops
    whole = flops[""]
    weights = whole["matmul_weights"] + whole["conv_weights"]
    cast = plan_work(flops, "bf16", {}, cast_from="fp16")
    assert cast[("bf16", "cast")] == weights
    assert ("bf16", "cast") not in plan_work(flops, "bf16", {})
    islands = plan_work(flops, "fp16", {LAYER: "fp32"}, cast_from="fp16")
    assert islands[("fp32", "cast")] == flops[LAYER]["conv_weights"]
    assert ("fp16", "cast") not in islands


def test_a_plan_is_priced_as_it_is_placed(unet_flops):
    """`plan_seconds` reads how the plan places the part: a bf16 plan of the fp16-stored part
    computes from the stored weights (the same width: no copy), so it pays their cast; in fp16
    it pays none."""
    from app.core.precision import resolve_plan
    from app.core.settings import PrecisionSettings

    pipeline = build_tiny_sd_pipeline().to(torch.float16)
    _, flops = unet_flops
    rates = {"matmul": 1.0, "conv": 1.0, "matmul_weights": 1.0, "conv_weights": 1.0}
    speed = dtype_speed.DtypeSpeed(
        "test", {"fp16": rates, "bf16": {**rates, "cast": 1.0}, "fp32": rates}
    )

    def seconds(precision: str) -> float:
        plan = resolve_plan(
            PrecisionSettings(precision=precision), device="cpu", components=["unet"]
        )
        value = plan_seconds(speed, flops, pipeline, plan, "unet")
        assert value is not None
        return value

    whole = flops[""]
    weights = whole["matmul_weights"] + whole["conv_weights"]
    assert seconds("bf16") - seconds("fp16") == pytest.approx(weights / 1e9)


def test_a_plan_is_priced_from_a_measured_call_at_the_devices_rates(unet_flops):
    _, flops = unet_flops
    fp16 = plan_flops(flops, "fp16", {})
    # The whole part in fp32 at half the rate: twice the measured fp16 call.
    assert predicted_ms(SPEED, 60.0, fp16, plan_flops(flops, "fp32", {})) == pytest.approx(120.0)
    # A bf16 copy runs at the bf16 rate: what fp16 takes here.
    assert predicted_ms(SPEED, 60.0, fp16, plan_flops(flops, "bf16", {})) == pytest.approx(60.0)
    # One layer in fp32: fp16's time and that layer's share of the work once more.
    one = predicted_ms(SPEED, 60.0, fp16, plan_flops(flops, "fp16", {LAYER: "fp32"}))
    share = flops[LAYER]["conv"] / (flops[""]["conv"] + flops[""]["matmul"])
    assert one == pytest.approx(60.0 * (1 + share))
    # A dtype the device has no rate for is not guessed.
    missing = dataclasses.replace(SPEED, gflops={"fp16": SPEED.gflops["fp16"]})
    assert predicted_ms(missing, 60.0, fp16, plan_flops(flops, "fp32", {})) is None


def test_the_dtype_table_is_measured_once_and_cached_beside_the_self_test(monkeypatch):
    device = hardware.describe_device(torch.device("cpu"))
    device = dataclasses.replace(device, name="cached-speed-test", bf16="unsupported")
    measured: list[list[str]] = []
    real = dtype_speed.measure

    def counting(torch_device, key, dtypes=dtype_speed.DTYPES, repeats=3):
        measured.append(list(dtypes))
        return real(torch_device, key, ["fp32"], repeats=1)

    monkeypatch.setattr(dtype_speed, "measure", counting)
    first = selftest_cache.dtype_speed(device, torch.device("cpu"))
    again = selftest_cache.dtype_speed(device, torch.device("cpu"))
    assert measured == [["fp16", "fp32"]]  # once; bf16 is not supported on it
    assert again == first and first.gflops["fp32"]["matmul"] > 0
    path = dtype_speed.cache_path(selftest_cache.self_test_key(device))
    assert path.parent.name == "selftest"
    path.write_text("{not json", encoding="utf-8")  # damaged: measured again, not trusted
    selftest_cache.dtype_speed(device, torch.device("cpu"))
    assert len(measured) == 2


def test_the_table_tells_the_arithmetic_from_the_weights():
    """Two shapes of a kernel, one bound by its arithmetic and one by its weights, give both
    rates; where the weights cannot explain the second, the arithmetic's rate stands alone."""
    # 1 GFLOP/s and 0.5 G weights/s: 2 GFLOP and 1e6 weights, then 0.1 GFLOP and 1e8 weights.
    work, weights = (2e9, 1e8), (1e6, 1e8)
    seconds = (2 + 1e6 / 0.5e9, 0.1 + 1e8 / 0.5e9)
    flops_rate, weight_rate = dtype_speed._fit(work, weights, seconds)
    assert flops_rate == pytest.approx(1.0) and weight_rate == pytest.approx(0.5)
    assert dtype_speed._fit(work, weights, (2.0, 0.05)) == (pytest.approx(1.0), None)


def test_a_rate_the_table_could_not_tell_counts_no_time():
    speed = dataclasses.replace(SPEED, gflops={"fp16": {"matmul": 1.0, "conv": 1.0}})
    assert speed.seconds({("fp16", "conv"): 1e9, ("fp16", "conv_weights"): 5.0}) == 1.0
    assert speed.seconds({("fp32", "cast"): 5.0}) is None  # fp32 was not measured at all


def test_a_desktop_check_process_reads_the_fixed_table_instead_of_measuring(tmp_path):
    """The desktop checks the ComfyUI tests run as processes predict from one fixed table
    (`desktop_check.CPU_TABLE`), written where such a process looks for its cached one: it
    reads that table and measures none, whatever this machine's speeds are."""
    import json
    import subprocess
    import sys

    from tests.support.desktop_check import CPU_TABLE, ROOT, environment

    code = (
        "import json, torch; from app.core import hardware; "
        "from app.core.hardware.selftest_cache import dtype_speed; "
        "print(json.dumps(dtype_speed(hardware.describe_device(torch.device('cpu')), "
        "torch.device('cpu')).to_json()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(tmp_path),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = json.loads(done.stdout.strip().splitlines()[-1])
    assert table == {"gflops": CPU_TABLE, "seconds_measuring": 0.0}
