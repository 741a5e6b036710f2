"""Client subcommands of the `minibroker` console script, in the spirit of kcat and Kafka's tools.

    minibroker topics create NAME --partitions 3
    minibroker topics list | describe NAME | delete NAME...
    minibroker configs describe --topic T | --broker [ID]
    minibroker configs alter --topic T --add-config k=v[,k=v] --delete-config k[,k]
    echo "k:v" | minibroker produce TOPIC --key-separator :
    minibroker consume TOPIC --from-beginning --count 10 --format json
    minibroker perf-produce --topic T --num-records 1000000 --record-size 100
    minibroker perf-consume --topic T --messages 1000000
    minibroker txn list [--prefix P] [--state ONGOING]...
    minibroker txn abort TRANSACTIONAL_ID
    minibroker txn apps [APP_ID...]
    minibroker groups list | describe GROUP
    minibroker groups reset-offsets GROUP --topic T --to-earliest | --to-latest | --to-offset N
    minibroker acls add --allow-principal User:alice --operation read --topic orders
    minibroker acls list [--topic orders] | remove ...
    minibroker users add alice [--password-stdin] | list | remove alice

`register(subparsers)` adds them to the parser `minibroker_cli` builds; each subcommand sets
`func(args) -> exit code` and takes `--bootstrap-server` (default: the environment's
MINIBROKER_BOOTSTRAP_SERVERS, else 127.0.0.1:9092) and `--client-config FILE`, a TOML
file of the SDK's settings (security_protocol, ssl_*, sasl_*, client_id,
allow_auto_create_topics, ...) for the command's own producers, consumers and admin
calls. Errors and the SDK's warnings are `minibroker: ...` lines on stderr; long
commands show their progress (client/progress.py), and Ctrl-C prints what was done and
exits 130.
"""

from __future__ import annotations

import argparse
import base64
import difflib
import getpass
import itertools
import json
import logging
import os
import sys
import time
import tomllib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from client import perf
from client.admin import (
    OPEN_TXN_STATES,
    abort_transaction,
    alter_group_offsets,
    alter_user_scram_credentials,
    create_acls,
    create_topic,
    delete_acls,
    delete_topics,
    describe_acls,
    describe_configs,
    describe_groups,
    describe_topic,
    describe_txn_apps,
    describe_user_scram_credentials,
    incremental_alter_configs,
    list_group_offsets,
    list_groups,
    list_topics,
    list_transactions,
)
from client.config import (
    DEFAULT_BOOTSTRAP,
    FILE_SETTINGS,
    AdminConfig,
    ConsumerConfig,
    ProducerConfig,
    SecurityConfig,
    settings_for,
)
from client.consumer import Consumer
from client.errors import MinibrokerError, NonEmptyGroupError, UnknownPartitionError
from client.interrupt import ctrl_c
from client.producer import Producer
from client.progress import Progress
from client.security import DEFAULT_ITERATIONS, ITERATIONS_MAX, ITERATIONS_MIN, SCRAM_MECHANISMS
from client.types import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AlterConfigOp,
    ConfigResource,
    ConsumerRecord,
    PatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
    TopicPartition,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from protocol.errors import ErrorCode
from protocol.messages import TXN_STATES, GroupDescription, GroupMemberDescription

