"""How the packages depend on each other, and the `minibroker` command that joins them."""

from __future__ import annotations

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
        ("protocol", ["broker", "client", "spark_connector"]),
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
