from collections.abc import Sequence
from typing import Any, TypeVar

from protocol.records import BinaryChunk

_T = TypeVar("_T", bound=tuple[Any, ...])

def count_plain_records(records: bytes | memoryview, /) -> int: ...
def plain_header(
    batch: bytes | bytearray | memoryview, max_bytes: int, header_type: type[_T], /
) -> _T | None: ...
def bytes_lengths(column: list[Any], /) -> list[int] | None: ...
def encode_list_records(
    values: list[bytes | None], keys: list[bytes | None] | None, start: int, stop: int, /
) -> bytes | None: ...
def encode_binary_records(
    values: Sequence[BinaryChunk], keys: Sequence[BinaryChunk] | None, start: int, stop: int, /
) -> bytes: ...
def binary_record_bounds(
    values: Sequence[BinaryChunk], keys: Sequence[BinaryChunk] | None, limit: int, overhead: int, /
) -> list[tuple[int, int]]: ...
def plain_rows(
    records: bytes | memoryview,
    record_count: int,
    skip: int,
    row_type: type[tuple[Any, ...]],
    topic: str,
    partition: int,
    base_offset: int,
    base_timestamp: int,
    no_headers: tuple[Any, ...],
    /,
) -> list[Any] | None: ...
def v2_records_parse(
    records: bytes | memoryview, record_count: int, /
) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]] | None: ...
def v2_records_from_plain(records: bytes | memoryview, record_count: int, /) -> bytes | None: ...
def v2_records_valid(records: bytes | memoryview, record_count: int, /) -> bool: ...
def crc32c(data: bytes | bytearray | memoryview, value: int = 0, /) -> int: ...
