"""The hostile half of the bad-input corpus: files that hang, explode or crash a naive loader.

Each builder writes one file or folder into a given place, in code; each is tiny (kilobytes),
whatever model it claims to hold. The tests feed them to the loader, the CLI and the library.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from app.core import architecture as arch
from app.core.checkpoint import write_safetensors
from app.core.families.sd import SD1_TEXT
from tests.support.model_files import ldm_state_dict
from tests.support.tiny_models import build_tiny_sd_pipeline

TEXT = SD1_TEXT + "text_model."
UNET = arch.UNET
VAE = arch.VAE


def tiny_sd1_tensors() -> dict[str, torch.Tensor]:
    """The demo's tiny SD1.x model under original-layout names: a good file to damage."""
    return {k: v.contiguous() for k, v in ldm_state_dict(build_tiny_sd_pipeline()).items()}


def empty_tensor(*shape: int) -> torch.Tensor:
    """A tensor with no elements (0 bytes in the file) but any shape: a size that costs nothing."""
    return torch.empty(shape, dtype=torch.float16)


# Single files: sizes that would build huge models -------------------------------------------


def _with(extra: dict[str, torch.Tensor], drop: Callable[[str], bool] | None = None):
    def build() -> dict[str, torch.Tensor]:
        tensors = {k: v for k, v in tiny_sd1_tensors().items() if not (drop and drop(k))}
        tensors.update(extra)
        return tensors

    return build


def _replaced(key: str, make: Callable[[torch.Tensor], torch.Tensor]):
    def build() -> dict[str, torch.Tensor]:
        tensors = tiny_sd1_tensors()
        tensors[key] = make(tensors[key])
        return tensors

    return build


# name: (tensors, words the sentence must contain)
SINGLE_FILES: dict[str, tuple[Callable[[], dict[str, torch.Tensor]], str]] = {
    "text encoder of 1e8 layers": (
        _with({TEXT + "encoder.layers.99999999.mlp.fc1.weight": empty_tensor(0)}),
        "layers",
    ),
    "VAE of 1e6 layers per block": (
        _with({VAE + "encoder.down.0.block.999999.conv1.weight": empty_tensor(0)}),
        "layers",
    ),
    "text encoder of 1e12 positions": (
        _replaced(TEXT + "embeddings.position_embedding.weight", lambda t: empty_tensor(10**12, 0)),
        "a dimension larger than any real weight's",
    ),
    "vocabulary of 20M tokens": (
        _replaced(
            TEXT + "embeddings.token_embedding.weight", lambda t: empty_tensor(20_000_000, 0)
        ),
        "vocab_size",
    ),
    "UNet 1e9 channels wide": (
        _replaced(
            UNET + "input_blocks.1.0.out_layers.3.weight", lambda t: empty_tensor(10**9, 0, 3, 3)
        ),
        "block_out_channels",
    ),
    "a dimension of 2**70": (
        _with({UNET + "extra": empty_tensor(0).reshape(0)}),  # replaced in the header below
        "shape",
    ),
    "scalar token embedding": (
        _replaced(TEXT + "embeddings.token_embedding.weight", lambda t: torch.zeros(())),
        "token_embedding",
    ),
    "1-D UNet input convolution": (
        _replaced(UNET + "input_blocks.0.0.weight", lambda t: t.flatten()),
        "input_blocks.0.0.weight",
    ),
    "1-D MLP weight": (
        _replaced(TEXT + "encoder.layers.0.mlp.fc1.weight", lambda t: t.flatten()),
        "fc1",
    ),
    "attention without proj_in": (
        _with({}, drop=lambda k: ".proj_in." in k),
        "proj_in",
    ),
    "integer UNet weight": (
        _replaced(UNET + "out.2.weight", lambda t: t.to(torch.int64)),
        "integer",
    ),
    "bool VAE weight": (
        _replaced(VAE + "decoder.conv_out.weight", lambda t: t.to(torch.bool)),
        "bool",
    ),
    "uint8 text encoder weight": (
        _replaced(TEXT + "encoder.layers.0.mlp.fc1.weight", lambda t: t.to(torch.uint8)),
        "integer",
    ),
}


def write_single_file(path: Path, case: str) -> Path:
    """Write the single-file case `case` of SINGLE_FILES as a safetensors file."""
    tensors = SINGLE_FILES[case][0]()
    write_safetensors(path, tensors)
    if case == "a dimension of 2**70":
        _set_shape(path, UNET + "extra", [0, 2**70])
    return path


