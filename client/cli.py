"""Client subcommands of the `minibroker` console script, in the spirit of kcat and Kafka's tools.

    minibroker topics create NAME --partitions 3
    minibroker topics list | describe NAME
    echo "k:v" | minibroker produce TOPIC --key-separator :
    minibroker consume TOPIC --from-beginning --count 10 --format json
    minibroker perf-produce --topic T --num-records 1000000 --record-size 100
    minibroker perf-consume --topic T --messages 1000000
    minibroker txn list [--prefix P] [--state ONGOING]...
    minibroker txn abort TRANSACTIONAL_ID
    minibroker txn apps [APP_ID...]

`register(subparsers)` adds them to the parser `minibroker_cli` builds; each subcommand sets
`func(args) -> exit code` and takes `--bootstrap-server` (default 127.0.0.1:9092).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from client import perf
from client.admin import (
    OPEN_TXN_STATES,
    abort_transaction,
    create_topic,
    describe_topic,
    describe_txn_apps,
    list_topics,
    list_transactions,
)
from client.config import DEFAULT_BOOTSTRAP
from client.consumer import Consumer
from client.errors import MinibrokerError
from client.producer import Producer
from client.types import ConsumerRecord, TopicPartition
from protocol.messages import TXN_STATES

# Exit codes: 1 for an error reported by the broker or the client, 2 for bad usage.
EXIT_ERROR = 1
EXIT_USAGE = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `topics`, `produce`, `consume`, `perf-produce`, `perf-consume` and `txn`."""
    topics = subparsers.add_parser("topics", help="create, list and describe topics")
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
        "--bootstrap-server", default=DEFAULT_BOOTSTRAP, metavar="HOST:PORT", help="the broker"
    )
    parser.set_defaults(func=_reporting(func))
    return parser


def _reporting(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn client errors into one line on stderr and an exit code, not a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (MinibrokerError, ValueError, OSError) as exc:
            print(f"minibroker: {exc}", file=sys.stderr)
            return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_ERROR
        except KeyboardInterrupt:
            return 130

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
        args.bootstrap_server,
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
    for name in list_topics(args.bootstrap_server):
        print(name)
    return 0


def _topics_describe(args: argparse.Namespace) -> int:
    description = describe_topic(args.bootstrap_server, args.name)
    partitions = description["partitions"]
    print(f"Topic: {args.name}\tPartitionCount: {len(partitions)}")
    for p in partitions:
        print(
            f"\tPartition: {p['partition']}\tLeader: {p['leader']}\t"
            f"BeginningOffset: {p['beginning_offset']}\tEndOffset: {p['end_offset']}"
        )
    return 0


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
    with Producer(args.bootstrap_server, **config) as producer:
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
    timeout = float("inf") if args.timeout_ms is None else args.timeout_ms
    reset = "earliest" if args.from_beginning else "latest"
    out = sys.stdout
    with Consumer(
        bootstrap_servers=args.bootstrap_server,
        auto_offset_reset=reset,
        consumer_timeout_ms=timeout,
        isolation_level=args.isolation_level,
    ) as consumer:
        partitions = args.partition or sorted(consumer.partitions_for_topic(args.topic))
        tps = [TopicPartition(args.topic, p) for p in partitions]
        consumer.assign(tps)
        if args.offset is not None:
            for tp in tps:
                consumer.seek(tp, args.offset)
        for count, record in enumerate(consumer, 1):
            out.write(_format(record, args.format))
            if args.count is not None and count >= args.count:
                break
        out.flush()
    return 0


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
    listings = list_transactions(args.bootstrap_server, args.prefix, args.state)
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
    aborted = abort_transaction(args.bootstrap_server, args.transactional_id)
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
    for app in describe_txn_apps(args.bootstrap_server, args.app_ids or None):
        print(f"{app.txn_app_id}\t{app.txn_app_version}\t{app.committed_ms}")
    return 0


# --------------------------------------------------------------------------- perf


def _perf_produce(args: argparse.Namespace) -> int:
    perf.perf_produce(args)
    return 0


def _perf_consume(args: argparse.Namespace) -> int:
    result = perf.perf_consume(args)
    return 0 if result["records"] >= args.messages else EXIT_ERROR
