"""Producer and consumer settings: Kafka's names and defaults, validated once at construction.

Settings arrive as keyword arguments (as in kafka-python and aiokafka); an
unknown name is a TypeError and an inconsistent combination a ValueError, the
equivalent of Kafka's ConfigException, so mistakes surface before any I/O.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from client.security import (
    PLAINTEXT,
    SASL_MECHANISMS,
    SASL_PROTOCOLS,
    SECURITY_PROTOCOLS,
    TLS_PROTOCOLS,
    ConnectionSecurity,
    SaslSettings,
    tls_context,
)
from protocol.compression import Compression
from protocol.messages import IDENTIFIER_CHARS_MAX

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_PORT = 9092
IDEMPOTENT_IN_FLIGHT_MAX = 5
RETRIES_UNBOUNDED = 2**31 - 1

# kafka-python's custom partitioner signature: (key bytes, all partitions, available ones) -> int.
PartitionerFn = Callable[[bytes | None, list[int], list[int]], int]


def parse_bootstrap(servers: str | Sequence[str]) -> list[tuple[str, int]]:
    """'host:port,host2' or a list of such strings, as (host, port) pairs."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    parsed = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, str(DEFAULT_PORT)
        parsed.append((host.strip("[]") or "127.0.0.1", int(port)))
    if not parsed:
        raise ValueError("bootstrap_servers is empty")
    return parsed


def parse_acks(acks: str | int) -> int:
    """Kafka's spellings of acks: "all" or -1, 1, 0."""
    normalized = {"all": -1, "-1": -1, "1": 1, "0": 0}.get(str(acks).strip().lower())
    if normalized is None:
        raise ValueError(f"acks must be 'all', -1, 1 or 0, got {acks!r}")
    return normalized


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


# The TLS settings that only mean something with security_protocol SSL or SASL_SSL, and the
# SASL ones with SASL_PLAINTEXT or SASL_SSL. Naming one with another protocol is an error:
# a forgotten security_protocol would otherwise connect in plaintext, without a word.
_TLS_SETTINGS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_context")
_SASL_SETTINGS = ("sasl_mechanism", "sasl_plain_username", "sasl_plain_password")
SECRET_SETTINGS = frozenset({"ssl_password", "sasl_plain_password"})
"""Settings whose values must never be shown: hidden from reprs here and in the Spark
connector's options."""


