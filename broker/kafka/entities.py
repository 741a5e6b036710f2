"""Kafka's messages as kio's generated entities: reading a request's header and body,
and building a response of any version from plain values.

kio generates one class per API, version and direction from Kafka's JSON message
specs (flexible versions and tagged fields included). `build` fills a response class
of whichever version the request had from one dict per message: fields that version
lacks are dropped, fields the dict lacks take their zero, so the translations in
apis/ are written once for all versions.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import re
import struct
import typing
from collections.abc import Mapping
from typing import Any

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.serial import entity_reader, entity_writer

from broker.kafka.wire import read_uvarint
from protocol.framing import FrameError

HEAD = struct.Struct(">hhi")
"""api_key, api_version and correlation_id: where every request header begins."""
_I16 = struct.Struct(">h")
_FIXED_BYTES = {
    "int8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
"""The bytes of each fixed-size field kind of kio's entities."""
_VARIABLE = frozenset({"string", "bytes", "records"})
_LONG_VARINT = re.compile(rb"[\x80-\xff]{3}")
"""Three bytes in a row with the high bit set: how a varint of 2**21 or more begins,
the least count whose preallocation by kio (8 bytes an item) weighs anything."""

_ZEROS: dict[str, Any] = {
    "string": "",
    "bool": False,
    "bytes": b"",
    "records": b"",
    "uuid": None,
    "datetime_i64": -1,
    "float64": 0.0,
}


class Plan(typing.NamedTuple):
    """How one field of an entity class is filled."""

    name: str
    kind: str
    nested: type | None
    many: bool
    required: bool
    nullable: bool
    tagged: bool


@functools.cache
def request_class(key: int, version: int) -> type | None:
    """kio's request entity of (key, version), None when Kafka's specs have none."""
    try:
        return load_request_schema(key, version)
    except KioIndexError:
        return None


@functools.cache
def response_class(key: int, version: int) -> type:
    return load_response_schema(key, version)


@functools.cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@functools.cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


def read_request(cls: type, body: bytes | memoryview) -> tuple[Any, Any]:
    """(header, request) of a request frame body; FrameError when the bytes are not one
    (the connection closes, as Kafka closes it), or when a compact array counts more
    items than bytes are left (`check_counts`)."""
    if cls.__flexible__ and _LONG_VARINT.search(body):  # type: ignore[attr-defined]
        check_counts(cls, body)
    try:
        header, used = _reader(cls.__header_schema__)(body, 0)  # type: ignore[attr-defined]
        request, _ = _reader(cls)(body, used)
    except Exception as exc:  # kio raises several unrelated types for bad input
        raise FrameError(f"Kafka request cannot be decoded: {exc!r}") from exc
    return header, request


class _Unread(Exception):
    """The walk met bytes it does not read: kio's reader decides about them."""


def check_counts(cls: type, body: bytes | memoryview) -> int:
    """Where the flexible request `cls` in `body` (header v2 included) ends, walking its
    fields as kio's reader does; FrameError when a compact array's count exceeds the
    bytes left. kio's reader allocates an array's count before reading its items, and a
    count near 2**32 made that allocation fail, which aborts the whole process (Rust's
    out-of-memory abort, no exception). Every item takes at least a byte, so such a
    count is refused here first. Bytes the walk cannot read (cut short, a varint too
    long, a field kind it does not know) are left to kio's reader, which refuses them
    itself: -1 then."""
    view = memoryview(body)
    try:
        (size,) = _I16.unpack_from(view, HEAD.size)  # the header's client id: int16-long
        at = _tags(view, HEAD.size + 2 + max(size, 0))
        return _walk(_steps(cls), view, at)
    except (_Unread, struct.error, IndexError, ValueError):  # ValueError: a varint too long
        return -1


_SKIP, _VARIABLE_FIELD, _ARRAY, _TAGS, _UNREAD = range(5)
Step = tuple[int, Any]


@functools.cache
def _steps(cls: type) -> tuple[Step, ...]:
    """How to walk past a flexible entity of `cls`: its fixed-size fields in runs (one
    step each), its compact strings and bytes, its arrays (the item's steps), then its
    tagged fields."""
    steps: list[Step] = []
    for plan in _plans(cls):
        if plan.tagged:
            continue
        if plan.many:
            item = _steps(plan.nested) if plan.nested is not None else (_field_step(plan),)
            steps.append((_ARRAY, (f"{cls.__name__}.{plan.name}", item)))
        elif plan.nested is not None:
            steps.append((_UNREAD, f"a single nested entity {plan.name}"))  # none in a request
        else:
            step = _field_step(plan)
            if step[0] == _SKIP and steps and steps[-1][0] == _SKIP:
                step = (_SKIP, steps.pop()[1] + step[1])
            steps.append(step)
    steps.append((_TAGS, None))
    return tuple(steps)


