"""A marker decides a transaction whose decision record was lost, even behind a snapshot.

EndTxn's decision in txn.wal shares an fsync round with the markers, so after a
power loss a marker may be all that is left of the decision. Recovery found such a
marker only by replaying the log after the newest producer-state snapshot: a segment
roll between the marker and the crash hid it. The producer state now remembers each
producer's last marker until its decision is durable, in snapshot version 3 too.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import anyio
import msgpack
import pytest

from broker.config import BrokerConfig
from broker.partitions.partition import Partition, ProducerLimits
from broker.partitions.producer_ids import ProducerIdManager
from broker.partitions.producer_state import PartitionProducerState, SnapshotError
from broker.partitions.topics import TopicRegistry
from broker.storage.log import LogConfig
from broker.transactions.coordinator import TransactionCoordinator
from broker.transactions.log import TxnLog
from broker.transactions.state import COMPLETE_ABORT, COMPLETE_COMMIT, initialized, with_partitions
from protocol.batch import build_batch, validate
from protocol.errors import ErrorCode

PID, EPOCH = 7, 3
LIMITS = ProducerLimits(max_producers=1000, expiration_ms=86_400_000)
NOW = 10_000


def _open(directory: Path, clean: bool) -> Partition:
    return Partition.open("t", 0, directory, LogConfig(), LIMITS, clean_shutdown=clean, now_ms=NOW)


def _txn_batch(pid: int, seq: int) -> bytes:
    return build_batch(
        [(NOW, None, b"v%d" % seq, None)],
        producer_id=pid,
        producer_epoch=EPOCH,
        base_sequence=seq,
        transactional=True,
    )


def _append(p: Partition, data: bytes) -> int:
    r = p.append(data, validate(data), NOW)
    assert r.error == ErrorCode.NONE, r
    return r.base_offset


def _decode(data: bytes) -> tuple[int, PartitionProducerState]:
    return PartitionProducerState.decode_snapshot(
        data, max_producers=LIMITS.max_producers, expiration_ms=LIMITS.expiration_ms
    )


@pytest.mark.parametrize("committed", [True, False])
def test_a_marker_behind_a_snapshot_is_found_after_a_crash(tmp_path: Path, committed: bool) -> None:
    """The hole: a marker written, a roll snapshotting past it, the process dies before
    the decision is durable. The reopened partition must still know the marker."""
    p = _open(tmp_path, clean=True)
    _append(p, _txn_batch(PID, 0))
    marker = p.append_marker(PID, EPOCH, committed, NOW)
    p.log.roll(NOW)  # what the next append to a full segment does: a snapshot past it
    _append(p, _txn_batch(PID + 1, 0))  # another producer's transaction goes on
    [newest, *_] = p.log.snapshots()
    assert newest[0] > marker, "the test needs a snapshot past the marker"
    # No close(): the process dies here.
    again = _open(tmp_path, clean=False)
    assert again.producers.last_marker(PID) == (EPOCH, committed)
    assert again.producers.markers == {PID: (marker, EPOCH, committed)}
    assert not again.producers.in_txn(PID) and again.producers.in_txn(PID + 1)
    assert again.last_stable_offset == marker + 1


def test_a_marker_whose_decision_is_durable_is_forgotten(tmp_path: Path) -> None:
    p = _open(tmp_path, clean=True)
    _append(p, _txn_batch(PID, 0))
    p.append_marker(PID, EPOCH, True, NOW)
    p.producers.forget_marker(PID, EPOCH - 1)  # another transaction's decision: kept
    assert p.producers.last_marker(PID) == (EPOCH, True)
    p.producers.forget_marker(PID, EPOCH)
    assert p.producers.last_marker(PID) is None
    p.log.roll(NOW)
    again = _open(tmp_path, clean=False)
    assert again.producers.markers == {}


def test_recovery_forgets_every_marker_and_the_next_snapshot_keeps_none(
    tmp_path: Path,
) -> None:
    p = _open(tmp_path, clean=True)
    for pid in (PID, PID + 1):
        _append(p, _txn_batch(pid, 0))
        p.append_marker(pid, EPOCH, pid == PID, NOW)
    assert set(p.producers.markers) == {PID, PID + 1}
    p.producers.forget_markers()
    p.close()
    assert _open(tmp_path, clean=True).producers.markers == {}


def test_a_later_marker_of_the_producer_replaces_the_earlier() -> None:
    state = PartitionProducerState(max_producers=10, expiration_ms=1000)
    state.begin_txn(1, 0)
    assert state.end_txn(1, 1, 0, False) == 0
    state.begin_txn(2, 2)
    assert state.end_txn(2, 3, 5, True) == 2
    state.begin_txn(1, 4)
    assert state.end_txn(1, 5, 1, True) == 4
    assert state.markers == {2: (3, 5, True), 1: (5, 1, True)}
    state.forget_marker(1, 4)  # the replaced marker's decision: the newer one stays
    assert state.last_marker(1) == (1, True)


def test_markers_survive_a_snapshot_round_trip() -> None:
    state = PartitionProducerState(max_producers=10, expiration_ms=1000)
    state.begin_txn(1, 0)
    state.end_txn(1, 2, 4, True)
    state.begin_txn(2, 1)
    state.end_txn(2, 3, 0, False)
    state.begin_txn(1, 5)  # a new transaction after the remembered marker
    offset, loaded = _decode(state.encode_snapshot(6))
    assert offset == 6
    assert loaded.markers == {1: (2, 4, True), 2: (3, 0, False)}
    assert loaded.open_txns == {1: 5}


def _framed(body: object, version: int, offset: int = 100) -> bytes:
    data = msgpack.packb(body, use_bin_type=True)
    head = struct.pack(">4sHqI", b"MBPS", version, offset, len(data))
    return head + data + struct.pack(">I", zlib.crc32(head + data))


PRODUCER = [7, 1, 123, [[0, 0, 10, 0, 5]]]


def test_a_version_2_snapshot_still_loads_with_no_markers() -> None:
    offset, state = _decode(_framed([[PRODUCER], [[7, 10]]], version=2))
    assert offset == 100 and state.epoch_of(7) == 1
    assert state.open_txns == {7: 10} and state.markers == {}


def test_a_version_1_snapshot_still_loads_with_no_markers() -> None:
    offset, state = _decode(_framed([PRODUCER], version=1))
    assert offset == 100 and state.epoch_of(7) == 1 and state.markers == {}


def test_a_version_3_snapshot_of_the_documented_layout_loads() -> None:
    _, state = _decode(_framed([[PRODUCER], [[7, 12]], [[9, 8, 2, 0], [7, 11, 1, 1]]], 3))
    assert state.markers == {9: (8, 2, False), 7: (11, 1, True)}


@pytest.mark.parametrize(
    "markers",
    [
        pytest.param([[9, 100, 2, 1]], id="at-snapshot-offset"),
        pytest.param([[7, 12, 1, 1]], id="at-open-transaction"),
        pytest.param([[7, 13, 1, 1]], id="after-open-transaction"),
        pytest.param([[9, 8, 2, 1], [9, 9, 2, 1]], id="producer-twice"),
        pytest.param([[9, 8, 2, 1], [10, 8, 2, 1]], id="same-offset"),
        pytest.param([[9, 9, 2, 1], [10, 8, 2, 1]], id="not-oldest-first"),
        pytest.param([[9, 8, 2, 2]], id="bad-control-type"),
        pytest.param([[9, 8, 2**15, 1]], id="epoch-over-int16"),
        pytest.param([[9, -1, 2, 1]], id="negative-offset"),
        pytest.param([[-9, 8, 2, 1]], id="negative-pid"),
        pytest.param([[9, 8, 2, True]], id="bool-type"),
        pytest.param([[9, 8, 2]], id="short"),
        pytest.param([[9, 8, 2, 1, 0]], id="long"),
    ],
)
def test_inconsistent_markers_are_refused(markers: list[object]) -> None:
    with pytest.raises(SnapshotError):
        _decode(_framed([[PRODUCER], [[7, 12]], markers], version=3))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param([[PRODUCER], [[7, 12]]], id="version-3-without-markers"),
        pytest.param([[PRODUCER], [[7, 12]], [], []], id="version-3-four-lists"),
    ],
)
def test_a_version_3_body_of_the_wrong_shape_is_refused(body: object) -> None:
    with pytest.raises(SnapshotError):
        _decode(_framed(body, version=3))


def test_a_version_2_body_with_markers_is_refused() -> None:
    with pytest.raises(SnapshotError):
        _decode(_framed([[PRODUCER], [[7, 12]], [[9, 8, 2, 1]]], version=2))


# The coordinator's recovery, in process: the hole as a power loss would leave it.


class _Committer:
    """Syncs a partition at once: what the group committer's round would do."""

    def request_flush(self, partition: Partition, batches: int = 0) -> None:
        pass

    async def wait_durable(self, partition: Partition, last_offset: int) -> None:
        partition.log.flush()
        assert partition.log.flushed_offset > last_offset


