"""How the packages depend on each other, and the `minibroker` command that joins them."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from broker import __version__

ROOT = Path(__file__).resolve().parent.parent

# Each package's modules all imported in a fresh interpreter, then sys.modules checked.
_IMPORT_ALL = """
import importlib, pkgutil, sys
package, forbidden = sys.argv[1], sys.argv[2:]
root = importlib.import_module(package)
for info in pkgutil.walk_packages(root.__path__, package + "."):
    if not info.name.endswith(".__main__"):
        importlib.import_module(info.name)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
print(" ".join(leaked))
"""


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        # The broker runs without the client SDK; only minibroker_cli joins the two.
        ("broker", ["client", "spark_connector", "minibroker_cli"]),
        # Applications import the SDK without the broker.
        ("client", ["broker", "minibroker_cli"]),
        # The wire contract is sans IO: no event loop, no sockets.
        ("protocol", ["broker", "client", "spark_connector", "anyio", "trio", "socket"]),
    ],
)
def test_package_does_not_import(package: str, forbidden: list[str]) -> None:
    r = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, package, *forbidden],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == []


def test_minibroker_version() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "minibroker_cli", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"minibroker {__version__}"
    assert __version__ != "unknown"  # the test environment has minibroker installed


@pytest.mark.parametrize("package", ["broker", "client", "protocol", "spark_connector"])
def test_every_logger_is_in_the_minibroker_tree(package: str) -> None:
    """`broker.logs.setup` and the SIGHUP level change act on the `minibroker` logger, so
    a module logging anywhere else would escape both the format and the level."""
    if package == "spark_connector":
        pytest.importorskip("pyspark")
    root = importlib.import_module(package)
    found = 0
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if info.name.endswith(".__main__"):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, logging.Logger):
                assert value.name == f"minibroker.{info.name}"
                found += 1
    assert found or package == "protocol"
