"""Broker settings: one table that drives the TOML file, the CLI flags, topic overrides
and the docs.

Every setting has a limit-style name with its unit last (`segment_bytes`,
`retention_ms`) so a config file reads unambiguously. Each is declared once, on
BrokerConfig, with its default, bounds or choices, unit, reloadability,
sensitivity and (for per-topic overrides) Kafka's dotted name; `SETTINGS` is
derived from those declarations and `Setting.check` is the one validation of
every source: the file, flags, SIGHUP, CreateTopics' config and
IncrementalAlterConfigs. DescribeConfigs answers from the same table
(`describe_broker`, `describe_topic`). docs/configuration.md is checked against
it by a test.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NamedTuple

DAY_MS = 24 * 3600 * 1000


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the key and what it allows."""


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1  # Kafka's long: what a topic config can carry on the wire
PARTITIONS_MAX = 10_000
_INTEGER = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True)
class Setting:
    """One setting as declared on BrokerConfig: what it is, what it allows, who may set it.

    `topic_key` is Kafka's dotted name when a topic may override the setting; a
    `sensitive` one (a password, a key) is never shown: DescribeConfigs answers nil. A
    list setting (a tuple default) takes a TOML array of strings: `min`/`max` bound its
    length, `choices` and `pattern` each item, and no item may come twice. `parse`, when
    given, is the whole check of a structured setting (`listeners`): it takes the raw
    TOML value or an already parsed one and returns the parsed form."""

    name: str
    default: Any
    doc: str
    unit: str
    min: int | None
    max: int | None
    choices: tuple[str, ...]
    reloadable: bool
    topic_key: str | None
    sensitive: bool
    pattern: str | None = None
    parse: Callable[[Any], Any] | None = None
    shape: str = ""
    """What a structured setting allows, as the docs show it."""

    @property
    def kind(self) -> type:
        return type(self.default)

    def allowed(self) -> str:
        """The allowed values, as error messages and the docs show them."""
        if self.shape:
            return self.shape
        if self.kind is tuple:
            items = _one_of(self.choices) if self.choices else f"strings matching {self.pattern}"
            return f"a list of {self.min}..{self.max} of {items}, each once"
        if self.choices:
            return _one_of(self.choices)
        if self.kind is bool:
            return "true or false"
        if self.kind is int:
            return f"{self.min}..{self.max}"
        return "any string"

    def check(self, value: Any) -> Any:
        """`value` as this setting's type, or ConfigError naming the setting and its range.

        The one validation of every source: TOML, flags, SIGHUP, CreateTopics, topic.meta.
        Strings are parsed (flags and Kafka clients send them); floats and bools are not
        integers even when they look like one."""
        if self.parse is not None:
            return self.parse(value)
        if self.kind is tuple:
            return self._check_list(value)
        if self.kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        elif self.kind is int and isinstance(value, str) and _INTEGER.fullmatch(value):
            value = int(value)
        number: Any = value  # compared only once its type is known to be the setting's
        ok = type(value) is self.kind and (
            (self.min is None or number >= self.min)
            and (self.max is None or number <= self.max)
            and (not self.choices or value in self.choices)
        )
        if not ok:
            shown = repr(value)
            shown = shown if len(shown) <= 80 else shown[:80] + "..."
            expected = ("an integer in " if self.kind is int else "") + self.allowed()
            raise ConfigError(f"setting {self.name}={shown} is invalid: expected {expected}")
        return value

    def _check_list(self, value: Any) -> tuple[str, ...]:
        assert self.min is not None and self.max is not None
        items = tuple(value) if isinstance(value, list | tuple) else None
        ok = (
            items is not None
            and self.min <= len(items) <= self.max
            and len(set(items)) == len(items)
            and all(
                isinstance(item, str)
                and (not self.choices or item in self.choices)
                and (self.pattern is None or re.fullmatch(self.pattern, item) is not None)
                for item in items
            )
        )
        if not ok:
            shown = repr(value)
            shown = shown if len(shown) <= 120 else shown[:120] + "..."
            raise ConfigError(f"setting {self.name}={shown} is invalid: expected {self.allowed()}")
        assert items is not None
        return items


def _one_of(choices: tuple[str, ...]) -> str:
    if len(choices) > 1:
        return ", ".join(choices[:-1]) + " or " + choices[-1]
    return choices[0]


def _setting(
    default: Any,
    doc: str,
    *,
    unit: str = "",
    min: int | None = None,
    max: int | None = None,
    choices: tuple[str, ...] = (),
    reloadable: bool = False,
    topic_key: str | None = None,
    sensitive: bool = False,
    pattern: str | None = None,
    parse: Callable[[Any], Any] | None = None,
    shape: str = "",
) -> Any:
    if isinstance(default, int | tuple) and not isinstance(default, bool) and parse is None:
        assert min is not None and max is not None, "every integer and list setting has bounds"
    meta = {
        "doc": doc,
        "unit": unit,
        "min": min,
        "max": max,
        "choices": choices,
        "reloadable": reloadable,
        "topic_key": topic_key,
        "sensitive": sensitive,
        "pattern": pattern,
        "parse": parse,
        "shape": shape,
    }
    # A sensitive value stays out of the config's repr too, and so out of any traceback.
    return field(default=default, metadata=meta, repr=not sensitive)


