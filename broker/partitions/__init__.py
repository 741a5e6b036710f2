"""Topics and their partitions: the produce core (docs/architecture.md).

`topics` is the registry of topics on disk; `partition` is one partition's log with
the producer state that guards its appends (`producer_state`, pure); `producer_ids`
hands out producer ids and epochs; `group_commit` runs the fdatasync rounds acks=all
waits for. Other domains import from here, not from the modules.
"""

from broker.partitions.group_commit import FlushFailed, GroupCommitter
from broker.partitions.partition import AppendResult, Partition, StorageError
from broker.partitions.producer_ids import ProducerIdManager, ProducerIdStateError
from broker.partitions.producer_state import PRODUCER_EPOCH_MAX
from broker.partitions.topics import Topic, TopicError, TopicRegistry

__all__ = [
    "PRODUCER_EPOCH_MAX",
    "AppendResult",
    "FlushFailed",
    "GroupCommitter",
    "Partition",
    "ProducerIdManager",
    "ProducerIdStateError",
    "StorageError",
    "Topic",
    "TopicError",
    "TopicRegistry",
]
