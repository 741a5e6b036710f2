"""Committed consumer offsets per group, and the records that change them, pure logic
(docs/protocol.md section 6, docs/consumer-groups.md "Committed offsets").

Per group: the committed offsets, {(topic, partition): (offset, metadata,
commit_ms)}; the pending transactional ones, {producer_id: {(topic, partition):
(offset, metadata)}}, with the producer epoch of the transaction that wrote them,
which that transaction's marker commits or drops; and
`empty_since_ms`, when the group was first seen with no members (None while it
has members). Every change is one record, a msgpack list whose first item names
its kind; broker/groups/offset_store.py appends them to `groups/offsets.wal`
(broker/storage/record_log.py frames them) and replaying the file in order rebuilds the
state:

| kind      | fields after the kind                                              |
|-----------|--------------------------------------------------------------------|
| "commit"  | group_id, empty_since_ms, commit_ms, [[topic, partition, offset,   |
|           | metadata], ...]  (OffsetCommit)                                    |
| "pending" | group_id, empty_since_ms, producer_id, [[topic, partition, offset, |
|           | metadata], ...], producer_epoch  (TxnOffsetCommit; the epoch is    |
|           | missing from records written before it was kept)                   |
| "markers" | commit_ms, [[group_id, producer_id, committed], ...]  (a           |
|           | transaction's end: its pending offsets become committed, or go)    |
| "empty"   | group_id, empty_since_ms  (the group's members came or went)       |
| "expire"  | group_id, [[topic, partition], ...]  (offsets_retention_ms passed) |
| "deleted" | topic  (DeleteTopics: every group's offsets of the topic go)        |
| "group"   | group_id, empty_since_ms, [[topic, partition, offset, metadata,    |
|           | commit_ms], ...], [[producer_id, [[topic, partition, offset,       |
|           | metadata], ...], producer_epoch], ...]  (a whole group: what       |
|           | compaction writes; the epoch as in "pending")                      |

A group holding no offset, committed or pending, is forgotten. No IO, no clock:
time comes in as `now_ms`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

TopicPartition = tuple[str, int]

COMMIT = "commit"
PENDING = "pending"
MARKERS = "markers"
EMPTY = "empty"
EXPIRE = "expire"
DELETED = "deleted"
GROUP = "group"


class OffsetStateError(ValueError):
    """A persisted record that does not decode to a consistent change."""


class Committed(NamedTuple):
    offset: int
    metadata: str | None
    commit_ms: int


class Pending(NamedTuple):
    offset: int
    metadata: str | None


@dataclass(slots=True)
class GroupOffsets:
    empty_since_ms: int | None
    committed: dict[TopicPartition, Committed] = field(default_factory=dict)
    pending: dict[int, dict[TopicPartition, Pending]] = field(default_factory=dict)
    # The epoch of the transaction each producer's pending offsets belong to; none for
    # offsets read from a record that predates it.
    pending_epochs: dict[int, int] = field(default_factory=dict)

    def is_pending(self, key: TopicPartition) -> bool:
        """Whether an open transaction holds an offset for `key` (OffsetFetch require_stable)."""
        return any(key in offsets for offsets in self.pending.values())

    def held(self) -> int:
        return len(self.committed) + sum(len(offsets) for offsets in self.pending.values())


class OffsetState:
    """Every group's offsets, and how many are held against max_committed_offsets."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupOffsets] = {}
        self.held = 0
        # One key object per partition, shared by every group that holds it: a quarter
        # of what an offset costs (there are no more keys than partitions in the broker).
        self._keys: dict[TopicPartition, TopicPartition] = {}

    def group(self, group_id: str) -> GroupOffsets | None:
        return self.groups.get(group_id)

    def new_keys(self, group_id: str, keys: Iterable[TopicPartition], producer_id: int) -> int:
        """How many of `keys` a commit (producer_id -1) or a pending record of
        `producer_id` would add to the offsets held."""
        group = self.groups.get(group_id)
        if group is None:
            return len(set(keys))
        held = group.committed if producer_id < 0 else group.pending.get(producer_id, {})
        return len({k for k in keys if k not in held})

    def holds_pending(self, group_id: str, producer_id: int, producer_epoch: int | None) -> bool:
        """Whether the group holds pending offsets of the producer's transaction at
        `producer_epoch` (None, or offsets whose epoch is unknown: of any epoch)."""
        group = self.groups.get(group_id)
        if group is None or producer_id not in group.pending:
            return False
        held = group.pending_epochs.get(producer_id)
        return producer_epoch is None or held is None or held == producer_epoch

    def holds_topic(self, topic: str) -> list[str]:
        """The groups holding an offset of `topic`, committed or pending."""
        return [
            group_id
            for group_id, group in self.groups.items()
            if any(t == topic for t, _ in group.committed)
            or any(t == topic for offsets in group.pending.values() for t, _ in offsets)
        ]

    def pending_in(self, topic: str) -> list[tuple[str, int]]:
        """(group_id, producer_id) of every open transaction holding an offset of `topic`."""
        return [
            (group_id, pid)
            for group_id, group in self.groups.items()
            for pid, offsets in group.pending.items()
            if any(t == topic for t, _ in offsets)
        ]

    def pending_owners(self) -> set[tuple[str, int, int | None]]:
        """(group_id, producer_id, producer_epoch or None where unknown) of every pending
        transactional offset."""
        return {
            (g, pid, group.pending_epochs.get(pid))
            for g, group in self.groups.items()
            for pid in group.pending
        }

    def expired(self, group_id: str, now_ms: int, retention_ms: int) -> list[TopicPartition]:
        """Offsets of an empty group past retention: `retention_ms` after the later of
        their commit and the group becoming empty; never one an open transaction holds."""
        group = self.groups.get(group_id)
        if group is None or group.empty_since_ms is None:
            return []
        since = group.empty_since_ms
        return sorted(
            key
            for key, c in group.committed.items()
            if max(c.commit_ms, since) + retention_ms <= now_ms and not group.is_pending(key)
        )

    # ------------------------------------------------------------------ replay

    def apply(self, record: Any) -> None:
        """Apply one record (new, or read back from the log); OffsetStateError when it is
        malformed, before anything changed."""
        try:
            kind = record[0]
            if kind == COMMIT:
                _, group_id, since, stamp, items = record
                entries = [self._entry(i) for i in items]
                group_id, since, stamp = _str(group_id), _since(since), _int(stamp)
                group = self._fetch_group(group_id, since)
                for key, (offset, metadata) in entries:
                    self.held += key not in group.committed
                    group.committed[key] = Committed(offset, metadata, stamp)
            elif kind == PENDING:
                _, group_id, since, pid, items, *epoch = record
                entries = [self._entry(i) for i in items]
                group_id, since, pid = _str(group_id), _since(since), _int(pid)
                epochs = [_int(e) for e in epoch]
                if len(epochs) > 1:
                    raise ValueError("a pending record holds one producer epoch")
                group = self._fetch_group(group_id, since)
                offsets = group.pending.setdefault(pid, {})
                for key, value in entries:
                    self.held += key not in offsets
                    offsets[key] = value
                if epochs:
                    group.pending_epochs[pid] = epochs[0]
            elif kind == MARKERS:
                _, stamp, markers = record
                checked = [(_str(g), _int(pid), _bool(c)) for g, pid, c in markers]
                stamp = _int(stamp)
                for group_id, pid, committed in checked:
                    self._end_pending(group_id, pid, committed, stamp)
            elif kind == EMPTY:
                _, group_id, since = record
                found = self.groups.get(_str(group_id))
                if found is not None:
                    found.empty_since_ms = _since(since)
            elif kind == EXPIRE:
                _, group_id, keys = record
                self._expire(_str(group_id), [(_str(t), _int(p)) for t, p in keys])
            elif kind == DELETED:
                _, topic = record
                self._drop_topic(_str(topic))
            elif kind == GROUP:
                _, group_id, since, committed, pending = record
                self._install(group_id, since, committed, pending)
            else:
                raise OffsetStateError(f"unknown kind {kind!r}")
        except (TypeError, ValueError, IndexError) as exc:
            raise OffsetStateError(f"offsets record {record!r:.200}: {exc}") from exc

    def _fetch_group(self, group_id: str, since: int | None) -> GroupOffsets:
        """The group, created if new, with its empty_since_ms set."""
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = GroupOffsets(since)
        else:
            group.empty_since_ms = since
        return group

    def _end_pending(self, group_id: str, pid: int, committed: bool, stamp: int) -> None:
        group = self.groups.get(group_id)
        offsets = None if group is None else group.pending.pop(pid, None)
        if group is None or offsets is None:
            return  # written twice (a retry after a storage failure): the first one ended it
        group.pending_epochs.pop(pid, None)
        self.held -= len(offsets)
        if committed:
            for key, (offset, metadata) in offsets.items():
                self.held += key not in group.committed
                group.committed[key] = Committed(offset, metadata, stamp)
        self._forget_if_bare(group_id, group)

    def _expire(self, group_id: str, keys: list[TopicPartition]) -> None:
        group = self.groups.get(group_id)
        if group is None:
            return
        for key in keys:
            self.held -= group.committed.pop(key, None) is not None
        self._forget_if_bare(group_id, group)

    def _drop_topic(self, topic: str) -> None:
        for group_id in self.holds_topic(topic):
            group = self.groups[group_id]
            for key in [k for k in group.committed if k[0] == topic]:
                del group.committed[key]
                self.held -= 1
            for pid, offsets in list(group.pending.items()):
                for key in [k for k in offsets if k[0] == topic]:
                    del offsets[key]
                    self.held -= 1
                if not offsets:
                    del group.pending[pid]
                    group.pending_epochs.pop(pid, None)
            self._forget_if_bare(group_id, group)
        self._keys = {k: v for k, v in self._keys.items() if k[0] != topic}

    def _install(self, group_id: Any, since: Any, committed: Any, pending: Any) -> None:
        new = GroupOffsets(_since(since))
        for topic, partition, offset, metadata, stamp in committed:
            key, value = self._entry([topic, partition, offset, metadata])
            new.committed[key] = Committed(*value, _int(stamp))
        for pid, items, *epoch in pending:
            new.pending[_int(pid)] = dict(self._entry(i) for i in items)
            if len(epoch) > 1:
                raise ValueError("a group's pending offsets hold one producer epoch")
            if epoch:
                new.pending_epochs[_int(pid)] = _int(epoch[0])
        old = self.groups.pop(_str(group_id), None)
        self.held -= 0 if old is None else old.held()
        self.groups[group_id] = new
        self.held += new.held()
        self._forget_if_bare(group_id, new)

    def _entry(self, item: Any) -> Entry:
        """A record's [topic, partition, offset, metadata], checked, with the shared key."""
        topic, partition, offset, metadata = item
        if metadata is not None:
            _str(metadata)
        if _int(offset) < 0:
            raise ValueError(f"offset {offset} is negative")
        key = (_str(topic), _int(partition))
        return self._keys.setdefault(key, key), Pending(offset, metadata)

    def _forget_if_bare(self, group_id: str, group: GroupOffsets) -> None:
        if not group.committed and not group.pending:
            del self.groups[group_id]

    # ------------------------------------------------------------------ compaction

    def snapshot(self) -> Iterator[list[Any]]:
        """One "group" record per group: the whole state, for compaction."""
        for group_id, group in self.groups.items():
            yield [
                GROUP,
                group_id,
                group.empty_since_ms,
                [
                    [t, p, c.offset, c.metadata, c.commit_ms]
                    for (t, p), c in group.committed.items()
                ],
                [
                    [
                        pid,
                        [[t, p, *v] for (t, p), v in offsets.items()],
                        *_known(group.pending_epochs.get(pid)),
                    ]
                    for pid, offsets in group.pending.items()
                ],
            ]