LOG_LEVELS = ("debug", "info", "warning", "error")
SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
PRINCIPAL_PATTERN = r"User:[^\x00-\x1f]{1,255}"
HOST_CHARS_MAX = 255  # a DNS name's limit
DEFAULT_LISTENER = "default"
"""The name of the one plaintext listener that `host`/`port` describe."""


@dataclass(frozen=True)
class Listener:
    """One `[[listeners]]` table: where the broker accepts connections and how they
    secure themselves (docs/protocol.md section 7, "Listeners")."""

    name: str
    host: str
    port: int
    security: str = "plaintext"
    advertised_host: str = ""
    """What Metadata answers for this listener; "" = `host`."""
    advertised_port: int = 0
    """The port Metadata answers, where clients reach this listener through a proxy or a
    mapped port (the port of Kafka's advertised.listeners); 0 = the port bound."""
    protocol: str = "minibroker"
    max_connections: int = 0
    """Its own limit on open connections (Kafka's listener.name.X.max.connections); 0:
    only the broker's `max_connections`."""

    @property
    def tls(self) -> bool:
        return self.security in ("tls", "sasl_tls")

    @property
    def sasl(self) -> bool:
        return self.security in ("sasl_plaintext", "sasl_tls")


SECURITY = ("plaintext", "tls", "sasl_plaintext", "sasl_tls")
PROTOCOLS = ("minibroker", "kafka")
"""What a listener speaks: this broker's own protocol, or Apache Kafka's
(docs/kafka-compatibility.md)."""
LISTENER_NAME = re.compile(r"[a-z0-9_]{1,32}")
LISTENERS_MAX = 16
_LISTENER_KEYS = tuple(f.name for f in fields(Listener))
_PORT = range(0, 65536)


def parse_listeners(value: Any) -> tuple[Listener, ...]:
    """`[[listeners]]` as Listener objects (already parsed ones are checked again), or
    ConfigError naming the listener by its place and name and what is wrong."""
    if not isinstance(value, list | tuple) or len(value) > LISTENERS_MAX:
        raise ConfigError(
            f"setting listeners is invalid: expected an array of at most {LISTENERS_MAX} "
            "tables ([[listeners]])"
        )
    out: list[Listener] = []
    names: dict[str, int] = {}
    addresses: dict[tuple[str, int], int] = {}
    for place, raw in enumerate(value, 1):
        entry = vars(raw) if isinstance(raw, Listener) else raw
        where = f"listeners[{place}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} is invalid: expected a table ([[listeners]])")
        name = entry.get("name")
        if isinstance(name, str) and LISTENER_NAME.fullmatch(name):
            where = f"{where} ({name})"
        for key in entry:
            if key not in _LISTENER_KEYS:
                # TOML puts every key after a [[listeners]] header into that table.
                hint = (
                    " (broker settings go before the first [[listeners]] table)"
                    if key in SETTINGS
                    else _did_you_mean(key, _LISTENER_KEYS)
                )
                raise ConfigError(
                    f"{where}: unknown key {key!r}; known: {', '.join(_LISTENER_KEYS)}{hint}"
                )
        for key in ("name", "host", "port"):
            if key not in entry:
                raise ConfigError(f"{where}: missing key {key!r}")
        listener = Listener(**entry)
        if not isinstance(name, str) or not LISTENER_NAME.fullmatch(name):
            raise ConfigError(f"{where}: name={name!r} is invalid: expected [a-z0-9_]{{1,32}}")
        if name in names:
            raise ConfigError(f"{where}: name {name!r} is taken by listeners[{names[name]}]")
        names[name] = place
        for key in ("host", "advertised_host"):
            text = getattr(listener, key)
            if not isinstance(text, str) or len(text) > HOST_CHARS_MAX:
                raise ConfigError(
                    f"{where}: {key}={text!r} is invalid: expected a string of at most "
                    f"{HOST_CHARS_MAX} characters"
                )
        for key in ("port", "advertised_port"):
            number = getattr(listener, key)
            if type(number) is not int or number not in _PORT:
                raise ConfigError(
                    f"{where}: {key}={number!r} is invalid: expected an integer in 0..65535"
                )
        port = listener.port
        if listener.security not in SECURITY:
            raise ConfigError(
                f"{where}: security={listener.security!r} is invalid: expected {_one_of(SECURITY)}"
            )
        limit = listener.max_connections
        if type(limit) is not int or not 0 <= limit <= INT32_MAX:
            raise ConfigError(
                f"{where}: max_connections={limit!r} is invalid: expected an integer in "
                f"0..{INT32_MAX} (0: only the broker's max_connections)"
            )
        if listener.protocol not in PROTOCOLS:
            raise ConfigError(
                f"{where}: protocol={listener.protocol!r} is invalid: expected {_one_of(PROTOCOLS)}"
            )
        if port:  # port 0 picks a free port each time: never a clash
            address = (listener.host, port)
            if address in addresses:
                raise ConfigError(
                    f"{where}: {listener.host}:{port} is taken by listeners[{addresses[address]}]"
                )
            addresses[address] = place
        out.append(listener)
    return tuple(out)


