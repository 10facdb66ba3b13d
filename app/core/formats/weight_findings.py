"""What reading a model's weights found: the weight scan (`WeightScan`: tensors holding NaN or
Inf, the content digest) and quantized weights that decode wrongly (`QuantFinding`), and how a model's files store their
quantized weights (`StoredQuantization`).

Plain records, apart from the scanner (`checkpoint.scan`) and the dequantiser (`quantized`) that
make them, which re-export them: a `ModelSummary` carries them to the window, whose process
must not import the checkpoint reader to show one. Imports no other HalfSafe module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Names the digest scheme; changing how tensors are hashed must change it, so that no key of
# the old scheme can ever match one of the new.
DIGEST_SCHEME = "halfsafe-tensors-v1"


@dataclass(frozen=True)
class StoredQuantization:
    """How a model's files store its quantized weights: their format ("fp8_scaled", "gguf",
    "mixed", ...), the stored types, the files, the dtype each layer reads its weights as, and
    the types dequantised when they are read (the rest are kept as stored)."""

    format: str
    types: tuple[str, ...]
    files: tuple[str, ...]
    dequantized_to: str
    dequantized_on_load: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "types": list(self.types),
            "files": list(self.files),
            "dequantized_to": self.dequantized_to,
            "dequantized_on_load": list(self.dequantized_on_load),
        }

    def held_words(self) -> str:
        """How the weights are held, in the words every view shows."""
        words = (
            f"kept as stored, each layer reading its weights as {self.dequantized_to} values "
            "as it computes"
        )
        if self.dequantized_on_load:
            decoded = ", ".join(self.dequantized_on_load)
            words += f" ({decoded} weights dequantised to {self.dequantized_to} when loaded)"
        return words


@dataclass(frozen=True)
class QuantFinding:
    """One tensor whose quantised form decodes to weights that cannot be the model's."""

    tensor: str  # the name in the file
    problem: str  # completes "tensor X ...": "has the scale 0 (in X.scale_weight)"
    file: str = ""  # the file's name, when the model has several files
    component: str | None = None  # the pipeline component, when the loader knows it

    def to_json(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "file": self.file,
            "component": self.component,
            "problem": self.problem,
        }

    @property
    def sentence(self) -> str:
        where = f"{self.file}: " if self.file else ""
        return f"{where}{self.tensor} {self.problem}"


@dataclass
class WeightScan:
    """What one pass over every tensor found: the names of tensors holding NaN or Inf, and,
    when asked for, the digest of their content (see `checkpoint.scan.TensorDigest`)."""

    non_finite: list[str]
    tensors: int
    bytes: int
    seconds: float
    content: str | None = None  # TensorDigest hex, None when the scan did not identify
    # Quantized weights that decode wrongly (a bad scale, implausible values): see quantized.py.
    bad_quantized: list[QuantFinding] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        """Throughput in MB/s (10^6 bytes); 0 when nothing was timed."""
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def merged(self, other: WeightScan) -> WeightScan:
        """Both scans as one (a checkpoint and its separate VAE); the content digest covers
        both, each kept apart so tensors of the same name in the two cannot stand in for
        each other."""
        import hashlib  # OpenSSL's bindings: a loader's work, not the window's

        content = None
        if self.content is not None and other.content is not None:
            content = hashlib.sha256(
                f"{DIGEST_SCHEME} merged\0{self.content}\0{other.content}".encode()
            ).hexdigest()
        return WeightScan(
            self.non_finite + other.non_finite,
            self.tensors + other.tensors,
            self.bytes + other.bytes,
            self.seconds + other.seconds,
            content,
            self.bad_quantized + other.bad_quantized,
        )
