"""Consume-transform-produce with confluent-kafka, as its exactly-once example runs it,
for the kill tests (tests/kafka/test_kafka_ctp_kill.py) to run in a process of its own:

    python -m tests.kafka.kafka_ctp_loop BOOTSTRAP INPUT OUTPUT GROUP [--idle-exit-ms N]

A static member of GROUP (so a restarted copy takes the killed one's partitions over at
once) reads INPUT at read_committed; each batch's values, upper-cased, go to OUTPUT's
same partition in one transaction with the consumed offsets
(`send_offsets_to_transaction` with the consumer's group metadata). A failure that
needs an abort (the broker was killed under the transaction) aborts, and the batch is
read again from the committed offsets; a fatal one exits 1. Prints `started` once
initialized and `committed` after each commit, flushed, for the test to follow.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial

import confluent_kafka
from confluent_kafka import KafkaException

BATCH = 10
TIMEOUT_S = 30.0
# Reconnect within half a second of a restarted broker (librdkafka's default backs
# off up to 10 s), and learn of a lost answer in 5 s rather than 60. No re-bootstrap
# (KIP-899) when every broker is down: librdkafka 2.10+ then decommissions the broker
# it knew as the group coordinator, and send_offsets_to_transaction waits for ever for
# it to come back (confluentinc/librdkafka#5511, open; its timeout is not applied,
# #5456): a client's bug, seen here with librdkafka 2.16 after the broker's restart.
QUICK = {
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 500,
    "socket.timeout.ms": 5_000,
    "retry.backoff.ms": 50,
    "metadata.recovery.strategy": "none",
}


def retried(step: Callable[[], object]) -> None:
    """`step` again while it fails with a retriable error (a lost answer, say)."""
    while True:
        try:
            step()
            return
        except KafkaException as exc:
            if not exc.args[0].retriable():
                raise


def rewind(consumer: confluent_kafka.Consumer) -> None:
    """Back to the committed offsets: an aborted batch is read again."""
    assignment = consumer.assignment()
    if not assignment:
        return
    for tp in consumer.committed(assignment, TIMEOUT_S):
        offset = tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_BEGINNING
        consumer.seek(confluent_kafka.TopicPartition(tp.topic, tp.partition, offset))


def run(args: argparse.Namespace) -> int:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "group.instance.id": f"{args.group}-a",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": 6_000,
            **QUICK,
        }
    )
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "transactional.id": f"{args.group}-tx",
            "transaction.timeout.ms": 10_000,
            "linger.ms": 5,
            **QUICK,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    consumer.subscribe([args.input])
    print("started", flush=True)
    idle_since = time.monotonic()
    while True:
        batch = [m for m in consumer.consume(num_messages=BATCH, timeout=0.2) if not m.error()]
        if not batch:
            if (time.monotonic() - idle_since) * 1000 > args.idle_exit_ms:
                break
            continue
        idle_since = time.monotonic()
        try:
            producer.begin_transaction()
            for m in batch:
                producer.produce(args.output, value=m.value().upper(), partition=m.partition())
            offsets = consumer.position(consumer.assignment())
            group = consumer.consumer_group_metadata()
            retried(partial(producer.send_offsets_to_transaction, offsets, group, TIMEOUT_S))
            retried(partial(producer.commit_transaction, TIMEOUT_S))
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal() or not error.txn_requires_abort():
                print(f"failed {error}", flush=True)
                return 1
            retried(partial(producer.abort_transaction, TIMEOUT_S))
            rewind(consumer)
            print(f"aborted {error}", flush=True)
            continue
        print("committed", flush=True)
    consumer.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("bootstrap", "input", "output", "group"):
        parser.add_argument(name)
    parser.add_argument("--idle-exit-ms", type=float, default=float("inf"))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
