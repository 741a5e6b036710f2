"""A Fetch answer is bounded by its request on both listeners (issue 39, item 3): at most
`max_bytes` of records, however large a partition's own `partition_max_bytes`, or one
whole batch when the first is larger; on the kafka listener too, where batches written
natively are converted to Kafka's v2 form (in a worker thread)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse

from harness.broker_process import BrokerProcess
from harness.wire import WireClient, values_batch
from protocol.batch import scan_batches
from tests.kafka.conftest import BOTH_LISTENERS

MIB = 1 << 20
VALUE_BYTES = 64 * 1024
BATCH_VALUES = 4  # a batch of about 256 KiB
BATCHES = 12  # about 3 MiB in the partition
INT32_MAX = 2**31 - 1
FetchTopic = FetchRequest.FetchTopic


@pytest.fixture
def full_partition(tmp_path: Path, backend: str) -> Iterator[BrokerProcess]:
    """A broker with both listeners and a topic `big` holding about 3 MiB, written through
    the minibroker listener (so the kafka listener converts every batch)."""
    proc = BrokerProcess(tmp_path / "data", backend=backend, config=BOTH_LISTENERS).start()
    try:
        with WireClient(proc.address("minibroker")) as client:
            assert client.create_topic("big") == 0
            for n in range(BATCHES):
                values = [bytes([n]) * VALUE_BYTES for _ in range(BATCH_VALUES)]
                assert client.produce("big", 0, values_batch(values))["error"] == 0
        yield proc
    finally:
        proc.kill()


def test_the_minibroker_listener_answers_at_most_max_bytes(full_partition: BrokerProcess) -> None:
    with WireClient(full_partition.address("minibroker")) as client:
        response = client.call(
            "Fetch",
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=MIB,
            isolation_level=0,
            topics=[
                {
                    "topic": "big",
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": INT32_MAX}
                    ],
                }
            ],
        )
    records = response["topics"][0]["partitions"][0]["records"]
    batches = list(scan_batches(records))
    assert batches, "at least one batch, so a consumer progresses"
    assert len(records) <= MIB, f"{len(records)} bytes of records for max_bytes {MIB}"


def test_a_first_batch_larger_than_max_bytes_goes_whole(full_partition: BrokerProcess) -> None:
    with WireClient(full_partition.address("minibroker")) as client:
        response = client.call(
            "Fetch",
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=1024,
            isolation_level=0,
            topics=[
                {
                    "topic": "big",
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": INT32_MAX}
                    ],
                }
            ],
        )
    records = response["topics"][0]["partitions"][0]["records"]
    assert len(list(scan_batches(records))) == 1


def kafka_fetch(address: str, max_bytes: int) -> bytes:
    """The records of one Fetch v12 of `big` partition 0 from offset 0 with
    partition_max_bytes 2^31-1, sent raw to the kafka listener."""
    message = FetchRequest[12](
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        topics=[
            FetchTopic(
                topic="big",
                partitions=[
                    FetchTopic.FetchPartition(
                        partition=0, fetch_offset=0, partition_max_bytes=INT32_MAX
                    )
                ],
            )
        ],
    )
    message.with_header(correlation_id=5, client_id="bounds-test")
    body = bytes(message.encode(header=True))
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        head = _exactly(sock, 4)
        frame = _exactly(sock, struct.unpack(">i", head)[0])
    answer = FetchResponse[12].decode(frame, header=True)
    assert answer.header.correlation_id == 5
    partition = answer.responses[0].partitions[0]
    assert partition.error_code == 0
    return bytes(partition.records)


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), MIB))
        assert chunk, "the broker closed the connection"
        data += chunk
    return bytes(data)


def test_the_kafka_listener_answers_at_most_max_bytes(full_partition: BrokerProcess) -> None:
    """Converted to v2, a batch may change size a little: at most one batch over."""
    records = kafka_fetch(full_partition.address("kafka"), MIB)
    batches = list(scan_batches(records))
    assert batches and all(header.magic == 2 for _, header in batches)
    largest = max(header.batch_length for _, header in batches)
    assert len(records) <= MIB + largest, f"{len(records)} bytes of records for max_bytes {MIB}"


STALL_BATCHES = 160  # about 40 MiB of batches to convert in one Fetch
# The longest wait of another client, as a share of the Fetch's own time: a bound in
# seconds failed once on a loaded machine (0.36 s against 0.3), while the wait and the
# Fetch grow with the load together. Measured on a quiet machine, 4 runs each: 0.22-0.25
# with the conversion in a worker thread, 0.51-0.60 with it on the event loop (and
# with the 48 batches this test converted before, 0.47-0.74 on the loop against
# 0.20-0.27: too close to tell apart).
STALL_MAX_SHARE = 0.4


def test_converting_a_large_fetch_stalls_no_other_client(tmp_path: Path, backend: str) -> None:
    """A kafka listener's Fetch of many natively written batches (converted to v2, about
    40 MiB, a few hundred ms of CPU) runs beside another client's requests: the
    conversion is off the event loop, so the other's ApiVersions keep being answered,
    none waiting for most of the Fetch's time."""
    proc = BrokerProcess(tmp_path / "data", backend=backend, config=BOTH_LISTENERS).start()
    try:
        with WireClient(proc.address("minibroker")) as client:
            assert client.create_topic("big") == 0
            for n in range(STALL_BATCHES):
                values = [bytes([n]) * 1024 for _ in range(BATCH_VALUES * 64)]
                assert client.produce("big", 0, values_batch(values))["error"] == 0
        with WireClient(proc.address("minibroker")) as pinger:
            fetched: list[bytes] = []
            fetched_at: list[float] = []

            def read() -> None:
                fetched.append(kafka_fetch(proc.address("kafka"), 64 * MIB))
                fetched_at.append(time.perf_counter())

            reader = threading.Thread(target=read)
            slowest_s = 0.0
            fetch_started = time.perf_counter()
            reader.start()
            while reader.is_alive():
                started = time.perf_counter()
                assert pinger.call("ApiVersions")["error"] == 0
                slowest_s = max(slowest_s, time.perf_counter() - started)
            reader.join()
        assert len(fetched[0]) > 8 * MIB
        fetch_s = fetched_at[0] - fetch_started
        assert slowest_s < STALL_MAX_SHARE * fetch_s, (
            f"another client waited {slowest_s:.2f} s of the Fetch's {fetch_s:.2f} s"
        )
    finally:
        proc.kill()
