"""Kafka's v2 batches (magic 2) in a real broker, beside ours, read by the SDK.

Produced here through the minibroker listener (its Produce validates either
format, as the kafka listener's will): idempotent v2 batches in every codec,
interleaved with our own; lying v2 batches refused with section 2's codes and
nothing appended; then, across a kill -9 and restart, the SDK's Consumer reads
every record in offset order (the broker serving the stored bytes as they lie),
ListOffsets by timestamp lands inside a v2 batch, and a retried v2 batch is
still known as a duplicate.
"""

from __future__ import annotations

import struct

from client import Consumer, TopicPartition
from harness.broker_process import BrokerProcess
from harness.wire import WireClient
from protocol.batch import build_batch
from protocol.batch_v2 import encode_batch_v2
from protocol.compression import Compression
from protocol.errors import ErrorCode

T0 = 1_700_000_000_000


def v2_batch(pid: int, seq: int, codec: Compression) -> bytes:
    rows = [
        (T0 + 10 * seq, b"k%d" % seq, b"v2-%d" % seq, [("h", b"x"), ("null", None)]),
        (T0 + 10 * seq + 5, None, b"v2-%d" % (seq + 1), None),
    ]
    return encode_batch_v2(
        rows, compression=codec, producer_id=pid, producer_epoch=0, base_sequence=seq
    )


def test_v2_batches_are_stored_beside_ours_and_read_by_the_sdk(broker: BrokerProcess) -> None:
    tp = TopicPartition("mixed", 0)
    expected: list[tuple[int, bytes | None, tuple]] = []
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic(tp.topic, 1) == 0
        pid, _ = c.init_producer()
        for i, codec in enumerate(Compression):
            seq = 2 * i
            r = c.produce(tp.topic, 0, v2_batch(pid, seq, codec), acks=-1)
            assert (r["error"], r["base_offset"]) == (0, len(expected)), r
            expected += [
                (len(expected), b"v2-%d" % seq, (("h", b"x"), ("null", None))),
                (len(expected) + 1, b"v2-%d" % (seq + 1), ()),
            ]
            ours = build_batch([(T0 + 10 * seq + 7, None, b"ours-%d" % i, [("o", b"1")])])
            assert c.produce(tp.topic, 0, ours)["base_offset"] == len(expected)
            expected.append((len(expected), b"ours-%d" % i, (("o", b"1"),)))
        good = v2_batch(pid, 2 * len(Compression), Compression.NONE)
        bad_crc = bytearray(good)
        bad_crc[-1] ^= 1
        lying = bytearray(good)
        struct.pack_into(">i", lying, 57, 3)  # record_count 3 over 2 records
        for batch, code in (
            (bytes(bad_crc), ErrorCode.CORRUPT_MESSAGE),
            (bytes(lying), ErrorCode.CORRUPT_MESSAGE),  # the CRC-32C covers the count
            (good[:-1], ErrorCode.CORRUPT_MESSAGE),
        ):
            assert c.produce(tp.topic, 0, batch)["error"] == code
        assert c.fetch(tp.topic, 0, 0)["high_watermark"] == len(expected)

    broker.restart()  # kill -9: recovery and producer-state replay over both formats

    with WireClient(broker.bootstrap) as c:
        r = c.produce(tp.topic, 0, v2_batch(pid, 2 * (len(Compression) - 1), Compression.LZ4))
        assert (r["error"], r["duplicate"]) == (0, True)
        assert r["base_offset"] == 3 * (len(Compression) - 1)

    with Consumer(tp, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as consumer:
        got = []
        while len(got) < len(expected):
            got += consumer.poll(timeout_ms=5_000).get(tp, [])
        assert [(r.offset, r.value, tuple(r.headers)) for r in got] == expected
        assert got[1].timestamp == T0 + 5 and got[0].key == b"k0" and got[1].key is None
        # Between the two records of the second v2 batch (offsets 3 and 4).
        assert consumer.offsets_for_times({tp: T0 + 21}) == {tp: 4}
