"""Plain-text renderings of core results for the terminal (`halfsafe gpu`, `advise`, `check`,
`generate`, `explain`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from app.core.advice import FamilyAdvice
from app.core.advice.answer import HEADER as ADVICE_HEADER
from app.core.advice.kernels import untried_words
from app.core.components import words as component_words
from app.core.fixing.fix_ranking import CHOSEN_WORDS
from app.core.formats.weight_findings import StoredQuantization
from app.core.generation import GenerationResult
from app.core.generation.records import IMAGE_STATUS_WORDS
from app.core.hardware.records import HardwareReport
from app.core.hardware.selftest import SelfTestResult
from app.core.hardware.selftest_records import ACCUMULATION_OP
from app.core.health import (
    CANDIDATE_COLUMNS,
    RUN_WORDS,
    VERDICT_WORDS,
    HealthReport,
    candidate_rows,
    cost_comparison,
    cost_words,
    flag,
    flags,
    precision_words,
    status_words,
)
from app.core.health.report import CheckMemory
from app.core.memory import budget_source_words
from app.core.precision.words import low_bit_lines
from app.core.settings import FIELDS
from app.core.words.causes import cause_words
from app.core.words.nodes import NODE_WORDS


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]


def _quantization_line(quantization: StoredQuantization | None) -> list[str]:
    if not quantization:
        return []
    return [
        f"Stored:  {quantization.format} ({', '.join(quantization.types)}), "
        + quantization.held_words()
    ]


def _companion_lines(companions: Mapping[str, str]) -> list[str]:
    """The files a split transformer file was read with, one per component."""
    return [
        f"{'With:' if i == 0 else '':<9}{component:<16}{path}"
        for i, (component, path) in enumerate(companions.items())
    ]


def health_text(report: HealthReport) -> str:
    """The human-readable report `halfsafe check` prints; its first line is the headline."""
    model, device = report.model, report.device
    # The component column: 16 wide, wider for a longer name ("text_conditioner").
    wide = max([16, *(len(name) + 2 for name in report.components)])
    lines = [
        report.headline,
        "",
        f"Model:   {model.source} ({model.architecture}, {model.format})",
        *_companion_lines(model.companions),
        f"Device:  {device.name} ({device.kind}), probed at "
        f"{report.size}x{report.size}, timesteps {', '.join(map(str, report.timesteps))}",
        *_quantization_line(model.quantization),
        "Tested:  "
        + ", ".join(f"{k} {v}" for k, v in report.plan.dtypes.items())
        + (", upcast attention" if report.plan.upcast_attention else ""),
        "",
        f"{'component':<{wide}}{'status':<26}{'max |x|':>10}{'headroom':>10}  first bad layer",
    ]
    for name, c in report.components.items():
        lines.append(
            f"{name:<{wide}}{status_words(c):<26}{_number(c.max_abs):>10}"
            f"{_number(c.headroom):>10}  {c.first_bad_module or '-'}"
        )
        where = (
            f"; first past 65504 at {c.predicted_first_bad_module}"
            if (c.predicted_first_bad_module)
            else ""
        )
        lines.append(f"{'':<{wide}}{precision_words(c, len(report.plan.islands(name)))}{where}")
    lines.append("")
    if report.weights_non_finite:
        lines.append(
            f"Damaged tensors: {', '.join(report.weights_non_finite[:5])}"
            + (" ..." if len(report.weights_non_finite) > 5 else "")
        )
    for finding in report.weights_bad_quantized[:5]:
        lines.append(f"Bad quantized tensor: {finding.tensor} {finding.problem}")
    lines.append(f"Verdict: {VERDICT_WORDS[report.verdict]}")
    if report.loras:
        lines.append(
            "LoRAs:   " + ", ".join(f"{lora.name} at {lora.weight:g}" for lora in report.loras)
        )
    if report.cause is not None:
        proof = "verified" if report.cause.verified else "not verified"
        kind = report.cause.kind
        if report.cause.kernel is not None:  # the attention kernel it names
            kind += f" ({report.cause.kernel.kernel.words()})"
        lines.append(
            f"Cause:   {kind}, {cause_words(report.cause.kind)}; "
            f"repair: {report.cause.repair} ({proof})"
        )
    if report.remembered:
        lines.append(f"Ran with: the fix remembered for this model: {report.remembered}")
    fix = report.fix
    if fix:
        lines.append(f"Fix:     {fix.summary}")
        lines.append(f"Apply:   {flags(fix.settings)}")
        if fix.cost:
            lines.append(
                f"Cost:    {cost_words(fix.cost.fix)} with the fix; "
                f"{cost_words(fix.cost.no_half)} with --no-half"
            )
            comparison = cost_comparison(fix.cost, fix.settings)
            if comparison:
                lines.append(f"         {comparison}")
        alternative = report.cause.alternative if report.cause is not None else None
        if alternative is not None:  # the precision fix beside a kernel repair, priced too
            priced = f" ({cost_words(alternative.cost.fix)})" if alternative.cost else ""
            lines.append(f"Or:      {flags(alternative.settings)}{priced}")
        rows = candidate_rows(fix.candidates, fix.baselines)
        if rows:
            lines.append("")
            timed = ", timed on this device" if fix.baselines else ""
            how = (
                CHOSEN_WORDS
                if any(c.chosen for c in fix.candidates)
                else "none chosen: the cause's repair replaced them"
            )
            lines.append(f"Candidates (judged against fp32{timed}; {how}):")
            lines.extend(_table([CANDIDATE_COLUMNS, *rows]))
            if fix.baselines:
                lines.append(f"({RUN_WORDS}.)")
            lines.append("")
    elif report.advice is not None and report.advice.overflowing:
        lines.append(f"For fp16: {flags(report.advice.settings)}")
        if report.advice.layer_settings:
            lines.append(f"Or, layers only: {flags(report.advice.layer_settings)}")
    for note in report.notes:
        lines.append(f"Note:    {note}")
    memory = _memory_words(report.memory)
    if memory:
        lines.append(f"Memory:  {memory}")
    lines.append(f"Checked in {report.seconds:.2f} s.")
    return "\n".join(lines)


def _memory_words(memory: CheckMemory | None) -> str:
    """What the check's copies held, said where a memory budget was set."""
    if memory is None or memory.budget_mb is None:
        return ""
    budget = memory.budget_mb
    source = budget_source_words(memory.budget_from)
    source = f" ({source})" if source else ""
    words = (
        f"budget {budget:,.0f} MB{source}; the check's copies held at most "
        f"{memory.peak_placed_mb:,.0f} MB at once"
    )
    if memory.computed_in_place:
        parts = ", ".join(component_words(name) for name in memory.computed_in_place)
        words += f"; the {parts} computed wider layer by layer from the stored weights"
    if memory.streamed:
        parts = ", ".join(
            f"the {component_words(name)} ({held.blocks} blocks, {held.block_mb:,.0f} MB at a time)"
            for name, held in memory.streamed.items()
        )
        words += f"; streamed block by block: {parts}"
    if memory.peak_placed_mb > budget:
        words += (
            " (over the budget: the layers kept on the device and the largest block take "
            "more than it)"
        )
    return words + "."


