"""The generation record an image carries, as each tool writes it: A1111-style infotext
(AUTOMATIC1111, Forge, SD.Next, HalfSafe), SwarmUI's JSON parameters, ComfyUI's prompt and
workflow graphs, InvokeAI's metadata; bounded in JSON depth and node count."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core import samplers
from app.core.errors import BadFileError
from app.core.explain import checkers, kernels, regions, runtime, saved_chain, suspects
from app.core.explain.image_file import MAX_TEXT_CHUNK_BYTES
from app.core.settings.values import SettingValue
from app.core.words import infotext
from app.core.words.infotext import read_float, read_int, read_text

MAX_JSON_DEPTH = 64
MAX_NODES = 20_000  # ComfyUI graph nodes read
MAX_UPSCALE = 16.0  # a recorded upscale past this is not a size any tool drew
# Entries of one list a record keeps (attention kernels, step caches, second passes, low-bit
# files, inpainting samplers): a real graph has a few of each, and a graph of 20,000 such nodes
# would fill a report with megabytes of names.
MAX_LISTED = 16

# {count}: entries left out; {lists}: which lists, in words.
RECORD_WORDS = {
    "not_listed": (
        "The image's record names {count:,} more {lists} than HalfSafe lists here (it keeps "
        "the first {shown} of each)."
    ),
}
# A list of the record (by its name in `not_listed`) -> how it is named in a sentence.
_LIST_WORDS = {
    "attention_kernels": "attention kernels",
    "step_caches": "step caches",
    "second_passes": "passes over a region",
    "low_bit_files": "low-bit files",
    "inpaint_samplers": "inpainting samplers",
}

# The text chunks each tool writes.
TEXT_KEYS = ("parameters", "prompt", "workflow", "invokeai_metadata", "sd-metadata")


@dataclass
class Record:
    """What the image says about how it was made. Every field may be missing."""

    made_by: str = "unknown"
    model: str | None = None  # a checkpoint name, path or stem as the tool wrote it
    model_hash: str | None = None  # A1111 short (10 hex), old (8 hex) or full sha256
    unet: str | None = None  # ComfyUI's unet_name (a denoiser-only file)
    vae: str | None = None
    sampler: str | None = None  # the tool's own words
    scheduler: str | None = None  # HalfSafe's scheduler when the sampler maps to one
    # One sentence when `scheduler` is the closest HalfSafe runs, not the schedule recorded
    # (one it does not run, or one the sampler does not take in diffusers); None otherwise.
    schedule_note: str | None = None
    steps: int | None = None
    cfg: float | None = None
    # A guidance-distilled model's guidance (Forge's "Distilled CFG Scale", ComfyUI's
    # FluxGuidance node): what HalfSafe's CFG scale is for such a model (`remake`).
    guidance: float | None = None
    seed: int | None = None
    width: int | None = None
    height: int | None = None
    prompt: str = ""
    negative_prompt: str = ""
    # Where the starting noise was made ("cpu", "gpu", "nv"; None: not known): a seed makes the
    # same noise only from the same source (`remake`).
    noise_source: str | None = None
    # The first pass's denoise where it started from a picture (below 1: image-to-image).
    denoise: float | None = None
    # The node of a graph that inverts the decoded picture itself (ComfyUI's ImageInvert) on the
    # chain from the file's saver back to its decoder (`saved_chain`), "".
    inverts: str = ""
    # That node where the graph saves the picture and its negative and the file may be either.
    inverts_unsure: str = ""
    version: str | None = None
    halfsafe_status: str | None = None  # HalfSafe's own "NaN watch" entry
    precision: dict[str, SettingValue] = field(
        default_factory=dict
    )  # settings recorded by HalfSafe
    device_name: str | None = None  # the device HalfSafe made it on
    # The torch.compile step the record shows ran ("TorchCompileModel (inductor)"), or None.
    # Only ComfyUI records it (its graph holds the node); A1111, Forge, Forge Neo (whose
    # "Torch Compile Integrated" panel writes nothing into the infotext) and the others do not.
    compiled: str | None = None
    # The attention kernels the record shows ran (ComfyUI's Sage nodes; `explain.kernels`).
    attention: list[kernels.RecordedKernel] = field(default_factory=list)
    # The model's family as the tool states it: InvokeAI's model base ("sdxl", "sd-2", ...) or
    # the diffusers pipeline SD.Next names ("StableDiffusionXLPipeline"); None elsewhere.
    base: str | None = None
    clip_skip: int | None = None  # A1111's "Clip skip"; ComfyUI's CLIPSetLastLayer, negated
    # A hires fix or a second sampler at a larger size: the (width, height) that pass drew and
    # the VAE decoded, and how the first picture was enlarged, in the tool's words.
    hires_size: tuple[int, int] | None = None
    hires_upscaler: str | None = None
    # The step caches the record shows ran (ComfyUI's cache nodes, an extension's infotext
    # keys; `explain.runtime`).
    caches: list[runtime.RecordedCache] = field(default_factory=list)
    # The passes over one region the record shows ran (ADetailer, FaceDetailer; `regions`).
    second_passes: list[regions.SecondPass] = field(default_factory=list)
    # A safety checker the record shows was on (ComfyUI's Safety Checker node; `checkers`).
    safety_checker: checkers.RecordedChecker | None = None
    # The fast paths the record shows ran: low-bit files, Qwen-Image 2.1's prefix cache,
    # LanPaint's samplers (`suspects`).
    run: suspects.RunRecord = field(default_factory=suspects.RunRecord)
    # The graph's prompt upsampler (an LLM that wrote the prompt out before it was encoded:
    # FLUX.3's), its node and file in words, or None.
    prompt_upsampler: str | None = None
    # Entries left out of each list past MAX_LISTED, by the list's name in `to_json`.
    not_listed: dict[str, int] = field(default_factory=dict)

    def not_listed_note(self) -> str | None:
        """One sentence on the entries left out of the record's lists, or None."""
        if not self.not_listed:
            return None
        lists = [_LIST_WORDS[name] for name in self.not_listed]
        return RECORD_WORDS["not_listed"].format(
            count=sum(self.not_listed.values()),
            lists=lists[0] if len(lists) == 1 else ", ".join(lists[:-1]) + " and " + lists[-1],
            shown=MAX_LISTED,
        )

    def to_json(self) -> dict[str, Any]:
        keys = ("model", "model_hash", "unet", "vae", "sampler", "steps", "cfg", "guidance", "seed")
        document = {k: getattr(self, k) for k in keys}
        document["size"] = [self.width, self.height] if self.width and self.height else None
        document["version"] = self.version
        document["compiled"] = self.compiled
        document["attention_kernels"] = [k.to_json() for k in self.attention]
        document["clip_skip"] = self.clip_skip
        document["hires_size"] = list(self.hires_size) if self.hires_size else None
        document["hires_upscaler"] = self.hires_upscaler
        document["step_caches"] = [c.to_json() for c in self.caches]
        document["second_passes"] = [p.to_json() for p in self.second_passes]
        checker = self.safety_checker
        document["safety_checker"] = checker.to_json() if checker is not None else None
        document["noise_source"] = self.noise_source
        document["denoise"] = self.denoise
        document["inverts"] = self.inverts or None
        document["inverts_unsure"] = self.inverts_unsure or None
        document.update(self.run.to_json())
        document["prompt_upsampler"] = self.prompt_upsampler
        document["not_listed"] = dict(self.not_listed)
        return document