# Exit codes: 1 for an error reported by the broker or the client, 2 for bad usage, and
# the shell's for SIGINT (128 + 2) after Ctrl-C.
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
BOOTSTRAP_ENV = "MINIBROKER_BOOTSTRAP_SERVERS"
"""Where the commands connect when --bootstrap-server is not given (`make run PORT=...`)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `topics`, `configs`, `produce`, `consume`, `perf-produce`, `perf-consume`, `txn`,
    `groups`, `acls` and `users`."""
    topics = subparsers.add_parser("topics", help="create, list, describe and delete topics")
    verbs = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")

    create = _command(verbs, "create", "create a topic", _topics_create)
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="topic setting"
    )
    create.add_argument("--if-not-exists", action="store_true", help="succeed if it exists")

    _command(verbs, "list", "list topic names", _topics_list)

    describe = _command(verbs, "describe", "partitions and offsets of a topic", _topics_describe)
    describe.add_argument("name")

    delete = _command(
        verbs, "delete", "delete topics, their records and committed offsets", _topics_delete
    )
    delete.add_argument("names", nargs="+", metavar="NAME")
    _register_configs(subparsers)

    produce = _command(
        subparsers, "produce", "send stdin lines (or whole files) as records", _produce
    )
    produce.add_argument("topic")
    produce.add_argument(
        "files", nargs="*", metavar="FILE", help="send each file as one record instead of lines"
    )
    produce.add_argument("--key-separator", help="split each line into KEY<sep>VALUE")
    produce.add_argument("--key", help="key of every record")
    produce.add_argument("--partition", type=int, default=None)
    produce.add_argument("--acks", default="all", choices=["all", "-1", "1", "0"])
    produce.add_argument(
        "--compression-type", default="none", choices=["none", "gzip", "zstd", "lz4"]
    )
    produce.add_argument("--linger-ms", type=float, default=5)

    consume = _command(subparsers, "consume", "print records of a topic", _consume)
    consume.add_argument("topic")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="default: only new records")
    start.add_argument("--offset", type=int, help="start at this offset (every chosen partition)")
    consume.add_argument("--partition", type=int, action="append", help="default: all")
    consume.add_argument("--count", type=int, help="stop after this many records")
    consume.add_argument("--format", choices=["value", "json"], default="value")
    consume.add_argument("--timeout-ms", type=int, help="stop after this long without records")
    consume.add_argument(
        "--isolation-level",
        choices=["read_uncommitted", "read_committed"],
        default="read_committed",
    )
    perf.add_reporting_interval(consume)

    txn = subparsers.add_parser("txn", help="list and abort transactions, show txn apps")
    txn_verbs = txn.add_subparsers(dest="txn_command", required=True, metavar="ACTION")
    txn_list = _command(txn_verbs, "list", "transactional ids and their state", _txn_list)
    txn_list.add_argument("--prefix", help="only transactional ids starting with this")
    txn_list.add_argument(
        "--state",
        action="append",
        choices=TXN_STATES,
        help="only these states (repeatable; default: all)",
    )
    txn_abort = _command(
        txn_verbs,
        "abort",
        f"abort the open ({' or '.join(OPEN_TXN_STATES)}) transaction of a transactional id",
        _txn_abort,
    )
    txn_abort.add_argument("transactional_id")
    txn_apps = _command(txn_verbs, "apps", "the committed version of transactional apps", _txn_apps)
    txn_apps.add_argument("app_ids", nargs="*", metavar="APP_ID", help="default: every app")

    groups = subparsers.add_parser(
        "groups", help="list and describe consumer groups, reset their offsets"
    )
    group_verbs = groups.add_subparsers(dest="groups_command", required=True, metavar="ACTION")
    _command(group_verbs, "list", "consumer groups, their state and member count", _groups_list)
    group_describe = _command(
        group_verbs,
        "describe",
        "members, assignment, committed offsets and lag of a group (like kafka-consumer-groups)",
        _groups_describe,
    )
    group_describe.add_argument("group")
    reset = _command(
        group_verbs,
        "reset-offsets",
        "set a group's committed offsets for a topic (only while the group has no members)",
        _groups_reset_offsets,
    )
    reset.add_argument("group")
    reset.add_argument("--topic", required=True)
    reset.add_argument("--partition", type=int, action="append", help="default: all")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true")
    target.add_argument("--to-latest", action="store_true")
    target.add_argument("--to-offset", type=int, metavar="N", help="clamped to the log's range")
    reset.add_argument("--dry-run", action="store_true", help="show the new offsets, change none")

    _register_acls(subparsers)
    _register_users(subparsers)

    perf.add_produce_arguments(
        _command(
            subparsers,
            "perf-produce",
            "producer load test (like kafka-producer-perf-test)",
            _perf_produce,
        )
    )
    perf.add_consume_arguments(
        _command(
            subparsers,
            "perf-consume",
            "consumer load test (like kafka-consumer-perf-test)",
            _perf_consume,
        )
    )


