"""Frames that any protobuf stack reads as the messages they are.

codedgd writes tensor bytes into frames itself (codedgd.services.framing) to copy them
once. These tests decode the frames its senders really send (θ, partition rows, a
worker's result, several chunks each) with parsers that are not Python's:

* protoc, the C++ reference implementation (``grpc_tools.protoc --decode``), in the
  default suite;
* protobufjs 7, what Node's @grpc/proto-loader parses with. It keeps only the last
  occurrence of a repeated submessage instead of merging them, which is how the
  earlier framing lost ``job_id``, ``round``, ``params`` and the chunk's fields. It
  runs under the ``foreign`` marker after ``npm ci --prefix tests/foreign`` (.ci/run).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from google.protobuf import text_format
from google.protobuf.message import Message

from codedgd.services.compute.gradient import CancelFlag
from codedgd.services.coordinator.assignment import partition_messages
from codedgd.services.coordinator.dataplane import theta_frames
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import (
    DEFAULT_CHUNK_BYTES,
    GRPC_DEFAULT_MAX_RECEIVE,
    PARTITION_DATA,
    RESULT_DATA,
    THETA_DATA,
)
from codedgd.services.worker.uploads import Upload

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
PROTO = "codedgd/v1/codedgd.proto"
FOREIGN = Path(__file__).resolve().parent / "foreign"
SMALL_CHUNK = 4096  # several chunks per tensor, so chunk 0 and later chunks both show


def _theta_frames() -> list[tuple[str, bytes]]:
    theta = np.random.default_rng(1).standard_normal(1500)
    params = {"lag.threshold": 0.125, "other": -2.5}
    frames = theta_frames("job-7f3a", 42, theta, params, SMALL_CHUNK)
    assert len(frames) == 3
    return [("CoordinatorMessage", f) for f in frames]


def _partition_frames() -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(2)
    X = sp.random(300, 40, density=0.2, format="csr", random_state=3)
    y = rng.random(300)
    frames = partition_messages("job-7f3a", 5, X, y, SMALL_CHUNK)
    assert len(frames) > 5
    return [("CoordinatorMessage", f) for f in frames]


def _result_frames() -> list[tuple[str, bytes]]:
    payload = np.random.default_rng(4).standard_normal(1100)
    upload = Upload("job-7f3a", 42, payload, 0.75, 0.5, CancelFlag(), SMALL_CHUNK, lambda n: None)
    frames = list(upload)
    assert len(frames) == 3
    return [("WorkerMessage", f) for f in frames]


def _all_frames() -> list[tuple[str, bytes]]:
    return _theta_frames() + _partition_frames() + _result_frames()


def _expected(type_name: str, frame: bytes) -> Message:
    """The message a merging parser (Python's) reads, without the alignment filler."""
    message: Message = getattr(pb, type_name).FromString(frame)
    for chunk in _chunks_in(message):
        chunk.ClearField("pad")
    return message


def _chunks_in(message: Message) -> Iterator[pb.TensorChunk]:
    if isinstance(message, pb.CoordinatorMessage):
        kind = message.WhichOneof("kind")
        if kind == "round":
            yield message.round.theta
        elif kind == "data":
            yield message.data.chunk
    elif isinstance(message, pb.WorkerMessage) and message.WhichOneof("kind") == "result":
        yield message.result.payload


def test_protoc_reads_every_frame_as_the_message_it_is(tmp_path: Path) -> None:
    for i, (type_name, frame) in enumerate(_all_frames()):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"--decode=codedgd.v1.{type_name}",
                f"-I{PROTO_DIR}",
                PROTO,
            ],
            input=frame,
            capture_output=True,
            check=False,
        )
        assert out.returncode == 0, out.stderr.decode()
        decoded = text_format.Parse(out.stdout.decode(), getattr(pb, type_name)())
        for chunk in _chunks_in(decoded):
            chunk.ClearField("pad")
        assert decoded == _expected(type_name, frame), f"frame {i}"
        assert decoded.ByteSize() > 0


