"""Shared fixtures: a real broker process per test, on either AnyIO backend.

Every test that starts a broker process is marked `wire` here, so `make test-fast`
can leave them out without a list of files to keep up to date.
"""

from __future__ import annotations

import os
import subprocess
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.testing import running_broker
from harness.broker_process import BrokerProcess, serve_once

BACKENDS = ("trio", "asyncio")
_BROKER_STARTERS = (BrokerProcess, serve_once, running_broker)
# Only the project's own helpers are followed, not the libraries they call.
_OWN_PACKAGES = ("tests", "harness")


def _code_words(code: types.CodeType) -> tuple[set[str], set[str]]:
    """The names and the string constants of `code` and of the code nested in it."""
    names, strings = set(code.co_names), {c for c in code.co_consts if isinstance(c, str)}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            inner_names, inner_strings = _code_words(const)
            names |= inner_names
            strings |= inner_strings
    return names, strings


def _starts_brokers(func: object, seen: set[int]) -> bool:
    """Whether `func` starts a broker process: it names a harness starter (imported
    anywhere), runs `python -m broker serve` itself, or calls a helper of tests/ or
    harness/ (a function, or a class's methods) that does, however deep."""
    func = getattr(func, "__func__", func)  # a test method: its function
    if id(func) in seen:
        return False
    seen.add(id(func))
    if isinstance(func, type):
        return any(_starts_brokers(f, seen) for f in vars(func).values())
    if not isinstance(func, types.FunctionType):
        return False
    names, strings = _code_words(func.__code__)
    if {"broker", "serve"} <= strings or any(s.__name__ in names for s in _BROKER_STARTERS):
        return True
    for name in names:
        value = func.__globals__.get(name)
        own = getattr(value, "__module__", None) or ""
        if own.split(".")[0] in _OWN_PACKAGES and _starts_brokers(value, seen):
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    """Load the `minibroker` plugin (broker/pytest_plugin.py) when the installed package
    predates its pytest11 entry point (pyproject.toml); an install that has it loads it
    itself, under that name."""
    if not config.pluginmanager.has_plugin("minibroker"):
        config.pluginmanager.import_plugin("broker.pytest_plugin")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `wire` each test that starts a broker process: its function or one of its
    fixtures names the harness's broker starters, directly or through helpers."""
    for item in items:
        funcs = [getattr(item, "obj", None)]
        fixture_info = getattr(item, "_fixtureinfo", None)
        if fixture_info is not None:
            for definitions in fixture_info.name2fixturedefs.values():
                funcs += [d.func for d in definitions]
        seen: set[int] = set()
        if any(_starts_brokers(f, seen) for f in funcs):
            item.add_marker(pytest.mark.wire)


# The tests that share a session-wide resource, by node id prefix: one worker runs them all.
_ONE_WORKER = {"tests/spark/": "spark"}  # one local SparkSession (tests/spark/conftest.py)


@pytest.hookimpl(optionalhook=True)  # a run without xdist (-p no:xdist) has no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under `--dist loadgroup`, each prefix of _ONE_WORKER is one unit of work and every
    other test its own. xdist's own grouping (the xdist_group mark) renames the node ids,
    which pytest 9.2 no longer lets a plugin do, so the groups are made here instead.
    xdist hands out the largest units first (--loadscope-reorder, its default), so the
    Spark unit, the longest, starts at once and the other workers share the rest."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class OneWorkerGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            for prefix, group in _ONE_WORKER.items():
                if nodeid.startswith(prefix):
                    return group
            return nodeid

    return OneWorkerGroups(config, log)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def broker(tmp_path: Path, backend: str) -> Iterator[BrokerProcess]:
    """A running broker on loopback with a fresh data dir, on each backend in turn."""
    proc = BrokerProcess(tmp_path / "data", backend=backend).start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, for the tests of a full disk (root only; skipped elsewhere)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 4 MiB tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False, timeout=30)
