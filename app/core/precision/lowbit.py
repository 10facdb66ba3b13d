"""comfy-kitchen's low-bit kernels against the decoded reference, backend by backend and shape
by shape, on the user's own device.

The tools that run int8 and int4 models (ComfyUI, Forge Neo) compute their Linear layers with
comfy-kitchen's kernels (`precision.fused` says how its registry picks a backend); HalfSafe
computes with PyTorch's own kernels on decoded weights, so a kernel that fails on the user's
card for some shapes (tiles of noise, an error for M between two tile sizes) never shows in its
own runs. Here each usable backend runs, at every shape asked for:
- `int8_linear`: the int8 GEMM (activations quantised per row on the fly, weight int8 with one
  scale), on inputs the per-row quantisation keeps exactly (integers times a power of two), so
  the reference, both operands decoded and multiplied in fp32, differs only by the output's
  rounding;
- `dequantize_int8_simple_dtype`: the int8 decode of the weight, against `q * scale`;
- `w4a8_int8_linear`: the int4 GEMM (4-bit grouped weights, int8 activations, ConvRot), where a
  backend has it and K is a multiple of its rotation group, against the weight decoded by the
  eager backend's portable reading of the same storage, multiplied in fp32.
Each call is `right`, `wrong` (the error, relative to the reference's largest magnitude, past
the op's tolerance, or NaN/Inf), `refused` (it raised: the message is kept) or `slow` (right,
but far slower than the same layer in bf16: timed with CUDA events, on a CUDA device only).
A call a backend's declared constraints turn away (the cuda backend's int8 GEMM below compute
capability 7.5, say) is not judged: the registry sends it to the next backend; it is counted.

`generic_shapes` is the self-test's set (an M range around the 96/128 tile boundary);
`linear_shapes` lists a module tree's Linear layers at the M values a job gives
(`job_ms`). Both are deduplicated and bounded. Importing this module imports nothing heavy;
comparing imports torch and comfy_kitchen.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.precision import fused

INT8_GEMM = "int8_linear"
INT8_DECODE = "dequantize_int8_simple_dtype"
INT4_GEMM = "w4a8_int8_linear"
OPS = (INT8_GEMM, INT8_DECODE, INT4_GEMM)
GEMMS = (INT8_GEMM, INT4_GEMM)
STATUSES = ("right", "wrong", "refused", "slow")
# Largest error allowed relative to the reference's largest magnitude. The int8 GEMM's inputs
# are exact, so only the bf16 output's rounding (2^-8) remains; the int4 GEMM rotates and
# re-quantises its activations (about 1% here); a decode is exact.
TOLERANCE = {INT8_GEMM: 2e-2, INT8_DECODE: 1e-3, INT4_GEMM: 6e-2}
# "Far slower than bf16": this many times the bf16 layer's time, and at least this much more.
SLOW_FACTOR = 4.0
SLOW_MARGIN_MS = 0.1
INT4_ROTATION = 256  # the int4 GEMM's ConvRot group: K must be a multiple of it
# The self-test's shapes: M around the tiles of 96 and 128 rows (a kernel that refuses or
# miscomputes M = 97..127 while 96 and 128 pass), one token, and an image's worth.
GENERIC_MS = (1, 64, 96, 97, 112, 127, 128, 129, 256)
GENERIC_KN_GPU = ((3072, 3072), (3072, 12288))
GENERIC_KN_CPU = ((256, 256),)
GENERIC_MS_CPU = (1, 96, 97, 127, 128)
MAX_LAYER_SHAPES = 24  # distinct (K, N) of a model's Linear layers compared
MAX_MS = 4  # distinct M values a model's layers are compared at
# On a CPU a model's shapes are run up to this many int8 multiply-adds per backend (the eager
# backend's int8 GEMM ran at 0.4e9 to 3.4e9 a second, small M to large, on a busy two-core
# machine: seconds); the rest are counted as left out.
CPU_MACS = 1.5e10
# The ops a model stored int8 runs (its tools never run the int4 GEMM on it).
INT8_OPS = (INT8_GEMM, INT8_DECODE)


@dataclass(frozen=True)
class Shape:
    """One GEMM: x (m, k) times the weight's transpose, the weight (n, k)."""

    m: int
    k: int
    n: int


