"""The SDK's topic administration helpers against the real broker process, on both
backends: delete_topics, describe_configs and incremental_alter_configs, sync and async,
typed results, and the errors a refusal raises; and their CLI, `minibroker topics
delete` and `minibroker configs describe | alter`, run as a user would."""

from __future__ import annotations

import pytest

from client import MinibrokerError, Producer, TopicPartition
from client.admin import (
    alter_group_offsets,
    create_topic,
    delete_topics,
    delete_topics_async,
    describe_configs,
    describe_configs_async,
    incremental_alter_configs,
    incremental_alter_configs_async,
    list_group_offsets,
    list_topics,
)
from client.errors import InvalidConfigError, UnknownTopicError
from client.types import AlterConfigOp, ConfigEntry, ConfigResource
from harness.broker_process import BrokerProcess
from protocol.errors import ErrorCode
from tests.client.test_client_cli import cli


@pytest.fixture
def anyio_backend(backend: str) -> str:
    return backend


def test_delete_topics_takes_records_and_offsets(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "a", partitions=2)
    create_topic(bootstrap, "b")
    with Producer(bootstrap) as producer:
        producer.send("a", b"old", partition=1).get(timeout=10)
    alter_group_offsets(bootstrap, "g", {TopicPartition("a", 1): 1})
    assert list_group_offsets(bootstrap, "g") == {TopicPartition("a", 1): (1, None)}

    delete_topics(bootstrap, ["a"])
    assert list_topics(bootstrap) == ["b"]
    assert list_group_offsets(bootstrap, "g") == {}
    with pytest.raises(UnknownTopicError) as info:
        delete_topics(bootstrap, ["a", "b", "c"])
    # The first refused is raised; the others refused are named; b was deleted.
    assert info.value.topic == "a" and "'c'" in str(info.value)
    assert list_topics(bootstrap) == []

    create_topic(bootstrap, "a")
    with Producer(bootstrap) as producer:
        assert producer.send("a", b"new", partition=0).get(timeout=10).offset == 0


def test_describe_and_alter_configs_are_typed(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "t", config={"retention.ms": 1000})
    topic, broker_ = describe_configs(
        bootstrap, [ConfigResource("topic", "t"), ConfigResource("broker", "0")]
    )
    assert topic.resource == ConfigResource("topic", "t")
    assert topic.get("retention.ms") == ConfigEntry("retention.ms", "1000", "topic", False, False)
    assert topic.get("no.such.setting") is None
    assert broker_.get("log_level") == ConfigEntry("log_level", "info", "default", False, False)
    port = broker_.get("port")
    assert port is not None and port.read_only and port.value == str(broker.port)  # as started

    t = ConfigResource("topic", "t")
    incremental_alter_configs(
        bootstrap,
        {t: [AlterConfigOp("retention.ms", "delete"), AlterConfigOp("segment.ms", "set", "60000")]},
    )
    [after] = describe_configs(bootstrap, [t])
    assert after.get("segment.ms") == ConfigEntry("segment.ms", "60000", "topic", False, False)
    retention = after.get("retention.ms")
    assert retention is not None and retention.source == "default"

    with pytest.raises(InvalidConfigError, match=r"segment\.bytes") as refused:
        incremental_alter_configs(bootstrap, {t: [AlterConfigOp("segment.bytes", "set", "1")]})
    assert refused.value.code == ErrorCode.INVALID_CONFIG
    incremental_alter_configs(
        bootstrap, {t: [AlterConfigOp("segment.ms", "delete")]}, validate_only=True
    )
    assert describe_configs(bootstrap, [t]) == [after]
    with pytest.raises(UnknownTopicError):
        describe_configs(bootstrap, [ConfigResource("topic", "nope")])
    with pytest.raises(MinibrokerError) as wrong_broker:
        describe_configs(bootstrap, [ConfigResource("broker", "7")])
    assert wrong_broker.value.code == ErrorCode.INVALID_REQUEST
    # What the broker would refuse as a mistyped request is refused before sending.
    with pytest.raises(ValueError):
        ConfigResource("group", "g")
    with pytest.raises(ValueError):
        AlterConfigOp("retention.ms", "append", "1")
    with pytest.raises(ValueError):
        AlterConfigOp("retention.ms", "set")


@pytest.mark.anyio
async def test_async_faces(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "t")
    t = ConfigResource("topic", "t")
    await incremental_alter_configs_async(
        bootstrap, {t: [AlterConfigOp("retention.bytes", "set", "4096")]}
    )
    [described] = await describe_configs_async(bootstrap, [t])
    assert described.get("retention.bytes") == ConfigEntry(
        "retention.bytes", "4096", "topic", False, False
    )
    await delete_topics_async(bootstrap, ["t"])
    assert list_topics(bootstrap) == []


# --------------------------------------------------------------------------- CLI

# The CLI is the helpers above in a subprocess: one backend is enough.
on_trio = pytest.mark.parametrize("backend", ["trio"])


@on_trio
def test_cli_deletes_topics_and_reports_each(broker: BrokerProcess) -> None:
    for name in ("a", "b"):
        create_topic(broker.bootstrap, name)
    deleted = cli(broker, "topics", "delete", "a", "nope", "b")
    assert deleted.returncode == 1
    assert deleted.stdout.decode().splitlines() == ["Deleted topic a.", "Deleted topic b."]
    assert b"'nope'" in deleted.stderr and b"does not exist" in deleted.stderr
    assert list_topics(broker.bootstrap) == []


@on_trio
def test_cli_describes_and_alters_configs(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "t", config={"retention.ms": 1000})
    altered = cli(
        broker,
        "configs",
        "alter",
        "--topic",
        "t",
        "--add-config",
        "segment.ms=60000,retention.bytes=4096",
        "--delete-config",
        "retention.ms",
    )
    assert altered.returncode == 0, altered.stderr
    assert altered.stdout == b"Completed updating config for topic t.\n"
    shown = cli(broker, "configs", "describe", "--topic", "t").stdout.decode().splitlines()
    assert shown[0] == "All configs for topic t are:"
    assert "  segment.ms=60000 source=topic read_only=false sensitive=false" in shown
    assert "  retention.bytes=4096 source=topic read_only=false sensitive=false" in shown
    assert "  retention.ms=604800000 source=default read_only=false sensitive=false" in shown
    settings = cli(broker, "configs", "describe", "--broker").stdout.decode().splitlines()
    assert settings[0] == "All configs for broker 0 are:"
    assert "  log_level=info source=default read_only=false sensitive=false" in settings

    bad = cli(broker, "configs", "alter", "--topic", "t", "--add-config", "segment.bytes=1")
    assert bad.returncode == 1 and b"INVALID_CONFIG" in bad.stderr
    assert b"segment.bytes" in bad.stderr
    unchanged = cli(broker, "configs", "describe", "--topic", "t").stdout.decode()
    assert unchanged.splitlines() == shown
    checked = cli(
        broker,
        "configs",
        "alter",
        "--topic",
        "t",
        "--add-config",
        "segment.ms=1",
        "--validate-only",
    )
    assert checked.returncode == 0 and b"nothing changed" in checked.stdout
    assert cli(broker, "configs", "describe", "--topic", "t").stdout.decode().splitlines() == shown
    for usage in (
        ["configs", "alter", "--topic", "t"],
        ["configs", "alter", "--topic", "t", "--add-config", "novalue"],
    ):
        assert cli(broker, *usage).returncode == 2
    missing = cli(broker, "configs", "describe", "--topic", "nope")
    assert missing.returncode == 1 and b"does not exist" in missing.stderr
