"""Tensors on the wire: numpy arrays to and from TensorChunk messages.

Arrays travel as little-endian raw bytes, split into chunks of at most
``chunk_bytes`` so no single gRPC message grows past the limits both ends set.
:class:`Assembler` checks everything a peer could get wrong (dtype, shape,
chunk numbering, byte count) and raises :class:`WireError` naming it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import Message

from codedgd.services.errors import ConfigError, NonFiniteError, WireError
from codedgd.services.framing import ALIGN, Path, field_path, serialize
from codedgd.services.proto import codedgd_pb2 as pb

# A full chunk plus its envelope stays under gRPC's default 4 MiB receive limit, so a peer
# that never raised that limit still reads every message (64 KiB is left for the envelope).
GRPC_DEFAULT_MAX_RECEIVE = 4 * 1024 * 1024
DEFAULT_CHUNK_BYTES = GRPC_DEFAULT_MAX_RECEIVE - 64 * 1024
# The smallest chunk a sender may be set to cut (--chunk-bytes): below it the per-message
# cost swamps the bytes (bench/bench_chunks.py measures where).
MIN_CHUNK_BYTES = 4096
# Both ends set these explicitly: a chunk plus framing always fits, with room for a
# foreign sender that cuts chunks up to 4 MiB and a large envelope. Kept small so one
# message (which gRPC buffers whole before a handler sees it) costs a server little.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
ALLOWED_DTYPES = frozenset({"<f8", "<f4", "<i8", "<i4", "<u4", "<u8", "|u1", "|b1"})

# Where the tensor bytes sit in the stream messages (see codedgd.services.framing).
RESULT_DATA = field_path(pb.WorkerMessage, "result.payload.data")
THETA_DATA = field_path(pb.CoordinatorMessage, "round.theta.data")
PARTITION_DATA = field_path(pb.CoordinatorMessage, "data.chunk.data")
PEER_DATA = field_path(pb.PeerData, "tensor.data")
WORKER_TENSOR_PATHS = (RESULT_DATA,)
COORDINATOR_TENSOR_PATHS = (THETA_DATA, PARTITION_DATA)
PEER_TENSOR_PATHS = (PEER_DATA,)
PAD_FIELD = pb.TensorChunk.DESCRIPTOR.fields_by_name["pad"].number


def check_chunk_bytes(value: int) -> None:
    """Refuse a chunk size (``--chunk-bytes``) outside what every receiver reads."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"--chunk-bytes must be a whole number of bytes, got {value!r}")
    if not MIN_CHUNK_BYTES <= value <= DEFAULT_CHUNK_BYTES:
        raise ConfigError(
            f"--chunk-bytes {value}: a chunk must be {MIN_CHUNK_BYTES:,} to "
            f"{DEFAULT_CHUNK_BYTES:,} bytes (the largest keeps a chunk and its envelope "
            "under gRPC's default 4 MiB message limit)"
        )


def check_timings(timings: Sequence[pb.WorkerTiming], sender: int, below: Sequence[int]) -> None:
    """WorkerTiming entries of a message (Result.timings, PeerData.timings; a star's
    Result: its sender's own alone):
    each of the sender or a worker it names below it, once, with finite seconds,
    0 <= compute_seconds <= ready_seconds. Raises WireError naming the first bad one."""
    allowed = {sender, *below}
    seen: set[int] = set()
    for timing in timings:
        worker, compute, ready = int(timing.worker), timing.compute_seconds, timing.ready_seconds
        if worker not in allowed:
            raise WireError(
                f"a timing of worker {worker}, which is neither the sender ({sender}) nor "
                "one of the contributors it names"
            )
        if worker in seen:
            raise WireError(f"two timings of worker {worker}")
        seen.add(worker)
        if not (math.isfinite(compute) and math.isfinite(ready) and 0 <= compute <= ready):
            raise WireError(
                f"worker {worker}'s timing is not 0 <= compute_seconds <= ready_seconds "
                f"(finite): compute {compute!r}, ready {ready!r}"
            )


