"""docs/security.md's walk-through, run as written: a `sasl_tls` broker with the
authorizer on, the first admin from MINIBROKER_BOOTSTRAP_USERS, users and ACLs made
with the guide's `minibroker users` and `minibroker acls` commands, then a producer,
a consumer group and a Spark job's exactly-once write (the connector's own
transaction code, without Spark), each as its own principal with exactly the ACLs
the guide gives it. Each is also refused one thing it was not given, and the refusal
changes nothing."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from client import Consumer, Producer, TopicPartition, admin
from client.config import AdminConfig
from client.errors import AuthorizationFailedError
from harness.broker_process import BrokerProcess
from spark_connector import transactions
from tests.security_fixtures import Pki

ROOT = Path(__file__).resolve().parents[3]
ADMIN_PASSWORD = "first-admin-Password-1"
PASSWORDS = {"orders-app": "orders-Password-2", "billing": "billing-Password-3", "etl": "etl-4"}

# The guide's commands, in its order (each also gets --bootstrap-server and
# --client-config admin.toml).
GUIDE = [
    ["topics", "create", "orders", "--partitions", "3"],
    ["topics", "create", "payments", "--partitions", "1"],
    *(["users", "add", user, "--password-stdin"] for user in PASSWORDS),
    # a producer
    ["acls", "add", "--allow-principal", "User:orders-app", "--operation", "write",
     "--topic", "orders"],
    # a consumer group
    ["acls", "add", "--allow-principal", "User:billing", "--operation", "read",
     "--topic", "orders", "--group", "billing"],
    # a transactional Spark job
    ["acls", "add", "--allow-principal", "User:etl", "--operation", "write", "--topic", "orders"],
    ["acls", "add", "--allow-principal", "User:etl", "--operation", "write",
     "--transactional-id", "spark-", "--resource-pattern-type", "prefixed"],
    ["acls", "add", "--allow-principal", "User:etl", "--operation", "describe", "--cluster"],
]  # fmt: skip


def test_the_guide_shows_these_commands() -> None:
    """The commands run below are the guide's (its users are added at a prompt; the
    second topic is the test's, to be refused)."""
    guide = " ".join((ROOT / "docs" / "security.md").read_text().replace("\\\n", " ").split())
    for command in GUIDE:
        if command[:3] == ["topics", "create", "payments"]:
            continue
        shown = [word for word in command if word != "--password-stdin"]
        assert "minibroker " + " ".join(shown) in guide, shown


def settings(pki: Pki) -> str:
    return (
        f'tls_certfile = "{pki.certfile}"\n'
        f'tls_keyfile = "{pki.keyfile}"\n'
        'sasl_mechanisms = ["SCRAM-SHA-512", "SCRAM-SHA-256"]\n'
        "authorizer = true\n"
        'super_users = ["User:admin"]\n'
        '[[listeners]]\nname = "clients"\nhost = "127.0.0.1"\nport = 0\nsecurity = "sasl_tls"\n'
        'advertised_host = "localhost"\n'
    )


def client_settings(ca: Path, user: str, password: str) -> dict[str, Any]:
    return {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(ca),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }


