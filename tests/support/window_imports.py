"""The modules the window's process must not import: the engine's side of core, the heavy
third-party libraries, and what the records the window reads once lived beside."""

from __future__ import annotations

# The engine's side of core: loading, checking, generating. Each imports dozens of modules (and
# torch when run); the window's process needs none of them.
ENGINE_SIDE = {
    "app.core.health.check",
    "app.core.health.fix",
    "app.core.health.observations",
    "app.core.health.stages",
    "app.core.generation.entry",
    "app.core.generation.job",
    "app.core.generation.repair",
    "app.core.generation.stages",
    "app.core.generation.probes",
    "app.core.models.folder",
    "app.core.models.single_file",
    "app.core.models.conversion",
    "app.core.checkpoint.assembly",
    "app.core.architecture.configs",
    "app.core.precision.placement",
}

THIRD_PARTY = {"torch", "diffusers", "transformers", "numpy", "PIL", "safetensors"}

# What the records the GUI reads once lived beside, or imported for one method of theirs: the
# checkpoint reader and scanner, the dequantiser, the LoRA reader, the remembered fixes' store,
# the self-tests, the prediction test, PNG writing; each hundreds of lines that the window's
# process would compile before its window shows. And `importlib.metadata`, whose own imports
# (email, zipfile, csv) cost tens of ms, which only detecting attention kernels needs.
BESIDE_THE_RECORDS = {
    "app.core.checkpoint.reader",
    "app.core.checkpoint.scan",
    "app.core.formats.quantized",
    "app.core.lora.files",
    "app.core.fixing.profiles",
    "app.core.hardware.selftest",
    "app.core.hardware.selftest_stats",
    "app.core.models.prediction",
    "app.core.images.finished",
    "importlib.metadata",
}