def explain_text(explanation) -> str:
    """What `halfsafe explain` prints: the answer first, then the record, the model and the fix
    in the image tool's terms; the health report follows when the check ran."""
    from app.core.explain import findings
    from app.core.words.tools import TOOLS, setting_words

    record = explanation.record
    lines = [explanation.message, ""]
    lines.append(f"Image:   {explanation.path} ({explanation.status})")
    pixels = explanation.pixels
    flat = pixels.flat
    if flat:
        colour = ", ".join(str(c) for c in flat.colour)
        x0, y0, x1, y1 = flat.box
        lines.append(
            f"Pixels:  RGB {colour} exactly, {flat.share:.0%} of the picture "
            f"(x {x0}-{x1 - 1}, y {y0}-{y1 - 1})"
        )
    saturated, noise = pixels.saturated, pixels.noise
    if saturated:
        colour = ", ".join(str(c) for c in saturated.colour)
        lines.append(
            f"Pixels:  every channel at 0 or 255 in {saturated.share:.1%} of the picture "
            f"(most RGB {colour})"
        )
    elif noise and noise.coloured_noise and pixels.tiled is None:
        lines.append(
            f"Pixels:  correlation {noise.correlation:.2f} 16 px apart, colour "
            f"{noise.colour:.1f} times brightness between neighbours (coloured noise)"
        )
    look = findings.pixel_line(pixels)
    if look:
        lines.append(f"Pixels:  {look}")
    region = pixels.noise_region
    if region:
        x0, y0, x1, y1 = region.box
        lines.append(
            f"Pixels:  coloured noise in x {x0}-{x1 - 1}, y {y0}-{y1 - 1} "
            f"({region.share:.0%} of the picture), the rest a picture"
        )
    for second in record.second_passes:
        lines.append(f"Pass:    {second.words()}")
    if record.compiled:
        lines.append(f"Compile: {record.compiled} (the check runs uncompiled)")
    made = TOOLS[explanation.made_by].name if explanation.made_by in TOOLS else "unknown"
    lines.append(f"Made by: {made}" + (f" {record.version}" if record.version else ""))
    model = explanation.model
    named = record.model or record.unet or "not recorded"
    if record.model_hash:
        named += f" (hash {record.model_hash})"
    lines.append(f"Model:   {named}")
    if model.found:
        lines.append(f"Found:   {model.path} (by {model.matched_by})")
    else:
        lines.append("Found:   no; looked in " + ("; ".join(model.looked_in) or "no folders"))
    remade = explanation.remade
    if remade is not None:
        lines.append(
            f"Remade:  {remade.verdict}, brightness correlation {remade.correlation:.2f} "
            f"(seed {remade.seed})"
        )
    if remade is not None and remade.box is not None:
        x0, y0, x1, y1 = remade.box.box
        lines.append(
            f"Pixels:  noise in x {x0}-{x1 - 1}, y {y0}-{y1 - 1} (structure "
            f"{remade.box.structure:.2f}; {remade.box.made_structure:.2f} made again)"
        )
    fix = explanation.tool_fix
    if fix is not None:
        lines += ["", f"Fix in {TOOLS[fix.tool].name}:"]
        node_fix = explanation.node_fix
        if node_fix is not None:  # the nodes first; the tool's flags are their fallback
            lines.append(f"  nodes:    {node_fix.workflow.how}")
            lines.append(f"  workflow: {node_fix.saved or node_fix.file_name}")
            lines.append(f"  or:       {node_fix.fallback_words}")
            if node_fix.also:
                also = NODE_WORDS["also"].format(flags=" ".join(node_fix.also))
                lines.append(f"  also:     {also}")
        else:
            if fix.flags:
                lines.append("  flags:    " + " ".join(fix.flags))
            for key, value in fix.settings.items():
                shown = setting_words(fix.tool, key)
                lines.append(f"  setting:  {key} = {value}" + (f' ("{shown}")' if shown else ""))
        lines.append(f"  how:      {fix.how}")
        if fix.tool != "halfsafe":
            lines.append("Fix in HalfSafe: " + " ".join(explanation.halfsafe_flags))
    for note in explanation.notes:
        lines.append(f"Note: {note}")
    if explanation.check is not None:
        lines += ["", health_text(explanation.check)]
    return "\n".join(lines)