def read_record(path: str | Path, text: dict[str, str]) -> Record:
    """The generation record from a PNG's text chunks; `made_by` says which tool wrote it.

    Order: HalfSafe's own pairs, SwarmUI's JSON `parameters`, ComfyUI's `prompt`/`workflow`,
    InvokeAI's `invokeai_metadata` (or its older `sd-metadata`), then A1111-style infotext
    (Forge when its Version starts with "f" and a digit, SD.Next when it names itself or writes
    its own keys). Each list keeps its first MAX_LISTED entries, the rest counted in
    `not_listed`. Raises BadFileError when a chunk a tool reads is malformed or hostile.
    """
    return _bounded(_read_record(Path(path), text))


def _bounded(record: Record) -> Record:
    """`record` with each of its lists cut to its first MAX_LISTED entries, what was cut
    counted in `not_listed`, so that what a record can make HalfSafe print is bounded."""
    lists = (
        ("attention_kernels", record, "attention"),
        ("step_caches", record, "caches"),
        ("second_passes", record, "second_passes"),
        ("low_bit_files", record.run, "low_bit_files"),
        ("inpaint_samplers", record.run, "inpaint_samplers"),
    )
    for name, owner, attribute in lists:
        entries = getattr(owner, attribute)
        if len(entries) > MAX_LISTED:
            record.not_listed[name] = len(entries) - MAX_LISTED
            setattr(owner, attribute, entries[:MAX_LISTED])
    return record