def _command(
    subparsers: argparse._SubParsersAction,
    name: str,
    help_text: str,
    func: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    parser.add_argument(
        "--bootstrap-server",
        default=os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP,
        metavar="HOST:PORT",
        help=f"the broker (default: ${BOOTSTRAP_ENV}, else {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "--client-config",
        metavar="FILE",
        help="TOML file of the SDK's settings for this command's connections "
        "(security_protocol, ssl_cafile, sasl_mechanism, sasl_plain_username, client_id, "
        "allow_auto_create_topics, ...)",
    )
    parser.set_defaults(func=_reporting(func))
    return parser


def _load_client_config(path: str | None) -> dict[str, Any]:
    """The settings of a --client-config TOML file (the SDK's names, FILE_SETTINGS). A
    name no client takes is refused, with the closest one, as it would otherwise be
    ignored."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            settings = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"--client-config {path}: not TOML ({exc})") from None
    for name in sorted(settings):
        if name not in FILE_SETTINGS:
            close = difflib.get_close_matches(name, FILE_SETTINGS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"--client-config {path}: {name} is not a setting of the SDK's producer, "
                f"consumer or admin helpers{hint}"
            )
    return settings


def client_settings(
    args: argparse.Namespace, kind: type[SecurityConfig], own: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The settings of the command's producer, consumer or admin calls: its own, and those
    of its --client-config file that `kind` takes."""
    return settings_for(kind, own or {}, args.client_settings, args.client_config)


def _reporting(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn client errors into one line on stderr and an exit code, not a traceback, and
    show the SDK's warnings (a topic it created, an offset it reset) the same way."""

    def run(args: argparse.Namespace) -> int:
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter("minibroker: %(message)s"))
        logging.getLogger("minibroker.client").addHandler(handler)
        try:
            # The command's connections: `client_settings` for its producers and
            # consumers (client_settings()), `admin` for its admin calls.
            args.client_settings = _load_client_config(args.client_config)
            args.admin = AdminConfig(
                bootstrap_servers=args.bootstrap_server, **client_settings(args, AdminConfig)
            )
            return func(args)
        except (MinibrokerError, ValueError, OSError) as exc:
            print(f"minibroker: {exc}", file=sys.stderr)
            return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_ERROR
        except KeyboardInterrupt:
            print("minibroker: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED

    return run


# --------------------------------------------------------------------------- topics


def _topics_create(args: argparse.Namespace) -> int:
    config: dict[str, Any] = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--config expects KEY=VALUE, got {item!r}")
        config[key] = _setting(value)
    create_topic(
        args.admin,
        args.name,
        args.partitions,
        config or None,
        exist_ok=args.if_not_exists,
    )
    print(f"Created topic {args.name} with {args.partitions} partition(s).")
    return 0


def _setting(value: str) -> Any:
    """Topic settings travel typed: ints stay ints."""
    try:
        return int(value)
    except ValueError:
        return value


def _topics_list(args: argparse.Namespace) -> int:
    for name in list_topics(args.admin):
        print(name)
    return 0


def _topics_describe(args: argparse.Namespace) -> int:
    description = describe_topic(args.admin, args.name)
    partitions = description.partitions
    print(f"Topic: {args.name}\tPartitionCount: {len(partitions)}")
    for p in partitions:
        print(
            f"\tPartition: {p.partition}\tLeader: {p.leader}\t"
            f"BeginningOffset: {p.beginning_offset}\tEndOffset: {p.end_offset}"
        )
    return 0


def _topics_delete(args: argparse.Namespace) -> int:
    """One topic at a time, so each is reported whether or not another is refused."""
    failed = 0
    for name in args.names:
        try:
            delete_topics(args.admin, [name])
        except MinibrokerError as exc:
            print(f"minibroker: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"Deleted topic {name}.")
    return EXIT_ERROR if failed else 0


# --------------------------------------------------------------------------- configs


def _register_configs(subparsers: argparse._SubParsersAction) -> None:
    """`configs describe` and `configs alter`, with kafka-configs' flags."""
    configs = subparsers.add_parser(
        "configs", help="describe topic and broker settings, alter topic settings"
    )
    verbs = configs.add_subparsers(dest="configs_command", required=True, metavar="ACTION")
    describe = _command(
        verbs, "describe", "every setting of a topic or of the broker", _configs_describe
    )
    which = describe.add_mutually_exclusive_group(required=True)
    which.add_argument("--topic", metavar="T")
    which.add_argument(
        "--broker", nargs="?", const="0", metavar="ID", help="the broker's id (default 0)"
    )
    alter = _command(
        verbs,
        "alter",
        "set or delete a topic's settings (in force at once, durably)",
        _configs_alter,
    )
    alter.add_argument("--topic", required=True, metavar="T")
    alter.add_argument(
        "--add-config",
        action="append",
        default=[],
        metavar="K=V[,K=V]",
        help="set these overrides (repeatable)",
    )
    alter.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="K[,K]",
        help="drop these overrides: the broker's value applies again (repeatable)",
    )
    alter.add_argument("--validate-only", action="store_true", help="check, change nothing")


def _configs_describe(args: argparse.Namespace) -> int:
    resource = (
        ConfigResource("topic", args.topic)
        if args.topic is not None
        else ConfigResource("broker", args.broker)
    )
    (description,) = describe_configs(args.admin, [resource])
    print(f"All configs for {resource.type} {resource.name} are:")
    for e in description.entries:
        value = "null" if e.value is None else e.value
        print(
            f"  {e.name}={value} source={e.source} read_only={str(e.read_only).lower()} "
            f"sensitive={str(e.sensitive).lower()}"
        )
    return 0


def _configs_alter(args: argparse.Namespace) -> int:
    ops: list[AlterConfigOp] = []
    for item in _split(args.add_config):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--add-config expects K=V[,K=V], got {item!r}")
        ops.append(AlterConfigOp(key, "set", value))
    ops += [AlterConfigOp(key, "delete") for key in _split(args.delete_config)]
    if not ops:
        raise ValueError("name settings with --add-config and/or --delete-config")
    resource = ConfigResource("topic", args.topic)
    incremental_alter_configs(args.admin, {resource: ops}, validate_only=args.validate_only)
    if args.validate_only:
        print(f"Validated the config change for topic {args.topic} (nothing changed).")
    else:
        print(f"Completed updating config for topic {args.topic}.")
    return 0


def _split(items: list[str]) -> list[str]:
    """The comma-separated entries of repeated flags, blanks dropped."""
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


# --------------------------------------------------------------------------- produce / consume


def _produce(args: argparse.Namespace) -> int:
    separator = None if args.key_separator is None else args.key_separator.encode()
    fixed_key = None if args.key is None else args.key.encode()
    config: dict[str, Any] = {
        "acks": args.acks,
        "compression_type": args.compression_type,
        "linger_ms": args.linger_ms,
    }
    failures: list[BaseException] = []

    def delivered(error: BaseException | None, _metadata: Any) -> None:
        if error is not None:
            failures.append(error)

    sent = 0
    with Producer(
        args.bootstrap_server, **client_settings(args, ProducerConfig, config)
    ) as producer:
        for key, value in _inputs(args.files, separator, fixed_key, sys.stdin.buffer):
            producer.send(
                args.topic, value, key=key, partition=args.partition, on_delivery=delivered
            )
            sent += 1
        producer.flush()
    if failures:
        print(
            f"minibroker: {len(failures)} of {sent} records failed: {failures[0]}", file=sys.stderr
        )
        return EXIT_ERROR
    print(f"{sent} record(s) sent to {args.topic}", file=sys.stderr)
    return 0


def _inputs(
    files: list[str], separator: bytes | None, key: bytes | None, stdin: BinaryIO
) -> Iterator[tuple[bytes | None, bytes]]:
    """(key, value) pairs: one per file, or one per stdin line (newline stripped)."""
    if files:
        for name in files:
            yield key, stdin.read() if name == "-" else Path(name).read_bytes()
        return
    for line in stdin:
        line = line.rstrip(b"\r\n")
        if separator is not None:
            line_key, sep, value = line.partition(separator)
            if sep:
                yield line_key, value
                continue
        yield key, line


def _consume(args: argparse.Namespace) -> int:
    """Print records until --count, --timeout-ms idle, or Ctrl-C; then a summary on stderr.

    When the records go to a file or a pipe, progress goes to stderr: a live line on a
    terminal, else a plain line every --reporting-interval ms. An --offset outside a
    partition's log is reset by auto_offset_reset (latest, or earliest with
    --from-beginning), which the consumer's warning says."""
    idle_limit_s = float("inf") if args.timeout_ms is None else args.timeout_ms / 1000
    reset = "earliest" if args.from_beginning else "latest"
    out = sys.stdout
    interrupted = False
    own = {"auto_offset_reset": reset, "isolation_level": args.isolation_level}
    with Consumer(
        bootstrap_servers=args.bootstrap_server, **client_settings(args, ConsumerConfig, own)
    ) as consumer:
        available = consumer.partitions_for_topic(args.topic)
        for partition in args.partition or ():
            if partition not in available:
                raise UnknownPartitionError(args.topic, partition, len(available))
        tps = [TopicPartition(args.topic, p) for p in args.partition or sorted(available)]
        consumer.assign(tps)
        if args.offset is not None:
            for tp in tps:
                consumer.seek(tp, args.offset)
        # Records on the screen are progress enough; in a file or a pipe they are not.
        progress = Progress(
            sys.stderr,
            f"consumed from {args.topic}",
            interval_ms=args.reporting_interval,
            live=not out.isatty(),
            plain=not out.isatty(),
            delay_s=1.0,
        )
        count = nbytes = 0
        idle_since = time.monotonic()
        try:
            with ctrl_c() as stop:
                while args.count is None or count < args.count:
                    if stop.is_set():
                        raise KeyboardInterrupt
                    wait_s = min(idle_limit_s - (time.monotonic() - idle_since), 1.0)
                    if wait_s <= 0:
                        break
                    room = 10_000 if args.count is None else min(args.count - count, 10_000)
                    polled = consumer.poll(timeout_ms=wait_s * 1000, max_records=room)
                    if polled:
                        idle_since = time.monotonic()
                    for records in polled.values():
                        for record in records:
                            out.write(_format(record, args.format))
                            nbytes += len(record.value or b"")
                        count += len(records)
                    progress.show(count, nbytes)
            out.flush()
        except KeyboardInterrupt:
            interrupted = True
        progress.close()
    print(f"{'interrupted: ' if interrupted else ''}{progress.summary()}", file=sys.stderr)
    return EXIT_INTERRUPTED if interrupted else 0


def _format(record: ConsumerRecord, fmt: str) -> str:
    if fmt == "value":
        return _text(record.value) + "\n"
    return (
        json.dumps(
            {
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "timestamp": record.timestamp,
                "key": _json_bytes(record.key),
                "value": _json_bytes(record.value),
                "headers": {name: _json_bytes(value) for name, value in record.headers},
            }
        )
        + "\n"
    )


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", "backslashreplace")


def _json_bytes(data: bytes | None) -> str | None:
    """UTF-8 text as is; other bytes as "base64:..." so nothing is lost."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


# --------------------------------------------------------------------------- transactions


def _txn_list(args: argparse.Namespace) -> int:
    listings = list_transactions(args.admin, args.prefix, args.state)
    print("TransactionalId\tProducerId\tEpoch\tState\tStartedMs\tTimeoutMs\tPartitions")
    for t in listings:
        partitions = ",".join(
            f"{entry.topic}-{p}" for entry in t.partitions for p in sorted(entry.partitions)
        )
        print(
            f"{t.transactional_id}\t{t.producer_id}\t{t.producer_epoch}\t{t.state}\t"
            f"{t.started_ms}\t{t.timeout_ms}\t{partitions or '-'}"
        )
    return 0


def _txn_abort(args: argparse.Namespace) -> int:
    aborted = abort_transaction(args.admin, args.transactional_id)
    if aborted is None:
        print(f"minibroker: {args.transactional_id!r} has no open transaction", file=sys.stderr)
        return EXIT_ERROR
    print(
        f"Aborted the {aborted.state} transaction of {aborted.transactional_id} "
        f"(producer id {aborted.producer_id}, epoch {aborted.producer_epoch})."
    )
    return 0


def _txn_apps(args: argparse.Namespace) -> int:
    print("TxnAppId\tVersion\tCommittedMs")
    for app in describe_txn_apps(args.admin, args.app_ids or None):
        print(f"{app.txn_app_id}\t{app.txn_app_version}\t{app.committed_ms}")
    return 0


# --------------------------------------------------------------------------- groups


def _groups_list(args: argparse.Namespace) -> int:
    print("GROUP\tSTATE\tMEMBERS")
    for group in list_groups(args.admin):
        print(f"{group.group_id}\t{group.state}\t{group.members}")
    return 0


def _describe_group(bootstrap: AdminConfig, group_id: str) -> GroupDescription:
    """The group's description (GROUP_ID_NOT_FOUND: no members, state DEAD); other errors
    raise."""
    (description,) = describe_groups(bootstrap, [group_id])
    if description.error and description.error != ErrorCode.GROUP_ID_NOT_FOUND:
        raise MinibrokerError(
            f"consumer group {group_id!r}: {ErrorCode.name_of(description.error)}",
            description.error,
        )
    return description


def _groups_describe(args: argparse.Namespace) -> int:
    bootstrap, group_id = args.admin, args.group
    description = _describe_group(bootstrap, group_id)
    committed = list_group_offsets(bootstrap, group_id)
    if description.error and not committed:
        print(f"minibroker: consumer group {group_id!r} does not exist", file=sys.stderr)
        return EXIT_ERROR
    owner: dict[TopicPartition, GroupMemberDescription] = {}
    for member in description.members:
        for entry in member.assignment:
            for p in entry.partitions:
                owner[TopicPartition(entry.topic, p)] = member
    partitions = sorted(set(committed) | set(owner))
    ends: dict[TopicPartition, int] = {}
    for topic in sorted({tp.topic for tp in partitions}):
        try:
            for described in describe_topic(bootstrap, topic).partitions:
                ends[TopicPartition(topic, described.partition)] = described.end_offset
        except MinibrokerError:
            pass  # a topic deleted since: no log-end offset, no lag
    state = "EMPTY" if description.error else description.state
    print(
        f"Group: {group_id}\tState: {state}\tEpoch: {max(description.group_epoch, 0)}\t"
        f"Members: {len(description.members)}"
    )
    print()
    print("GROUP\tTOPIC\tPARTITION\tCURRENT-OFFSET\tLOG-END-OFFSET\tLAG\tCONSUMER-ID\tCLIENT-ID")
    for tp in partitions:
        current = committed.get(tp)
        end = ends.get(tp)
        lag = "-" if current is None or end is None else str(max(end - current.offset, 0))
        holder = owner.get(tp)
        print(
            "\t".join(
                [
                    group_id,
                    tp.topic,
                    str(tp.partition),
                    "-" if current is None else str(current.offset),
                    "-" if end is None else str(end),
                    lag,
                    "-" if holder is None else holder.member_id,
                    "-" if holder is None else holder.client_id or "-",
                ]
            )
        )
    print()
    print("MEMBER-ID\tEPOCH\tCLIENT-ID\tSUBSCRIBED\tASSIGNMENT")
    for member in description.members:
        assignment = ",".join(
            f"{entry.topic}-{p}" for entry in member.assignment for p in sorted(entry.partitions)
        )
        print(
            f"{member.member_id}\t{member.member_epoch}\t{member.client_id or '-'}\t"
            f"{','.join(member.subscribed_topics) or '-'}\t{assignment or '-'}"
        )
    return 0


def _groups_reset_offsets(args: argparse.Namespace) -> int:
    bootstrap, group_id = args.admin, args.group
    description = _describe_group(bootstrap, group_id)
    if description.members:
        raise NonEmptyGroupError(
            f"group {group_id!r} has {len(description.members)} member(s) (state "
            f"{description.state}): offsets can only be reset while it has none; stop its "
            "consumers first"
        )
    partitions = describe_topic(bootstrap, args.topic).partitions
    chosen = set(args.partition or [p.partition for p in partitions])
    unknown = chosen - {p.partition for p in partitions}
    if unknown:
        raise ValueError(f"topic {args.topic!r} has no partition {sorted(unknown)}")
    plan: dict[TopicPartition, int] = {}
    for p in partitions:
        if p.partition not in chosen:
            continue
        earliest, latest = p.beginning_offset, p.end_offset
        if args.to_earliest:
            offset = earliest
        elif args.to_latest:
            offset = latest
        else:
            offset = min(max(args.to_offset, earliest), latest)
        plan[TopicPartition(args.topic, p.partition)] = offset
    if not args.dry_run:
        alter_group_offsets(bootstrap, group_id, plan)
    print("GROUP\tTOPIC\tPARTITION\tNEW-OFFSET")
    for tp, offset in sorted(plan.items()):
        print(f"{group_id}\t{tp.topic}\t{tp.partition}\t{offset}")
    if args.dry_run:
        print("(dry run: nothing changed)", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- perf


def _perf_produce(args: argparse.Namespace) -> int:
    perf.perf_produce(args)
    return 0


def _perf_consume(args: argparse.Namespace) -> int:
    result = perf.perf_consume(args)
    return 0 if result["records"] >= args.messages else EXIT_ERROR


# --------------------------------------------------------------------------- ACLs

_RESOURCE_OPTIONS = (
    ("topic", ResourceType.TOPIC),
    ("group", ResourceType.GROUP),
    ("transactional_id", ResourceType.TRANSACTIONAL_ID),
)


def _register_acls(subparsers: argparse._SubParsersAction) -> None:
    """`acls add|list|remove`, with kafka-acls' options."""
    acls = subparsers.add_parser("acls", help="add, list and remove ACLs (like kafka-acls)")
    verbs = acls.add_subparsers(dest="acls_command", required=True, metavar="ACTION")
    add = _command(verbs, "add", "allow or deny principals operations on resources", _acls_add)
    _acl_arguments(add, pattern_types=("literal", "prefixed"), default_pattern="literal")
    listing = _command(verbs, "list", "the ACLs, or those of a resource", _acls_list)
    _resource_arguments(listing)
    listing.add_argument("--principal", help="only the ACLs of this principal (User:NAME)")
    listing.add_argument(
        "--resource-pattern-type",
        choices=["any", "match", "literal", "prefixed"],
        default="any",
        help="any: the resource name as given, either type (default); match: every ACL "
        "that applies to the resource (literal, * and prefixes)",
    )
    remove = _command(
        verbs, "remove", "remove the ACLs that match (exactly, as kafka-acls)", _acls_remove
    )
    _acl_arguments(remove, pattern_types=("literal", "prefixed"), default_pattern="literal")
    remove.add_argument(
        "--force",
        action="store_true",
        help="remove every ACL of the resource when no principal or operation is named",
    )


def _resource_arguments(parser: argparse.ArgumentParser) -> None:
    for name, kind in _RESOURCE_OPTIONS:
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            action="append",
            metavar="NAME",
            help=f"a {kind.value.replace('_', ' ')} (repeatable; * for every one)",
        )
    parser.add_argument("--cluster", action="store_true", help="the cluster")


def _acl_arguments(
    parser: argparse.ArgumentParser, *, pattern_types: tuple[str, ...], default_pattern: str
) -> None:
    parser.add_argument(
        "--allow-principal", action="append", default=[], metavar="PRINCIPAL", help="User:NAME"
    )
    parser.add_argument(
        "--deny-principal", action="append", default=[], metavar="PRINCIPAL", help="User:NAME"
    )
    parser.add_argument(
        "--operation",
        action="append",
        default=[],
        type=_operation,
        metavar="OPERATION",
        help=f"repeatable: {', '.join(o.value for o in AclOperation)}",
    )
    parser.add_argument("--host", default="*", help="the client's IP address (default: *)")
    _resource_arguments(parser)
    parser.add_argument("--resource-pattern-type", choices=pattern_types, default=default_pattern)


def _operation(text: str) -> AclOperation:
    """An operation as kafka-acls spells it (Read, IdempotentWrite) or as the wire does."""
    squashed = text.replace("_", "").replace("-", "").lower()
    for operation in AclOperation:
        if operation.value.replace("_", "") == squashed:
            return operation
    raise argparse.ArgumentTypeError(
        f"unknown operation {text!r} (one of {', '.join(o.value for o in AclOperation)})"
    )


def _resources(args: argparse.Namespace) -> list[tuple[ResourceType, str]]:
    named = [
        (kind, name) for option, kind in _RESOURCE_OPTIONS for name in getattr(args, option) or ()
    ]
    if args.cluster:
        named.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return named


def _principals(args: argparse.Namespace) -> list[tuple[AclPermissionType, str]]:
    return [(AclPermissionType.ALLOW, p) for p in args.allow_principal] + [
        (AclPermissionType.DENY, p) for p in args.deny_principal
    ]


def _print_acls(bindings: list[AclBinding]) -> None:
    print("PRINCIPAL\tHOST\tOPERATION\tPERMISSION\tRESOURCE_TYPE\tNAME\tPATTERN")
    for b in bindings:
        p = b.resource_pattern
        print(
            f"{b.principal}\t{b.host}\t{b.operation.value}\t{b.permission_type.value}\t"
            f"{p.resource_type.value}\t{p.resource_name}\t{p.pattern_type.value}"
        )


def _acls_add(args: argparse.Namespace) -> int:
    resources, principals = _resources(args), _principals(args)
    if not resources or not principals or not args.operation:
        raise ValueError(
            "acls add needs a resource (--topic, --group, --transactional-id or --cluster), "
            "a principal (--allow-principal or --deny-principal) and an --operation"
        )
    bindings = [
        AclBinding(
            principal,
            args.host,
            operation,
            permission,
            ResourcePattern(kind, name, PatternType(args.resource_pattern_type)),
        )
        for (kind, name), (permission, principal), operation in itertools.product(
            resources, principals, args.operation
        )
    ]
    result = create_acls(args.admin, bindings)
    if result.created:
        print(f"Added {len(result.created)} ACL(s):")
        _print_acls(result.created)
    for _, error in result.failed:
        print(f"minibroker: {error}", file=sys.stderr)
    return EXIT_ERROR if result.failed else 0


def _acls_list(args: argparse.Namespace) -> int:
    resources: list[tuple[ResourceType | None, str | None]] = [*_resources(args)] or [(None, None)]
    pattern = PatternType(args.resource_pattern_type)
    found: list[AclBinding] = []
    for kind, name in resources:
        acl_filter = AclBindingFilter(
            principal=args.principal,
            resource_pattern=ResourcePatternFilter(kind, name, pattern),
        )
        found += [b for b in describe_acls(args.admin, acl_filter) if b not in found]
    _print_acls(found)
    return 0


def _acls_remove(args: argparse.Namespace) -> int:
    resources, principals = _resources(args), _principals(args)
    if not resources:
        raise ValueError(
            "acls remove needs a resource (--topic, --group, --transactional-id or --cluster)"
        )
    if not principals and not args.operation and not args.force:
        raise ValueError(
            "no --allow-principal, --deny-principal or --operation: that removes every ACL of "
            "the resource; say --force to do so"
        )
    pattern = PatternType(args.resource_pattern_type)
    who: list[tuple[AclPermissionType | None, str | None]] = [*principals] or [(None, None)]
    filters = [
        AclBindingFilter(
            principal=principal,
            host=args.host,
            operation=operation,
            permission_type=permission,
            resource_pattern=ResourcePatternFilter(kind, name, pattern),
        )
        for (kind, name), (permission, principal), operation in itertools.product(
            resources, who, args.operation or [None]
        )
    ]
    deleted: list[AclBinding] = []
    failed = 0
    for result in delete_acls(args.admin, filters):
        deleted += result.deleted
        if result.error is not None:
            failed += 1
            print(f"minibroker: {result.error}", file=sys.stderr)
    print(f"Removed {len(deleted)} ACL(s):")
    _print_acls(deleted)
    return EXIT_ERROR if failed else 0


# --------------------------------------------------------------------------- SCRAM users


def _register_users(subparsers: argparse._SubParsersAction) -> None:
    """`users add|list|remove`: SCRAM credentials, as kafka-configs --entity-type users."""
    users = subparsers.add_parser(
        "users", help="add, list and remove SCRAM users (like kafka-configs --entity-type users)"
    )
    verbs = users.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    add = _command(
        verbs,
        "add",
        "set a user's SCRAM credentials (the password is asked for, never an argument)",
        _users_add,
    )
    add.add_argument("user")
    add.add_argument(
        "--mechanism",
        action="append",
        choices=SCRAM_MECHANISMS,
        help="repeatable (default: both)",
    )
    add.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help=f"{ITERATIONS_MIN} to {ITERATIONS_MAX} (default {DEFAULT_ITERATIONS})",
    )
    add.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from the first line of stdin instead of asking for it",
    )
    listing = _command(verbs, "list", "users and their SCRAM mechanisms", _users_list)
    listing.add_argument("users", nargs="*", metavar="USER", help="default: every user")
    remove = _command(verbs, "remove", "delete a user's SCRAM credentials", _users_remove)
    remove.add_argument("user")
    remove.add_argument(
        "--mechanism",
        action="append",
        choices=SCRAM_MECHANISMS,
        help="repeatable (default: every one the user has)",
    )


