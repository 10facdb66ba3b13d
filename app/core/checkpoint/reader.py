"""An opened checkpoint, `Checkpoint`: names, shapes and dtypes up front, each tensor on demand
(a zero-copy view of a memory map for safetensors), fp8, int8, NVFP4 and GGUF weights kept as
stored and read as the values they mean.

Imports torch only inside the functions that need it.
"""

from __future__ import annotations

import errno
import os
import sys
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from app.core.checkpoint.dtypes import (
    _GGUF_PREFIX,
    _gguf_code,
    _safetensors_dtype,
    _torch_dtype,
    stored_dtype,
)
from app.core.checkpoint.header import SafetensorsHeader, _file_size, read_safetensors_header
from app.core.checkpoint.pickles import is_pickle_file, load_pickle_state_dict, refuse_pickle
from app.core.errors import BadFileError
from app.core.formats import gguf, int4, quantized
from app.core.limits import open_regular


class Checkpoint:
    """A single-file checkpoint opened for reading: names, shapes and dtypes up front, tensors
    on demand.

    Quantized files are read here, in `get`, as the values they mean, so every loader reads
    them as weights: fp8, int8 and NVFP4 tensors with their scales (`quantized.scaled_layout`
    pairs them; the scales, input scales, ComfyUI's layer configs and the `scaled_fp8` marker
    are hidden from `keys`, `shapes` and `dtypes`, and an NVFP4 weight has the shape of its
    values) and GGUF files (recognised by their first bytes,
    bounds-checked before they are mapped) come as `stored.StoredTensor`s, the file's bytes
    decoded to `quantized.COMPUTE_DTYPE` values only while an operation reads them (GGUF block
    types torch cannot decode are dequantised by the gguf package as they are read). What a
    decoded weight shows wrong (a
    bad scale, implausible values) is kept in `findings` and reported to an active
    `quantized.collecting()`; `quantization` says how the file is stored. `component` names the
    pipeline part the file holds, when the loader knows it (for the findings).

    For safetensors, the validated byte ranges are read as zero-copy views of a private
    (copy-on-write) memory map of the file: nothing is copied, pages are shared with the OS
    cache, and writing to a tensor never touches the file. The map lives as long as any
    tensor from it. The file is held open and checked before each tensor, so one that is
    truncated or rewritten meanwhile gets a sentence (see `check_unchanged`). Use as a context
    manager, or call `close()`.
    """

    def __init__(
        self, path: str | Path, *, allow_pickle: bool = False, component: str | None = None
    ) -> None:
        self.path = Path(path)
        self.header: SafetensorsHeader | None = None
        self._map: Any = None
        self._tensors: dict[str, Any] | None = None
        self._populated = 0
        self._gguf: gguf.GgufTensors | None = None
        self._scaled: quantized.ScaledLayout | None = None
        self._scales: dict[str, Any] = {}
        self._tensor_scales: dict[str, Any] = {}
        self._pre_scales: dict[str, Any] = {}  # NVFP4 weight -> its AWQ input smoothing
        self._rotations: dict[str, quantized.Rotation] = {}
        self.quantization: quantized.Quantization | None = None
        self.findings: dict[str, quantized.QuantFinding] = {}
        self.component = component
        if is_pickle_file(self.path):
            if not allow_pickle:
                refuse_pickle(self.path)
            self._stamp = self._stamp_now()
            self._tensors = load_pickle_state_dict(self.path)
            self.shapes = {k: tuple(v.shape) for k, v in self._tensors.items()}
            self.dtypes = {k: _safetensors_dtype(v.dtype) for k, v in self._tensors.items()}
            self.metadata: dict[str, str] = {}
            self.file_size = _file_size(self.path)
        elif gguf.is_gguf_file(self.path):
            self._gguf = gguf.GgufTensors(self.path)
            self._stamp = self._stamp_now()
            self.shapes = dict(self._gguf.shapes)
            self.dtypes = {n: _gguf_code(t) for n, t in self._gguf.types.items()}
            self.metadata = {}
            self.file_size = self._gguf.file_size
            self.quantization = quantized.Quantization(
                "gguf", self._gguf.quantized_types, self.path.name
            )
        else:
            self.header = read_safetensors_header(self.path)
            self.shapes = self.header.shapes()
            self.dtypes = self.header.dtypes()
            self.metadata = self.header.metadata
            self.file_size = self.header.file_size
        if not self.shapes:
            raise BadFileError(self.path, "the file holds no tensors, so it holds no model.")
        if self.header is not None:
            int4.refuse_int4(self.path, self.dtypes)
            self._scaled = quantized.scaled_layout(self.path, self.dtypes, self.shapes)
            self._open_for_tensors()
        if self._scaled is not None:
            self._read_scales(self._scaled)
        if self.quantization is not None:
            quantized.report(quantization=self.quantization)

    def _read_scales(self, layout: quantized.ScaledLayout) -> None:
        """Hide the bookkeeping tensors, check ComfyUI's layer configs and read every scale up
        front (a few bytes per row; NVFP4's block scales one byte per 16 values, put in row
        order), so each weight is read with its own scales."""
        import torch

        for name in layout.hidden:
            self.shapes.pop(name, None)
            self.dtypes.pop(name, None)
        for weight, config in layout.config_of.items():
            raw = self._stored(config)
            if raw.dtype != torch.uint8 or raw.dim() != 1:
                raise BadFileError(self.path, f"the layer config '{config}' is not a row of bytes.")
            # A few dozen bytes in a real file: past the bound, only enough to refuse it is read.
            head = raw[: quantized.MAX_LAYER_CONFIG_BYTES + 1].numpy().tobytes()
            rotation = quantized.layer_format(self.path, config, head, layout.stored[weight])
            if rotation is not None:
                self._rotations[weight] = rotation
        for weight, scale in layout.scale_of.items():
            if layout.stored[weight] != quantized.NVFP4_CODE:
                self._scales[weight] = self._stored(scale).to(torch.float32).clone()
                continue
            blocks = self._stored(scale)
            if layout.tiled(weight):
                rows, columns = self.shapes[weight]
                blocks = untile_block_scales(blocks, rows, columns // quantized.NVFP4_BLOCK)
            self._scales[weight] = blocks
        for weight, second in layout.tensor_scale_of.items():
            self._tensor_scales[weight] = self._stored(second).to(torch.float32).reshape(())
        for weight, pre in layout.pre_scale_of.items():
            self._pre_scales[weight] = self._stored(pre).to(torch.float32).clone()
        if layout.stored:  # a `scaled_fp8` marker beside no fp8 weight leaves the file as stored
            rotated = quantized.INT8_CONVROT_TYPE
            types = sorted(
                {rotated if n in self._rotations else c for n, c in layout.stored.items()}
            )
            fmt = quantized.INT8_CONVROT_FORMAT if self._rotations else layout.format
            self.quantization = quantized.Quantization(fmt, types, self.path.name)

    def _finding(self, name: str, problem: str) -> None:
        finding = quantized.QuantFinding(name, problem, self.path.name, self.component)
        if name not in self.findings:
            self.findings[name] = finding
            quantized.report(finding=finding)

    def _open_for_tensors(self) -> None:
        """Hold the validated file open and remember what it looked like (see `check_unchanged`)."""
        try:
            with open_regular(self.path) as handle:
                fd = os.dup(handle.fileno())
            # A bare descriptor, closed by close() or when this object goes away.
            self._fd: int | None = fd
            self._closer = weakref.finalize(self, os.close, fd)
            self._stamp = _stamp(os.fstat(fd))
            named = _stamp(os.stat(self.path))
        except OSError as error:
            raise BadFileError(
                self.path, f"the file cannot be read ({error.strerror or error})."
            ) from None
        if self._stamp != named or self._stamp[0] != self.file_size:
            self.close()
            raise _changed(self.path)

    def check_unchanged(self) -> None:
        """Raise BadFileError when the file was truncated, rewritten or replaced since it was
        opened: its size or modification time on the open handle differ.

        Tensors are zero-copy views of a map of the file, and a page of a map beyond a shrunken
        file's end kills the process (SIGBUS) when touched. `get` calls this before mapping each
        tensor, and loaders call it once more at the end, so a file that changes while it loads
        gets a sentence; only a change in the very moment a tensor is being read still crashes.
        """
        if getattr(self, "_stamp", None) is not None and self._stamp_now() != self._stamp:
            raise _changed(self.path)

    def _stamp_now(self) -> tuple[int, int, int, int, int] | None:
        """The stamp of the open descriptor (safetensors), or of the path (pickles, which
        PyTorch maps itself); None when it cannot be read."""
        fd = getattr(self, "_fd", None)
        try:
            return _stamp(os.fstat(fd) if fd is not None else os.stat(self.path))
        except (OSError, ValueError):
            return None

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop this object's hold on the file; tensors already handed out stay valid."""
        self._map = None
        if getattr(self, "_fd", None) is not None:
            self._fd = None
            self._closer()

    def keys(self) -> list[str]:
        """Tensor names, in file order (sequential reads are kinder to disks)."""
        if self.header is not None:
            ordered = sorted(self.header.tensors.items(), key=lambda kv: kv[1].start)
            return [k for k, _ in ordered if k in self.shapes]
        if self._gguf is not None:
            return self._gguf.keys()
        return list(self.shapes)

    def get(self, name: str):
        """One tensor: as stored (dtype and shape as in the file), except that fp8 and GGUF
        weights come as the values they mean (see the class)."""
        from app.core.checkpoint import stored  # torch, on first read

        if self._tensors is not None:
            self.check_unchanged()
            return self._tensors[name]
        if self._gguf is not None:
            self.check_unchanged()
            kind = self._gguf.types[name]
            holds = False
            if stored.gguf_decodable(kind):
                raw = self._gguf.raw(name)
                holds = quantized.gguf_holds_values(raw, kind)
                tensor = stored.from_gguf(raw, kind, self.shapes[name])
            else:
                tensor = self._gguf.get(name)
            if self.dtypes[name].startswith(_GGUF_PREFIX):
                self._check_decoded(name, tensor, holds)
            return tensor
        tensor = self._stored(name)
        layout = self._scaled
        if layout is None or name not in layout.stored:
            return tensor
        # The one place a scaled weight becomes a weight: kept as stored, with its scales.
        scale = self._scales.get(name)
        holds = False
        if layout.stored[name] == quantized.NVFP4_CODE:
            holds = quantized.nvfp4_holds_values(tensor)
            second, pre = self._tensor_scales[name], self._pre_scales.get(name)
            tensor = stored.from_nvfp4(
                tensor, scale, second, high_first=layout.tiled(name), pre_scale=pre
            )
            problem = quantized.scale_problem(second)
            where = layout.tensor_scale_of[name]
            if problem is None:
                problem, where = quantized.block_scale_problem(scale), layout.scale_of[name]
            if problem is None and pre is not None:
                problem, where = quantized.scale_problem(pre), layout.pre_scale_of[name]
        else:
            problem = quantized.scale_problem(scale, tensor) if scale is not None else None
            where = layout.scale_of.get(name)
            if layout.stored[name] == quantized.INT8_CODE:
                tensor, rotation_problem = self._int8(name, tensor, scale)
                if rotation_problem is not None:  # said whole: not a scale's
                    self._finding(name, f"{rotation_problem} (in {layout.config_of[name]})")
                    return tensor
            else:
                tensor = stored.from_fp8(tensor, scale)
        if problem is not None:
            self._finding(name, f"has the scale {problem} (in {where})")
        else:
            self._check_decoded(name, tensor, holds, where)
        return tensor

    def _int8(self, name: str, values, scale):
        """An int8 weight kept as stored, turned back by its rotation where its layer config
        names one; and why that rotation cannot be undone, if so (the weight is then read
        unrotated: its values are wrong, and the finding says so)."""
        from app.core.checkpoint import stored

        rotation = self._rotations.get(name)
        if rotation is None:
            return stored.from_int8(values, scale), None
        problem = rotation.problem or quantized.group_problem(rotation.group, self.shapes[name])
        if problem is not None:
            return stored.from_int8(values, scale), problem
        return stored.from_int8_convrot(values, scale, rotation.group), None

    def _check_decoded(self, name: str, tensor, holds: bool = False, where=None) -> None:
        """A finding for a weight that decodes to implausible values, or to 0 everywhere while
        its codes `holds` values (its scales, `where`, are 0)."""
        problem = quantized.implausible(tensor, holds)
        if problem is not None:
            lost = holds and problem.startswith("decodes to 0") and where
            self._finding(name, f"{problem} (in {where})" if lost else problem)

    def _stored(self, name: str):
        """One safetensors tensor exactly as stored: a zero-copy view of the map."""
        import torch

        assert self.header is not None
        info = self.header.tensors[name]
        dtype = _torch_dtype(self.path, name, info.dtype)
        if info.nbytes == 0:
            return torch.empty(info.shape, dtype=dtype)
        start = self.header.data_start + info.start
        self.check_unchanged()
        self._populate(start + info.nbytes)
        tensor = torch.frombuffer(
            self._mapping(), dtype=dtype, count=info.nbytes // dtype.itemsize, offset=start
        ).view(info.shape)
        # Kernels may assume element alignment; a header of odd length breaks it, so copy.
        return tensor if start % dtype.itemsize == 0 else tensor.clone()

    def _mapping(self):
        if self._map is None:
            import mmap

            if getattr(self, "_fd", None) is None:
                self._open_for_tensors()  # reopened after close(): still the same file?
            assert self._fd is not None
            try:
                self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError) as error:
                raise BadFileError(
                    self.path,
                    f"the file cannot be mapped for reading "
                    f"({getattr(error, 'strerror', None) or error}).",
                ) from None
            if len(self._map) != self.file_size:
                self._map = None
                raise _changed(self.path)
        return self._map

    def _populate(self, end: int) -> None:
        """Map the file's pages ahead of use in large steps (Linux): one call per 256 MiB
        instead of a page fault every few KiB, which dominates reading on virtual machines."""
        if self._populated >= end or sys.platform != "linux":
            return
        mapping = self._mapping()
        start = self._populated
        stop = min(len(mapping), max(end, start + _POPULATE_STEP))
        stop = min(len(mapping), (stop + mmap_page() - 1) // mmap_page() * mmap_page())
        try:
            mapping.madvise(_MADV_POPULATE_READ, start, stop - start)
        except OSError as error:
            if error.errno == errno.EFAULT:
                # The kernel's way of saying "these pages are past the file's end now": the
                # file shrank after it was mapped, and touching them would raise SIGBUS.
                raise _changed(self.path) from None
            self._populated = len(mapping)  # unsupported kernel: fall back to page faults
            return
        except (ValueError, AttributeError):
            self._populated = len(mapping)
            return
        self._populated = stop

    def stored_dtype(self, names: Iterable[str] | None = None) -> str:
        return stored_dtype(self.dtypes[n] for n in (self.dtypes if names is None else names))


def _stamp(stat: os.stat_result) -> tuple[int, int, int, int, int]:
    """What identifies one version of a file: size, modification and change times, device and
    inode (see `file_stamp`)."""
    return (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_dev, stat.st_ino)


def _changed(path: Path) -> BadFileError:
    return BadFileError(
        path,
        "the file changed while it was read (it was truncated, rewritten or replaced); "
        "load it again once it is complete.",
    )


def untile_block_scales(tiled, rows: int, columns: int):
    """NVFP4 block scales from cuBLAS's tiled layout (as ComfyUI's files keep them) in row
    order: `rows` by `columns` (blocks per row), a copy of one byte per 16 values.

    The tiled layout pads the matrix to whole tiles of 128 rows by 4 columns, lays the tiles
    out row of tiles by row of tiles, and within a tile puts row 32 * a + j, column c at
    16 * j + 4 * a + c (cuBLAS documentation, "1D block scaling factors layout")."""
    tile_rows, tile_columns = quantized.NVFP4_TILE
    row_tiles, column_tiles = -(-rows // tile_rows), -(-columns // tile_columns)
    # [row tile, column tile, j, a, c] -> [row tile, a, j, column tile, c]
    tiles = tiled.reshape(row_tiles, column_tiles, 32, 4, tile_columns)
    ordered = tiles.permute(0, 3, 2, 1, 4).reshape(row_tiles * tile_rows, -1)
    return ordered[:rows, :columns].contiguous()


_POPULATE_STEP = 256 << 20
_MADV_POPULATE_READ = 22  # Linux 5.14+; Python 3.11's mmap module does not name it


def mmap_page() -> int:
    import mmap

    return mmap.ALLOCATIONGRANULARITY
