"""PySpark data source for minibroker: `df.write.format("minibroker")` and
`spark.read.format("minibroker")`, shaped like Spark's Kafka sink and source.

Delivery guarantee of the writer: no duplicates from network retries (the
idempotent producer's resends are deduplicated by the broker); at least once
across Spark task retries (rows pushed by a failed task attempt stay in the log
and its retry pushes them again). Exactly once comes with transactions.
"""

from spark_connector.options import MinibrokerOptionError
from spark_connector.reader import SCHEMA, MinibrokerReader, OffsetRange
from spark_connector.source import MinibrokerDataSource
from spark_connector.writer import MinibrokerCommitMessage, MinibrokerWriter, PartitionRange

__all__ = [
    "SCHEMA",
    "MinibrokerCommitMessage",
    "MinibrokerDataSource",
    "MinibrokerOptionError",
    "MinibrokerReader",
    "MinibrokerWriter",
    "OffsetRange",
    "PartitionRange",
]