@dataclass(frozen=True)
class LowBitCall:
    """One op of one backend at one shape (a decode's `m` is 0: it has no activations).

    `error` is the largest difference from the reference over the reference's largest
    magnitude (inf where the output held NaN or Inf; None when refused). `ms` and `bf16_ms`
    are the timed milliseconds (None where not timed)."""

    backend: str
    op: str
    m: int
    k: int
    n: int
    status: str
    error: float | None = None
    tolerance: float | None = None
    message: str = ""
    ms: float | None = None
    bf16_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "op": self.op,
            "m": self.m,
            "k": self.k,
            "n": self.n,
            "status": self.status,
            "error": None if self.error is None or math.isinf(self.error) else self.error,
            "non_finite": self.error is not None and math.isinf(self.error),
            "tolerance": self.tolerance,
            "message": self.message,
            "ms": self.ms,
            "bf16_ms": self.bf16_ms,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LowBitCall:
        error = data.get("error")
        return cls(
            backend=str(data["backend"]),
            op=str(data["op"]),
            m=int(data["m"]),
            k=int(data["k"]),
            n=int(data["n"]),
            status=str(data["status"]),
            error=math.inf if data.get("non_finite") else None if error is None else float(error),
            tolerance=None if data.get("tolerance") is None else float(data["tolerance"]),
            message=str(data.get("message", "")),
            ms=None if data.get("ms") is None else float(data["ms"]),
            bf16_ms=None if data.get("bf16_ms") is None else float(data["bf16_ms"]),
        )


