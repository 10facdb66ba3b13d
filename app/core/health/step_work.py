"""The work one call of a part does, and what it costs under a plan: its matmul and convolution
floating-point operations per module, counted once on fake tensors (shapes only, nothing
computed: `module_flops`), split by the dtype each module computes in under a plan (its
island's, else its part's: `plan_flops`), and priced with the device's dtype table
(`hardware.dtype_speed`) against a call measured under another plan (`predicted_ms`).

A fix's cost can so be predicted instead of timed: a plan that keeps two UNet layers in fp32
differs from fp16 by those layers' work at fp32's rate; a bf16 copy runs at the device's bf16
rate, not at the rate of the check's layer-by-layer casts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# aten operators counted, by the kind of kernel the dtype table measures.
_KIND_OF = {"convolution": "conv"}


def module_flops(module, call: Callable[[Any], Any]) -> dict[str, dict[str, float]]:
    """Per module path of `module` ("" for the whole), the operations `call(module)` runs in it,
    {"matmul": n, "conv": n}, counted on fake tensors: `call` builds its inputs with torch's
    factory functions (`torch.randn(...)`), which make fake ones inside, and nothing runs on a
    device. The weights are read as they are (their shapes only)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    with FakeTensorMode(allow_non_fake_inputs=True), FlopCounterMode(display=False) as counter:
        call(module)
    found: dict[str, dict[str, float]] = {}
    for name, by_op in counter.get_flop_counts().items():
        if name == "Global":
            continue
        path = name.partition(".")[2]  # "UNet2DConditionModel.down_blocks.0" -> "down_blocks.0"
        kinds = found.setdefault(path, {"matmul": 0.0, "conv": 0.0})
        for op, count in by_op.items():
            kinds[_KIND_OF.get(str(op).rpartition(".")[2], "matmul")] += float(count)
    return found


def plan_flops(
    flops: Mapping[str, Mapping[str, float]], dtype: str, islands: Mapping[str, str]
) -> dict[tuple[str, str], float]:
    """The work of `flops` (`module_flops`) by (dtype, kind) where the part computes in `dtype`
    and its `islands` (module path -> dtype) in theirs (an island inside another counts in the
    outer one)."""
    whole = flops.get("", {"matmul": 0.0, "conv": 0.0})
    outer = [p for p in islands if not any(p.startswith(o + ".") for o in islands)]
    split: dict[tuple[str, str], float] = {}
    rest = dict(whole)
    for path in outer:
        for kind, count in flops.get(path, {}).items():
            key = (islands[path], kind)
            split[key] = split.get(key, 0.0) + count
            rest[kind] = rest.get(kind, 0.0) - count
    for kind, count in rest.items():
        split[(dtype, kind)] = split.get((dtype, kind), 0.0) + max(count, 0.0)
    return split


def predicted_ms(
    speed, measured_ms: float, measured: Mapping[tuple[str, str], float], planned
) -> float | None:
    """One call under a plan doing the work `planned`, from a call measured at `measured_ms`
    doing `measured` ((dtype, kind) -> operations, `plan_flops`): the measured time scaled by
    the two works' times at the device's rates (`speed`, a `DtypeSpeed`), so what the table
    does not hold (memory traffic, kernel launches, the ops between) scales with them. None
    where a dtype of either was not measured on the device."""
    then, now = speed.seconds(measured), speed.seconds(planned)
    if then is None or now is None or then <= 0:
        return None
    return measured_ms * now / then
