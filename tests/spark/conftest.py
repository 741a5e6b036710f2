"""One local SparkSession (`local[2,4]`: 2 cores, 4 attempts per task) for the Spark tests.

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
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here runs on one xdist worker (`--dist loadgroup`): they share the
    session's one SparkSession, and two JVMs would not fit beside the brokers."""
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.xdist_group("spark"))


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