@dataclass(slots=True, kw_only=True)
class SecurityConfig:
    """How a client's connections are secured: kafka-python's names, shared by the
    producer, the consumer and the admin helpers (`AdminConfig`).

    security_protocol: PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL.
    TLS (SSL, SASL_SSL): the broker's certificate is checked against ssl_cafile (else
    the system's CAs) and, with ssl_check_hostname, must name the host connected to;
    ssl_certfile and ssl_keyfile (decrypted with ssl_password) are the client's own
    certificate for mTLS. Or ssl_context: the caller's `ssl.SSLContext`, used as is.
    SASL (SASL_*): sasl_mechanism PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 with
    sasl_plain_username and sasl_plain_password (Kafka's names for every mechanism).

    The TLS context is built here, so a missing file or a wrong key password is a
    ValueError at construction. Passwords are left out of the repr."""

    security_protocol: str = PLAINTEXT
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True
    ssl_context: ssl.SSLContext | None = None
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)
    security: ConnectionSecurity = field(init=False, repr=False)

    def _check_security(self) -> None:
        """Validate the settings and build `security`; subclasses call it first thing in
        their __post_init__ (slots dataclasses cannot use super() there)."""
        protocol = str(self.security_protocol).upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise ValueError(
                f"security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, "
                f"got {self.security_protocol!r}"
            )
        self.security_protocol = protocol
        tls = protocol in TLS_PROTOCOLS
        sasl = protocol in SASL_PROTOCOLS
        named = [n for n in _TLS_SETTINGS if getattr(self, n) is not None]
        if not self.ssl_check_hostname:
            named.append("ssl_check_hostname")
        if named and not tls:
            raise ValueError(
                f"{', '.join(named)} need security_protocol SSL or SASL_SSL (it is {protocol})"
            )
        named = [n for n in _SASL_SETTINGS if getattr(self, n) is not None]
        if named and not sasl:
            raise ValueError(
                f"{', '.join(named)} need security_protocol SASL_PLAINTEXT or SASL_SSL "
                f"(it is {protocol})"
            )
        context = None
        if tls:
            context = self._tls_context()
        credentials = None
        if sasl:
            credentials = self._sasl_settings(protocol)
        self.security = ConnectionSecurity(context, credentials)

    def _tls_context(self) -> ssl.SSLContext:
        if self.ssl_context is not None:
            if not isinstance(self.ssl_context, ssl.SSLContext):
                raise ValueError("ssl_context must be an ssl.SSLContext")
            others = [n for n in _TLS_SETTINGS[:-1] if getattr(self, n) is not None]
            if not self.ssl_check_hostname:
                others.append("ssl_check_hostname (set check_hostname on the context)")
            if others:
                raise ValueError(f"ssl_context is used as is: drop {', '.join(others)}")
            return self.ssl_context
        if self.ssl_certfile is None and (
            self.ssl_keyfile is not None or self.ssl_password is not None
        ):
            raise ValueError("ssl_keyfile and ssl_password need ssl_certfile")
        return tls_context(
            cafile=self.ssl_cafile,
            certfile=self.ssl_certfile,
            keyfile=self.ssl_keyfile,
            password=self.ssl_password,
            check_hostname=bool(self.ssl_check_hostname),
        )

    def _sasl_settings(self, protocol: str) -> SaslSettings:
        mechanism = str(self.sasl_mechanism or "").upper()
        if mechanism not in SASL_MECHANISMS:
            raise ValueError(
                f"security_protocol {protocol} needs sasl_mechanism "
                f"{', '.join(SASL_MECHANISMS[:-1])} or {SASL_MECHANISMS[-1]}, "
                f"got {self.sasl_mechanism!r}"
            )
        self.sasl_mechanism = mechanism
        missing = [
            n for n in ("sasl_plain_username", "sasl_plain_password") if not getattr(self, n)
        ]
        if missing:
            raise ValueError(f"sasl_mechanism {mechanism} needs {' and '.join(missing)}")
        assert self.sasl_plain_username is not None and self.sasl_plain_password is not None
        settings = SaslSettings(mechanism, self.sasl_plain_username, self.sasl_plain_password)
        settings.client()  # a name or password that SCRAM cannot use fails here, not at connect
        return settings


SECURITY_SETTINGS = tuple(f.name for f in fields(SecurityConfig) if f.init)
"""The names of the security settings."""


@dataclass(slots=True)
class AdminConfig(SecurityConfig):
    """Where and how the admin helpers (client/admin.py) connect: the bootstrap servers and
    the security settings. Every helper takes one in place of a bootstrap string."""

    bootstrap_servers: str | Sequence[str] = DEFAULT_BOOTSTRAP
    client_id: str = "minibroker-admin"
    servers: list[tuple[str, int]] = field(init=False)

    def __post_init__(self) -> None:
        self._check_security()
        self.servers = parse_bootstrap(self.bootstrap_servers)