class _NoGroups:
    def pending_owners(self) -> set[tuple[str, int, int | None]]:
        return set()

    async def write_markers(self, markers: object) -> None:
        raise AssertionError("no group joined the transaction")

    async def settled(self, group_ids: object) -> None:
        raise AssertionError("no group joined the transaction")


def _coordinator(data: Path, registry: TopicRegistry) -> TransactionCoordinator:
    config = BrokerConfig().validate()
    return TransactionCoordinator(
        config,
        registry,
        ProducerIdManager(data),
        _Committer(),  # type: ignore[arg-type]
        TxnLog(data, config.transaction_log_max_bytes),
        _NoGroups(),
    )


@pytest.mark.parametrize("committed", [True, False])
def test_recovery_decides_by_a_marker_only_a_snapshot_kept(tmp_path: Path, committed: bool) -> None:
    """Transaction `a` wrote to s-0 and s-1. Its decision record is lost; its marker on
    s-0 is on disk, and so is a snapshot of s-0 taken past that marker (a roll); s-1
    got no marker. Recovery must decide `a` by that marker on both partitions."""
    registry = TopicRegistry(tmp_path, BrokerConfig().validate())
    registry.open_all(clean_shutdown=True, now_ms=NOW)
    registry.create("s", 2, None, NOW)
    s0, s1 = registry.partition("s", 0), registry.partition("s", 1)
    assert s0 is not None and s1 is not None
    for p in (s0, s1):
        _append(p, _txn_batch(PID, 0))
    txn_log = TxnLog(tmp_path, BrokerConfig().transaction_log_max_bytes)
    txn_log.open(lambda body: None)
    entry = with_partitions(
        initialized(None, "a", PID, EPOCH, 60_000, NOW), {("s", 0), ("s", 1)}, NOW
    )
    txn_log.append_now([[entry.encode()], [], []])  # the last record kept: ONGOING
    txn_log.close()
    marker = s0.append_marker(PID, EPOCH, committed, NOW)
    s0.log.roll(NOW)
    assert s0.log.snapshots()[0][0] > marker
    for p in registry.all_partitions():
        p.close_files()  # the process dies: nothing more is written

    again = TopicRegistry(tmp_path, BrokerConfig().validate())
    again.open_all(clean_shutdown=False, now_ms=NOW)
    coordinator = _coordinator(tmp_path, again)
    coordinator.load()
    anyio.run(coordinator.recover)
    assert coordinator.entries["a"].state == (COMPLETE_COMMIT if committed else COMPLETE_ABORT)
    s0, s1 = again.partition("s", 0), again.partition("s", 1)
    assert s0 is not None and s1 is not None
    assert s0.log.log_end_offset == marker + 1, "no second marker on s-0"
    assert s1.log.log_end_offset == 2 and s1.last_stable_offset == 2
    assert [e.first_offset for e in s1.aborted.between(0, 2**63)] == ([] if committed else [0])
    assert [p.producers.markers for p in (s0, s1)] == [{}, {}], "forgotten after recovery"
    coordinator.close()
    again.close()