def _fix_flags(settings: dict) -> str:
    """A fix as the flags that apply it; a switch that is off by default and must stay off
    is said in words (it has no --no- form)."""
    return " ".join(
        flag(key, value) or f"(leave --{FIELDS[key].flag_name} off)"
        for key, value in settings.items()
    )


def generation_text(result: GenerationResult) -> str:
    """The human-readable summary `halfsafe generate` prints."""
    s = result.settings
    dtypes = (
        f"UNet {s.get('unet_precision')}, VAE {s.get('vae_precision')}, text encoder "
        f"{s.get('text_encoder_precision')}"
        + (", upcast attention" if s.get("upcast_attention") else "")
    )
    lines = [
        f"Model:    {result.model.name} ({result.model.architecture})",
        f"Device:   {result.device.name} ({result.device.kind})",
        f"Settings: {dtypes}; NaN watch {'on' if s.get('nan_check') else 'off'}, "
        f"auto-fix {s.get('auto_fix')}",
    ]
    lines += [f"Warning:  {w}" for w in result.warnings]
    lines.append("")
    for image in result.images:
        name = Path(image.path).name if image.path else "(not saved)"
        lines.append(f"{name:<24} seed {image.seed:<11} {IMAGE_STATUS_WORDS[image.status]}")
        if image.status != "ok":
            lines.append(f"{'':<24} {image.message}")
        if image.fix and image.status in ("nan", "black"):
            lines.append(f"{'':<24} fix: {_fix_flags(image.fix)}")
    folder = {str(Path(i.path).parent) for i in result.images if i.path}
    lines.append("")
    lines.append(
        f"{len(result.images)} image{'s' if len(result.images) != 1 else ''} in "
        f"{result.seconds:.1f} s"
        + (f", saved in {folder.pop()}" if len(folder) == 1 else "")
        + ("." if result.all_good else "; some are still broken.")
    )
    return "\n".join(lines)


