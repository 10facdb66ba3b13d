"""A precision in words: the one table for what each part of a model runs in, said the same way
in the status bar, a check's headline and report, a caption and the Fixes page.

'fp32 everywhere', 'fp16 everywhere', 'fp16, VAE in fp32', 'fp16, with 2 VAE layers in fp32',
'fp16 under autocast, attention upcast to fp32'. The most common dtype is named first and the
parts that differ follow it; layers kept wider or clamped are counted per part.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from app.core.components import words as component_words
from app.core.encoders.kinds import own_island
from app.core.precision.plan import PrecisionPlan

NOT_DECIDED = "auto (decided when a job runs)"
# The parts a precision is resolved and said for when no model is loaded: those every family
# has.
USUAL_PARTS = ("text_encoder", "text_encoder_2", "unet", "vae")


def dtype_words(
    dtypes: Mapping[str, str],
    *,
    islands: Mapping[str, Mapping[str, int]] | None = None,
    clamps: Mapping[str, int] | None = None,
    autocast: bool = False,
    upcast: bool = False,
) -> str:
    """`dtypes`: part -> dtype ('auto' where not decided yet); `islands`: part -> {dtype: how
    many of its layers run in it}; `clamps`: part -> how many of its layers are clamped;
    `autocast`: the fp16 parts run under torch.autocast; `upcast`: attention upcast to fp32."""
    if not dtypes or set(dtypes.values()) == {"auto"}:
        return NOT_DECIDED
    counts: dict[str, int] = {}
    for dtype in dtypes.values():
        counts[dtype] = counts.get(dtype, 0) + 1
    base = max(counts, key=lambda d: counts[d])
    others = [f"{component_words(n)} in {d}" for n, d in dtypes.items() if d != base]
    for part, by_dtype in (islands or {}).items():
        for dtype, count in by_dtype.items():
            others.append(f"with {layer_count_words(count, part)} in {dtype}")
    for part, count in (clamps or {}).items():
        if count:
            others.append(f"with {layer_count_words(count, part)} clamped")
    everywhere = not others  # no part and no layer runs otherwise
    head = f"{base} everywhere" if everywhere else base
    if autocast and base == "fp16":
        head = "fp16 everywhere, under autocast" if everywhere else "fp16 under autocast"
    elif autocast:
        others.append("fp16 parts under autocast")
    if upcast:
        others.append("attention upcast to fp32")
    return ", ".join([head, *others])


def plan_words(plan: PrecisionPlan) -> str:
    """What a plan runs each part in (`dtype_words`), its islands and clamps counted."""
    islands: dict[str, dict[str, int]] = {}
    for part in plan.dtypes:
        for dtype in plan.islands(part).values():
            islands.setdefault(part, {})
            islands[part][dtype] = islands[part].get(dtype, 0) + 1
    return dtype_words(
        plan.dtypes,
        islands=islands,
        clamps={part: len(paths) for part, paths in plan.clamps.items()},
        autocast=plan.autocast_active,
        upcast=plan.upcast_attention,
    )


def settings_words(
    values: Mapping[str, Any],
    dtypes: Mapping[str, str],
) -> str:
    """Settings values said as `dtype_words`, for parts whose dtypes (`dtypes`, resolved as far
    as anything decides them) are known: the layer lists counted for parts not already as wide
    as the list asks, autocast and upcast as the values set them."""
    islands: dict[str, dict[str, int]] = {}
    clamps: dict[str, int] = {}
    for key, wide in (("fp32_modules", "fp32"), ("bf16_modules", "bf16"), ("clamp_modules", "")):
        for part, count in _per_part(values.get(key) or ()).items():
            own = dtypes.get(part)
            if own is None:
                continue
            if not wide:
                if own in ("fp16", "auto"):
                    clamps[part] = clamps.get(part, 0) + count
            elif own != "fp32" and own != wide:
                islands.setdefault(part, {})[wide] = count
    return dtype_words(
        dtypes,
        islands=islands,
        clamps=clamps,
        autocast=values.get("precision") == "autocast" and "fp16" in dtypes.values(),
        upcast=bool(values.get("upcast_attention")),
    )


def _per_part(entries: Iterable[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in entries:
        part = str(entry).split(":", 1)[0]
        counts[part] = counts.get(part, 0) + 1
    return counts


def layer_count_words(count: int, part: str) -> str:
    """ "2 VAE layers": the one noun phrase for a count of a part's layers, in a state
    ('with 2 VAE layers in fp32') and in a fix ('keep 2 VAE layers in fp32') alike."""
    return f"{count} {component_words(part)} layer{'s' if count != 1 else ''}"


# --- a fix in words ----------------------------------------------------------------------------

_LAYER_LISTS = {"fp32_modules": "fp32", "bf16_modules": "bf16", "clamp_modules": None}
_REDUCED = ("fp16_accumulation", "fp16_reduced_precision_reduction", "attention_reduced_precision")


def fix_words(settings: Mapping[str, Any] | None, components: Collection[str] = ()) -> str:
    """What a fix does, from its settings: the one way a fix is said, by the check's candidates,
    its report, the Fixes page and the Models page alike, with the layer counts `dtype_words`
    uses for the same state. {'fp32_modules': ['vae:a', 'vae:b']} -> 'keep 2 VAE layers in
    fp32'; {'vae_precision': 'fp32'} -> 'run the VAE in fp32'; '' for no settings.
    `components`, the model's where they are known, name a setting shared by several kinds of
    component by the one the model has ({'unet_precision': 'bf16'} runs a Flux model's
    transformer, not a UNet); else by the first kind."""
    from app.core.components import COMPONENTS
    from app.core.settings import FIELDS

    settings = settings or {}
    precision_words: dict[str, str] = {}
    for component in COMPONENTS.values():
        if component.part_of is None and component.name in components:
            # Every part the setting governs: "text conditioner and transformer" (Anima).
            said = precision_words.get(component.setting)
            words = component.words
            precision_words[component.setting] = f"{said} and {words}" if said else words
    for component in COMPONENTS.values():
        if component.part_of is None and not component.borrows_setting:
            precision_words.setdefault(component.setting, component.words)
    parts: list[str] = []
    for key, value in settings.items():
        if key in _LAYER_LISTS:
            dtype = _LAYER_LISTS[key]
            for part, count in _per_part(value or ()).items():
                layers = layer_count_words(count, part)
                parts.append(
                    f"keep {layers} in {dtype}" if dtype else f"clamp {layers} to fp16's range"
                )
        elif key in precision_words:
            parts.append(f"run the {precision_words[key]} in {value}")
        elif key == "no_half":
            parts.append("run everything in fp32" if value else "allow half precision")
        elif key == "no_half_vae":
            parts.append("run the VAE in fp32" if value else "allow a half-precision VAE")
        elif (island := own_island(key)) is not None and value:
            parts.append(island.words)
        elif key == "upcast_attention" and value:
            parts.append("upcast attention to fp32")
        elif key == "attention_backend" and value == "auto":
            parts.append("switch attention to PyTorch's own kernel")
        elif key == "attention_backend":
            parts.append(f"switch attention to the {value} kernel")
        elif key in _REDUCED and value is False:
            math_alone = (
                key == "attention_reduced_precision" and settings.get("attention_backend") == "math"
            )
            said = "turn off reduced-precision accumulation"
            if not math_alone and said not in parts:
                parts.append(said)
        else:
            field = FIELDS.get(key)
            label = field.label if field is not None else key.replace("_", " ")
            shown = ("on" if value else "off") if isinstance(value, bool) else str(value)
            parts.append(f"{label}: {shown}")
    return "; ".join(parts)


# comfy-kitchen's low-bit kernels (`precision.lowbit`): each op and each outcome of a call.
LOW_BIT_OPS = {
    "int8_linear": "int8 GEMM",
    "dequantize_int8_simple_dtype": "int8 decode",
    "w4a8_int8_linear": "int4 GEMM",
}
LOW_BIT_STATUS = {
    "right": "right",
    "wrong": "wrong results",
    "refused": "refused",
    "slow": "far slower than bf16",
}


LOW_BIT_SHAPES_SAID = 3  # layer shapes named in one line before "and N more"


def low_bit_lines(document: Mapping[str, Any]) -> list[str]:
    """A low-bit kernel comparison (`LowBitReport.to_json()`) in words: one line per backend
    with its calls counted, then one per fault: a backend's op, its status, the M values it
    struck at and the (K, N) shapes where it struck at just those, the worst error or the
    first message, the times where slow."""
    lines = []
    calls = list(document.get("calls", []))
    for backend, count in document.get("calls_per_backend", {}).items():
        bad = [c for c in calls if c["backend"] == backend and c["status"] != "right"]
        verdict = f"{len(bad)} not right" if bad else "all right"
        declined = document.get("declined", {}).get(backend, 0)
        away = f" ({declined} more its constraints send to another backend)" if declined else ""
        calls_said = f"{count} call" + ("s" if count != 1 else "")
        lines.append(f"{backend}: {calls_said}, {verdict}{away}")
    per_shape: dict[tuple[str, str, str, int, int], list[Mapping[str, Any]]] = {}
    for call in calls:
        if call["status"] != "right":
            key = (call["backend"], call["op"], call["status"], call["k"], call["n"])
            per_shape.setdefault(key, []).append(call)
    # Shapes struck at the same M values are said together.
    groups: dict[tuple[str, str, str, tuple[int, ...]], list[Mapping[str, Any]]] = {}
    for (backend, op, status, _k, _n), group in per_shape.items():
        ms = tuple(sorted({c["m"] for c in group}))
        groups.setdefault((backend, op, status, ms), []).extend(group)
    for (backend, op, status, ms), group in groups.items():
        shapes = list(dict.fromkeys(f"K {c['k']}, N {c['n']}" for c in group))
        more = len(shapes) - LOW_BIT_SHAPES_SAID
        said = "; ".join(shapes[:LOW_BIT_SHAPES_SAID]) + (f"; and {more} more" if more > 0 else "")
        where = f"({said})" if ms == (0,) else f"M {', '.join(map(str, ms))} ({said})"
        first = group[0]
        if status == "wrong":
            how = (
                "NaN or Inf"
                if any(c.get("non_finite") for c in group)
                else f"off by {max(c['error'] or 0.0 for c in group):.2g} of the largest value"
            )
        elif status == "refused":
            how = f'raised "{first.get("message", "")}"'
        else:
            how = f"{first.get('ms')} ms against {first.get('bf16_ms')} ms in bf16"
        op_words = LOW_BIT_OPS.get(op, op)
        lines.append(f"{backend} {op_words}: {LOW_BIT_STATUS[status]} at {where}: {how}")
    return lines


LOW_BIT_NOTE = (
    "comfy-kitchen's low-bit kernels on this device, at this model's int8 layers' shapes (as "
    "ComfyUI runs them; HalfSafe's own runs decode the weights instead): {line}."
)


def low_bit_notes(document: Mapping[str, Any]) -> list[str]:
    """One note per fault of a model's low-bit kernel comparison (none when all are right)."""
    backends = len(document.get("calls_per_backend", {}))
    return [LOW_BIT_NOTE.format(line=line) for line in low_bit_lines(document)[backends:]]