def _walk(buffer: bytes) -> list[tuple[int, int, int]]:
    """(field number, start, end of value) of each length-delimited field, in wire order;
    other fields as (number, -1, -1)."""
    fields, pos = [], 0

    def varint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            byte = buffer[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    while pos < len(buffer):
        key = varint()
        wire = key & 7
        if wire == 2:
            length = varint()
            fields.append((key >> 3, pos, pos + length))
            pos += length
        else:
            if wire == 0:
                varint()
            else:
                pos += 8 if wire == 1 else 4
            fields.append((key >> 3, -1, -1))
    return fields


@pytest.mark.parametrize(
    ("frames", "path"),
    [
        (_theta_frames, THETA_DATA),
        (_partition_frames, PARTITION_DATA),
        (_result_frames, RESULT_DATA),
    ],
    ids=["theta", "partition", "result"],
)
def test_each_message_on_the_way_to_the_bytes_is_written_once_and_last(
    frames: object, path: tuple[int, ...]
) -> None:
    """What a parser that keeps the last occurrence of a submessage needs."""
    for _, frame in frames():  # type: ignore[operator]
        level = frame
        for number in path:
            fields = _walk(level)
            on_path = [f for f in fields if f[0] == number]
            assert len(on_path) == 1, f"field {number} occurs {len(on_path)} times"
            assert fields[-1] == on_path[0], f"field {number} is not the last of its message"
            _, start, end = on_path[0]
            level = level[start:end]


def test_a_default_chunk_with_its_envelope_fits_grpcs_default_message_limit() -> None:
    """A peer that never raised gRPC's 4 MiB receive limit still reads every message."""
    dim = 3 * DEFAULT_CHUNK_BYTES // 8 + 11  # full chunks and a short last one
    theta = np.ones(dim)
    params = {f"param.{i}": float(i) for i in range(8)}
    biggest = max(len(f) for f in theta_frames("f" * 64, 2**40, theta, params, DEFAULT_CHUNK_BYTES))
    upload = Upload(
        "f" * 64, 2**40, theta, 1.0, 1.0, CancelFlag(), DEFAULT_CHUNK_BYTES, lambda n: None
    )
    biggest = max(biggest, *(len(f) for f in upload))
    X = np.ones((DEFAULT_CHUNK_BYTES // 8 // 50 + 3, 50))
    rows = partition_messages("f" * 64, 2**31, X, np.ones(X.shape[0]), DEFAULT_CHUNK_BYTES)
    biggest = max(biggest, *(len(f) for f in rows))
    assert DEFAULT_CHUNK_BYTES < biggest <= GRPC_DEFAULT_MAX_RECEIVE


def _node_decode(tmp_path: Path, type_name: str, frames: list[bytes]) -> list[dict[str, object]]:
    paths = []
    for i, frame in enumerate(frames):
        path = tmp_path / f"{type_name}-{i}.bin"
        path.write_bytes(frame)
        paths.append(str(path))
    out = subprocess.run(
        [
            "node",
            str(FOREIGN / "decode.mjs"),
            str(PROTO_DIR / PROTO),
            f"codedgd.v1.{type_name}",
            *paths,
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=FOREIGN,
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def _js_chunk(obj: dict[str, object]) -> dict[str, object]:
    return {
        "key": obj["key"],
        "index": obj["index"],
        "count": obj["count"],
        "dtype": obj["dtype"],
        "shape": [int(d) for d in obj["shape"]],  # type: ignore[attr-defined]
        "data": base64.b64decode(obj["data"]),  # type: ignore[arg-type]
    }


def _py_chunk(chunk: pb.TensorChunk) -> dict[str, object]:
    return {
        "key": chunk.key,
        "index": chunk.index,
        "count": chunk.count,
        "dtype": chunk.dtype,
        "shape": list(chunk.shape),
        "data": chunk.data,
    }


@pytest.mark.foreign
def test_protobufjs_reads_every_frame_as_the_message_it_is(tmp_path: Path) -> None:
    """Node's stack (protobufjs 7, as @grpc/proto-loader uses it) on the real frames."""
    coordinator = [f for t, f in _all_frames() if t == "CoordinatorMessage"]
    for frame, js in zip(
        coordinator, _node_decode(tmp_path, "CoordinatorMessage", coordinator), strict=True
    ):
        expected = _expected("CoordinatorMessage", frame)
        if expected.WhichOneof("kind") == "round":
            start = expected.round
            assert js["round"]["jobId"] == start.job_id == "job-7f3a"  # type: ignore[index]
            assert int(js["round"]["round"]) == start.round == 42  # type: ignore[index]
            assert js["round"]["params"] == dict(start.params)  # type: ignore[index]
            assert _js_chunk(js["round"]["theta"]) == _py_chunk(start.theta)  # type: ignore[index]
        else:
            data = expected.data
            assert js["data"]["jobId"] == data.job_id == "job-7f3a"  # type: ignore[index]
            assert js["data"]["partition"] == data.partition == 5  # type: ignore[index]
            assert _js_chunk(js["data"]["chunk"]) == _py_chunk(data.chunk)  # type: ignore[index]
    first_params = [js for js in _node_decode(tmp_path, "CoordinatorMessage", coordinator[:1])]
    assert first_params[0]["round"]["params"] == {"lag.threshold": 0.125, "other": -2.5}  # type: ignore[index]
    worker = [f for t, f in _all_frames() if t == "WorkerMessage"]
    for frame, js in zip(worker, _node_decode(tmp_path, "WorkerMessage", worker), strict=True):
        result = _expected("WorkerMessage", frame).result
        assert js["result"]["jobId"] == result.job_id  # type: ignore[index]
        assert int(js["result"]["round"]) == result.round == 42  # type: ignore[index]
        assert js["result"]["computeSeconds"] == result.compute_seconds  # type: ignore[index]
        assert _js_chunk(js["result"]["payload"]) == _py_chunk(result.payload)  # type: ignore[index]
