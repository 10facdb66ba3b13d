"""What every benchmark script shares: offline set-up, the machine description, timing with
device synchronisation, peak working memory, and the models they measure.

Models: `demo` (the built-in tiny SD1.x model) and `sd1` / `sdxl` (full-size pipelines with
random weights, built from the shipped configs: the same shapes and so the same cost as the real
models; the images mean nothing). `tiny=True` builds the tests' tiny SD1.x / SDXL pipelines in
their place (`TINY_SIZE` px): the same code paths in seconds, for a dry run on a CPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODELS = ("demo", "sd1", "sdxl")
NATIVE_SIZE = {"demo": 128, "sd1": 512, "sdxl": 1024}
TINY_SIZE = 64
MODEL_WORDS = {
    "demo": "demo model (tiny SD1.x)",
    "sd1": "SD1.5-size, random weights",
    "sdxl": "SDXL-size, random weights",
}


# --- the machine -------------------------------------------------------------------------


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_average() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def machine(device: str = "cpu") -> dict:
    """CPU, memory, GPU (when `device` is one) and the versions that decide the figures, from
    HalfSafe's own hardware report."""
    import torch

    from app.core.hardware import describe_device

    cpu = describe_device("cpu")
    described = {
        "cpu": cpu.name,
        "cores": os.cpu_count(),
        "memory_gib": None if cpu.memory_total_mb is None else round(cpu.memory_total_mb / 1024, 1),
        "torch_threads": torch.get_num_threads(),
        "gpu": None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "diffusers": _version("diffusers"),
        "transformers": _version("transformers"),
        "pyside6": _version("PySide6-Essentials") or _version("PySide6"),
        "load_average": load_average(),
    }
    if not device.startswith("cpu"):
        gpu = describe_device(device)
        described["gpu"] = {
            "name": gpu.name,
            "kind": gpu.kind,
            "memory_gib": round((gpu.memory_total_mb or 0) / 1024, 1),
            "compute_capability": ".".join(map(str, gpu.capability)) if gpu.capability else None,
            "driver": gpu.driver,
            "cudnn": torch.backends.cudnn.version() if gpu.kind == "cuda" else None,
        }
    return described


def machine_line(described: dict) -> str:
    """The machine in one line, for tables."""
    gpu = described.get("gpu")
    where = (
        f"{gpu['name']} ({gpu['memory_gib']} GiB, driver {gpu['driver']})"
        if gpu
        else f"{described['cpu']}, {described['cores']} cores"
    )
    return (
        f"{where}; torch {described['torch']}, diffusers {described['diffusers']}, "
        f"Python {described['python']}"
    )


# --- timing ------------------------------------------------------------------------------


def sync(device) -> None:
    import torch

    if getattr(device, "type", str(device).split(":")[0]) == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device, repeats: int = 1) -> float:
    """Median wall seconds of `repeats` calls, synchronised at both ends."""
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def spread(values: list[float], digits: int = 4) -> dict[str, float | int]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "runs": len(values),
    }


# --- memory ------------------------------------------------------------------------------

_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def _proc_status_kib(*keys: str) -> dict[str, int] | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    found = {k: re.search(rf"^{k}:\s+(\d+) kB", text, re.MULTILINE) for k in keys}
    if not all(found.values()):
        return None
    return {k: int(m.group(1)) for k, m in found.items()}


class PeakMemory:
    """Peak working memory of a block: what it allocated on top of what was already held.

    CUDA: the allocator's own peak (`max_memory_allocated`) minus what was allocated when the
    block began. CPU (Linux): the process's resident high-water mark, reset when the block begins
    (`/proc/self/clear_refs`), minus the resident size then; glibc is told to serve every block of
    256 KiB or more with its own mapping, so a freed tensor really leaves the process and the
    next block starts from a true baseline. Elsewhere the figure is None.
    """

    _malloc_set = False

    def __init__(self, device) -> None:
        import torch

        self.device = torch.device(device)
        self.mib: float | None = None

    @classmethod
    def _tune_malloc(cls) -> bool:
        if not cls._malloc_set:
            with contextlib.suppress(OSError, AttributeError):
                libc = ctypes.CDLL("libc.so.6")
                cls._malloc_set = bool(libc.mallopt(_M_MMAP_THRESHOLD, 256 * 1024))
        return cls._malloc_set

    def __enter__(self) -> PeakMemory:
        import torch

        self._before = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._before = torch.cuda.memory_allocated(self.device)
        elif self.device.type == "cpu" and self._tune_malloc():
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                return self
            status = _proc_status_kib("VmRSS")
            self._before = status["VmRSS"] * 1024 if status else None
        return self

    def __exit__(self, *exc) -> None:
        import torch

        if self._before is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            status = _proc_status_kib("VmHWM")
            if status is None:
                return
            peak = status["VmHWM"] * 1024
        self.mib = max(0.0, (peak - self._before) / 2**20)


