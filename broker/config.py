"""Broker settings: one table that drives the TOML file, the CLI flags and the docs.

Every setting has a limit-style name with its unit last (`segment_bytes`,
`retention_ms`) so a config file reads unambiguously. `SETTINGS` is the single
source; docs/configuration.md is checked against it by a test.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

DAY_MS = 24 * 3600 * 1000


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the key."""


def _setting(default: Any, doc: str, *, reloadable: bool = False) -> Any:
    return field(default=default, metadata={"doc": doc, "reloadable": reloadable})


@dataclass(frozen=True)
class BrokerConfig:
    host: str = _setting("127.0.0.1", "Address the Kafka-protocol listener binds.")
    port: int = _setting(9092, "Listener port; 0 picks a free one (logged at start).")
    data_dir: str = _setting("./data", "Directory holding topics, logs and producer state.")
    backend: str = _setting("trio", "AnyIO backend: `trio`, or `asyncio` (runs on uvloop).")
    log_level: str = _setting("info", "debug, info, warning or error.", reloadable=True)
    log_format: str = _setting("text", "`text` (logfmt) or `json`, one line per event.")
    metrics_host: str = _setting("127.0.0.1", "Address of the /metrics, /healthz, /readyz server.")
    metrics_port: int = _setting(9644, "Port of the metrics server; 0 picks one, -1 disables it.")
    pid_file: str = _setting("", "Write the process id here while running (empty: none).")
    max_frame_bytes: int = _setting(
        16 * 1024 * 1024, "Largest frame accepted; a larger declared length closes the connection."
    )
    message_max_bytes: int = _setting(
        1024 * 1024, "Largest record batch accepted (MESSAGE_TOO_LARGE above it)."
    )
    fetch_zero_copy: bool = _setting(
        True,
        "On the trio backend, send fetched batches from the log file with os.sendfile "
        "(asyncio buffers writes in its transport, so it always copies).",
    )
    fetch_max_bytes: int = _setting(
        50 * 1024 * 1024, "Cap on the bytes one Fetch response carries."
    )
    max_connections: int = _setting(1000, "Open client connections; further ones are closed.")
    max_inflight_requests_per_connection: int = _setting(
        256, "Pipelined requests read ahead of their responses before reading pauses."
    )
    max_unsent_response_bytes_per_connection: int = _setting(
        16 * 1024 * 1024,
        "Bytes of answers built but not yet sent before reading pauses (one answer may exceed it).",
    )
    max_entries_per_request: int = _setting(
        10_000, "Topics and partitions one request may name; more is INVALID_REQUEST."
    )
    request_timeout_ms: int = _setting(
        30_000, "Upper bound on a Produce's timeout_ms and a Fetch's max_wait_ms."
    )
    connections_max_idle_ms: int = _setting(
        600_000, "A connection that sends no request for this long is closed."
    )
    request_receive_timeout_ms: int = _setting(
        30_000, "A request begun must arrive whole within this long, else the connection closes."
    )
    segment_bytes: int = _setting(1024 * 1024 * 1024, "Roll a segment at this size.")
    segment_ms: int = _setting(7 * DAY_MS, "Roll a segment this long after its first append.")
    retention_bytes: int = _setting(
        -1, "Delete oldest segments past this partition size (-1: no limit).", reloadable=True
    )
    retention_ms: int = _setting(
        7 * DAY_MS,
        "Delete segments whose newest record is older (-1: keep forever).",
        reloadable=True,
    )
    retention_check_interval_ms: int = _setting(
        300_000, "How often retention and producer expiry run."
    )
    index_interval_bytes: int = _setting(4096, "Bytes of log between sparse index entries.")
    segment_index_bytes: int = _setting(
        10 * 1024 * 1024, "Largest offset index of a segment; a full index rolls the segment."
    )
    producer_id_expiration_ms: int = _setting(
        DAY_MS, "Forget a producer idle this long on a partition.", reloadable=True
    )
    max_producers_per_partition: int = _setting(
        100_000, "Producer ids remembered per partition; the least recently used is evicted."
    )
    auto_create_topics: bool = _setting(True, "Create a topic on Metadata with allow_auto_create.")
    default_partitions: int = _setting(1, "Partitions of an auto-created topic.")
    shutdown_timeout_ms: int = _setting(
        10_000, "SIGTERM: time allowed to finish in-flight requests before closing."
    )

    def validate(self) -> BrokerConfig:
        """Check ranges and choices; raise ConfigError naming the key."""
        checks: list[tuple[str, bool, str]] = [
            ("backend", self.backend in ("trio", "asyncio"), "trio or asyncio"),
            ("log_level", self.log_level in LOG_LEVELS, ", ".join(LOG_LEVELS)),
            ("log_format", self.log_format in ("text", "json"), "text or json"),
            ("port", 0 <= self.port <= 65535, "0..65535"),
            ("metrics_port", -1 <= self.metrics_port <= 65535, "-1..65535"),
            ("max_frame_bytes", 1024 <= self.max_frame_bytes <= 1 << 30, "1 KiB..1 GiB"),
            (
                "message_max_bytes",
                0 < self.message_max_bytes <= self.max_frame_bytes,
                "1..max_frame_bytes",
            ),
            ("max_connections", self.max_connections >= 1, ">= 1"),
            (
                "max_inflight_requests_per_connection",
                self.max_inflight_requests_per_connection >= 1,
                ">= 1",
            ),
            (
                "max_unsent_response_bytes_per_connection",
                self.max_unsent_response_bytes_per_connection >= 1,
                ">= 1",
            ),
            ("segment_bytes", 1024 <= self.segment_bytes <= 2**31 - 1, "1024..2147483647"),
            ("segment_ms", self.segment_ms >= 1, ">= 1"),
            ("retention_bytes", self.retention_bytes >= -1, ">= -1"),
            ("retention_ms", self.retention_ms >= -1, ">= -1"),
            ("index_interval_bytes", self.index_interval_bytes >= 1, ">= 1"),
            ("segment_index_bytes", self.segment_index_bytes >= 64, ">= 64"),
            ("producer_id_expiration_ms", self.producer_id_expiration_ms >= 1, ">= 1"),
            ("max_producers_per_partition", self.max_producers_per_partition >= 1, ">= 1"),
            ("default_partitions", self.default_partitions >= 1, ">= 1"),
            ("max_entries_per_request", self.max_entries_per_request >= 1, ">= 1"),
            ("request_timeout_ms", self.request_timeout_ms >= 1, ">= 1"),
            ("request_receive_timeout_ms", self.request_receive_timeout_ms >= 1, ">= 1"),
            ("shutdown_timeout_ms", self.shutdown_timeout_ms >= 0, ">= 0"),
        ]
        for key, ok, expected in checks:
            if not ok:
                raise ConfigError(
                    f"setting {key}={getattr(self, key)!r} is invalid: expected {expected}"
                )
        return self

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    def with_overrides(self, overrides: dict[str, Any]) -> BrokerConfig:
        return replace(self, **coerce(overrides)).validate()


