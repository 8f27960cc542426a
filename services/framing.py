"""Tensor bytes in and out of protobuf frames with one copy at most.

A round moves ℓ float64 down to every worker and back. Building and parsing those
messages with protobuf alone copies the tensor bytes three times on the way out
(``bytes(view)``, the field assignment, ``SerializeToString``) and twice on the way
in (the parse, then reading ``.data``). This module keeps the messages plain
protobuf on the wire (any protobuf client can still speak to us) but treats the
one big field, ``TensorChunk.data``, specially:

* :func:`serialize` writes the envelope through protobuf with ``data`` left empty,
  then moves, at every level on the path to ``data``, the field that leads down to it
  to the end of its message, and ends the innermost message with ``data``. Each
  message on the path is written once (some parsers, protobufjs among them, keep only
  the last occurrence of a repeated submessage instead of merging), and the result
  parses, in any conforming protobuf library, to exactly the message with ``data``
  set. The tensor bytes are copied once, into the frame.
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
from functools import lru_cache
from typing import Generic, TypeVar

from google.protobuf.message import DecodeError, Message

from codedgd.services.errors import WireError

M = TypeVar("M", bound=Message)
Path = tuple[int, ...]

_LEN = 2  # wire type of length-delimited fields (strings, bytes, messages)
# numpy's own buffers are 16-byte aligned, and so are Python bytes objects' contents:
# tensor bytes at a multiple of 16 in a received frame make arrays like numpy's.
ALIGN = 16
# Frames shorter than this whose first field leads to no tensor are parsed whole.
FAST_PATH_BYTES = 4096


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
    tensor bytes are copied once. Every message on ``path`` appears once, with the field
    that leads down the path as its last field, and ``data`` is the last field of all.
    With ``pad_field`` (a bytes field beside ``data`` that receivers ignore), filler is
    added just before ``data`` so it starts at a multiple of ``align`` bytes from the
    start of the frame: a receiver can then use the bytes in place as an aligned array.
    """
    levels = _levels(envelope.SerializeToString(), path[:-1])
    tags, tail = _joints(tuple(map(len, levels)), len(data), path, pad_field, align)
    pieces: list[bytes | memoryview] = []
    for j, tag in enumerate(tags):
        pieces += (levels[j], tag)
    pieces += (levels[-1], tail, data)
    return b"".join(pieces)


@lru_cache(maxsize=256)
def _joints(
    sizes: tuple[int, ...], size: int, path: Path, pad_field: int | None, align: int
) -> tuple[tuple[bytes, ...], bytes]:
    """The bytes that join the levels of a frame (their other fields ``sizes`` long).

    The tag and length of each field on the path, outermost first, and what goes
    between the innermost message's other fields and the data: the filler and the
    data field's tag. They depend on sizes only, and a stream's frames repeat the same
    few, so they are computed once per shape (this runs for every frame sent).
    """
    numbers = path[:-1]
    data_tag = _varint((path[-1] << 3) | _LEN) + _varint(size)
    filler = b""
    tags = _nesting(sizes, numbers, len(data_tag) + size)
    if pad_field is not None:
        pad_tag = _varint((pad_field << 3) | _LEN)
        pad = 0
        # Growing the filler can lengthen an enclosing length prefix by a byte, at
        # most once per level; the next pass accounts for it, so this settles.
        for _ in range(len(path) + 2):
            filler = pad_tag + _varint(pad) + b"\0" * pad
            tags = _nesting(sizes, numbers, len(filler) + len(data_tag) + size)
            offset = sum(sizes) + sum(map(len, tags)) + len(filler) + len(data_tag)
            if offset % align == 0:
                break
            pad += -offset % align
    return tuple(tags), filler + data_tag


