"""Opening checkpoint files safely: safetensors header checks, the pickle policy, the weight scan.

Every file is untrusted. A `.safetensors` header is validated, byte by byte, before the file is
handed to safetensors or diffusers, so a malformed file is refused with one sentence and nothing
is half-loaded. Pickle checkpoints (`.ckpt`, `.pt`, `.bin`) can run code when opened; they are
refused unless the user allows them, and even then only PyTorch's weights-only loader reads
them.

One responsibility per module, each importing only those before it:
  dtypes    the dtype codes: bits per element, display names, the torch dtype of each
  header    a safetensors header read and validated (read_header reads GGUF's too)
  pickles   the pickle policy: refusal, and the weights-only loader when allowed
  stored    StoredTensor: a quantized weight kept as its file stores it, decoded per use
  reader    Checkpoint, an opened file: tensors on demand from a memory map, quantized ones
            kept as stored
  scan      the weight scan: NaN/Inf in every tensor, and the tensors' content digest (its
            record, `WeightScan`, is plain data in `app.core.formats.weight_findings`)
  writer    write_safetensors
  cache     values computed from files' bytes, kept with the files' stamps; atomic JSON
  hashing   a file's sha256 and AUTOMATIC1111's short model hash

The package imports torch only inside the functions that need it (and `stored`, which is
imported by them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.lazy import lazy_exports

if TYPE_CHECKING:
    from app.core.checkpoint.cache import (
        cached_value,
        file_stamp,
        files_stamp,
        store_value,
        write_json_atomic,
    )
    from app.core.checkpoint.dtypes import DTYPE_BITS, DTYPE_NAMES, FLOAT_DTYPES, stored_dtype
    from app.core.checkpoint.hashing import cached_model_hash, model_hash, sha256_file
    from app.core.checkpoint.header import (
        HEADER_LIMIT,
        SAFETENSORS_SUFFIX,
        SafetensorsHeader,
        TensorInfo,
        read_header,
        read_safetensors_header,
    )
    from app.core.checkpoint.pickles import (
        PICKLE_SUFFIXES,
        is_pickle_file,
        load_pickle_state_dict,
        refuse_pickle,
    )
    from app.core.checkpoint.reader import Checkpoint, mmap_page
    from app.core.checkpoint.scan import (
        TensorDigest,
        WeightScanner,
        one_torch_thread,
        scan_weights,
        tensor_bytes,
        tensor_is_finite,
    )
    from app.core.checkpoint.writer import write_safetensors
    from app.core.formats.weight_findings import WeightScan

__all__ = [
    "DTYPE_BITS",
    "DTYPE_NAMES",
    "FLOAT_DTYPES",
    "HEADER_LIMIT",
    "PICKLE_SUFFIXES",
    "SAFETENSORS_SUFFIX",
    "Checkpoint",
    "SafetensorsHeader",
    "TensorDigest",
    "TensorInfo",
    "WeightScan",
    "WeightScanner",
    "cached_model_hash",
    "cached_value",
    "file_stamp",
    "files_stamp",
    "is_pickle_file",
    "load_pickle_state_dict",
    "mmap_page",
    "model_hash",
    "one_torch_thread",
    "read_header",
    "read_safetensors_header",
    "refuse_pickle",
    "scan_weights",
    "sha256_file",
    "store_value",
    "stored_dtype",
    "tensor_bytes",
    "tensor_is_finite",
    "write_json_atomic",
    "write_safetensors",
]

if not TYPE_CHECKING:  # pyright would take any name from a module with __getattr__
    __getattr__, __dir__ = lazy_exports(
        globals(),
        {
            ".cache": [
                "cached_value",
                "file_stamp",
                "files_stamp",
                "store_value",
                "write_json_atomic",
            ],
            ".dtypes": ["DTYPE_BITS", "DTYPE_NAMES", "FLOAT_DTYPES", "stored_dtype"],
            ".hashing": ["cached_model_hash", "model_hash", "sha256_file"],
            ".header": [
                "HEADER_LIMIT",
                "SAFETENSORS_SUFFIX",
                "SafetensorsHeader",
                "TensorInfo",
                "read_header",
                "read_safetensors_header",
            ],
            ".pickles": [
                "PICKLE_SUFFIXES",
                "is_pickle_file",
                "load_pickle_state_dict",
                "refuse_pickle",
            ],
            ".reader": ["Checkpoint", "mmap_page"],
            ".scan": [
                "TensorDigest",
                "WeightScanner",
                "one_torch_thread",
                "scan_weights",
                "tensor_bytes",
                "tensor_is_finite",
            ],
            ".writer": ["write_safetensors"],
            "app.core.formats.weight_findings": ["WeightScan"],
        },
    )
