"""HalfSafe's ComfyUI nodes as the desktop app and the command speak of them: the fix for a
ComfyUI user (HalfSafe Fix between the loader and the sampler, with a workflow to drop in, and
the whole-component flag for those who will not install the nodes), and what installing the
node package into a ComfyUI did or needs. Plain data; no torch."""

from __future__ import annotations

# The node package's folder (in this repository, and its name in custom_nodes/) and the node
# classes a workflow names (comfyui-halfsafe/nodes.py, NODE_CLASS_MAPPINGS).
PACKAGE = "comfyui-halfsafe"
CHECK_NODE = "HalfSafeCheck"
FIX_NODE = "HalfSafeFix"
NODE_TITLES = {CHECK_NODE: "HalfSafe Check", FIX_NODE: "HalfSafe Fix"}

NODE_WORDS = {
    # The fix for a ComfyUI user, at the start of the answer. {flags}: the whole-component flag.
    "fix": (
        "In ComfyUI, add HalfSafe Fix between the loader and the sampler (the workflow to drop "
        "in is with the fix); without HalfSafe's nodes, start it with {flags}, which runs the "
        "whole diffusion model wider"
    ),
    "title": "Add HalfSafe Fix between the loader and the sampler.",
    # Flags the nodes leave to the tool (a failing VAE's): {flags}.
    "also": "with either, start it with {flags} too",
    # What the workflow holds: {loader} and {consumers}, node titles with their ids.
    "placed": (
        "HalfSafe Fix takes {loader}'s MODEL and feeds {consumers}; HalfSafe Check, fed the "
        "same model, proves the fix as this ComfyUI runs it on the first run and hands it to "
        "HalfSafe Fix, which keeps only the failing layers wider."
    ),
    "from_image": "The workflow is the image's own, every node and link kept.",
    "from_template": (
        "The image carries no graph with a model loader HalfSafe could rewrite, so this is a "
        "minimal workflow: set its loader to your model and its prompts to yours."
    ),
    "drop": (
        "Drop the workflow file into ComfyUI with HalfSafe's nodes installed in its "
        "custom_nodes folder (Install HalfSafe's nodes, or halfsafe comfyui install)."
    ),
    # Without the nodes: {flags}.
    "fallback": (
        "Without HalfSafe's nodes: start ComfyUI with {flags} (the whole diffusion model "
        "wider, which costs memory a 6 GB card may not have)."
    ),
    "saved": "The workflow with HalfSafe Fix: {path}",
    "not_saved": "The workflow with HalfSafe Fix was not saved: {problem}",
    # Installing the node package. {target}: the folder in custom_nodes/; {command}: pip's.
    "installed": (
        "HalfSafe's nodes are in {target}; now install HalfSafe's core into that ComfyUI's "
        "Python with {command} and restart ComfyUI."
    ),
    "installed_python_unknown": (
        "HalfSafe's nodes are in {target}; now install HalfSafe's core with the Python that "
        "runs that ComfyUI ({command}, where python is that one) and restart ComfyUI."
    ),
    "none_found": (
        "No ComfyUI was found in the usual places (ComfyUI, ComfyUI_windows_portable or "
        "Documents/ComfyUI in your home folder, or a model folder in the settings): copy "
        "HalfSafe's {package} folder into your ComfyUI's custom_nodes folder, or run halfsafe "
        "comfyui install with your ComfyUI's folder."
    ),
    "several": "HalfSafe found more than one ComfyUI ({found}): name the one to install into.",
    "not_comfyui": (
        "{path} is not a ComfyUI folder: it holds neither ComfyUI's main.py beside its comfy "
        "folder nor the custom_nodes and models folders of ComfyUI Desktop's."
    ),
    "no_package": (
        "HalfSafe's node package is missing beside this HalfSafe (looked for {folder}); "
        "install it from HalfSafe's source, where it is the {package} folder."
    ),
    "taken": (
        "{target} exists and is not HalfSafe's node package; move it away and install again."
    ),
    "not_written": "HalfSafe's nodes could not be copied into {folder}: {problem}",
}
