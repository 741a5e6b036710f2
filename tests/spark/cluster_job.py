"""The driver of the standalone-cluster test, run as its own process (one SparkContext
per process, and the test process already has the local one).

    python -m tests.spark.cluster_job MASTER_URL BOOTSTRAP TOPIC

Writes 4,000 values from 4 partitions through `format("minibroker_faults")` whose
partition 0 fails its first attempt after handing rows over, then prints one JSON
line: the executors the tasks ran in."""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession

from tests.spark.conftest import JVM_OPTIONS
from tests.spark.faults import FaultSource

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    master, bootstrap, topic = sys.argv[1:4]
    spark = (
        SparkSession.builder.master(master)
        .appName("minibroker-cluster-test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
        .config("spark.executor.extraJavaOptions", JVM_OPTIONS)
        .config("spark.task.maxFailures", "4")
        # Executors start their Python workers with these, not with the driver's env.
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", ROOT)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(FaultSource)
    (
        spark.range(0, 4000, numPartitions=4)
        .selectExpr("cast(id as string) as value")
        .write.format("minibroker_faults")
        .mode("append")
        .option("minibroker.bootstrap.servers", bootstrap)
        .option("test.fault", "failing_once")
        .option("topic", topic)
        .save()
    )
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    print(json.dumps({"executors": executors}))
    spark.stop()


if __name__ == "__main__":
    main()
