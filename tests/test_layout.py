"""How the packages depend on each other, and the `minibroker` command that joins them."""

from __future__ import annotations

import ast
import graphlib
import importlib
import logging
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

from broker import __version__
from broker.kafka.kafka_only import KafkaOnlyRequest
from harness.broker_process import BrokerProcess
from protocol import messages as m

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
        # Kafka's wire (kio) is the kafka listener's business, in broker/kafka/.
        ("protocol", ["broker", "client", "spark_connector", "anyio", "trio", "socket", "kio"]),
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
        "partitions",
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


def _room_order() -> list[str]:
    """broker/'s rooms, each after every room it imports; CycleError names a circle."""
    graph: dict[str, set[str]] = {}
    for path, name in _broker_imports():
        rel = path.relative_to(BROKER)
        importer = _unit("broker." + ".".join(rel.with_suffix("").parts))
        imported = _unit(name)
        graph.setdefault(importer, set())
        if imported != importer:
            graph[importer].add(imported)
    return list(graphlib.TopologicalSorter(graph).static_order())


def test_broker_rooms_import_each_other_without_a_circle() -> None:
    """The domains and the top-level modules form layers: no import runs back up."""
    order = _room_order()
    assert order.index("broker.storage") < order.index("broker.partitions")
    assert order.index("broker.partitions") < order.index("broker.transactions")
    assert order.index("broker.partitions") < order.index("broker.groups")
    assert order.index("broker.api") < order.index("broker.network") < order.index("broker.app")


def test_the_native_contract_holds_native_apis_only() -> None:
    """protocol/messages.py is the minibroker listener's wire contract: every request
    class there is one that listener decodes and its API table lists. A Kafka API the
    native protocol lacks is a `KafkaOnlyRequest` in its family's module of
    broker/kafka/apis/, and never takes a native API's name."""
    defined = [c for c in vars(m).values() if isinstance(c, type) and issubclass(c, m.Request)]
    assert set(defined) - {m.Request} == set(m.REQUEST_CLASSES)
    assert m.__doc__ is not None
    listed = set(re.findall(r"^\| (\w+) ", m.__doc__, re.MULTILINE))
    assert set(m.REQUEST_TYPES) <= listed
    for info in pkgutil.walk_packages([str(BROKER / "kafka")], "broker.kafka."):
        importlib.import_module(info.name)
    kafka_only: list[type[KafkaOnlyRequest]] = []
    pending = [KafkaOnlyRequest]
    while pending:
        subclasses = pending.pop().__subclasses__()
        kafka_only += subclasses
        pending += subclasses
    assert all(str(c.__struct_config__.tag) not in m.REQUEST_TYPES for c in kafka_only)


def test_the_kafka_codec_stays_out_of_the_network() -> None:
    """broker/network/ runs a kafka listener's connections with the codec, not the other
    way round: broker/kafka/ imports nothing of broker/network/."""
    kafka = BROKER / "kafka"
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path, name in _broker_imports()
        if path.is_relative_to(kafka) and _unit(name) == "broker.network"
    ]
    assert wrong == []


def test_metrics_imports_the_transaction_names_it_labels() -> None:
    """The abort causes and the coordinator's figures are the transactions domain's;
    metrics imports them, so nothing the coordinator imports may import metrics."""
    order = _room_order()
    assert order.index("broker.transactions") < order.index("broker.metrics")
    assert order.index("broker.partitions") < order.index("broker.metrics")


def test_the_transaction_states_and_admission_rules_are_pure() -> None:
    """`broker/transactions/state.py` holds the transitions and the admission rules, which
    the coordinator and its unit tests share: values in, values out, no IO or clock."""
    path = BROKER / "transactions" / "state.py"
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported & {"anyio", "trio", "asyncio", "socket", "os", "time", "broker"} == set()


def test_the_audit_logger_is_named_once() -> None:
    """Operators route the audit trail by its logger's name: one definition, in logs.py."""
    named = [
        str(path.relative_to(ROOT))
        for path in sorted(BROKER.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant) and node.value == "minibroker.audit"
    ]
    assert named == ["broker/logs.py"]


def test_bench_modules_import_each_other_without_a_circle() -> None:
    """A suite shares code through a module both import (bench/open_loop.py), never by
    reaching into another suite that reaches back, even inside a function."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "bench").glob("*.py")):
        importer = f"bench.{path.stem}"
        graph.setdefault(importer, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "bench":
                names = [f"bench.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            graph[importer] |= {n for n in names if n.startswith("bench.") and n != importer}
    list(graphlib.TopologicalSorter(graph).static_order())  # CycleError names a circle


CLIENT = ROOT / "client"


def _imported_modules(path: Path) -> set[str]:
    """The modules a file imports, `from a import b` read as a.b when b is a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(
                f"{node.module}.{a.name}"
                for a in node.names
                if (ROOT / node.module.replace(".", "/") / f"{a.name}.py").is_file()
            )
    return found


def test_the_transaction_manager_is_pure_and_beside_the_accumulator() -> None:
    """The transaction manager takes answers in and hands batches out, as the accumulator
    does: no event loop, no socket, no I/O module of the client. The accumulator asks it
    through `TransactionGate` and never imports it, so the two make no circle."""
    io = {"anyio", "trio", "asyncio", "socket", "client.sender", "client.connection"}
    manager = _imported_modules(CLIENT / "transaction_manager.py")
    assert {m for m in manager if m in io or m.split(".")[0] in io} == set()
    assert "client.transaction_manager" not in _imported_modules(CLIENT / "accumulator.py")


def _private_uses_of_the_core(face: str, path: Path) -> list[str]:
    """`_name`s that class `face` reads off its async core (`self._core`, or `core`)."""
    tree = ast.parse(path.read_text(), str(path))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == face)
    found = []
    for node in ast.walk(cls):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "core") or (
            isinstance(owner, ast.Attribute)
            and owner.attr == "_core"
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "self"
        ):
            found.append(f"{face} line {node.lineno}: {node.attr}")
    return found


def test_the_sync_consumer_uses_only_the_async_ones_public_api() -> None:
    """The sync Consumer is a face: what it needs of AsyncConsumer is public, so the core
    can change inside without the face (its rebalance, with the listener called on the
    polling thread, is the core's own, reached through PortalThread.call_serving)."""
    assert _private_uses_of_the_core("Consumer", CLIENT / "consumer.py") == []


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


# The tests of the whole tree stay at the top of tests/; every other test lives under
# the folder that mirrors its code (docs/architecture.md).
TREE_TESTS = {"test_layout.py", "test_deploy.py", "test_bench_progress.py"}
TEST_FOLDERS = {"protocol", "client", "broker", "kafka", "spark", "reliability"}


def test_tests_mirror_the_code() -> None:
    """A newcomer finds a module's tests by its path: tests/<package>/ and, for the
    broker's domains, tests/broker/<domain>/."""
    tests = ROOT / "tests"
    assert {p.name for p in tests.glob("test_*.py")} <= TREE_TESTS
    folders = {p.name for p in tests.iterdir() if (p / "__init__.py").is_file()}
    assert folders == TEST_FOLDERS
    broker_folders = {p.name for p in (tests / "broker").iterdir() if p.is_dir()} - {"__pycache__"}
    assert broker_folders <= set(DOMAINS)
