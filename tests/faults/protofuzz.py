"""Hypothesis strategies derived from the codedgd.v1 descriptors (protos/codedgd/v1/codedgd.proto).

Nothing here names a message type: every strategy walks the generated descriptor, so a
message or field added to the contract is fuzzed without a change here.

* :class:`Messages` builds *valid* messages (every field of its declared type) with
  random values: ints over the whole range of the field's wire type (negative shapes,
  index past count, the largest round numbers), NaN/inf/huge floats, long strings and
  control characters, repeated fields of random length, maps, nested messages, one
  member of each oneof. ``hints`` (field full name → strategy) mix values that mean
  something to the receiver (the running job's id, a dtype it accepts) into the
  generic ones, so the fuzz gets past the first check.
* :func:`raw_message` builds *bytes* shaped like the message on the wire: known and
  unknown field numbers, with their own or a wrong wire type, varints past 64 bits,
  length prefixes that lie, invalid UTF-8, nested messages built the same way, and
  the result cut short or not.
* :func:`tensor_paths` finds every path from a message down to a ``TensorChunk.data``,
  as :mod:`codedgd.services.framing` takes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

from codedgd.services.proto import codedgd_pb2 as pb

F = FieldDescriptor
TensorPath = tuple[int, ...]
Hints = Mapping[str, st.SearchStrategy[Any]]

# Every message type of the contract (top level: map entries are fuzzed as the maps they are).
MESSAGE_TYPES: tuple[Descriptor, ...] = tuple(pb.DESCRIPTOR.message_types_by_name.values())
TENSOR = pb.TensorChunk.DESCRIPTOR

_INT_BOUNDS: dict[int, tuple[int, int]] = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_ENUM: (-(2**31), 2**31 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}
_EDGES = (-(2**63), -(2**31), -1, 0, 1, 2, 3, 64, 65, 2**31 - 1, 2**32 - 1, 2**53 + 1, 2**63 - 1)


def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Small values (what a receiver indexes with), the edges of [lo, hi], and anything."""
    edges = sorted({v for v in (lo, hi, *_EDGES) if lo <= v <= hi})
    return st.one_of(
        st.integers(max(lo, -2), min(hi, 8)), st.sampled_from(edges), st.integers(lo, hi)
    )


def floats(width: int = 64) -> st.SearchStrategy[float]:
    big = 3.4e38 if width == 32 else 1.7976931348623157e308
    special = [0.0, -0.0, math.nan, math.inf, -math.inf, big, -big, 1.0, -1.0, 1e-300]
    return st.one_of(st.sampled_from(special), st.floats(width=width))


def texts() -> st.SearchStrategy[str]:
    """Short text, control characters (C0 and C1), and long runs."""
    return st.one_of(
        st.text(max_size=20),
        st.text(st.characters(max_codepoint=0x9F), max_size=20),
        st.builds(lambda c, n: c * n, st.characters(), st.integers(65, 3000)),
    )


def binaries() -> st.SearchStrategy[bytes]:
    """Bytes of any length, of whole float64s, and long zero runs."""
    return st.one_of(
        st.binary(max_size=40),
        st.integers(0, 6).flatmap(lambda n: st.binary(min_size=8 * n, max_size=8 * n)),
        st.integers(100, 5000).map(lambda n: b"\0" * n),
    )


def is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