def _field_step(plan: Plan) -> Step:
    fixed = _FIXED_BYTES.get(plan.kind)
    if fixed is not None:
        return (_SKIP, fixed)
    if plan.kind in _VARIABLE:
        return (_VARIABLE_FIELD, None)
    return (_UNREAD, f"a field of kind {plan.kind!r}")


def _walk(steps: tuple[Step, ...], view: memoryview, at: int) -> int:
    """Past what `steps` walk, from `at`."""
    for op, arg in steps:
        if op == _SKIP:
            at += arg
        elif op == _VARIABLE_FIELD:
            size = view[at]
            if size < 0x80:  # a length under 127: most strings, read in place
                at += size if size else 1  # its length + 1 and its bytes; 0 is null
            else:
                size, at = read_uvarint(view, at)
                at += max(size - 1, 0)
        elif op == _ARRAY:
            count, at = read_uvarint(view, at)
            count -= 1  # 0 is null
            if count > len(view) - at:
                raise FrameError(
                    f"Kafka request cannot be decoded: {arg[0]} counts {count} items in "
                    f"{len(view) - at} bytes"
                )
            item = arg[1]
            for _ in range(count):
                at = _walk(item, view, at)
        elif op == _TAGS:
            at = at + 1 if view[at] == 0 else _tags(view, at)
        else:
            raise _Unread(arg)
    return at


def _tags(view: memoryview, at: int) -> int:
    """Past a tagged field section at `at`."""
    count, at = read_uvarint(view, at)
    for _ in range(count):
        _tag, at = read_uvarint(view, at)
        size, at = read_uvarint(view, at)
        at += size
    return at


def write_response(entity: Any, correlation_id: int) -> bytes:
    """The frame (length prefix, response header, body) of a response entity."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    cls: type = type(entity)
    header_cls: type = cls.__header_schema__  # type: ignore[attr-defined]
    _writer(header_cls)(out, header_cls(correlation_id=correlation_id))
    _writer(cls)(out, entity)
    data = out.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


@functools.cache
def _plans(cls: type) -> tuple[Plan, ...]:
    hints = typing.get_type_hints(cls)
    plans = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        nullable = type(None) in args
        many = hint is tuple or typing.get_origin(hint) is tuple
        if nullable:
            inner = next(a for a in args if a is not type(None))
            many = many or typing.get_origin(inner) is tuple
            hint = inner
        candidates = typing.get_args(hint) if many else (hint,)
        nested = next((c for c in candidates if dataclasses.is_dataclass(c)), None)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        kind = f.metadata.get("kafka_type", "")
        tagged = "tag" in f.metadata
        plans.append(Plan(f.name, kind, nested, many, required, nullable, tagged))  # type: ignore[arg-type]
    return tuple(plans)


def build(cls: type, data: Mapping[str, Any]) -> Any:
    """An entity of `cls` from plain values: nested entities as dicts (lists of dicts),
    error codes and durations as ints; what `cls` lacks is dropped."""
    values: dict[str, Any] = {}
    for plan in _plans(cls):
        if plan.name in data:
            value = data[plan.name]
        elif plan.required:
            value = None if plan.nullable else _zero(plan)
        else:
            continue
        values[plan.name] = _convert(plan, value)
    return cls(**values)


def _zero(plan: Plan) -> Any:
    if plan.many:
        return ()
    if plan.nested is not None:
        return {}
    return _ZEROS.get(plan.kind, 0)


def _convert(plan: Plan, value: Any) -> Any:
    if value is None:
        return None
    if plan.nested is not None:
        if plan.many:
            return tuple(build(plan.nested, item) for item in value)
        return build(plan.nested, value)
    if plan.many:
        return tuple(value)
    kind = plan.kind
    if kind == "error_code":
        return KafkaErrorCode(value)
    if kind.startswith("timedelta"):
        return datetime.timedelta(milliseconds=value)
    if kind == "datetime_i64":
        # Kafka's -1 (no time: log append time not used) is kio's None where the field
        # is nullable; where it is not (DescribeTransactions' start time), the instant
        # -1 ms, which kio writes as -1.
        if value < 0 and plan.nullable:
            return None
        return datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    return value


def has_error_code(key: int, version: int) -> bool:
    """Whether the response of (key, version) has a top-level error code."""
    return any(plan.name == "error_code" for plan in _plans(response_class(key, version)))


def error_entity(key: int, version: int, code: int, message: str | None = None) -> Any:
    """A response of (key, version) that carries only `code` (and `message` where the
    version has one): how Kafka answers a request it will not run."""
    return build(response_class(key, version), {"error_code": code, "error_message": message})
