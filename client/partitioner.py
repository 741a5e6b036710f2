"""Choosing a partition: a stable key hash, or a sticky partition for keyless records.

The default key hash is Kafka's murmur2 (the Java client's `Utils.murmur2`,
positive part modulo the partition count), so a key lands on the same partition
number as it would with Kafka's default partitioner, in any process on any
machine. Python's `hash()` is never used: it is salted per process. "crc32"
(zlib's, in C) is offered for keyed workloads where murmur2's pure-Python cost
(about 2 µs per key) matters more than Kafka compatibility.

Keyless records stick to one partition until a batch there fills up, then move
to another (Kafka's sticky partitioner, KIP-480), so they form full batches
instead of spraying one record per partition.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable

from client.config import PartitionerFn

_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of `data` as an unsigned 32-bit int (seed 0x9747b28c)."""
    length = len(data)
    h = 0x9747B28C ^ length
    words = length >> 2
    for k in struct.unpack_from(f"<{words}I", data):
        k = (k * _M) & _MASK32
        k ^= k >> 24
        h = ((h * _M) ^ (k * _M)) & _MASK32
    tail = words << 2
    extra = length & 3
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h


def murmur2_partition(key: bytes, num_partitions: int) -> int:
    """Kafka's `toPositive(murmur2(key)) % numPartitions`."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


def crc32_partition(key: bytes, num_partitions: int) -> int:
    return zlib.crc32(key) % num_partitions


class Partitioner:
    """Key hash or sticky choice; `batch_full` moves a topic's sticky partition on."""

    __slots__ = ("_custom", "_hash", "_rng", "_sticky")

    def __init__(self, kind: str | PartitionerFn = "murmur2", rng: random.Random | None = None):
        self._custom: PartitionerFn | None = None if isinstance(kind, str) else kind
        self._hash: Callable[[bytes, int], int] = (
            crc32_partition if kind == "crc32" else murmur2_partition
        )
        self._rng = rng or random.Random()
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, key: bytes | None, num_partitions: int) -> int:
        if self._custom is not None:
            all_partitions = list(range(num_partitions))
            return self._custom(key, all_partitions, all_partitions)
        if key is not None:
            return self._hash(key, num_partitions)
        sticky = self._sticky.get(topic)
        if sticky is None or sticky >= num_partitions:
            sticky = self._sticky[topic] = self._rng.randrange(num_partitions)
        return sticky

    def batch_full(self, topic: str, partition: int, num_partitions: int) -> None:
        """A batch of `topic` filled up on `partition`: keyless records move elsewhere."""
        if num_partitions > 1 and self._sticky.get(topic) == partition:
            choice = self._rng.randrange(num_partitions - 1)
            self._sticky[topic] = choice + 1 if choice >= partition else choice