def _set_shape(path: Path, name: str, shape: list[int]) -> None:
    """Rewrite one tensor's shape in a safetensors header (for shapes torch cannot make)."""
    import struct

    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    header[name]["shape"] = shape
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])


# Pickle checkpoints (read only with --allow-pickle) --------------------------------------


def self_referencing_ckpt(path: Path) -> Path:
    """A .ckpt whose state_dict entry is the dictionary itself."""
    document: dict = {"global_step": 1}
    document["state_dict"] = document
    torch.save(document, str(path))
    return path


def two_step_cycle_ckpt(path: Path) -> Path:
    """A .ckpt whose state_dict points to a dict whose state_dict points back."""
    first: dict = {}
    second: dict = {"state_dict": first}
    first["state_dict"] = second
    torch.save(first, str(path))
    return path


def stride_zero_ckpt(path: Path) -> Path:
    """A full tiny model plus one UNet tensor of 1e6 x 1e6 elements held in 4 bytes."""
    tensors = tiny_sd1_tensors()
    tensors[UNET + "huge"] = torch.zeros(1).expand(10**6, 10**6)
    torch.save({"state_dict": tensors}, str(path))
    return path


def _odd_tensor(kind: str) -> torch.Tensor:
    if kind == "sparse":
        return torch.eye(4).to_sparse()
    if kind == "quantized":
        with warnings.catch_warnings():  # torch deprecates quantized tensors; files still hold them
            warnings.simplefilter("ignore")
            return torch.quantize_per_tensor(torch.ones(4, 4), 0.1, 0, torch.qint8)
    if kind == "meta":
        return torch.empty(4, 4, device="meta")
    raise ValueError(kind)


def odd_tensor_ckpt(path: Path, kind: str) -> Path:
    """A full tiny model whose UNet output convolution is a sparse, quantized or meta tensor."""
    tensors = tiny_sd1_tensors()
    tensors[UNET + "out.2.bias"] = _odd_tensor(kind)
    torch.save({"state_dict": tensors}, str(path))
    return path


def pickle_named_safetensors(path: Path) -> Path:
    """A good tiny model saved with torch.save (a pickle) under a .safetensors name."""
    torch.save({"state_dict": tiny_sd1_tensors()}, str(path))
    return path


# Diffusers folders ------------------------------------------------------------------------


def tiny_folder(path: Path) -> Path:
    """The tiny SD1.x pipeline as a diffusers folder (safetensors weights)."""
    build_tiny_sd_pipeline().save_pretrained(path, safe_serialization=True)
    return path


