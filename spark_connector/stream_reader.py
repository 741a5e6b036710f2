"""The streaming source: `spark.readStream.format("minibroker")`, shaped like Spark's Kafka
source.

An offset is JSON per topic partition, `{"orders": {"0": 42, "1": 7}}`: the next offset
to read, kept by Spark in the query's checkpoint. `latestOffset` asks the broker for each
partition's end, which under read_committed (the default) is the last stable offset, so
a micro-batch never plans past a transaction still open and reads the same records when
it runs again. Partitions that appear later start at offset 0. Every method but `read`
runs on the driver side; `read` runs in a task, over one planned range.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from spark_connector.options import EARLIEST, LATEST, MinibrokerOptionError, ReadOptions
from spark_connector.reader import OffsetRange, open_consumer, read_range, split

if TYPE_CHECKING:
    from client import Consumer, TopicPartition

Offsets = dict[tuple[str, int], int]


def to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json(offsets: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {(t, int(p)): o for t, parts in offsets.items() for p, o in parts.items()}


def rate_limited(start: Offsets, end: Offsets, limit: int) -> Offsets:
    """`end`, cut so that at most about `limit` offsets are read, shared between the
    partitions in proportion to how far behind each is (Spark's Kafka source's rule;
    a partition's share is at least one offset, so every one moves on)."""
    behind = {tp: e - start.get(tp, 0) for tp, e in end.items() if e > start.get(tp, 0)}
    total = sum(behind.values())
    if total <= limit:
        return end
    cut = dict(end)
    for tp, size in behind.items():
        share = limit * size / total
        cut[tp] = min(end[tp], start.get(tp, 0) + (math.ceil(share) if share < 1 else int(share)))
    return cut


class MinibrokerStreamReader(DataSourceStreamReader):
    """Holds options only: Spark pickles it, and calls the planning methods in a
    long-lived worker and `read` in tasks."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def _partitions(self, consumer: Consumer) -> list[TopicPartition]:
        from client import TopicPartition

        if self.options.pattern is not None:
            topics = sorted(t for t in consumer.topics() if self.options.pattern.fullmatch(t))
        else:
            topics = list(self.options.topics)
        return [
            TopicPartition(topic, p)
            for topic in topics
            for p in sorted(self._topic_partitions(consumer, topic))
        ]

    def _topic_partitions(self, consumer: Consumer, topic: str) -> set[int]:
        from client.errors import UnknownTopicError

        try:
            return consumer.partitions_for_topic(topic)
        except UnknownTopicError:
            if self.options.pattern is not None:
                return set()  # deleted since it was listed
            raise MinibrokerOptionError(f"topic {topic!r} does not exist") from None

    def initialOffset(self) -> dict[str, Any]:
        starting = self.options.starting
        consumer = open_consumer(self.options)
        try:
            tps = self._partitions(consumer)
            for topic, given in starting.specific.items():
                held = {tp.partition for tp in tps if tp.topic == topic}
                if set(given) != held:
                    raise MinibrokerOptionError(
                        f"option 'startingOffsets' must give an offset for every partition of "
                        f"{topic!r} (-2 earliest, -1 latest): it has {sorted(given)}, the topic "
                        f"has {sorted(held)}"
                    )
            earliest = consumer.beginning_offsets(tps)
            latest = consumer.end_offsets(tps)
        finally:
            consumer.close()
        offsets: Offsets = {}
        for tp in tps:
            wanted = (
                starting.specific[tp.topic][tp.partition]
                if tp.topic in starting.specific
                else starting.default
            )
            offsets[(tp.topic, tp.partition)] = {EARLIEST: earliest[tp], LATEST: latest[tp]}.get(
                wanted, wanted
            )
        return to_json(offsets)

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        """pyspark 4.2+ passes the micro-batch's start and read limit; 4.0 and 4.1 pass
        neither, and so get no maxOffsetsPerTrigger and no data-loss check here."""
        consumer = open_consumer(self.options)
        try:
            tps = self._partitions(consumer)
            latest = consumer.end_offsets(tps)
        finally:
            consumer.close()
        begin = {} if start is None else from_json(start)
        end: Offsets = {(tp.topic, tp.partition): offset for tp, offset in latest.items()}
        lost = [
            f"{t}[{p}] is gone" if (t, p) not in end else f"{t}[{p}] ends at {end[(t, p)]}"
            for (t, p), offset in sorted(begin.items())
            if end.get((t, p), -1) < offset
        ]
        if lost and self.options.fail_on_data_loss:
            raise MinibrokerOptionError(
                f"the query read further than the broker now holds: {', '.join(lost)} "
                "(the topic was deleted and created again, or its data was lost or replaced "
                "since); set failOnDataLoss=false to go on "
                "from there"
            )
        if limit is not None:
            from pyspark.sql.streaming.datasource import ReadMaxRows

            if isinstance(limit, ReadMaxRows):
                end = rate_limited(begin, end, limit.max_rows)
        return to_json(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[OffsetRange]:
        begin, until = from_json(start), from_json(end)
        wanted = {tp: (begin.get(tp, 0), e) for tp, e in until.items() if e > begin.get(tp, 0)}
        if not wanted:
            return []
        from client import TopicPartition

        consumer = open_consumer(self.options)
        try:
            earliest = consumer.beginning_offsets([TopicPartition(*tp) for tp in wanted])
        finally:
            consumer.close()
        ranges = []
        for (topic, partition), (first, last) in sorted(wanted.items()):
            low = earliest[TopicPartition(topic, partition)]
            if low > first:
                if self.options.fail_on_data_loss:
                    raise MinibrokerOptionError(
                        f"offsets {first}..{low - 1} of {topic}[{partition}] were deleted "
                        "(retention) before they were read; set failOnDataLoss=false to go on "
                        "without them"
                    )
                first = low
            if first < last:
                ranges.append(OffsetRange(topic, partition, first, last))
        return split(ranges, self.options.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        yield from read_range(self.options, partition)
