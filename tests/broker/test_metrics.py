"""broker.metrics and broker.network.http_endpoints, in process (no broker needed)."""

from __future__ import annotations

import socket
import threading
import timeit
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import (
    CONTENT_TYPE,
    PRODUCER_EVENT_KINDS,
    REQUEST_BUCKETS,
    TXN_STATES,
    BrokerMetrics,
    GroupSnapshot,
    GroupStats,
    OffsetStats,
    PartitionStats,
)
from broker.network.http_endpoints import MAX_REQUEST_BYTES, serve_http
from broker.transactions import TXN_ABORT_CAUSES, TxnStats

GROUP_FAMILIES = (
    "minibroker_group_members",
    "minibroker_group_state",
    "minibroker_group_rebalances",
    "minibroker_group_heartbeats",
)
NOW_S = 1_700_000_000.0
"""The wall clock of the metrics in these tests (`BrokerMetrics._clock`)."""


def samples(m: BrokerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, keyed by (name, sorted labels)."""
    body, content_type = m.render()
    assert content_type == CONTENT_TYPE
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def exercise(m: BrokerMetrics) -> None:
    """Call every method at least once, as a running broker would."""
    m.observe_request("Produce", 0, 0.0003)
    m.observe_request("Produce", 0, 0.002)
    m.observe_request("Produce", 45, 0.0001)
    m.observe_request("Fetch", 0, 0.5)
    m.record_produce("orders", 1000, 10)
    m.record_produce("orders", 500, 5)
    m.record_fetch("orders", 700, 7)
    for kind in PRODUCER_EVENT_KINDS:
        m.producer_event(kind)
    m.producer_event("duplicate", 2)
    m.set_producer_ids_max(1000)
    m.observe_fsync(0.004, 12)
    m.observe_fsync(0.0005, 1)
    m.connection_opened()
    m.connection_opened()
    m.connection_closed()
    m.authorization_denied("Produce", "topic")
    m.authorization_denied("Produce", "topic")
    m.authorization_denied("Produce", "transactional_id")
    m.authorization_denied("Hostile", "cluster")
    m.set_recovery_seconds(1.25)
    m.set_partition_source(
        lambda: [
            PartitionStats("orders", 0, 15, 0, 12, 4096, 3),
            PartitionStats("orders", 1, 0, 0, 0, 0, frozenset()),  # type: ignore[arg-type]
        ]
    )
    m._clock = lambda: NOW_S
    m.set_transaction_source(
        lambda: TxnStats(
            states=Counter({"ONGOING": 2, "PREPARED": 1, "COMPLETE_COMMIT": 4}),
            commits=7,
            aborts={"client": 2, "timeout": 1},
            oldest_open_ms={
                ("orders", 0): int(NOW_S * 1000) - 90_500,
                ("orders", 1): int(NOW_S * 1000) - 250,
            },
        )
    )
    m.set_group_source(
        lambda: GroupStats(
            {"billing": GroupSnapshot("STABLE", 3, 7), "audit": GroupSnapshot("RECONCILING", 1, 2)},
            heartbeats=41,
        )
    )
    m.set_offset_source(
        lambda: OffsetStats(
            groups=2,
            committed=3,
            pending=1,
            commits={"OffsetCommit": 5, "TxnOffsetCommit": 2},
            expired=4,
            lag=[("billing", "orders", 0, 6), ("billing", "orders", 1, 0)],
            lag_omitted=1,
        )
    )


def test_every_metric_has_the_expected_value(tmp_path) -> None:
    m = BrokerMetrics()
    exercise(m)
    m.set_data_dir(tmp_path)
    s = samples(m)

    assert s[("minibroker_requests_total", (("api", "Produce"),))] == 3
    assert s[("minibroker_requests_total", (("api", "Fetch"),))] == 1
    key = (
        "minibroker_request_errors_total",
        (("api", "Produce"), ("error", "OUT_OF_ORDER_SEQUENCE_NUMBER")),
    )
    assert s[key] == 1
    assert ("minibroker_request_errors_total", (("api", "Fetch"), ("error", "NONE"))) not in s
    lat = "minibroker_request_duration_seconds"
    assert s[(f"{lat}_count", (("api", "Produce"),))] == 3
    assert s[(f"{lat}_sum", (("api", "Produce"),))] == pytest.approx(0.0024)
    assert s[(f"{lat}_bucket", (("api", "Produce"), ("le", "0.0001")))] == 1
    assert s[(f"{lat}_bucket", (("api", "Produce"), ("le", "0.0005")))] == 2
    assert s[(f"{lat}_bucket", (("api", "Produce"), ("le", "0.0025")))] == 3
    assert s[(f"{lat}_bucket", (("api", "Produce"), ("le", "+Inf")))] == 3
    assert s[(f"{lat}_bucket", (("api", "Fetch"), ("le", "0.25")))] == 0
    assert s[(f"{lat}_bucket", (("api", "Fetch"), ("le", "0.5")))] == 1

    topic = (("topic", "orders"),)
    assert s[("minibroker_bytes_in_total", topic)] == 1500
    assert s[("minibroker_records_in_total", topic)] == 15
    assert s[("minibroker_bytes_out_total", topic)] == 700
    assert s[("minibroker_records_out_total", topic)] == 7

    assert s[("minibroker_producer_events_total", (("kind", "duplicate"),))] == 3
    for kind in PRODUCER_EVENT_KINDS[1:]:
        assert s[("minibroker_producer_events_total", (("kind", kind),))] == 1
    assert s[("minibroker_producer_ids_max", ())] == 1000

    assert s[("minibroker_fsyncs_total", ())] == 2
    assert s[("minibroker_fsync_duration_seconds_count", ())] == 2
    assert s[("minibroker_fsync_duration_seconds_bucket", (("le", "0.0005"),))] == 1
    assert s[("minibroker_group_commit_batches_sum", ())] == 13
    assert s[("minibroker_group_commit_batches_bucket", (("le", "1.0"),))] == 1
    assert s[("minibroker_group_commit_batches_bucket", (("le", "16.0"),))] == 2

    assert s[("minibroker_connections_open", ())] == 1
    assert s[("minibroker_connections_accepted_total", ())] == 2
    assert s[("minibroker_recovery_duration_seconds", ())] == 1.25
    denials = "minibroker_authorization_denials_total"
    assert {labels: v for (name, labels), v in s.items() if name == denials} == {
        (("api", "Produce"), ("resource_type", "topic")): 2,
        (("api", "Produce"), ("resource_type", "transactional_id")): 1,
        (("api", "unknown"), ("resource_type", "cluster")): 1,
    }

    # Transactions: every state and cause has a series, 0 when nothing is in it.
    assert {
        labels[0][1]: v for (name, labels), v in s.items() if name == "minibroker_transactions"
    } == {
        "EMPTY": 0,
        "ONGOING": 2,
        "PREPARED": 1,
        "PREPARE_COMMIT": 0,
        "PREPARE_ABORT": 0,
        "COMPLETE_COMMIT": 4,
        "COMPLETE_ABORT": 0,
    }
    assert s[("minibroker_transactions_committed_total", ())] == 7
    assert {
        labels[0][1]: v
        for (name, labels), v in s.items()
        if name == "minibroker_transactions_aborted_total"
    } == {"client": 2, "timeout": 1, "fenced": 0, "recovery": 0}
    age = "minibroker_oldest_open_transaction_age_seconds"
    assert s[(age, (("partition", "0"), ("topic", "orders")))] == 90.5
    assert s[(age, (("partition", "1"), ("topic", "orders")))] == 0.25
    assert len([name for name, _ in s if name == age]) == 2

    # Groups: members, the state (one series per group), rebalances, heartbeats.
    assert s[("minibroker_group_members", (("group", "billing"),))] == 3
    assert s[("minibroker_group_members", (("group", "audit"),))] == 1
    assert {labels: v for (name, labels), v in s.items() if name == "minibroker_group_state"} == {
        (("group", "audit"), ("state", "RECONCILING")): 1,
        (("group", "billing"), ("state", "STABLE")): 1,
    }
    assert s[("minibroker_group_rebalances_total", (("group", "billing"),))] == 7
    assert s[("minibroker_group_heartbeats_total", ())] == 41
    # Committed offsets: counts, commits by API, and the lag of each (group, partition).
    assert s[("minibroker_consumer_groups_with_offsets", ())] == 2
    assert s[("minibroker_consumer_group_committed_offsets", ())] == 3
    assert s[("minibroker_consumer_group_pending_offsets", ())] == 1
    assert s[("minibroker_offset_commits_total", (("api", "OffsetCommit"),))] == 5
    assert s[("minibroker_offset_commits_total", (("api", "TxnOffsetCommit"),))] == 2
    assert s[("minibroker_offsets_expired_total", ())] == 4
    lag = "minibroker_consumer_group_lag"
    billing = (("group", "billing"),)
    assert s[(lag, (*billing, ("partition", "0"), ("topic", "orders")))] == 6
    assert s[(lag, (*billing, ("partition", "1"), ("topic", "orders")))] == 0
    assert s[("minibroker_consumer_group_lag_series_omitted", ())] == 1

    p0 = (("partition", "0"), ("topic", "orders"))
    p1 = (("partition", "1"), ("topic", "orders"))
    assert s[("minibroker_log_end_offset", p0)] == 15
    assert s[("minibroker_log_start_offset", p0)] == 0
    assert s[("minibroker_last_stable_offset", p0)] == 12
    assert s[("minibroker_log_size_bytes", p0)] == 4096
    assert s[("minibroker_active_producer_ids", p0)] == 3
    assert s[("minibroker_active_producer_ids", p1)] == 0

    assert s[("minibroker_data_dir_capacity_bytes", ())] > 0
    assert (
        0
        <= s[("minibroker_data_dir_free_bytes", ())]
        <= s[("minibroker_data_dir_capacity_bytes", ())]
    )
    assert [v for (name, _), v in s.items() if name == "minibroker_build_info"] == [1]

    # The standard collectors are there too.
    names = {name for name, _ in s}
    assert "process_cpu_seconds_total" in names
    assert "python_info" in names
    assert "python_gc_collections_total" in names


def test_names_follow_prometheus_conventions() -> None:
    m = BrokerMetrics()
    exercise(m)
    body, _ = m.render()
    for family in text_string_to_metric_families(body.decode()):
        if family.name.startswith(("process_", "python_")):
            continue
        assert family.name.startswith("minibroker_"), family.name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), family.name
        for s in family.samples:
            assert set(s.labels) <= {
                *("api", "error", "topic", "partition", "kind", "version", "le"),
                *("state", "cause", "group", "resource_type"),
                *("listener", "mechanism", "result"),
            }


def test_unknown_api_names_do_not_grow_the_series_set() -> None:
    m = BrokerMetrics()
    for i in range(1000):
        m.observe_request(f"Hostile{i}", 35, 0.0001)
    s = samples(m)
    apis = {dict(labels).get("api") for name, labels in s if name == "minibroker_requests_total"}
    assert apis == {"unknown"}
    assert s[("minibroker_requests_total", (("api", "unknown"),))] == 1000
    key = (
        "minibroker_request_errors_total",
        (("api", "unknown"), ("error", "UNSUPPORTED_VERSION")),
    )
    assert s[key] == 1000
    assert len(m._requests) == 1


def test_series_read_zero_before_anything_happens() -> None:
    s = samples(BrokerMetrics())
    assert s[("minibroker_producer_events_total", (("kind", "fenced"),))] == 0
    assert s[("minibroker_fsyncs_total", ())] == 0
    assert s[("minibroker_connections_open", ())] == 0
    # Not exported until the broker says what they are.
    assert ("minibroker_producer_ids_max", ()) not in s
    assert not any(name == "minibroker_log_end_offset" for name, _ in s)
    # No transaction or group family before the broker registers its coordinators.
    assert not any("transaction" in name or name.startswith(GROUP_FAMILIES) for name, _ in s)


def test_group_series_for_a_coordinator_without_groups() -> None:
    m = BrokerMetrics()
    m.set_group_source(lambda: GroupStats({}, 0))
    s = samples(m)
    assert s[("minibroker_group_heartbeats_total", ())] == 0
    assert not any(name.startswith("minibroker_group_members") for name, _ in s)


def test_a_failing_group_source_does_not_break_the_scrape(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = BrokerMetrics()
    m.set_group_source(lambda: GroupStats({"g": None}, 1))  # type: ignore[dict-item]
    s = samples(m)
    assert s[("minibroker_metrics_collect_errors_total", ())] == 1
    assert not any(name.startswith(GROUP_FAMILIES) for name, _ in s)
    assert ("minibroker_requests_total", (("api", "unknown"),)) in s
    assert "event=metrics_group_source_failed" in caplog.text


def test_transaction_series_read_zero_for_a_coordinator_with_nothing_yet() -> None:
    m = BrokerMetrics()
    m.set_transaction_source(lambda: TxnStats(Counter(), 0, {}, {}))
    s = samples(m)
    for state in TXN_STATES:
        assert s[("minibroker_transactions", (("state", state),))] == 0
    assert s[("minibroker_transactions_committed_total", ())] == 0
    for cause in TXN_ABORT_CAUSES:
        assert s[("minibroker_transactions_aborted_total", (("cause", cause),))] == 0
    assert not any(name == "minibroker_oldest_open_transaction_age_seconds" for name, _ in s)


def test_open_transaction_age_follows_the_clock_and_never_goes_negative() -> None:
    m = BrokerMetrics()
    clock = [NOW_S]
    m._clock = lambda: clock[0]
    started = int(NOW_S * 1000) - 1_000
    m.set_transaction_source(lambda: TxnStats({}, 0, {}, {("t", 3): started}))
    key = ("minibroker_oldest_open_transaction_age_seconds", (("partition", "3"), ("topic", "t")))
    assert samples(m)[key] == 1.0
    clock[0] += 299
    assert samples(m)[key] == 300.0
    clock[0] = NOW_S - 60  # the wall clock was stepped back
    assert samples(m)[key] == 0.0


def test_a_state_or_cause_the_list_lacks_is_still_shown() -> None:
    m = BrokerMetrics()
    m.set_transaction_source(lambda: TxnStats({"NEW_STATE": 1}, 0, {"new_cause": 2}, {}))
    s = samples(m)
    assert s[("minibroker_transactions", (("state", "NEW_STATE"),))] == 1
    assert s[("minibroker_transactions_aborted_total", (("cause", "new_cause"),))] == 2
    assert s[("minibroker_transactions", (("state", "EMPTY"),))] == 0


def test_unknown_event_kinds_are_refused() -> None:
    m = BrokerMetrics()
    with pytest.raises(ValueError):
        m.producer_event("producer_42")


def test_a_failing_partition_source_does_not_break_the_scrape() -> None:
    m = BrokerMetrics()

    def broken() -> list[PartitionStats]:
        raise RuntimeError("boom")

    m.set_partition_source(broken)
    s = samples(m)
    assert s[("minibroker_metrics_collect_errors_total", ())] == 1
    assert ("minibroker_requests_total", (("api", "unknown"),)) in s


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(lambda: 1 / 0, id="raises"),
        pytest.param(lambda: TxnStats({"ONGOING": 1}, 0, {}, None), id="bad-snapshot"),
        pytest.param(lambda: TxnStats({}, 0, {}, {("t", 0): "soon"}), id="bad-age"),
    ],
)
def test_a_failing_transaction_source_does_not_break_the_scrape(
    source: Callable[[], TxnStats], caplog: pytest.LogCaptureFixture
) -> None:
    m = BrokerMetrics()
    m.set_partition_source(lambda: [PartitionStats("orders", 0, 5, 0, 5, 100, 1)])
    m.set_transaction_source(source)
    s = samples(m)
    assert s[("minibroker_metrics_collect_errors_total", ())] == 1
    # None of the transaction families, not even the part built before the failure ...
    assert not any("transaction" in name for name, _ in s)
    # ... and everything else as usual.
    assert s[("minibroker_log_end_offset", (("partition", "0"), ("topic", "orders")))] == 5
    assert ("minibroker_requests_total", (("api", "unknown"),)) in s
    assert "event=metrics_transaction_source_failed" in caplog.text
    # Each scrape tries again, and counts again.
    assert samples(m)[("minibroker_metrics_collect_errors_total", ())] == 2


def test_a_failing_offset_source_does_not_break_the_scrape(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = BrokerMetrics()
    m.set_offset_source(lambda: OffsetStats(1, 1, 0, {}, 0, None, 0))  # type: ignore[arg-type]
    s = samples(m)
    assert s[("minibroker_metrics_collect_errors_total", ())] == 1
    assert not any("offset" in name or "consumer" in name for name, _ in s)
    assert "event=metrics_offset_source_failed" in caplog.text


def test_registries_are_private() -> None:
    a, b = BrokerMetrics(), BrokerMetrics()
    a.record_produce("t", 1, 1)
    assert ("minibroker_bytes_in_total", (("topic", "t"),)) not in samples(b)
    from prometheus_client import REGISTRY

    assert REGISTRY.get_sample_value("minibroker_bytes_in_total", {"topic": "t"}) is None


def test_disabled_metrics_are_no_ops() -> None:
    m = BrokerMetrics(enabled=False)
    assert isinstance(m, BrokerMetrics)
    assert m.enabled is False
    exercise(m)
    m.set_data_dir("/")
    assert m.render() == (b"", CONTENT_TYPE)


def test_hot_path_is_cheap() -> None:
    """Loose bounds (a busy CI machine is slow); the measured numbers are printed with -s."""
    number = 50_000
    results = {}
    for enabled in (True, False):
        m = BrokerMetrics(enabled=enabled)

        def produce(m: BrokerMetrics = m) -> None:
            m.observe_request("Produce", 0, 0.0002)
            m.record_produce("bench", 1000, 10)

        produce()
        best = min(timeit.repeat(produce, number=number, repeat=5)) / number
        results[enabled] = best * 1e9
    print(
        f"\nobserve_request+record_produce: enabled {results[True]:.0f} ns, "
        f"disabled {results[False]:.0f} ns"
    )
    # ~0.3 µs here; a Produce request costs tens of µs, so 5 µs would already be ~10%.
    assert results[True] < 5_000


def test_request_buckets_are_sorted() -> None:
    assert list(REQUEST_BUCKETS) == sorted(REQUEST_BUCKETS)


# --------------------------------------------------------------------------- HTTP


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


def raw_request(port: int, data: bytes, *, shutdown: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        if shutdown:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


async def in_thread(fn: Callable[[], object]) -> object:
    return await anyio.to_thread.run_sync(fn)


@pytest.mark.anyio
async def test_http_endpoints(anyio_backend: str) -> None:
    m = BrokerMetrics()
    m.record_produce("orders", 10, 2)
    ready = threading.Event()
    async with anyio.create_task_group() as tg:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = await tg.start(serve_http, listener, m, ready.is_set)
        assert port > 0

        status, headers, body = await in_thread(lambda: get(port, "/metrics"))
        assert status == 200
        assert headers["Content-Type"] == CONTENT_TYPE
        assert b'minibroker_records_in_total{topic="orders"} 2.0' in body
        assert b"process_cpu_seconds_total" in body

        status, _, body = await in_thread(lambda: get(port, "/healthz"))
        assert (status, body) == (200, b"ok\n")

        status, _, body = await in_thread(lambda: get(port, "/readyz"))
        assert status == 503
        ready.set()
        status, _, body = await in_thread(lambda: get(port, "/readyz"))
        assert (status, body) == (200, b"ready\n")

        status, _, _ = await in_thread(lambda: get(port, "/nope"))
        assert status == 404
        status, _, _ = await in_thread(lambda: get(port, "/metrics?name[]=x"))
        assert status == 200

        reply = await in_thread(
            lambda: raw_request(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        )
        assert reply.startswith(b"HTTP/1.1 405 ")
        assert b"\r\nAllow: GET, HEAD\r\n" in reply

        reply = await in_thread(
            lambda: raw_request(port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        )
        assert reply.startswith(b"HTTP/1.1 200 ")
        assert b"\r\nContent-Length: 3\r\n" in reply
        assert reply.endswith(b"\r\n\r\n")  # no body

        # HTTP/1.0 with bare LF line ends is accepted; HTTP/1.1 must name its Host.
        reply = await in_thread(lambda: raw_request(port, b"GET /healthz HTTP/1.0\n\n"))
        assert reply.startswith(b"HTTP/1.1 200 ")
        assert reply.endswith(b"\r\n\r\nok\n")
        reply = await in_thread(lambda: raw_request(port, b"GET /healthz HTTP/1.1\r\n\r\n"))
        assert reply.startswith(b"HTTP/1.1 400 ")

        reply = await in_thread(
            lambda: raw_request(port, b"GET http://x:1/readyz?a=b HTTP/1.1\r\nHost: x\r\n\r\n")
        )
        assert reply.startswith(b"HTTP/1.1 200 ")

        reply = await in_thread(lambda: raw_request(port, b"garbage\r\n\r\n"))
        assert reply.startswith(b"HTTP/1.1 400 ")

        huge = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (2 * MAX_REQUEST_BYTES) + b"\r\n\r\n"
        reply = await in_thread(lambda: raw_request(port, huge, shutdown=False))
        assert reply.startswith(b"HTTP/1.1 431 ")

        # A peer that connects and goes away must not disturb the server.
        await in_thread(lambda: raw_request(port, b""))
        status, _, _ = await in_thread(lambda: get(port, "/healthz"))
        assert status == 200
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_http_read_timeout(anyio_backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import broker.network.http_endpoints as http

    monkeypatch.setattr(http, "READ_TIMEOUT_S", 0.3)
    async with anyio.create_task_group() as tg:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = await tg.start(serve_http, listener, BrokerMetrics(), lambda: True)

        def slow_client() -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"GET /metr")  # and never finishes
                return sock.recv(100)

        with anyio.fail_after(5):
            assert await in_thread(slow_client) == b""  # closed without an answer
        status, _, _ = await in_thread(lambda: get(port, "/healthz"))
        assert status == 200
        tg.cancel_scope.cancel()
