"""Attention kernels an image's record shows its tool ran (SageAttention, chosen by a node in a
ComfyUI graph), and each tool's own switch to turn such a kernel off, in its terms.

What is and is not recorded (checked against each tool's source):
- ComfyUI: the launch flag `--use-sage-attention` (comfy/cli_args.py, beside
  `--use-pytorch-cross-attention` and `--disable-xformers`) is not in the image, but a node that
  patches attention is in the graph: KJNodes' "Patch Sage Attention KJ" (class
  `PathchSageAttentionKJ`, its `sage_attention` input `disabled`, `auto`,
  `sageattn_qk_int8_pv_fp16_cuda`, `..._fp8_cuda`, ...; kijai/ComfyUI-KJNodes
  nodes/model_optimization_nodes.py), KJNodes' `CheckpointLoaderKJ` and
  `DiffusionModelLoaderKJ` (the same `sage_attention` input, fifth widget), and other packs'
  Sage nodes (an `enable` switch, as ComfyUI-SageAttention3's).
- AUTOMATIC1111 (`--xformers`; Settings > Optimizations > "Cross attention optimization",
  modules/shared_options.py, written into no infotext), Forge Classic/Neo (SageAttention used
  when installed, `--disable-sage`, `--disable-xformers`, `--attention-pytorch` in
  ldm_patched/modules/args_parser.py of Haoming02/sd-webui-forge-classic), SD.Next and the
  others record no attention kernel in the image: nothing is read for them, and nothing is
  claimed.
Why it is a suspect: SageAttention's own Windows build notes (woct0rdho/SageAttention README)
say Wan and Qwen-Image "may produce black or noise output" with it, some values overflowing its
quantisation; ComfyUI issue 12138 shows it breaking Z-Image.

Plain data; no torch. Used by `records` (reading) and `explanation` (the words).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# A UI workflow node's mode: 2 muted, 4 bypassed; neither ran.
_SKIPPED_MODES = (2, 4)
# KJNodes' loaders take the kernel as their fifth widget (ckpt_name or model_name,
# weight_dtype, compute_dtype, patch_cublaslinear, sage_attention, ...).
_LOADER_SAGE_WIDGET = {"CheckpointLoaderKJ": 4, "DiffusionModelLoaderKJ": 4}
_OFF = ("disabled", "none", "off", "false")


@dataclass(frozen=True)
class RecordedKernel:
    """An attention kernel the image's record shows its tool ran."""

    kernel: str  # "sageattention"
    node: str  # the node as the graph names it: "PathchSageAttentionKJ"
    mode: str | None  # the node's choice: "auto", "sageattn_qk_int8_pv_fp8_cuda", or None

    def words(self) -> str:
        return f"{self.node} ({self.mode})" if self.mode else self.node

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "node": self.node, "mode": self.mode}


def _text(value: Any) -> str | None:
    return value[:100] if isinstance(value, str) else None


def _sage(kind: str, mode: Any, enable: Any) -> RecordedKernel | None:
    """A Sage node that ran: its mode is not `disabled` and its `enable` switch not off."""
    if enable is False or (isinstance(mode, str) and mode.strip().lower() in _OFF):
        return None
    if mode is False:
        return None
    return RecordedKernel("sageattention", kind[:200], _text(mode))


def from_comfy_prompt(nodes: Iterable[tuple[str, dict[str, Any]]]) -> list[RecordedKernel]:
    """The Sage attention nodes of a ComfyUI API prompt ((class_type, inputs) pairs: what
    ran): a node with a `sage_attention` input, or one whose class names Sage."""
    found = []
    for kind, inputs in nodes:
        if "sage_attention" in inputs or "sage" in kind.lower():
            hit = _sage(kind, inputs.get("sage_attention"), inputs.get("enable"))
            if hit is not None:
                found.append(hit)
    return found


def from_comfy_workflow(workflow: Any, max_nodes: int) -> list[RecordedKernel]:
    """The Sage attention nodes of a ComfyUI UI workflow that were neither muted nor bypassed;
    the mode read from the node's widgets (KJNodes' loaders: the fifth; a Sage node: its first
    text widget, or its first switch as `enable`)."""
    if not isinstance(workflow, dict) or not isinstance(workflow.get("nodes"), list):
        return []
    found = []
    for node in workflow["nodes"][:max_nodes]:
        if not isinstance(node, dict) or node.get("mode") in _SKIPPED_MODES:
            continue
        kind = str(node.get("type", ""))[:200]
        values = node.get("widgets_values")
        values = values if isinstance(values, list) else []
        if kind in _LOADER_SAGE_WIDGET:
            index = _LOADER_SAGE_WIDGET[kind]
            mode = values[index] if len(values) > index else None
            if mode is None:
                continue
            hit = _sage(kind, mode, None)
        elif "sage" in kind.lower():
            mode = next((v for v in values if isinstance(v, str)), None)
            enable = (
                next((v for v in values if isinstance(v, bool)), None) if mode is None else None
            )
            hit = _sage(kind, mode, enable)
        else:
            continue
        if hit is not None:
            found.append(hit)
    return found


