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
    assert DOMAINS == [
        "api",
        "groups",
        "kafka",
        "network",
        "security",
        "storage",
        "transactions",
    ]
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
    assert order.index("broker.api") < order.index("broker.network") < order.index("broker.app")


def _imported_names(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names taken from it) for every absolute import of `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names]))
    return found


# What the network may import of the rest of the broker: the settings, the logs, the
# metrics and the clocks, the security decisions (sessions, SASL admission), the Kafka
# codec, and of the APIs only what a request comes to (broker/api/outcomes.py).
NETWORK_MAY_IMPORT = {
    "broker.api",
    "broker.clock",
    "broker.config",
    "broker.kafka",
    "broker.logs",
    "broker.metrics",
    "broker.network",
    "broker.security",
}


def test_the_network_knows_the_apis_only_by_their_outcomes() -> None:
    """Listeners, connections and codecs run whatever the composition root hands them:
    no domain (storage, transactions, groups, topics) and no API module is theirs to
    import, so the start-up and the APIs change without touching the network."""
    outcomes = importlib.import_module("broker.api.outcomes")
    allowed_names = {n for n, v in vars(outcomes).items() if not n.startswith("_")}
    wrong = []
    for path in sorted((BROKER / "network").rglob("*.py")):
        for module, names in _imported_names(path):
            if not module.startswith("broker."):
                continue
            if _unit(module) not in NETWORK_MAY_IMPORT:
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
            elif _unit(module) == "broker.api" and (
                module != "broker.api" or not set(names) <= allowed_names
            ):
                wrong.append(f"{path.relative_to(ROOT)} imports {module}: {names}")
    assert wrong == []


def test_no_api_module_imports_the_network() -> None:
    """The APIs answer requests whatever carries them: broker/api/ never reaches into
    broker/network/ (the SASL handlers included)."""
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path, name in _broker_imports()
        if path.is_relative_to(BROKER / "api") and _unit(name) == "broker.network"
    ]
    assert wrong == []
