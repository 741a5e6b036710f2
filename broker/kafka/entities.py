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
import struct
import typing
from collections.abc import Mapping
from typing import Any

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.serial import entity_reader, entity_writer

from protocol.framing import FrameError

HEAD = struct.Struct(">hhi")
"""api_key, api_version and correlation_id: where every request header begins."""

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
    (the connection closes, as Kafka closes it)."""
    try:
        header, used = _reader(cls.__header_schema__)(body, 0)  # type: ignore[attr-defined]
        request, _ = _reader(cls)(body, used)
    except Exception as exc:  # kio raises several unrelated types for bad input
        raise FrameError(f"Kafka request cannot be decoded: {exc!r}") from exc
    return header, request


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
        plans.append(Plan(f.name, kind, nested, many, required, nullable))  # type: ignore[arg-type]
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
