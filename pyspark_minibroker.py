"""Registers the `minibroker` format with no `spark.dataSource.register` call.

PySpark imports every installed top-level module named `pyspark_*` and registers
its `DefaultSource`, so this module must stay cheap and must not fail to import.
"""

from spark_connector import MinibrokerDataSource

DefaultSource = MinibrokerDataSource

__all__ = ["DefaultSource"]
