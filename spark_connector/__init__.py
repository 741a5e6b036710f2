"""PySpark data source for minibroker: `df.write.format("minibroker")` and
`spark.read.format("minibroker")`, shaped like Spark's Kafka sink and source.

`spark.readStream.format("minibroker")` and `df.writeStream.format("minibroker")`
are the streaming source and sink.

Delivery guarantee of the writers (`minibroker.delivery`): `exactly_once` by default,
one transaction per task attempt, committed all at once by the driver (per
micro-batch for a stream); `at_least_once` writes without transactions, so a
retried task's rows may be stored twice. See spark_connector/README.md.

Importing it before the SparkSession starts, with PYSPARK_PYTHON unset, points Spark's
Python workers at this interpreter (see worker_python.py).
"""

from spark_connector.worker_python import (
    default_workers_to_this_python,
    explain_missing_dependency,
)

with explain_missing_dependency():
    from spark_connector.options import MinibrokerOptionError
    from spark_connector.reader import SCHEMA, MinibrokerReader, OffsetRange
    from spark_connector.source import MinibrokerDataSource, use_in_this_thread
    from spark_connector.stream_reader import MinibrokerStreamReader
    from spark_connector.stream_writer import MinibrokerStreamWriter
    from spark_connector.writer import MinibrokerCommitMessage, MinibrokerWriter, PartitionRange

default_workers_to_this_python()

__all__ = [
    "SCHEMA",
    "MinibrokerCommitMessage",
    "MinibrokerDataSource",
    "MinibrokerOptionError",
    "MinibrokerReader",
    "MinibrokerStreamReader",
    "MinibrokerStreamWriter",
    "MinibrokerWriter",
    "OffsetRange",
    "PartitionRange",
    "use_in_this_thread",
]
