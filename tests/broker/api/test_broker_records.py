"""A batch whose record_count disagrees with its records, against the real broker.

Before the broker decoded the records, a header claiming 2^31-1 records over an
empty array was stored: the partition's offsets jumped by 2^31 and the
project's own Consumer could no longer read it. Now such batches (plain,
compressed, or inflating past message_max_bytes) are refused INVALID_RECORD and
the partition goes on as if they had never been sent.
"""

from __future__ import annotations

import msgpack
import zstandard

from client import Consumer, TopicPartition
from harness.broker_process import BrokerProcess
from harness.wire import WireClient, values_batch
from protocol.batch import encode_batch
from protocol.compression import Compression
from protocol.errors import ErrorCode


def lying_batch(records: list, record_count: int, compression: int = Compression.NONE) -> bytes:
    return encode_batch(
        msgpack.packb(records),
        record_count=record_count,
        base_timestamp=1_700_000_000_000,
        max_timestamp=1_700_000_000_000,
        compression=compression,
    )


def test_lying_batches_are_refused_and_the_partition_stays_readable(
    broker: BrokerProcess,
) -> None:
    tp = TopicPartition("liars", 0)
    # 2 MiB of zeros in one record: a few hundred bytes zstd-compressed, > message_max_bytes.
    bomb = lying_batch([[0, None, b"\0" * (2 << 20), None]], 1, Compression.ZSTD)
    assert len(bomb) < 1024
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic(tp.topic, 1) == 0
        assert c.produce(tp.topic, 0, values_batch([b"a", b"b"]))["base_offset"] == 0
        for bad in (
            lying_batch([], 2**31 - 1),
            lying_batch([[0, None, b"c", None]], 2),
            lying_batch([[0, None, b"c", None]] * 3, 2, Compression.GZIP),
            lying_batch([[0, "str key", b"c", None]], 1, Compression.LZ4),
            bomb,
        ):
            r = c.produce(tp.topic, 0, bad)
            assert r["error"] == ErrorCode.INVALID_RECORD, r
        assert c.produce(tp.topic, 0, values_batch([b"c"]))["base_offset"] == 2
        assert c.fetch(tp.topic, 0, 0)["high_watermark"] == 3

    with Consumer(tp, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as consumer:
        assert consumer.end_offsets([tp]) == {tp: 3}
        records = consumer.poll(timeout_ms=5_000)[tp]
    assert [(r.offset, r.value) for r in records] == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_zstd_frames_are_bounded_by_message_max_bytes_not_by_their_own_claim(
    broker: BrokerProcess,
) -> None:
    """A well-formed batch whose records inflate just under the limit is still stored."""
    value = b"\0" * (900 * 1024)
    records = msgpack.packb([[0, None, value, None]])
    assert len(zstandard.ZstdCompressor().compress(records)) < 1024
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("zeros", 1) == 0
        r = c.produce("zeros", 0, lying_batch([[0, None, value, None]], 1, Compression.ZSTD))
        assert (r["error"], r["base_offset"]) == (0, 0)
