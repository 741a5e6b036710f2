"""The broker process from start to clean stop: the composition root.

`Broker` owns what outlives a run's parts: the data dir's lock, the pid file, the
signals, the listeners' sockets (bound before recovery, so a port in use ends the start
at once) and readiness. `Running` is everything a run opens, built whole in one phase
by `Running.open`: the partitions recovered, the credentials and ACLs, the offsets and
the transaction log recovered (decided transactions finished, interrupted deletions
too), the groups, every API, and the network's server. It then runs them, reloads
them on SIGHUP, drains and closes them. Nothing here answers a request: the APIs are
`broker/api/`'s, the connections `broker/network/`'s.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
from anyio.abc import TaskGroup, TaskStatus

from broker.admin import Admin, finish_deletions
from broker.api import (
    BROKER_ID,
    Apis,
    Authentication,
    ClusterApi,
    FetchApi,
    GroupApi,
    ProduceApi,
    TopicApi,
    TransactionApi,
)
from broker.clock import now_ms
from broker.config import RELOADABLE, BrokerConfig, ConfigError
from broker.groups import GroupCoordinator, NoMembers, OffsetLog, OffsetStore, PartitionCounts
from broker.kafka import ClassicGroupApi, ConsumerGroupApi, GroupOffsetApi
from broker.metrics import BrokerMetrics, PartitionStats
from broker.network import Listeners, Server
from broker.partitions import GroupCommitter, ProducerIdManager, TopicRegistry
from broker.security import AclLog, AclStore, CredentialStore
from broker.storage import DataDir, PreviousShutdown, StorageError, cannot_use
from broker.transactions import TransactionCoordinator, TxnLog

log = logging.getLogger(f"minibroker.{__name__}")


class Broker:
    """Everything one broker process owns, from start to clean shutdown."""

    def __init__(
        self, config: BrokerConfig, reload_config: Callable[[], BrokerConfig] | None = None
    ):
        """ConfigError when a TLS listener's certificate, key or CA cannot be loaded."""
        self.config = config
        self.reload_config = reload_config
        self.metrics = BrokerMetrics(enabled=config.metrics_port >= 0)
        self.data_dir = DataDir(config.data_path)
        self.listeners = Listeners(config, self.metrics)
        self.ready = False
        self._stopping = False

    async def run(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        config = self.config
        previous = self.data_dir.acquire()
        with _refusing_start(config.data_path):
            producer_ids = ProducerIdManager(config.data_path)
        log.info(
            "event=starting data_dir=%s backend=%s previous_shutdown=%s pid=%d",
            config.data_path.resolve(),
            config.backend,
            previous.value,
            os.getpid(),
        )
        pid_file = config.pid_file
        if pid_file:
            try:
                with open(pid_file, "w") as f:
                    f.write(f"{os.getpid()}\n")
            except OSError as exc:
                raise ConfigError(
                    f"cannot write pid_file {pid_file}: {exc.strerror}; set pid_file "
                    "(--pid-file) to a path this user may write, or leave it empty"
                ) from exc
        # Signals are caught from here on, before any line that tells a supervisor
        # the broker is up, so an early SIGTERM is a graceful stop, not a kill.
        signals = anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        try:
            self.listeners.bind()
            with signals as signal_stream:
                async with anyio.create_task_group() as tg:
                    await self.listeners.serve_metrics(tg, self.is_ready)
                    running = await Running.open(
                        config, self.metrics, self.listeners, previous, producer_ids, tg
                    )
                    with _refusing_start(config.data_path):
                        self.data_dir.begin_run()
                    self.ready = True
                    running.start(tg)
                    # Connections run outside the listener's scope: stopping accepting
                    # must not cancel a reply that is waiting for its fsync.
                    async with anyio.create_task_group() as connections:
                        tg.start_soon(running.server.serve, connections)
                        self.listeners.log_listening(running.server.served)
                        task_status.started(self.listeners.port)
                        await self._wait_for_stop_signal(signal_stream, running)
                        try:
                            await self._drain(running)
                        finally:
                            connections.cancel_scope.cancel()
                    tg.cancel_scope.cancel()
            clean = running.close(self.data_dir)
        finally:
            self.listeners.close()
            self.data_dir.release()
            if pid_file:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(pid_file)
        if clean:
            log.info("event=stopped clean=true")

    def is_ready(self) -> bool:
        return self.ready and not self._stopping

    async def _wait_for_stop_signal(self, signals: AsyncIterator[int], running: Running) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:
                self._reload(running)
                continue
            log.info("event=stopping signal=%s", signal.Signals(signum).name)
            return

    def _reload(self, running: Running) -> None:
        if self.reload_config is None:
            log.warning("event=reload_skipped reason='no config source'")
            return
        try:
            new = self.reload_config()
        except ConfigError as exc:
            log.error("event=reload_failed error=%r", str(exc))
            return
        changed = {
            k: getattr(new, k) for k in RELOADABLE if getattr(new, k) != getattr(self.config, k)
        }
        ignored = sorted(
            k
            for k in vars(new)
            if k not in RELOADABLE and getattr(new, k) != getattr(self.config, k)
        )
        applied = dict(changed)
        self.config = type(self.config)(
            **{**vars(self.config), **{k: getattr(new, k) for k in RELOADABLE}}
        )
        if "log_level" in changed:
            logging.getLogger("minibroker").setLevel(self.config.log_level.upper())
        running.reconfigure(self.config)
        self.listeners.reload_tls(self.config)
        housekeeping(running.topics)
        log.info(
            "event=reloaded applied=%s needs_restart=%s",
            ",".join(f"{k}={v}" for k, v in sorted(applied.items())) or "none",
            ",".join(ignored) or "none",
        )

    async def _drain(self, running: Running) -> None:
        """Stop accepting, stop reading, let in-flight replies go out, within the deadline."""
        self._stopping = True
        running.server.stop()
        running.fetch.stop_waiting()
        await running.server.drain()


@dataclass(eq=False)
class Running:
    """What one run of the broker opened, each part whole: built by `open` only."""

    config: BrokerConfig
    topics: TopicRegistry
    credentials: CredentialStore
    acls: AclStore | None
    """None when `authorizer` is off."""
    offsets: OffsetStore
    coordinator: TransactionCoordinator
    groups: GroupCoordinator
    authentication: Authentication
    produce: ProduceApi
    fetch: FetchApi
    cluster: ClusterApi
    apis: Apis
    server: Server

    @classmethod
    async def open(
        cls,
        config: BrokerConfig,
        metrics: BrokerMetrics,
        listeners: Listeners,
        previous: PreviousShutdown,
        producer_ids: ProducerIdManager,
        tg: TaskGroup,
    ) -> Running:
        """Recover the partitions, open the security stores, listen, recover the offsets
        and the transactions (the group commit already running in `tg`, as recovery
        writes markers), and put the APIs and the server together. The listeners accept
        only once the caller serves them."""
        topics = await _open_topics(config, metrics, previous)
        credentials, acls = await _open_security(config)
        authentication = Authentication(config, credentials, metrics, acls)
        served = await listeners.listen()
        committer = GroupCommitter(metrics)
        topics.set_on_rolled(committer.request_flush)
        tg.start_soon(committer.run)
        with _refusing_start(config.data_path):
            offsets, coordinator = await _recover_logs(config, topics, producer_ids, committer)
        metrics.set_transaction_source(coordinator.stats)
        metrics.set_offset_source(offsets.stats)
        groups = GroupCoordinator(config, PartitionCounts(topics))
        metrics.set_group_source(groups.stats)
        offsets.members = groups
        groups.offset_groups = lambda: offsets.state.groups.keys()
        fetch = FetchApi(config, topics, metrics)
        coordinator.on_markers = fetch.wake
        admin = Admin(topics, offsets, coordinator, committer, BROKER_ID, fetch.wake)
        produce = ProduceApi(
            config, topics, producer_ids, committer, coordinator, metrics, fetch.wake
        )
        cluster = ClusterApi(config, topics, served[0].advertised)
        apis = Apis(
            config,
            topics,
            metrics,
            produce,
            [
                fetch,
                cluster,
                TopicApi(topics, admin),
                TransactionApi(topics, producer_ids, coordinator, metrics),
                GroupApi(groups, offsets, coordinator),
                ClassicGroupApi(groups, offsets),
                ConsumerGroupApi(groups, topics),
                GroupOffsetApi(offsets),
                authentication,
            ],
            acls,
        )
        server = Server(config, metrics, apis, authentication, listeners, served)
        return cls(
            config,
            topics,
            credentials,
            acls,
            offsets,
            coordinator,
            groups,
            authentication,
            produce,
            fetch,
            cluster,
            apis,
            server,
        )

    def start(self, tg: TaskGroup) -> None:
        """The background work: the transactions' timeouts and summaries, the groups'
        timers, the offsets' expiry and the housekeeping."""
        tg.start_soon(self.coordinator.run)
        tg.start_soon(self.coordinator.log_summaries)
        tg.start_soon(self.groups.run)
        tg.start_soon(self.offsets.run)
        tg.start_soon(self._housekeeping)

    def reconfigure(self, config: BrokerConfig) -> None:
        """SIGHUP's new settings: the reloadable ones apply from the next request."""
        self.config = config
        self.topics.apply_settings(config)
        for holder in (self.apis, self.produce, self.fetch, self.cluster, self.authentication):
            holder.config = config
        self.coordinator.config = config
        self.offsets.config = config
        self.server.config = config
        if self.acls is not None:
            self.acls.authorizer.set_super_users(config.super_users)

    async def _housekeeping(self) -> None:
        while True:
            await anyio.sleep(self.config.retention_check_interval_ms / 1000)
            housekeeping(self.topics)

    def close(self, data_dir: DataDir) -> bool:
        """Close the stores and logs (each partition leaves a snapshot) and mark the data
        dir cleanly shut down. When a write this needs fails (a full disk), say so in one
        line and leave the marker out: the next start recovers as after a crash."""
        try:
            self.credentials.close()
            if self.acls is not None:
                self.acls.close()
            self.coordinator.close()
            self.offsets.close()
            self.topics.close()
            data_dir.mark_clean_shutdown()
        except (OSError, StorageError) as exc:
            reason = cannot_use(self.config.data_path, exc)
            log.error(
                "event=stopped clean=false reason=%r",
                f"{reason}; the next start recovers it as after a crash",
            )
            return False
        return True


async def _open_topics(
    config: BrokerConfig, metrics: BrokerMetrics, previous: PreviousShutdown
) -> TopicRegistry:
    started = time.perf_counter()
    registry = TopicRegistry(config.data_path, config)
    # Only after a kill or crash are the log tails validated: a new data dir has none.
    clean = previous is not PreviousShutdown.UNCLEAN
    with _refusing_start(config.data_path):
        await anyio.to_thread.run_sync(
            lambda: registry.open_all(clean_shutdown=clean, now_ms=now_ms())
        )
    seconds = time.perf_counter() - started
    metrics.set_recovery_seconds(seconds)
    metrics.set_partition_source(functools.partial(_partition_stats, registry))
    metrics.set_forgotten_source(functools.partial(_forgotten_producers, registry))
    metrics.set_producer_ids_max(config.max_producers_per_partition)
    metrics.set_data_dir(config.data_path)
    log.info(
        "event=recovered topics=%d partitions=%d seconds=%.3f previous_shutdown=%s",
        len(registry.topics),
        len(registry.all_partitions()),
        seconds,
        previous.value,
    )
    return registry


async def _open_security(config: BrokerConfig) -> tuple[CredentialStore, AclStore | None]:
    """Open the SCRAM credentials (security/credentials.wal), creating the bootstrap
    users when it holds none, and with the authorizer on the ACLs
    (security/acls.wal): before any listener opens (Hi and fdatasync, in a worker
    thread)."""
    store = CredentialStore(config.data_path)
    await anyio.to_thread.run_sync(store.open)
    await anyio.to_thread.run_sync(store.bootstrap, os.environ)
    if not config.authorizer:
        return store, None
    acls = AclStore(AclLog(config.data_path), config.super_users, config.acls_max)
    await anyio.to_thread.run_sync(acls.load)
    return store, acls


async def _recover_logs(
    config: BrokerConfig,
    topics: TopicRegistry,
    producer_ids: ProducerIdManager,
    committer: GroupCommitter,
) -> tuple[OffsetStore, TransactionCoordinator]:
    """Load the committed offsets and the transaction log, and finish what a crash left
    decided (and topic deletions it interrupted), before any partition serves a read
    or any offset is fetched."""
    offsets = OffsetStore(
        config,
        topics,
        OffsetLog(config.data_path, config.offsets_log_max_bytes),
        NoMembers(),
    )
    offsets.load()
    await finish_deletions(topics, offsets)
    coordinator = TransactionCoordinator(
        config,
        topics,
        producer_ids,
        committer,
        TxnLog(config.data_path, config.transaction_log_max_bytes),
        offsets,
    )
    coordinator.load()
    await coordinator.recover()
    return offsets, coordinator


def housekeeping(topics: TopicRegistry) -> None:
    """Retention and producer expiry, run every retention_check_interval_ms."""
    stamp = now_ms()
    for p in topics.all_partitions():
        deleted = p.apply_retention(stamp)
        if deleted:
            log.info(
                "event=retention topic=%s partition=%d segments_deleted=%d log_start_offset=%d",
                p.topic,
                p.index,
                deleted,
                p.log.log_start_offset,
            )
        p.producers.expire(stamp)


def _partition_stats(topics: TopicRegistry) -> list[PartitionStats]:
    return [
        PartitionStats(
            p.topic,
            p.index,
            p.log.log_end_offset,
            p.log.log_start_offset,
            p.last_stable_offset,
            p.log.size_bytes,
            len(p.producers),
        )
        for p in topics.all_partitions()
    ]


def _forgotten_producers(topics: TopicRegistry) -> tuple[int, int]:
    states = [p.producers for p in topics.all_partitions()]
    return sum(s.expired_total for s in states), sum(s.evicted_total for s in states)


@contextlib.contextmanager
def _refusing_start(data_path: Path) -> Iterator[None]:
    """An OS or storage error while the broker starts (recovery cuts tails, rebuilds
    indexes, writes markers) is the data dir's refusal to start, in one line saying what
    to do about a full, read-only or unwritable disk, not a traceback."""
    try:
        yield
    except (OSError, StorageError) as exc:
        raise cannot_use(data_path, exc) from exc
