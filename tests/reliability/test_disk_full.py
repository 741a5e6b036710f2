"""A full disk: the data dir on a 4 MiB tmpfs that the test mounts (root only).

What is tried, on each backend: a 1 MiB filler file, then 32 KiB idempotent
acks=-1 batches until one is refused, then a second filler takes the last free
bytes. Then every writing API must answer
KAFKA_STORAGE_ERROR(56) — Produce (and its retry, which must not count as a
duplicate), CreateTopics (leaving no topic behind), InitProducerId with a new
transactional id — while reads go on (Fetch returns exactly the acknowledged
records, Metadata and ApiVersions answer). Deleting the filler gives space back:
the failed batch is then appended (not a duplicate), CreateTopics and the
transactional InitProducerId succeed. A kill -9 and restart on the same tmpfs
shows nothing torn: exactly the acknowledged records, every CRC valid.
"""

from __future__ import annotations

from pathlib import Path

from harness.broker_process import BrokerProcess
from harness.wire import WireClient, values_batch
from protocol.errors import ErrorCode
from tests.reliability.conftest import read_partition

STORAGE_ERROR = ErrorCode.KAFKA_STORAGE_ERROR
BATCH_VALUE_BYTES = 32 * 1024
BATCHES_MAX = 400  # 12 MiB: well past the 4 MiB filesystem


def top_up(path: Path) -> None:
    """Write `path` until the filesystem has no byte left."""
    with open(path, "wb", buffering=0) as f:
        for _ in range(4096):
            try:
                f.write(b"\0" * 1024)
            except OSError:
                return
    raise AssertionError("the 4 MiB filesystem did not fill")


def test_full_disk_refuses_writes_serves_reads_and_resumes(small_fs: Path, backend: str) -> None:
    filler = small_fs / "filler"
    filler.write_bytes(b"\0" * (1 << 20))
    broker = BrokerProcess(small_fs / "data", backend=backend).start()
    try:
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("full", 1) == 0
            pid, epoch = c.init_producer()
            acked: list[bytes] = []
            for seq in range(BATCHES_MAX):
                value = b"%06d" % seq + b"x" * BATCH_VALUE_BYTES
                batch = values_batch(
                    [value], producer_id=pid, producer_epoch=epoch, base_sequence=seq
                )
                r = c.produce("full", 0, batch, acks=-1)
                if r["error"]:
                    break
                acked.append(value)
            assert r["error"] == STORAGE_ERROR, r
            assert len(acked) > 10, "the filesystem filled before any data"
            top_up(small_fs / "top-up")  # the last pages too, which a 32 KiB batch left
            again = c.produce("full", 0, batch, acks=-1)
            assert again["error"] == STORAGE_ERROR and not again["duplicate"], again
            created = c.call("CreateTopics", topics=[{"name": "later", "partitions": 8}])
            assert created["error"] == 0 and created["topics"][0]["error"] == STORAGE_ERROR, created
            txn = c.call("InitProducerId", transactional_id="tx-full")
            assert txn["error"] == STORAGE_ERROR, txn
            # Reads go on.
            assert c.call("ApiVersions")["error"] == 0
            names = {t["name"] for t in c.call("Metadata", topics=None)["topics"]}
            assert names == {"full"}, names
            assert [v for _, v in read_partition(c, "full", 0)] == acked

            filler.unlink()
            (small_fs / "top-up").unlink()
            r = c.produce("full", 0, batch, acks=-1)
            assert (r["error"], r["duplicate"], r["base_offset"]) == (0, False, len(acked)), r
            acked.append(value)
            assert c.create_topic("later", 8) == 0
            assert c.call("InitProducerId", transactional_id="tx-full")["error"] == 0
            assert [v for _, v in read_partition(c, "full", 0)] == acked
        broker.restart(kill=True)
        with WireClient(broker.bootstrap) as c:
            assert [v for _, v in read_partition(c, "full", 0)] == acked
            later = c.call("Metadata", topics=["later"])["topics"][0]
            assert later["error"] == 0 and len(later["partitions"]) == 8
    finally:
        broker.kill()
