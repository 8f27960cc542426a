"""Tensors survive chunking; malformed chunks are refused with a clear WireError."""

from __future__ import annotations

import numpy as np
import pytest

from codedgd.services.errors import WireError
from codedgd.services.proto import codedgd_pb2 as pb
from codedgd.services.wire import Assembler, tensor_chunks, to_array


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


def test_add_into_sums_the_chunks_in_place() -> None:
    total = np.arange(10.0)
    start = total.copy()
    x = np.random.default_rng(1).standard_normal(10)
    asm = Assembler("gradient", dtype="<f8", shape=(10,), add_into=total)
    out = None
    for c in tensor_chunks("gradient", x, chunk_bytes=24):  # 4 chunks: 3 + 3 + 3 + 1 floats
        assert out is None
        out = asm.add(c)
    assert out is total
    np.testing.assert_array_equal(total, start + x)


@pytest.mark.parametrize("skip_floats", [0, 2, 3, 5, 10])
def test_add_into_skips_the_values_a_lost_sender_already_added(skip_floats: int) -> None:
    """A sender lost after adding a prefix; its replacement adds the rest, even when the
    prefix ends inside one of its chunks (3 floats a chunk here)."""
    x = np.random.default_rng(2).standard_normal(10)
    total = np.zeros(10)
    total[:skip_floats] = x[:skip_floats]  # what the lost sender left in the sum
    asm = Assembler(
        "gradient", dtype="<f8", shape=(10,), add_into=total, skip_bytes=8 * skip_floats
    )
    for c in tensor_chunks("gradient", x, chunk_bytes=24):
        asm.add(c)
        assert asm.added_bytes >= 8 * skip_floats
    np.testing.assert_array_equal(total, x)
    assert asm.added_bytes == 80


def test_skip_bytes_must_be_whole_float64s_of_the_sum() -> None:
    for bad in (4, 88):
        with pytest.raises(ValueError, match="skip_bytes"):
            Assembler("gradient", dtype="<f8", shape=(10,), add_into=np.zeros(10), skip_bytes=bad)
    with pytest.raises(ValueError, match="skip_bytes"):
        Assembler("gradient", dtype="<f8", shape=(10,), skip_bytes=8)


def test_add_into_refuses_a_chunk_of_partial_floats() -> None:
    total = np.zeros(4)
    asm = Assembler("gradient", dtype="<f8", shape=(4,), add_into=total)
    chunk = pb.TensorChunk(
        key="gradient", index=0, count=2, dtype="<f8", shape=[4], data=b"\0" * 12
    )
    with pytest.raises(WireError, match="whole float64s"):
        asm.add(chunk)
    np.testing.assert_array_equal(total, np.zeros(4))


def test_add_into_needs_float64_of_the_tensor_shape() -> None:
    with pytest.raises(ValueError, match="add_into"):
        Assembler("gradient", dtype="<f4", shape=(4,), add_into=np.zeros(4))
    with pytest.raises(ValueError, match="add_into"):
        Assembler("gradient", dtype="<f8", shape=(5,), add_into=np.zeros(4))


def test_a_float_tensor_with_nan_or_inf_is_refused_before_it_is_used() -> None:
    from codedgd.services.errors import NonFiniteError

    values = np.arange(10.0)
    values[7] = np.inf
    first, second = list(tensor_chunks("gradient", values, chunk_bytes=40))
    into = np.zeros(10)
    asm = Assembler("gradient", dtype="<f8", shape=(10,), add_into=into, finite=True)
    assert asm.add(first) is None  # the finite half is added
    with pytest.raises(NonFiniteError, match=r"chunk 1 holds 1 value\(s\) that are not finite"):
        asm.add(second)
    assert np.array_equal(into[:5], np.arange(5.0)) and not into[5:].any()
    # Integers are never "not finite", and the default takes floats as they are.
    assert Assembler("y").add(next(tensor_chunks("y", values))) is not None


def test_a_ring_or_tree_messages_timings_are_checked_before_they_are_recorded() -> None:
    """Each timing is of the sender or a contributor it names, once, with finite
    0 <= compute <= ready: what tune would fit from is never taken absurd."""
    from codedgd.services.wire import check_timings

    def timing(w: int, compute: float = 0.1, ready: float = 0.2) -> pb.WorkerTiming:
        return pb.WorkerTiming(worker=w, compute_seconds=compute, ready_seconds=ready)

    check_timings([timing(3), timing(5), timing(4, 0.0, 0.0)], 3, [4, 5])  # all good
    check_timings([], 3, [4, 5])  # a star's result, or a worker of an older version
    for bad, why in [
        ([timing(6)], "worker 6, which is neither the sender"),
        ([timing(4), timing(4)], "two timings of worker 4"),
        ([timing(4, 0.3, 0.2)], "compute 0.3, ready 0.2"),
        ([timing(4, -1.0)], "compute -1.0"),
        ([timing(4, 0.1, float("nan"))], "ready nan"),
    ]:
        with pytest.raises(WireError, match=why):
            check_timings(bad, 3, [4, 5])