@dataclass(slots=True)
class ProducerConfig(SecurityConfig):
    """Producer settings; see Kafka's producer configs for the meaning of each."""

    bootstrap_servers: str | Sequence[str] = DEFAULT_BOOTSTRAP
    client_id: str = "minibroker-python"
    # None: on when acks is "all", as Kafka does when the user did not ask explicitly.
    enable_idempotence: bool | None = None
    acks: str | int = "all"
    retries: int = RETRIES_UNBOUNDED
    max_in_flight_requests_per_connection: int = 5
    linger_ms: float = 0
    batch_size: int = 16384
    # Unlike Kafka's batch.size, batch_size is not a cap while every in-flight slot of a
    # partition is taken: its open batch then grows up to max_request_size, so that each
    # round trip carries what arrived while it waited. False: Kafka's fixed cap.
    adaptive_batching: bool = True
    buffer_memory: int = 32 * 1024 * 1024
    compression_type: str | int | None = None
    request_timeout_ms: int = 30_000
    delivery_timeout_ms: int = 120_000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    reconnect_backoff_ms: int = 50
    reconnect_backoff_max_ms: int = 1000
    max_block_ms: int = 60_000
    # Let the broker create a topic that does not exist (if its auto_create_topics allows),
    # as Kafka's producers do; a creation is logged as a warning either way.
    allow_auto_create_topics: bool = True
    max_request_size: int = 1024 * 1024
    partitioner: str | PartitionerFn = "murmur2"
    transactional_id: str | None = None
    transaction_timeout_ms: int = 60_000
    # How long a prepared transaction waits for its commit (by anyone) before the broker
    # aborts it; at most the broker's transaction_max_prepared_ms.
    transaction_prepared_timeout_ms: int = 3_600_000
    servers: list[tuple[str, int]] = field(init=False)
    acks_int: int = field(init=False)
    compression: Compression = field(init=False)

    def __post_init__(self) -> None:
        self._check_security()
        self.servers = parse_bootstrap(self.bootstrap_servers)
        self.acks_int = parse_acks(self.acks)
        self.compression = Compression.parse(self.compression_type)
        if self.enable_idempotence is None:
            self.enable_idempotence = self.acks_int == -1 or self.transactional_id is not None
        if self.enable_idempotence:
            if self.acks_int != -1:
                raise ValueError("enable_idempotence requires acks='all' (Kafka's rule)")
            if self.max_in_flight_requests_per_connection > IDEMPOTENT_IN_FLIGHT_MAX:
                raise ValueError(
                    "max_in_flight_requests_per_connection must be <= 5 with idempotence, got "
                    f"{self.max_in_flight_requests_per_connection}"
                )
        elif self.transactional_id is not None:
            raise ValueError("transactional_id requires enable_idempotence")
        for name in (
            "max_in_flight_requests_per_connection",
            "batch_size",
            "buffer_memory",
            "request_timeout_ms",
            "delivery_timeout_ms",
            "max_request_size",
            "transaction_timeout_ms",
            "transaction_prepared_timeout_ms",
        ):
            _positive(name, getattr(self, name))
        for name in (
            "retries",
            "linger_ms",
            "retry_backoff_ms",
            "retry_backoff_max_ms",
            "reconnect_backoff_ms",
            "reconnect_backoff_max_ms",
            "max_block_ms",
        ):
            _non_negative(name, getattr(self, name))
        if self.batch_size > self.max_request_size:
            raise ValueError("batch_size must be <= max_request_size")
        if self.max_request_size > self.buffer_memory:
            raise ValueError("max_request_size must be <= buffer_memory")
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise ValueError("delivery_timeout_ms must be >= linger_ms + request_timeout_ms")
        if not callable(self.partitioner) and self.partitioner not in ("murmur2", "crc32"):
            raise ValueError("partitioner must be 'murmur2', 'crc32' or a callable")


# Kafka's consumer protocol (KIP-848) leaves these to the broker; a client setting would be
# silently ignored there, so naming one is an error that says where the setting lives.
BROKER_SIDE_GROUP_SETTINGS = {
    "session_timeout_ms": "the broker's group_session_timeout_ms",
    "heartbeat_interval_ms": "the broker's group_heartbeat_interval_ms",
    "partition_assignment_strategy": "the broker's assignor",
}