# Each tool's switch that turns a kernel off, in its own terms (sources in the docstring).
_TURN_OFF = {
    ("comfyui", "sageattention"): (
        "set its sage_attention to disabled (or bypass the node with Ctrl+B), and start ComfyUI "
        "without --use-sage-attention if its launch command has it"
    ),
    ("swarmui", "sageattention"): (
        "set its sage_attention to disabled (or bypass the node), and remove "
        "--use-sage-attention from ExtraArgs in Server > Backends if it is there"
    ),
}


# comfy-kitchen's backends (`precision.fused`), keyed "comfy-kitchen:<backend>": ComfyUI turns
# `triton` on only with --enable-triton-backend, and --disable-triton-backend overrides it
# (comfy/cli_args.py, comfy/quant_ops.py); it runs `cuda` under a PyTorch built for CUDA 13 or
# newer and has no flag for it; comfy-kitchen keeps `hip` off with COMFY_KITCHEN_DISABLE_HIP=1
# (its backends/hip). SwarmUI passes ExtraArgs to the ComfyUI it starts.
_TURN_OFF.update(
    {
        ("comfyui", "comfy-kitchen:triton"): (
            "start ComfyUI without --enable-triton-backend, or with --disable-triton-backend "
            "(ComfyUI runs Triton only when started with --enable-triton-backend; without it, "
            "this backend was not the one that ran)"
        ),
        ("swarmui", "comfy-kitchen:triton"): (
            "remove --enable-triton-backend from ExtraArgs in Server > Backends, or add "
            "--disable-triton-backend there (without that flag, this backend did not run)"
        ),
        ("comfyui", "comfy-kitchen:cuda"): (
            "ComfyUI has no flag for comfy-kitchen's CUDA backend: it runs it under a PyTorch "
            "built for CUDA 13 or newer (under an older one it is already off, and was not the "
            "one that ran), so run ComfyUI on a PyTorch for CUDA 12.x to turn it off"
        ),
        ("swarmui", "comfy-kitchen:cuda"): (
            "its ComfyUI has no flag for comfy-kitchen's CUDA backend: it runs it under a "
            "PyTorch built for CUDA 13 or newer (under an older one it is already off), so give "
            "that ComfyUI a PyTorch for CUDA 12.x"
        ),
        ("comfyui", "comfy-kitchen:hip"): (
            "set COMFY_KITCHEN_DISABLE_HIP=1 in the environment ComfyUI starts in"
        ),
        ("swarmui", "comfy-kitchen:hip"): (
            "set COMFY_KITCHEN_DISABLE_HIP=1 in the environment SwarmUI starts its ComfyUI in"
        ),
    }
)


def backend_switch_words(tool: str, library: str, backend: str) -> str:
    """How to turn `library`'s `backend` off in `tool`, one clause; the library's own call
    where the tool has no switch HalfSafe knows."""
    return _TURN_OFF.get(
        (tool, f"{library}:{backend}"),
        f"turn off {library}'s {backend} backend where the tool registers it "
        f'(comfy_kitchen.disable_backend("{backend}") before its first run)',
    )


def turn_off_words(tool: str, recorded: RecordedKernel) -> str:
    """How to turn the recorded kernel off in `tool`, one clause."""
    return _TURN_OFF.get(
        (tool, recorded.kernel),
        "set the node's kernel to disabled or bypass the node",
    )


def suspect_words(tool: str, recorded: list[RecordedKernel]) -> str:
    """The sentence that names the recorded kernel as a suspect and how to turn it off."""
    nodes = ", ".join(r.words() for r in recorded)
    first = recorded[0]
    return (
        f"The image's workflow runs attention through SageAttention ({nodes}), an 8-bit "
        "attention kernel whose quantisation can overflow and give black or noise images with "
        "some models (Wan, Qwen-Image, Z-Image among them) while fp16 itself is fine; "
        f"HalfSafe's check runs PyTorch's attention. To rule it out, {turn_off_words(tool, first)}, "
        "and generate the image again."
    )