BASIC_AUTH_USERS_MAX = 100
BCRYPT_COST_MIN, BCRYPT_COST_MAX = 4, 31
# Modular crypt format: $2b$ (or the older $2a$, $2y$), the cost, 22 characters of salt
# and 31 of hash in bcrypt's base64 alphabet.
_BCRYPT_HASH = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")
_BASIC_AUTH_USER = re.compile(r"[^\x00-\x20:\x7f]{1,255}")


def parse_basic_auth_users(value: Any) -> tuple[tuple[str, str], ...]:
    """`metrics_basic_auth_users` as sorted (user, bcrypt hash) pairs, from the TOML table
    (or the pairs already parsed), or ConfigError naming the user and what is wrong. The
    message never shows a hash: it is not the password, but it is what a password
    guesser wants."""
    pairs = list(value.items()) if isinstance(value, Mapping) else value
    if not isinstance(pairs, list | tuple) or len(pairs) > BASIC_AUTH_USERS_MAX:
        raise ConfigError(
            "setting metrics_basic_auth_users is invalid: expected a table of at most "
            f"{BASIC_AUTH_USERS_MAX} user = bcrypt hash pairs, e.g. "
            'metrics_basic_auth_users = { prometheus = "$2b$12$..." }'
        )
    out: dict[str, str] = {}
    for pair in pairs:
        if not (isinstance(pair, list | tuple) and len(pair) == 2):
            raise ConfigError("setting metrics_basic_auth_users is invalid: expected a table")
        user, hashed = pair
        if not isinstance(user, str) or not _BASIC_AUTH_USER.fullmatch(user) or user in out:
            raise ConfigError(
                f"setting metrics_basic_auth_users: user {str(user)[:80]!r} is invalid: "
                "expected 1..255 visible characters without ':' or spaces, each user once"
            )
        cost = _BCRYPT_HASH.fullmatch(hashed) if isinstance(hashed, str) else None
        if cost is None or not BCRYPT_COST_MIN <= int(cost.group(1)) <= BCRYPT_COST_MAX:
            raise ConfigError(
                f"setting metrics_basic_auth_users: the hash of user {user!r} is not a bcrypt "
                f"hash of cost {BCRYPT_COST_MIN}..{BCRYPT_COST_MAX} ($2b$12$ and 53 "
                "characters); make one with htpasswd -nBC 12 USER, or python -c 'import "
                "bcrypt, getpass; print(bcrypt.hashpw(getpass.getpass().encode(), "
                "bcrypt.gensalt()).decode())'"
            )
        out[user] = hashed
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class BrokerConfig:
    """Every broker setting, declared once; SETTINGS, the CLI, topic overrides, LogConfig
    and docs/configuration.md all derive from these declarations."""

    host: str = _setting(
        "127.0.0.1",
        "Address the listener (minibroker's protocol) binds, when `listeners` is empty.",
    )
    port: int = _setting(
        9092,
        "Listener port, when `listeners` is empty; 0 picks a free one (logged at start).",
        min=0,
        max=65535,
    )
    listeners: tuple[Listener, ...] = _setting(
        (),
        "`[[listeners]]` tables, each with `name`, `host`, `port`, `security` and optionally "
        "`advertised_host`, `advertised_port`, `protocol` and `max_connections` "
        '(operations.md, "Listeners"); '
        "empty: one plaintext listener at `host`:`port` (with listeners, leave those two "
        "unset).",
        parse=parse_listeners,
        shape=f"up to {LISTENERS_MAX} tables: name [a-z0-9_]{{1,32}}, unique; security "
        f"{_one_of(SECURITY)}; protocol {_one_of(PROTOCOLS)}; max_connections "
        f"0..{INT32_MAX}",
    )
    tls_certfile: str = _setting(
        "",
        "The broker's certificate chain (PEM) for `tls` and `sasl_tls` listeners; "
        "SIGHUP re-reads it for new handshakes.",
        reloadable=True,
    )
    tls_keyfile: str = _setting(
        "", "The private key (PEM, unencrypted) of `tls_certfile`.", reloadable=True
    )
    tls_cafile: str = _setting(
        "",
        "CA bundle (PEM) that client certificates must chain to; needed when "
        "`tls_client_auth` is not `none`.",
        reloadable=True,
    )
    tls_client_auth: str = _setting(
        "none",
        "Client certificates (mTLS): `none` asks for none, `requested` checks one when "
        "sent, `required` ends the handshake without one.",
        choices=("none", "requested", "required"),
        reloadable=True,
    )
    tls_handshake_timeout_ms: int = _setting(
        10_000,
        "A TLS handshake not finished within this long closes the connection.",
        unit="ms",
        min=1,
        max=INT32_MAX,
    )
    sasl_mechanisms: tuple[str, ...] = _setting(
        ("SCRAM-SHA-256", "SCRAM-SHA-512"),
        "Mechanisms `sasl_*` listeners accept; PLAIN is on only when named here.",
        min=1,
        max=len(SASL_MECHANISMS),
        choices=SASL_MECHANISMS,
        reloadable=True,
    )
    allow_plain_without_tls: bool = _setting(
        False,
        "Accept PLAIN (a password in clear) on `sasl_plaintext` listeners.",
        reloadable=True,
    )
    connections_max_reauth_ms: int = _setting(
        0,
        "Lifetime of a SASL session: the client authenticates again before it ends, else "
        "its next request closes the connection (0: sessions do not expire).",
        unit="ms",
        min=0,
        max=INT32_MAX,
        reloadable=True,
    )
    sasl_server_max_receive_bytes: int = _setting(
        512 * 1024,
        "Largest frame a connection on a `sasl_*` listener may send before it has "
        "authenticated; a larger declared length closes it at once (Kafka's "
        "sasl.server.max.receive.size).",
        unit="bytes",
        min=1024,
        max=1 << 30,
    )
    authentication_failure_delay_ms: int = _setting(
        100,
        "A failed authentication is answered after this long, then the connection closes "
        "(slows password guessing).",
        unit="ms",
        min=0,
        max=60_000,
        reloadable=True,
    )
    authorizer: bool = _setting(
        False, 'Decide every request by the ACLs (protocol.md section 7, "Authorization").'
    )
    super_users: tuple[str, ...] = _setting(
        (),
        'Principals allowed everything when `authorizer` is on, e.g. `["User:admin"]`.',
        min=0,
        max=1000,
        pattern=PRINCIPAL_PATTERN,
        shape="a list of up to 1000 principals `User:<name>`, each once",
        reloadable=True,
    )
    acls_max: int = _setting(
        100_000,
        "ACL bindings in force at most; a CreateAcls beyond it answers POLICY_VIOLATION(44).",
        min=1,
        max=1_000_000,
    )
    data_dir: str = _setting("./data", "Directory holding topics, logs and producer state.")
    backend: str = _setting(
        "trio", "AnyIO backend: `trio`, or `asyncio` (runs on uvloop).", choices=("trio", "asyncio")
    )
    log_level: str = _setting(
        "info", "How much the broker logs.", choices=LOG_LEVELS, reloadable=True
    )
    log_format: str = _setting(
        "text", "`text` (logfmt) or `json`, one line per event.", choices=("text", "json")
    )
    metrics_host: str = _setting("127.0.0.1", "Address of the /metrics, /healthz, /readyz server.")
    metrics_port: int = _setting(
        9644, "Port of the metrics server; 0 picks one, -1 disables it.", min=-1, max=65535
    )
    metrics_tls_certfile: str = _setting(
        "",
        "Certificate chain (PEM) of the metrics server: with `metrics_tls_keyfile` it "
        "serves HTTPS only; SIGHUP re-reads both files for new connections.",
    )
    metrics_tls_keyfile: str = _setting(
        "", "The private key (PEM, unencrypted) of `metrics_tls_certfile`."
    )
    metrics_basic_auth_users: tuple[tuple[str, str], ...] = _setting(
        (),
        "Users allowed to scrape /metrics, as a TOML table of user = bcrypt hash "
        "(Prometheus's `basic_auth_users`); empty: /metrics needs no credentials. "
        "/healthz and /readyz never do.",
        parse=parse_basic_auth_users,
        sensitive=True,
        shape=f"a table of up to {BASIC_AUTH_USERS_MAX} user = bcrypt hash ($2b$, cost "
        f"{BCRYPT_COST_MIN}..{BCRYPT_COST_MAX})",
    )
    pid_file: str = _setting("", "Write the process id here while running (empty: none).")
    max_frame_bytes: int = _setting(
        16 * 1024 * 1024,
        "Largest frame accepted; a larger declared length closes the connection.",
        unit="bytes",
        min=1024,
        max=1 << 30,
    )
    message_max_bytes: int = _setting(
        1024 * 1024,
        "Largest record batch accepted (MESSAGE_TOO_LARGE above it); at most max_frame_bytes.",
        unit="bytes",
        min=1,
        max=1 << 30,
    )
    fetch_zero_copy: bool = _setting(
        True,
        "On the trio backend, send fetched batches from the log file with os.sendfile "
        "(asyncio buffers writes in its transport, so it always copies).",
    )
    fetch_max_bytes: int = _setting(
        55 * 1024 * 1024,
        "Cap on the record bytes one Fetch response carries, whatever its `max_bytes` "
        "(one first batch larger than that goes whole); Kafka's fetch.max.bytes.",
        unit="bytes",
        min=1,
        max=INT32_MAX,
    )
    max_connections: int = _setting(
        1000,
        "Open client connections; at the limit the oldest connection not yet "
        "authenticated is closed to make room, else the new one is.",
        min=1,
        max=INT32_MAX,
    )
    max_connections_per_ip: int = _setting(
        INT32_MAX,
        "Open connections from one client address; further ones are closed (Kafka's "
        "max.connections.per.ip).",
        min=1,
        max=INT32_MAX,
    )
    max_connections_per_ip_overrides: tuple[str, ...] = _setting(
        (),
        'Per address, a limit in place of `max_connections_per_ip`, as `"ADDRESS:COUNT"` '
        "(Kafka's max.connections.per.ip.overrides).",
        min=0,
        max=1000,
        pattern=r"[^\s]{1,255}:[0-9]{1,9}",
        shape='a list of up to 1000 `"ADDRESS:COUNT"`, each once',
    )
    sasl_authentication_timeout_ms: int = _setting(
        30_000,
        "A connection on a `sasl_*` listener that has not authenticated this long after "
        "it was accepted is closed, whatever it sends meanwhile.",
        unit="ms",
        min=1,
        max=INT32_MAX,
    )
    max_authenticating_connections: int = _setting(
        16,
        "Per listener, connections not yet authenticated whose TLS handshake or SASL "
        "exchange runs at once; the others wait their turn, so a storm of logins delays "
        "authenticated clients by at most this many steps.",
        min=1,
        max=INT32_MAX,
    )
    authentication_turn_ms: int = _setting(
        200,
        "A turn among `max_authenticating_connections` lasts this long: past it, the "
        "first connection waiting takes it and the holder waits again at its next step, "
        "so slow or idle connections cannot keep logins out.",
        unit="ms",
        min=1,
        max=INT32_MAX,
    )
    max_inflight_requests_per_connection: int = _setting(
        256,
        "Pipelined requests read ahead of their responses before reading pauses.",
        min=1,
        max=INT32_MAX,
    )
    queued_max_response_bytes: int = _setting(
        16 * 1024 * 1024,
        "Per connection, bytes of answers built but not yet sent before reading pauses "
        "(one answer may exceed it; Kafka's queued.max.request.bytes for answers).",
        unit="bytes",
        min=1024,
        max=INT32_MAX,
    )
    read_ahead_max_bytes: int = _setting(
        2 * 1024 * 1024,
        "On the asyncio backend, per connection, bytes the transport reads ahead of the "
        "broker before it pauses reading (memory each connection may hold); the broker "
        "takes up to 2 MiB of them per read, so a pipelining client costs less per "
        "request (trio reads the socket directly).",
        unit="bytes",
        min=64 * 1024,
        max=INT32_MAX,
    )
    max_entries_per_request: int = _setting(
        10_000,
        "Topics and partitions one request may name; more is INVALID_REQUEST.",
        min=1,
        max=INT32_MAX,
    )
    request_timeout_ms: int = _setting(
        30_000,
        "Upper bound on a Produce's timeout_ms and a Fetch's max_wait_ms.",
        unit="ms",
        min=1,
        max=INT32_MAX,
    )
    connections_max_idle_ms: int = _setting(
        600_000,
        "A connection that sends no request for this long is closed.",
        unit="ms",
        min=1,
        max=INT32_MAX,
    )
    segment_bytes: int = _setting(
        1024 * 1024 * 1024,
        "Roll a segment at this size (file positions are 32-bit in the index).",
        unit="bytes",
        min=1024,
        max=INT32_MAX,
        topic_key="segment.bytes",
    )
    segment_ms: int = _setting(
        7 * DAY_MS,
        "Roll a segment this long after its first append.",
        unit="ms",
        min=1,
        max=INT64_MAX,
        topic_key="segment.ms",
    )
    request_receive_timeout_ms: int = _setting(
        30_000,
        "A request begun must arrive whole within this long, else the connection closes.",
        unit="ms",
        min=1,
        max=INT32_MAX,
    )
    retention_bytes: int = _setting(
        -1,
        "Delete oldest segments past this partition size (-1: no limit).",
        unit="bytes",
        min=-1,
        max=INT64_MAX,
        reloadable=True,
        topic_key="retention.bytes",
    )
    retention_ms: int = _setting(
        7 * DAY_MS,
        "Delete segments whose newest record is older (-1: keep forever).",
        unit="ms",
        min=-1,
        max=INT64_MAX,
        reloadable=True,
        topic_key="retention.ms",
    )
    retention_check_interval_ms: int = _setting(
        300_000,
        "How often retention and producer expiry run.",
        unit="ms",
        min=1,
        max=INT32_MAX,
    )
    index_interval_bytes: int = _setting(
        4096,
        "Bytes of log between sparse index entries (0: an entry per batch).",
        unit="bytes",
        min=0,
        max=INT32_MAX,
        topic_key="index.interval.bytes",
    )
    segment_index_bytes: int = _setting(
        10 * 1024 * 1024,
        "Largest offset index of a segment; a full index rolls the segment. "
        "At least one time-index entry (16 bytes).",
        unit="bytes",
        min=16,
        max=INT32_MAX,
        topic_key="segment.index.bytes",
    )
    producer_id_expiration_ms: int = _setting(
        DAY_MS,
        "Forget a producer idle this long on a partition.",
        unit="ms",
        min=1,
        max=INT64_MAX,
        reloadable=True,
    )
    max_producers_per_partition: int = _setting(
        100_000,
        "Producer ids remembered per partition; the least recently used is evicted.",
        min=1,
        max=INT32_MAX,
    )
    transaction_max_timeout_ms: int = _setting(
        15 * 60_000,
        "Largest transaction_timeout_ms a producer may ask for (Kafka's "
        "transaction.max.timeout.ms).",
        unit="ms",
        min=1,
        max=INT32_MAX,
        reloadable=True,
    )
    transaction_max_prepared_ms: int = _setting(
        DAY_MS,
        "Largest prepared_timeout_ms of a PrepareTxn: how long a prepared transaction may "
        "wait for its decision.",
        unit="ms",
        min=1,
        max=INT64_MAX,
        reloadable=True,
    )
    transactional_id_expiration_ms: int = _setting(
        7 * DAY_MS,
        "Forget a transactional id whose last transaction ended this long ago.",
        unit="ms",
        min=1,
        max=INT64_MAX,
        reloadable=True,
    )
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = _setting(
        10_000,
        "How often the coordinator looks for transactions past their deadline.",
        unit="ms",
        min=10,
        max=INT32_MAX,
    )
    log_summary_interval_ms: int = _setting(
        60_000,
        "How often (and at the stop) the broker logs one INFO line counting the transactions "
        "committed and aborted since the last one, if any; each one's own line is DEBUG.",
        unit="ms",
        min=1000,
        max=INT32_MAX,
        reloadable=True,
    )
    max_transactional_ids: int = _setting(
        1_000_000,
        "Transactional ids held; a new id beyond this evicts the least recently used ended "
        "one, or is refused with CONCURRENT_TRANSACTIONS when every id is open.",
        min=1,
        max=INT32_MAX,
    )
    max_partitions_per_transaction: int = _setting(
        10_000,
        "Partitions one transaction may write to; a batch for one more is INVALID_TXN_STATE.",
        min=1,
        max=INT32_MAX,
    )
    transaction_log_max_bytes: int = _setting(
        64 * 1024 * 1024,
        "The transaction log is compacted into one snapshot record when it grows past this "
        "(and past twice its last compacted size).",
        unit="bytes",
        min=4096,
        max=INT64_MAX,
    )
    group_session_timeout_ms: int = _setting(
        45_000,
        "A group member with no heartbeat for this long is removed and its partitions "
        "reassigned (Kafka's group.consumer.session.timeout.ms).",
        unit="ms",
        min=100,
        max=3_600_000,
    )
    group_heartbeat_interval_ms: int = _setting(
        5_000,
        "How often members are told to heartbeat; below group_session_timeout_ms "
        "(Kafka's group.consumer.heartbeat.interval.ms).",
        unit="ms",
        min=10,
        max=3_600_000,
    )
    group_max_rebalance_timeout_ms: int = _setting(
        1_800_000,
        "Largest rebalance_timeout_ms a member may ask for: how long it may keep "
        "partitions it was told to give up (INVALID_REQUEST above it).",
        unit="ms",
        min=1,
        max=INT32_MAX,
    )
    group_max_size: int = _setting(
        200,
        "Members per consumer group; one more is GROUP_MAX_SIZE_REACHED "
        "(Kafka's group.consumer.max.size).",
        min=1,
        max=10_000,
    )
    group_initial_rebalance_delay_ms: int = _setting(
        3_000,
        "How long a classic group's first rebalance waits for more members to join, "
        "each new one waiting again, up to the rebalance timeout (Kafka's "
        "group.initial.rebalance.delay.ms).",
        unit="ms",
        min=0,
        max=300_000,
    )
    group_min_session_timeout_ms: int = _setting(
        6_000,
        "Shortest session a classic group member (a Kafka client's JoinGroup) may ask "
        "for; below it is INVALID_SESSION_TIMEOUT (Kafka's group.min.session.timeout.ms).",
        unit="ms",
        min=1,
        max=3_600_000,
    )
    group_max_session_timeout_ms: int = _setting(
        1_800_000,
        "Longest session a classic group member may ask for; above it is "
        "INVALID_SESSION_TIMEOUT (Kafka's group.max.session.timeout.ms).",
        unit="ms",
        min=1,
        max=3_600_000,
    )
    max_groups: int = _setting(
        10_000,
        "Consumer groups with members the broker holds; a join that would start one more "
        "is POLICY_VIOLATION.",
        min=1,
        max=1_000_000,
    )
    offsets_retention_ms: int = _setting(
        7 * DAY_MS,
        "Committed offsets of a group with no members are deleted this long after the later of "
        "their commit and the group becoming empty (Kafka's offsets.retention.minutes).",
        unit="ms",
        min=1,
        max=INT64_MAX,
        reloadable=True,
    )
    offsets_retention_check_interval_ms: int = _setting(
        600_000,
        "How often groups are looked at for expired offsets and for members that came or "
        "went (Kafka's offsets.retention.check.interval.ms).",
        unit="ms",
        min=10,
        max=INT32_MAX,
    )
    max_committed_offsets: int = _setting(
        1_000_000,
        "Committed and pending transactional offsets held over all groups; committing a "
        "partition a group does not hold yet beyond this is POLICY_VIOLATION.",
        min=1,
        max=INT32_MAX,
        reloadable=True,
    )
    offsets_log_max_bytes: int = _setting(
        64 * 1024 * 1024,
        "The committed-offsets log is compacted into one record per group when it grows past "
        "this (and past twice its last compacted size).",
        unit="bytes",
        min=4096,
        max=INT64_MAX,
    )
    max_consumer_lag_series: int = _setting(
        10_000,
        "Consumer-lag series (group, topic, partition) /metrics shows, whole groups in name "
        "order; the rest are counted in minibroker_consumer_group_lag_series_omitted.",
        min=0,
        max=INT32_MAX,
        reloadable=True,
    )
    auto_create_topics: bool = _setting(True, "Create a topic on Metadata with allow_auto_create.")
    default_partitions: int = _setting(
        1, "Partitions of an auto-created topic.", min=1, max=PARTITIONS_MAX
    )
    shutdown_timeout_ms: int = _setting(
        10_000,
        "SIGTERM: time allowed to finish in-flight requests before closing.",
        unit="ms",
        min=0,
        max=INT32_MAX,
    )

    def validate(self) -> BrokerConfig:
        """Check every setting against its declaration; raise ConfigError naming the key."""
        for name, setting in SETTINGS.items():
            setting.check(getattr(self, name))
        # The rules between two settings: a batch must fit in a frame.
        if self.message_max_bytes > self.max_frame_bytes:
            raise ConfigError(
                f"setting message_max_bytes={self.message_max_bytes} is invalid: expected "
                f"at most max_frame_bytes ({self.max_frame_bytes})"
            )
        # A member heartbeating as told must not outlive its session.
        if self.group_heartbeat_interval_ms >= self.group_session_timeout_ms:
            raise ConfigError(
                f"setting group_heartbeat_interval_ms={self.group_heartbeat_interval_ms} is "
                f"invalid: expected less than group_session_timeout_ms "
                f"({self.group_session_timeout_ms})"
            )
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ConfigError(
                f"setting group_min_session_timeout_ms={self.group_min_session_timeout_ms} is "
                f"invalid: expected at most group_max_session_timeout_ms "
                f"({self.group_max_session_timeout_ms})"
            )
        self._validate_security()
        return self

    def _validate_security(self) -> None:
        """The rules between the listeners and the security settings."""
        if self.listeners and (self.host, self.port) != (
            SETTINGS["host"].default,
            SETTINGS["port"].default,
        ):
            raise ConfigError(
                "settings host and port describe the one listener of a broker without "
                "[[listeners]]: set either them or [[listeners]], not both"
            )
        tls = [listener.name for listener in self.listeners if listener.tls]
        if tls and not (self.tls_certfile and self.tls_keyfile):
            raise ConfigError(f"listener {tls[0]!r} uses TLS: set tls_certfile and tls_keyfile")
        if bool(self.metrics_tls_certfile) != bool(self.metrics_tls_keyfile):
            raise ConfigError(
                "settings metrics_tls_certfile and metrics_tls_keyfile go together: set both "
                "(the metrics server speaks HTTPS) or neither"
            )
        if self.tls_client_auth != "none" and not self.tls_cafile:
            raise ConfigError(
                f"setting tls_client_auth={self.tls_client_auth!r} needs tls_cafile, the CA "
                "bundle client certificates are checked against"
            )

    def effective_listeners(self) -> tuple[Listener, ...]:
        """The listeners served: `listeners`, or the one plaintext listener of host:port."""
        if self.listeners:
            return self.listeners
        return (Listener(DEFAULT_LISTENER, self.host, self.port),)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    def with_overrides(self, overrides: dict[str, Any]) -> BrokerConfig:
        return replace(self, **coerce(overrides)).validate()


