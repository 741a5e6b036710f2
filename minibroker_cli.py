"""The installed `minibroker` command: the broker's verbs and the client's in one parser.

The one module that imports both `broker` and `client`, so that neither package
depends on the other: the broker runs without the client SDK, and a client
application never imports the broker. `python -m minibroker_cli` runs it from a
source tree.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker import cli as broker_cli
from client import cli as client_cli


def main(argv: Sequence[str] | None = None) -> int:
    return broker_cli.main(argv, more=[client_cli.register])


if __name__ == "__main__":
    raise SystemExit(main())
