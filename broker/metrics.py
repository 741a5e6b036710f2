"""Prometheus metrics of the broker, through `prometheus-client`.

One `BrokerMetrics` per broker process. It owns its own `CollectorRegistry`
(never the library's global one, so tests can build many and nothing else in
the process leaks into `/metrics`), with the standard process, platform and GC
collectors registered beside the broker's own collector.

Naming follows the Prometheus conventions: every broker metric starts with
``minibroker_``, counters end in ``_total``, quantities are in base units
(``_seconds``, ``_bytes``), and labels are only ones of bounded cardinality:

=================  ===============================================================
label              values
=================  ===============================================================
``api``            the API names of the wire contract; anything else is ``unknown``
``error``          `ErrorCode` names (codes the broker itself answers with)
``topic``          topic names (created by operators or by auto-creation)
``partition``      partition numbers of those topics
``kind``           the fixed producer-state event kinds (`PRODUCER_EVENT_KINDS`)
``state``          the transaction states (`TXN_STATES`)
``cause``          the causes of an abort (`TXN_ABORT_CAUSES`)
``group``          consumer group ids: of groups with members (at most `max_groups`), and
                   on the lag family of groups with committed offsets (at most
                   `max_consumer_lag_series` series)
``resource_type``  what an ACL names: topic, group, transactional_id, cluster
``listener``       the names of the configured listeners (at most 16)
``mechanism``      `AUTHENTICATION_MECHANISMS`; a name a client made up is ``other``
``result``         `AUTHENTICATION_RESULTS`
=================  ===============================================================

Producer ids, transactional ids, member ids, client ids and connection addresses
are never labels: they are unbounded. Group ids are chosen by clients too, so the
lag series stop at their setting and the rest are only counted.

Hot path. The broker calls `observe_request` for every request and
`record_produce` / `record_fetch` for every partition of a Produce / Fetch. A
`prometheus_client` Counter takes a lock and validates its argument on every
``inc()`` (~0.4 µs) and a Histogram scans its buckets under a lock (~0.6 µs),
which made one Produce cost ~1.8 µs of metrics. So the broker's own metrics are
plain Python numbers in ``__slots__`` objects, cached per label value in dicts,
updated with no lock and no ``.labels()`` call (~0.2 µs per call), and turned
into metric families by one custom collector when Prometheus scrapes;
`prometheus_client` still does all of the exposition. The price: the update
methods must be called from one thread at a time - the event loop's, where the
broker runs every request - or an increment could be lost (never corrupted).
`render` runs there too (`serve_http` is a task of the same loop), which is also
what the partition source registered with `set_partition_source` relies on.

``BrokerMetrics(enabled=False)`` builds an instance of a subclass whose update
methods are empty, so a disabled call costs one plain method call.

Per topic-partition state (offsets, size, active producers) is not pushed on
every append: the broker registers a callable with `set_partition_source`, and
the collector asks it for a snapshot at scrape time. The transaction coordinator's
state (transactions by state, commits, aborts by cause, the oldest open transaction
per partition) comes the same way, from `set_transaction_source`, and the group
coordinator's (members and state per group, rebalances, heartbeats) from
`set_group_source`, and the committed offsets' (counts, commits, expiry, consumer
lag) from `set_offset_source`. A source that
raises costs its own families for that scrape, never the whole of /metrics: it is
counted in ``minibroker_metrics_collect_errors_total`` and logged.

``python -m bench.bench_metrics`` measures the hot-path methods per call.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from broker import __version__
from broker.transactions import TXN_ABORT_CAUSES, TxnStats
from protocol.errors import ErrorCode
from protocol.messages import REQUEST_TYPES, TXN_STATES

__all__ = [
    "AUTHENTICATION_MECHANISMS",
    "AUTHENTICATION_RESULTS",
    "CONTENT_TYPE",
    "KNOWN_APIS",
    "PRODUCER_EVENT_KINDS",
    "TXN_STATES",
    "BrokerMetrics",
    "GroupSnapshot",
    "GroupStats",
    "OffsetStats",
    "PartitionStats",
]

log = logging.getLogger(f"minibroker.{__name__}")

NAMESPACE = "minibroker"

# The text exposition format every Prometheus server understands. The body
# generate_latest() writes is the same in 0.0.4 and 1.0.0 for our (legacy-charset)
# names; announcing 0.0.4 keeps Prometheus 2.x scrapers on their usual parser.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

KNOWN_APIS: frozenset[str] = frozenset(REQUEST_TYPES)
"""API names that get their own `api` label value. Any other name (a client can send
anything) is counted under ``unknown``, so a hostile client cannot grow the series set."""
UNKNOWN_API = "unknown"

PRODUCER_EVENT_KINDS: tuple[str, ...] = (
    "duplicate",  # a retried batch recognised in the 5-batch cache: answered, not appended
    "out_of_order",  # OUT_OF_ORDER_SEQUENCE_NUMBER
    "fenced",  # INVALID_PRODUCER_EPOCH / PRODUCER_FENCED: an older epoch was refused
    "unknown_producer_id",  # UNKNOWN_PRODUCER_ID
    "expired",  # state forgotten after producer_id_expiration_ms idle
    "evicted",  # state forgotten (LRU) because a partition held max_producers_per_partition
)

# Request latency: a local produce with acks=1 takes tens of microseconds, an
# fsync'd one about a millisecond, a long-polling Fetch up to its max_wait_ms.
REQUEST_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
FSYNC_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
GROUP_COMMIT_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)

AUTHENTICATION_MECHANISMS: tuple[str, ...] = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "TLS")
"""How a connection authenticated: a SASL mechanism, or a TLS client certificate."""
AUTHENTICATION_RESULTS: tuple[str, ...] = (
    "success",
    "reauthenticated",  # the same principal again on the same connection (KIP-368)
    "failure",  # answered SASL_AUTHENTICATION_FAILED, the connection closed
    "unsupported_mechanism",  # UNSUPPORTED_SASL_MECHANISM, the connection kept
)
OTHER_MECHANISM = "other"


class _Listener:
    """The connections of one listener."""

    __slots__ = ("accepted", "handshake_failures", "insecure", "open")

    def __init__(self) -> None:
        self.insecure = False
        self.open = 0
        self.accepted = 0
        self.handshake_failures = 0


class GroupSnapshot(NamedTuple):
    """One consumer group, taken when Prometheus scrapes."""

    state: str
    members: int
    rebalances: int
    """Group epoch bumps since the group started (its group epoch)."""


class GroupStats(NamedTuple):
    """The group coordinator's state, taken when Prometheus scrapes."""

    groups: Mapping[str, GroupSnapshot]
    """By group id: the groups that have members."""
    heartbeats: int
    """ConsumerGroupHeartbeat and classic Heartbeat requests handled since start."""


