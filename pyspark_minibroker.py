"""Registers the `minibroker` format with no `spark.dataSource.register` call.

PySpark imports every installed top-level module named `pyspark_*` and registers
its `DefaultSource`, so this module must stay cheap and must not fail to import:
one failure and Spark skips them all, and `format("minibroker")` fails with a bare
DATA_SOURCE_NOT_FOUND, its cause in a WARN far above. That import runs in a Python
worker, whose interpreter may lack what the connector needs (pyarrow): then
`DefaultSource` is `MissingDependencySource`, which fails each use with the reason
(spark_connector/worker_python.py words it).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource


class MissingDependencySource(DataSource):
    """`minibroker` where the connector does not import for want of a module. Spark
    pickles the class by reference, so the worker that builds the source imports this
    module again and finds the same reason."""

    reason = ""

    @classmethod
    def name(cls) -> str:
        return "minibroker"

    def __init__(self, options: dict[str, str]) -> None:
        raise ModuleNotFoundError(self.reason)


DefaultSource: type[DataSource]
try:
    from spark_connector import MinibrokerDataSource
except ModuleNotFoundError as error:
    MissingDependencySource.reason = str(error)
    DefaultSource = MissingDependencySource
else:
    DefaultSource = MinibrokerDataSource

__all__ = ["DefaultSource"]