# ---------------------------------------------------------------------- records


Entry = tuple[TopicPartition, Pending]
"""One partition's offset as a request carries it: ((topic, partition), (offset, metadata))."""


def _entries(entries: Iterable[Entry]) -> list[list[Any]]:
    return [[t, p, offset, metadata] for (t, p), (offset, metadata) in entries]


def commit_record(
    group_id: str, empty_since_ms: int | None, now_ms: int, entries: Iterable[Entry]
) -> list[Any]:
    return [COMMIT, group_id, empty_since_ms, now_ms, _entries(entries)]


def pending_record(
    group_id: str,
    empty_since_ms: int | None,
    producer_id: int,
    producer_epoch: int,
    entries: Iterable[Entry],
) -> list[Any]:
    return [PENDING, group_id, empty_since_ms, producer_id, _entries(entries), producer_epoch]


def markers_record(now_ms: int, markers: Iterable[tuple[str, int, bool]]) -> list[Any]:
    return [MARKERS, now_ms, [list(m) for m in markers]]


def empty_record(group_id: str, empty_since_ms: int | None) -> list[Any]:
    return [EMPTY, group_id, empty_since_ms]


def expire_record(group_id: str, keys: Iterable[TopicPartition]) -> list[Any]:
    return [EXPIRE, group_id, [list(k) for k in keys]]


def deleted_record(topic: str) -> list[Any]:
    return [DELETED, topic]


def empty_since(group: GroupOffsets | None, has_members: bool, now_ms: int) -> int | None:
    """The group's empty_since_ms after a look at its membership now."""
    if has_members:
        return None
    if group is None or group.empty_since_ms is None:
        return now_ms
    return group.empty_since_ms


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"{value!r} is not an integer")
    return value


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise TypeError(f"{value!r} is not a bool")
    return value


def _since(value: Any) -> int | None:
    return None if value is None else _int(value)


def _known(epoch: int | None) -> list[int]:
    """A pending entry's epoch as a record's optional last field."""
    return [] if epoch is None else [epoch]