class OffsetStats(NamedTuple):
    """The committed-offsets store's state, taken when Prometheus scrapes."""

    groups: int
    """Groups holding committed or pending offsets."""
    committed: int
    pending: int
    """Offsets of open transactions (TxnOffsetCommit), not yet committed."""
    commits: Mapping[str, int]
    """Offsets committed since start, by the API that committed them."""
    expired: int
    lag: Sequence[tuple[str, str, int, int]]
    """(group, topic, partition, high watermark - committed offset)."""
    lag_omitted: int
    """Committed offsets whose lag is not shown (past max_consumer_lag_series)."""


class PartitionStats(NamedTuple):
    """A snapshot of one topic-partition, taken when Prometheus scrapes."""

    topic: str
    partition: int
    log_end_offset: int
    log_start_offset: int
    last_stable_offset: int
    size_bytes: int
    active_producers: int
    """How many producer ids the partition keeps state for (a count; a sized
    collection of ids is accepted too and counted)."""


class _Histogram:
    """Bucket counts (not cumulative; the last one is +Inf) and the sum of observations."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: the first bound >= value, i.e. Prometheus's "le" bucket.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def exposition_buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            total += n
            out.append((_le(bound), total))
        out.append(("+Inf", total + self.counts[-1]))
        return out


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class _Flow:
    """Bytes and records through one topic in one direction."""

    __slots__ = ("bytes", "records")

    def __init__(self) -> None:
        self.bytes = 0
        self.records = 0


class BrokerMetrics:
    """Every metric of one broker process, and the exposition of them."""

    def __new__(cls, *, enabled: bool = True) -> BrokerMetrics:
        # Disabled: an instance of the subclass whose update methods are empty, so a
        # call costs one plain method call and no `if` in every method.
        if not enabled and cls is BrokerMetrics:
            cls = _DisabledMetrics
        return super().__new__(cls)

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.registry = CollectorRegistry(auto_describe=True)
        self._partition_source: Callable[[], Iterable[PartitionStats]] | None = None
        self._transaction_source: Callable[[], TxnStats] | None = None
        self._group_source: Callable[[], GroupStats] | None = None
        self._offset_source: Callable[[], OffsetStats] | None = None
        self._forgotten_source: Callable[[], tuple[int, int]] | None = None
        self._turns_source: Callable[[str], tuple[int, int]] | None = None
        self._data_dir: str | None = None
        self._version = __version__
        # Wall clock for the age of open transactions (their start is epoch ms); tests
        # may replace it.
        self._clock: Callable[[], float] = time.time

        # api -> latency histogram (its count is the requests_total of that api)
        self._requests: dict[str, _Histogram] = {}
        # (api, error code) -> count; api already folded to its label value
        self._errors: dict[tuple[str, int], int] = {}
        self._flow_in: dict[str, _Flow] = {}
        self._flow_out: dict[str, _Flow] = {}
        self._producer_events: dict[str, int] = dict.fromkeys(PRODUCER_EVENT_KINDS, 0)
        self._producer_ids_max: float | None = None
        self._fsync = _Histogram(FSYNC_BUCKETS)
        self._group_commit = _Histogram(GROUP_COMMIT_BUCKETS)
        self._connections_open = 0
        self._connections_accepted = 0
        self._listeners: dict[str, _Listener] = {}
        # (listener, mechanism, result) -> count
        self._authentications: dict[tuple[str, str, str], int] = {}
        # (api, resource type) -> operations denied; api already folded to its label value
        self._authorization_denials: dict[tuple[str, str], int] = {}
        self._recovery_seconds = 0.0
        self._collect_errors = 0

        if not enabled:
            return

        self._requests[UNKNOWN_API] = _Histogram(REQUEST_BUCKETS)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(_BrokerCollector(self))

    # ------------------------------------------------------------------ requests

    def _request_histogram(self, api: str) -> _Histogram:
        if api not in KNOWN_APIS:
            # Never cached under the client's string: the dict must stay bounded.
            return self._requests[UNKNOWN_API]
        hist = self._requests[api] = _Histogram(REQUEST_BUCKETS)
        return hist

    def observe_request(self, api: str, error_code: int, seconds: float) -> None:
        """One request answered: counted and timed per API, its error counted when not 0."""
        try:
            hist = self._requests[api]
        except KeyError:
            hist = self._request_histogram(api)
        hist.counts[bisect_left(hist.bounds, seconds)] += 1
        hist.sum += seconds
        if error_code:
            key = (api if api in KNOWN_APIS else UNKNOWN_API, error_code)
            errors = self._errors
            errors[key] = errors.get(key, 0) + 1

    # ------------------------------------------------------------------ throughput

    def record_produce(self, topic: str, bytes_: int, records: int) -> None:
        """A batch appended to `topic` (call once per appended partition of a Produce)."""
        try:
            flow = self._flow_in[topic]
        except KeyError:
            flow = self._flow_in[topic] = _Flow()
        flow.bytes += bytes_
        flow.records += records

    def record_fetch(self, topic: str, bytes_: int, records: int) -> None:
        """Bytes and records returned from `topic` by a Fetch (once per partition)."""
        try:
            flow = self._flow_out[topic]
        except KeyError:
            flow = self._flow_out[topic] = _Flow()
        flow.bytes += bytes_
        flow.records += records

    # ------------------------------------------------------------------ producer state

    def producer_event(self, kind: str, count: int = 1) -> None:
        """One of `PRODUCER_EVENT_KINDS` happened `count` times."""
        events = self._producer_events
        if kind not in events:
            raise ValueError(
                f"unknown producer event kind {kind!r}; expected one of {PRODUCER_EVENT_KINDS}"
            )
        events[kind] += count

    def set_producer_ids_max(self, value: int) -> None:
        """Export the max_producers_per_partition setting (at start and on reload) as
        `minibroker_producer_ids_max`, which the ProducerIdCapNearLimit alert compares with."""
        self._producer_ids_max = value

    # ------------------------------------------------------------------ storage

    def observe_fsync(self, seconds: float, batches: int) -> None:
        """One fsync took `seconds` and made `batches` appended batches durable."""
        self._fsync.observe(seconds)
        self._group_commit.observe(batches)

    def set_recovery_seconds(self, seconds: float) -> None:
        self._recovery_seconds = seconds

    def set_data_dir(self, path: str | os.PathLike[str]) -> None:
        """Export the free and total bytes of the filesystem holding `path`, read at scrape
        time (the DiskNearlyFull alert uses them)."""
        self._data_dir = os.fspath(path)

    def set_forgotten_source(self, source: Callable[[], tuple[int, int]]) -> None:
        """(expired, evicted) producer ids so far, summed over partitions, read at
        scrape time: eviction happens inside every append, where counting costs."""
        self._forgotten_source = source

    def set_transaction_source(self, source: Callable[[], TxnStats]) -> None:
        """`source()` is called at every scrape, like the partition source (same thread,
        same rules), and gives the transaction families their samples."""
        self._transaction_source = source

    def set_group_source(self, source: Callable[[], GroupStats]) -> None:
        """`source()` is called at every scrape, like the partition source, and gives
        the consumer-group families their samples."""
        self._group_source = source

    def set_offset_source(self, source: Callable[[], OffsetStats]) -> None:
        """`source()` is called at every scrape, like the partition source, and gives the
        committed-offset families their samples."""
        self._offset_source = source

    def set_partition_source(self, source: Callable[[], Iterable[PartitionStats]]) -> None:
        """`source()` is called at every scrape, on the thread that renders (the event
        loop's, with `serve_http`); it must be quick and must not block."""
        self._partition_source = source

    # ------------------------------------------------------------------ sessions

    def _listener(self, name: str) -> _Listener:
        try:
            return self._listeners[name]
        except KeyError:
            listener = self._listeners[name] = _Listener()
            return listener

    def set_listener(self, name: str, *, insecure: bool) -> None:
        """A listener serves from now on; `insecure`: plaintext without authentication
        on an address other hosts can reach (`minibroker_listener_insecure` is 1)."""
        self._listener(name).insecure = insecure

    def connection_opened(self, listener: str = "default") -> None:
        self._connections_accepted += 1
        self._connections_open += 1
        counts = self._listener(listener)
        counts.accepted += 1
        counts.open += 1

    def connection_closed(self, listener: str = "default") -> None:
        self._connections_open -= 1
        self._listener(listener).open -= 1

    def tls_handshake_failed(self, listener: str) -> None:
        self._listener(listener).handshake_failures += 1

    def set_authentication_turns_source(self, source: Callable[[str], tuple[int, int]]) -> None:
        """`source(listener)`: its connections holding an authentication turn and those
        waiting for one (network/limits.py `AuthenticationTurns`), asked at each scrape."""
        self._turns_source = source

    def authentication(self, listener: str, mechanism: str, result: str) -> None:
        """One authentication attempt ended with `result` (`AUTHENTICATION_RESULTS`)."""
        if mechanism not in AUTHENTICATION_MECHANISMS:
            mechanism = OTHER_MECHANISM  # a client's string never becomes a series
        if result not in AUTHENTICATION_RESULTS:
            raise ValueError(f"unknown authentication result {result!r}")
        key = (listener, mechanism, result)
        self._authentications[key] = self._authentications.get(key, 0) + 1

    # ------------------------------------------------------------------ authorization

    def authorization_denied(self, api: str, resource_type: str) -> None:
        """A request of `api` was refused an operation on a resource of `resource_type`
        (one of the four an ACL names): once per resource denied."""
        key = (api if api in KNOWN_APIS else UNKNOWN_API, resource_type)
        denials = self._authorization_denials
        denials[key] = denials.get(key, 0) + 1

    # ------------------------------------------------------------------ exposition

    def render(self) -> tuple[bytes, str]:
        """The text exposition of every metric, and its Content-Type."""
        if not self.enabled:
            return b"", CONTENT_TYPE
        return generate_latest(self.registry), CONTENT_TYPE


class _DisabledMetrics(BrokerMetrics):
    """`BrokerMetrics(enabled=False)`: every update is a no-op; `render` gives an empty body."""

    def observe_request(self, api: str, error_code: int, seconds: float) -> None:
        pass

    def record_produce(self, topic: str, bytes_: int, records: int) -> None:
        pass

    def record_fetch(self, topic: str, bytes_: int, records: int) -> None:
        pass

    def producer_event(self, kind: str, count: int = 1) -> None:
        pass

    def set_producer_ids_max(self, value: int) -> None:
        pass

    def observe_fsync(self, seconds: float, batches: int) -> None:
        pass

    def set_recovery_seconds(self, seconds: float) -> None:
        pass

    def set_data_dir(self, path: str | os.PathLike[str]) -> None:
        pass

    def set_forgotten_source(self, source: Callable[[], tuple[int, int]]) -> None:
        pass

    def set_transaction_source(self, source: Callable[[], TxnStats]) -> None:
        pass

    def set_group_source(self, source: Callable[[], GroupStats]) -> None:
        pass

    def set_offset_source(self, source: Callable[[], OffsetStats]) -> None:
        pass

    def set_partition_source(self, source: Callable[[], Iterable[PartitionStats]]) -> None:
        pass

    def set_listener(self, name: str, *, insecure: bool) -> None:
        pass

    def connection_opened(self, listener: str = "default") -> None:
        pass

    def connection_closed(self, listener: str = "default") -> None:
        pass

    def tls_handshake_failed(self, listener: str) -> None:
        pass

    def set_authentication_turns_source(self, source: Callable[[str], tuple[int, int]]) -> None:
        pass

    def authentication(self, listener: str, mechanism: str, result: str) -> None:
        pass

    def authorization_denied(self, api: str, resource_type: str) -> None:
        pass


class _BrokerCollector(Collector):
    """Turns the broker's counters into metric families at scrape time."""

    def __init__(self, m: BrokerMetrics) -> None:
        self._m = m

    def describe(self) -> Iterable[Metric]:
        # Names without samples, for the registry's duplicate check: no snapshot taken.
        return [*self._families(samples=False)]

    def collect(self) -> Iterator[Metric]:
        return self._families(samples=True)

    def _families(self, *, samples: bool) -> Iterator[Metric]:
        m = self._m
        ns = NAMESPACE

        info = GaugeMetricFamily(
            f"{ns}_build_info",
            "Always 1; the version label says which broker runs.",
            labels=["version"],
        )
        if samples:
            info.add_metric([m._version], 1)
        yield info

        # ---- requests
        requests = CounterMetricFamily(
            f"{ns}_requests", "Requests handled, per API.", labels=["api"]
        )
        latency = HistogramMetricFamily(
            f"{ns}_request_duration_seconds",
            "Time from a request's decoding to its response being ready, per API.",
            labels=["api"],
        )
        errors = CounterMetricFamily(
            f"{ns}_request_errors",
            "Requests answered with an error code other than NONE, per API and error name.",
            labels=["api", "error"],
        )
        if samples:
            for api, hist in list(m._requests.items()):
                buckets = hist.exposition_buckets()
                requests.add_metric([api], buckets[-1][1])
                latency.add_metric([api], buckets, hist.sum)
            for (api, code), n in list(m._errors.items()):
                errors.add_metric([api, ErrorCode.name_of(code)], n)
        yield requests
        yield errors
        yield latency

        # ---- throughput
        for direction, flows, verb in (
            ("in", m._flow_in, "appended by Produce"),
            ("out", m._flow_out, "returned by Fetch"),
        ):
            b = CounterMetricFamily(
                f"{ns}_bytes_{direction}",
                f"Record-batch bytes {verb}, per topic.",
                labels=["topic"],
            )
            r = CounterMetricFamily(
                f"{ns}_records_{direction}", f"Records {verb}, per topic.", labels=["topic"]
            )
            if samples:
                for topic, flow in list(flows.items()):
                    b.add_metric([topic], flow.bytes)
                    r.add_metric([topic], flow.records)
            yield b
            yield r

        # ---- idempotent producers
        events = CounterMetricFamily(
            f"{ns}_producer_events",
            "Idempotent-producer events: duplicate batches detected, out-of-order sequences, "
            "fenced producers, unknown producer ids, and producer ids expired or evicted.",
            labels=["kind"],
        )
        if samples:
            counts = dict(m._producer_events)
            if m._forgotten_source is not None:
                expired, evicted = m._forgotten_source()
                counts["expired"] += expired
                counts["evicted"] += evicted
            for kind, n in counts.items():
                events.add_metric([kind], n)
        yield events
        if m._producer_ids_max is not None or not samples:
            cap = GaugeMetricFamily(
                f"{ns}_producer_ids_max",
                "The max_producers_per_partition setting: active producer ids a partition "
                "keeps before it evicts the least recently used one.",
            )
            if samples:
                cap.add_metric([], m._producer_ids_max)  # type: ignore[arg-type]
            yield cap

        # ---- storage
        fsync = HistogramMetricFamily(
            f"{ns}_fsync_duration_seconds",
            "Duration of one fsync of the log (one group commit).",
        )
        fsyncs = CounterMetricFamily(f"{ns}_fsyncs", "fsync calls on the log.")
        group = HistogramMetricFamily(
            f"{ns}_group_commit_batches",
            "Record batches made durable by one fsync (the group-commit size).",
        )
        recovery = GaugeMetricFamily(
            f"{ns}_recovery_duration_seconds",
            "Time the log recovery took when this process started.",
        )
        if samples:
            fsync_buckets = m._fsync.exposition_buckets()
            fsync.add_metric([], fsync_buckets, m._fsync.sum)
            fsyncs.add_metric([], fsync_buckets[-1][1])
            group.add_metric([], m._group_commit.exposition_buckets(), m._group_commit.sum)
            recovery.add_metric([], m._recovery_seconds)
        yield fsyncs
        yield fsync
        yield group
        yield recovery

        # ---- sessions
        conns_open = GaugeMetricFamily(f"{ns}_connections_open", "Client connections open now.")
        conns = CounterMetricFamily(
            f"{ns}_connections_accepted", "Client connections accepted since start."
        )
        if samples:
            conns_open.add_metric([], m._connections_open)
            conns.add_metric([], m._connections_accepted)
        yield conns_open
        yield conns

        # ---- listeners and authentication
        listener_open = GaugeMetricFamily(
            f"{ns}_listener_connections_open",
            "Client connections open now, per listener.",
            labels=["listener"],
        )
        listener_accepted = CounterMetricFamily(
            f"{ns}_listener_connections_accepted",
            "Client connections accepted since start, per listener.",
            labels=["listener"],
        )
        insecure = GaugeMetricFamily(
            f"{ns}_listener_insecure",
            "1 for a plaintext listener without authentication on an address other hosts "
            "can reach (anyone there may read and write every topic), else 0.",
            labels=["listener"],
        )
        handshakes = CounterMetricFamily(
            f"{ns}_tls_handshake_failures",
            "TLS handshakes that failed or timed out (plaintext sent to a TLS port, a "
            "client certificate refused), per listener.",
            labels=["listener"],
        )
        authenticating = GaugeMetricFamily(
            f"{ns}_listener_authenticating",
            "Connections not yet authenticated whose TLS handshake or SASL exchange runs "
            "now (at most max_authenticating_connections), per listener.",
            labels=["listener"],
        )
        waiting = GaugeMetricFamily(
            f"{ns}_listener_authentications_waiting",
            "Connections not yet authenticated waiting for their turn to run their TLS "
            "handshake or SASL exchange, per listener.",
            labels=["listener"],
        )
        authentications = CounterMetricFamily(
            f"{ns}_authentications",
            "Authentication attempts, per listener, mechanism and result.",
            labels=["listener", "mechanism", "result"],
        )
        if samples:
            for name, listener in list(m._listeners.items()):
                listener_open.add_metric([name], listener.open)
                listener_accepted.add_metric([name], listener.accepted)
                insecure.add_metric([name], 1 if listener.insecure else 0)
                handshakes.add_metric([name], listener.handshake_failures)
                if m._turns_source is not None:
                    running, queued = m._turns_source(name)
                    authenticating.add_metric([name], running)
                    waiting.add_metric([name], queued)
            for (name, mechanism, result), n in list(m._authentications.items()):
                authentications.add_metric([name, mechanism, result], n)
        yield listener_open
        yield listener_accepted
        yield insecure
        yield handshakes
        yield authenticating
        yield waiting
        yield authentications

        # ---- authorization
        denials = CounterMetricFamily(
            f"{ns}_authorization_denials",
            "Operations on resources refused to requests by the ACLs, per API and resource "
            "type (a resource left out of a listing is not counted).",
            labels=["api", "resource_type"],
        )
        if samples:
            for (api, resource_type), n in list(m._authorization_denials.items()):
                denials.add_metric([api, resource_type], n)
        yield denials

        # ---- per topic-partition and transactions, asked for at scrape time
        yield from self._partition_families(samples)
        yield from self._transaction_families(samples)
        yield from self._group_families(samples)
        yield from self._offset_families(samples)
        yield from self._disk_families(samples)

        # Last: a source that failed above is already counted in this scrape.
        errors_fam = CounterMetricFamily(
            f"{ns}_metrics_collect_errors",
            "Failures to read a statistics source at scrape time (partitions, "
            "transactions, groups, committed offsets, the data dir's filesystem); the broker "
            "logs each one.",
        )
        if samples:
            errors_fam.add_metric([], m._collect_errors)
        yield errors_fam

    def _partition_families(self, samples: bool) -> Iterator[Metric]:
        m = self._m
        ns = NAMESPACE
        labels = ["topic", "partition"]
        families = [
            GaugeMetricFamily(
                f"{ns}_log_end_offset",
                "Offset the next appended record will get (the high watermark).",
                labels=labels,
            ),
            GaugeMetricFamily(
                f"{ns}_log_start_offset",
                "First offset still in the log (moves up when retention deletes segments).",
                labels=labels,
            ),
            GaugeMetricFamily(
                f"{ns}_last_stable_offset",
                "Last stable offset: read_committed consumers see the offsets below it.",
                labels=labels,
            ),
            GaugeMetricFamily(
                f"{ns}_log_size_bytes", "Size on disk of the partition's segments.", labels=labels
            ),
            GaugeMetricFamily(
                f"{ns}_active_producer_ids",
                "Producer ids the partition currently keeps idempotence state for.",
                labels=labels,
            ),
        ]
        if not samples:
            yield from families
            return
        source = m._partition_source
        if source is None:
            return
        leo, start, lso, size, producers = families
        try:
            for p in source():
                key = [p.topic, str(p.partition)]
                leo.add_metric(key, p.log_end_offset)
                start.add_metric(key, p.log_start_offset)
                lso.add_metric(key, p.last_stable_offset)
                size.add_metric(key, p.size_bytes)
                active = p.active_producers
                producers.add_metric(key, active if isinstance(active, int) else len(active))
        except Exception:
            # A failing source must not take /metrics down: the process and request
            # metrics are what an operator needs to see then.
            m._collect_errors += 1
            log.exception("event=metrics_partition_source_failed")
            return
        yield from families

    def _transaction_families(self, samples: bool) -> Iterator[Metric]:
        m = self._m
        ns = NAMESPACE
        by_state = GaugeMetricFamily(
            f"{ns}_transactions",
            "Transactional ids held by the coordinator, by the state of their transaction.",
            labels=["state"],
        )
        committed = CounterMetricFamily(
            f"{ns}_transactions_committed", "Transactions committed since start."
        )
        aborted = CounterMetricFamily(
            f"{ns}_transactions_aborted",
            "Transactions aborted since start, by cause: client (EndTxn, CommitTxns), timeout, "
            "fenced (a new instance of the transactional id), recovery (at start).",
            labels=["cause"],
        )
        oldest = GaugeMetricFamily(
            f"{ns}_oldest_open_transaction_age_seconds",
            "Age of the oldest open (or decided, markers not yet written) transaction on "
            "the partition: how long read_committed consumers have been held at the last "
            "stable offset. No series for a partition without an open transaction.",
            labels=["topic", "partition"],
        )
        families = [by_state, committed, aborted, oldest]
        if not samples:
            yield from families
            return
        source = m._transaction_source
        if source is None:
            return
        try:
            stats = source()
            now_ms = m._clock() * 1000.0
            # Every known state and cause, 0 when absent, so rate() and the alert rules
            # have a series from the start; one the source adds is shown too.
            states = dict.fromkeys(TXN_STATES, 0)
            states.update(stats.states)
            causes = dict.fromkeys(TXN_ABORT_CAUSES, 0)
            causes.update(stats.aborts)
            for state, n in states.items():
                by_state.add_metric([state], n)
            committed.add_metric([], stats.commits)
            for cause, n in causes.items():
                aborted.add_metric([cause], n)
            for (topic, partition), started_ms in sorted(stats.oldest_open_ms.items()):
                # A wall clock stepped back must not show a negative age.
                age = max(0.0, (now_ms - started_ms) / 1000.0)
                oldest.add_metric([topic, str(partition)], age)
        except Exception:
            m._collect_errors += 1
            log.exception("event=metrics_transaction_source_failed")
            return
        yield from families

    def _group_families(self, samples: bool) -> Iterator[Metric]:
        m = self._m
        ns = NAMESPACE
        members = GaugeMetricFamily(
            f"{ns}_group_members", "Members of the consumer group.", labels=["group"]
        )
        state = GaugeMetricFamily(
            f"{ns}_group_state",
            "Always 1, one series per group: the state label says which state the group "
            "is in (EMPTY, RECONCILING, STABLE; a classic group's in Kafka's names).",
            labels=["group", "state"],
        )
        rebalances = CounterMetricFamily(
            f"{ns}_group_rebalances",
            "Group epoch bumps: joins, leaves, removals, subscription and partition-count "
            "changes. Starts again when an emptied group comes back.",
            labels=["group"],
        )
        heartbeats = CounterMetricFamily(
            f"{ns}_group_heartbeats",
            "ConsumerGroupHeartbeat and classic Heartbeat requests handled since start.",
        )
        families = [members, state, rebalances, heartbeats]
        if not samples:
            yield from families
            return
        source = m._group_source
        if source is None:
            return
        try:
            stats = source()
            for group_id, snapshot in sorted(stats.groups.items()):
                members.add_metric([group_id], snapshot.members)
                state.add_metric([group_id, snapshot.state], 1)
                rebalances.add_metric([group_id], snapshot.rebalances)
            heartbeats.add_metric([], stats.heartbeats)
        except Exception:
            m._collect_errors += 1
            log.exception("event=metrics_group_source_failed")
            return
        yield from families

    def _offset_families(self, samples: bool) -> Iterator[Metric]:
        m = self._m
        ns = NAMESPACE
        groups = GaugeMetricFamily(
            f"{ns}_consumer_groups_with_offsets",
            "Consumer groups holding committed or pending offsets.",
        )
        committed = GaugeMetricFamily(
            f"{ns}_consumer_group_committed_offsets",
            "Committed offsets held over all groups (one per group and partition); with the "
            "pending ones, bounded by max_committed_offsets.",
        )
        pending = GaugeMetricFamily(
            f"{ns}_consumer_group_pending_offsets",
            "Offsets committed inside open transactions (TxnOffsetCommit), not yet visible.",
        )
        commits = CounterMetricFamily(
            f"{ns}_offset_commits",
            "Offsets committed since start (one per partition), by API: OffsetCommit, or "
            "TxnOffsetCommit when the transaction committed.",
            labels=["api"],
        )
        expired = CounterMetricFamily(
            f"{ns}_offsets_expired",
            "Committed offsets deleted since start because offsets_retention_ms passed.",
        )
        lag = GaugeMetricFamily(
            f"{ns}_consumer_group_lag",
            "High watermark minus the group's committed offset: records the group has not "
            "committed yet (0 when it committed past the end).",
            labels=["group", "topic", "partition"],
        )
        omitted = GaugeMetricFamily(
            f"{ns}_consumer_group_lag_series_omitted",
            "Committed offsets whose lag series is left out because max_consumer_lag_series "
            "series are shown.",
        )
        families = [groups, committed, pending, commits, expired, lag, omitted]
        if not samples:
            yield from families
            return
        source = m._offset_source
        if source is None:
            return
        try:
            stats = source()
            groups.add_metric([], stats.groups)
            committed.add_metric([], stats.committed)
            pending.add_metric([], stats.pending)
            for api, n in sorted(stats.commits.items()):
                commits.add_metric([api], n)
            expired.add_metric([], stats.expired)
            for group, topic, partition, behind in stats.lag:
                lag.add_metric([group, topic, str(partition)], behind)
            omitted.add_metric([], stats.lag_omitted)
        except Exception:
            m._collect_errors += 1
            log.exception("event=metrics_offset_source_failed")
            return
        yield from families

    def _disk_families(self, samples: bool) -> Iterator[Metric]:
        m = self._m
        capacity = GaugeMetricFamily(
            f"{NAMESPACE}_data_dir_capacity_bytes", "Size of the filesystem holding the data dir."
        )
        free = GaugeMetricFamily(
            f"{NAMESPACE}_data_dir_free_bytes",
            "Bytes available to the broker on the filesystem holding the data dir.",
        )
        if not samples:
            yield capacity
            yield free
            return
        if m._data_dir is None:
            return
        try:
            usage = shutil.disk_usage(m._data_dir)
        except OSError as exc:
            m._collect_errors += 1
            log.warning("event=metrics_disk_usage_failed data_dir=%s error=%s", m._data_dir, exc)
            return
        capacity.add_metric([], usage.total)
        free.add_metric([], usage.free)
        yield capacity
        yield free
