"""The consumer group and committed offset APIs (docs/consumer-groups.md): membership
is the group coordinator's, offsets the offset store's; a TxnOffsetCommit is judged
by the transaction coordinator too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.api.outcomes import SyncedReply
from broker.groups import GroupCoordinator, OffsetStore
from broker.security import Session
from broker.transactions import TransactionCoordinator
from protocol import messages as m


class GroupApi:
    """The groups' and their offsets' APIs."""

    def __init__(
        self,
        groups: GroupCoordinator,
        offsets: OffsetStore,
        coordinator: TransactionCoordinator,
    ) -> None:
        self.groups = groups
        self.offsets = offsets
        self.coordinator = coordinator

    def apis(self) -> dict[str, Callable[[Any, Session], Any]]:
        groups, offsets = self.groups, self.offsets
        return {
            "ConsumerGroupHeartbeat": lambda req, session: groups.heartbeat(
                req, client_host=session.peer_host
            ),
            "ListGroups": lambda req, _session: groups.list_groups(req),
            "DescribeGroups": lambda req, _session: groups.describe_groups(req),
            "OffsetCommit": lambda req, _session: offsets.offset_commit(req),
            "OffsetFetch": lambda req, _session: offsets.offset_fetch(req),
            "TxnOffsetCommit": self.txn_offset_commit,
        }

    async def txn_offset_commit(
        self, req: m.TxnOffsetCommitRequest, session: Session
    ) -> m.TxnOffsetCommitResponse | SyncedReply:
        """Judged and written by the offset store; answered once synced, while the
        connection runs what comes behind it."""
        result = await self.offsets.txn_offset_commit(req, self.coordinator, session.principal)
        if isinstance(result, m.TxnOffsetCommitResponse):
            return result
        return SyncedReply(result.response, result.is_durable, result.durable)