class Messages:
    """Valid messages of any type of the contract, with random field values."""

    def __init__(self, hints: Hints | None = None, max_depth: int = 4, max_items: int = 4):
        self.hints = dict(hints or {})
        self.max_depth = max_depth
        self.max_items = max_items
        self._cache: dict[tuple[str, int], st.SearchStrategy[Message]] = {}

    def of(self, descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
        key = (descriptor.full_name, depth)
        if key not in self._cache:
            self._cache[key] = self._build(descriptor, depth)
        return self._cache[key]

    def scalar(self, field: FieldDescriptor) -> st.SearchStrategy[Any]:
        t = field.type
        if t in _INT_BOUNDS:
            generic: st.SearchStrategy[Any] = integers(*_INT_BOUNDS[t])
        elif t == F.TYPE_DOUBLE:
            generic = floats(64)
        elif t == F.TYPE_FLOAT:
            generic = floats(32)
        elif t == F.TYPE_BOOL:
            generic = st.booleans()
        elif t == F.TYPE_STRING:
            generic = texts()
        elif t == F.TYPE_BYTES:
            generic = binaries()
        else:  # pragma: no cover - a new field type: fuzz it once this knows how
            raise NotImplementedError(f"no strategy for {field.full_name} (type {t})")
        hint = self.hints.get(field.full_name)
        return generic if hint is None else st.one_of(hint, generic)

    def _build(self, descriptor: Descriptor, depth: int) -> st.SearchStrategy[Message]:
        cls = GetMessageClass(descriptor)
        setters: list[tuple[FieldDescriptor, st.SearchStrategy[Callable[[Message], None]]]] = []
        for field in descriptor.fields:
            setter = self.setter(field, depth)
            if setter is not None:
                setters.append((field, setter))
        oneofs = {o.full_name: o for o in descriptor.oneofs}

        @st.composite
        def build(draw: st.DrawFn) -> Message:
            message = cls()
            chosen = {
                name: draw(st.sampled_from([None, *(f.name for f in o.fields)]))
                for name, o in oneofs.items()
            }
            for field, setter in setters:
                oneof = field.containing_oneof
                if oneof is not None:
                    if chosen[oneof.full_name] != field.name:
                        continue
                elif not draw(st.booleans()):
                    continue  # left unset
                draw(setter)(message)
            return message

        return build()

    def setter(
        self, field: FieldDescriptor, depth: int
    ) -> st.SearchStrategy[Callable[[Message], None]] | None:
        """What sets ``field`` of a message (at ``depth``) to a random value; None: too deep."""
        name = field.name
        n = self.max_items
        if is_map(field):
            entry = field.message_type
            keys = self.scalar(entry.fields_by_name["key"])
            value_field = entry.fields_by_name["value"]
            if value_field.message_type is not None:
                if depth + 1 > self.max_depth:
                    return None
                values = self.of(value_field.message_type, depth + 1)

                def put_messages(items: dict[Any, Message]) -> Callable[[Message], None]:
                    def put(m: Message) -> None:
                        for k, v in items.items():
                            getattr(m, name)[k].CopyFrom(v)

                    return put

                return st.dictionaries(keys, values, max_size=n).map(put_messages)
            scalars = self.scalar(value_field)
            return st.dictionaries(keys, scalars, max_size=n).map(
                lambda items: lambda m: getattr(m, name).update(items)
            )
        if field.message_type is not None:
            if depth + 1 > self.max_depth:
                return None
            sub = self.of(field.message_type, depth + 1)
            if field.is_repeated:

                def add_all(items: list[Message]) -> Callable[[Message], None]:
                    def add(m: Message) -> None:
                        for v in items:
                            getattr(m, name).add().CopyFrom(v)

                    return add

                return st.lists(sub, max_size=min(n, 3)).map(add_all)

            def merge(v: Message) -> Callable[[Message], None]:
                def set_(m: Message) -> None:
                    target = getattr(m, name)
                    target.SetInParent()  # present even when empty (and chosen in its oneof)
                    target.MergeFrom(v)

                return set_

            return sub.map(merge)
        values = self.scalar(field)
        if field.is_repeated:
            hint = self.hints.get(field.full_name + "[]")  # a hint for the whole list
            lists = st.lists(values, max_size=n + 2)
            if hint is not None:
                lists = st.one_of(hint, lists)
            return lists.map(lambda items: lambda m: getattr(m, name).extend(items))
        return values.map(lambda v: lambda m: setattr(m, name, v))


# ---------------------------------------------------------------- bytes on the wire


def varint(value: int) -> bytes:
    """``value`` (>= 0, any size: past 2**64 it is a varint no parser takes) as a varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_NATURAL_WIRE_TYPE = {
    F.TYPE_DOUBLE: 1,
    F.TYPE_FIXED64: 1,
    F.TYPE_SFIXED64: 1,
    F.TYPE_FLOAT: 5,
    F.TYPE_FIXED32: 5,
    F.TYPE_SFIXED32: 5,
    F.TYPE_STRING: 2,
    F.TYPE_BYTES: 2,
    F.TYPE_MESSAGE: 2,
}


def _payload(wire_type: int, nested: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    if wire_type == 0:
        return st.one_of(integers(0, 2**64 - 1), st.integers(2**64, 2**80)).map(varint)
    if wire_type == 1:
        return st.binary(min_size=8, max_size=8)
    if wire_type == 5:
        return st.binary(min_size=4, max_size=4)
    if wire_type == 2:
        body = st.one_of(nested, st.binary(max_size=24))
        lie = st.integers(-3, 3)
        return st.tuples(body, lie, st.booleans()).map(
            lambda t: varint(max(0, len(t[0]) + t[1]) if t[2] else len(t[0])) + t[0]
        )
    return st.just(b"")  # groups (3, 4) and the wire types protobuf never defined (6, 7)


def raw_message(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[bytes]:
    """Bytes shaped like a ``descriptor`` message on the wire, valid or not."""

    def known(field: FieldDescriptor) -> st.SearchStrategy[bytes]:
        natural = 2 if field.is_repeated and field.type != F.TYPE_MESSAGE else 0
        natural = _NATURAL_WIRE_TYPE.get(field.type, natural)
        nested = (
            raw_message(field.message_type, depth + 1)
            if field.message_type is not None and depth < 3
            else st.binary(max_size=16)
        )
        wire = st.one_of(st.just(natural), st.integers(0, 7))
        return wire.flatmap(
            lambda w: _payload(w, nested).map(lambda p: varint(field.number << 3 | w) + p)
        )

    unknown = st.tuples(st.integers(0, 2**29 + 5), st.integers(0, 7)).flatmap(
        lambda t: _payload(t[1], st.binary(max_size=16)).map(lambda p: varint(t[0] << 3 | t[1]) + p)
    )
    fields = [known(f) for f in descriptor.fields]
    one = st.one_of(*fields, unknown) if fields else unknown
    body = st.lists(one, max_size=5).map(b"".join)
    if depth:
        return body
    # At the top: the frame as it is, or cut short anywhere.
    return st.tuples(body, st.integers(0, 64), st.booleans()).map(
        lambda t: t[0][: len(t[0]) - t[1]] if t[2] else t[0]
    )


def frames(descriptor: Descriptor) -> st.SearchStrategy[bytes]:
    """Anything a peer could put in a frame of ``descriptor``: structured or random bytes."""
    return st.one_of(raw_message(descriptor), st.binary(max_size=64))


# ---------------------------------------------------------------- paths to tensor bytes


def tensor_paths(descriptor: Descriptor, seen: tuple[str, ...] = ()) -> list[TensorPath]:
    """Every path of singular fields from ``descriptor`` down to a TensorChunk's data."""
    data = TENSOR.fields_by_name["data"].number
    if descriptor is TENSOR:
        return [(data,)]
    paths: list[TensorPath] = []
    for field in descriptor.fields:
        sub = field.message_type
        if sub is None or field.is_repeated or sub.full_name in seen:
            continue
        for below in tensor_paths(sub, (*seen, descriptor.full_name)):
            paths.append((field.number, *below))
    return paths


def at_path(message: Message, path: TensorPath) -> tuple[Message, FieldDescriptor] | None:
    """The message holding the last field of ``path`` and that field, if every message on
    the way is present (None: the path is not set in ``message``)."""
    for number in path[:-1]:
        field = message.DESCRIPTOR.fields_by_number[number]
        if not message.HasField(field.name):
            return None
        message = getattr(message, field.name)
    return message, message.DESCRIPTOR.fields_by_number[path[-1]]


def touch_path(message: Message, path: TensorPath) -> Message:
    """The innermost message on ``path``, made present (switching oneofs on the way)."""
    for number in path[:-1]:
        field = message.DESCRIPTOR.fields_by_number[number]
        message = getattr(message, field.name)
        message.SetInParent()
    return message


def field_paths(descriptor: Descriptor, depth: int = 0) -> list[tuple[FieldDescriptor, ...]]:
    """Every path of fields from ``descriptor`` (to mutate one field of a message)."""
    out: list[tuple[FieldDescriptor, ...]] = []
    for field in descriptor.fields:
        out.append((field,))
        sub = field.message_type
        if sub is not None and not field.is_repeated and depth < 3:
            out += [(field, *below) for below in field_paths(sub, depth + 1)]
    return out
