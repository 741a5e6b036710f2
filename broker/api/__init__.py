"""The APIs: each request in, its outcome out (docs/protocol.md section 4).

`outcomes` is what a request comes to, the one thing the network and the Kafka codec
know of the APIs; `dispatch` is the table every API is registered in and the
authorization judge in front of it. One module per family of APIs: `produce`,
`fetch` (and ListOffsets), `topics` (and their configs), `groups` (and committed
offsets), `transactions` (and InitProducerId), `cluster` (Metadata) and `security`
(SASL, SCRAM credentials, ACLs, and each connection's session). ApiVersions
answers from the table. Other modules import from here, not from the modules.
"""

from broker.api.cluster import BROKER_ID, ClusterApi
from broker.api.dispatch import Apis
from broker.api.fetch import FetchApi
from broker.api.groups import GroupApi
from broker.api.outcomes import (
    DISK_FAILURES,
    Answer,
    DurableReply,
    NoAnswer,
    Outcome,
    SplicedReply,
    SyncedReply,
)
from broker.api.produce import ProduceApi
from broker.api.security import Authentication
from broker.api.topics import TopicApi
from broker.api.transactions import TransactionApi

__all__ = [
    "BROKER_ID",
    "DISK_FAILURES",
    "Answer",
    "Apis",
    "Authentication",
    "ClusterApi",
    "DurableReply",
    "FetchApi",
    "GroupApi",
    "NoAnswer",
    "Outcome",
    "ProduceApi",
    "SplicedReply",
    "SyncedReply",
    "TopicApi",
    "TransactionApi",
]