def _read_record(path: Path, text: dict[str, str]) -> Record:
    parameters = text.get("parameters")
    record = None
    if parameters is not None:
        if parameters.lstrip().startswith("{"):
            try:
                data = _json(path, "parameters", parameters)
            except BadFileError:
                data = None  # infotext whose prompt opens a brace ("{red|blue} car")
            if isinstance(data, dict) and isinstance(data.get("sui_image_params"), dict):
                return _swarm_record(data["sui_image_params"])
        record = _infotext_record(parameters)
        if record.made_by == "halfsafe":
            return record
    if "prompt" in text or "workflow" in text:
        comfy = _comfy_record(path, text.get("prompt"), text.get("workflow"))
        if comfy.model or comfy.unet or record is None:
            return comfy
    if "invokeai_metadata" in text:
        return _invoke_record(_json(path, "invokeai_metadata", text["invokeai_metadata"]))
    if "sd-metadata" in text:
        return _invoke_legacy_record(_json(path, "sd-metadata", text["sd-metadata"]))
    return record or Record()


# A JSON string, escapes included; what is left once they are blanked is structure.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


def json_depth(text: str) -> int:
    """How deep `text`'s brackets nest outside JSON strings: NumPy's running sum over the
    bracket bytes once strings are blanked. Measured on 8 MB (2-core EPYC): 40-60 ms for
    ordinary text, 0.6 s for an unterminated string (the pattern backtracks once through it),
    where a Python loop over the characters takes over a second."""
    import numpy as np

    structure = _JSON_STRING.sub('""', text).encode("utf-8", errors="replace")
    codes = np.frombuffer(structure, dtype=np.uint8)
    # "[" and "{" are 0x5B and 0x7B, "]" and "}" 0x5D and 0x7D: bit 5 aside, one byte each.
    folded = codes | 0x20
    steps = (folded == 0x7B).astype(np.int8) - (folded == 0x7D)
    return int(np.cumsum(steps, dtype=np.int32).max()) if steps.size else 0


def _json(path: Path, chunk: str, text: str) -> Any:
    """JSON from a chunk, refused when nested deeper than MAX_JSON_DEPTH (the depth is measured
    before parsing, so a hostile nesting never reaches the parser's recursion)."""
    if json_depth(text) > MAX_JSON_DEPTH:
        raise BadFileError(
            path,
            f"its {chunk!r} chunk nests JSON deeper than {MAX_JSON_DEPTH} levels; it is not read.",
        )
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise BadFileError(path, f"its {chunk!r} chunk is not valid JSON.") from None


# The precision settings an image's record carries into the check (see _reproduced_precision).
_REPRODUCED_SETTINGS = (
    infotext.PRECISION,
    *infotext.COMPONENT_PRECISION.values(),
    infotext.UPCAST_ATTENTION,
    infotext.ATTENTION_BACKEND,
    infotext.TF32,
    infotext.FP16_REDUCED_PRECISION_REDUCTION,
    infotext.FP16_ACCUMULATION,
    infotext.ATTENTION_REDUCED_PRECISION,
    infotext.FP32_LAYERS,
    infotext.BF16_LAYERS,
    infotext.CLAMPED_LAYERS,
)


