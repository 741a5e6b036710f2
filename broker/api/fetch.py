"""Fetch and ListOffsets: reading the partitions' logs (docs/protocol.md section 4).

A Fetch takes each partition's stored batches from the one holding `fetch_offset`,
bounded by the request's bytes; on trio (`fetch_zero_copy`) they leave as file spans
that the connection sends with sendfile (`SplicedReply`). With too little to answer,
it long-polls: it waits for an append (`wake`) or its deadline.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import anyio

from broker.api.outcomes import SplicedReply
from broker.config import BrokerConfig
from broker.metrics import BrokerMetrics
from broker.partitions import TopicRegistry
from broker.security import Session
from broker.storage import CorruptBatchError, FileSpan, OffsetOutOfRange
from protocol import messages as m
from protocol.batch import scan_batches
from protocol.errors import ErrorCode

log = logging.getLogger(f"minibroker.{__name__}")

FetchLook = tuple[
    m.FetchResponse, int, bool, list[tuple[FileSpan, bytes]], list[tuple[str, int, int]]
]
"""(response, bytes ready, errored, file spans with their placeholders, and the
(topic, bytes, records) flows to count once this look is the reply sent)."""


class FetchApi:
    """Fetch's long poll, and ListOffsets."""

    def __init__(self, config: BrokerConfig, topics: TopicRegistry, metrics: BrokerMetrics):
        self.config = config
        self.topics = topics
        self.metrics = metrics
        self._appended = anyio.Event()
        self._zero_copy = config.fetch_zero_copy and config.backend == "trio"
        self._waiters = 0
        self._stopping = False

    def apis(self) -> dict[str, Callable[[Any, Session], Any]]:
        return {
            "Fetch": lambda req, _session: self.fetch(req),
            "ListOffsets": lambda req, _session: self.list_offsets(req),
        }

    def wake(self) -> None:
        """Records were appended (or a marker moved a stable offset): the waiting Fetches
        look again."""
        if self._waiters:
            self._appended.set()
            self._appended = anyio.Event()

    async def fetch(self, req: m.FetchRequest) -> m.FetchResponse | SplicedReply:
        wait_s = min(max(req.max_wait_ms, 0), self.config.request_timeout_ms) / 1000
        deadline = anyio.current_time() + wait_s
        while True:
            response, ready_bytes, errored, spans, flows = self._fetch_once(req)
            remaining = deadline - anyio.current_time()
            if ready_bytes >= req.min_bytes or errored or remaining <= 0 or self._stopping:
                for topic, size, count in flows:
                    self.metrics.record_fetch(topic, size, count)
                if not spans:
                    return response
                return SplicedReply(response, [s for s, _ in spans], [h for _, h in spans])
            for span, _ in spans:
                os.close(span.fd)
            self._waiters += 1
            try:
                with anyio.move_on_after(remaining):
                    await self._appended.wait()
            finally:
                self._waiters -= 1

    def _fetch_once(self, req: m.FetchRequest) -> FetchLook:
        """One look at the logs; on any failure the file spans taken so far are closed."""
        spans: list[tuple[FileSpan, bytes]] = []
        try:
            return self._look(req, spans)
        except BaseException:
            for span, _ in spans:
                os.close(span.fd)
            raise

    def _look(self, req: m.FetchRequest, spans: list[tuple[FileSpan, bytes]]) -> FetchLook:
        budget = min(req.max_bytes, self.config.fetch_max_bytes)
        used = 0
        errored = False
        flows: list[tuple[str, int, int]] = []
        topics = []
        for t in req.topics:
            topic = t.topic
            out = []
            for fp in t.partitions:
                p = self.topics.partition(topic, fp.partition)
                if p is None:
                    errored = True
                    out.append(
                        m.FetchPartitionResponse(fp.partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    )
                    continue
                plog = p.log
                high_watermark = plog.log_end_offset
                stable = p.last_stable_offset
                committed = req.isolation_level == m.ISOLATION_READ_COMMITTED
                upper = stable if committed else None
                records = b""
                size = count = 0
                end_offset = fp.fetch_offset
                error = ErrorCode.NONE
                # Kafka's rule: every partition's own limit is capped by what is left of
                # the answer's budget; the first non-empty partition may exceed it by one
                # batch (a larger first batch whole) so a consumer always progresses.
                room = min(fp.partition_max_bytes, budget - used)
                if room > 0 or not used:
                    try:
                        if self._zero_copy:
                            span = plog.span(fp.fetch_offset, max(room, 1), upper)
                            if span is not None:
                                # A placeholder stands in the map for the file bytes.
                                records = os.urandom(12) + len(spans).to_bytes(4, "big")
                                spans.append((span, records))
                                size, count = span.length, span.record_count
                                end_offset = span.next_offset
                        else:
                            records = plog.read(fp.fetch_offset, max(room, 1), upper)
                            size = len(records)
                            headers = [h for _, h in scan_batches(records, check_crc=False)]
                            count = sum(h.record_count for h in headers)
                            if headers:
                                end_offset = headers[-1].next_offset
                    except OffsetOutOfRange:
                        error = ErrorCode.OFFSET_OUT_OF_RANGE
                        errored = True
                    except CorruptBatchError as exc:
                        # Damage at rest: said, logged, never sent on.
                        log.error(
                            "event=corrupt_batch topic=%s partition=%d reason=%r",
                            topic,
                            p.index,
                            str(exc),
                        )
                        error = ErrorCode.KAFKA_STORAGE_ERROR
                        errored = True
                used += size
                if size:
                    flows.append((topic, size, count))
                out.append(
                    m.FetchPartitionResponse(
                        fp.partition,
                        error,
                        high_watermark,
                        stable,
                        plog.log_start_offset,
                        [
                            m.AbortedTransaction(pid, first)
                            for pid, first in p.aborted.overlapping(fp.fetch_offset, end_offset)
                        ]
                        if committed
                        else None,
                        records,
                    )
                )
            topics.append(m.FetchTopicResponse(topic, out))
        return m.FetchResponse(topics=topics), used, errored, spans, flows

    def stop_waiting(self) -> None:
        """Shutdown: answer every long-polling Fetch now with what it has."""
        self._stopping = True
        self._appended.set()

    def list_offsets(self, req: m.ListOffsetsRequest) -> m.ListOffsetsResponse:
        topics = []
        for t in req.topics:
            out = []
            for lp in t.partitions:
                index, timestamp = lp.partition, lp.timestamp
                p = self.topics.partition(t.topic, index)
                if p is None:
                    out.append(
                        m.ListOffsetsPartitionResponse(index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    )
                elif timestamp == m.TIMESTAMP_LATEST:
                    latest = (
                        p.last_stable_offset
                        if req.isolation_level == m.ISOLATION_READ_COMMITTED
                        else p.log.log_end_offset
                    )
                    out.append(m.ListOffsetsPartitionResponse(index, offset=latest))
                elif timestamp == m.TIMESTAMP_EARLIEST:
                    out.append(m.ListOffsetsPartitionResponse(index, offset=p.log.log_start_offset))
                else:
                    found = p.log.offset_for_timestamp(timestamp)
                    out.append(
                        m.ListOffsetsPartitionResponse(
                            index, offset=-1 if found is None else found, timestamp=timestamp
                        )
                    )
            topics.append(m.ListOffsetsTopicResponse(t.topic, out))
        return m.ListOffsetsResponse(topics=topics)
