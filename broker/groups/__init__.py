"""Consumer groups: membership, assignment and committed offsets (docs/consumer-groups.md).

`assignor` decides who should own what and `state` runs membership and
reconciliation (both pure); `coordinator` holds the groups and their timers.
`offset_state` is the committed offsets and the records that change them
(pure), and `offset_store` their durable log. Other domains import from here,
not from the modules.
"""

from broker.groups.coordinator import GroupCoordinator, PartitionCounts
from broker.groups.offset_store import NoMembers, OffsetLog, OffsetStore

__all__ = ["GroupCoordinator", "NoMembers", "OffsetLog", "OffsetStore", "PartitionCounts"]
