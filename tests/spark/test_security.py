"""A batch write and read and a streaming query through a SCRAM listener with the
authorizer on, as a principal with just the ACLs the connector documents; no password
in the driver's logs or in Spark's errors (docs/security.md#clients)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from client import AdminConfig, admin
from client.types import AclBinding, PatternType, ResourcePattern, ResourceType
from harness.broker_process import BrokerProcess

pytestmark = pytest.mark.spark

if "config" not in BrokerProcess.__dataclass_fields__:
    pytest.skip(
        "the harness cannot give the broker a settings file yet (listeners come with the "
        "broker's side of issue 26)",
        allow_module_level=True,
    )

ADMIN_SECRET = "spark-admin-Secret"
APP_SECRET = "spark-app-Secret"
SETTINGS = (
    'sasl_mechanisms = ["SCRAM-SHA-512"]\n'
    "authorizer = true\n"
    'super_users = ["User:admin"]\n'
    "[[listeners]]\n"
    'name = "sasl"\nhost = "127.0.0.1"\nport = 0\nsecurity = "sasl_plaintext"\n'
)


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(
        tmp_path_factory.mktemp("sasl-broker") / "data",
        config=SETTINGS,
        env={"MINIBROKER_BOOTSTRAP_USERS": f"admin:{ADMIN_SECRET},app:{APP_SECRET}"},
    ).start()
    try:
        yield proc
    finally:
        proc.kill()


def options(broker: BrokerProcess, user: str, password: str) -> dict[str, str]:
    return {
        "minibroker.bootstrap.servers": broker.address("sasl"),
        "minibroker.security.protocol": "SASL_PLAINTEXT",
        "minibroker.sasl.mechanism": "SCRAM-SHA-512",
        "minibroker.sasl.plain.username": user,
        "minibroker.sasl.plain.password": password,
    }


def grant_app(broker: BrokerProcess, topic: str) -> None:
    """What the connector's docs say a writer and a reader need."""
    ops = AdminConfig(
        bootstrap_servers=broker.address("sasl"),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="admin",
        sasl_plain_password=ADMIN_SECRET,
    )
    admin.create_topic(ops, topic, 2)

    def allow(kind: ResourceType, name: str, operation: str, pattern: str = "literal") -> Any:
        pattern_of = ResourcePattern(kind, name, PatternType(pattern))
        return AclBinding("User:app", "*", operation, "allow", pattern_of)  # type: ignore[arg-type]

    result = admin.create_acls(
        ops,
        [
            allow(ResourceType.TOPIC, topic, "write"),
            allow(ResourceType.TOPIC, topic, "read"),
            allow(ResourceType.TRANSACTIONAL_ID, "spark-", "write", "prefixed"),
            allow(ResourceType.CLUSTER, "cluster", "describe"),
        ],
    )
    assert not result.failed, result.failed


def test_secured_write_read_and_stream_show_no_password(
    spark: SparkSession,
    sasl_broker: BrokerProcess,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="minibroker")
    topic = "secured-orders"
    grant_app(sasl_broker, topic)
    app = options(sasl_broker, "app", APP_SECRET)
    rows = spark.createDataFrame([(f"v{i}",) for i in range(100)], "value string")
    rows.write.format("minibroker").options(**app, topic=topic).mode("append").save()
    back = spark.read.format("minibroker").options(**app, topic=topic).load()
    assert sorted(r.value.decode() for r in back.select("value").collect()) == sorted(
        f"v{i}" for i in range(100)
    )

    stream = (
        spark.readStream.format("minibroker")
        .options(**app, subscribe=topic, startingOffsets="earliest")
        .load()
        .selectExpr("value")
        .writeStream.format("minibroker")
        .options(**app, topic=topic)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(once=True)
        .start()
    )
    stream.awaitTermination(120)
    assert stream.exception() is None
    again = spark.read.format("minibroker").options(**app, topic=topic).load()
    assert again.count() == 200

    wrong = options(sasl_broker, "app", "not-" + APP_SECRET)
    with pytest.raises(Exception) as refused:
        spark.read.format("minibroker").options(**wrong, topic=topic).load().collect()
    assert "authentication of 'app' with SCRAM-SHA-512" in str(refused.value)
    # Spark's error, this process's log records (the driver's planning), the broker's log.
    # (The Python workers write to the JVM's stderr, out of this test's reach; what they
    # log is the connector's summaries and the client's errors, tested without secrets.)
    for text in (str(refused.value), caplog.text, sasl_broker.log_text()):
        assert APP_SECRET not in text and ADMIN_SECRET not in text
