"""The binary tensor body of `/v1/infer` (`application/octet-stream`), torch-free.

A 2-D tensor as a small header and its raw little-endian data:

    offset 0  4 bytes  magic b"EPT1"
    offset 4  u8       dtype code (1 float32, 2 float16, 3 bfloat16)
    offset 5  u8       ndim (2)
    offset 6  u16      0 (reserved)
    offset 8  u32 x ndim  the shape, little-endian
    then      prod(shape) * itemsize bytes of data, little-endian, row-major

`parse_header` checks everything against the caller's limits before any tensor is made, so a short
body, an unknown dtype or a huge declared shape costs nothing but the header read. The coordinator's
canary and the benchmarks import this module; the agent turns the data into a tensor itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MEDIA_TYPE = "application/octet-stream"
MAGIC = b"EPT1"
_FIXED = struct.Struct("<4sBBH")
_DIM = struct.Struct("<I")

DTYPE_CODES: dict[str, int] = {"float32": 1, "float16": 2, "bfloat16": 3}
DTYPE_NAMES: dict[int, str] = {code: name for name, code in DTYPE_CODES.items()}
ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}


class WireError(ValueError):
    """A malformed binary tensor body; `code` is the problem type."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Header:
    dtype: str
    shape: tuple[int, ...]
    offset: int  # where the data starts

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * ITEMSIZE[self.dtype]


def header_bytes(dtype: str, shape: tuple[int, ...]) -> bytes:
    if dtype not in DTYPE_CODES:
        raise ValueError(f"unknown dtype {dtype!r}")
    return _FIXED.pack(MAGIC, DTYPE_CODES[dtype], len(shape), 0) + b"".join(_DIM.pack(d) for d in shape)


def encode(dtype: str, shape: tuple[int, ...], data: bytes | memoryview) -> bytes:
    """Header + data (the caller's raw little-endian bytes, e.g. `tensor.numpy().tobytes()`, or a
    byte view of its memory: joined in one copy)."""
    return b"".join((header_bytes(dtype, shape), data))


def parse_header(body: bytes | bytearray, *, width: int | None = None, max_rows: int | None = None) -> Header:
    """The header of a [rows, width] tensor body, checked against the body's length and the limits
    (None: any width / any number of rows, e.g. reading an answer)."""
    if len(body) < _FIXED.size:
        raise WireError("invalid-tensor", f"body of {len(body)} bytes is shorter than the tensor header")
    magic, code, ndim, _ = _FIXED.unpack_from(body)
    if magic != MAGIC:
        raise WireError("invalid-tensor", "not a tensor body (the magic is not EPT1)")
    dtype = DTYPE_NAMES.get(code)
    if dtype is None:
        raise WireError("unsupported-dtype", f"dtype code {code} (known: {DTYPE_CODES})")
    if ndim != 2:
        raise WireError("invalid-tensor", f"tokens must be a 2-D tensor [n, hidden_size], got {ndim} dims")
    offset = _FIXED.size + ndim * _DIM.size
    if len(body) < offset:
        raise WireError("invalid-tensor", "body ends inside the tensor header")
    shape = tuple(_DIM.unpack_from(body, _FIXED.size + i * _DIM.size)[0] for i in range(ndim))
    rows, cols = shape
    if width is not None and cols != width:
        raise WireError("invalid-request", f"every token needs {width} values, got {cols}")
    if max_rows is not None and not 1 <= rows <= max_rows:
        raise WireError("invalid-request", f"tokens per request must be 1..{max_rows}, got {rows}")
    header = Header(dtype, shape, offset)
    if len(body) - offset != header.nbytes:
        raise WireError(
            "invalid-tensor",
            f"shape {list(shape)} of {dtype} needs {header.nbytes} data bytes, got {len(body) - offset}",
        )
    return header


def decode(body: bytes) -> tuple[Header, memoryview]:
    """A whole tensor body: its header and a view of its data (checked to be exactly the shape's)."""
    header = parse_header(body)
    return header, memoryview(body)[header.offset :]