@dataclass(slots=True)
class ConsumerConfig(SecurityConfig):
    """Consumer settings. Without `group_id` offsets are the caller's to store; with one the
    broker keeps them and, for subscribed topics, shares the partitions among the group."""

    bootstrap_servers: str | Sequence[str] = DEFAULT_BOOTSTRAP
    client_id: str = "minibroker-python"
    group_id: str | None = None
    # Static membership (KIP-345): a consumer restarted with the same id takes its
    # predecessor's partitions at once, and one that closes keeps them for the broker's
    # session timeout. One id per running consumer; a second one with it fences the first.
    group_instance_id: str | None = None
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    # The longest the application may go between polls before the member leaves the group
    # and its partitions go to others; sent to the broker as the rebalance timeout.
    max_poll_interval_ms: int = 300_000
    # None: max_poll_interval_ms, as Kafka's consumers do.
    rebalance_timeout_ms: int | None = None
    auto_offset_reset: str = "latest"
    # Kafka's consumers default to read_uncommitted; ours (and the Spark reader) to
    # read_committed, so that aborted and still-open transactions are never read by default.
    isolation_level: str = "read_committed"
    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = 50 * 1024 * 1024
    max_partition_fetch_bytes: int = 1024 * 1024
    max_poll_records: int = 500
    consumer_timeout_ms: float = math.inf
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    reconnect_backoff_ms: int = 50
    reconnect_backoff_max_ms: int = 1000
    check_crcs: bool = True
    # Whether the topics this consumer looks up itself (named without a group_id, or given to
    # partitions_for_topic) are created when missing. Off, as in librdkafka's consumer
    # (Kafka's Java consumer has it on): reading a mistyped topic must not create it. A
    # group's subscribed topics are resolved by the broker, which never creates them.
    allow_auto_create_topics: bool = False
    servers: list[tuple[str, int]] = field(init=False)

    def __post_init__(self) -> None:
        self._check_security()
        self.servers = parse_bootstrap(self.bootstrap_servers)
        if self.group_id is not None and not self.group_id:
            raise ValueError("group_id must be a non-empty string (or None for no group)")
        if self.group_instance_id is not None:
            if self.group_id is None:
                raise ValueError("group_instance_id needs a group_id")
            if not 0 < len(self.group_instance_id) <= IDENTIFIER_CHARS_MAX:
                raise ValueError(
                    f"group_instance_id must be 1 to {IDENTIFIER_CHARS_MAX} characters "
                    "(or None for a dynamic member)"
                )
        if self.rebalance_timeout_ms is None:
            self.rebalance_timeout_ms = self.max_poll_interval_ms
        if self.auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
        if self.isolation_level not in ("read_committed", "read_uncommitted"):
            raise ValueError("isolation_level must be 'read_committed' or 'read_uncommitted'")
        for name in (
            "fetch_max_bytes",
            "max_partition_fetch_bytes",
            "max_poll_records",
            "request_timeout_ms",
            "auto_commit_interval_ms",
            "max_poll_interval_ms",
            "rebalance_timeout_ms",
        ):
            _positive(name, getattr(self, name))
        for name in (
            "fetch_min_bytes",
            "fetch_max_wait_ms",
            "consumer_timeout_ms",
            "retry_backoff_ms",
            "retry_backoff_max_ms",
            "reconnect_backoff_ms",
            "reconnect_backoff_max_ms",
        ):
            _non_negative(name, getattr(self, name))
        if self.request_timeout_ms <= self.fetch_max_wait_ms:
            raise ValueError("request_timeout_ms must be > fetch_max_wait_ms")

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"


CLIENT_KINDS: tuple[type[SecurityConfig], ...] = (ProducerConfig, ConsumerConfig, AdminConfig)
FILE_SETTINGS = tuple(
    sorted(
        {f.name for kind in CLIENT_KINDS for f in fields(kind) if f.init}
        - {"bootstrap_servers", "ssl_context"}
    )
)
"""What the command line's --client-config file may set: every setting of a producer, a
consumer or the admin helpers but where they connect (--bootstrap-server) and an
SSLContext (an object, not a value)."""


def settings_for(
    kind: type[SecurityConfig], own: dict[str, Any], from_file: dict[str, Any], file: str
) -> dict[str, Any]:
    """The settings of a command's producer, consumer or admin calls (`kind`): those of
    the --client-config `file` that `kind` takes, and the command's `own` (from its
    flags). A setting in both is refused, naming it, rather than one silently losing."""
    names = {f.name for f in fields(kind) if f.init}
    taken = {k: v for k, v in from_file.items() if k in names}
    both = sorted(taken.keys() & own.keys())
    if both:
        raise ValueError(
            f"--client-config {file}: {', '.join(both)} is set by this command's own flags; "
            "set it there"
        )
    return taken | own