def _infotext_record(text: str) -> Record:
    parsed = infotext.parse(text[:MAX_TEXT_CHUNK_BYTES])
    version = parsed.get(infotext.VERSION)
    if infotext.HALFSAFE in parsed:
        made_by = "halfsafe"
        version = parsed.get(infotext.HALFSAFE)
    elif (parsed.raw(infotext.APP) or "").lower().startswith("sd.next") or any(
        key in parsed for key in (infotext.PIPELINE, infotext.OPERATIONS)
    ):
        made_by = "sdnext"
    elif version and re.match(r"f\d", version):
        made_by = "forge"
    elif parsed.pairs:
        made_by = "a1111"
    else:
        made_by = "unknown"
    width, height = parsed.get(infotext.SIZE, (None, None))
    record = Record(
        made_by=made_by,
        model=parsed.get(infotext.MODEL),
        model_hash=parsed.get(infotext.MODEL_HASH),
        vae=parsed.get(infotext.VAE),
        sampler=parsed.get(infotext.SAMPLER),
        scheduler=parsed.scheduler(),
        steps=parsed.get(infotext.STEPS),
        cfg=parsed.get(infotext.CFG_SCALE),
        guidance=parsed.get(infotext.DISTILLED_CFG_SCALE),
        seed=parsed.get(infotext.SEED),
        width=width,
        height=height,
        prompt=parsed.prompt[:4096],
        negative_prompt=parsed.negative_prompt[:4096],
        noise_source=_infotext_noise(made_by, parsed.raw(infotext.RNG)),
        version=version,
    )
    record.schedule_note = samplers.read(
        parsed.raw(infotext.SAMPLER), parsed.raw(infotext.SCHEDULE_TYPE)
    )[1]
    record.clip_skip = parsed.get(infotext.CLIP_SKIP)
    record.hires_size, record.hires_upscaler = _a1111_hires(parsed, width, height)
    if record.hires_size is None:  # a denoising strength without a hires fix: image-to-image
        record.denoise = parsed.get(infotext.DENOISING_STRENGTH)
    record.caches = runtime.from_infotext_keys(parsed.pairs)
    record.second_passes = regions.from_infotext(parsed.pairs)
    record.run = suspects.from_names([record.model])
    if made_by == "sdnext":
        record.base = parsed.get(infotext.PIPELINE)
    if made_by == "halfsafe":
        record.halfsafe_status = parsed.raw(infotext.NAN_WATCH)
        record.precision = parsed.settings(_REPRODUCED_SETTINGS)
        record.device_name = parsed.get(infotext.DEVICE_NAME)
    return record


