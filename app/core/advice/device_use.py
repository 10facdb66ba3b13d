"""What one device does with each stored form, from its hardware report (`hardware.DeviceInfo`:
kind, compute capability, its bf16 class from capability, quirks and self-test, and the
precision recommended for it), said as a clause for the form's sentence.

The thresholds are NVIDIA's: int8 tensor cores from compute capability 7.5 (Turing; not Volta's
7.0 or Pascal), fp8 from 8.9 (Ada), NVFP4 from 10.0 (Blackwell). Turing's TU116 and TU117 chips
(GTX 16xx and their siblings) have no tensor cores at all: the quirks table already names them
(`NO_TENSOR_CORES`). HalfSafe itself runs no int8,
fp8 or packed kernel: it decodes each layer's weights as it computes (`formats.quantized`), in
the precision it runs on this device; the native path is what other tools' kernels use. Where
the self-test ran those tools' int8 kernels here (comfy-kitchen's, `precision.lowbit`), the int8
sentence says what they did: a capable card whose kernels give wrong results is no fast path.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.hardware.records import DeviceInfo

NATIVE, EMULATED, DECODED, UNSUPPORTED = "native", "emulated", "decoded", "unsupported"
INT8_FROM = (7, 5)
FP8_FROM = (8, 9)
NVFP4_FROM = (10, 0)
BF16_FROM = (8, 0)
# The quirk whose match is exactly the TU116/TU117 cards, which have no tensor cores.
NO_TENSOR_CORES = "nvidia-turing-gtx16-fp16-nan"


@dataclass(frozen=True)
class DeviceUse:
    """How the device computes a form: "native", "emulated" (the device lacks it and it is
    computed through a wider type), "decoded" (no device has it: decoded layer by layer) or
    "unsupported"; the precision HalfSafe computes it in here; the clause saying so."""

    use: str
    precision: str
    words: str


def device_use(form: str, device: DeviceInfo) -> DeviceUse:
    """What `device` does with weights stored in `form` (a `formats.forms` key)."""
    precision = str(device.recommended.get("precision") or "fp32")
    decoded = f"each layer is decoded to {precision} as it computes"
    if form == "bf16":
        return _sixteen_bits(device, precision)
    if form.startswith("gguf"):
        return DeviceUse(
            DECODED, precision, f"GGUF blocks have no kernel on any GPU: {decoded}, here too"
        )
    threshold, what, era = {
        "fp8": (FP8_FROM, "fp8 tensor cores", "Ada"),
        "int8-convrot": (INT8_FROM, "int8 tensor cores", "Turing"),
        "nvfp4": (NVFP4_FROM, "NVFP4 tensor cores", "Blackwell"),
    }[form]
    start = f"{threshold[0]}.{threshold[1]}, {era}"
    measured = _int8_kernels_measured(device) if form == "int8-convrot" else ""
    if device.backend != "cuda" or device.capability is None:
        return DeviceUse(
            EMULATED,
            precision,
            f"{what} are NVIDIA's (from compute capability {start}) and this {_kind(device)} "
            f"has none: {decoded}",
        )
    capability = f"{device.capability[0]}.{device.capability[1]}"
    if any(quirk.id == NO_TENSOR_CORES for quirk in device.quirks):
        return DeviceUse(
            EMULATED,
            precision,
            f"this GPU has no tensor cores at all (a TU116 or TU117 chip, compute capability "
            f"{capability}; {what} start at {start} on the other chips{measured}): {decoded}",
        )
    if tuple(device.capability) >= threshold:
        return DeviceUse(
            NATIVE,
            precision,
            f"this GPU has {what} (compute capability {capability}; they start at {start}), "
            f"which tools with such kernels use{measured}; HalfSafe decodes each layer to "
            f"{precision} as it computes",
        )
    return DeviceUse(
        EMULATED,
        precision,
        f"this GPU has no {what} (compute capability {capability}; they start at {start}"
        f"{measured}): {decoded}",
    )


def _int8_kernels_measured(device: DeviceInfo) -> str:
    """What the self-test's low-bit section found of the int8 ops (GEMM and decode) on this
    device, as a clause starting "; " ("" where it did not run them)."""
    from app.core.precision.lowbit import INT8_OPS
    from app.core.precision.words import LOW_BIT_OPS, LOW_BIT_STATUS

    test = device.self_test
    low_bit = test.low_bit if test is not None else None
    calls = [c for c in low_bit.calls if c.op in INT8_OPS] if low_bit is not None else []
    if low_bit is None or not calls:
        return "; the self-test has not run int8 kernels here"
    kitchen = f"comfy-kitchen {low_bit.version}" if low_bit.version else "comfy-kitchen"
    faults = [c for c in calls if c.status != "right"]
    if not faults:
        return (
            f"; the self-test found {kitchen}'s int8 kernels right here at all "
            f"{len(calls)} shapes it tried"
        )
    first = faults[0]
    return (
        f"; but the self-test found {kitchen}'s {first.backend} {LOW_BIT_OPS[first.op]} "
        f"{LOW_BIT_STATUS[first.status]} here at {len(faults)} of {len(calls)} shapes "
        f"(first at M {first.m}, K {first.k}, N {first.n}), so tools using it may draw noise"
    )


def _sixteen_bits(device: DeviceInfo, precision: str) -> DeviceUse:
    test = device.self_test if device.self_test is not None and device.self_test.ran else None
    if test is None:
        tested = "the self-test has not run here"
    elif test.bf16 == "pass":
        tested = "the self-test found its bf16 results right"
    elif test.bf16 == "fail":
        failed = ", ".join(test.failed_ops("bf16")[:3])
        tested = f"the self-test failed bf16 ({failed})" if failed else "the self-test failed bf16"
    else:
        tested = "the self-test did not test bf16"
    runs = f"HalfSafe runs 16-bit weights in {precision} here"
    if device.fp16 != "fast" and device.kind != "cpu":
        runs += f" (fp16 is {device.fp16} on it{_quirk(device, 'fp16')})"
    if device.bf16 == "native":
        return DeviceUse(
            NATIVE, precision, f"this {_kind(device)} computes bf16 natively ({tested}); {runs}"
        )
    if device.bf16 == "emulated":
        return DeviceUse(
            EMULATED,
            precision,
            f"bf16 is emulated on this {_kind(device)}, slow ({_why_emulated(device)}; "
            f"{tested}); {runs}",
        )
    return DeviceUse(
        UNSUPPORTED,
        precision,
        f"this {_kind(device)} has no usable bf16{_quirk(device, 'bf16')} ({tested}); {runs}",
    )


def _why_emulated(device: DeviceInfo) -> str:
    if device.backend == "cuda" and device.capability is not None:
        major, minor = device.capability
        return (
            f"compute capability {major}.{minor}; bf16 tensor cores start at "
            f"{BF16_FROM[0]}.{BF16_FROM[1]}, Ampere"
        )
    if device.backend == "mps":
        return (
            "Apple's GPU computes bf16 through fp32 on M1 and M2, and HalfSafe classes it so on all"
        )
    if device.kind == "cpu":
        return "this CPU has no bf16 instructions"
    return "it has no bf16 arithmetic"


def _quirk(device: DeviceInfo, dtype: str) -> str:
    value = getattr(device, dtype)
    for quirk in device.quirks:
        if quirk.effects.get(dtype) == value:
            return f" [{quirk.id}]"
    return ""


def _kind(device: DeviceInfo) -> str:
    return {"cpu": "CPU", "mps": "Apple GPU"}.get(device.kind, "GPU")
