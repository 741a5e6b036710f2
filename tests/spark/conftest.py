"""One local SparkSession (`local[2,4]`: 2 cores, 4 attempts per task) for the Spark tests.

Under xdist every test here runs on one worker (tests/conftest.py, the scheduler), so
they share this one session.

Its Python workers run this interpreter with the repository on their path, so
the tests use the checkout's `spark_connector` whether or not it is installed.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from harness.broker_process import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]
# Every JVM of these tests lives for seconds to minutes: C2's compiles never pay back on
# 2 cores, and the serial collector keeps GC threads off the other tests' core. Spark's
# results do not depend on either; the Spark tests use about a third less CPU with them.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    if shutil.which("java") is None:
        pytest.skip("java not found: pyspark 4.x needs Java 17 (apt-get install openjdk-17-jre)")
    # Spark starts workers with `python3` from PATH unless told; that may lack pyarrow.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = (path + os.pathsep if path else "") + str(ROOT)
    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("minibroker-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the tests that do not kill it; each test uses its own topics."""
    proc = BrokerProcess(tmp_path_factory.mktemp("broker") / "data", backend="trio").start()
    try:
        yield proc
    finally:
        proc.kill()