def _password(args: argparse.Namespace) -> str:
    """From stdin's first line (--password-stdin), else asked twice on the terminal."""
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        # Without a terminal getpass warns and reads stdin instead: say what to do.
        with warnings.catch_warnings():
            warnings.simplefilter("error", getpass.GetPassWarning)
            try:
                password = getpass.getpass(f"Password for {args.user}: ")
                again = getpass.getpass("Again: ")
            except (getpass.GetPassWarning, EOFError):
                raise ValueError(
                    "no terminal to ask for the password on: give it on stdin with "
                    f"--password-stdin (printf '%s\\n' \"$PASSWORD\" | minibroker users add "
                    f"{args.user} --password-stdin)"
                ) from None
        if again != password:
            raise ValueError("the two passwords differ")
    if not password:
        raise ValueError("the password must not be empty")
    return password


def _users_add(args: argparse.Namespace) -> int:
    mechanisms = args.mechanism or list(SCRAM_MECHANISMS)
    password = _password(args)
    upsertions = [
        UserScramCredentialUpsertion(args.user, password, mechanism, args.iterations)
        for mechanism in mechanisms
    ]
    return _report_alterations(
        alter_user_scram_credentials(args.admin, upsertions),
        f"Set the {', '.join(mechanisms)} credentials of {args.user} "
        f"({args.iterations} iterations).",
    )


