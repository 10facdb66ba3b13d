"""The explanation of one image: its record and pixels, its model, and for a NaN-black image
the health check at the image's settings (`check_settings`) with the fix in the terms of the
tool that made it, in words (`message`). torch is imported only when the check runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app import __version__
from app.core import samplers
from app.core.errors import (
    BadFileError,
    CancelledError,
    HalfSafeError,
    WrongVariant,
    WrongVariantError,
)
from app.core.explain import designs, kernels, next_steps, runtime, suspects
from app.core.explain.check_settings import (
    _clip_skip,
    _enlarges_pixels,
    _own_steps,
    _probe_size,
    _reproduced_precision,
    _size_notes,
)
from app.core.explain.findings import FINDING_WORDS
from app.core.explain.image_file import (
    PNG_SIGNATURE,
    pixel_status,
    read_exif,
    read_png,
)
from app.core.explain.matching import ModelMatch, find_model, find_vae, named_model
from app.core.explain.message import (
    _check_words,
    _config_variant_words,
    _not_found_words,
    _status_words,
)
from app.core.explain.next_steps import NextSteps
from app.core.explain.node_fix import NodeFix, node_fix_for
from app.core.explain.pixels import PixelFigures
from app.core.explain.records import Record, read_record
from app.core.explain.remake import REMADE_STATUSES, REMAKE_WORDS, Remade
from app.core.families import family_of
from app.core.images.finished import read_head
from app.core.jobs import CancelToken, ProgressCallback, no_progress
from app.core.memory import said_as_sentence
from app.core.words.tools import MADE_BY, TOOLS, ToolFix, in_tool_terms

if TYPE_CHECKING:  # explain runs the check and compares the kernels: these are their records
    from app.core.causes.records import Cause
    from app.core.explain.kitchen import KitchenFinding
    from app.core.health.report import HealthReport

# Image statuses (DESIGN.md): NaN-black, a genuinely dark picture, a safety-checker blank, fine;
# then one flat colour where a generation record says a tool made it (NaN replaced by zeros,
# most likely), and one flat colour with no record (nothing claimed); saturated (white, or
# every channel at 0 or 255: an overflow to infinity, clipped) and coloured noise
# (`signatures`) where a record says a tool made it, and either with no record ("unclaimed":
# a white or noisy design looks the same, so nothing is claimed).
STATUSES = (
    "nan",
    "black",
    "safety_checker",
    "ok",
    "nan_zeroed",
    "flat",
    "saturated",
    "noise",
    "unclaimed",
    "noise_region",
    "inverted",
    "tiled_noise",
    "rgb_static",
    "false_colour",
)
# The statuses of a failed image: the exit status is 1, and for the first four the health
# check runs (a box of noise in a fine picture is a second pass's, which the check of the
# model at the image's settings does not run: `regions`; tiled noise, RGB static and false
# colour are a tool's fast path failing, which HalfSafe's ordinary kernels do not run:
# `suspects`, and `--remake` makes HalfSafe's own image of the record to compare).
PROBLEMS = (
    "nan",
    "nan_zeroed",
    "saturated",
    "noise",
    "noise_region",
    "inverted",
    *suspects.LOOKS,
)
CHECKED = PROBLEMS[:4]

# What explain says, in one table for the terminal, the window and --json's message: the short
# names of the statuses only explain gives (a generated image's are generation's
# IMAGE_STATUS_WORDS); the sentences of the findings only explain makes are
# `findings.FINDING_WORDS`.
STATUS_WORDS = {
    "nan_zeroed": "flat colour: NaN replaced by zeros",
    "flat": "one flat colour",
    "saturated": "white or saturated: an overflow to infinity",
    "noise": "coloured noise: not a picture",
    "unclaimed": "white, noise, static or false colour, no record",
    "noise_region": "coloured noise in one box: a second pass's",
    "inverted": "inverted colours: the negative of the picture its record makes",
    "tiled_noise": "tiled or blocky noise: a kernel's tile size, not fp16",
    "rgb_static": "RGB static: every pixel its own colour, not fp16",
    "false_colour": "false colour: hue unrelated to brightness, not fp16",
}


@dataclass
class Explanation:
    path: str
    made_by: str
    status: str
    record: Record
    pixels: PixelFigures
    model: ModelMatch
    check: HealthReport | None = None  # the health check at the image's settings
    halfsafe_flags: list[str] = field(default_factory=list)
    tool_fix: ToolFix | None = None
    # For a ComfyUI user whose fix is in the diffusion model: HalfSafe Fix in the image's own
    # workflow, the tool's flags its fallback (`node_fix`).
    node_fix: NodeFix | None = None
    message: str = ""
    notes: list[str] = field(default_factory=list)
    # What to try in the image's tool while its model cannot be checked (not reproduced).
    next_steps: NextSteps | None = None
    # comfy-kitchen compared here after a clean check of an image from a tool that runs it
    # (`kitchen`), and the kernel cause it proved, if one.
    kitchen: KitchenFinding | None = None
    cause: Cause | None = None
    # The image made again from its record and compared with the file (`remake`), when asked.
    remade: Remade | None = None
    # The tool's log, when given (`suspects.read_log`), and the fast paths the record and the
    # log show for a look or coloured noise, in the order to rule them out.
    log: suspects.ToolLog | None = None
    look_causes: list[suspects.Suspect] = field(default_factory=list)
    # The model's weights are another variant than the config it is built with (a folder's
    # config.json: proved), or than what a tool's loader that knows only the family's first
    # variant builds (likely): said before any numeric verdict.
    variant: WrongVariant | None = None
    variant_words: str = ""

    @property
    def problem(self) -> bool:
        """A NaN-black image, or NaN replaced by zeros: the command's exit status 1, with a fix
        or without one."""
        return self.status in PROBLEMS

    def _memory_manager(self) -> dict[str, Any] | None:
        manager = runtime.memory_manager(self.made_by, self.record.version)
        named = self.next_steps is not None or (
            self.check is not None
            and self.check.verdict == "healthy"
            and self.status != "safety_checker"  # the recorded checker explains it
        )
        return manager.to_json() if manager is not None and named else None

    def to_json(self) -> dict[str, Any]:
        fix = None
        if self.tool_fix is not None:
            workflow = self.node_fix.to_json() if self.node_fix is not None else None
            fix = {
                "halfsafe": list(self.halfsafe_flags),
                "for_tool": {**self.tool_fix.to_json(), "workflow": workflow},
            }
        return {
            "halfsafe": __version__,
            "image": {"path": self.path, "made_by": self.made_by, "status": self.status},
            "model": self.model.to_json(),
            "check": self.check.to_json() if self.check is not None else None,
            "fix": fix,
            "record": self.record.to_json(),
            "pixels": self.pixels.to_json(),
            "message": self.message,
            "notes": list(self.notes),
            "next_steps": self.next_steps.to_json() if self.next_steps is not None else None,
            # The tool's memory manager, named where the words point at it (a clean check, or
            # next steps without the model) as what to rule out.
            "memory_manager": self._memory_manager(),
            # A cause proved beside the check (a comfy-kitchen kernel after a clean check).
            "cause": self.cause.to_json() if self.cause is not None else None,
            "fused_kernels": self.kitchen.to_json(self.made_by) if self.kitchen else None,
            "remake": self.remade.to_json() if self.remade is not None else None,
            "log": self.log.to_json() if self.log is not None else None,
            "look_causes": [c.to_json() for c in self.look_causes],
            "variant": self.variant.to_json() if self.variant is not None else None,
            # Attention kernels the record shows ran, each with the tool's switch to turn it off.
            "suspects": [
                {**k.to_json(), "turn_off": kernels.turn_off_words(self.made_by, k)}
                for k in self.record.attention
            ],
        }


def read_image(
    path: str | Path, log: suspects.ToolLog | None = None
) -> tuple[Record, str, PixelFigures]:
    """(record, status, pixel figures) of an image file, without the library or a model.
    PNG is read chunk by chunk (`read_png`); JPEG and WebP through their EXIF (`read_exif`).
    `log`: the tool's log, whose evidence of a fast path counts as the record's.
    Raises BadFileError with one sentence for a file that cannot be read."""
    path = Path(path)
    head = read_head(path)
    if head.startswith(PNG_SIGNATURE):
        facts = read_png(path)
    elif head.startswith(b"\xff\xd8\xff") or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
        facts = read_exif(path)
    else:
        raise BadFileError(
            path, "not a PNG, JPEG or WebP image (its first bytes are none of theirs)."
        )
    record = read_record(path, facts.text)
    status, figures = pixel_status(path, facts)
    return record, verdict(record, status, figures, log), figures


def verdict(
    record: Record, status: str, figures: PixelFigures, log: suspects.ToolLog | None = None
) -> str:
    """The image's status from its pixels' status (`pixel_status`) and its record: a fault
    only where a tool made it and the evidence is there (`designs`)."""
    if status in ("nan", "black") and record.halfsafe_status == "safety_checker":
        status = "safety_checker"
    generated = record.made_by in MADE_BY and record.made_by != "unknown"
    if status == "flat" and generated:
        # One exact colour over a large part of a generated picture: a value replaced by a
        # constant where the pixels show what a design cannot (`designs`).
        status = "nan_zeroed"
    if status in ("saturated", "noise", "noise_region", *suspects.LOOKS) and not generated:
        status = "unclaimed"  # a white, noisy or false-colour design looks the same
    if status in designs.NEEDS_EVIDENCE and not _proved(status, record, figures, log):
        status = designs.NEEDS_EVIDENCE[status]  # a picture made so on purpose looks the same
    return status


def _proved(status: str, record: Record, figures: PixelFigures, log) -> bool:
    """Whether a fault the pixels look like has evidence a picture made on purpose cannot
    show: the pixels' own (`designs`), or for tiles the record's or the log's of the fast
    path that draws them. The evidence the record gives is kept in the figures."""
    design = figures.design
    if design is not None and design.proof is not None:
        return True
    if status != "tiled_noise":
        return False
    kinds = [s.kind for s in suspects.suspects(status, record.made_by, record.run, None, log)]
    return designs.recorded_path(kinds) is not None


def explain_image(
    path: str | Path,
    *,
    device: str = "auto",
    folders: list[str] | None = None,
    loaded: Any = None,
    measure_cost: bool = False,
    on_progress: ProgressCallback | None = None,
    cancel: CancelToken | None = None,
    model: str | None = None,
    remake: bool = False,
    log: str | Path | None = None,
) -> Explanation:
    """Explain one image: its record and pixels, its model, and for a NaN-black image the
    health check at the image's settings (steps, sampler, size, and the precision the tool ran)
    with the fix in that tool's terms; when its model is not found, what such images from that
    tool usually are and its switches to try (`next_steps`), said as likely.

    `loaded` is a model already in memory (the engine's): used when it is the file found.
    `model` is the model the user says made the image (a file, a folder or a built-in demo's
    name), for an image that names none or one the library cannot find: it is checked in place
    of a search, and the explanation says whose word it is.
    `remake`: an image that is a picture is made again from its record with its model and
    compared with the file (`remake`); one that is its negative is "inverted"; one that shows
    a look (tiled noise, RGB static, false colour) is compared with HalfSafe's own image.
    `log`: the tool's log file, read for its version and a loader's unexpected keys
    (`suspects.read_log`; BadFileError where it cannot be read).
    Runs on the calling thread; the check takes seconds on a GPU. Raises BadFileError for an
    unreadable or hostile image, and passes on the model loader's errors. Writes nothing but
    the hash cache and the library index; a verified fix is not remembered as a profile.
    """
    progress = on_progress or no_progress
    cancel = cancel or CancelToken()
    path = Path(path).expanduser()
    progress("Reading the image", 0, 1)
    tool_log = suspects.read_log(log) if log is not None else None
    record, status, figures = read_image(path, tool_log)
    made_by = record.made_by if record.made_by in MADE_BY else "unknown"
    if tool_log is not None and record.version is None and made_by in ("comfyui", "swarmui"):
        record.version = tool_log.version  # the record names none; the log's start does
    cancel.raise_if_cancelled()
    if model is not None:
        found = named_model(model, record)
    elif record.model or record.unet or record.model_hash:
        found = find_model(record, folders, on_progress=progress, cancel=cancel)
    else:
        from app.core import library

        found = ModelMatch(False, None, [str(f) for f in library.library_folders(folders)])
    explanation = Explanation(str(path), made_by, status, record, figures, found)
    explanation.log = tool_log
    not_listed = record.not_listed_note()  # a record's lists past MAX_LISTED, counted
    if not_listed:
        explanation.notes.append(not_listed)
    if status in (*suspects.LOOKS, "noise"):
        explanation.look_causes = suspects.suspects(
            status, made_by, record.run, record.version, tool_log
        )
    if status == "noise" and explanation.look_causes:
        explanation.notes.append(suspects.words(status, explanation.look_causes, record.run))
    if record.compiled:
        explanation.notes.append(FINDING_WORDS["compiled"].format(compiled=record.compiled))
    if record.prompt_upsampler:
        upsampler = record.prompt_upsampler
        explanation.notes.append(FINDING_WORDS["prompt_upsampler"].format(upsampler=upsampler))
    if record.attention:
        explanation.notes.append(kernels.suspect_words(made_by, record.attention))
    if record.caches:
        nodes, first = runtime.cache_nodes(record.caches), record.caches[0].node
        explanation.notes.append(
            runtime.RUNTIME_WORDS["cache_note"].format(nodes=nodes, first=first)
        )
    if found.note:
        explanation.notes.append(found.note)
    explanation.notes.extend(found.unread)
    if status not in CHECKED:
        if remake and found.found and status in REMADE_STATUSES:
            _remake(explanation, device, loaded, progress, cancel)
        elif remake and found.found:
            explanation.notes.append(REMAKE_WORDS["no_picture"])
        elif remake:
            explanation.notes.append(
                REMAKE_WORDS["asked_not_made"].format(why="its model was not found.")
            )
        elif status in suspects.LOOKS:
            explanation.notes.append(REMAKE_WORDS["look_offer"])
        explanation.message = _status_words(explanation)
        return explanation
    if remake:
        explanation.notes.append(REMAKE_WORDS["checked_instead"])
    if not found.found:
        named = bool(record.model or record.unet or record.model_hash)
        explanation.next_steps = next_steps.plan(record, status, figures, add_folder=named)
        explanation.message = " ".join(
            [_status_words(explanation), _not_found_words(record, found, explanation.next_steps)]
        )
        return explanation
    _run_check(explanation, device, loaded, measure_cost, progress, cancel)
    return explanation


def _image_vae(explanation: Explanation, ran: str):
    """The VAE the image's record names, found beside its model or in the VAE folders; None
    for the model's own (a note says so where the named one was not found: `ran` is what
    then ran with the model's own, "the check ran")."""
    record, model_path = explanation.record, explanation.model.path
    if not record.vae or model_path is None:
        return None
    vae = find_vae(record.vae, model_path, explanation.model.vaes, explanation.model.roots or None)
    if vae is None and record.vae.lower() not in ("none", "automatic", "baked vae"):
        explanation.notes.append(
            f"The image used the VAE {record.vae}, which was not found next to the model; "
            f"{ran} with the model's own VAE."
        )
    return vae


def _same_file(a, b) -> bool:
    return b is not None and Path(a).resolve() == Path(b).resolve()


def _image_model(explanation: Explanation, vae, loaded, progress, cancel, *, who: str):
    """The image's model: `loaded` where it is the file found and runs the VAE asked (its own,
    or the file it was loaded with: a split transformer's `ae`), else the file loaded. None, with the message saying why, for a model file that fails."""
    from app.core.models import load_model

    model_path = explanation.model.path
    assert model_path is not None  # a found model has its path
    if (
        loaded is not None
        and str(getattr(loaded, "source", "")) not in ("", "demo")
        and Path(loaded.source).resolve() == Path(model_path).resolve()
        and (vae is None or _same_file(vae, loaded.vae or loaded.companions.get("vae")))
    ):
        return loaded  # never a second copy of the model the engine holds
    try:
        return load_model(model_path, vae=vae, on_progress=progress, cancel=cancel)
    except WrongVariantError as error:
        # Weights and config of two variants: that, before anything about numbers.
        explanation.variant = error.variant
        explanation.variant_words = _config_variant_words(explanation, error.variant)
        explanation.notes.append(str(error))
        explanation.message = f"{explanation.variant_words} {_status_words(explanation)}"
        return None
    except BadFileError as error:
        # The image was read; it is the model file that failed.
        explanation.notes.append(str(error))
        explanation.message = (
            f"{_status_words(explanation)} Its model was found at {model_path}, but "
            f"{who} could not load it: {error.problem}"
        )
        return None


def _remake(explanation: Explanation, device, loaded, progress, cancel) -> None:
    """Make the image again from its record and compare (`remake`); a file that is the
    picture's negative becomes "inverted", its cause the tool's memory (`state`)."""
    from app.core.explain import remake as remaking

    record = explanation.record
    tool = TOOLS.get(explanation.made_by)
    tool_name = tool.name if tool else "the tool that made it"
    why = remaking.missing(record)
    if why is not None:
        explanation.notes.append(REMAKE_WORDS["asked_not_made"].format(why=why + "."))
        return
    vae = _image_vae(explanation, "it was made again")
    model = _image_model(explanation, vae, loaded, progress, cancel, who="HalfSafe")
    if model is None:
        return
    _apply_image_loras(explanation, model)
    state = runtime.state_words(explanation.made_by, tool_name, record.version)
    try:
        with said_as_sentence("making the image again"):
            remade = remaking.remake(
                record,
                Path(explanation.path),
                model,
                precision=_reproduced_precision(record),
                device=device,
                tool_name=tool_name,
                state_words=state,
                look=explanation.status if explanation.status in suspects.LOOKS else None,
                on_progress=progress,
                cancel=cancel,
            )
    except HalfSafeError as error:  # a record HalfSafe cannot make again as it stands
        if isinstance(error, CancelledError):
            raise
        explanation.notes.append(REMAKE_WORDS["asked_not_made"].format(why=str(error)))
        return
    take_remade(explanation, remade, state)


def take_remade(explanation: Explanation, remade: Remade, state: str) -> None:
    """What the image made again proves, taken into the explanation: a file that is the
    picture's negative is "inverted" (its cause the tool's memory, `state` its words); a box of
    noise a pass left is "noise_region"; another picture is a note."""
    from app.core.causes.records import Cause

    explanation.remade = remade
    if remade.note:
        explanation.notes.append(remade.note)
    if explanation.status in suspects.LOOKS:
        first = explanation.look_causes[0] if explanation.look_causes else None
        if remade.look is None and first is not None:
            # The model draws a picture here: the first fast path the record shows is the
            # likely cause; nothing of the tool's was run, so nothing is verified.
            explanation.cause = Cause(
                first.cause, None, f"{remade.words} {first.words}", first.switch, "none", False
            )
        return
    if remade.verdict == "inverted":
        explanation.status = "inverted"
        explanation.cause = Cause(
            "state",
            "vae",
            remade.words,
            state,
            "none",  # the tool's memory, restarted or switched there; nothing HalfSafe sets
            verified=True,  # made again here, freshly loaded: the right picture
        )
    elif remade.verdict == "pass_noise":
        explanation.status = "noise_region"  # a pass's box, proved by the picture made again
    elif remade.verdict != "matches":
        explanation.notes.append(remade.words)


def _fix_the_tool_can_apply(fix, tool: str) -> dict[str, Any]:
    """The check's fix as settings, or, when the tool that made the image has no switch for it
    (a layer-level fix: no other tool keeps single layers wider), per failing component the
    best verified candidate that tool can apply (the checks's ranking decides which)."""
    chosen = dict(fix.settings)
    if tool == "halfsafe" or in_tool_terms(tool, chosen, []).covered:
        return chosen
    settings: dict[str, Any] = {}
    for component in dict.fromkeys(c.component for c in fix.candidates):
        usable = [
            c
            for c in fix.candidates
            if c.component == component
            and c.verified
            and in_tool_terms(tool, c.settings, []).covered
        ]
        if not usable:
            return chosen
        settings.update(usable[0].settings)
    return settings


def _apply_image_loras(explanation, model) -> None:
    """The LoRAs the image's prompt names (`<lora:name:weight>`), looked up beside its model
    and in the Lora folders; one that is missing or does not load is a note, and the check runs
    without it."""
    from app.core.lora.files import (
        LoraRequest,
        OutsideModelFoldersError,
        find_lora,
        load_requested,
        prompt_loras_quiet,
    )

    requests = []
    # ComfyUI applies LoRAs by its loader nodes; "<lora:...>" in its prompt is only text.
    prompt = "" if explanation.made_by == "comfyui" else explanation.record.prompt or ""
    for tag in prompt_loras_quiet(prompt):
        try:
            requests.append(
                LoraRequest(
                    str(
                        find_lora(tag.path, explanation.model.path, explanation.model.roots or None)
                    ),
                    tag.weight,
                )
            )
        except OutsideModelFoldersError as refused:
            explanation.notes.append(f"{refused} The check ran without it.")
        except HalfSafeError:
            explanation.notes.append(
                f"The image used the LoRA {tag.path}, which was not found beside its model or "
                "in the Lora folders; the check ran without it."
            )
    try:
        load_requested(model, requests)
    except HalfSafeError as error:
        explanation.notes.append(f"{error} The check ran without the image's LoRAs.")
        load_requested(model, [])


def _run_check(explanation, device, loaded, measure_cost, progress, cancel) -> None:
    from app.core import health
    from app.core.causes import check_and_attribute
    from app.core.lora.files import strip_tags
    from app.core.settings import FIELDS

    record = explanation.record
    vae = _image_vae(explanation, "the check ran")
    model = _image_model(explanation, vae, loaded, progress, cancel, who="the health check")
    if model is None:
        return
    _tool_variant(explanation, model)
    steps = record.steps
    try:
        steps = FIELDS["steps"].validate(steps) if steps is not None else None
    except ValueError:
        steps = None
    if record.sampler and record.scheduler is None:
        refused = samplers.refusal(record.sampler) or (
            f"HalfSafe does not run the sampler {record.sampler}."
        )
        explanation.notes.append(
            f"{refused} The check probed the schedule of "
            f"{samplers.words(FIELDS['scheduler'].default)} at the same step count."
        )
    elif record.schedule_note:
        explanation.notes.append(
            f"{record.schedule_note} The check probed that schedule at the same step count."
        )
    _apply_image_loras(explanation, model)
    size = _probe_size(record, model.native_size)
    explanation.notes.extend(_size_notes(record, size))
    clip_skip = _clip_skip(explanation, model)
    with said_as_sentence("checking the image's model"):
        report = check_and_attribute(
            model,
            health.CheckRequest(
                precision=_reproduced_precision(record),
                device=device,
                size=size,
                # The image's own step count; else the model's own where it states one.
                steps=steps or _own_steps(model, health.DEFAULT_STEPS),
                scheduler=record.scheduler or health.DEFAULT_SCHEDULER,
                clip_skip=clip_skip,
                prompt=strip_tags(record.prompt or "").strip() or health.DEFAULT_PROMPT,
                pixel_upscale=bool(record.hires_size) and _enlarges_pixels(record.hires_upscaler),
            ),
            # The image's recorded settings, exactly: a fix remembered since would hide
            # what made it black.
            run=health.CheckRun(remember=False, measure_cost=measure_cost, use_remembered=False),
            on_progress=progress,
            cancel=cancel,
        )
    explanation.check = report
    if report.verdict == "healthy":
        _compare_kitchen(explanation, report)
        if record.safety_checker is not None and explanation.cause is None:
            # The record says a checker was on, and the model runs clean: the checker's.
            explanation.status = "safety_checker"
    if record.caches and report.verdict in ("fixable", "broken"):
        explanation.notes.append(
            runtime.RUNTIME_WORDS["cache_reproduced"].format(
                nodes=runtime.cache_nodes(record.caches)
            )
        )
    if report.fix is not None and report.verdict == "fixable":
        settings = _fix_the_tool_can_apply(report.fix, explanation.made_by)
        explanation.halfsafe_flags = [
            f for f in (health.flag(k, v) for k, v in settings.items()) if f
        ]
        explanation.tool_fix = in_tool_terms(
            explanation.made_by, settings, explanation.halfsafe_flags
        )
        explanation.notes.extend(explanation.tool_fix.notes)
        explanation.node_fix = node_fix_for(
            explanation.path,
            explanation.made_by,
            record,
            report.fix,
            settings,
            explanation.tool_fix.flags,
        )
    said = [_status_words(explanation), _check_words(explanation)]
    if explanation.variant_words:
        said.insert(0, explanation.variant_words)
    explanation.message = " ".join(said)


def _tool_variant(explanation: Explanation, model) -> None:
    """For an image another tool made, a model file of a later published variant than its
    family's first (Anima 2.9B's 40 blocks): what a loader that knows only the first builds
    (`families.variants`). HalfSafe reads the count from the file, so its check cannot show it."""
    from app.core.families.variants import older_loader

    family = family_of(model.pipeline)
    if family is None or explanation.made_by == "halfsafe" or not family.variants:
        return
    denoiser = getattr(model.pipeline, family.denoiser, None)
    config = getattr(denoiser, "config", None)
    found = older_loader(family.variants, family.denoiser, dict(config or {}))
    if found is None:
        return
    mine, variant = found
    tool = TOOLS.get(explanation.made_by)
    explanation.variant = variant
    explanation.variant_words = FINDING_WORDS["variant_tool"].format(
        mine=mine.title,
        first=variant.config,
        in_file=variant.in_file,
        in_config=variant.in_config,
        unit="block",
        where=variant.where,
        tool=tool.name if tool else "the tool",
    )


def _compare_kitchen(explanation: Explanation, report) -> None:
    """comfy-kitchen's kernels against PyTorch's own on the check's device, for an image from
    a tool that runs them (`kitchen`): a kernel at fault is the cause; else a note."""
    from app.core.explain import kitchen
    from app.core.fixing.quality import QUALITY_THRESHOLD_DB

    device = report.plan.device
    architecture = report.model.architecture
    finding = kitchen.examine(explanation.made_by, architecture, device, QUALITY_THRESHOLD_DB)
    if finding is None:
        return
    explanation.kitchen = finding
    name = TOOLS[explanation.made_by].name
    explanation.cause = kitchen.cause(finding, explanation.made_by, name, report.device.name)
    explanation.notes.extend(kitchen.notes(finding, name))
