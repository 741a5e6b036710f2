from collections.abc import Sequence

from protocol.records import BinaryChunk

def count_plain_records(records: bytes | memoryview, /) -> int: ...
def encode_binary_records(
    values: Sequence[BinaryChunk], keys: Sequence[BinaryChunk] | None, start: int, stop: int, /
) -> bytes: ...
def binary_record_bounds(
    values: Sequence[BinaryChunk], keys: Sequence[BinaryChunk] | None, limit: int, overhead: int, /
) -> list[tuple[int, int]]: ...