def _users_list(args: argparse.Namespace) -> int:
    described = describe_user_scram_credentials(args.admin, args.users or None)
    print("USER\tMECHANISM\tITERATIONS")
    for user in described:
        for credential in user.credentials:
            print(f"{user.user}\t{credential.mechanism}\t{credential.iterations}")
    missing = sorted(set(args.users) - {d.user for d in described})
    for user in missing:
        print(f"minibroker: user {user!r} has no SCRAM credentials", file=sys.stderr)
    return EXIT_ERROR if missing else 0


def _users_remove(args: argparse.Namespace) -> int:
    mechanisms = args.mechanism
    if not mechanisms:
        described = describe_user_scram_credentials(args.admin, [args.user])
        mechanisms = [c.mechanism for d in described for c in d.credentials]
        if not mechanisms:
            print(f"minibroker: user {args.user!r} has no SCRAM credentials", file=sys.stderr)
            return EXIT_ERROR
    deletions = [UserScramCredentialDeletion(args.user, mechanism) for mechanism in mechanisms]
    return _report_alterations(
        alter_user_scram_credentials(args.admin, deletions),
        f"Deleted the {', '.join(mechanisms)} credentials of {args.user}.",
    )


def _report_alterations(results: list[Any], done: str) -> int:
    failed = [r for r in results if r.error is not None]
    for result in failed:
        print(f"minibroker: {result.error}", file=sys.stderr)
    if failed:
        return EXIT_ERROR
    print(done)
    return 0