def hardware_text(report: HardwareReport) -> str:
    """What `halfsafe gpu` prints: the devices as a table, then each device's recommendation
    with reasons."""
    lines = [
        f"HalfSafe {report.halfsafe} · PyTorch {report.torch} · "
        + (f"CUDA {report.cuda}" if report.cuda else "no CUDA in this PyTorch"),
        "",
    ]
    header = ("Device", "Name", "Memory", "fp16", "bf16", "TF32", "Self-test")
    rows: list[tuple[str, ...]] = [header]
    for d in report.devices:
        rows.append(
            (
                d.torch_device + (f" ({d.kind})" if d.kind == "rocm" else ""),
                d.name
                + (f" [{d.arch}]" if d.arch else "")
                + (
                    f" cc {d.capability[0]}.{d.capability[1]}"
                    if d.capability and d.kind == "cuda"
                    else ""
                ),
                f"{d.memory_total_mb / 1024:.1f} GB" if d.memory_total_mb else "?",
                d.fp16,
                d.bf16,
                "yes" if d.tf32 else "no",
                _self_test_cell(d.self_test),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for number, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))

    for d in report.devices:
        lines += [
            "",
            f"{d.torch_device} · {d.name}" + (f" · driver {d.driver}" if d.driver else ""),
        ]
        for quirk in d.quirks:
            lines.append(f"  Known issue [{quirk.id}]: {quirk.summary}")
            lines.append(f"    source: {quirk.source}")
        test = d.self_test
        if test is not None and test.ran:
            for dtype in ("fp16", "bf16"):
                failed = [
                    x
                    for x in test.details
                    if x.dtype == dtype and x.status == "fail" and x.op != ACCUMULATION_OP
                ]
                for op in failed:
                    lines.append(f"  Self-test: {op.op} failed in {dtype}: {op.note}")
            lines += _accumulation_lines(test)
            for op in test.details:
                if op.status == "skipped":
                    lines.append(f"  Self-test: {op.dtype} not tested: {op.note}")
            lines += [f"  {note}" for note in test.notes]
            lines += _statistical_lines(test)
            lines += _low_bit_lines(test)
        kernels = untried_words(d)
        if kernels:
            lines.append(f"  {kernels}")
        lines.append("  Recommended settings:")
        key_width = max(len(k) for k in d.recommended)
        for key, value in d.recommended.items():
            shown = str(value).lower() if isinstance(value, bool) else str(value)
            lines.append(f"    {key.ljust(key_width)}  {shown.ljust(5)}  {d.reasons[key]}")
    if report.notes:
        lines += ["", *[f"Note: {note}" for note in report.notes]]
    return "\n".join(lines)


def _accumulation_lines(test: SelfTestResult) -> list[str]:
    """The full fp16 accumulation row, where it ran: a mode, not fp16 itself."""
    return [
        f"  Self-test: full fp16 accumulation (fp16_accumulation) "
        f"{'overflows' if row.status == 'fail' else 'holds'} here: {row.note}"
        for row in test.details
        if row.op == ACCUMULATION_OP and row.status in ("pass", "fail")
    ]


def _low_bit_lines(test: SelfTestResult) -> list[str]:
    """comfy-kitchen's low-bit kernels at the self-test's shapes, per backend and per fault."""
    low_bit = test.low_bit
    if low_bit is None:
        return []
    timed = ", timed against bf16" if low_bit.timed else ""
    head = (
        f"  comfy-kitchen {low_bit.version} low-bit kernels "
        f"({low_bit.dtype}, {low_bit.shapes_from} shapes{timed}):"
    )
    return [head, *[f"    {line}" for line in low_bit_lines(low_bit.to_json())]]


def _statistical_lines(test: SelfTestResult) -> list[str]:
    """The statistical self-test's counts, one line per operation measured."""
    stat = test.statistical
    if stat is None:
        return []
    bound = f"{stat.budget_s:g} s budget" if stat.budget_s is not None else "bounded by calls"
    lines = [f"  Statistical self-test ({bound}, took {stat.seconds:.1f} s):"]
    lines += [f"    {r.words()}" for r in stat.results if r.status != "unavailable"]
    missing = sorted({r.name for r in stat.results if r.status == "unavailable"})
    if missing:
        lines.append(f"    not available here: {', '.join(missing)}")
    return lines


def _self_test_cell(test: SelfTestResult | None) -> str:
    if test is None or not test.ran:
        return "not run"
    text = f"fp16 {test.fp16}, bf16 {test.bf16}"
    if test.cached:
        return text + " (cached)"
    return text + f" ({test.seconds:.1f} s)"


def advice_text(advice: FamilyAdvice) -> str:
    """`halfsafe advise FAMILY`: the answer, the table of forms, whether the int8 kernels were
    tried, then the device and one sentence per stored form."""
    table = [ADVICE_HEADER, *(row.cells() for row in advice.table)]
    widths = [max(len(row[i]) for row in table) for i in range(len(ADVICE_HEADER))]
    lines = [advice.answer, ""]
    for number, row in enumerate(table):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    if advice.kernels:
        lines += ["", advice.kernels]
    lines += ["", f"{advice.title} on {advice.device_words()}, form by form:"]
    lines += [f"- {form.sentence}" for form in advice.forms]
    return "\n".join(lines)
