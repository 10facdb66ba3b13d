"""The work one call of a part does, and what it costs under a plan: its matmul and convolution
floating-point operations and the weights its layers read, per module, counted once on fake
tensors (shapes only, nothing computed: `module_flops`, `call_flops` from a call caught in a run:
`first_call`), split by the dtype each module computes in under a plan (its island's, else its
part's), with the cast of weights stored in another dtype where the part computes from them
(`plan_work`), and priced at the device's dtype table (`hardware.dtype_speed`) as the plan
places the part (`plan_seconds`), or scaled from a call measured under another plan
(`predicted_ms`).

The fix search ranks candidates by these predictions, untimed, where they are apart by more
than the ranking's band and their measured error (`PREDICTION_ERROR`, `EXPLAINED`;
`health.fix.CandidateTable.needing_time`): a plan that keeps two UNet layers in fp32 differs
from fp16 by those layers' work at fp32's rates; a bf16 part computed from fp16 weights pays
their cast at every call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# aten operators counted, by the kind of kernel the dtype table measures.
_KIND_OF = {"convolution": "conv"}
# The relative error of a prediction's ratio of two plans' steps beside their timed ratio, per
# device kind, as measured (docs/benchmarks.md, "Predicted before timed"): the largest over
# the plans of SD1.5's UNet at 64 px on the 2-core Xeon VM, four runs (58%: the part in fp32
# computed from its fp16 weights; 31% among the plans alike in memory), rounded up. A kind not
# measured has its candidates timed, never predicted.
PREDICTION_ERROR = {"cpu": 0.6}
# A prediction stands for a call only where its work takes at least this share of the time
# the call took in the candidate's own verification run: a small model's call is mostly what
# the table does not hold (the operations between the kernels, each call's fixed cost), and
# there the prediction's ratio was 1.8 to 3.3 times the timed one (the tests' tiny UNet).
EXPLAINED = 0.5


def device_speed(device) -> Any:
    """The dtype table (`hardware.dtype_speed.DtypeSpeed`) of the torch `device` where its
    predictions are used (a kind with a measured `PREDICTION_ERROR`), measured once and cached
    beside its self-test; None elsewhere."""
    if device.type not in PREDICTION_ERROR:
        return None
    from app.core import hardware
    from app.core.hardware.selftest_cache import dtype_speed

    return dtype_speed(hardware.describe_device(device), device)


@dataclass
class Caught:
    """The calls of a module class made inside `first_call`: how many, and the first one's
    arguments."""

    calls: int = 0
    module: Any = None  # the copy that made the first call
    args: tuple[Any, ...] | None = None
    kwargs: dict[str, Any] | None = None


@contextmanager
def first_call(kind: type) -> Iterator[Caught]:
    """Inside the block, every forward call of a module of class `kind` is counted and the
    first one's arguments kept (`Caught`), whichever copy of the part runs it."""
    from app.core.hooks import Hooks

    caught = Caught()

    def seen(module, args, kwargs, output) -> None:
        if type(module) is kind:
            caught.calls += 1
            if caught.args is None:
                caught.module, caught.args, caught.kwargs = module, args, dict(kwargs)

    with Hooks() as hooks:
        hooks.after_any(seen)
        yield caught


def call_flops(part, counted, caught: Caught) -> dict[str, dict[str, float]] | None:
    """`module_flops` of the call `caught` (made by a copy of `counted`: the part `part` itself,
    or the decoder a VAE's stage calls) run again on fake tensors by the copy that made it,
    keyed by module path in `part` ("" for the whole call); None where nothing was caught or
    the call cannot run on fake tensors."""
    if caught.args is None or caught.module is None:
        return None
    prefix = next((p for p, m in part.named_modules() if m is counted), None)
    if prefix is None:
        return None
    args, kwargs = caught.args, caught.kwargs or {}
    try:
        flops = module_flops(caught.module, lambda m: m(*args, **kwargs))
    except Exception:  # noqa: BLE001 - a call fake tensors cannot run is timed instead
        return None
    if not prefix:
        return flops
    return {(f"{prefix}.{p}" if p else ""): kinds for p, kinds in flops.items()}


def module_flops(module, call: Callable[[Any], Any]) -> dict[str, dict[str, float]]:
    """Per module path of `module` ("" for the whole), the operations `call(module)` runs in it,
    {"matmul": n, "conv": n}, and the weights its linear and convolution layers hold
    ("matmul_weights", "conv_weights": elements, each read once a call), counted on fake
    tensors: `call` builds its inputs with torch's factory functions (`torch.randn(...)`), or
    passes real ones, which are made fake inside, and nothing runs on a device. The weights are
    read as they are (their shapes only)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    with FakeTensorMode(allow_non_fake_inputs=True), FlopCounterMode(display=False) as counter:
        call(module)
    found: dict[str, dict[str, float]] = {}
    for path, leaf in module.named_modules():
        kind = _weighted_kind(leaf)
        if kind is None:
            continue
        parts = path.split(".") if path else []
        for depth in range(len(parts) + 1):  # the layer and every module holding it
            kinds = found.setdefault(".".join(parts[:depth]), {"matmul": 0.0, "conv": 0.0})
            key = f"{kind}_weights"
            kinds[key] = kinds.get(key, 0.0) + float(leaf.weight.numel())
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


def _weighted_kind(layer) -> str | None:
    """The kind of kernel a layer with weights runs ("matmul" for a linear one, "conv"), None
    for any other."""
    import torch

    if not isinstance(getattr(layer, "weight", None), torch.Tensor):
        return None
    if isinstance(layer, torch.nn.modules.conv._ConvNd):
        return "conv"
    return "matmul" if isinstance(layer, torch.nn.Linear) else None


def plan_work(
    flops: Mapping[str, Mapping[str, float]],
    dtype: str,
    islands: Mapping[str, str],
    cast_from: str | None = None,
) -> dict[tuple[str, str], float]:
    """`plan_flops`, and where the part computes from weights stored in `cast_from` (a check's
    plan, or a CPU's part of another dtype of the same width), the weights of every layer
    computing in another dtype cast to it at each call: (dtype, "cast") -> elements."""
    split = plan_flops(flops, dtype, islands)
    if cast_from is None:
        return split
    for (wide, kind), count in list(split.items()):
        if kind.endswith("_weights") and wide != cast_from and count:
            split[(wide, "cast")] = split.get((wide, "cast"), 0.0) + count
    return split


def plan_seconds(speed, flops: Mapping[str, Mapping[str, float]], pipeline, plan, name: str):
    """What one call of the component `name` (a module of `pipeline`) doing the work `flops`
    (`module_flops`) takes under `plan` at the device's rates (`speed`, a `DtypeSpeed`), placed
    as `plan` places it (`placement.memory_plan`: computing from its stored weights, or a copy);
    None where a dtype it computes in was not measured. The work alone: what the table does not
    hold (the operations between the kernels, a call's fixed cost) is left out."""
    from app.core.precision.placement import memory_plan
    from app.core.precision.plan import dtype_name

    part = next((p for p in memory_plan(pipeline, plan) if p.component == name), None)
    if part is None:
        return None
    cast_from = part.stored_dtype
    if cast_from is None and (plan.compute_in_place or plan.reference):
        cast_from = dtype_name(next(getattr(pipeline, name).parameters()).dtype)
    return speed.seconds(plan_work(flops, plan.dtypes[name], plan.islands(name), cast_from))


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
