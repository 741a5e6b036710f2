"""Authorization of requests: what each request class declares it needs
(protocol/authorization.py, docs/protocol.md section 7's table), decided by the ACLs in
force (the `Authorizer` of acl.py).

`Access.judge` runs once per request, before its handler, from `Apis.handle` and
`Apis.produce_many` (broker/api/dispatch.py), the one place where requests are
authorized. Its `Judgement` says what the handler may do:

- `refused`: the handler does not run, so a denial changes nothing, and `refusal` is
  the whole answer (None for a Produce with acks=0): when a request need is denied
  (every entry and the top-level `error` carry the denial), or every entry was refused;
- else `request`: the request to handle, without its refused entries and without the
  names a request-side omission leaves out; once handled, `finish` puts each refused
  entry's answer back in its place of the response and leaves out of listings what the
  principal may not see.

Decisions are made on the ACLs in force when the request is judged, so a change applies
to every connection from its next request on. Each (resource, operation) is decided once
per request; the `Authorizer`'s index makes each decision a few dict look-ups.

`Audit` writes one line per denial on the `minibroker.audit` logger, and holds back
repeats: omissions from listings are not denials (Kafka does not log them either), so a
principal listing topics it may not see logs nothing.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

from broker.logs import AUDIT_LOGGER
from broker.security.acl import Authorizer
from protocol.authorization import CLUSTER_NAME, Entries, Omission, ResourceType
from protocol.errors import ErrorCode
from protocol.messages import Request, Response

AUDIT_REPEAT_S = 60.0
"""A denial repeated within this long of the last line logged for it is counted, not
logged; the next line logged for it says how many were held back."""
AUDIT_KEYS_MAX = 10_000
"""Denials remembered for holding back repeats; beyond it the oldest is forgotten."""


class Denial(NamedTuple):
    """An operation on a resource that a request was refused."""

    resource_type: str
    resource_name: str
    operation: str


@dataclass(slots=True)
class Judgement:
    """What one request may do: see the module's docstring."""

    request: Request
    refused: bool
    refusal: Response | None
    denials: list[Denial]
    _entries: Entries | None = None
    _answers: dict[int, Any] | None = None  # refused entry's index -> its answer
    _omissions: tuple[Omission, ...] = ()
    _allowed: Callable[[str, str, str], bool] | None = None

    @property
    def finishes(self) -> bool:
        """Whether `finish` has anything to do: refused entries to answer or listings to
        cut."""
        return bool(self._answers) or bool(self._omissions)

    def finish(self, response: Response) -> None:
        """Complete the handler's `response`: the refused entries' answers in their places,
        and the listings without what the principal may not see."""
        answers = self._answers
        if answers:
            entries = self._entries
            assert entries is not None
            answered = iter(getattr(response, entries.answers))
            total = len(answers) + len(getattr(self.request, entries.field))
            merged = [answers[i] if i in answers else next(answered, None) for i in range(total)]
            setattr(response, entries.answers, [a for a in merged if a is not None])
        allowed = self._allowed
        for omission in self._omissions:
            assert allowed is not None
            path = omission.names
            op, rtype = omission.operation, omission.resource_type
            for holder in omission.holders(response):
                items = getattr(holder, path.field)
                if items:
                    setattr(
                        holder,
                        path.field,
                        [item for item in items if allowed(op, rtype, path.name(item))],
                    )


