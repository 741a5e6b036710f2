"""A transactional producer over the raw wire, and what a reader keeps of a Fetch:
shared by the tests that drive transactions without the client library."""

from __future__ import annotations

from typing import Any

from harness.wire import WireClient, values_batch
from protocol.batch import CONTROL_ABORT, CONTROL_COMMIT, control_type, iter_records, scan_batches

TXN = "tx"


class Txn:
    """One transactional producer over the raw wire: its ids and per-partition sequences."""

    def __init__(self, c: WireClient, transactional_id: str = TXN, timeout_ms: int = 60_000):
        self.c = c
        self.id = transactional_id
        self.pid, self.epoch = c.init_producer(
            transactional_id=transactional_id, transaction_timeout_ms=timeout_ms
        )
        self.seqs: dict[tuple[str, int], int] = {}

    def send(self, topic: str, partition: int, values: list[bytes], acks: int = -1) -> dict:
        seq = self.seqs.get((topic, partition), 0)
        batch = values_batch(
            values,
            producer_id=self.pid,
            producer_epoch=self.epoch,
            base_sequence=seq,
            transactional=True,
        )
        r = self.c.produce(topic, partition, batch, acks=acks, transactional_id=self.id)
        if r["error"] == 0:
            self.seqs[(topic, partition)] = seq + len(values)
        return r

    def end(self, committed: bool) -> dict[str, Any]:
        r = self.c.call(
            "EndTxn",
            transactional_id=self.id,
            producer_id=self.pid,
            producer_epoch=self.epoch,
            committed=committed,
        )
        if r["error"] == 0:
            self.pid, self.epoch = r["producer_id"], r["producer_epoch"]
            self.seqs = {}
        return r

    def prepare(self, timeout_ms: int = 60_000, **app: Any) -> dict[str, Any]:
        """PrepareTxn; `app` may carry txn_app_id and txn_app_version."""
        return self.c.call(
            "PrepareTxn",
            transactional_id=self.id,
            producer_id=self.pid,
            producer_epoch=self.epoch,
            prepared_timeout_ms=timeout_ms,
            **app,
        )

    def ref(self) -> dict[str, Any]:
        return {"transactional_id": self.id, "producer_id": self.pid, "producer_epoch": self.epoch}


def assert_end_txn_retry_answered(
    c: WireClient, transactional_id: str, old: tuple[int, int], committed: bool
) -> None:
    """A client's retry of EndTxn, with the producer id and epoch it sent it with, gets
    the answer it lost: success and the bumped epoch."""
    r = c.call(
        "EndTxn",
        transactional_id=transactional_id,
        producer_id=old[0],
        producer_epoch=old[1],
        committed=committed,
    )
    assert (r["error"], r["producer_epoch"]) == (0, old[1] + 1)


def committed_view(fetched: dict[str, Any]) -> list[bytes | None]:
    """What a read_committed reader keeps of one Fetch partition answer (Kafka's rule:
    drop an aborted producer's transactional batches from its first_offset up to its
    ABORT marker, and every control batch)."""
    records = fetched["records"]
    aborted = sorted(
        (a["first_offset"], a["producer_id"]) for a in fetched["aborted_transactions"] or []
    )
    dropping: set[int] = set()
    out = []
    for pos, header in scan_batches(records):
        while aborted and aborted[0][0] <= header.last_offset:
            dropping.add(aborted.pop(0)[1])
        if header.is_control:
            if control_type(records, pos, header) == CONTROL_ABORT:
                dropping.discard(header.producer_id)
            continue
        if header.is_transactional and header.producer_id in dropping:
            continue
        out += [r.value for r in iter_records(records, pos, header)]
    return out


def log_view(fetched: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every batch as ("data", values) or ("COMMIT"/"ABORT", producer_id)."""
    records = fetched["records"]
    out: list[tuple[str, Any]] = []
    for pos, header in scan_batches(records):
        if header.is_control:
            kind = "COMMIT" if control_type(records, pos, header) == CONTROL_COMMIT else "ABORT"
            out.append((kind, header.producer_id))
        else:
            out.append(("data", [r.value for r in iter_records(records, pos, header)]))
    return out