def release_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- models ------------------------------------------------------------------------------


def bench_model(name: str, dtype: str = "fp32", *, tiny: bool = False):
    """A LoadedModel for `demo`, `sd1` or `sdxl` (random weights, stored in `dtype`); with
    `tiny`, the tests' tiny pipeline of the same architecture (`sd1`, `sdxl`)."""
    from app.core.checkpoint import scan_weights
    from app.core.models import LoadedModel, load_model
    from app.core.precision.plan import torch_dtype
    from tests.support.model_files import build_random_pipeline

    if name == "demo":
        return load_model("demo")
    if name not in NATIVE_SIZE:
        raise SystemExit(f"Unknown model {name!r}: choose from {', '.join(MODELS)}.")
    if tiny:
        from tests.support import tiny_models

        build = {
            "sd1": tiny_models.build_tiny_sd_pipeline,
            "sdxl": tiny_models.build_tiny_sdxl_pipeline,
        }
        pipeline = build[name](seed=0).to(torch_dtype(dtype))
    else:
        pipeline = build_random_pipeline(name, dtype=dtype, seed=0)
    kind = "tiny" if tiny else "random"
    return LoadedModel(
        pipeline=pipeline,
        source=f"{kind}-{name}",
        name=f"{kind}-{name}",
        format="demo",
        architecture=name,
        prediction_type=pipeline.scheduler.config.prediction_type,
        native_size=TINY_SIZE if tiny else NATIVE_SIZE[name],
        stored_dtype=dtype,
        model_hash=None,
        profile_key=f"bench-{kind}-{name}",
        weights=scan_weights(pipeline),
        detected_because="random weights for a benchmark",
    )


def model_size(name: str, size: int | None, tiny: bool = False) -> int:
    """The picture size a benchmark runs `name` at: `size` where given, else the model's
    native size (`TINY_SIZE` for a tiny one)."""
    return size or (TINY_SIZE if tiny else NATIVE_SIZE[name])


# The layer each architecture has an fp16 overflow planted in, and the factor its weights are
# scaled by (its output passes 65504 while the weights stay within fp16's range). SDXL's is the
# one `whole_job_memory.py` plants in its files; SD1.5's is `islands.py`'s.
PLANTS = {
    "sd1": ("down_blocks.0.resnets.0.conv1", 1e5),
    "sdxl": ("down_blocks.1.attentions.0.transformer_blocks.0.ff.net.0.proj", 1e5),
}


def plant(model, name: str) -> str:
    """Scale `PLANTS[name]`'s layer of `model`'s UNet in place; its module path."""
    import torch

    layer, factor = PLANTS[name]
    with torch.no_grad():
        model.pipeline.unet.get_submodule(layer).weight.mul_(factor)
    return layer


PROMPT = "a lighthouse on a cliff at dusk, highly detailed"


def generation_job(model, plan, *, device, info, size: int, steps: int, scheduler: str):
    """The job `app.core.generation.generate` would run for one image of `size` px with the NaN
    watch on, under `plan`: its placed components stay ready for repeated stages."""
    from app.core import generation
    from app.core.jobs import CancelToken, no_progress

    request = generation.GenerationRequest(
        prompt=PROMPT,
        steps=steps,
        cfg=7.0,
        seed=1234,
        width=size,
        height=size,
        scheduler=scheduler,
    )
    return generation._Job(
        model,
        request,
        plan,
        device=device,
        bf16_native=info.bf16 == "native",
        watch=True,
        progress=no_progress,
        preview=None,
        cancel=CancelToken(),
    )


# --- output ------------------------------------------------------------------------------


def names(value: str | None, default: tuple[str, ...] | list[str]) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else list(default)


def write_json(path: str | Path, document: dict) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return out


def emit(document: dict, table: str, path: str | None) -> None:
    """Print a script's table; write its figures as JSON when asked."""
    print(table)
    if path:
        write_json(path, document)


@contextlib.contextmanager
def status(message: str) -> Iterator[None]:
    """Say on stderr what is running and how long it took (stdout keeps the tables)."""
    print(f"{message}...", file=sys.stderr, flush=True)
    begun = time.perf_counter()
    yield
    print(f"  done in {time.perf_counter() - begun:.1f} s", file=sys.stderr, flush=True)