def test_the_guide_secures_a_broker_for_a_producer_a_group_and_spark(
    tmp_path: Path, backend: str
) -> None:
    pki = Pki.create(tmp_path / "tls")
    ca = tmp_path / "ca.pem"
    pki.server_ca.cert_pem.write_to_path(str(ca))
    broker = BrokerProcess(
        tmp_path / "data",
        backend=backend,
        config=settings(pki),
        env={"MINIBROKER_BOOTSTRAP_USERS": f"admin:{ADMIN_PASSWORD}"},
    ).start()
    try:
        bootstrap = f"localhost:{broker.listener_ports['clients']}"
        admin_toml = tmp_path / "admin.toml"
        admin_toml.write_text(
            "".join(
                f'{key} = "{value}"\n'
                for key, value in client_settings(ca, "admin", ADMIN_PASSWORD).items()
            )
        )
        for command in GUIDE:
            stdin = PASSWORDS[command[2]] if command[:2] == ["users", "add"] else ""
            done = subprocess.run(
                [sys.executable, "-m", "minibroker_cli", *command, "--bootstrap-server",
                 bootstrap, "--client-config", str(admin_toml)],
                input=stdin.encode(), capture_output=True, cwd=ROOT, timeout=60,
            )  # fmt: skip
            assert done.returncode == 0, (command, done.stderr.decode())
        as_admin = AdminConfig(
            bootstrap_servers=bootstrap, **client_settings(ca, "admin", ADMIN_PASSWORD)
        )

        def as_(user: str) -> dict[str, Any]:
            return client_settings(ca, user, PASSWORDS[user])

        def end_offsets(topic: str, partitions: int) -> list[int]:
            with Consumer(
                bootstrap_servers=bootstrap, **client_settings(ca, "admin", ADMIN_PASSWORD)
            ) as c:
                tps = [TopicPartition(topic, p) for p in range(partitions)]
                ends = c.end_offsets(tps)
                return [ends[tp] for tp in tps]

        # The producer writes to orders (idempotent: InitProducerId is allowed by its
        # write on a topic), and nowhere else.
        with Producer(bootstrap, **as_("orders-app")) as p:
            for i in range(3):
                p.send("orders", f"order-{i}".encode(), partition=0).get(timeout=10)
        with (
            Producer(bootstrap, max_block_ms=3000, **as_("orders-app")) as p,
            pytest.raises(AuthorizationFailedError, match="TOPIC_AUTHORIZATION_FAILED"),
        ):
            p.send("payments", b"x", partition=0).get(timeout=10)
        assert end_offsets("payments", 1) == [0]

        # The Spark job: each task attempt's transaction, named as the connector names
        # it, prepared under the write's app id; then the driver commits them all.
        write_id = "spark-0123456789abcdef"
        with Producer(
            bootstrap, transactional_id=transactions.transactional_id(write_id, 0, 0), **as_("etl")
        ) as p:
            p.init_transactions()
            p.begin_transaction()
            for i in range(2):
                p.send("orders", f"etl-{i}".encode(), partition=1)
            handle = p.prepare_transaction(app_id=write_id, app_version=0)
        etl_admin = AdminConfig(bootstrap_servers=bootstrap, **as_("etl"))
        ended = transactions.commit(etl_admin, write_id, [handle], write_id, 0)
        assert ended == transactions.Ended(already=False, aborted=0)
        (app,) = admin.describe_txn_apps(etl_admin, [write_id])
        assert app.txn_app_version == 0
        # Its transactional ids are spark-...: any other name is refused, changing nothing.
        with (
            Producer(bootstrap, transactional_id="nightly-1", max_block_ms=3000, **as_("etl")) as p,
            pytest.raises(AuthorizationFailedError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
        ):
            p.init_transactions()
        assert admin.list_transactions(as_admin, "nightly-") == []

        # The consumer group reads what both wrote (read_committed) and commits.
        with Consumer(
            "orders",
            bootstrap_servers=bootstrap,
            group_id="billing",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            consumer_timeout_ms=10_000,
            **as_("billing"),
        ) as c:
            # Five records, the topic's all (its end offsets are checked below).
            values = sorted(r.value for r in itertools.islice(c, 5))
            assert c.poll(timeout_ms=300) == {}
            c.commit()
        assert values == [b"etl-0", b"etl-1", b"order-0", b"order-1", b"order-2"]
        # Another group is not billing's.
        with (
            Consumer(
                "orders",
                bootstrap_servers=bootstrap,
                group_id="audit",
                auto_offset_reset="earliest",
                consumer_timeout_ms=3000,
                **as_("billing"),
            ) as c,
            pytest.raises(AuthorizationFailedError, match="GROUP_AUTHORIZATION_FAILED"),
        ):
            list(c)
        assert "audit" not in [g.group_id for g in admin.list_groups(as_admin)]
        assert end_offsets("orders", 3) == [3, 3, 0]  # 2 records and a commit marker
        assert broker.log_shows("event=authorization_denied principal='User:etl'")
    finally:
        broker.kill()


def _guide_shell_blocks() -> list[str]:
    """The ```sh blocks of the guide's walk-through, in order."""
    text = (ROOT / "docs" / "security.md").read_text()
    section = text[text.index("## A secured broker, step by step") : text.index("\n## Listeners")]
    return re.findall(r"```sh\n(.*?)```", section, re.DOTALL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_the_walkthrough_runs_as_written_on_a_fresh_machine(tmp_path: Path) -> None:
    """Every shell block of the guide, in a bash of a fresh HOME (no minibroker user, no
    host name, no sudo), with `minibroker` on the PATH: the broker from step 3 in the
    background (as in a terminal of its own), the rest once it listens. Only the ports
    differ (free ones for 9093 and 9645), so that it runs beside anything."""
    port, metrics_port = _free_port(), _free_port()
    blocks = [b.replace("9093", str(port)).replace("9645", str(metrics_port)) for b in
              _guide_shell_blocks()]  # fmt: skip
    serving = next(i for i, block in enumerate(blocks) if "minibroker serve" in block)
    *before_serve, serve = blocks[serving].rstrip("\n").split("\n")
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    shim = bin_dir / "minibroker"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m minibroker_cli "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIBROKER_")}
    env |= {"HOME": str(home), "PATH": f"{bin_dir}:{env['PATH']}", "PYTHONPATH": str(ROOT)}

    def bash(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            capture_output=True, text=True, cwd=home, env=env, timeout=120,
        )  # fmt: skip

    prepared = bash("\n".join([*blocks[:serving], *before_serve]))
    assert prepared.returncode == 0, prepared.stderr
    workdir = home / "minibroker-secure"
    broker = subprocess.Popen(
        ["bash", "-c", serve], cwd=workdir, env=env, text=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    log: list[str] = []
    listening = threading.Event()

    def read_log() -> None:
        assert broker.stderr is not None
        for line in broker.stderr:
            log.append(line)
            if "event=listening" in line:
                listening.set()
        listening.set()  # it exited

    threading.Thread(target=read_log, daemon=True).start()
    try:
        assert listening.wait(60) and broker.poll() is None, "".join(log)
        assert any("event=credentials_bootstrapped users=['admin']" in line for line in log)
        done = bash("\n".join(blocks[serving + 1 :]))
        assert done.returncode == 0, done.stderr
        # Step 8's listing: the Spark job's three bindings.
        *_, header, topic, transactional_id, cluster = done.stdout.splitlines()
        assert header.startswith("PRINCIPAL\t")
        assert topic == "User:etl\t*\twrite\tallow\ttopic\torders\tliteral"
        assert transactional_id == "User:etl\t*\twrite\tallow\ttransactional_id\tspark-\tprefixed"
        assert cluster == "User:etl\t*\tdescribe\tallow\tcluster\tcluster\tliteral"
        # The users made in step 4 log in with their passwords, with what they were given.
        produced = bash(
            "cd ~/minibroker-secure && sed -e 's/admin/orders-app/' "
            '-e "s|^sasl_plain_password.*|sasl_plain_password = \\"$(cat orders-app-password)\\"|" '
            "admin.toml > orders-app.toml && echo paid | minibroker produce orders "
            f"--bootstrap-server 127.0.0.1:{port} --client-config orders-app.toml"
        )
        assert produced.returncode == 0, produced.stderr
        assert (workdir / "data-secure" / "topics" / "orders").is_dir()
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        broker.wait(30)