LOG_LEVELS = ("debug", "info", "warning", "error")
SETTINGS = {f.name: f for f in fields(BrokerConfig)}
RELOADABLE = frozenset(name for name, f in SETTINGS.items() if f.metadata["reloadable"])


def coerce(values: dict[str, Any]) -> dict[str, Any]:
    """Type-check raw values (TOML or CLI) against the table; unknown keys are errors."""
    out: dict[str, Any] = {}
    for raw_key, value in values.items():
        key = raw_key.replace("-", "_").replace(".", "_")
        f = SETTINGS.get(key)
        if f is None:
            raise ConfigError(f"unknown setting {raw_key!r}")
        kind = type(f.default)
        if kind is bool and isinstance(value, str):
            if value.lower() not in ("true", "false"):
                raise ConfigError(f"setting {key} must be true or false, got {value!r}")
            value = value.lower() == "true"
        elif kind is int and isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise ConfigError(f"setting {key} must be an integer, got {value!r}") from None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(
                f"setting {key} must be {kind.__name__}, got {type(value).__name__} {value!r}"
            )
        out[key] = value
    return out


def load(path: str | Path | None, overrides: dict[str, Any] | None = None) -> BrokerConfig:
    """Defaults, then the TOML file (if any), then explicit overrides (CLI flags)."""
    values: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:
                values.update(tomllib.load(f))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    values.update(overrides or {})
    return BrokerConfig().with_overrides(values)


def markdown_table() -> str:
    """The settings table as docs/configuration.md shows it."""
    rows = ["| key | default | reloadable (SIGHUP) | meaning |", "|---|---|---|---|"]
    for name, f in SETTINGS.items():
        default = f.default
        shown = "true" if default is True else "false" if default is False else repr(default)
        rows.append(
            f"| `{name}` | `{shown}` | {'yes' if f.metadata['reloadable'] else ''} "
            f"| {f.metadata['doc']} |"
        )
    return "\n".join(rows)
