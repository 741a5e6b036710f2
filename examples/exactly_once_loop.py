"""Consume-transform-produce, exactly once: read topic A in a consumer group, write each
record's transform to topic B, and commit the consumed offsets in the same transaction.

Start a broker (`make run`), put records in A, then:

    .venv/bin/python examples/exactly_once_loop.py --input A --output B --group upper

Each round polls a batch from A (read_committed, auto-commit off), begins a
transaction, sends every record's transform (its value in upper case, same key)
to B, adds the next offsets to read to the transaction with
`send_offsets_to_transaction(offsets, consumer.group_metadata())`, and commits.
The output records and the group's offsets become visible together or not at all.

Kill it at any moment and start it again: `init_transactions()` aborts what the
dead instance left open (its output and its offsets vanish together), and the
consumer starts at the offsets the last committed transaction stored, so B read
under read_committed holds each record of A transformed exactly once. A
transaction that fails (this member lost its partitions meanwhile, or the
producer timed out) is aborted and its batch read again from where it began.

The consumer is a static member (`group_instance_id`, by default the
transactional id): the restarted copy joins with the dead one's instance id and
takes its partitions over at once, where a dynamic member would wait for the
broker's session timeout (`group_session_timeout_ms`, 45 s by default) to remove
the dead one first. Should the old copy still run (a pause, not a crash), the
broker fences it: its producer by the new `init_transactions()`, its consumer
with FencedInstanceIdError, so it can no longer commit. A copy that stops on
its own (`--idle-exit-ms`) leaves keeping its partitions for the session
timeout, so a restart within it moves nothing.

Run several copies with the same --group and distinct --transactional-id to
share A's partitions among them.
"""

from __future__ import annotations

import argparse
import sys
import time

from client import (
    Consumer,
    ConsumerRecord,
    Producer,
    TopicPartition,
    TransactionAbortableError,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="broker host:port")
    parser.add_argument("--input", required=True, help="topic A, read in the group")
    parser.add_argument("--output", required=True, help="topic B, written transactionally")
    parser.add_argument("--group", required=True, help="the consumer group id")
    parser.add_argument("--transactional-id", help="default: <group>-<input>; one per running copy")
    parser.add_argument(
        "--instance-id", help="the consumer's group_instance_id; default: the transactional id"
    )
    parser.add_argument("--batch", type=int, default=100, help="records per transaction, at most")
    parser.add_argument(
        "--idle-exit-ms",
        type=float,
        default=float("inf"),
        help="stop after this long without records (default: run until killed)",
    )
    return parser.parse_args(argv)


def transform(record: ConsumerRecord) -> bytes:
    return (record.value or b"").upper()


def run(args: argparse.Namespace) -> int:
    transactional_id = args.transactional_id or f"{args.group}-{args.input}"
    with (
        Producer(args.bootstrap, transactional_id=transactional_id, linger_ms=5) as producer,
        Consumer(
            args.input,
            bootstrap_servers=args.bootstrap,
            group_id=args.group,
            group_instance_id=args.instance_id or transactional_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        ) as consumer,
    ):
        # First, so that a dead predecessor's open transaction is aborted before the
        # consumer reads the group's committed offsets (it waits for them to be stable).
        producer.init_transactions()
        print("started", flush=True)
        processed = 0
        idle_since = time.monotonic()
        while (time.monotonic() - idle_since) * 1000 < args.idle_exit_ms:
            batch = consumer.poll(timeout_ms=200, max_records=args.batch)
            if not batch:
                continue
            idle_since = time.monotonic()
            if process(producer, consumer, batch, args.output):
                processed += sum(len(records) for records in batch.values())
                print(f"committed {processed}", flush=True)
    return 0


def process(
    producer: Producer,
    consumer: Consumer,
    batch: dict[TopicPartition, list[ConsumerRecord]],
    output: str,
) -> bool:
    """One transaction: the batch's transforms and its offsets; False when it was aborted
    (the batch is then read again from its first record)."""
    producer.begin_transaction()
    try:
        for records in batch.values():
            for record in records:
                producer.send(output, transform(record), key=record.key)
        next_offsets = {tp: records[-1].offset + 1 for tp, records in batch.items()}
        producer.send_offsets_to_transaction(next_offsets, consumer.group_metadata())
        producer.commit_transaction()
    except TransactionAbortableError as exc:
        print(f"aborted: {exc}", file=sys.stderr, flush=True)
        producer.abort_transaction()
        owned = consumer.assignment()
        for tp, records in batch.items():
            if tp in owned:
                consumer.seek(tp, records[0].offset)
        return False
    return True


if __name__ == "__main__":
    raise SystemExit(run(parse_args()))