@dataclass
class LowBitReport:
    """Every call of the comparison: which comfy-kitchen ran, on which device, in which dtype,
    with which shapes ("generic": the self-test's; "model": a model's layers), and whether the
    calls were timed. `declined` counts per backend the calls its declared constraints turn
    away (compute capability, device, dtypes): the registry sends those to the next backend,
    so they are not judged."""

    version: str
    device: str
    dtype: str
    shapes_from: str
    timed: bool
    backends: list[str] = field(default_factory=list)
    calls: list[LowBitCall] = field(default_factory=list)
    declined: dict[str, int] = field(default_factory=dict)
    left_out: int = 0  # shapes not run for the work bound (`within`)

    @property
    def faults(self) -> list[LowBitCall]:
        return [c for c in self.calls if c.status != "right"]

    def calls_per_backend(self) -> dict[str, int]:
        counts = dict.fromkeys(self.backends, 0)
        for call in self.calls:
            counts[call.backend] = counts.get(call.backend, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "comfy_kitchen": self.version,
            "device": self.device,
            "dtype": self.dtype,
            "shapes_from": self.shapes_from,
            "timed": self.timed,
            "backends": list(self.backends),
            "calls_per_backend": self.calls_per_backend(),
            "declined": dict(self.declined),
            "left_out": self.left_out,
            "calls": [c.to_json() for c in self.calls],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LowBitReport:
        return cls(
            version=str(data.get("comfy_kitchen", "")),
            device=str(data.get("device", "")),
            dtype=str(data.get("dtype", "bf16")),
            shapes_from=str(data.get("shapes_from", "generic")),
            timed=bool(data.get("timed", False)),
            backends=[str(b) for b in data.get("backends", [])],
            calls=[LowBitCall.from_json(c) for c in data.get("calls", [])],
            declined={str(b): int(n) for b, n in dict(data.get("declined", {})).items()},
            left_out=int(data.get("left_out", 0)),
        )


def generic_shapes(device_type: str) -> list[Shape]:
    """The self-test's shapes on a device of `device_type` ("cuda", "cpu", ...): a diffusion
    transformer's widths on a GPU, small ones on a CPU, each at an M range around the 96- and
    128-row tiles."""
    gpu = device_type != "cpu"
    kns = GENERIC_KN_GPU if gpu else GENERIC_KN_CPU
    ms = GENERIC_MS if gpu else GENERIC_MS_CPU
    return [Shape(m, k, n) for k, n in kns for m in ms]


def job_ms(tokens: int | Iterable[int], batch: int = 1, cfg: bool = True) -> list[int]:
    """The M values a job's Linear layers run at: each token count (one per resolution of a
    UNet) times the batch, and times two where classifier-free guidance runs the positive and
    negative prompts as one batch (ComfyUI does when memory allows, else one at a time).
    Deduplicated, smallest first, at most `MAX_MS` (the largest token counts kept)."""
    counts = [tokens] if isinstance(tokens, int) else list(tokens)
    found = sorted(
        {t * b for t in counts if t > 0 for b in ({batch, 2 * batch} if cfg else {batch})}
    )
    return found[-MAX_MS:]


def linear_shapes(
    module: Any,
    ms: Sequence[int],
    only: Callable[[Any], bool] | None = None,
    limit: int = MAX_LAYER_SHAPES,
) -> list[Shape]:
    """Every distinct (K, N) of the `torch.nn.Linear` layers in `module` (any module tree), in
    the order they are met, those `only` accepts when given, at most `limit`, each at every M
    of `ms`: at most limit * len(ms) shapes."""
    import torch

    pairs: dict[tuple[int, int], None] = {}
    for layer in module.modules():
        if not isinstance(layer, torch.nn.Linear) or (only is not None and not only(layer)):
            continue
        n, k = layer.weight.shape
        pairs.setdefault((int(k), int(n)), None)
        if len(pairs) >= limit:
            break
    return [Shape(m, k, n) for k, n in pairs for m in dict.fromkeys(ms)]


# The stored codecs the tools run through comfy-kitchen's int8 GEMM: int8 with its scale, and
# int8 ConvRot (its input rotated first, then the same GEMM on the stored rows).
INT8_CODECS = ("int8", "int8_convrot")


def stored_int8(layer: Any) -> bool:
    """Whether a Linear layer's weight is kept as its file stores it in int8 (HalfSafe's
    `StoredTensor` with an int8 codec, plain or ConvRot): a layer the tools run through an int8
    GEMM."""
    return getattr(layer.weight, "codec", None) in INT8_CODECS


def model_report(
    pipeline: Any, size: int, device: str, dtype: str = "bf16", batch: int = 1
) -> LowBitReport | None:
    """The comparison at a model's own shapes: every distinct (K, N) of its denoiser's Linear
    layers stored int8 (`stored_int8`), at the M values a `size` px job of `batch` pictures
    gives (`job_ms`: the image tokens, one per 2x2 latent patch of a transformer, a UNet's
    latent at each of its four resolutions; times the batch, and twice that under CFG). None
    when comfy-kitchen is not installed or no layer is stored int8. Text tokens, which a joint
    transformer block adds to M, are left out. Only the int8 ops run (`INT8_OPS`); on a CPU
    the shapes within `CPU_MACS` (`within`), the rest counted in `left_out`."""
    if fused.installed() is None:
        return None
    transformer = getattr(pipeline, "transformer", None)
    denoiser = transformer if transformer is not None else getattr(pipeline, "unet", None)
    if denoiser is None or not any(
        stored_int8(layer) for layer in denoiser.modules() if hasattr(layer, "weight")
    ):
        return None
    latent = size // int(getattr(pipeline, "vae_scale_factor", 8) or 8)
    tokens = (
        (latent // 2) ** 2 if transformer is not None else [(latent >> i) ** 2 for i in range(4)]
    )
    shapes = linear_shapes(denoiser, job_ms(tokens, batch), stored_int8)
    kept = within(shapes, CPU_MACS) if str(device).startswith("cpu") else shapes
    report = compare(kept, device, dtype, "model", ops=INT8_OPS)
    if report is not None:
        report.left_out = len(shapes) - len(kept)
    return report


def within(shapes: Sequence[Shape], macs: float) -> list[Shape]:
    """Those of `shapes` whose GEMMs (m k n multiply-adds a shape) fit in `macs` together, taken smallest M first (every layer at the job's smallest M
    before any at a larger one), smaller layers first within an M; in the order given."""
    kept, spent = [], 0.0
    for shape in sorted(shapes, key=lambda s: (s.m, s.k * s.n)):
        cost = float(shape.m * shape.k * shape.n)
        if spent + cost > macs:
            continue
        kept.append(shape)
        spent += cost
    return [s for s in shapes if s in kept]


def compare(
    shapes: Sequence[Shape],
    device: str = "cpu",
    dtype: str = "bf16",
    shapes_from: str = "generic",
    timing: bool | None = None,
    ops: Sequence[str] = OPS,
) -> LowBitReport | None:
    """Every op of `ops` (all of `OPS` by default) each usable comfy-kitchen backend offers, at every shape of `shapes`
    (a decode once per distinct (K, N)), on `device`, activations and outputs in `dtype`
    ("bf16" or "fp16"). `timing` (None: on a CUDA device) times each right GEMM against the
    bf16 layer of the same shape. None when comfy-kitchen is not installed. Runs on the calling
    thread; calls per backend: 2 per shape plus 1 per distinct (K, N), at most."""
    version = fused.installed()
    if version is None:
        return None
    import comfy_kitchen
    import torch

    timing = torch.device(device).type == "cuda" if timing is None else timing
    report = LowBitReport(version, str(device), dtype, shapes_from, bool(timing))
    states = comfy_kitchen.list_backends()
    pairs = list(dict.fromkeys((s.k, s.n) for s in shapes))
    for backend in fused.backends():
        offered = [op for op in ops if op in states[backend]["capabilities"]]
        if not offered:
            continue
        report.backends.append(backend)
        for k, n in pairs:
            weights = _Weights(k, n, device, dtype)
            ms = [s.m for s in shapes if (s.k, s.n) == (k, n)]
            for op in offered:
                if op == INT8_DECODE:
                    made = [weights.decode(backend)]
                elif op != INT4_GEMM or k % INT4_ROTATION == 0:
                    made = [weights.gemm(backend, op, m, bool(timing)) for m in ms]
                else:
                    continue
                report.calls += [c for c in made if c is not None]
                turned_away = made.count(None)
                if turned_away:
                    report.declined[backend] = report.declined.get(backend, 0) + turned_away
    return report


class _Weights:
    """One (K, N) weight, int8 and (made on first need) int4, with its decoded reference, on
    `device`; the calls of every backend at that shape share it."""

    def __init__(self, k: int, n: int, device: str, dtype: str) -> None:
        import torch

        self.k, self.n, self.device = k, n, device
        self.dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
        generator = torch.Generator().manual_seed(k * 7919 + n)
        self.generator = generator
        self.q = torch.randint(-127, 128, (n, k), generator=generator, dtype=torch.int8).to(device)
        self.scale = torch.tensor(2.0**-7, device=device)  # a power of two: decoding is exact
        self.decoded = self.q.float() * self.scale
        self._int4: tuple[Any, ...] | None = None

    def decode(self, backend: str) -> LowBitCall | None:
        import torch

        code = 2 if self.dtype == torch.bfloat16 else 1  # comfy-kitchen's output dtype codes
        kwargs = {"q": self.q, "scale": self.scale, "output_dtype_code": code}
        return self._judge(backend, INT8_DECODE, 0, kwargs, lambda: self.decoded, False)

    def gemm(self, backend: str, op: str, m: int, timing: bool) -> LowBitCall | None:
        import torch

        if op == INT8_GEMM:
            # Integers in [-127, 127] with 127 in every row, times 2^-5: the per-row int8
            # quantisation the kernel applies reproduces them exactly.
            values = torch.randint(-127, 128, (m, self.k), generator=self.generator).float()
            values[:, 0] = 127.0
            x = (values * 2.0**-5).to(self.device, self.dtype)
            kwargs: dict[str, Any] = {"x": x, "weight": self.q, "weight_scale": self.scale}
            weight = self.decoded
        else:
            qdata, s_rel, s_channel, correction, codebook, weight = self.int4()
            x = torch.randn(m, self.k, generator=self.generator).to(self.device, self.dtype)
            kwargs = {
                "x": x,
                "qdata": qdata,
                "s_rel": s_rel,
                "s_channel": s_channel,
                "codebook": codebook,
                "correction": correction,
            }
        kwargs["out_dtype"] = self.dtype
        return self._judge(backend, op, m, kwargs, lambda: x.float() @ weight.T, timing, weight)

    def int4(self) -> tuple[Any, ...]:
        """The int4 storage of a random weight (quantised by the eager backend, the portable
        reading of the format) and its decoded reference in fp32."""
        if self._int4 is None:
            import comfy_kitchen
            import torch

            registry = comfy_kitchen.registry
            plain = torch.randn(self.n, self.k, generator=self.generator).to(self.device)
            stored = registry.get_implementation("quantize_w4a8_int8_weight", backend="eager")(
                plain
            )
            qdata, s_rel, s_channel, correction, codebook = stored
            decode = registry.get_implementation("dequantize_w4a8_int8_weight", backend="eager")
            weight = decode(
                qdata,
                s_rel,
                s_channel,
                codebook=codebook,
                correction=correction,
                output_dtype=torch.float32,
            )
            self._int4 = (qdata, s_rel, s_channel, correction, codebook, weight)
        return self._int4

    def _judge(
        self,
        backend: str,
        op: str,
        m: int,
        kwargs: dict[str, Any],
        reference: Callable[[], Any],
        timing: bool,
        weight: Any = None,
    ) -> LowBitCall | None:
        """The call judged; None when the backend's declared constraints turn it away."""
        import comfy_kitchen
        import torch

        tolerance = TOLERANCE[op]
        try:
            run = comfy_kitchen.registry.get_implementation(op, backend=backend, kwargs=kwargs)
        except Exception:  # noqa: BLE001 - the registry would send the call to another backend
            return None
        try:
            output = run(**kwargs)
        except Exception as exc:  # noqa: BLE001 - a kernel that raises is the finding
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            return LowBitCall(backend, op, m, self.k, self.n, "refused", None, tolerance, first)
        expected = reference()
        output = output.float().reshape(expected.shape)
        if not bool(torch.isfinite(output).all()):
            bad = int((~torch.isfinite(output)).sum())
            message = f"{bad} of {output.numel()} outputs NaN or Inf"
            return LowBitCall(backend, op, m, self.k, self.n, "wrong", math.inf, tolerance, message)
        peak = float(expected.abs().max().clamp_min(1e-12))
        error = float((output - expected).abs().max()) / peak
        if error > tolerance:
            return LowBitCall(backend, op, m, self.k, self.n, "wrong", error, tolerance)
        if not timing or weight is None:
            return LowBitCall(backend, op, m, self.k, self.n, "right", error, tolerance)
        ms = _cuda_ms(lambda: run(**kwargs))
        x = kwargs["x"].to(torch.bfloat16)
        plain = weight.to(torch.bfloat16)
        bf16_ms = _cuda_ms(lambda: torch.nn.functional.linear(x, plain))
        slow = ms > SLOW_FACTOR * bf16_ms and ms - bf16_ms > SLOW_MARGIN_MS
        status = "slow" if slow else "right"
        return LowBitCall(backend, op, m, self.k, self.n, status, error, tolerance, "", ms, bf16_ms)


def _cuda_ms(run: Callable[[], Any], repeats: int = 5) -> float:
    """The median milliseconds of `run` over `repeats` calls after one warm-up, measured with
    CUDA events on the current stream."""
    import torch

    run()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return round(statistics.median(times), 4)
