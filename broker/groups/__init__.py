"""Consumer groups: membership, assignment and committed offsets (docs/consumer-groups.md).

`assignor` decides who should own what and `state` runs membership and
reconciliation (both pure); `classic` runs Kafka's classic group protocol, whose
members assign (pure); `coordinator` holds the groups of both kinds and their timers.
`offset_state` is the committed offsets and the records that change them
(pure), and `offset_store` their durable log. Other domains import from here,
not from the modules.
"""

from broker.groups.classic import STATES as CLASSIC_STATES
from broker.groups.classic import ClassicGroup, Join, JoinAnswer, Sync, SyncAnswer
from broker.groups.coordinator import GroupCoordinator, Listing, PartitionCounts
from broker.groups.offset_store import NoMembers, OffsetLog, OffsetStore
from broker.groups.state import Group as ConsumerGroup

__all__ = [
    "CLASSIC_STATES",
    "ClassicGroup",
    "ConsumerGroup",
    "GroupCoordinator",
    "Join",
    "JoinAnswer",
    "Listing",
    "NoMembers",
    "OffsetLog",
    "OffsetStore",
    "PartitionCounts",
    "Sync",
    "SyncAnswer",
]
