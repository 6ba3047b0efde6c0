"""A GGUF (v2/v3) file: its metadata and its tensors, memory-mapped.

Layout (little-endian): magic "GGUF", version u32, tensor count u64, metadata count u64; the
metadata key/values; one info record per tensor (name, dims, GGML type, offset); padding to
`general.alignment` (default 32); then the tensor data, each tensor at its offset from there.

GGUF lists dims fastest first (ne[0] is the contiguous one), the reverse of numpy/torch. A
tensor stored with ne = [576, 49152] comes back as a [49152, 576] array.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from replica.engine.models.gguf_quants import dequantize, ggml_type

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# metadata value type id -> struct format of a scalar of that type
_SCALAR_FORMATS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}
_FLOAT32, _STRING, _ARRAY = 6, 8, 9
_NUMPY_DTYPES = {
    0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
    7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64,
}


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy/torch order (slowest first): GGUF's ne reversed
    type_id: int  # GGML type
    offset: int  # absolute byte offset of the data in the file
    num_bytes: int

    @property
    def type_name(self) -> str:
        return ggml_type(self.type_id).name

    @property
    def num_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class _Cursor:
    """Reads consecutive values out of a buffer; raises ValueError past its end."""

    def __init__(self, buf: memoryview, path: str) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF file (header runs past the end)")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF file (string runs past the end)")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def _strings(self, count: int) -> list[str]:
        # the hot loop of the header (a vocabulary is ~100k strings): locals only, no calls
        buf, pos, end, unpack_from = self.buf, self.pos, len(self.buf), struct.unpack_from
        out = []
        for _ in range(count):
            if pos + 8 > end:
                raise ValueError(f"{self.path}: truncated GGUF file (string runs past the end)")
            (n,) = unpack_from("<Q", buf, pos)
            pos += 8 + n
            if pos > end:
                raise ValueError(f"{self.path}: truncated GGUF file (string runs past the end)")
            out.append(str(buf[pos - n:pos], "utf-8", "replace"))
        self.pos = pos
        return out

    def value(self, type_id: int) -> Any:
        if type_id == _FLOAT32:
            # the shortest decimal that rounds to this float32: 1e-05, not 9.999999747378752e-06
            # (str, not repr: NumPy 2's repr is "np.float32(1e-05)")
            return float(str(np.float32(self.unpack("<f"))))
        if type_id in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[type_id])
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if item_type in _NUMPY_DTYPES:
                dtype = np.dtype(_NUMPY_DTYPES[item_type]).newbyteorder("<")
                end = self.pos + count * dtype.itemsize
                if end > len(self.buf):
                    raise ValueError(f"{self.path}: truncated GGUF file (array runs past the end)")
                items = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).tolist()
                self.pos = end
                return items
            if item_type == _STRING:
                return self._strings(count)
            return [self.value(item_type) for _ in range(count)]
        raise ValueError(f"{self.path}: unknown GGUF metadata value type {type_id}")


class GGUFReader:
    """The parsed header of one GGUF file plus a read-only memory map of its data.

    `metadata` maps keys to Python values (numbers, str, lists). Tensors are read on demand:
    `raw()` is a zero-copy view of the bytes, `load()` a fresh float32 array.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"no GGUF file at {self.path}")
        try:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:  # empty file, unreadable
            raise ValueError(f"{self.path}: cannot map the file as GGUF ({e})") from e
        cursor = _Cursor(memoryview(self._data), self.path)
        if bytes(self._data[:4]) != GGUF_MAGIC:
            raise ValueError(f"{self.path}: not a GGUF file (bad magic {bytes(self._data[:4])!r})")
        cursor.pos = 4
        self.version: int = cursor.unpack("<I")
        if self.version not in SUPPORTED_VERSIONS:
            raise ValueError(f"{self.path}: GGUF version {self.version} is not supported "
                             f"(supported: {SUPPORTED_VERSIONS}; a big-endian file also shows this)")
        num_tensors, num_kv = cursor.unpack("<Q"), cursor.unpack("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(num_kv):
            key = cursor.string()
            self.metadata[key] = cursor.value(cursor.unpack("<I"))
        headers = [self._tensor_header(cursor) for _ in range(num_tensors)]
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-cursor.pos // alignment) * alignment
        self.tensor_infos: dict[str, GGUFTensorInfo] = {}
        for name, shape, type_id, rel_offset in headers:
            num_elements = int(np.prod(shape, dtype=np.int64))
            info = GGUFTensorInfo(name, shape, type_id, data_start + rel_offset,
                                  ggml_type(type_id).num_bytes(num_elements))
            if info.offset + info.num_bytes > self._data.size:
                raise ValueError(f"{self.path}: tensor {name} runs past the end of the file (truncated?)")
            self.tensor_infos[name] = info

    @staticmethod
    def _tensor_header(cursor: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
        name = cursor.string()
        num_dims = cursor.unpack("<I")
        ne = [cursor.unpack("<Q") for _ in range(num_dims)]
        type_id, offset = cursor.unpack("<I"), cursor.unpack("<Q")
        return name, tuple(reversed(ne)), type_id, offset

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of tensor `name`: a read-only uint8 view into the map."""
        info = self._info(name)
        return self._data[info.offset:info.offset + info.num_bytes]

    def load(self, name: str) -> np.ndarray:
        """Tensor `name` dequantised: a fresh, writable float32 array of `info.shape`."""
        info = self._info(name)
        try:
            values = dequantize(self.raw(name), info.type_id)
        except ValueError as e:
            raise ValueError(f"{self.path}: tensor {name}: {e}") from e
        return values.reshape(info.shape)

    def load_part(self, name: str, axis: int, start: int, stop: int) -> np.ndarray:
        """Rows (axis 0) or columns (axis 1) [start, stop) of 2-D tensor `name`, dequantised.
        Only those bytes are read from the map: whole rows for rows; for columns, each row's
        blocks that hold them (a block is `block_size` consecutive values of one row), trimmed
        after dequantising."""
        info = self._info(name)
        if len(info.shape) != 2 or axis not in (0, 1) or not 0 <= start < stop <= info.shape[axis]:
            raise ValueError(f"{self.path}: tensor {name} {info.shape} has no part {axis}:[{start}, {stop})")
        kind = ggml_type(info.type_id)
        rows, cols = info.shape
        row_bytes = cols // kind.block_size * kind.type_size
        by_row = self.raw(name).reshape(rows, row_bytes)
        if axis == 0:
            raw, shape, trim = by_row[start:stop], (stop - start, cols), slice(None)
        else:
            first, last = start // kind.block_size, -(-stop // kind.block_size)
            blocks = by_row.reshape(rows, cols // kind.block_size, kind.type_size)[:, first:last]
            raw, shape = blocks, (rows, (last - first) * kind.block_size)
            trim = slice(start - first * kind.block_size, stop - first * kind.block_size)
        try:
            values = dequantize(np.ascontiguousarray(raw).reshape(-1), info.type_id)
        except ValueError as e:
            raise ValueError(f"{self.path}: tensor {name}: {e}") from e
        values = values.reshape(shape)
        return values if axis == 0 else np.ascontiguousarray(values[:, trim])

    def _info(self, name: str) -> GGUFTensorInfo:
        try:
            return self.tensor_infos[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None
