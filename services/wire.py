"""Tensors on the wire: numpy arrays to and from TensorChunk messages.

Arrays travel as little-endian raw bytes, split into chunks of at most
``chunk_bytes`` so no single gRPC message grows past the limits both ends set.
:class:`Assembler` checks everything a peer could get wrong (dtype, shape,
chunk numbering, byte count) and raises :class:`WireError` naming it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from services.errors import WireError
from services.proto import codedgd_pb2 as pb

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
# Both ends set these explicitly: a chunk plus framing always fits.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
ALLOWED_DTYPES = frozenset({"<f8", "<f4", "<i8", "<i4", "<u4", "<u8", "|u1", "|b1"})

GRPC_OPTIONS: Sequence[tuple[str, int]] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
SERVER_OPTIONS: Sequence[tuple[str, int]] = (
    *GRPC_OPTIONS,
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.so_reuseport", 0),
)


def _wire_dtype(array: np.ndarray) -> np.dtype:
    dt = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    return dt


@dataclass(frozen=True)
class Chunk:
    """One chunk's fields; :meth:`fill` writes them into a TensorChunk in place.

    Filling a chunk that already sits inside its envelope (``msg.result.payload``)
    avoids the deep copies protobuf makes when a submessage is passed to a
    constructor: a result is copied once, into its message.
    """

    key: str
    index: int
    count: int
    dtype: str
    shape: tuple[int, ...]
    data: bytes

    def fill(self, target: pb.TensorChunk) -> None:
        target.key = self.key
        target.index = self.index
        target.count = self.count
        target.dtype = self.dtype
        target.shape.extend(self.shape)
        target.data = self.data

    def message(self) -> pb.TensorChunk:
        out = pb.TensorChunk()
        self.fill(out)
        return out


def chunks(key: str, array: np.ndarray, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[Chunk]:
    """Split ``array`` into chunks (at least one, even when empty), little-endian.

    The array's buffer is sliced through a memoryview, so each byte is copied
    once, into its chunk.
    """
    dt = _wire_dtype(array)
    contiguous = np.ascontiguousarray(array, dtype=dt)
    view = contiguous.reshape(-1).data.cast("B")
    nbytes = view.nbytes
    step = max(1, chunk_bytes - chunk_bytes % max(dt.itemsize, 1))
    count = max(1, -(-nbytes // step))
    shape = tuple(int(d) for d in array.shape)
    for index in range(count):
        data = bytes(view[index * step : (index + 1) * step])
        yield Chunk(key, index, count, dt.str, shape, data)


def tensor_chunks(
    key: str, array: np.ndarray, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[pb.TensorChunk]:
    """Split ``array`` into standalone TensorChunk messages."""
    for c in chunks(key, array, chunk_bytes):
        yield c.message()


def to_array(chunk: pb.TensorChunk) -> np.ndarray:
    """Decode a single-chunk tensor (count == 1)."""
    asm = Assembler(chunk.key)
    out = asm.add(chunk)
    if out is None:
        raise WireError(f"tensor {chunk.key!r} has {chunk.count} chunks; expected one")
    return out


class Assembler:
    """Collects the chunks of one tensor, in order, and checks them."""

    def __init__(
        self,
        key: str,
        *,
        dtype: str | None = None,
        shape: tuple[int, ...] | None = None,
        max_bytes: int = 8 * 1024**3,
    ) -> None:
        self.key = key
        self._dtype = dtype
        self._shape = shape
        self._max_bytes = max_bytes
        self._parts: list[bytes] = []
        self._buffer: bytearray | None = None
        self._filled = 0
        self._received = 0
        self._count = 0
        self._first: pb.TensorChunk | None = None

    def add(self, chunk: pb.TensorChunk) -> np.ndarray | None:
        """Add the next chunk; return the array once the last chunk arrived."""
        if chunk.key != self.key:
            raise WireError(f"expected a chunk of tensor {self.key!r}, got {chunk.key!r}")
        if self._first is None:
            self._start(chunk)
        first = self._first
        assert first is not None
        if chunk.index != self._received:
            raise WireError(
                f"tensor {self.key!r}: chunk {chunk.index} arrived, expected chunk {self._received}"
            )
        if (
            chunk.count != first.count
            or chunk.dtype != first.dtype
            or list(chunk.shape) != list(first.shape)
        ):
            raise WireError(f"tensor {self.key!r}: chunk {chunk.index} disagrees with chunk 0")
        self._received += 1
        data = chunk.data
        if self._count == 1:
            self._parts.append(data)  # the common case: no copy at all
        else:
            end = self._filled + len(data)
            if self._buffer is None:
                self._buffer = bytearray(self._nbytes)
            if end > self._nbytes:
                raise WireError(
                    f"tensor {self.key!r}: more than the {self._nbytes} bytes of its shape"
                )
            self._buffer[self._filled : end] = data
            self._filled = end
        if self._received < self._count:
            return None
        return self._finish()

    def _start(self, chunk: pb.TensorChunk) -> None:
        if chunk.dtype not in ALLOWED_DTYPES:
            raise WireError(
                f"tensor {self.key!r}: dtype {chunk.dtype!r} is not allowed "
                f"(allowed: {', '.join(sorted(ALLOWED_DTYPES))})"
            )
        if self._dtype is not None and chunk.dtype != self._dtype:
            raise WireError(f"tensor {self.key!r}: dtype {chunk.dtype!r}, expected {self._dtype!r}")
        shape = tuple(int(d) for d in chunk.shape)
        if any(d < 0 for d in shape):
            raise WireError(f"tensor {self.key!r}: negative dimension in shape {shape}")
        if self._shape is not None and shape != self._shape:
            raise WireError(f"tensor {self.key!r}: shape {shape}, expected {self._shape}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(chunk.dtype).itemsize
        if nbytes > self._max_bytes:
            raise WireError(
                f"tensor {self.key!r}: {nbytes} bytes exceeds the limit {self._max_bytes}"
            )
        if chunk.count < 1 or chunk.index != 0:
            raise WireError(
                f"tensor {self.key!r}: first chunk must have index 0 and count >= 1, "
                f"got index {chunk.index}, count {chunk.count}"
            )
        self._first = chunk
        self._count = chunk.count
        self._nbytes = nbytes

    def _finish(self) -> np.ndarray:
        first = self._first
        assert first is not None
        data: bytes | bytearray = (
            self._parts[0]
            if self._count == 1
            else (self._buffer if self._buffer is not None else b"")
        )
        size = len(data) if self._count == 1 else self._filled
        if size != self._nbytes:
            raise WireError(
                f"tensor {self.key!r}: {size} bytes for shape {tuple(first.shape)} "
                f"of {first.dtype} ({self._nbytes} bytes expected)"
            )
        shape = tuple(int(d) for d in first.shape)
        return np.frombuffer(data, dtype=np.dtype(first.dtype)).reshape(shape)
