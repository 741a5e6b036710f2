"""Producer ids and their owners across an epoch wrap (issue 39, item 8)."""

from __future__ import annotations

from pathlib import Path

from broker.partitions import PRODUCER_EPOCH_MAX
from broker.partitions.producer_ids import ProducerIdManager
from protocol.errors import ErrorCode

ALICE = "User:alice"


def test_the_id_after_the_last_epoch_is_the_holders(tmp_path: Path) -> None:
    ids = ProducerIdManager(tmp_path)
    first = ids.new_producer(ALICE)
    pid, epoch = first.producer_id, first.producer_epoch
    assert ids.owner(pid) == ALICE
    ids.remember(pid, PRODUCER_EPOCH_MAX - 1)
    epoch = PRODUCER_EPOCH_MAX - 1
    last = ids.bump(pid, epoch, None, ALICE)
    assert (last.producer_id, last.producer_epoch) == (pid, PRODUCER_EPOCH_MAX)
    wrapped = ids.bump(pid, PRODUCER_EPOCH_MAX, None, ALICE)
    assert wrapped.error == ErrorCode.NONE and wrapped.producer_epoch == 0
    assert wrapped.producer_id != pid
    assert ids.owner(wrapped.producer_id) == ALICE
    # ... after a restart too: the owner is written with the id's block.
    assert ProducerIdManager(tmp_path).owner(wrapped.producer_id) == ALICE
