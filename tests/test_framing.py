"""Framed messages are plain protobuf both ways; tensor bytes come out aligned and in place."""

from __future__ import annotations

import numpy as np
import pytest

from codedgd.services.errors import WireError
from codedgd.services.framing import field_path, parse, serialize
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import (
    ALIGN,
    COORDINATOR_TENSOR_PATHS,
    RESULT_DATA,
    THETA_DATA,
    WORKER_TENSOR_PATHS,
    Assembler,
    BufferPool,
    chunks,
    framed,
)


def _address(buffer: object) -> int:
    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)  # type: ignore[call-overload]


def _result(
    job_id: str, round_: int, data: bytes, length: int | None = None, **payload: object
) -> pb.WorkerMessage:
    """A result message; ``length`` (the tensor's shape) defaults to ``len(data) // 8``."""
    message = pb.WorkerMessage()
    message.result.job_id = job_id
    message.result.round = round_
    message.result.compute_seconds = 0.25
    message.result.payload.key = "gradient"
    message.result.payload.count = 1
    message.result.payload.dtype = "<f8"
    message.result.payload.shape.extend([len(data) // 8 if length is None else length])
    for name, value in payload.items():
        setattr(message.result.payload, name, value)
    message.result.payload.data = data
    return message


def test_paths_follow_the_proto() -> None:
    assert RESULT_DATA == (3, 3, 6)
    assert THETA_DATA == (6, 3, 6)
    assert field_path(pb.CoordinatorMessage, "data.chunk.data") == (4, 3, 6)
    with pytest.raises(ValueError, match="not a message field"):
        field_path(pb.WorkerMessage, "result.round.data")


@pytest.mark.parametrize("n_bytes", [0, 8, 1000, 70_000, 300_000])
@pytest.mark.parametrize("pad", [False, True])
def test_serialize_equals_protobuf_with_the_field_set(n_bytes: int, pad: bool) -> None:
    data = np.random.default_rng(n_bytes).bytes(n_bytes)
    full = _result("job-1", 7, data)
    envelope = _result("job-1", 7, b"", n_bytes // 8)
    frame = (
        framed(envelope, RESULT_DATA, memoryview(data))
        if pad
        else serialize(envelope, RESULT_DATA, data)
    )
    parsed = pb.WorkerMessage.FromString(frame)  # what any protobuf receiver sees
    assert parsed.result.payload.data == data
    parsed.result.payload.ClearField("pad")
    assert parsed == full


@pytest.mark.parametrize("job_id", ["", "j", "x" * 200], ids=["empty", "short", "long"])
@pytest.mark.parametrize("n_bytes", [0, 8, 120, 128, 136, 4096, 16376, 16384, 1 << 20])
def test_framed_data_starts_aligned_and_is_read_in_place(job_id: str, n_bytes: int) -> None:
    data = np.arange(n_bytes // 8, dtype="<f8").tobytes()
    frame = framed(_result(job_id, 3, b"", n_bytes // 8), RESULT_DATA, data)
    got = parse(pb.WorkerMessage, frame, WORKER_TENSOR_PATHS)
    assert got.data is not None and bytes(got.data) == data
    assert got.size == len(frame)
    offset = _address(got.data) - _address(frame) if n_bytes else 0
    assert offset % ALIGN == 0
    assert got.message.result.job_id == job_id and got.message.result.round == 3
    assert got.message.result.payload.data == b""  # kept out of the parsed message
    asm = Assembler("gradient", dtype="<f8", shape=(n_bytes // 8,))
    array = asm.add(got.message.result.payload, got.data)
    assert array is not None and np.array_equal(array, np.arange(n_bytes // 8, dtype="<f8"))
    if n_bytes:
        assert np.shares_memory(array, np.frombuffer(frame, dtype=np.uint8))


def test_plain_protobuf_frames_parse_the_same() -> None:
    """A client that serializes with protobuf alone (no framing) is understood."""
    rng = np.random.default_rng(1)
    for trial in range(50):
        data = rng.bytes(int(rng.integers(0, 5000)))
        message = _result(f"job{trial}", int(rng.integers(0, 2**40)), data, index=0)
        buffer = message.SerializeToString()
        got = parse(pb.WorkerMessage, buffer, WORKER_TENSOR_PATHS)
        assert got.data is not None and bytes(got.data) == data
        message.result.payload.ClearField("data")
        assert got.message == message


def test_a_repeated_data_field_keeps_the_last_value_like_protobuf() -> None:
    first = _result("j", 1, b"A" * 16, 3).SerializeToString()
    second = serialize(pb.WorkerMessage(), RESULT_DATA, b"B" * 24)
    buffer = first + second  # protobuf merges the two occurrences of result.payload
    got = parse(pb.WorkerMessage, buffer, WORKER_TENSOR_PATHS)
    assert got.data is not None and bytes(got.data) == b"B" * 24
    assert pb.WorkerMessage.FromString(buffer).result.payload.data == b"B" * 24
    assert got.message.result.job_id == "j"


def test_theta_frames_carry_params_and_parse_on_both_paths() -> None:
    theta = np.linspace(-1.0, 1.0, 1000)
    frames = []
    for c in chunks("theta", theta, 1024):
        message = pb.CoordinatorMessage()
        message.round.job_id = "j"
        message.round.round = 2
        if c.index == 0:
            message.round.params.update({"lag.threshold": 0.5})
        c.fill(message.round.theta, with_data=False)
        frames.append(framed(message, THETA_DATA, c.data))
    asm = Assembler("theta", dtype="<f8")
    out = None
    for i, frame in enumerate(frames):
        got = parse(pb.CoordinatorMessage, frame, COORDINATOR_TENSOR_PATHS)
        assert got.message.round.params.get("lag.threshold") == (0.5 if i == 0 else None)
        out = asm.add(got.message.round.theta, got.data)
    assert out is not None and np.array_equal(out, theta)


def test_messages_without_tensors_take_the_plain_path() -> None:
    hello = pb.WorkerMessage(hello=pb.Hello(name="w", protocol="codedgd.v1"))
    got = parse(pb.WorkerMessage, hello.SerializeToString(), WORKER_TENSOR_PATHS)
    assert got.message == hello and got.data is None
    empty = parse(pb.WorkerMessage, b"", WORKER_TENSOR_PATHS)
    assert empty.message == pb.WorkerMessage() and empty.data is None


@pytest.mark.parametrize(
    "buffer",
    [
        b"\x1a\x10\x1a\x05",  # result claims 16 bytes, payload runs past it
        b"\x1a\x05\x08",  # truncated
        b"\x1a" + b"\xff" * 11,  # a varint longer than 10 bytes
        b"\x1a\x02\x0b\x00",  # a group (wire type 3) inside result
        b"\xff\xff\xff\xff\x0f\x00",  # not a WorkerMessage at all
    ],
)
def test_malformed_frames_raise_wire_error(buffer: bytes) -> None:
    with pytest.raises(WireError, match="malformed WorkerMessage frame"):
        parse(pb.WorkerMessage, buffer, WORKER_TENSOR_PATHS)


def test_unaligned_bytes_from_other_senders_are_copied_to_an_aligned_array() -> None:
    raw = bytearray(8 * 4 + 1)
    view = memoryview(raw)[1:]  # 1 byte off: no numpy allocator hands that out
    view[:] = np.arange(4.0).tobytes()
    chunk = pb.TensorChunk(key="g", index=0, count=1, dtype="<f8", shape=[4])
    out = Assembler("g").add(chunk, view)
    assert out is not None and np.array_equal(out, np.arange(4.0))
    assert out.ctypes.data % ALIGN == 0


def test_buffer_pool_reuses_only_buffers_no_one_holds() -> None:
    pool = BufferPool(limit=2)
    a = pool.take(64)
    a_id = id(a)
    kept = a.view("<f8")[2:]  # a policy keeping a payload keeps its buffer
    del a
    b = pool.take(64)
    assert id(b) != a_id
    del kept
    assert id(pool.take(64)) in (a_id, id(b))  # free again
    del b
    assert len(pool) == 2
    held = [pool.take(64), pool.take(64), pool.take(64)]  # over the limit: not kept
    assert len({id(h) for h in held}) == 3 and len(pool) == 2
    assert pool.take(32).nbytes == 32  # another size is never handed a wrong buffer


def test_a_large_frame_whose_tensor_comes_last_is_read_in_place() -> None:
    """PeerData starts with its job and round, its tensor comes last: a large frame is
    still walked, and the tensor's bytes come out as a view, not inside the message."""
    from codedgd.services.wire import PEER_TENSOR_PATHS
    from codedgd.services.worker.topology import peer_frames

    values = np.arange(1000.0)
    (raw,) = list(peer_frames("j", 3, 1, 2, "reduce", "gradient", values, 1 << 20))
    got = parse(pb.PeerData, raw, PEER_TENSOR_PATHS)
    assert got.data is not None and np.array_equal(np.frombuffer(got.data), values)
    assert (got.message.round, got.message.attempt, got.message.sender) == (3, 1, 2)
    assert not got.message.tensor.data and got.message.tensor.shape == [1000]
