"""The consumer-group assignor: which member should own which partition (pure).

Balanced and sticky, in the spirit of Kafka's uniform assignor (KIP-848):

- Every member subscribed to the same topics as another gets as many partitions
  as it, give or take one; with mixed subscriptions no partition could move from
  a member to one holding two fewer that also subscribes to its topic.
- A partition stays with its previous target owner whenever balance allows; with
  one subscription shared by every member the number of partitions taken from
  their previous owner is the least any balanced assignment needs.

Deterministic: the same input always gives the same output, whatever the order
of the mappings. The assignor knows nothing of reconciliation: broker/groups/state.py
decides when a partition actually changes hands.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

TopicPartition = tuple[str, int]
Assignment = dict[str, frozenset[TopicPartition]]


def assign(
    subscriptions: Mapping[str, frozenset[str]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, frozenset[TopicPartition]],
) -> Assignment:
    """The target assignment of every member in `subscriptions` (member id -> topics).

    Topics absent from `partition_counts` do not exist (yet) and are skipped;
    `previous` is the last target assignment, the source of stickiness."""
    members = sorted(subscriptions)
    if not members:
        return {}
    kept = _still_valid(members, subscriptions, partition_counts, previous)
    topic_sets = {subscriptions[m] for m in members}
    if len(topic_sets) == 1:
        return _homogeneous(members, next(iter(topic_sets)), partition_counts, kept)
    return _general(members, subscriptions, partition_counts, kept)


def _still_valid(
    members: list[str],
    subscriptions: Mapping[str, frozenset[str]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, frozenset[TopicPartition]],
) -> dict[str, set[TopicPartition]]:
    """Each member's previous partitions that still exist and that it still subscribes
    to; a partition claimed twice (never, from a valid target) goes to the first id."""
    taken: set[TopicPartition] = set()
    kept: dict[str, set[TopicPartition]] = {}
    for member in members:
        topics = subscriptions[member]
        mine = {
            tp
            for tp in previous.get(member, frozenset())
            if tp[0] in topics and 0 <= tp[1] < partition_counts.get(tp[0], 0) and tp not in taken
        }
        taken |= mine
        kept[member] = mine
    return kept


def _homogeneous(
    members: list[str],
    topics: frozenset[str],
    partition_counts: Mapping[str, int],
    kept: dict[str, set[TopicPartition]],
) -> Assignment:
    """One subscription for all: quotas of P // N, the P % N extra ones going to the
    members that kept the most (which is what makes the moves minimal)."""
    every = [(t, p) for t in sorted(topics) for p in range(partition_counts.get(t, 0))]
    base, extra = divmod(len(every), len(members))
    by_kept = sorted(members, key=lambda m: (-len(kept[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_kept)}
    out: dict[str, list[TopicPartition]] = {}
    for member in members:
        out[member] = sorted(kept[member])[: quota[member]]
    owned = {tp for held in out.values() for tp in held}
    free = iter([tp for tp in every if tp not in owned])
    for member in members:
        while len(out[member]) < quota[member]:
            out[member].append(next(free))
    return {m: frozenset(tps) for m, tps in out.items()}


def _general(
    members: list[str],
    subscriptions: Mapping[str, frozenset[str]],
    partition_counts: Mapping[str, int],
    kept: dict[str, set[TopicPartition]],
) -> Assignment:
    """Mixed subscriptions: keep what is valid, give each free partition to the
    least loaded of its topic's subscribers (topics with fewest subscribers first),
    then move partitions from the most to the least loaded while one can move."""
    subscribers: dict[str, list[str]] = {}
    for member in members:
        for topic in subscriptions[member]:
            if partition_counts.get(topic, 0) > 0:
                subscribers.setdefault(topic, []).append(member)
    out = {m: set(kept[m]) for m in members}
    owned = {tp for held in out.values() for tp in held}
    count = {m: len(out[m]) for m in members}
    for topic in sorted(subscribers, key=lambda t: (len(subscribers[t]), t)):
        # A heap of (count, member) per topic; an entry whose count went stale is
        # pushed back with the current one (counts only grow here).
        heap = [(count[m], m) for m in subscribers[topic]]
        heapq.heapify(heap)
        for p in range(partition_counts[topic]):
            if (topic, p) in owned:
                continue
            while heap[0][0] != count[heap[0][1]]:
                _, stale = heapq.heappop(heap)
                heapq.heappush(heap, (count[stale], stale))
            _, member = heapq.heappop(heap)
            out[member].add((topic, p))
            count[member] += 1
            heapq.heappush(heap, (count[member], member))
    # Each move lowers the sum of squared counts, so this ends.
    while (move := _a_move(members, subscriptions, out, kept)) is not None:
        donor, receiver, tp = move
        out[donor].remove(tp)
        out[receiver].add(tp)
    return {m: frozenset(tps) for m, tps in out.items()}


def _a_move(
    members: list[str],
    subscriptions: Mapping[str, frozenset[str]],
    out: dict[str, set[TopicPartition]],
    kept: dict[str, set[TopicPartition]],
) -> tuple[str, str, TopicPartition] | None:
    """A partition the most loaded possible donor can give to the least loaded
    member holding at least two fewer and subscribed to its topic, or None. One the
    donor was only just given goes first: moving it takes nothing from anyone."""
    order = sorted(members, key=lambda m: (len(out[m]), m))
    for donor in reversed(order):
        for receiver in order:
            if len(out[receiver]) + 2 > len(out[donor]):
                break
            movable = [tp for tp in out[donor] if tp[0] in subscriptions[receiver]]
            if movable:
                return donor, receiver, min(movable, key=lambda tp: (tp in kept[donor], tp))
    return None
