"""What an authorization decision costs with 10,000 ACLs against none, in process (no broker).

With `authorizer = true` the broker decides every topic, group and transactional id a
request names (docs/protocol.md section 7), so `Authorizer.authorize` is on the hot path.
It looks only at the patterns that can match the name, so its cost should not grow
with the number of ACLs; this suite checks that. The 10,000 bindings: 999 principals
with ten each (five literal topics, three prefixes, a deny, a prefixed group) and ten
of `User:*`. Each decision is timed in `ROUNDS` rounds, the cost of the timing loop's
own call subtracted, and reported as the median with the spread (min-max); beside
them, the same decision by a scan of every binding, the cost the index avoids.

    .venv/bin/python -m bench.bench_acl [--number N]

prints the rows alone, without touching docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from collections.abc import Callable
from functools import partial
from typing import Any

from bench.stats import min_max, table
from broker.security import AclBinding, Authorizer

ROUNDS = 9
PRINCIPALS = 999
HOST = "10.1.2.3"
ME = "User:u500"


def bindings() -> list[AclBinding]:
    out = []
    for i in range(PRINCIPALS):
        user = f"User:u{i}"
        out += [
            AclBinding("topic", f"t{i}-{k}", "literal", user, "*", "read", "allow")
            for k in range(5)
        ]
        out += [
            AclBinding("topic", f"p{i}-{k}-", "prefixed", user, "*", "write", "allow")
            for k in range(3)
        ]
        out.append(AclBinding("topic", f"p{i}-0-secret", "literal", user, "*", "write", "deny"))
        out.append(AclBinding("group", f"g{i}-", "prefixed", user, HOST, "read", "allow"))
    out += [
        AclBinding("topic", f"public-{k}-", "prefixed", "User:*", "*", "describe", "allow")
        for k in range(9)
    ]
    out.append(AclBinding("topic", "quarantine", "literal", "User:*", "*", "all", "deny"))
    assert len(set(out)) == 10_000
    return out


def scan(acls: list[AclBinding], principal: str, host: str, op: str, rtype: str, name: str) -> bool:
    """The decision by looking at every binding, what the index is measured against (without
    the implications of an allow, which these queries do not need)."""
    allowed = False
    for b in acls:
        if (
            b.resource_type == rtype
            and b.principal in (principal, "User:*")
            and b.host in (host, "*")
            and (
                name.startswith(b.resource_name)
                if b.pattern_type == "prefixed"
                else b.resource_name in (name, "*")
            )
        ):
            if b.permission == "deny" and b.operation in (op, "all"):
                return False
            allowed = allowed or (b.permission == "allow" and b.operation in (op, "all"))
    return allowed


# (case, operation, resource type, name, the answer with 10,000 ACLs)
QUERIES = [
    ("literal allow", "read", "topic", "t500-3", True),
    ("prefixed allow", "write", "topic", "p500-1-events", True),
    ("deny over a prefixed allow", "write", "topic", "p500-0-secret", False),
    ("no binding matches", "read", "topic", "unrelated-topic", False),
    ("prefixed group, host matched", "read", "group", "g500-consumers", True),
]


def _nothing() -> None:
    """What the timing loop costs by itself: a call through a partial."""


def _ns_per_call(fn: Callable[[], object], number: int, baseline: float = 0.0) -> list[float]:
    """ns per call of each round, less `baseline` (the timing loop's own call)."""
    return [t / number * 1e9 - baseline for t in timeit.repeat(fn, number=number, repeat=ROUNDS)]


def _row(name: str, empty: list[float], full: list[float]) -> dict[str, Any]:
    return {
        "benchmark": name,
        "ns_0_acls": statistics.median(empty),
        "spread_0_acls": min_max(empty, 0),
        "ns_10k_acls": statistics.median(full),
        "spread_10k_acls": min_max(full, 0),
        "ratio": round(statistics.median(full) / statistics.median(empty), 1),
    }


def run(number: int = 200_000) -> list[dict[str, Any]]:
    """One row per decision: ns per call with no ACL and with 10,000 (median, spread),
    and the median of a scan of the 10,000 instead."""
    acls = bindings()
    full = Authorizer()
    for b in acls:
        full.add(b)
    empty = Authorizer()
    baseline = statistics.median(_ns_per_call(partial(_nothing), number))
    rows = []
    for case, op, rtype, name, expected in QUERIES:
        assert full.authorize(ME, HOST, op, rtype, name) == expected
        assert scan(acls, ME, HOST, op, rtype, name) == expected
        costs = [
            _ns_per_call(partial(index.authorize, ME, HOST, op, rtype, name), number, baseline)
            for index in (empty, full)
        ]
        scans = _ns_per_call(partial(scan, acls, ME, HOST, op, rtype, name), max(number // 2000, 5))
        rows.append(
            {**_row(f"acl authorize, {case}", *costs), "scan_10k_acls_ns": statistics.median(scans)}
        )
    costs = [
        _ns_per_call(partial(index.authorize_any, ME, HOST, "write", "topic"), number, baseline)
        for index in (empty, full)
    ]
    rows.append(_row("acl authorize_any, write on any topic", *costs))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000, help="calls per round")
    print(table(run(parser.parse_args().number)))


if __name__ == "__main__":
    main()
