"""Why was this image black? Read an image's generation record (AUTOMATIC1111, Forge, SD.Next,
ComfyUI, InvokeAI, SwarmUI or HalfSafe), say what its pixels are (NaN-black, a dark picture, a
safety-checker blank, or fine), find the model in the library, re-run the health check with the
image's settings, and give the fix in the terms of the tool that made it.

One responsibility per module, each importing only those before it:
  image_file    the file within bounds: PNG chunk by chunk, JPEG/WebP EXIF, pixel status
  records       the generation record as each tool writes it
  matching      the image's model and VAE in the user's library (names, hashes)
  next_steps    while the model is not found: the likely cause and the tool's switches to try
  signatures, regions   what the pixels are beyond black: saturated, noise, a box of noise
  checkers      other tools' safety checkers as their records show them
  kitchen       comfy-kitchen's kernels compared after a clean check of a ComfyUI image
  findings      the sentences of the findings (FINDING_WORDS) and the pixels' words
  check_settings  the settings the check of an image runs at, read from its record
  message       the explanation's message: the image's status and the check's verdict in words
  explanation   Explanation, explain_image: the check at the image's settings, in words

Every chunk of the file is hostile until read; any breach is one sentence naming the file
(BadFileError). Nothing is written. torch is imported only when the check runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.lazy import lazy_exports

if TYPE_CHECKING:
    from app.core.explain.check_settings import (
        _probe_size,  # two steps of the check that tests/core/test_explain.py reaches from here
        _reproduced_precision,
    )
    from app.core.explain.explanation import (
        FINDING_WORDS,
        PROBLEMS,
        STATUS_WORDS,
        STATUSES,
        Explanation,
        explain_image,
        read_image,
    )
    from app.core.explain.image_file import (
        IMAGE_SUFFIXES,
        MAX_CHUNKS,
        MAX_IMAGE_BYTES,
        MAX_PIXELS,
        MAX_TEXT_CHUNK_BYTES,
        MAX_TEXT_TOTAL_BYTES,
        PNG_SIGNATURE,
        PngFacts,
        is_image_path,
        pixel_status,
        read_exif,
        read_png,
    )
    from app.core.explain.matching import ModelMatch, find_model, find_vae, old_a1111_hash
    from app.core.explain.records import (
        MAX_JSON_DEPTH,
        MAX_NODES,
        TEXT_KEYS,
        Record,
        json_depth,
        read_record,
    )

__all__ = [
    "IMAGE_SUFFIXES",
    "MAX_CHUNKS",
    "MAX_IMAGE_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_NODES",
    "MAX_PIXELS",
    "MAX_TEXT_CHUNK_BYTES",
    "MAX_TEXT_TOTAL_BYTES",
    "FINDING_WORDS",
    "PNG_SIGNATURE",
    "PROBLEMS",
    "STATUSES",
    "STATUS_WORDS",
    "TEXT_KEYS",
    "Explanation",
    "ModelMatch",
    "PngFacts",
    "Record",
    "_probe_size",
    "_reproduced_precision",
    "explain_image",
    "find_model",
    "find_vae",
    "is_image_path",
    "json_depth",
    "old_a1111_hash",
    "pixel_status",
    "read_exif",
    "read_image",
    "read_png",
    "read_record",
]

if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            ".check_settings": ["_probe_size", "_reproduced_precision"],
            ".explanation": [
                "FINDING_WORDS",
                "PROBLEMS",
                "STATUS_WORDS",
                "STATUSES",
                "Explanation",
                "explain_image",
                "read_image",
            ],
            ".image_file": [
                "IMAGE_SUFFIXES",
                "MAX_CHUNKS",
                "MAX_IMAGE_BYTES",
                "MAX_PIXELS",
                "MAX_TEXT_CHUNK_BYTES",
                "MAX_TEXT_TOTAL_BYTES",
                "PNG_SIGNATURE",
                "PngFacts",
                "is_image_path",
                "pixel_status",
                "read_exif",
                "read_png",
            ],
            ".matching": ["ModelMatch", "find_model", "find_vae", "old_a1111_hash"],
            ".records": [
                "MAX_JSON_DEPTH",
                "MAX_NODES",
                "TEXT_KEYS",
                "Record",
                "json_depth",
                "read_record",
            ],
        },
    )