def framed(envelope: Message, path: Path, data: bytes | memoryview) -> bytes:
    """``envelope`` serialized with its chunk's ``data`` on ``path``, aligned for the receiver.

    The chunk's other fields must already be set (:meth:`Chunk.fill` with
    ``with_data=False``); see :mod:`codedgd.services.framing`.
    """
    return serialize(envelope, path, data, pad_field=PAD_FIELD)


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

    ``data`` is a view of the array that was split (no copy): serialize the chunk
    (:func:`framed`, or :meth:`fill` then ``SerializeToString``) before that array
    changes. Filling a chunk that already sits inside its envelope
    (``msg.result.payload``) avoids the deep copies protobuf makes when a submessage
    is passed to a constructor.
    """

    key: str
    index: int
    count: int
    dtype: str
    shape: tuple[int, ...]
    data: memoryview

    def fill(self, target: pb.TensorChunk, *, with_data: bool = True) -> None:
        """Write the fields into ``target``; ``with_data=False`` leaves ``data`` for framing."""
        target.key = self.key
        target.index = self.index
        target.count = self.count
        target.dtype = self.dtype
        target.shape.extend(self.shape)
        if with_data:
            target.data = bytes(self.data)

    def message(self) -> pb.TensorChunk:
        out = pb.TensorChunk()
        self.fill(out)
        return out


def chunks(key: str, array: np.ndarray, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[Chunk]:
    """Split ``array`` into chunks (at least one, even when empty), little-endian.

    The chunks' data are memoryview slices of the (little-endian, contiguous) array:
    nothing is copied until a chunk is serialized.
    """
    dt = _wire_dtype(array)
    contiguous = np.ascontiguousarray(array, dtype=dt)
    view = contiguous.reshape(-1).data.cast("B")
    nbytes = view.nbytes
    step = max(1, chunk_bytes - chunk_bytes % max(dt.itemsize, 1))
    count = max(1, -(-nbytes // step))
    shape = tuple(int(d) for d in array.shape)
    for index in range(count):
        yield Chunk(key, index, count, dt.str, shape, view[index * step : (index + 1) * step])


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


class BufferPool:
    """Byte buffers reused across rounds for assembling chunked tensors.

    A fresh multi-MiB buffer every round costs a page fault per 4 KiB page, more
    than the copy into it. A buffer is handed out again only when nothing but the
    pool refers to it: a payload a policy keeps (LAG's latest gradients, a code's
    stored results), θ still read by a cancelled computation, or any array viewing
    the buffer keeps it out of the pool. At most ``limit`` buffers are kept.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buffers: list[np.ndarray] = []

    def take(self, nbytes: int) -> np.ndarray:
        """An uninitialised uint8 buffer of ``nbytes`` no one else holds."""
        for buffer in self._buffers:
            # References: the list, this loop variable, getrefcount's argument.
            if buffer.nbytes == nbytes and sys.getrefcount(buffer) == 3:
                return buffer
        buffer = np.empty(nbytes, dtype=np.uint8)
        if len(self._buffers) < self.limit:
            self._buffers.append(buffer)
        return buffer

    def __len__(self) -> int:
        return len(self._buffers)


# A tensor's rank at most (numpy's own limit is 64; codedgd's tensors have 1 or 2).
MAX_DIMS = 32


