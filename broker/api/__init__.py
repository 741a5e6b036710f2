"""The APIs: each request in, its outcome out (docs/protocol.md section 4)."""

from broker.api.produce import Answer, DurableReply, Handlers, NoAnswer, Outcome, SplicedReply
from broker.api.security import Authentication

__all__ = [
    "Answer",
    "Authentication",
    "DurableReply",
    "Handlers",
    "NoAnswer",
    "Outcome",
    "SplicedReply",
]