def _levels(head: bytes, numbers: Path) -> list[bytes]:
    """The fields of each message on the path, without the one that leads further down.

    ``levels[0]`` is the envelope's other fields, ``levels[j]`` those of the message
    reached by ``numbers[:j]``, and ``levels[-1]`` the innermost message's (``data``
    empty, so absent). Several occurrences of a field on the path are merged, as a
    protobuf parser would merge them. One-byte tags and lengths are read inline: this
    runs for every frame sent.
    """
    levels: list[bytes] = []
    message = head
    for number in numbers:
        key_on_path = (number << 3) | _LEN
        kept: list[bytes] = []
        below: list[bytes] = []
        pos, end = 0, len(message)
        run = 0  # message[run:pos] is a run of kept fields
        while pos < end:
            start = pos
            key = message[pos]
            if key < 0x80:
                pos += 1
            else:
                key, pos = _read_varint(message, pos)
            wire_type = key & 7
            if wire_type == _LEN:
                length = message[pos]
                if length < 0x80:
                    pos += 1
                else:
                    length, pos = _read_varint(message, pos)
                if key == key_on_path:
                    kept.append(message[run:start])
                    below.append(message[pos : pos + length])
                    run = pos = pos + length
                    continue
                pos += length
            elif wire_type == 0:
                _, pos = _read_varint(message, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            else:
                raise ValueError(f"unsupported wire type {wire_type} in field {key >> 3}")
        kept.append(message[run:end])
        levels.append(b"".join(kept))
        message = below[0] if len(below) == 1 else b"".join(below)
    levels.append(message)
    return levels


def _nesting(sizes: tuple[int, ...], numbers: Path, innermost_tail: int) -> list[bytes]:
    """Tag and length prefix of each field on the path, outermost first.

    ``sizes`` are the bytes of each level's other fields; ``innermost_tail`` is what
    the innermost message holds after its own (filler, the data field's tag, the data).
    """
    inner = sizes[-1] + innermost_tail
    tags: list[bytes] = []
    for j in range(len(numbers) - 1, -1, -1):
        tag = _varint((numbers[j] << 3) | _LEN) + _varint(inner)
        tags.append(tag)
        inner += len(tag) + sizes[j]
    tags.reverse()
    return tags


def parse(cls: type[M], buffer: bytes, paths: Sequence[Path]) -> Frame[M]:
    """Parse ``buffer`` as ``cls``, taking the ``data`` field on any of ``paths`` out as a view.

    Raises :class:`WireError` on a frame that is not valid protobuf.
    """
    return _parse(cls, buffer, _trie(tuple(paths)))


def _parse(cls: type[M], buffer: bytes, trie: _Trie) -> Frame[M]:
    view = memoryview(buffer)
    try:
        # Fast path: a small frame whose first field is on no path (hello, ack, cancel,
        # ...). A large one is walked whatever comes first: a message whose path field
        # is not its first (PeerData: job, round, ... then the tensor) still hands its
        # bytes over without a copy.
        if not view or (len(view) < FAST_PATH_BYTES and _first_field(view) not in trie):
            return Frame(cls.FromString(buffer), None, len(buffer))
        pieces, data = _strip(view, 0, len(view), trie)
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

    trie = _trie(tuple(paths))

    def read(buffer: bytes) -> Frame[M] | WireError:
        try:
            return _parse(cls, buffer, trie)
        except WireError as exc:
            return exc

    return read


# The paths as nested dicts: field number -> the fields below it, or None for ``data``.
_Trie = dict[int, "_Trie | None"]


@lru_cache(maxsize=32)
def _trie(paths: tuple[Path, ...]) -> _Trie:
    root: _Trie = {}
    for path in paths:
        node = root
        for number in path[:-1]:
            below = node.setdefault(number, {})
            if below is None:
                raise ValueError(f"path {path}: field {number} is a data field on another path")
            node = below
        if node.get(path[-1]) is not None:
            raise ValueError(f"path {path}: field {path[-1]} has fields below it on another path")
        node[path[-1]] = None
    return root


def _strip(
    view: memoryview, start: int, end: int, trie: _Trie
) -> tuple[list[bytes | memoryview], memoryview | None]:
    """The fields in ``view[start:end]`` minus the last ``data`` on ``trie``, and that data.

    Runs of fields left as they are come back as one slice each; a submessage on a
    path is rebuilt only when ``data`` was taken out of it. One-byte varints (tags
    and short lengths) are read inline: this runs for every message of every round.
    """
    pieces: list[bytes | memoryview] = []
    data: memoryview | None = None
    kept = pos = start  # view[kept:pos] is a run of fields kept verbatim
    while pos < end:
        field_start = pos
        key = view[pos]  # IndexError past the end: a truncated frame
        if key < 0x80:
            pos += 1
        else:
            key, pos = _read_varint(view, pos)
        wire_type = key & 7
        if wire_type == _LEN:
            length = view[pos]
            if length < 0x80:
                pos += 1
            else:
                length, pos = _read_varint(view, pos)
            value_start, pos = pos, pos + length
            number = key >> 3
            if pos > end:
                raise ValueError(f"field {number} runs past the end of its message")
            if number in trie:
                below = trie[number]
                if below is None:  # the data field itself: kept out
                    found: memoryview | None = view[value_start:pos]
                    inner: list[bytes | memoryview] = []
                else:
                    inner, found = _strip(view, value_start, pos, below)
                if found is not None:
                    data = found
                    pieces.append(view[kept:field_start])
                    if below is not None:
                        body = b"".join(inner)
                        pieces.append(_varint(key) + _varint(len(body)) + body)
                    kept = pos
            continue
        if wire_type == 0:
            _, pos = _read_varint(view, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire_type} in field {key >> 3}")
        if pos > end:
            raise ValueError(f"field {key >> 3} runs past the end of its message")
    pieces.append(view[kept:end])
    return pieces, data


def _first_field(view: memoryview) -> int:
    key, _ = _read_varint(view, 0)
    return key >> 3


def _read_varint(view: bytes | memoryview, pos: int) -> tuple[int, int]:
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
