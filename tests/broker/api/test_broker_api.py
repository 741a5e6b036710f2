"""Every v1 API and every error code of docs/protocol.md sections 1-4, against the real
broker process on loopback, on both backends (the `broker` fixture)."""

from __future__ import annotations

import struct
import threading
import time
import zlib

import msgpack

from broker.storage.fileio import unseal
from harness.broker_process import BrokerProcess
from harness.wire import WireClient, fetched_values, frame_of_length, values_batch
from protocol.batch import scan_batches, validate
from protocol.errors import ErrorCode
from protocol.framing import encode_frame


def test_api_versions_lists_the_v1_apis(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        r = c.call("ApiVersions")
    assert r["error"] == 0
    for api in (
        "ApiVersions",
        "Metadata",
        "CreateTopics",
        "InitProducerId",
        "Produce",
        "Fetch",
        "ListOffsets",
    ):
        assert r["apis"][api] == [1, 1]
    assert r["max_frame_bytes"] == 16 * 1024 * 1024
    assert isinstance(r["broker_version"], str)


def test_create_topics_and_metadata(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("orders", 3) == 0
        assert c.create_topic("orders", 3) == ErrorCode.TOPIC_ALREADY_EXISTS
        for bad in (".", "..", "has space", "x" * 250, "slash/no", ""):
            assert c.create_topic(bad, 1) == ErrorCode.INVALID_TOPIC_EXCEPTION, bad
        assert c.create_topic("a" * 249, 1) == 0
        assert c.create_topic("zero", 0) == ErrorCode.INVALID_PARTITIONS
        r = c.call(
            "CreateTopics", topics=[{"name": "cfg", "partitions": 1, "config": {"bogus.key": 1}}]
        )
        assert r["topics"][0]["error"] == ErrorCode.INVALID_CONFIG
        assert "bogus.key" in r["topics"][0]["message"]

        everything = c.call("Metadata", topics=None)
        names = {t["name"] for t in everything["topics"]}
        assert names == {"orders", "a" * 249}
        assert everything["brokers"] == [{"id": 0, "host": "127.0.0.1", "port": broker.port}]

        r = c.call("Metadata", topics=["orders", "missing"], allow_auto_create=False)
        by_name = {t["name"]: t for t in r["topics"]}
        assert [p["partition"] for p in by_name["orders"]["partitions"]] == [0, 1, 2]
        assert by_name["missing"]["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

        r = c.call("Metadata", topics=["auto"], allow_auto_create=True)
        assert r["topics"][0]["error"] == 0
        assert len(r["topics"][0]["partitions"]) == 1


def test_topics_persist_across_restart(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        assert c.create_topic("kept", 2, {"retention.ms": 1000000}) == 0
    broker.restart(kill=True)
    with WireClient(broker.bootstrap) as c:
        r = c.call("Metadata", topics=["kept"])
    assert len(r["topics"][0]["partitions"]) == 2
    meta = unseal((broker.data_dir / "topics" / "kept" / "topic.meta").read_bytes())
    assert meta is not None
    assert msgpack.unpackb(meta) == {
        "partitions": 2,
        "config": {"retention_ms": 1000000},
        "id": r["topics"][0]["topic_id"],
    }


def test_produce_fetch_round_trip(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic("t", 1)
        first = c.produce("t", 0, values_batch([b"a", b"b", b"c"]))
        second = c.produce("t", 0, values_batch([b"d"]), acks=-1)
        assert (first["error"], first["base_offset"], first["duplicate"]) == (0, 0, False)
        assert (second["error"], second["base_offset"]) == (0, 3)
        f = c.fetch("t", 0, 0)
        assert f["error"] == 0 and f["high_watermark"] == 4 and f["log_start_offset"] == 0
        assert fetched_values(f["records"]) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
        # A fetch inside a batch starts at that batch; the client skips what lies below.
        f = c.fetch("t", 0, 1)
        first = next(iter(scan_batches(f["records"])))[1]
        assert validate(f["records"][: first.size_bytes]).base_offset == 0
        assert fetched_values(f["records"], 1)[0] == (1, b"b")
        # The stored bytes are served as they lie: the produced batch with its offset stamped.
        produced = values_batch([b"a", b"b", b"c"])
        header = next(iter(scan_batches(f["records"])))[1]
        assert f["records"][8 : header.size_bytes] == produced[8:]
        # At the high watermark: empty. Past it or below start: OFFSET_OUT_OF_RANGE.
        assert c.fetch("t", 0, 4)["records"] == b""
        assert c.fetch("t", 0, 5)["error"] == ErrorCode.OFFSET_OUT_OF_RANGE
        assert c.fetch("t", 0, -1)["error"] == ErrorCode.OFFSET_OUT_OF_RANGE
        assert c.fetch("nope", 0, 0)["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        # Always at least one whole batch, even over partition_max_bytes.
        f = c.fetch("t", 0, 0, partition_max_bytes=1)
        assert len(list(scan_batches(f["records"]))) == 1


def test_produce_validation_errors(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic("v", 1)
        good = values_batch([b"x" * 10])
        assert c.produce("v", 0, good, acks=2)["error"] == ErrorCode.INVALID_REQUIRED_ACKS
        assert c.produce("v", 7, good)["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert c.produce("nope", 0, good)["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        flipped = bytearray(good)
        flipped[-1] ^= 0xFF
        assert c.produce("v", 0, bytes(flipped))["error"] == ErrorCode.CORRUPT_MESSAGE
        assert c.produce("v", 0, good[:-3])["error"] == ErrorCode.CORRUPT_MESSAGE
        assert c.produce("v", 0, good[:20])["error"] == ErrorCode.CORRUPT_MESSAGE

        def restamp(buf: bytearray) -> bytes:
            struct.pack_into(">I", buf, 12, zlib.crc32(bytes(buf[16:])))
            return bytes(buf)

        bad_magic = bytearray(good)
        bad_magic[16] = 3  # 1 is ours, 2 is Kafka's v2: 3 is neither
        assert c.produce("v", 0, restamp(bad_magic))["error"] == ErrorCode.INVALID_RECORD
        bad_delta = bytearray(good)
        struct.pack_into(">i", bad_delta, 18, 5)
        assert c.produce("v", 0, restamp(bad_delta))["error"] == ErrorCode.INVALID_RECORD
        bad_codec = bytearray(good)
        bad_codec[17] = 5
        r = c.produce("v", 0, restamp(bad_codec))
        assert r["error"] == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
        control = bytearray(good)
        control[17] = 0x20
        assert c.produce("v", 0, restamp(control))["error"] == ErrorCode.INVALID_RECORD
        txn = bytearray(good)
        txn[17] = 0x10
        assert c.produce("v", 0, restamp(txn))["error"] == ErrorCode.INVALID_TXN_STATE
        big = values_batch([b"z" * (1024 * 1024)])
        assert c.produce("v", 0, big)["error"] == ErrorCode.MESSAGE_TOO_LARGE
        # None of the rejected batches reached the log.
        assert c.fetch("v", 0, 0)["high_watermark"] == 0
        assert c.produce("v", 0, good)["base_offset"] == 0


def test_acks_zero_gets_no_reply_and_order_is_kept(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic("z", 1)
        parts = [{"topic": "z", "partitions": [{"partition": 0, "records": values_batch([b"0"])}]}]
        c.send("Produce", acks=0, timeout_ms=1000, topics=parts)
        cid = c.send(
            "ListOffsets",
            topics=[{"topic": "z", "partitions": [{"partition": 0, "timestamp": -1}]}],
        )
        r = c.recv()
        assert r["cid"] == cid
        assert r["topics"][0]["partitions"][0]["offset"] == 1


def test_pipelined_requests_answer_in_order(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic("p", 1)
        pid, epoch = c.init_producer()
        cids = []
        for seq in range(200):
            batch = values_batch(
                [str(seq).encode()], producer_id=pid, producer_epoch=epoch, base_sequence=seq
            )
            cids.append(
                c.send(
                    "Produce",
                    acks=-1 if seq % 3 == 0 else 1,
                    timeout_ms=10_000,
                    topics=[{"topic": "p", "partitions": [{"partition": 0, "records": batch}]}],
                )
            )
        responses = [c.recv() for _ in cids]
        assert [r["cid"] for r in responses] == cids
        assert [r["topics"][0]["partitions"][0]["base_offset"] for r in responses] == list(
            range(200)
        )
        assert fetched_values(c.fetch("p", 0, 0, partition_max_bytes=1 << 20)["records"])[-1] == (
            199,
            b"199",
        )


def test_one_read_of_produce_requests_answers_as_one_after_another(
    broker: BrokerProcess,
) -> None:
    """Tried: one write carrying a producer's next two batches, a resend of the first,
    a batch after a gap, a Fetch, the next batch in sequence, another producer's batch
    into the same partition and one more of the first. The broker appends the Produce
    requests of one read together; the answers must still be those of the requests
    sent one at a time, and the log must hold each accepted batch once, in order."""
    with WireClient(broker.bootstrap) as c:
        c.create_topic("run", 1)
        pid, epoch = c.init_producer()
        other, other_epoch = c.init_producer()

        def produce(cid: int, seq: int, p: int = pid, e: int = epoch) -> bytes:
            batch = values_batch(
                [f"{p}-{seq}".encode()], producer_id=p, producer_epoch=e, base_sequence=seq
            )
            partitions = [{"partition": 0, "records": batch}]
            return encode_frame(
                {
                    "api": "Produce",
                    "v": 1,
                    "cid": cid,
                    "acks": 1,
                    "timeout_ms": 10_000,
                    "topics": [{"topic": "run", "partitions": partitions}],
                }
            )

        fetch = encode_frame(
            {
                "api": "Fetch",
                "v": 1,
                "cid": 5,
                "max_wait_ms": 0,
                "min_bytes": 1,
                "max_bytes": 1 << 20,
                "isolation_level": 0,
                "topics": [
                    {
                        "topic": "run",
                        "partitions": [
                            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                        ],
                    }
                ],
            }
        )
        frames = [
            produce(1, 0),
            produce(2, 1),
            produce(3, 0),  # a resend: the original offset, not a second copy
            produce(4, 5),  # a gap
            fetch,
            produce(6, 2),
            produce(7, 0, other, other_epoch),
            produce(8, 3),
        ]
        c.send_raw(b"".join(frames))
        answers = [c.recv() for _ in frames]
        assert [a["cid"] for a in answers] == [1, 2, 3, 4, 5, 6, 7, 8]
        produced = {
            a["cid"]: (p["error"], p["base_offset"], p["duplicate"])
            for a in answers
            if a["cid"] != 5
            for p in [a["topics"][0]["partitions"][0]]
        }
        assert produced == {
            1: (0, 0, False),
            2: (0, 1, False),
            3: (0, 0, True),
            4: (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, False),
            6: (0, 2, False),
            7: (0, 3, False),
            8: (0, 4, False),
        }
        # The Fetch saw what was appended before it, and nothing after.
        seen = answers[4]["topics"][0]["partitions"][0]["records"]
        assert fetched_values(seen) == [(0, f"{pid}-0".encode()), (1, f"{pid}-1".encode())]
        assert fetched_values(c.fetch("run", 0, 0)["records"]) == [
            (0, f"{pid}-0".encode()),
            (1, f"{pid}-1".encode()),
            (2, f"{pid}-2".encode()),
            (3, f"{other}-0".encode()),
            (4, f"{pid}-3".encode()),
        ]


def test_idempotence_rules(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic("idem", 2)
        pid, epoch = c.init_producer()
        assert epoch == 0

        def send(seq: int, n: int = 1, *, e: int = epoch, p: int = pid, part: int = 0) -> dict:
            vals = [f"{seq}-{i}".encode() for i in range(n)]
            return c.produce(
                "idem", part, values_batch(vals, producer_id=p, producer_epoch=e, base_sequence=seq)
            )

        # Rule 4: no state and base_sequence != 0 -> UNKNOWN_PRODUCER_ID.
        assert send(3)["error"] == ErrorCode.UNKNOWN_PRODUCER_ID
        # Rule 1: an id never issued.
        assert send(0, p=pid + 10_000)["error"] == ErrorCode.UNKNOWN_PRODUCER_ID
        offsets = {}
        seq = 0
        for n in (2, 1, 3, 1, 2, 1):
            r = send(seq, n)
            assert r["error"] == 0 and not r["duplicate"]
            offsets[seq] = (n, r["base_offset"])
            seq += n
        # Rule 3: each of the last 5 batches answers with its original offset.
        for s in sorted(offsets)[1:]:
            n, base = offsets[s]
            r = send(s, n)
            assert (r["error"], r["base_offset"], r["duplicate"]) == (0, base, True), s
        # The 6th-oldest lies wholly before the window -> DUPLICATE_SEQUENCE_NUMBER.
        assert send(0, 2)["error"] == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
        # Rule 5: a gap -> OUT_OF_ORDER_SEQUENCE_NUMBER.
        assert send(seq + 1)["error"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        # The log holds each record exactly once.
        values = [v for _, v in fetched_values(c.fetch("idem", 0, 0)["records"])]
        assert len(values) == len(set(values)) == seq
        # Partitions are judged independently: partition 1 starts at seq 0.
        assert send(0, part=1)["error"] == 0

        # KIP-360 bump: same id, epoch + 1; the old epoch is fenced (rule 2).
        r = c.call("InitProducerId", producer_id=pid, producer_epoch=epoch)
        assert (r["error"], r["producer_id"], r["producer_epoch"]) == (0, pid, 1)
        assert send(seq)["error"] == ErrorCode.INVALID_PRODUCER_EPOCH
        # A higher epoch must start at sequence 0 (rule 4).
        assert send(5, e=1)["error"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert send(0, e=1)["error"] == 0
        # A bump with a stale epoch is refused.
        r = c.call("InitProducerId", producer_id=pid, producer_epoch=0)
        assert r["error"] == ErrorCode.INVALID_PRODUCER_EPOCH


def test_init_producer_id_transactional_fences(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic("tx", 1)
        a = c.init_producer(transactional_id="app-1")
        b = c.init_producer(transactional_id="app-1")
        other = c.init_producer(transactional_id="app-2")
        assert b == (a[0], a[1] + 1)
        assert other[0] != a[0]
        r = c.produce(
            "tx", 0, values_batch([b"old"], producer_id=a[0], producer_epoch=a[1], base_sequence=0)
        )
        assert r["error"] == ErrorCode.INVALID_PRODUCER_EPOCH
        plain = {c.init_producer()[0] for _ in range(20)}
        assert len(plain) == 20 and a[0] not in plain
    broker.restart(kill=True)
    with WireClient(broker.bootstrap) as c:
        # The mapping survives kill -9, and ids issued before are never handed out again.
        assert c.init_producer(transactional_id="app-1") == (a[0], a[1] + 2)
        fresh = c.init_producer()[0]
        assert fresh not in plain and fresh > max(plain)


def test_list_offsets(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        c.create_topic("lo", 1)
        for i, ts in enumerate((1000, 2000, 3000)):
            c.produce("lo", 0, values_batch([str(i).encode()], timestamp_ms=ts))

        def ask(ts: int, topic: str = "lo") -> dict:
            r = c.call(
                "ListOffsets",
                topics=[{"topic": topic, "partitions": [{"partition": 0, "timestamp": ts}]}],
            )
            return r["topics"][0]["partitions"][0]

        assert ask(-1)["offset"] == 3
        assert ask(-2)["offset"] == 0
        assert ask(1500)["offset"] == 1
        assert ask(2000)["offset"] == 1
        assert ask(9999)["offset"] == -1
        assert ask(-1, "nope")["error"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_long_poll_fetch_is_woken_by_append(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c, WireClient(broker.bootstrap) as other:
        c.create_topic("lp", 1)

        def produce_later() -> None:
            time.sleep(0.3)
            other.produce("lp", 0, values_batch([b"late"]))

        t = threading.Thread(target=produce_later)
        started = time.monotonic()
        t.start()
        f = c.fetch("lp", 0, 0, max_wait_ms=10_000, min_bytes=1)
        elapsed = time.monotonic() - started
        t.join()
        assert fetched_values(f["records"]) == [(0, b"late")]
        assert elapsed < 5, "long poll was not woken by the append"
        # With nothing arriving, the broker answers empty after max_wait_ms.
        started = time.monotonic()
        f = c.fetch("lp", 0, 1, max_wait_ms=200, min_bytes=1)
        assert f["records"] == b"" and time.monotonic() - started >= 0.15


def test_bad_requests_keep_or_close_the_connection(broker: BrokerProcess) -> None:
    with WireClient(broker.bootstrap) as c:
        r = c.call("NoSuchApi")
        assert r["error"] == ErrorCode.UNSUPPORTED_VERSION
        r = c.call("Metadata", v=2)
        assert r["error"] == ErrorCode.UNSUPPORTED_VERSION
        r = c.call("Produce", acks=1)  # no topics
        assert r["error"] == ErrorCode.INVALID_REQUEST
        r = c.call("Fetch", topics="not-a-list")
        assert r["error"] == ErrorCode.INVALID_REQUEST
        r = c.call(
            "Produce",
            acks=1,
            timeout_ms=1,
            topics=[{"topic": "t", "partitions": [{"partition": 0, "records": "str not bin"}]}],
        )
        assert r["error"] == ErrorCode.INVALID_REQUEST
        assert c.call("ApiVersions")["error"] == 0  # still connected

    tried = {
        "bytes that are not msgpack": struct.pack(">I", 2) + b"\xc1\xc1",
        "a frame that is not a map": struct.pack(">I", 1) + msgpack.packb(5),
        "a map without cid": struct.pack(">I", len(msgpack.packb({"api": "ApiVersions", "v": 1})))
        + msgpack.packb({"api": "ApiVersions", "v": 1}),
        "a declared length over max_frame_bytes": frame_of_length(16 * 1024 * 1024 + 1),
    }
    for what, data in tried.items():
        with WireClient(broker.bootstrap) as c:
            c.send_raw(data)
            assert c.is_closed_by_peer(), what
    # The broker survived all of it.
    with WireClient(broker.bootstrap) as c:
        assert c.call("ApiVersions")["error"] == 0


def test_oversized_frame_is_refused_before_it_is_buffered(broker: BrokerProcess) -> None:
    """The broker closes on the 4 length bytes alone: it never waits for a 1 GiB body."""
    with WireClient(broker.bootstrap, timeout_s=5) as c:
        c.send_raw(frame_of_length(1 << 30))
        assert c.is_closed_by_peer()


def test_client_reset_with_replies_pending_leaves_the_broker_serving(broker: BrokerProcess) -> None:
    """Tried: 200 pipelined requests, then a TCP reset (SO_LINGER 0) before reading
    any reply. The broker drops that connection and keeps serving others."""
    import socket

    for _ in range(3):
        c = WireClient(broker.bootstrap)
        for cid in range(200):
            c.send("Metadata", cid=cid, topics=None)
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
    time.sleep(0.3)
    assert broker.proc is not None and broker.proc.poll() is None
    with WireClient(broker.bootstrap) as c:
        assert c.call("ApiVersions")["error"] == 0