SETTINGS: dict[str, Setting] = {
    f.name: Setting(name=f.name, default=f.default, **f.metadata) for f in fields(BrokerConfig)
}
RELOADABLE = frozenset(name for name, s in SETTINGS.items() if s.reloadable)
# Kafka's dotted name -> the setting a topic may override.
TOPIC_SETTINGS: dict[str, Setting] = {
    s.topic_key: s for s in SETTINGS.values() if s.topic_key is not None
}
_TOPIC_SETTINGS_BY_NAME = {s.name: s for s in TOPIC_SETTINGS.values()}


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known name `word` most likely misspells (difflib's closest match), if any: what
    a message about an unknown setting, flag or command suggests."""
    matches = difflib.get_close_matches(word, list(known), n=1)
    return matches[0] if matches else None


def _did_you_mean(word: str, known: Iterable[str]) -> str:
    match = closest(word, known)
    return f"; did you mean {match!r}?" if match else ""


def coerce(values: Mapping[str, Any]) -> dict[str, Any]:
    """Check raw values (TOML or CLI) against the table; unknown keys are errors."""
    out: dict[str, Any] = {}
    for raw_key, value in values.items():
        name = raw_key.replace("-", "_").replace(".", "_")
        setting = SETTINGS.get(name)
        if setting is None:
            raise ConfigError(f"unknown setting {raw_key!r}{_did_you_mean(name, SETTINGS)}")
        out[setting.name] = setting.check(value)
    return out


def topic_setting(key: str) -> Setting:
    """The setting a topic config key names: Kafka's dotted name (`retention.ms`) or ours
    (`retention_ms`); ConfigError naming the key when no topic may override it."""
    setting = TOPIC_SETTINGS.get(key) or _TOPIC_SETTINGS_BY_NAME.get(key)
    if setting is None:
        # Suggested in the spelling the key was written in: Kafka's dotted or ours.
        known = _TOPIC_SETTINGS_BY_NAME if "_" in key else TOPIC_SETTINGS
        raise ConfigError(
            f"unknown topic config {key!r}{_did_you_mean(key, known)} "
            f"(known: {', '.join(TOPIC_SETTINGS)})"
        )
    return setting


def topic_overrides(config: Mapping[Any, Any] | None) -> dict[str, int]:
    """A topic's config (CreateTopics or topic.meta) as checked overrides by setting name.

    Kafka's dotted names (`retention.ms`) and ours (`retention_ms`) are both accepted."""
    out: dict[str, int] = {}
    for raw_key, value in (config or {}).items():
        setting = topic_setting(raw_key)
        out[setting.name] = _checked_override(raw_key, setting, value)
    return out


def _checked_override(key: str, setting: Setting, value: Any) -> int:
    try:
        checked: int = setting.check(value)
    except ConfigError as exc:
        raise ConfigError(f"topic config {key!r}: {exc}") from None
    return checked


class SettingNamedTwice(ConfigError):
    """One alteration names a setting under both its names (`retention.ms`, `retention_ms`)."""


def altered_overrides(
    overrides: Mapping[str, int], ops: Sequence[tuple[str, str, Any]]
) -> dict[str, int]:
    """A topic's overrides after IncrementalAlterConfigs' `ops`, each (key, "set" or
    "delete", value): a set checks the value as CreateTopics' config is checked, a
    delete drops the override (the broker's value applies again; none is no change).

    ConfigError naming the first key that is not a topic setting or whose value is
    out of bounds, SettingNamedTwice for a setting named twice; `overrides` is never
    changed, so a refused alteration changes nothing."""
    out = dict(overrides)
    named: dict[str, str] = {}
    for key, op, value in ops:
        setting = topic_setting(key)
        if setting.name in named:
            raise SettingNamedTwice(f"{named[setting.name]!r} and {key!r} name one setting")
        named[setting.name] = key
        if op == "set":
            out[setting.name] = _checked_override(key, setting, value)
        else:
            out.pop(setting.name, None)
    return out


SOURCE_DEFAULT = "default"
SOURCE_BROKER = "broker"
SOURCE_TOPIC = "topic"


class Described(NamedTuple):
    """One setting as DescribeConfigs answers it (docs/protocol.md section 4)."""

    name: str
    value: str | None
    source: str
    read_only: bool
    sensitive: bool


def describe_broker(config: BrokerConfig) -> list[Described]:
    """Every broker setting under its settings-file name. `read_only` is Kafka's: true
    unless the setting changes while the broker runs (the reloadable ones, on SIGHUP);
    the source is "broker" when the broker's value is not the declared default."""
    return [
        _described(s.name, s, getattr(config, s.name), _broker_source(config, s), not s.reloadable)
        for s in SETTINGS.values()
    ]


def describe_topic(config: BrokerConfig, overrides: Mapping[str, int]) -> list[Described]:
    """Every setting a topic may override, under Kafka's dotted name (what CreateTopics'
    config takes): the topic's override, else the broker's value. None is read-only:
    IncrementalAlterConfigs changes them."""
    out = []
    for key, s in TOPIC_SETTINGS.items():
        if s.name in overrides:
            out.append(_described(key, s, overrides[s.name], SOURCE_TOPIC, False))
        else:
            value = getattr(config, s.name)
            out.append(_described(key, s, value, _broker_source(config, s), False))
    return out


def _broker_source(config: BrokerConfig, setting: Setting) -> str:
    return SOURCE_DEFAULT if getattr(config, setting.name) == setting.default else SOURCE_BROKER


def _described(name: str, s: Setting, value: Any, source: str, read_only: bool) -> Described:
    shown = None if s.sensitive else _shown(value)
    return Described(name, shown, source, read_only, s.sensitive)


def _shown(value: Any) -> str:
    """A setting's value as text, as the TOML file would spell it (`true`, not `True`); a
    list comma-separated, a listener as Kafka writes one (`NAME:SECURITY://HOST:PORT`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(_shown(item) for item in value)
    if isinstance(value, Listener):
        return f"{value.name}:{value.security}://{value.host}:{value.port}"
    return str(value)


def load(path: str | Path | None, overrides: dict[str, Any] | None = None) -> BrokerConfig:
    """Defaults, then the TOML file (if any), then explicit overrides (CLI flags). An
    error in the file, or in the settings as a whole, names the file."""
    values: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:
                values.update(tomllib.load(f))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    coerce(overrides or {})  # a bad flag is the command line's, not the file's
    try:
        coerce(values)
        return BrokerConfig().with_overrides(values | (overrides or {}))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}" if path else str(exc)) from None


def markdown_table() -> str:
    """The settings table as docs/configuration.md shows it."""
    rows = [
        "| key | default | allowed | unit | topic override | reloadable (SIGHUP) | meaning |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in SETTINGS.values():
        default = s.default
        if isinstance(default, tuple):
            shown = "[" + ", ".join(f'"{item}"' for item in default) + "]"
        else:
            shown = "true" if default is True else "false" if default is False else repr(default)
        topic = f"`{s.topic_key}`" if s.topic_key else ""
        rows.append(
            f"| `{s.name}` | `{shown}` | {s.allowed()} | {s.unit} | {topic} "
            f"| {'yes' if s.reloadable else ''} | {s.doc} |"
        )
    return "\n".join(rows)
