"""Small admin helpers (create, list, describe topics) for the CLI, tests and scripts.

Each helper opens one connection, does its requests and closes it. The async
versions run in the caller's event loop; the sync ones run the async version on
a short-lived portal thread, so they also work when called from inside a loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio
from anyio.from_thread import start_blocking_portal

from client.config import DEFAULT_BOOTSTRAP, parse_bootstrap
from client.connection import Connection, open_connection
from client.errors import TopicAlreadyExistsError, UnknownTopicError, error_for
from client.replies import check, list_offsets_request, metadata_request, offsets, partition_count
from protocol.errors import ErrorCode
from protocol.framing import DEFAULT_FRAME_BYTES_MAX
from protocol.messages import (
    ISOLATION_READ_UNCOMMITTED,
    TIMESTAMP_EARLIEST,
    TIMESTAMP_LATEST,
    CreatableTopic,
    CreateTopicsRequest,
    MetadataRequest,
    Request,
)

T = TypeVar("T")
TIMEOUT_S = 30.0


async def _with_connection(
    bootstrap: str | Sequence[str], work: Callable[[Connection], Awaitable[T]]
) -> T:
    host, port = parse_bootstrap(bootstrap)[0]
    outcome: list[Any] = []
    with anyio.fail_after(TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            # Failures, connecting included, are re-raised below, outside the task
            # group, so callers get the error itself and not an ExceptionGroup.
            try:
                conn = await open_connection(
                    tg,
                    host,
                    port,
                    client_id="minibroker-admin",
                    timeout_s=TIMEOUT_S,
                    max_response_bytes=DEFAULT_FRAME_BYTES_MAX,
                )
            except Exception as exc:
                outcome.append(exc)
            else:
                try:
                    outcome.append(await work(conn))
                except Exception as exc:
                    outcome.append(exc)
                finally:
                    await conn.aclose()
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


async def _request(conn: Connection, request: Request) -> Any:
    response = await conn.request(request, TIMEOUT_S)
    check(response, request.api)
    return response


async def create_topic_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    name: str = "",
    partitions: int = 1,
    config: dict[str, Any] | None = None,
    *,
    exist_ok: bool = False,
) -> None:
    """Create `name`; TopicAlreadyExistsError if it exists (unless exist_ok)."""

    async def work(conn: Connection) -> None:
        response = await _request(
            conn, CreateTopicsRequest(topics=[CreatableTopic(name, partitions, config)])
        )
        for result in response.topics:
            if result.error == ErrorCode.TOPIC_ALREADY_EXISTS:
                if not exist_ok:
                    raise TopicAlreadyExistsError(name, result.message)
            elif result.error:
                raise error_for(result.error, f"create topic {name!r}", result.message)

    await _with_connection(bootstrap, work)


async def list_topics_async(bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP) -> list[str]:
    """Names of every topic, sorted."""

    async def work(conn: Connection) -> list[str]:
        response = await _request(conn, MetadataRequest(topics=None))
        return sorted(t.name for t in response.topics if not t.error)

    return await _with_connection(bootstrap, work)


async def describe_topic_async(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, name: str = ""
) -> dict[str, Any]:
    """{"topic", "partitions": [{"partition", "leader", "beginning_offset", "end_offset"}]}."""

    async def work(conn: Connection) -> dict[str, Any]:
        metadata = await _request(conn, metadata_request(name, allow_auto_create=False))
        count = partition_count(metadata, name)
        entry = metadata.topic(name)
        if count is None or entry is None:
            raise UnknownTopicError(name)
        partitions = list(range(count))
        leaders = {p.partition: p.leader for p in entry.partitions}
        found: dict[tuple[int, int], int] = {}
        for timestamp in (TIMESTAMP_EARLIEST, TIMESTAMP_LATEST):
            request = list_offsets_request(
                [(name, p) for p in partitions], timestamp, ISOLATION_READ_UNCOMMITTED
            )
            for tp, offset in offsets(await _request(conn, request)).items():
                found[(tp.partition, timestamp)] = offset
        return {
            "topic": name,
            "partitions": [
                {
                    "partition": p,
                    "leader": leaders[p],
                    "beginning_offset": found.get((p, TIMESTAMP_EARLIEST), -1),
                    "end_offset": found.get((p, TIMESTAMP_LATEST), -1),
                }
                for p in partitions
            ],
        }

    return await _with_connection(bootstrap, work)


def _run(func: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    with start_blocking_portal() as portal:
        return portal.call(lambda: func(*args, **kwargs))


def create_topic(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
    name: str = "",
    partitions: int = 1,
    config: dict[str, Any] | None = None,
    *,
    exist_ok: bool = False,
) -> None:
    _run(create_topic_async, bootstrap, name, partitions, config, exist_ok=exist_ok)


def list_topics(bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP) -> list[str]:
    return _run(list_topics_async, bootstrap)


def describe_topic(
    bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, name: str = ""
) -> dict[str, Any]:
    return _run(describe_topic_async, bootstrap, name)
