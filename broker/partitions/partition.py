"""One topic-partition: its log plus the producer state that guards appends.

The idempotence decision (docs/protocol.md section 3) and the append happen here
in one synchronous step, so no other request can slip between the check and
the write. Producer state is snapshotted on every segment roll and on close,
and rebuilt on open from the newest valid snapshot plus a replay of the log.

Transactions (section 5) leave two things here: each producer's open
transaction (in the producer state, so in its snapshots), whose oldest first
offset is the last stable offset, and the aborted-transaction index, written
per segment on roll and close and rebuilt by the same replay.

The producer state also remembers each producer's last marker until its decision
is durable, in its snapshots too (broker/producer_state.py): recovery decides a
transaction whose decision record was lost by such a marker, whether the replay
read it or a snapshot taken after it kept it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from broker.partitions.producer_state import PartitionProducerState, SnapshotError
from broker.storage import (
    TXN_INDEX_SUFFIX,
    AbortedIndex,
    AbortedTxn,
    LogConfig,
    PartitionLog,
    StorageError,
    TxnIndexError,
    decode_entries,
    encode_entries,
    file_name,
    write_atomic,
)
from protocol.batch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    NO_PRODUCER_ID,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    build_control_batch,
    control_type,
    read_header,
)
from protocol.errors import ErrorCode

log = logging.getLogger(f"minibroker.{__name__}")


class AppendResult(NamedTuple):
    """What an append came to; a tuple because one is built per produced batch and a
    frozen dataclass costs a microsecond to build."""

    error: ErrorCode
    base_offset: int = -1
    duplicate: bool = False
    last_offset: int = -1
    message: str | None = None


_UNDECIDED = AppendResult(ErrorCode.UNKNOWN_SERVER_ERROR, message="undecided")


@dataclass(frozen=True, slots=True)
class ProducerLimits:
    max_producers: int
    expiration_ms: int


class Partition:
    def __init__(
        self,
        topic: str,
        index: int,
        log_: PartitionLog,
        producers: PartitionProducerState,
        limits: ProducerLimits,
        aborted: AbortedIndex,
    ) -> None:
        self.topic = topic
        self.index = index
        self.log = log_
        self.producers = producers
        self.limits = limits
        self.aborted = aborted
        # (first offset, marker offset) of each commit appended by `append_commit_first`
        # whose marker is not flushed yet, oldest first: read_committed stops before it.
        self._commits_unflushed: list[tuple[int, int]] = []
        # Set by the server: queues a background fsync of the segment just rolled.
        self.on_rolled: Callable[[Partition], None] | None = None
        log_.on_roll = self._rolled

    @classmethod
    def open(
        cls,
        topic: str,
        index: int,
        directory: Path,
        config: LogConfig,
        limits: ProducerLimits,
        *,
        clean_shutdown: bool,
        now_ms: int,
    ) -> Partition:
        plog = PartitionLog.open(directory, config, clean_shutdown=clean_shutdown, now_ms=now_ms)
        try:
            aborted = _load_aborted(plog)
            producers, replay_from = cls._load_snapshot(plog, limits)
        except TxnIndexError as exc:
            # Without a segment's aborted list, only a replay of the whole log rebuilds it.
            log.warning(
                "event=txnindex_ignored topic=%s partition=%d reason=%r", topic, index, str(exc)
            )
            aborted = AbortedIndex()
            producers = PartitionProducerState(
                max_producers=limits.max_producers, expiration_ms=limits.expiration_ms
            )
            replay_from = plog.log_start_offset
        aborted.drop_from(replay_from)
        producers.restarted(now_ms)
        replayed = 0
        remembered = len(producers.markers)
        for header, batch in plog.batches_from(replay_from):
            if header.base_offset < replay_from or not header.is_idempotent:
                continue
            replayed += 1
            if header.is_control:
                abort = control_type(batch, 0, header) == CONTROL_ABORT
                first = producers.end_txn(
                    header.producer_id, header.base_offset, header.producer_epoch, not abort
                )
                if first is not None and abort:
                    aborted.add(header.producer_id, first, header.base_offset)
                continue
            if header.is_transactional:
                producers.begin_txn(header.producer_id, header.base_offset)
            # Replayed producers count as seen at restart, like those of the snapshot.
            producers.apply(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.record_count,
                header.base_offset,
                header.max_timestamp,
                now_ms,
            )
        if replayed:
            log.info(
                "event=producer_state_replayed topic=%s partition=%d from_offset=%d batches=%d",
                topic,
                index,
                replay_from,
                replayed,
            )
        if remembered:
            # Markers a snapshot kept: their decisions may have been lost with txn.wal's
            # last round, and the replay no longer reads them.
            log.info(
                "event=snapshot_markers topic=%s partition=%d markers=%d",
                topic,
                index,
                remembered,
            )
        assert all(at < plog.log_end_offset for at, _, _ in producers.markers.values())
        partition = cls(topic, index, plog, producers, limits, aborted)
        bases = plog.segment_bases
        for i, base in enumerate(bases):
            if i + 1 == len(bases) or bases[i + 1] > replay_from:
                partition._write_aborted(base, bases[i + 1] if i + 1 < len(bases) else None)
        return partition

    @staticmethod
    def _load_snapshot(
        plog: PartitionLog, limits: ProducerLimits
    ) -> tuple[PartitionProducerState, int]:
        for offset, path in plog.snapshots():
            if offset > plog.log_end_offset:
                continue
            try:
                snap_offset, state = PartitionProducerState.decode_snapshot(
                    plog.read_snapshot(path),
                    max_producers=limits.max_producers,
                    expiration_ms=limits.expiration_ms,
                )
            except (SnapshotError, OSError) as exc:
                log.warning("event=snapshot_ignored path=%s reason=%r", path, str(exc))
                continue
            assert snap_offset == offset
            assert all(at < offset for at, _, _ in state.markers.values()), path
            return state, offset
        fresh = PartitionProducerState(
            max_producers=limits.max_producers, expiration_ms=limits.expiration_ms
        )
        return fresh, plog.log_start_offset

    def _rolled(self, offset: int) -> None:
        # The finished segment's aborted list is durable before the snapshot that lets
        # a recovery skip replaying the segment.
        bases = self.log.segment_bases
        self._write_aborted(bases[-2], offset)
        self._snapshot_at(offset)
        if self.on_rolled is not None:
            self.on_rolled(self)

    def _write_aborted(self, base_offset: int, next_base: int | None) -> None:
        """Write the `.txnindex` of the segment [base_offset, next_base) whole; none when
        it holds no ABORT marker and never had a file."""
        entries = self.aborted.between(base_offset, 2**63 if next_base is None else next_base)
        path = self.log.directory / file_name(base_offset, TXN_INDEX_SUFFIX)
        if not entries and not path.exists():
            return
        try:
            write_atomic(path, encode_entries(entries))
        except OSError as exc:
            raise StorageError(f"txnindex {path}: {exc}") from exc

    def _snapshot_at(self, offset: int) -> None:
        assert offset == self.log.log_end_offset
        self.log.write_snapshot(offset, self.producers.encode_snapshot(offset))

    def append(self, batch: bytes | memoryview, header: BatchHeader, now_ms: int) -> AppendResult:
        """Judge an idempotent batch by the producer state, then append it or not."""
        return self.append_many([batch], [header], now_ms)[0]

    def append_many(
        self, batches: Sequence[bytes | memoryview], headers: Sequence[BatchHeader], now_ms: int
    ) -> list[AppendResult]:
        """Judge and append batches in order, with the results appending them one after
        another would give, but in one write per segment.

        Each batch's verdict depends on the batches before it, which the producer state
        learns only once they are written, so a run is judged on a scratch copy of its
        producer's entry. That copy holds one producer: a run of several producers' or of
        transactional batches goes one batch at a time. A failed write refuses its batch
        and every one after it with KAFKA_STORAGE_ERROR, and leaves the log and the state
        as the batches before it left them (there are any only when the run rolled a
        segment, as one-by-one appends would have)."""
        if len(batches) > 1 and (
            len({h.producer_id for h in headers}) > 1
            or any(h.attributes & TRANSACTIONAL_FLAG for h in headers)
        ):
            return [
                self.append_many([b], [h], now_ms)[0] for b, h in zip(batches, headers, strict=True)
            ]
        producers = self.producers
        producer_id = headers[0].producer_id
        idempotent = producer_id != NO_PRODUCER_ID
        judge = producers if len(batches) == 1 or not idempotent else producers.trial(producer_id)
        results: list[AppendResult] = [_UNDECIDED] * len(batches)
        chosen: list[int] = []
        next_offset = self.log.log_end_offset
        i = 0
        while i < len(headers):
            if judge is not producers:
                # The next batches in sequence, the common case, in one step.
                following = itertools.islice(headers, i, None)
                taken, next_offset = judge.apply_in_order(
                    producer_id, following, next_offset, now_ms
                )
                chosen += range(i, i + taken)
                i += taken
                if i == len(headers):
                    break
            header = headers[i]
            if idempotent:
                epoch, sequence, count = (
                    header.producer_epoch,
                    header.base_sequence,
                    header.record_count,
                )
                decision = judge.check(producer_id, epoch, sequence, count, now_ms)
                if decision.error:
                    results[i] = AppendResult(decision.error, message=decision.message)
                    i += 1
                    continue
                if (dup := decision.duplicate) is not None:
                    results[i] = AppendResult(
                        ErrorCode.NONE, dup.base_offset, True, dup.last_offset
                    )
                    i += 1
                    continue
                if judge is not producers:
                    judge.apply(
                        producer_id,
                        epoch,
                        sequence,
                        count,
                        next_offset,
                        header.max_timestamp,
                        now_ms,
                    )
            chosen.append(i)
            next_offset += header.last_offset_delta + 1
            i += 1
        written: list[int] = []  # the offsets of the chosen batches written so far
        error: StorageError | None = None
        while len(written) < len(chosen):
            rest = chosen[len(written) :]
            try:
                offsets = self.log.append_leading(
                    [batches[i] for i in rest], [headers[i] for i in rest], now_ms
                )
            except StorageError as exc:
                error = exc
                break
            # Applied before the next call, whose roll snapshots the producer state.
            if judge is not producers and len(offsets) == len(chosen):
                producers.adopt(judge, producer_id)
            elif idempotent:
                for i, base_offset in zip(rest, offsets, strict=False):  # the written ones
                    header = headers[i]
                    if header.attributes & TRANSACTIONAL_FLAG:
                        producers.begin_txn(producer_id, base_offset)
                    producers.apply(
                        producer_id,
                        header.producer_epoch,
                        header.base_sequence,
                        header.record_count,
                        base_offset,
                        header.max_timestamp,
                        now_ms,
                    )
            written += offsets
        for i, base_offset in zip(chosen, written, strict=False):  # the written ones
            results[i] = AppendResult(
                ErrorCode.NONE, base_offset, False, base_offset + headers[i].last_offset_delta
            )
        if error is not None:
            log.error(
                "event=storage_error topic=%s partition=%d error=%r",
                self.topic,
                self.index,
                str(error),
            )
            # From the first batch not written on, every verdict was reached on a state
            # that counted it written: none of them stands.
            refused = AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(error))
            for i in range(chosen[len(written)], len(batches)):
                results[i] = refused
        assert _UNDECIDED not in results
        return results

    def append_marker(
        self, producer_id: int, producer_epoch: int, committed: bool, now_ms: int
    ) -> int:
        """Append the COMMIT or ABORT marker ending `producer_id`'s transaction here and
        return its offset; StorageError (nothing changed) when the write fails."""
        batch, header = _marker(producer_id, producer_epoch, committed, now_ms)
        return self._append_marker(batch, header, producer_id, producer_epoch, committed, now_ms)[1]

    def append_commit_first(self, producer_id: int, producer_epoch: int, now_ms: int) -> int | None:
        """Append the COMMIT marker of `producer_id`'s transaction before anything has
        decided it, for one fsync round to make its batches and it durable at once (the
        marker then decides it: docs/transactions.md); return its offset. None, nothing
        appended, when that round could keep the marker and lose a batch: something not
        flushed lies in an older segment, or the marker would start a new one.
        read_committed sees the transaction only once the marker is flushed. StorageError
        (nothing changed) when the write fails."""
        batch, header = _marker(producer_id, producer_epoch, True, now_ms)
        if not self.log.appends_beside_unflushed(header, now_ms):
            return None
        first, offset = self._append_marker(
            batch, header, producer_id, producer_epoch, True, now_ms
        )
        assert first is not None and first < offset, (first, offset)
        self._unflushed_commits().append((first, offset))
        return offset

    def _unflushed_commits(self) -> list[tuple[int, int]]:
        """`_commits_unflushed`, rid of those whose marker is flushed now: it holds no
        more than the commits of the rounds not yet synced, whoever reads it."""
        held = self._commits_unflushed
        flushed = self.log.flushed_offset
        while held and held[0][1] < flushed:
            del held[0]
        return held

    def _append_marker(
        self,
        batch: bytes,
        header: BatchHeader,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        now_ms: int,
    ) -> tuple[int | None, int]:
        """(the transaction's first offset here or None, the marker's offset)."""
        offset = self.log.append(batch, header, now_ms)
        first = self.producers.end_txn(producer_id, offset, producer_epoch, committed)
        if first is not None and not committed:
            self.aborted.add(producer_id, first, offset)
        return first, offset

    @property
    def last_stable_offset(self) -> int:
        """Below it every transaction has ended, and every commit's marker is on disk:
        what read_committed may see."""
        first = self.producers.first_unstable_offset()
        stable = self.log.log_end_offset if first is None else first
        if self._commits_unflushed:
            held = self._unflushed_commits()
            if held:
                stable = min(stable, min(f for f, _ in held))
        return stable

    def apply_retention(self, now_ms: int) -> int:
        """Delete segments past retention (their `.txnindex` with them); return how many."""
        deleted = self.log.apply_retention(now_ms)
        if deleted:
            self.aborted.drop_before(self.log.log_start_offset)
        return deleted

    def close(self) -> None:
        """Flush the log and leave a snapshot at its end, so the next start replays nothing."""
        self._write_aborted(self.log.segment_bases[-1], None)
        self._snapshot_at(self.log.log_end_offset)
        self.log.close()

    def close_files(self) -> None:
        """Close the log's files, writing nothing: its topic was deleted."""
        self.log.close_files()


def _load_aborted(plog: PartitionLog) -> AbortedIndex:
    """The aborted transactions of every segment's `.txnindex`; TxnIndexError if one is bad."""
    bases = plog.segment_bases
    entries: list[AbortedTxn] = []
    for i, base in enumerate(bases):
        path = plog.directory / file_name(base, TXN_INDEX_SUFFIX)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        try:
            entries += decode_entries(data, base, bases[i + 1] if i + 1 < len(bases) else None)
        except TxnIndexError as exc:
            raise TxnIndexError(f"{path}: {exc}") from exc
    return AbortedIndex([e for e in entries if e.last_offset < plog.log_end_offset])


def _marker(
    producer_id: int, producer_epoch: int, committed: bool, now_ms: int
) -> tuple[bytes, BatchHeader]:
    batch = build_control_batch(
        CONTROL_COMMIT if committed else CONTROL_ABORT,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        timestamp_ms=now_ms,
    )
    return batch, read_header(batch)


__all__ = ["AppendResult", "Partition", "ProducerLimits", "StorageError"]
