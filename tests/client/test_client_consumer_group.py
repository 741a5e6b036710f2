"""The consumer's group I/O and rebalance rules over a fake broker (tests/fake_group_broker.py).

What the real broker only does on its timers, or never, is scripted here: an
answer of FENCED_MEMBER_EPOCH, a STALE_MEMBER_EPOCH commit, an unstable offset,
a broker that does not serve groups. Both faces, both event loops: callbacks run
inside the poll (on the polling thread for the sync face), revoked partitions are
committed before the heartbeat that releases them, their records are never
returned after the revoke callback, and positions start at committed offsets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from anyio.from_thread import start_blocking_portal

from client import (
    AsyncConsumer,
    Consumer,
    ConsumerGroupMetadata,
    ConsumerRebalanceListener,
    FencedInstanceIdError,
    IllegalStateError,
    MinibrokerError,
    NoOffsetForPartitionError,
    StaleMemberEpochError,
    TopicPartition,
)
from protocol.errors import ErrorCode
from tests.fake_group_broker import FakeGroupBroker, running

pytestmark = pytest.mark.anyio
E = ErrorCode
FAST = {
    "retry_backoff_ms": 10,
    "retry_backoff_max_ms": 50,
    "reconnect_backoff_ms": 10,
    "request_timeout_ms": 5_000,
    "fetch_max_wait_ms": 100,
    "auto_offset_reset": "earliest",
}
T = [TopicPartition("t", p) for p in range(4)]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


class Recorder(ConsumerRebalanceListener):
    """Every callback, in order, with what the consumer saw at the time."""

    def __init__(self, consumer: Any = None) -> None:
        self.consumer = consumer
        self.calls: list[tuple[str, set[TopicPartition]]] = []
        self.threads: set[int] = set()

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.calls.append(("revoked", revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.calls.append(("assigned", assigned))


async def poll_until(consumer: AsyncConsumer, condition: Any, limit_s: float = 10.0) -> list[Any]:
    """Poll, keeping every record, until `condition(records)` holds."""
    got: list[Any] = []
    with anyio.fail_after(limit_s):
        while not condition(got):
            for records in (await consumer.getmany(timeout_ms=50)).values():
                got += records
    return got


async def test_members_split_the_partitions_and_read_every_record_once() -> None:
    fake = FakeGroupBroker({"t": 4})
    for p in range(4):
        fake.append("t", p, [f"{p}-{i}".encode() for i in range(5)])
    async with running(fake) as bootstrap:
        a_calls, b_calls = Recorder(), Recorder()
        config = {**FAST, "group_id": "g", "enable_auto_commit": False}
        async with AsyncConsumer("t", bootstrap_servers=bootstrap, listener=a_calls, **config) as a:
            first = await poll_until(a, lambda got: len(got) >= 20)
            await a.commit()
            assert a.assignment() == set(T)
            assert await a.committed(T[0]) == 5
            async with AsyncConsumer(
                topics=["t"], bootstrap_servers=bootstrap, listener=b_calls, **config
            ) as b:
                for p in range(4):
                    fake.append("t", p, [f"{p}-{i}".encode() for i in range(5, 8)])
                got_a: list[Any] = []
                got_b: list[Any] = []
                with anyio.fail_after(10):
                    while len(got_a) + len(got_b) < 12 or len(b.assignment()) != 2:
                        for records in (await a.getmany(timeout_ms=20)).values():
                            got_a += records
                        for records in (await b.getmany(timeout_ms=20)).values():
                            got_b += records
                        await a.commit()
                        await b.commit()
                assert a.assignment() | b.assignment() == set(T)
                assert not a.assignment() & b.assignment()
                b_final = b.assignment()
                assert fake.owners() == {
                    tp: [m]
                    for m, tps in (("m1", a.assignment()), ("m2", b.assignment()))
                    for tp in tps
                }
    values = sorted(r.value for r in first + got_a + got_b)
    assert values == sorted(f"{p}-{i}".encode() for p in range(4) for i in range(8))
    assert a_calls.calls[0] == ("assigned", set(T))
    assert a_calls.calls[1][0] == "revoked" and len(a_calls.calls[1][1]) == 2
    assert b_calls.calls == [("assigned", b_final), ("revoked", b_final)]  # closing revokes


async def test_revoked_partitions_are_committed_before_the_heartbeat_that_releases_them() -> None:
    fake = FakeGroupBroker({"t": 4})
    for p in range(4):
        fake.append("t", p, [b"x"] * 3)
    async with running(fake) as bootstrap:
        seen_in_callback: list[Any] = []

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
                commits = fake.requests("OffsetCommit")
                seen_in_callback.append((revoked, len(commits)))

        config = {**FAST, "group_id": "g", "auto_commit_interval_ms": 600_000}
        async with AsyncConsumer(
            "t", bootstrap_servers=bootstrap, listener=Listener(), **config
        ) as a:
            await poll_until(a, lambda got: len(got) >= 12)
            async with AsyncConsumer("t", bootstrap_servers=bootstrap, **config) as b:
                with anyio.fail_after(10):
                    while len(b.assignment()) < 2:
                        await a.getmany(timeout_ms=20)
                        await b.getmany(timeout_ms=20)
                revoked = seen_in_callback[0][0]
                assert seen_in_callback[0][1] == 1  # the auto-commit came before the callback
                commit_index = fake.seen.index(fake.requests("OffsetCommit")[0])
                release = next(
                    i
                    for i, r in enumerate(fake.seen)
                    if r.api == "ConsumerGroupHeartbeat"
                    and r.member_id == "m1"
                    and r.owned is not None
                    and len(r.owned[0].partitions) == 2
                )
                assert commit_index < release
                committed = {tp: fake.offsets[tp][0] for tp in revoked}
                assert committed == dict.fromkeys(revoked, 3)


async def test_records_of_revoked_partitions_are_never_returned_after_the_callback() -> None:
    fake = FakeGroupBroker({"t": 2})
    fake.append("t", 0, [b"a"] * 1000)
    fake.append("t", 1, [b"b"] * 1000)
    async with running(fake) as bootstrap:
        revoked_at: dict[TopicPartition, int] = {}
        returned_after: list[Any] = []
        polls = 0

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
                for tp in revoked:
                    revoked_at[tp] = polls

        config = {**FAST, "group_id": "g", "enable_auto_commit": False}
        async with AsyncConsumer(
            "t", bootstrap_servers=bootstrap, listener=Listener(), **config
        ) as a:
            await poll_until(a, lambda got: len(got) >= 1)  # prefetched buffers are full
            async with AsyncConsumer("t", bootstrap_servers=bootstrap, **config) as b:
                with anyio.fail_after(10):
                    while not revoked_at:
                        polls += 1
                        for tp, records in (await a.getmany(timeout_ms=20, max_records=1)).items():
                            if tp in revoked_at:
                                returned_after.append(records)
                        await b.getmany(timeout_ms=0)
                for _ in range(5):
                    for tp, records in (await a.getmany(timeout_ms=20)).items():
                        assert tp not in revoked_at, records
    assert returned_after == []


async def test_fencing_loses_the_partitions_without_a_commit_and_rejoins() -> None:
    fake = FakeGroupBroker({"t": 2})
    async with running(fake) as bootstrap:
        calls: list[Any] = []

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
                calls.append(("revoked", revoked))  # a plain function works on the async face

            async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
                calls.append(("assigned", assigned))

        config = {**FAST, "group_id": "g"}
        async with AsyncConsumer(
            "t", bootstrap_servers=bootstrap, listener=Listener(), **config
        ) as a:
            with anyio.fail_after(10):
                while len(a.assignment()) < 2:
                    await a.getmany(timeout_ms=20)
            commits_before = len(fake.requests("OffsetCommit"))
            fake.expire("m1")  # the broker forgot the member: its next heartbeat is refused
            with anyio.fail_after(10):
                while a.group_metadata().member_id in ("", "m1"):
                    await a.getmany(timeout_ms=20)
            assert a.group_metadata() == ConsumerGroupMetadata("g", "m2", 1)
            with anyio.fail_after(10):
                while len(a.assignment()) < 2:
                    await a.getmany(timeout_ms=20)
            assert len(fake.requests("OffsetCommit")) == commits_before  # lost: no commit
    all_t = {TopicPartition("t", 0), TopicPartition("t", 1)}
    assert calls[:3] == [("assigned", all_t), ("revoked", all_t), ("assigned", all_t)]
    joins = [r for r in fake.requests("ConsumerGroupHeartbeat") if r.member_epoch == 0]
    assert [r.member_id for r in joins] == ["", ""]


async def test_positions_start_at_committed_offsets_else_auto_offset_reset() -> None:
    fake = FakeGroupBroker({"t": 2})
    fake.append("t", 0, [b"a", b"b", b"c"])
    fake.append("t", 1, [b"d", b"e", b"f"])
    fake.offsets[TopicPartition("t", 0)] = (2, None)
    async with running(fake) as bootstrap:
        config = {**FAST, "group_id": "g", "auto_offset_reset": "latest"}
        async with AsyncConsumer("t", bootstrap_servers=bootstrap, **config) as c:
            got = await poll_until(c, lambda got: len(got) >= 1)
            assert [(r.partition, r.offset) for r in got] == [(0, 2)]  # committed
            assert await c.position(TopicPartition("t", 1)) == 3  # none committed: latest
        config["auto_offset_reset"] = "none"
        fake.offsets.clear()
        async with AsyncConsumer(
            TopicPartition("t", 0), bootstrap_servers=bootstrap, **config
        ) as c:
            with pytest.raises(NoOffsetForPartitionError, match="no committed offset"):
                await c.position(TopicPartition("t", 0))


async def test_manual_assignment_commits_from_outside_the_group() -> None:
    fake = FakeGroupBroker({"t": 1})
    fake.append("t", 0, [b"a", b"b", b"c"])
    fake.offsets[TopicPartition("t", 0)] = (1, "m")
    async with running(fake) as bootstrap:
        config = {**FAST, "group_id": "g"}
        async with AsyncConsumer(
            TopicPartition("t", 0), bootstrap_servers=bootstrap, **config
        ) as c:
            got = await poll_until(c, lambda got: len(got) >= 2)
            assert [r.value for r in got] == [b"b", b"c"]
            assert c.group_metadata() == ConsumerGroupMetadata("g", "", -1)
            with pytest.raises(IllegalStateError, match="assign"):
                c.subscribe(["t"])
        # closing with enable_auto_commit committed the position, as member "" epoch -1
        last = fake.requests("OffsetCommit")[-1]
        assert (last.member_id, last.member_epoch) == ("", -1)
        assert fake.offsets[TopicPartition("t", 0)] == (3, None)
        assert fake.requests("ConsumerGroupHeartbeat") == []


async def test_a_stale_epoch_commit_is_refused_unless_the_member_moved_on_meanwhile() -> None:
    fake = FakeGroupBroker({"t": 1})
    tp = TopicPartition("t", 0)
    async with running(fake) as bootstrap:
        config = {**FAST, "group_id": "g", "enable_auto_commit": False}
        async with AsyncConsumer("t", bootstrap_servers=bootstrap, **config) as c:
            with anyio.fail_after(10):
                while not c.assignment():
                    await c.getmany(timeout_ms=20)
            fake.errors["OffsetCommit"] = [E.STALE_MEMBER_EPOCH]
            heartbeats = len(fake.requests("ConsumerGroupHeartbeat"))
            with pytest.raises(StaleMemberEpochError, match="STALE_MEMBER_EPOCH"):
                await c.commit({tp: 1})
            assert tp not in fake.offsets
            # The refusal made it heartbeat at once. Let that end, and let the member adopt
            # a long interval: a heartbeat answer it read after the hook below set its epoch
            # would set the older one back.
            fake.heartbeat_interval_ms = 60_000
            membership = c._coordinator.membership  # type: ignore[union-attr]
            with anyio.fail_after(10):
                while (
                    len(fake.requests("ConsumerGroupHeartbeat")) <= heartbeats
                    or membership.heartbeat_interval_ms != 60_000
                    or membership._in_flight
                ):
                    await anyio.sleep(0.01)

            def epoch_moves(request: Any) -> None:
                # A heartbeat answer with a newer epoch reached the member while its commit,
                # sent with the older one, was on its way.
                fake.members["m1"].epoch += 1
                membership.member_epoch = fake.members["m1"].epoch
                del fake.hooks["OffsetCommit"]

            fake.hooks["OffsetCommit"] = epoch_moves
            await c.commit({tp: 2})
            epochs = [r.member_epoch for r in fake.requests("OffsetCommit")]
            assert epochs[-2:] == [1, 2]
            assert fake.offsets[tp] == (2, None)


async def test_an_unstable_committed_offset_is_waited_for() -> None:
    fake = FakeGroupBroker({"t": 1})
    fake.offsets[TopicPartition("t", 0)] = (7, None)
    fake.unstable[TopicPartition("t", 0)] = 3
    async with (
        running(fake) as bootstrap,
        AsyncConsumer(bootstrap_servers=bootstrap, group_id="g", **FAST) as c,
    ):
        assert await c.committed(("t", 0)) == 7
    assert fake.unstable[TopicPartition("t", 0)] == 0


async def test_a_broker_without_groups_makes_poll_raise() -> None:
    fake = FakeGroupBroker({"t": 1})
    fake.errors["ConsumerGroupHeartbeat"] = [E.UNSUPPORTED_VERSION]
    async with (
        running(fake) as bootstrap,
        AsyncConsumer("t", bootstrap_servers=bootstrap, group_id="g", **FAST) as c,
    ):
        with anyio.fail_after(10), pytest.raises(MinibrokerError, match="consumer groups"):
            while True:
                await c.getmany(timeout_ms=20)


async def test_a_member_that_stops_polling_leaves_and_rejoins_when_it_polls_again() -> None:
    fake = FakeGroupBroker({"t": 1})
    async with running(fake) as bootstrap:
        calls = Recorder()
        config = {**FAST, "group_id": "g", "max_poll_interval_ms": 300}
        async with AsyncConsumer("t", bootstrap_servers=bootstrap, listener=calls, **config) as c:
            with anyio.fail_after(10):
                while not c.assignment():
                    await c.getmany(timeout_ms=20)
            with anyio.fail_after(10):
                while fake.members:  # the heartbeat task left on its own
                    await anyio.sleep(0.02)
            await c.getmany(timeout_ms=0)
            assert calls.calls[-1] == ("revoked", {TopicPartition("t", 0)})  # lost
            with anyio.fail_after(10):
                while not c.assignment():
                    await c.getmany(timeout_ms=20)
            assert [m for m, _ in calls.calls] == ["assigned", "revoked", "assigned"]


async def test_unsubscribe_revokes_then_leaves() -> None:
    fake = FakeGroupBroker({"t": 1})
    async with running(fake) as bootstrap:
        calls = Recorder()
        async with AsyncConsumer(
            "t", bootstrap_servers=bootstrap, group_id="g", listener=calls, **FAST
        ) as c:
            with anyio.fail_after(10):
                while not c.assignment():
                    await c.getmany(timeout_ms=20)
            await c.unsubscribe()
            assert c.assignment() == set() and c.subscription() == set()
            assert fake.members == {}
            leave = fake.requests("ConsumerGroupHeartbeat")[-1]
            assert (leave.member_id, leave.member_epoch) == ("m1", -1)
    assert [m for m, _ in calls.calls] == ["assigned", "revoked"]


async def test_a_static_consumer_names_its_instance_and_leaves_keeping_its_partitions() -> None:
    fake = FakeGroupBroker({"t": 1})
    async with running(fake) as bootstrap:
        config = {**FAST, "group_id": "g", "group_instance_id": "i-1"}
        async with AsyncConsumer("t", bootstrap_servers=bootstrap, **config) as c:
            with anyio.fail_after(10):
                while not c.assignment():
                    await c.getmany(timeout_ms=20)
    beats = fake.requests("ConsumerGroupHeartbeat")
    assert len(beats) >= 2 and {r.instance_id for r in beats} == {"i-1"}
    assert (beats[-1].member_id, beats[-1].member_epoch) == ("m1", -2)


@pytest.mark.parametrize("learnt_by", ["OffsetCommit", "ConsumerGroupHeartbeat"])
async def test_fenced_instance_id_is_fatal_for_the_consumer(learnt_by: str) -> None:
    fake = FakeGroupBroker({"t": 1})
    fake.append("t", 0, [b"a", b"b"])
    async with running(fake) as bootstrap:
        config = {
            **FAST,
            "group_id": "g",
            "group_instance_id": "i-1",
            "enable_auto_commit": False,
        }
        async with AsyncConsumer("t", bootstrap_servers=bootstrap, **config) as c:
            with anyio.fail_after(10):
                while not c.assignment():
                    await c.getmany(timeout_ms=20)
            # Another consumer joined with "i-1": the broker fences this one.
            fake.errors[learnt_by] = [E.FENCED_INSTANCE_ID]
            if learnt_by == "OffsetCommit":
                with pytest.raises(FencedInstanceIdError):
                    await c.commit({TopicPartition("t", 0): 1})
            with anyio.fail_after(10), pytest.raises(FencedInstanceIdError):
                while True:
                    await c.getmany(timeout_ms=20)
            with pytest.raises(FencedInstanceIdError):  # every later poll, too
                await c.getmany(timeout_ms=0)
        assert fake.offsets == {}
    # No rejoin (it would fence the other consumer in turn), and no leave on close.
    assert all(r.member_epoch >= 0 for r in fake.requests("ConsumerGroupHeartbeat"))
    assert fake.joins == 1


async def test_group_calls_need_a_group_id_and_broker_side_settings_are_refused() -> None:
    c = AsyncConsumer(bootstrap_servers="127.0.0.1:1")
    with pytest.raises(IllegalStateError, match="group_id"):
        c.subscribe(["t"])
    with pytest.raises(ValueError, match="group_session_timeout_ms"):
        AsyncConsumer(group_id="g", session_timeout_ms=10_000)
    with pytest.raises(ValueError, match="not both"):
        AsyncConsumer("t", TopicPartition("t", 0), group_id="g")
    with pytest.raises(ValueError, match="group_instance_id needs a group_id"):
        AsyncConsumer(group_instance_id="i-1")
    for bad in ("", "x" * 256):
        with pytest.raises(ValueError, match="1 to 255 characters"):
            AsyncConsumer(group_id="g", group_instance_id=bad)


# --------------------------------------------------------------------------- the sync face


@pytest.fixture
def fake_in_thread() -> Iterator[tuple[FakeGroupBroker, str, Any]]:
    """The fake on its own event loop thread, for the sync Consumer's tests; its state is
    touched through the portal."""
    with start_blocking_portal() as portal:
        fake = portal.call(FakeGroupBroker, {"t": 2})
        with portal.wrap_async_context_manager(running(fake)) as bootstrap:
            yield fake, bootstrap, portal


def test_sync_face_callbacks_run_on_the_polling_thread_and_commits_count_returned_records(
    fake_in_thread: tuple[FakeGroupBroker, str, Any],
) -> None:
    fake, bootstrap, portal = fake_in_thread
    portal.call(fake.append, "t", 0, [b"a"] * 50)
    portal.call(fake.append, "t", 1, [b"b"] * 50)
    threads: set[int] = set()
    calls: list[Any] = []

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
            threads.add(threading.get_ident())
            calls.append(("revoked", revoked))

        def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
            threads.add(threading.get_ident())
            calls.append(("assigned", assigned))

    config = {**FAST, "group_id": "g", "enable_auto_commit": False}
    with Consumer("t", bootstrap_servers=bootstrap, listener=Listener(), **config) as a:
        deadline = time.monotonic() + 10
        got: list[Any] = []
        while len(got) < 10:
            assert time.monotonic() < deadline
            for records in a.poll(timeout_ms=50, max_records=5).values():
                got += records
        # Only 10 records were returned; the rest wait in the local buffer, not consumed.
        a.commit()
        committed = {
            tp.partition: o for tp, (o, _) in portal.call(lambda: dict(fake.offsets)).items()
        }
        assert sum(committed.values()) == 10
        with Consumer("t", bootstrap_servers=bootstrap, **config) as b:
            while not (a.assignment() and b.assignment() and len(a.assignment()) == 1):
                assert time.monotonic() < deadline
                a.poll(timeout_ms=20, max_records=1)
                b.poll(timeout_ms=20, max_records=1)
            revoked = calls[1][1]
            assert calls[1][0] == "revoked"
            for _ in range(3):
                assert not set(a.poll(timeout_ms=20)) & revoked
    assert threads == {threading.get_ident()}
    assert calls[0] == ("assigned", {TopicPartition("t", 0), TopicPartition("t", 1)})
