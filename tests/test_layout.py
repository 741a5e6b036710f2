"""How the packages depend on each other, and the `minibroker` command that joins them."""

from __future__ import annotations

import ast
import graphlib
import importlib
import logging
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from broker import __version__
from harness.broker_process import BrokerProcess

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


# broker/'s domains: the sub-packages (storage, transactions, groups, network, ...).
BROKER = ROOT / "broker"
DOMAINS = sorted(p.name for p in BROKER.iterdir() if (p / "__init__.py").is_file())


def _broker_imports() -> list[tuple[Path, str]]:
    """(importing file, imported module) for every `broker.*` import in broker/, with
    `from broker.d import m` read as broker.d.m when m is a module of domain d."""
    found = []
    for path in sorted(BROKER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
                names += [
                    f"{node.module}.{a.name}"
                    for a in node.names
                    if (BROKER.parent / node.module.replace(".", "/") / f"{a.name}.py").is_file()
                ]
            else:
                continue
            found += [(path, n) for n in names if n.startswith("broker.")]
    return found


def _unit(name: str) -> str:
    """The room a broker module belongs to: its domain package, or itself at the top."""
    parts = name.split(".")
    return ".".join(parts[:2])


def test_domains_are_entered_through_their_package() -> None:
    """A domain's modules are its own business: the rest of the broker imports what the
    domain's __init__ exports, so a change inside one domain stays in its folder."""
    assert DOMAINS == ["groups", "kafka", "network", "security", "storage", "transactions"]
    wrong = []
    for path, name in _broker_imports():
        parts = name.split(".")
        own = path.relative_to(BROKER).parts[0]
        if len(parts) > 2 and parts[1] in DOMAINS and parts[1] != own:
            wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert wrong == []


@pytest.mark.parametrize("domain", DOMAINS)
def test_domain_exports_are_defined(domain: str) -> None:
    module = importlib.import_module(f"broker.{domain}")
    assert module.__all__, f"broker.{domain} exports nothing"
    assert all(hasattr(module, name) for name in module.__all__)


def test_broker_rooms_import_each_other_without_a_circle() -> None:
    """The domains and the top-level modules form layers: no import runs back up."""
    graph: dict[str, set[str]] = {}
    for path, name in _broker_imports():
        rel = path.relative_to(BROKER)
        importer = _unit("broker." + ".".join(rel.with_suffix("").parts))
        imported = _unit(name)
        graph.setdefault(importer, set())
        if imported != importer:
            graph[importer].add(imported)
    order = list(graphlib.TopologicalSorter(graph).static_order())  # CycleError names a circle
    assert order.index("broker.storage") < order.index("broker.partition")
    assert order.index("broker.handlers") < order.index("broker.network")


# What tests/conftest.py reads to mark `wire` the tests that start a broker process
# (`make test-fast` leaves them out): samples of each way a test may start one, named
# by strings so that the test reading them is not itself one that starts a broker.
SAMPLES = ("_starts_a_broker", "_runs_broker_serve", "_through_a_helper", "_pure")


def _starts_a_broker(data: Path) -> None:
    BrokerProcess(data).start()


def _runs_broker_serve(data: Path) -> None:
    subprocess.run([sys.executable, "-m", "broker", "serve", "--data-dir", str(data)], check=False)


def _through_a_helper(data: Path) -> None:
    _starts_a_broker(data / "nested")


def _pure(data: Path) -> None:
    data.joinpath("broker").write_text("no process")


def test_tests_that_start_a_broker_are_marked_wire() -> None:
    from tests.conftest import _starts_brokers

    samples = {name: globals()[name] for name in SAMPLES}
    for name in SAMPLES[:-1]:
        assert _starts_brokers(samples[name], set()), name
    assert not _starts_brokers(samples["_pure"], set())
