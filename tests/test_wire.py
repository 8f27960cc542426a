"""Tensors survive chunking; malformed chunks are refused with a clear WireError."""

from __future__ import annotations

import numpy as np
import pytest

from services.errors import WireError
from services.proto import codedgd_pb2 as pb
from services.wire import Assembler, tensor_chunks, to_array


@pytest.mark.parametrize("size,chunk", [(0, 64), (1, 64), (1000, 64), (1000, 8000), (1001, 24)])
def test_roundtrip(size: int, chunk: int) -> None:
    x = np.random.default_rng(0).standard_normal(size)
    chunks = list(tensor_chunks("v", x, chunk))
    assert len(chunks) == max(1, -(-size * 8 // chunk))
    assert all(len(c.data) <= chunk for c in chunks)
    asm = Assembler("v", dtype="<f8", shape=(size,))
    out = None
    for c in chunks:
        out = asm.add(c)
    assert out is not None and np.array_equal(out, x)


def test_big_endian_input_is_sent_little_endian() -> None:
    x = np.arange(5, dtype=">f8")
    (c,) = tensor_chunks("v", x)
    assert c.dtype == "<f8"
    assert np.array_equal(to_array(c), np.arange(5.0))


def _chunk(**kw: object) -> pb.TensorChunk:
    base = {
        "key": "g",
        "index": 0,
        "count": 1,
        "dtype": "<f8",
        "shape": [3],
        "data": np.zeros(3).tobytes(),
    }
    base.update(kw)
    return pb.TensorChunk(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"shape": [4]}, "shape (4,), expected (3,)"),
        ({"dtype": "<f4"}, "dtype '<f4', expected '<f8'"),
        ({"dtype": "object"}, "not allowed"),
        ({"data": b"\x00" * 7}, "7 bytes"),
        ({"index": 1, "count": 2}, "index 0"),
        ({"key": "theta"}, "expected a chunk of tensor 'g'"),
    ],
)
def test_malformed_chunks_are_refused(bad: dict[str, object], message: str) -> None:
    asm = Assembler("g", dtype="<f8", shape=(3,))
    with pytest.raises(WireError, match=message.replace("(", r"\(").replace(")", r"\)")):
        asm.add(_chunk(**bad))


def test_out_of_order_chunk_is_refused() -> None:
    chunks = list(tensor_chunks("g", np.zeros(10), 16))
    asm = Assembler("g")
    asm.add(chunks[0])
    with pytest.raises(WireError, match="expected chunk 1"):
        asm.add(chunks[2])