def edit_json(path: Path, change: Callable[[dict], object]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def nested_json(depth: int = 100_000) -> str:
    """A JSON document nested `depth` levels deep: [[[[...]]]] inside an object."""
    return '{"a": ' + "[" * depth + "]" * depth + "}"


def _set(file: str, key: str, value: object) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        edit_json(folder / file, lambda data: data.__setitem__(key, value))

    return apply


def _write(file: str, text: str) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        (folder / file).write_text(text, encoding="utf-8")

    return apply


def _big_vocab(folder: Path) -> None:
    vocab = {f"t{n}</w>": n for n in range(400_000)}
    (folder / "tokenizer" / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")


def _raw_value(file: str, key: str, literal: str) -> Callable[[Path], None]:
    """Set `key` to a JSON literal Python's json writes but strict JSON lacks (NaN, Infinity)."""

    def apply(folder: Path) -> None:
        edit_json(folder / file, lambda data: data.__setitem__(key, "@@"))
        target = folder / file
        target.write_text(target.read_text().replace('"@@"', literal), encoding="utf-8")

    return apply


# name: (change to a good folder, file the sentence must name, words it must contain)
FOLDERS: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "layers_per_block 100000": (
        _set("unet/config.json", "layers_per_block", 100_000),
        "unet/config.json",
        "layers_per_block",
    ),
    "vocab_size 20M": (
        _set("text_encoder/config.json", "vocab_size", 20_000_000),
        "text_encoder/config.json",
        "vocab_size",
    ),
    "vocabulary file of 400k entries": (_big_vocab, "tokenizer/vocab.json", "400000"),
    "num_train_timesteps 2e8": (
        _set("scheduler/scheduler_config.json", "num_train_timesteps", 200_000_000),
        "scheduler/scheduler_config.json",
        "num_train_timesteps",
    ),
    # Every number of a schedule is bounded, those of the families that do not read it too: a
    # scheduler made for another sampler is built from the same config.
    **{
        f"schedule's {key} {words}": (
            _raw_value("scheduler/scheduler_config.json", key, literal),
            "scheduler/scheduler_config.json",
            key,
        )
        for key, literal, words in (
            ("shift", "1e308", "1e308"),
            ("beta_end", "1e308", "1e308"),
            ("beta_start", "NaN", "NaN"),
            ("max_shift", "1e308", "1e308"),
            ("base_shift", "-1e308", "-1e308"),
            ("sigma_max", "Infinity", "Infinity"),
            ("sigma_min", "-1", "-1"),
            ("rho", "1e308", "1e308"),
            ("flow_shift", "1e308", "1e308"),
            ("shift_terminal", "2", "2"),
            ("trained_betas", "[0.1, 1e308]", "1e308"),
            ("max_image_seq_len", "1e308", "1e308"),
            ("a_future_key", "1e308", "1e308"),
        )
    },
    "sample_size 512": (_set("unet/config.json", "sample_size", 512), "unet/config.json", "512"),
    "sample_size big": (
        _set("unet/config.json", "sample_size", "big"),
        "unet/config.json",
        "sample_size",
    ),
    "sample_size NaN": (
        _raw_value("unet/config.json", "sample_size", "NaN"),
        "unet/config.json",
        "sample_size",
    ),
    "sample_size Infinity": (
        _raw_value("unet/config.json", "sample_size", "Infinity"),
        "unet/config.json",
        "sample_size",
    ),
    "attention_head_dim 0": (
        _set("unet/config.json", "attention_head_dim", 0),
        "unet/config.json",
        "attention_head_dim",
    ),
    "VAE block_out_channels 1e9": (
        _set("vae/config.json", "block_out_channels", [10**9, 64]),
        "vae/config.json",
        "block_out_channels",
    ),
    "text encoder of 1e6 layers": (
        _set("text_encoder/config.json", "num_hidden_layers", 1_000_000),
        "text_encoder/config.json",
        "num_hidden_layers",
    ),
    "vocab.json a list": (_write("tokenizer/vocab.json", "[1, 2, 3]"), "vocab.json", "vocabulary"),
    "vocab.json ids not numbers": (
        _write("tokenizer/vocab.json", '{"a": "one", "b": 2}'),
        "vocab.json",
        "vocabulary",
    ),
    "merges.txt of one-token lines": (
        _write("tokenizer/merges.txt", "#version: 0.2\na\nb c\n"),
        "merges.txt",
        "line 2",
    ),
    "merges.txt of binary": (
        lambda folder: (folder / "tokenizer" / "merges.txt").write_bytes(b"\xff\xfe\x00garbage"),
        "merges.txt",
        "text",
    ),
    "nested model_index.json": (
        _write("model_index.json", nested_json()),
        "model_index.json",
        "nested",
    ),
    "nested unet config": (_write("unet/config.json", nested_json()), "unet/config.json", "nested"),
    "nested scheduler config": (
        _write("scheduler/scheduler_config.json", nested_json(200)),
        "scheduler_config.json",
        "nested",
    ),
    "nested tokenizer config": (
        _write("tokenizer/tokenizer_config.json", nested_json(200)),
        "tokenizer_config.json",
        "nested",
    ),
    "config is a list": (_write("vae/config.json", "[1]"), "vae/config.json", "object"),
}


def hostile_folder(path: Path, case: str) -> Path:
    """A tiny SD1.x diffusers folder damaged as FOLDERS[case] says."""
    tiny_folder(path)
    FOLDERS[case][0](path)
    return path


# FIFOs: names that a naive reader would open and wait on forever --------------------------

FIFO_NAMES = (
    "model_index.json",
    "unet/config.json",
    "unet/diffusion_pytorch_model.safetensors",
    "scheduler/scheduler_config.json",
    "tokenizer/vocab.json",
    "tokenizer/merges.txt",
    "text_encoder/config.json",
)


def replace_with_fifo(path: Path) -> Path:
    """Replace the file at `path` by a named pipe (nobody ever writes to it)."""
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path
