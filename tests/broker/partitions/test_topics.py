"""TopicRegistry on real files: checked topic configs, creation that is whole or nothing,
and a damaged topic.meta that is rebuilt from disk and never costs a record."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from broker.config import BrokerConfig
from broker.partitions.topics import (
    META_FILE,
    TopicError,
    TopicMetaError,
    TopicRegistry,
    decode_meta,
    topic_id_text,
)
from broker.storage import fileio, seal, segment
from harness.wire import fetched_values, values_batch
from protocol.batch import validate
from protocol.errors import ErrorCode

NOW_MS = 1_700_000_000_000


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def registry(data: Path, **settings: Any) -> TopicRegistry:
    r = TopicRegistry(data, BrokerConfig(**settings).validate())
    r.open_all(clean_shutdown=True, now_ms=NOW_MS)
    return r


def produce(r: TopicRegistry, topic: str, partition: int, values: list[bytes]) -> None:
    batch = values_batch(values)
    p = r.partition(topic, partition)
    assert p is not None
    assert p.append(batch, validate(batch), NOW_MS).error == ErrorCode.NONE


def stored_values(r: TopicRegistry, topic: str, partition: int) -> list[bytes]:
    p = r.partition(topic, partition)
    assert p is not None
    return [v for _, v in fetched_values(p.log.read(0, 1 << 20))]


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"segment.bytes": 100}, "segment.bytes"),
        ({"segment.ms": 1e300}, "segment.ms"),
        ({"retention.ms": float("inf")}, "retention.ms"),
        ({"retention.bytes": 2**70}, "retention.bytes"),
        ({"retention.ms": True}, "retention.ms"),
        ({"retention.ms": "soon"}, "retention.ms"),
        ({"index.interval.bytes": -1}, "index.interval.bytes"),
        ({"cleanup.policy": "compact"}, "unknown topic config 'cleanup.policy'"),
    ],
)
def test_bad_topic_config_is_invalid_config_and_leaves_nothing(
    tmp_path: Path, config: dict[str, Any], needle: str
) -> None:
    r = registry(tmp_path)
    before = open_fds()
    with pytest.raises(TopicError) as info:
        r.create("t", 2, config, NOW_MS)
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert needle in info.value.message
    assert os.listdir(r.root) == [] and open_fds() == before and "t" not in r.topics


def _fail_nth(n: int, real: Callable[..., Any]) -> Callable[..., Any]:
    calls = [0]

    def fake(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == n:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    return fake


@pytest.mark.parametrize(
    ("where", "nth"),
    [
        ("mkdir", 1),  # the staging directory
        ("mkdir", 3),  # a partition directory
        ("write", 1),  # the meta file
        ("rename", 1),  # the commit
        ("segment", 1),  # the first partition's log file, after the commit
        ("segment", 3),  # the third, with two partitions open
    ],
)
def test_full_disk_during_creation_is_storage_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, nth: int
) -> None:
    r = registry(tmp_path)
    before = open_fds()
    if where == "mkdir":
        monkeypatch.setattr(Path, "mkdir", _fail_nth(nth, Path.mkdir))
    elif where == "write":
        monkeypatch.setattr(fileio.os, "write", _fail_nth(nth, os.write))
    elif where == "rename":
        monkeypatch.setattr("broker.partitions.topics.os.rename", _fail_nth(nth, os.rename))
    else:
        monkeypatch.setattr(segment, "fsync_dir", _fail_nth(nth, fileio.fsync_dir))
    with pytest.raises(TopicError) as info:
        r.create("t", 4, {"retention.ms": 1000}, NOW_MS)
    monkeypatch.undo()
    assert info.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert "No space left on device" in info.value.message
    assert os.listdir(r.root) == [] and open_fds() == before and "t" not in r.topics
    # Nothing is in the way of trying again once there is room.
    r.create("t", 4, {"retention.ms": 1000}, NOW_MS)
    assert len(r.topics["t"].partitions) == 4
    r.close()


def test_a_restart_forgets_a_creation_that_crashed(tmp_path: Path) -> None:
    """A crash before the rename leaves `<name>~`, which is no topic and goes at start."""
    staging = tmp_path / "topics" / "t~"
    (staging / "0").mkdir(parents=True)
    r = registry(tmp_path)
    assert r.topics == {} and not staging.exists()
    r.create("t", 1, None, NOW_MS)
    r.close()


def test_create_never_deletes_a_directory_it_did_not_make(tmp_path: Path) -> None:
    r = registry(tmp_path)
    stray = r.root / "t" / "0"
    stray.mkdir(parents=True)
    (stray / "00000000000000000000.log").write_bytes(b"someone's records")
    with pytest.raises(TopicError) as info:
        r.create("t", 1, None, NOW_MS)
    assert info.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert str(r.root / "t") in info.value.message
    assert (stray / "00000000000000000000.log").read_bytes() == b"someone's records"


def _damage(meta: Path, how: str) -> None:
    if how == "deleted":
        meta.unlink()
    elif how == "truncated":
        meta.write_bytes(meta.read_bytes()[:3])
    elif how == "flipped":
        data = bytearray(meta.read_bytes())
        data[1] ^= 0xFF
        meta.write_bytes(bytes(data))
    else:
        meta.write_bytes(b"")


@pytest.mark.parametrize("how", ["deleted", "truncated", "flipped", "empty"])
def test_damaged_meta_is_rebuilt_from_the_partition_directories(tmp_path: Path, how: str) -> None:
    r = registry(tmp_path)
    r.create("t", 3, {"retention.ms": -1}, NOW_MS)
    for i in range(3):
        produce(r, "t", i, [f"{i}-{n}".encode() for n in range(5)])
    old_id = r.topics["t"].topic_id
    r.close()
    _damage(r.root / "t" / META_FILE, how)

    r = registry(tmp_path, retention_ms=123_456)
    assert [stored_values(r, "t", i) for i in range(3)] == [
        [f"{i}-{n}".encode() for n in range(5)] for i in range(3)
    ]
    # The override could not be recovered, and the broker's retention of 123 s would
    # delete what the topic kept forever: a rebuilt topic keeps everything instead.
    kept = {"retention_ms": -1, "retention_bytes": -1}
    assert r.topics["t"].config == kept
    assert r.partition("t", 0).log.config.retention_ms == -1  # type: ignore[union-attr]
    meta = decode_meta((r.root / "t" / META_FILE).read_bytes())
    assert (meta.partitions, meta.config) == (3, kept)
    assert meta.topic_id == r.topics["t"].topic_id != old_id, "a rebuilt topic gets a new id"
    with pytest.raises(TopicError) as info:
        r.create("t", 1, None, NOW_MS)
    assert info.value.code == ErrorCode.TOPIC_ALREADY_EXISTS
    r.close()


@pytest.mark.parametrize(
    ("partitions", "needle"),
    [([], "no partition directories"), (["0", "2"], "are not 0..n-1"), (["1"], "not 0..n-1")],
)
def test_unrecoverable_meta_refuses_to_open_and_names_the_file(
    tmp_path: Path, partitions: list[str], needle: str
) -> None:
    topic = tmp_path / "topics" / "t"
    topic.mkdir(parents=True)
    for name in partitions:
        (topic / name).mkdir()
        (topic / name / "00000000000000000000.log").write_bytes(b"")
    before = open_fds()
    r = TopicRegistry(tmp_path, BrokerConfig())
    with pytest.raises(TopicMetaError) as info:
        r.open_all(clean_shutdown=True, now_ms=NOW_MS)
    assert str(topic / META_FILE) in str(info.value) and needle in str(info.value)
    assert sorted(os.listdir(topic)) == sorted(partitions), "nothing touched"
    assert open_fds() == before


def test_a_deletion_renames_to_a_tombstone_that_blocks_the_name_until_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = registry(tmp_path)
    r.create("t", 2, None, NOW_MS)
    produce(r, "t", 1, [b"a"])
    before = open_fds()
    # A rename that fails changes nothing.
    monkeypatch.setattr("broker.partitions.topics.os.rename", _fail_nth(1, os.rename))
    with pytest.raises(TopicError) as info:
        r.delete("t")
    monkeypatch.undo()
    assert info.value.code == ErrorCode.KAFKA_STORAGE_ERROR and "t" in r.topics
    topic = r.delete("t")
    assert "t" not in r.topics and os.listdir(r.root) == ["t~deleted"]
    for p in topic.partitions:
        p.close_files()
    assert len(open_fds()) == len(before) - 2  # the two partitions' segment files
    with pytest.raises(TopicError) as info:
        r.create("t", 1, None, NOW_MS)
    assert (
        info.value.code == ErrorCode.KAFKA_STORAGE_ERROR
        and "has not finished" in info.value.message
    )
    # A start finds the tombstone: a deletion to finish, never a topic.
    again = registry(tmp_path)
    assert again.topics == {} and again.deleting == ["t"]
    again.remove_deleted("t")
    assert os.listdir(again.root) == []
    again.create("t", 1, None, NOW_MS)
    assert stored_values(again, "t", 0) == []
    again.close()


def test_altered_overrides_are_durable_and_in_force_at_once(tmp_path: Path) -> None:
    r = registry(tmp_path)
    r.create("t", 2, {"retention.ms": 1000}, NOW_MS)
    r.alter_config("t", {"segment_bytes": 4096})
    assert r.topics["t"].config == {"segment_bytes": 4096}
    for p in r.topics["t"].partitions:
        assert (p.log.config.segment_bytes, p.log.config.retention_ms) == (
            4096,
            BrokerConfig().retention_ms,
        )
    meta = decode_meta((r.root / "t" / META_FILE).read_bytes())
    assert meta == (2, {"segment_bytes": 4096}, r.topics["t"].topic_id)
    r.close()
    again = registry(tmp_path)
    assert again.topics["t"].config == {"segment_bytes": 4096}
    assert again.topics["t"].topic_id == meta.topic_id, "an override change keeps the id"
    again.close()


def test_a_topic_id_is_fixed_for_the_topics_life_and_new_for_a_new_topic(tmp_path: Path) -> None:
    r = registry(tmp_path)
    r.create("t", 1, None, NOW_MS)
    r.create("u", 1, None, NOW_MS)
    first = r.topics["t"].topic_id
    assert first != r.topics["u"].topic_id and first.version == 4
    assert not topic_id_text(first).startswith("-") and len(topic_id_text(first)) == 22
    r.close()
    r = registry(tmp_path)
    assert r.topics["t"].topic_id == first, "an id survives a restart"
    r.close()
    r = registry(tmp_path)
    topic = r.delete("t")
    for p in topic.partitions:
        p.close_files()
    r.remove_deleted("t")
    r.create("t", 1, None, NOW_MS)
    assert r.topics["t"].topic_id != first, "a topic created again under a name is new"
    r.close()


def test_a_meta_file_without_an_id_gets_one_written_back_before_serving(tmp_path: Path) -> None:
    """A data dir of a broker from before topic ids: the meta file of two keys."""
    r = registry(tmp_path)
    r.create("t", 2, {"retention.ms": 1000}, NOW_MS)
    produce(r, "t", 1, [b"kept"])
    r.close()
    meta_path = r.root / "t" / META_FILE
    body = {"partitions": 2, "config": {"retention_ms": 1000}}
    meta_path.write_bytes(seal(msgpack.packb(body, use_bin_type=True)))
    assert decode_meta(meta_path.read_bytes()).topic_id is None

    r = registry(tmp_path)
    given = r.topics["t"].topic_id
    assert decode_meta(meta_path.read_bytes()) == (2, {"retention_ms": 1000}, given)
    assert stored_values(r, "t", 1) == [b"kept"]
    r.close()
    again = registry(tmp_path)
    assert again.topics["t"].topic_id == given
    again.close()


@pytest.mark.parametrize("topic_id", [b"short", "a string of sixteen", 7])
def test_a_meta_file_with_a_malformed_id_is_damage(tmp_path: Path, topic_id: object) -> None:
    body = {"partitions": 1, "config": {}, "id": topic_id}
    with pytest.raises(ValueError, match="topic id"):
        decode_meta(seal(msgpack.packb(body, use_bin_type=True)))
