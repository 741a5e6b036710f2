"""`MinibrokerDataSource`: the `minibroker` format for `spark.read`, `df.write`,
`spark.readStream` and `df.writeStream`."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from spark_connector.options import (
    MinibrokerOptionError,
    read_options,
    stream_app_id,
    stream_read_options,
    write_options,
)
from spark_connector.reader import SCHEMA, MinibrokerReader
from spark_connector.stream_reader import MinibrokerStreamReader
from spark_connector.stream_writer import MinibrokerStreamWriter
from spark_connector.writer import MinibrokerWriter


class MinibrokerDataSource(DataSource):
    """Reads and writes minibroker topics with the columns of Spark's Kafka source and sink.

    Every method here runs at planning time, so bad options and bad input
    columns fail the query before any task starts."""

    @classmethod
    def name(cls) -> str:
        return "minibroker"

    def schema(self) -> StructType:
        # Asked for batch and streaming reads alike; only a stream subscribes by pattern.
        check = stream_read_options if "subscribepattern" in self.options else read_options
        check(self.options)
        return SCHEMA

    def _check_schema(self, schema: StructType) -> None:
        if schema != SCHEMA:
            raise MinibrokerOptionError(
                f"the minibroker source has a fixed schema, {SCHEMA.simpleString()}; "
                f"drop the .schema({schema.simpleString()}) call"
            )

    def reader(self, schema: StructType) -> MinibrokerReader:
        self._check_schema(schema)
        return MinibrokerReader(read_options(self.options))

    def streamReader(self, schema: StructType) -> MinibrokerStreamReader:
        self._check_schema(schema)
        return MinibrokerStreamReader(stream_read_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> MinibrokerWriter:
        _refuse_overwrite(overwrite)
        return MinibrokerWriter(write_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> MinibrokerStreamWriter:
        _refuse_overwrite(overwrite)
        options = write_options(self.options, schema)
        return MinibrokerStreamWriter(
            options, stream_app_id(self.options) if options.exactly_once else None
        )


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise MinibrokerOptionError(
            "save mode 'overwrite' is not supported (nor a stream's output mode 'complete'): "
            "a topic is an append-only log; use .mode('append') (outputMode 'append')"
        )


def use_in_this_thread(spark: SparkSession) -> None:
    """Make `spark` the active session of the calling thread on the JVM side, so that
    `format("minibroker")` resolves there.

    PySpark pins each Python thread to its own JVM thread, and a JVM thread without an
    active session fails to find Python data sources, registered or discovered alike
    (DATA_SOURCE_NOT_FOUND), in Spark 4.x. Call it first in every thread that reads or
    writes; PySpark has no public call for it, hence the private attributes."""
    jvm = spark._jvm
    if jvm is None:
        raise RuntimeError("use_in_this_thread needs a classic (JVM) SparkSession, not Connect")
    jvm.SparkSession.setActiveSession(spark._jsparkSession)