class Access:
    """Judges requests by their declared requirements and the `authorizer`'s ACLs.

    `creates(resource_type, name)` says whether a request that may create resources
    (Metadata's auto-creation) would create this one: the need to create applies then."""

    def __init__(self, authorizer: Authorizer, creates: Callable[[str, str], bool]) -> None:
        self.authorizer = authorizer
        self._creates = creates

    def judge(self, request: Request, principal: str, host: str) -> Judgement:
        """What `principal`, connected from `host` (canonical_host's form), may do of
        `request`."""
        requirements = type(request).requirements
        authorizer = self.authorizer
        if not requirements.needs or principal in authorizer.super_users:
            return Judgement(request, False, None, [])
        decided: dict[tuple[str, str, str], bool] = {}

        def allowed(operation: str, resource_type: str, name: str) -> bool:
            key = (operation, resource_type, name)
            verdict = decided.get(key)
            if verdict is None:
                verdict = decided[key] = authorizer.authorize(
                    principal, host, operation, resource_type, name
                )
            return verdict

        # The request needs: the first one denied refuses the whole request.
        entries = requirements.entries
        for need in requirements.request_needs:
            if not need.applies(request):
                continue
            denied = [
                Denial(need.resource_type, name, need.operation)
                for name in need.resource_names(request)
                if not allowed(need.operation, need.resource_type, name)
            ]
            if denied and need.or_any is not None:
                operation, resource_type = need.or_any
                if authorizer.authorize_any(principal, host, operation, resource_type):
                    denied = []
            if denied:
                why = _message(denied, principal)
                return Judgement(
                    request, True, _refusal(request, entries, need.denied, why), denied
                )

        # The entry needs: an entry's first one denied refuses that entry.
        denials: list[Denial] = []
        refused: dict[int, Any] = {}
        entry_needs = [n for n in requirements.entry_needs if n.applies(request)]
        if entry_needs:
            assert entries is not None
            for i, entry in enumerate(entries.of_request(request)):
                for entry_need in entry_needs:
                    if not entry_need.covers(entry):
                        continue
                    rtype = entry_need.resource_type
                    name = entry_need.resource_name(entry)
                    if entry_need.creating and not self._creates(rtype, name):
                        continue
                    op = entry_need.operation
                    if allowed(op, rtype, name) or (
                        entry_need.or_cluster and allowed(op, ResourceType.CLUSTER, CLUSTER_NAME)
                    ):
                        continue
                    denial = Denial(rtype, name, op)
                    denials.append(denial)
                    why = _message([denial], principal)
                    refused[i] = entries.refused(entry, entry_need.denied, why)
                    break
        changes: dict[str, Any] = {}
        if refused:
            assert entries is not None
            every = entries.of_request(request)
            if len(refused) == len(every) and not entries.handled_when_none_left:
                answers: dict[str, Any] = {entries.answers: [refused[i] for i in refused]}
                refusal = request.response(**answers)
                return Judgement(
                    request, True, refusal if request.expects_answer() else None, denials
                )
            changes[entries.field] = [e for i, e in enumerate(every) if i not in refused]
        # The omissions: the request's lists now, the response's in `finish`.
        in_response = []
        for omission in requirements.omissions:
            if not omission.applies(request):
                continue
            if omission.in_response:
                in_response.append(omission)
                continue
            path = omission.names
            names = getattr(request, path.field)
            if names:
                op, rtype = omission.operation, omission.resource_type
                changes[path.field] = [n for n in names if allowed(op, rtype, path.name(n))]
        if changes:
            request = msgspec.structs.replace(request, **changes)
        return Judgement(
            request, False, None, denials, entries, refused, tuple(in_response), allowed
        )


def _message(denied: list[Denial], principal: str) -> str:
    first = denied[0]
    more = f" (and {len(denied) - 1} more)" if len(denied) > 1 else ""
    return (
        f"{principal} may not {first.operation} {first.resource_type} {first.resource_name!r}{more}"
    )


def _refusal(
    request: Request, entries: Entries | None, code: ErrorCode, why: str
) -> Response | None:
    """The answer to a request refused whole: `code` at the top and in every entry."""
    if not request.expects_answer():
        return None
    answers: dict[str, Any] = {}
    if entries is not None:
        answers[entries.answers] = [
            entries.refused(e, code, why) for e in entries.of_request(request)
        ]
    return request.response(error=code, message=why, **answers)


# ---------------------------------------------------------------------- audit


class Audit:
    """One line per denial on the `minibroker.audit` logger, each repeat of a denial (same
    principal, API, resource and operation) within `repeat_s` of its last line held back
    and counted in the next line logged for it (`held_back=N`)."""

    def __init__(
        self,
        repeat_s: float = AUDIT_REPEAT_S,
        keys_max: int = AUDIT_KEYS_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # A module-level logger would be named after this module (tests/test_layout.py).
        self.log = logging.getLogger(AUDIT_LOGGER)
        self.repeat_s = repeat_s
        self.keys_max = keys_max
        self.clock = clock
        # key -> [when its last line was logged, repeats held back since]
        self._last: OrderedDict[tuple[str, str, str, str, str, str], list[float]] = OrderedDict()

    def denied(self, principal: str, host: str, api: str, denials: Iterable[Denial]) -> None:
        now = self.clock()
        last = self._last
        for denial in denials:
            key = (principal, host, api, *denial)
            seen = last.get(key)
            if seen is not None and now - seen[0] < self.repeat_s:
                seen[1] += 1
                continue
            held_back = 0 if seen is None else int(seen[1])
            last[key] = [now, 0]
            last.move_to_end(key)
            if len(last) > self.keys_max:
                last.popitem(last=False)
            self.log.info(
                "event=authorization_denied principal=%r host=%s api=%s resource_type=%s "
                "resource=%r operation=%s held_back=%d",
                principal,
                host,
                api,
                denial.resource_type,
                denial.resource_name,
                denial.operation,
                held_back,
            )
