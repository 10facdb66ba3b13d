"""Run one `halfsafe` command and write what the GPU's allocator held at its peak.

`python benchmarks/device_peak.py FILE ARGS...` runs `halfsafe ARGS...` in this process and, when
it ends (whatever its exit status), writes to FILE a JSON object: `allocated_bytes` and
`reserved_bytes`, torch's `max_memory_allocated` and `max_memory_reserved` over the whole
command (every stage, every copy, the activations), or nulls where CUDA was never used. The CUDA
context itself (a few hundred MB the driver takes) is in neither figure.

`whole_job_memory.py --device cuda` runs each job through this.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def peaks() -> dict:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {"allocated_bytes": None, "reserved_bytes": None}
    return {
        "allocated_bytes": torch.cuda.max_memory_allocated(),
        "reserved_bytes": torch.cuda.max_memory_reserved(),
    }


def main() -> None:
    target, argv = Path(sys.argv[1]), sys.argv[2:]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from app.cli import main as halfsafe

    try:
        code = halfsafe(argv)
    finally:
        target.write_text(json.dumps(peaks()))
    raise SystemExit(code)


if __name__ == "__main__":
    main()