def _a1111_hires(
    parsed: infotext.Infotext, width: int | None, height: int | None
) -> tuple[tuple[int, int] | None, str | None]:
    """A1111's and Forge's hires fix: the second pass's size (`Hires resize`, else `Size`
    times `Hires upscale`, as A1111 sizes it) and its upscaler, or (None, None)."""
    upscaler = parsed.get(infotext.HIRES_UPSCALER)
    resize = parsed.get(infotext.HIRES_RESIZE)
    if resize and min(resize) > 0:
        return (resize[0], resize[1]), upscaler
    scale = parsed.get(infotext.HIRES_UPSCALE)
    if scale is None or not width or not height or not 1.0 < scale <= MAX_UPSCALE:
        return None, None
    return (int(width * scale) // 8 * 8, int(height * scale) // 8 * 8), upscaler


def _infotext_noise(made_by: str, written: str | None) -> str | None:
    """Where an infotext image's starting noise was made: HalfSafe's on the CPU; A1111's and
    Forge's on the GPU unless their `RNG` says otherwise (their default, "GPU", is not written);
    another tool's as its `RNG` says, else unknown."""
    if made_by == "halfsafe":
        return "cpu"
    if written is not None and written.strip().lower() in ("cpu", "gpu", "nv"):
        return written.strip().lower()
    return "gpu" if made_by in ("a1111", "forge") else None


def _swarm_record(params: dict[str, Any]) -> Record:
    scheduler, note = samplers.read(
        read_text(params.get("sampler")), read_text(params.get("scheduler"))
    )
    record = Record(
        made_by="swarmui",
        model=read_text(params.get("model")),
        vae=read_text(params.get("vae")),
        sampler=read_text(params.get("sampler")),
        scheduler=scheduler,
        schedule_note=note,
        steps=read_int(params.get("steps")),
        cfg=read_float(params.get("cfgscale")),
        seed=read_int(params.get("seed")),
        width=read_int(params.get("width")),
        height=read_int(params.get("height")),
        prompt=read_text(params.get("prompt")) or "",
        version=read_text(params.get("swarm_version"), 100),
    )
    record.run = suspects.from_names([record.model])
    return record


def _comfy_nodes(prompt: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(class_type, inputs) of each node of a ComfyUI API prompt, at most MAX_NODES."""
    if not isinstance(prompt, dict):
        return
    for count, node in enumerate(prompt.values()):
        if count >= MAX_NODES:
            return
        if isinstance(node, dict) and isinstance(node.get("inputs"), dict):
            yield str(node.get("class_type", ""))[:200], node["inputs"]


# The UI workflow's widgets_values, in the order ComfyUI's nodes declare their widgets.
_WORKFLOW_WIDGETS = {
    "CheckpointLoaderSimple": ("ckpt_name",),
    "CheckpointLoader": ("config_name", "ckpt_name"),
    "UNETLoader": ("unet_name", "weight_dtype"),
    "VAELoader": ("vae_name",),
    "KSampler": ("seed", "control_after_generate", "steps", "cfg", "sampler_name", "scheduler"),
    "EmptyLatentImage": ("width", "height", "batch_size"),
    "CLIPSetLastLayer": ("stop_at_clip_layer",),
    "LatentUpscale": ("upscale_method", "width", "height", "crop"),
    "LatentUpscaleBy": ("upscale_method", "scale_by"),
    "ImageScale": ("upscale_method", "width", "height", "crop"),
    "ImageScaleBy": ("upscale_method", "scale_by"),
    "UpscaleModelLoader": ("model_name",),
}


def _workflow_nodes(workflow: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(workflow, dict) or not isinstance(workflow.get("nodes"), list):
        return
    for node in workflow["nodes"][:MAX_NODES]:
        if not isinstance(node, dict):
            continue
        kind = str(node.get("type", ""))[:200]
        values = node.get("widgets_values")
        names = _WORKFLOW_WIDGETS.get(kind)
        if names and isinstance(values, list):
            yield kind, dict(zip(names, values, strict=False))


# ComfyUI's node that runs the model through torch.compile (comfy_extras/nodes_torch_compile.py:
# TorchCompileModel, its one widget the backend, "inductor" or "cudagraphs"); custom node packs
# name theirs alike (TorchCompileModelFluxAdvanced, ...).
_COMPILE_NODE = "torchcompile"
# A UI workflow node's mode: 2 muted, 4 bypassed; neither ran.
_SKIPPED_MODES = (2, 4)


def _compile_node(prompt: Any, workflow: Any) -> str | None:
    """The torch.compile node of a ComfyUI graph, in words: from the API prompt (what ran)
    when there is one, else from the UI workflow's nodes that were neither muted nor bypassed."""
    found: list[tuple[str, Any]] = []
    if prompt is not None:
        found = [
            (kind, inputs.get("backend"))
            for kind, inputs in _comfy_nodes(prompt)
            if _COMPILE_NODE in kind.lower()
        ]
    elif isinstance(workflow, dict) and isinstance(workflow.get("nodes"), list):
        for node in workflow["nodes"][:MAX_NODES]:
            if not isinstance(node, dict) or node.get("mode") in _SKIPPED_MODES:
                continue
            kind = str(node.get("type", ""))[:200]
            values = node.get("widgets_values")
            if _COMPILE_NODE in kind.lower():
                found.append((kind, values[0] if isinstance(values, list) and values else None))
    if not found:
        return None
    kind, backend = found[0]
    backend = read_text(backend, 40)
    return f"{kind} ({backend})" if backend else kind


def _comfy_record(path: Path, prompt_text: str | None, workflow_text: str | None) -> Record:
    nodes: list[tuple[str, dict[str, Any]]] = []
    prompt = workflow = None
    if prompt_text is not None:
        prompt = _json(path, "prompt", prompt_text)
        nodes = list(_comfy_nodes(prompt))
    if not any(_loader_name(inputs) for _kind, inputs in nodes) and workflow_text is not None:
        workflow = _json(path, "workflow", workflow_text)
        nodes = list(_workflow_nodes(workflow))
    # ComfyUI draws a KSampler's starting noise on the CPU from its seed (comfy/sample.py).
    record = Record(made_by="comfyui", noise_source="cpu", compiled=_compile_node(prompt, workflow))
    record.attention = (
        kernels.from_comfy_prompt(_comfy_nodes(prompt))
        if prompt is not None
        else kernels.from_comfy_workflow(workflow, MAX_NODES)
    )
    record.caches = (
        runtime.from_comfy_prompt(_comfy_nodes(prompt))
        if prompt is not None
        else runtime.from_comfy_workflow(workflow, MAX_NODES)
    )
    record.run = (
        suspects.from_comfy_prompt(_comfy_nodes(prompt))
        if prompt is not None
        else suspects.from_comfy_workflow(workflow, MAX_NODES)
    )
    record.prompt_upsampler = _upsampler_node(_comfy_nodes(prompt))
    record.second_passes = regions.from_comfy_prompt(prompt)
    record.safety_checker = checkers.from_comfy_prompt(_comfy_nodes(prompt)) if prompt else None
    if prompt is None and isinstance(workflow, dict) and isinstance(workflow.get("nodes"), list):
        record.second_passes = regions.from_comfy_workflow(workflow["nodes"][:MAX_NODES])
        record.safety_checker = checkers.from_comfy_workflow(workflow["nodes"][:MAX_NODES])
    if workflow is None and workflow_text is not None:
        try:
            workflow = _json(path, "workflow", workflow_text)
        except BadFileError:
            workflow = None  # the prompt is the record; the UI graph only gives the version
    record.version = runtime.comfy_version(workflow, MAX_NODES)
    for kind, inputs in nodes:
        record.model = record.model or read_text(inputs.get("ckpt_name"), 1024)
        record.unet = record.unet or read_text(inputs.get("unet_name"), 1024)
        record.vae = record.vae or read_text(inputs.get("vae_name"), 1024)
        if kind.startswith("KSampler") and record.steps is None:
            denoise = read_float(inputs.get("denoise"))
            record.denoise = denoise if denoise is not None and denoise < 1.0 else None
            record.steps = read_int(inputs.get("steps"))
            record.cfg = read_float(inputs.get("cfg"))
            record.seed = read_int(inputs.get("seed", inputs.get("noise_seed")))
            record.sampler = read_text(inputs.get("sampler_name"), 100)
            schedule = read_text(inputs.get("scheduler"), 100)
            record.scheduler, record.schedule_note = samplers.read(record.sampler, schedule)
            if record.sampler and schedule:
                record.sampler = f"{record.sampler} ({schedule})"
        if kind.startswith("Empty") and "Latent" in kind and record.width is None:
            record.width, record.height = (
                read_int(inputs.get("width")),
                read_int(inputs.get("height")),
            )
        if kind == "FluxGuidance" and record.guidance is None:
            record.guidance = read_float(inputs.get("guidance"))
        if kind == "CLIPSetLastLayer" and record.clip_skip is None:
            layer = read_int(inputs.get("stop_at_clip_layer"))
            record.clip_skip = -layer if layer is not None and layer < 0 else None
    record.hires_size, record.hires_upscaler = _comfy_second_pass(nodes, record)
    if isinstance(prompt, dict):
        record.prompt, record.negative_prompt = _comfy_texts(prompt)
        inversion = saved_chain.saved_inversion(prompt, path.name, MAX_NODES)
        record.inverts, record.inverts_unsure = inversion.inverts, inversion.unsure
    return record


# The samplers whose `positive` and `negative` inputs carry a graph's prompts.
_SAMPLERS = ("KSampler", "KSamplerAdvanced")


def _comfy_texts(prompt: dict[str, Any]) -> tuple[str, str]:
    """The prompt and negative prompt of a ComfyUI API prompt: the text of the nodes its first
    sampler's `positive` and `negative` inputs lead to, through conditioning nodes between
    (FluxGuidance, a ControlNet's apply: their `conditioning`, or `positive` and `negative`,
    inputs), "" where none is a text node."""

    def text(link: Any) -> str:
        for _ in range(8):  # a few conditioning nodes deep, never round a cycle
            if not (isinstance(link, list) and link and isinstance(link[0], (str, int))):
                return ""
            node = prompt.get(str(link[0]))
            inputs = node.get("inputs") if isinstance(node, dict) else None
            if not isinstance(inputs, dict):
                return ""
            found = read_text(inputs.get("text", inputs.get("text_g")), 4096)
            if found is not None:
                return found
            # A node that passes both prompts on (a ControlNet's advanced apply) gives the
            # positive as its output 0 and the negative as its output 1.
            side = "negative" if len(link) > 1 and link[1] == 1 else "positive"
            link = inputs.get("conditioning", inputs.get(side))
        return ""

    for node in list(prompt.values())[:MAX_NODES]:
        if isinstance(node, dict) and node.get("class_type") in _SAMPLERS:
            inputs = node.get("inputs")
            if isinstance(inputs, dict):
                return text(inputs.get("positive")), text(inputs.get("negative"))
    return "", ""


def _comfy_second_pass(
    nodes: list[tuple[str, dict[str, Any]]], record: Record
) -> tuple[tuple[int, int] | None, str | None]:
    """A ComfyUI graph's upscale between two samplers: the size the larger pass drew (an
    upscale node's width and height, else the empty latent's size times its `scale_by`s) and
    the upscale method or model, or (None, None) for one pass."""
    scale, size, method = 1.0, None, None
    for kind, inputs in nodes:
        if kind in ("LatentUpscaleBy", "ImageScaleBy"):
            factor = read_float(inputs.get("scale_by"))
            if factor is not None and 0.0 < factor <= MAX_UPSCALE:
                scale *= factor
                method = method or _upscale_words(kind, inputs)
        elif kind in ("LatentUpscale", "ImageScale"):
            width, height = read_int(inputs.get("width")), read_int(inputs.get("height"))
            if width and height and width > 0 and height > 0:
                size = (width, height)
                method = method or _upscale_words(kind, inputs)
        elif kind == "UpscaleModelLoader":
            method = method or read_text(inputs.get("model_name"), 200)
    if size is None and scale > 1.0 and record.width and record.height:
        size = (int(record.width * scale) // 8 * 8, int(record.height * scale) // 8 * 8)
    first = max(record.width or 0, record.height or 0)
    if size is None or max(size) <= first:
        return None, None
    return size, method


def _upscale_words(kind: str, inputs: dict[str, Any]) -> str | None:
    """ "bilinear" for a latent upscale; "lanczos (pixels)" for an image scale."""
    method = read_text(inputs.get("upscale_method"), 100)
    if method is None:
        return None
    return method if kind.startswith("Latent") else f"{method} (pixels)"


# What marks a graph's prompt upsampler: a node named for it (PromptUpsampler, a custom pack's
# Flux3PromptUpsample, ...), or a file of one whatever node loads it (Black Forest Labs names
# FLUX.3's upsampler "...-pup", prompt upsampler).
_UPSAMPLER_NODE = "upsampl"
_WEIGHTS = (".safetensors", ".gguf", ".sft", ".ckpt", ".pt", ".bin")
_UPSAMPLER_FILE = re.compile(r"(prompt[-_ ]?upsampler|[-_]pup)([-_.]|$)", re.IGNORECASE)


def _upsampler_node(nodes: Iterator[tuple[str, dict[str, Any]]]) -> str | None:
    """The prompt upsampler node of a ComfyUI API prompt (what ran), in words: its class and
    the file it names ("PromptUpsampler (flux-3-image-klein-pup.safetensors)"), or None."""
    for kind, inputs in nodes:
        files = [v for v in inputs.values() if isinstance(v, str) and v.endswith(_WEIGHTS)]
        named = [f for f in files if _UPSAMPLER_FILE.search(Path(f).stem + "_")]
        if _UPSAMPLER_NODE in kind.lower() or named:
            file = (named or files or [None])[0]
            return f"{kind} ({read_text(file, 300)})" if file else kind
    return None


def _loader_name(inputs: dict[str, Any]) -> bool:
    return any(isinstance(inputs.get(k), str) for k in ("ckpt_name", "unet_name"))


def _model_field(value: Any) -> tuple[str | None, str | None]:
    """InvokeAI's model entry: (name, hash) from a v4 dict, a v3 dict or a bare name."""
    if isinstance(value, dict):
        name = read_text(value.get("name")) or read_text(value.get("model_name"))
        return name, read_text(value.get("hash"), 200)
    return read_text(value), None


def _model_base(value: Any) -> str | None:
    """InvokeAI's model base: `base` in v4's model entry, `base_model` in v3's."""
    if isinstance(value, dict):
        return read_text(value.get("base"), 40) or read_text(value.get("base_model"), 40)
    return None


def _invoke_record(data: Any) -> Record:
    if not isinstance(data, dict):
        return Record(made_by="invokeai")
    model, model_hash = _model_field(data.get("model"))
    vae, _ = _model_field(data.get("vae"))
    sampler = read_text(data.get("scheduler"), 100)
    return Record(
        made_by="invokeai",
        model=model,
        model_hash=model_hash,
        vae=vae,
        sampler=sampler,
        scheduler=_INVOKE_SCHEDULERS.get(sampler or ""),
        steps=read_int(data.get("steps")),
        cfg=read_float(data.get("cfg_scale")),
        seed=read_int(data.get("seed")),
        width=read_int(data.get("width")),
        height=read_int(data.get("height")),
        prompt=read_text(data.get("positive_prompt")) or "",
        version=read_text(data.get("app_version"), 100),
        base=_model_base(data.get("model")),
    )


# InvokeAI's scheduler names (invokeai/backend/stable_diffusion/schedulers) that HalfSafe runs.
_INVOKE_SCHEDULERS = {
    "euler": "euler",
    "euler_a": "euler_a",
    "dpmpp_2m_k": "dpmpp_2m_karras",
    "ddim": "ddim",
}


def _invoke_legacy_record(data: Any) -> Record:
    if not isinstance(data, dict):
        return Record(made_by="invokeai")
    found = data.get("image")
    image: dict[str, Any] = found if isinstance(found, dict) else {}
    prompt = image.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        prompt = prompt[0].get("prompt")
    sampler = read_text(image.get("sampler"), 100)
    return Record(
        made_by="invokeai",
        model=read_text(data.get("model_weights")),
        model_hash=read_text(data.get("model_hash"), 200),
        sampler=sampler,
        scheduler=samplers.key_for(sampler),
        schedule_note=samplers.read(sampler)[1],
        steps=read_int(image.get("steps")),
        cfg=read_float(image.get("cfg_scale")),
        seed=read_int(image.get("seed")),
        width=read_int(image.get("width")),
        height=read_int(image.get("height")),
        prompt=read_text(prompt) or "",
    )
