"""`MinibrokerDataSource`: the `minibroker` format for `spark.read` and `df.write`."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from spark_connector.options import MinibrokerOptionError, read_options, write_options
from spark_connector.reader import SCHEMA, MinibrokerReader
from spark_connector.writer import MinibrokerWriter


class MinibrokerDataSource(DataSource):
    """Reads and writes minibroker topics with the columns of Spark's Kafka source and sink.

    Every method here runs at planning time, so bad options and bad input
    columns fail the query before any task starts."""

    @classmethod
    def name(cls) -> str:
        return "minibroker"

    def schema(self) -> StructType:
        read_options(self.options)
        return SCHEMA

    def reader(self, schema: StructType) -> MinibrokerReader:
        if schema != SCHEMA:
            raise MinibrokerOptionError(
                f"the minibroker source has a fixed schema, {SCHEMA.simpleString()}; "
                f"drop the .schema({schema.simpleString()}) call"
            )
        return MinibrokerReader(read_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> MinibrokerWriter:
        if overwrite:
            raise MinibrokerOptionError(
                "save mode 'overwrite' is not supported: a topic is an append-only log; "
                "use .mode('append')"
            )
        return MinibrokerWriter(write_options(self.options, schema))
