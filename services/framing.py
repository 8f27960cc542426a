"""Tensor bytes in and out of protobuf frames with one copy at most.

A round moves ℓ float64 down to every worker and back. Building and parsing those
messages with protobuf alone copies the tensor bytes three times on the way out
(``bytes(view)``, the field assignment, ``SerializeToString``) and twice on the way
in (the parse, then reading ``.data``). This module keeps the messages plain
protobuf on the wire (any protobuf client can still speak to us) but treats the
one big field, ``TensorChunk.data``, specially:

* :func:`serialize` writes the envelope through protobuf with ``data`` left empty,
  then appends the same nested fields once more carrying only ``data``. Protobuf
  merges repeated occurrences of a singular message field and keeps the last value
  of a scalar, so the result parses to exactly the message with ``data`` set. The
  tensor bytes are copied once, into the frame.
* :func:`parse` walks the wire format along the known paths to ``data`` (a few
  varints per level), hands protobuf the frame *without* that field, and returns the
  field's bytes as a zero-copy ``memoryview`` of the received buffer.
* A filler field beside ``data`` (``TensorChunk.pad``) places the bytes at a
  multiple of 16 from the start of the frame, as numpy would align them, so the
  receiver's array takes the same numpy/BLAS code paths (and rounding) as any other.

A path is the field numbers from the envelope down to ``data``, e.g. WorkerMessage
``result`` (3) → Result ``payload`` (3) → TensorChunk ``data`` (6).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import DecodeError, Message

from services.errors import WireError

M = TypeVar("M", bound=Message)
Path = tuple[int, ...]

_LEN = 2  # wire type of length-delimited fields (strings, bytes, messages)
# numpy's own buffers are 16-byte aligned, and so are Python bytes objects' contents:
# tensor bytes at a multiple of 16 in a received frame make arrays like numpy's.
ALIGN = 16


@dataclass(frozen=True)
class Frame(Generic[M]):
    """A parsed message, its tensor bytes (if it carried any) and its size on the wire."""

    message: M
    data: memoryview | None
    size: int


def field_path(cls: type[Message], dotted: str) -> Path:
    """The field numbers of ``dotted`` (e.g. ``"result.payload.data"``) in message ``cls``."""
    names = dotted.split(".")
    message_type = cls.DESCRIPTOR
    numbers = []
    for depth, name in enumerate(names):
        field = message_type.fields_by_name[name]
        numbers.append(field.number)
        if depth + 1 < len(names):
            if field.message_type is None:
                raise ValueError(f"{dotted!r}: {name!r} is not a message field")
            message_type = field.message_type
    return tuple(numbers)


def serialize(
    envelope: Message,
    path: Path,
    data: bytes | memoryview,
    *,
    pad_field: int | None = None,
    align: int = ALIGN,
) -> bytes:
    """``envelope`` (its ``data`` field on ``path`` left empty) with ``data`` set, serialized.

    Equal, once parsed, to setting the field and calling ``SerializeToString``; the
    tensor bytes are copied once. With ``pad_field`` (a bytes field beside ``data``
    that receivers ignore), filler is added so ``data`` starts at a multiple of
    ``align`` bytes from the start of the frame: a receiver can then use the bytes in
    place as an aligned array.
    """
    head = envelope.SerializeToString()
    data_tag = _varint((path[-1] << 3) | _LEN) + _varint(len(data))
    filler = b""
    tags = _tags(path[:-1], len(data_tag) + len(data))
    if pad_field is not None:
        pad_tag = _varint((pad_field << 3) | _LEN)
        offset = len(head) + sum(map(len, tags)) + len(data_tag)
        pad = 0
        # Growing the filler can lengthen an enclosing length prefix by a byte, at
        # most once per level; the next pass accounts for it, so this settles.
        for _ in range(len(path) + 2):
            filler = pad_tag + _varint(pad) + b"\0" * pad
            tags = _tags(path[:-1], len(filler) + len(data_tag) + len(data))
            offset = len(head) + sum(map(len, tags)) + len(filler) + len(data_tag)
            if offset % align == 0:
                break
            pad += -offset % align
    return b"".join([head, *tags, filler, data_tag, data])


def _tags(numbers: Path, inner: int) -> list[bytes]:
    """Tag and length prefix of each enclosing field, outermost first, around ``inner`` bytes."""
    tags: list[bytes] = []
    for number in reversed(numbers):
        tag = _varint((number << 3) | _LEN) + _varint(inner)
        tags.append(tag)
        inner += len(tag)
    tags.reverse()
    return tags


def parse(cls: type[M], buffer: bytes, paths: Sequence[Path]) -> Frame[M]:
    """Parse ``buffer`` as ``cls``, taking the ``data`` field on any of ``paths`` out as a view.

    Raises :class:`WireError` on a frame that is not valid protobuf.
    """
    view = memoryview(buffer)
    top = {p[0] for p in paths}
    try:
        # Fast path: a frame whose first field is on no path (hello, ack, cancel, ...).
        if not view or _first_field(view) not in top:
            return Frame(cls.FromString(buffer), None, len(buffer))
        pieces, data = _strip(view, 0, len(view), paths)
        return Frame(cls.FromString(b"".join(pieces)), data, len(buffer))
    except (DecodeError, IndexError, ValueError) as exc:
        raise WireError(f"malformed {cls.DESCRIPTOR.name} frame: {exc}") from None


def to_wire(message: Message | bytes) -> bytes:
    """gRPC serializer for streams that carry both messages and ready-made frames."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def frame_reader(cls: type[M], paths: Sequence[Path]) -> Callable[[bytes], Frame[M] | WireError]:
    """gRPC deserializer: :func:`parse` frames of ``cls``, tensor bytes on ``paths`` as views.

    A frame that is not protobuf comes through as its :class:`WireError`, so the
    stream's reader can drop the peer with the reason instead of gRPC ending the
    call opaquely.
    """

    def read(buffer: bytes) -> Frame[M] | WireError:
        try:
            return parse(cls, buffer, paths)
        except WireError as exc:
            return exc

    return read


def _strip(
    view: memoryview, start: int, end: int, paths: Sequence[Path]
) -> tuple[list[bytes | memoryview], memoryview | None]:
    """The fields in ``view[start:end]`` minus the last ``data`` on ``paths``, and that data."""
    pieces: list[bytes | memoryview] = []
    data: memoryview | None = None
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _read_varint(view, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == _LEN:
            length, pos = _read_varint(view, pos)
            value_start, pos = pos, pos + length
            if pos > end:
                raise ValueError(f"field {number} runs past the end of its message")
            below = [p[1:] for p in paths if p[0] == number]
            if below:
                if any(not p for p in below):  # the data field itself: kept out
                    data = view[value_start:pos]
                    continue
                inner, found = _strip(view, value_start, pos, below)
                if found is not None:
                    data = found
                body = b"".join(inner)
                pieces.append(_varint(key) + _varint(len(body)) + body)
                continue
        elif wire_type == 0:
            _, pos = _read_varint(view, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire_type} in field {number}")
        if pos > end:
            raise ValueError(f"field {number} runs past the end of its message")
        pieces.append(view[field_start:pos])
    return pieces, data


def _first_field(view: memoryview) -> int:
    key, _ = _read_varint(view, 0)
    return key >> 3


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    byte = view[pos]  # IndexError past the end: a truncated frame
    if byte < 0x80:  # tags and short lengths: one byte
        return byte, pos + 1
    value = shift = 0
    while True:
        byte = view[pos]  # IndexError past the end: a truncated frame
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
