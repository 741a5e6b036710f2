"""The API table and the authorization judge: every request passes here on its way to
the function that serves it (docs/protocol.md sections 4 and 7).

Each family of APIs (a module of `broker/api/`) says which APIs it serves with
`apis()`; the table is their union, registered the one way, and ApiVersions answers
from it. With the authorizer on, each request is judged by what its class declares
it needs before its function runs, and its response completed after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from broker import __version__ as BROKER_VERSION
from broker.api.outcomes import Outcome, as_outcome
from broker.api.produce import ProduceApi, appends_together
from broker.config import BrokerConfig
from broker.metrics import BrokerMetrics
from broker.partitions import TopicRegistry
from broker.security import Access, AclStore, Audit, Denial, Judgement, ResourceType, Session
from protocol import messages as m
from protocol.errors import ErrorCode, ProtocolError

Handler = Callable[[Any, Session], Any]
"""An API's function: the request and its connection's session in, a response (or an
awaitable of one, or an outcome) out."""


class Family(Protocol):
    """A module's APIs: registered in the table by name, each with its function."""

    def apis(self) -> dict[str, Handler]: ...


class Apis:
    """Every API the broker serves, behind the authorization judge."""

    def __init__(
        self,
        config: BrokerConfig,
        topics: TopicRegistry,
        metrics: BrokerMetrics,
        produce: ProduceApi,
        families: Sequence[Family],
        acls: AclStore | None,
    ) -> None:
        """`produce` also appends the runs of Produce requests read together; `acls` is
        the ACL store when `authorizer` is on (None: everything is allowed)."""
        self.config = config
        self.topics = topics
        self.metrics = metrics
        self.produce = produce
        # None when `authorizer` is off: then a request costs one `is None` test more.
        self._access = None if acls is None else Access(acls.authorizer, self._creates)
        self._audit = Audit()
        self._table: dict[str, Handler] = {"ApiVersions": self._api_versions}
        for family in (produce, *families):
            self._table |= family.apis()
        # What the native ApiVersions lists: a Kafka-only request (broker/kafka's) has a
        # function here but no frame of the minibroker listener decodes to it.
        self.apis = frozenset(self._table).intersection(m.REQUEST_TYPES)

    appends_together = staticmethod(appends_together)

    async def handle(self, request: Any, session: Session) -> Outcome:
        """Run one parsed request from `session`'s client and say how the connection
        answers it: authorized first, when the authorizer is on."""
        handler = self._table.get(request.api)
        if handler is None:
            raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION, f"{request.api} is not served yet")
        judged: Judgement | None = None
        if self._access is not None:
            judged = self._judge(request, session)
            if judged.refused:
                return as_outcome(judged.refusal)
            request = judged.request
        result = handler(request, session)
        # What isinstance(result, Awaitable) checks, at a fifth of the cost.
        if hasattr(result, "__await__"):
            result = await result
        if judged is not None:
            _finish(judged, result)
        return as_outcome(result)

    def produce_many(self, reqs: list[m.ProduceRequest], session: Session) -> list[Outcome]:
        """Produce requests read together from `session`'s client (each
        `appends_together`), answered as one after another would be, with each
        partition's batches appended in one write."""
        principal = session.principal
        if self._access is None:
            return [as_outcome(reply) for reply in self.produce.produce_run(reqs, principal)]
        # A run's requests mostly name the same topics. Once one is allowed whole, the
        # others naming the same topics are too (a decision depends on the principal, the
        # host and the names, and the ACLs cannot change before the run is done), so they
        # are judged once per run: None stands for "allowed as it came".
        whole: set[tuple[str, ...]] = set()
        judged: list[Judgement | None] = []
        for req in reqs:
            names = tuple(t.topic for t in req.topics)
            if names in whole:
                judged.append(None)
                continue
            judgement = self._judge(req, session)
            if not judgement.refused and judgement.request is req and not judgement.finishes:
                whole.add(names)
            judged.append(judgement)
        handled = [
            req if j is None else cast(m.ProduceRequest, j.request)
            for req, j in zip(reqs, judged, strict=True)
            if j is None or not j.refused
        ]
        results = iter(self.produce.produce_run(handled, principal))
        outcomes = []
        for j in judged:
            if j is not None and j.refused:
                outcomes.append(as_outcome(j.refusal))
                continue
            reply = next(results)
            if j is not None:
                _finish(j, reply)
            outcomes.append(as_outcome(reply))
        return outcomes

    def _api_versions(self, _: m.ApiVersionsRequest, _session: Session) -> m.ApiVersionsResponse:
        return m.ApiVersionsResponse(
            apis={api: [m.VERSION, m.VERSION] for api in sorted(self.apis)},
            broker_version=BROKER_VERSION,
            max_frame_bytes=self.config.max_frame_bytes,
        )

    # ----------------------------------------------------------------- authorization

    def _judge(self, request: m.Request, session: Session) -> Judgement:
        """What the request may do (docs/protocol.md section 7); its denials audited."""
        assert self._access is not None
        judged = self._access.judge(request, session.principal, session.peer_host)
        if judged.denials:
            self._report(request.api, session, judged.denials)
        return judged

    def _report(self, api: str, session: Session, denials: list[Denial]) -> None:
        self._audit.denied(session.principal, session.peer_host, api, denials)
        for denial in denials:
            self.metrics.authorization_denied(api, denial.resource_type)

    def _creates(self, resource_type: str, name: str) -> bool:
        """Whether a request allowed to create resources (Metadata's auto-creation) would
        create this one: a topic that does not exist, while auto-creation is on."""
        return (
            resource_type == ResourceType.TOPIC
            and self.config.auto_create_topics
            and name not in self.topics.topics
        )


def _finish(judged: Judgement, result: Any) -> None:
    """Complete a handled request's response with what its judgement left out."""
    response = result if isinstance(result, m.Response) else getattr(result, "response", None)
    if response is not None:
        judged.finish(response)
