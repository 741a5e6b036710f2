"""One topic-partition: its log plus the producer state that guards appends.

The idempotence decision (docs/protocol.md section 3) and the append happen here
in one synchronous step, so no other request can slip between the check and
the write. Producer state is snapshotted on every segment roll and on close,
and rebuilt on open from the newest valid snapshot plus a replay of the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker.log import LogConfig, PartitionLog, StorageError
from broker.producer_state import PartitionProducerState, SnapshotError
from protocol.batch import BatchHeader
from protocol.errors import ErrorCode

log = logging.getLogger(f"minibroker.{__name__}")


@dataclass(frozen=True, slots=True)
class AppendResult:
    error: ErrorCode
    base_offset: int = -1
    duplicate: bool = False
    last_offset: int = -1
    message: str | None = None


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
    ) -> None:
        self.topic = topic
        self.index = index
        self.log = log_
        self.producers = producers
        self.limits = limits
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
        producers, replay_from = cls._load_snapshot(plog, limits)
        producers.restarted(now_ms)
        replayed = 0
        for header, _ in plog.batches_from(replay_from):
            if header.base_offset < replay_from or not header.is_idempotent or header.is_control:
                continue
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
            replayed += 1
        if replayed:
            log.info(
                "event=producer_state_replayed topic=%s partition=%d from_offset=%d batches=%d",
                topic,
                index,
                replay_from,
                replayed,
            )
        return cls(topic, index, plog, producers, limits)

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
            return state, offset
        fresh = PartitionProducerState(
            max_producers=limits.max_producers, expiration_ms=limits.expiration_ms
        )
        return fresh, plog.log_start_offset

    def _rolled(self, offset: int) -> None:
        self._snapshot_at(offset)
        if self.on_rolled is not None:
            self.on_rolled(self)

    def _snapshot_at(self, offset: int) -> None:
        assert offset == self.log.log_end_offset
        self.log.write_snapshot(offset, self.producers.encode_snapshot(offset))

    def append(self, batch: bytes, header: BatchHeader, now_ms: int) -> AppendResult:
        """Judge an idempotent batch by the producer state, then append it or not."""
        producers = self.producers
        if header.is_idempotent:
            decision = producers.check(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.record_count,
                now_ms,
            )
            if decision.error:
                return AppendResult(decision.error, message=decision.message)
            if decision.duplicate is not None:
                dup = decision.duplicate
                return AppendResult(
                    ErrorCode.NONE, dup.base_offset, True, dup.base_offset + dup.last_offset_delta
                )
        try:
            base_offset = self.log.append(batch, header, now_ms)
        except StorageError as exc:
            log.error(
                "event=storage_error topic=%s partition=%d error=%r",
                self.topic,
                self.index,
                str(exc),
            )
            return AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(exc))
        if header.is_idempotent:
            producers.apply(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.record_count,
                base_offset,
                header.max_timestamp,
                now_ms,
            )
        return AppendResult(
            ErrorCode.NONE, base_offset, False, base_offset + header.last_offset_delta
        )

    def close(self) -> None:
        """Flush the log and leave a snapshot at its end, so the next start replays nothing."""
        self._snapshot_at(self.log.log_end_offset)
        self.log.close()


__all__ = ["AppendResult", "Partition", "ProducerLimits", "StorageError"]