class Assembler:
    """Collects the chunks of one tensor, in order, and checks them.

    A single-chunk tensor is returned as a read-only view of the chunk's bytes (no
    copy) when they are 16-byte aligned, as codedgd's senders arrange; the chunks of
    a larger one are copied once, into an uninitialised buffer of the tensor's size
    (from ``pool`` when given, so rounds reuse buffers).

    With ``finite`` a chunk of floats holding NaN or inf is refused (NonFiniteError)
    before it is used. With ``add_into`` (a float64 vector of the tensor's shape) nothing
    is assembled:
    each chunk is added into that vector's matching slice as it arrives, and the
    vector is returned once the last chunk is in. A chunk that fails a check leaves
    the chunks before it added. ``skip_bytes`` (with ``add_into``) is how many leading
    bytes of the tensor are in that vector already, from an earlier sender of the same
    values that was lost part-way (:attr:`added_bytes`): they are checked, not added again.
    """

    def __init__(
        self,
        key: str,
        *,
        dtype: str | None = None,
        shape: tuple[int, ...] | None = None,
        max_bytes: int = 8 * 1024**3,
        pool: BufferPool | None = None,
        add_into: np.ndarray | None = None,
        skip_bytes: int = 0,
        finite: bool = False,
    ) -> None:
        if add_into is not None and (
            add_into.dtype != np.float64 or dtype != "<f8" or shape != add_into.shape
        ):
            raise ValueError("add_into needs dtype='<f8' and the float64 vector's own shape")
        if skip_bytes and (add_into is None or skip_bytes % 8 or skip_bytes > add_into.nbytes):
            raise ValueError("skip_bytes needs add_into and whole float64s within it")
        self._skip = skip_bytes
        self._finite = finite
        self.key = key
        self._pool = pool
        self._add_into = add_into
        self._dtype = dtype
        self._shape = shape
        self._max_bytes = max_bytes
        self._single: bytes | memoryview | None = None
        self._buffer: np.ndarray | None = None
        self._filled = 0
        self._received = 0
        self._count = 0
        self._nbytes = 0
        self._first: pb.TensorChunk | None = None

    def add(
        self, chunk: pb.TensorChunk, data: bytes | memoryview | None = None
    ) -> np.ndarray | None:
        """Add the next chunk; return the array once the last chunk arrived.

        ``data`` is the chunk's bytes when they travelled outside the parsed message
        (:func:`codedgd.services.framing.parse`); otherwise ``chunk.data`` is used.
        """
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
        if data is None:
            data = chunk.data
        if self._finite:
            self._check_finite(chunk, data)
        if self._add_into is not None:
            self._add(data)
        elif self._count == 1:
            self._single = data  # the common case: no copy at all
            self._filled = len(data)
        else:
            end = self._filled + len(data)
            if end > self._nbytes:
                raise WireError(
                    f"tensor {self.key!r}: more than the {self._nbytes} bytes of its shape"
                )
            if self._buffer is None:
                self._buffer = (
                    self._pool.take(self._nbytes)
                    if self._pool is not None
                    else np.empty(self._nbytes, dtype=np.uint8)
                )
            self._buffer[self._filled : end] = np.frombuffer(data, dtype=np.uint8)
            self._filled = end
        if self._received < self._count:
            return None
        return self._finish()

    def _check_finite(self, chunk: pb.TensorChunk, data: bytes | memoryview) -> None:
        """Refuse a chunk of a float tensor that holds NaN or inf (before it is used)."""
        dtype = np.dtype(chunk.dtype)
        if dtype.kind != "f" or len(data) % dtype.itemsize:
            return  # not floats, or a length the other checks refuse
        values = np.frombuffer(data, dtype=dtype)
        if not np.isfinite(values).all():
            bad = int(np.count_nonzero(~np.isfinite(values)))
            raise NonFiniteError(
                f"tensor {self.key!r}: chunk {chunk.index} holds {bad} value(s) that are not "
                "finite numbers (NaN or inf)"
            )

    def _add(self, data: bytes | memoryview) -> None:
        """Add a chunk's float64 values into ``add_into`` at the bytes filled so far."""
        assert self._add_into is not None
        end = self._filled + len(data)
        if end > self._nbytes or len(data) % 8:
            raise WireError(
                f"tensor {self.key!r}: chunk {self._received - 1} of {len(data)} bytes does "
                f"not fit the {self._nbytes - self._filled} bytes left of whole float64s"
            )
        start = max(self._filled, self._skip)  # bytes before start are in the sum already
        if start < end:
            target = self._add_into[start // 8 : end // 8]
            values = np.frombuffer(data, dtype="<f8")[(start - self._filled) // 8 :]
            np.add(target, values, out=target)
        self._filled = end

    @property
    def added_bytes(self) -> int:
        """With ``add_into``: how many leading bytes of the tensor are in it so far."""
        return max(self._filled, self._skip)

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
        if len(shape) > MAX_DIMS:
            raise WireError(
                f"tensor {self.key!r}: {len(shape)} dimensions, at most {MAX_DIMS} allowed"
            )
        # With a 0 among them the other dimensions could still be past what numpy can
        # shape: they are bounded as if the tensor held data.
        if math.prod(d for d in shape if d) * np.dtype(chunk.dtype).itemsize > self._max_bytes:
            raise WireError(
                f"tensor {self.key!r}: shape {shape} exceeds the limit of {self._max_bytes} bytes"
            )
        if self._shape is not None and shape != self._shape:
            raise WireError(f"tensor {self.key!r}: shape {shape}, expected {self._shape}")
        nbytes = math.prod(shape) * np.dtype(chunk.dtype).itemsize
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
        if self._filled != self._nbytes:
            raise WireError(
                f"tensor {self.key!r}: {self._filled} bytes for shape {tuple(first.shape)} "
                f"of {first.dtype} ({self._nbytes} bytes expected)"
            )
        if self._add_into is not None:
            return self._add_into
        shape = tuple(int(d) for d in first.shape)
        data: bytes | memoryview | np.ndarray = (
            self._single if self._single is not None else self._buffer_or_empty()
        )
        dtype = np.dtype(first.dtype)
        array = (
            data.view(dtype).reshape(shape)
            if isinstance(data, np.ndarray)
            else np.frombuffer(data, dtype=dtype).reshape(shape)
        )
        if array.ctypes.data % ALIGN:
            # Bytes that were not aligned in their frame (a sender that does not pad):
            # numpy and BLAS take other code paths on such arrays, with other rounding.
            array = array.copy()
        return array

    def _buffer_or_empty(self) -> np.ndarray:
        return self._buffer if self._buffer is not None else np.empty(0, dtype=np.uint8)
