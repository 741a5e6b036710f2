"""The group coordinator's classic groups (broker/groups/coordinator.py), in process: a
JoinGroup waits outside the lock for the barrier another member's join completes, a
follower's SyncGroup for the leader's plan; a group id serves one protocol while it
has members; commits are checked against the generation; the timers end a barrier."""

from __future__ import annotations

import anyio
import pytest

from broker.config import BrokerConfig
from broker.groups import GroupCoordinator, Join, JoinAnswer, Sync
from protocol import messages as m
from protocol.errors import ErrorCode

CONFIG = BrokerConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100)


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


def join(member_id: str = "", rebalance_ms: int = 10_000) -> Join:
    return Join(
        member_id=member_id,
        instance_id=None,
        protocol_type="consumer",
        protocols=(("range", b"meta"),),
        session_timeout_ms=10_000,
        rebalance_timeout_ms=rebalance_ms,
        client_id="c",
        client_host="h",
        require_known_member_id=False,
    )


def native_join(group_id: str) -> m.ConsumerGroupHeartbeatRequest:
    return m.ConsumerGroupHeartbeatRequest(
        group_id=group_id,
        member_id="",
        member_epoch=0,
        rebalance_timeout_ms=1_000,
        subscribed_topics=["t"],
    )


@pytest.mark.anyio
async def test_joins_wait_for_each_other_and_followers_for_the_plan(anyio_backend: str) -> None:
    groups = GroupCoordinator(CONFIG, {"t": 2})
    first = await groups.join_group("g", join())
    assert first.generation == 1 and first.leader == first.member_id
    a = first.member_id
    await groups.sync_group("g", Sync(a, 1, None, None, None, {a: b"A"}))
    answers: dict[str, JoinAnswer] = {}

    async def second() -> None:
        answers["b"] = await groups.join_group("g", join())

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        with anyio.fail_after(5):
            while (
                await groups.classic_heartbeat("g", a, None, 1) != ErrorCode.REBALANCE_IN_PROGRESS
            ):
                await anyio.sleep(0)
        answers["a"] = await groups.join_group("g", join(a))
    b = answers["b"].member_id
    assert answers["a"].generation == answers["b"].generation == 2
    assert [member[0] for member in answers["a"].members] == [a, b]
    assert groups.check_member("g", b, 2) == ErrorCode.REBALANCE_IN_PROGRESS
    synced: dict[str, bytes] = {}

    async def follower() -> None:
        synced["b"] = (await groups.sync_group("g", Sync(b, 2, None, None, None, {}))).assignment

    async with anyio.create_task_group() as tg:
        tg.start_soon(follower)
        await anyio.wait_all_tasks_blocked()  # the follower waits: nothing answers it
        assert "b" not in synced
        leader = await groups.sync_group("g", Sync(a, 2, None, None, None, {a: b"A2", b: b"B2"}))
    assert (leader.assignment, synced["b"]) == (b"A2", b"B2")
    assert groups.check_member("g", b, 2) == ErrorCode.NONE
    assert groups.check_member("g", b, 1) == ErrorCode.ILLEGAL_GENERATION
    assert groups.check_member("g", "", -1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert [(x.group_id, x.protocol_type, x.state) for x in groups.kafka_listings()] == [
        ("g", "consumer", "Stable")
    ]
    assert await groups.leave_group("g", [(a, None), (b, None)]) == [ErrorCode.NONE] * 2
    assert not groups.has_members("g") and groups.check_member("g", "", -1) == ErrorCode.NONE


@pytest.mark.anyio
async def test_a_group_serves_one_protocol_while_it_has_members(anyio_backend: str) -> None:
    groups = GroupCoordinator(CONFIG, {"t": 2})
    assert (await groups.join_group("classic", join())).error == ErrorCode.NONE
    refused = await groups.heartbeat(native_join("classic"))
    assert refused.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert (await groups.heartbeat(native_join("native"))).error == ErrorCode.NONE
    other = await groups.join_group("native", join())
    assert other.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert [(x.group_id, x.protocol_type) for x in groups.kafka_listings()] == [
        ("classic", "consumer"),
        ("native", "consumer"),
    ]


@pytest.mark.anyio
async def test_the_timer_ends_a_barrier_without_the_silent_member(anyio_backend: str) -> None:
    groups = GroupCoordinator(CONFIG, {"t": 2})
    async with anyio.create_task_group() as tg:
        tg.start_soon(groups.run)
        a = (await groups.join_group("g", join(rebalance_ms=200))).member_id
        await groups.sync_group("g", Sync(a, 1, None, None, None, {}))
        with anyio.fail_after(5):
            late = await groups.join_group("g", join(rebalance_ms=200))
        assert late.generation == 2 and late.leader == late.member_id
        assert [member[0] for member in late.members] == [late.member_id]
        assert groups.check_member("g", a, 1) == ErrorCode.UNKNOWN_MEMBER_ID
        tg.cancel_scope.cancel()
