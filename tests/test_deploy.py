"""Every file in deploy/ is checked here, by the tool that owns its format where one exists.

promtool comes from Debian's `prometheus` package (`make test` installs it);
systemd-analyze from systemd. Where a tool is missing the test says so and skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from broker.metrics import PRODUCER_EVENT_KINDS, BrokerMetrics, OffsetStats, PartitionStats
from broker.transactions import TxnStats

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "minibroker.service"
EXEC_START_BINARY = "/opt/minibroker/bin/minibroker"

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian: apt-get install -y --no-install-recommends prometheus)",
)
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed (no systemd tools here)"
)

METRIC_NAME = re.compile(r"\b((?:minibroker|process|python)_[A-Za-z0-9_]+)")


def run(*cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


def exercised_metrics(data_dir: Path) -> BrokerMetrics:
    """A BrokerMetrics with every method called, so every series exists."""
    m = BrokerMetrics()
    m.observe_request("Produce", 0, 0.0004)
    m.observe_request("Produce", 45, 0.0004)
    m.observe_request("Fetch", 1, 0.2)
    m.observe_request("NoSuchApi", 35, 0.0001)
    m.record_produce("orders", 2048, 16)
    m.record_fetch("orders", 1024, 8)
    for kind in PRODUCER_EVENT_KINDS:
        m.producer_event(kind, 2)
    m.set_producer_ids_max(100_000)
    m.observe_fsync(0.003, 7)
    m.connection_opened()
    m.connection_closed()
    m.connection_opened()
    m.set_listener("default", insecure=False)
    m.tls_handshake_failed("default")
    m.authentication("default", "SCRAM-SHA-256", "success")
    m.authorization_denied("Produce", "topic")
    m.set_recovery_seconds(0.75)
    m.set_data_dir(data_dir)
    m.set_partition_source(
        lambda: [
            PartitionStats("orders", 0, 100, 10, 90, 65536, 4),
            PartitionStats("orders", 1, 0, 0, 0, 0, 0),
            PartitionStats("weird.topic-name_1", 0, 5, 0, 5, 100, 1),
        ]
    )
    now_ms = int(time.time() * 1000)
    m.set_transaction_source(
        lambda: TxnStats(
            states=Counter({"ONGOING": 1, "COMPLETE_COMMIT": 3, "COMPLETE_ABORT": 1}),
            commits=3,
            aborts={"client": 1},
            oldest_open_ms={("orders", 0): now_ms - 5_000},
        )
    )
    m.set_offset_source(
        lambda: OffsetStats(
            groups=2,
            committed=3,
            pending=1,
            commits={"OffsetCommit": 7, "TxnOffsetCommit": 2},
            expired=1,
            lag=[("billing", "orders", 0, 10), ("billing", "orders", 1, 0)],
            lag_omitted=1,
        )
    )
    return m


def exported_names(tmp_path: Path) -> set[str]:
    """Every sample name /metrics can show (histograms as _bucket/_sum/_count)."""
    body, _ = exercised_metrics(tmp_path).render()
    names = set()
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_operations_guide_names_exactly_the_labels_of_the_metrics(tmp_path: Path) -> None:
    body, _ = exercised_metrics(tmp_path).render()
    exported = {
        label
        for line in body.decode().splitlines()
        if line.startswith("minibroker_")
        for label in re.findall(r'[{,](\w+)="', line)
    } - {"le"}  # a histogram's buckets
    ops = (ROOT / "docs" / "operations.md").read_text()
    sentence = ops.split("Labels are only ", 1)[1].split(", all of bounded cardinality", 1)[0]
    assert set(re.findall(r"`(\w+)`", sentence)) == exported
    # Said once: two drafts of the paragraph were once merged into one.
    assert ops.count("a client invents") == ops.count("are never labels") == 1


def load_yaml(path: Path) -> Any:
    """PyYAML when this interpreter has it, else a system python3 that has it, else skip."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        pass
    else:
        with path.open() as f:
            return yaml.safe_load(f)
    code = "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)"
    for python in ("/usr/bin/python3", shutil.which("python3")):
        if python and os.path.exists(python) and python != sys.executable:
            r = run(python, "-c", code, str(path))
            if r.returncode == 0:
                return json.loads(r.stdout)
    pytest.skip("no YAML parser: add pyyaml to the dev extra (or apt-get install python3-yaml)")


# --------------------------------------------------------------------------- promtool


@needs_promtool
def test_promtool_check_metrics_on_the_broker_exposition(tmp_path: Path) -> None:
    body, _ = exercised_metrics(tmp_path).render()
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=60)
    # promtool prints lint problems (naming, units, counters without _total) and exits 1.
    assert r.returncode == 0, (r.stdout + r.stderr).decode()
    assert not r.stdout.strip(), r.stdout.decode()


@needs_promtool
def test_promtool_check_rules() -> None:
    r = run(PROMTOOL, "check", "rules", str(DEPLOY / "alerts.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@needs_promtool
def test_promtool_unit_tests_of_the_alerts() -> None:
    """deploy/alerts_test.yml feeds series to every alert and checks it fires (and
    does not fire) when it should, with its rendered annotations."""
    r = run(PROMTOOL, "test", "rules", "alerts_test.yml", cwd=DEPLOY)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_check_config(tmp_path: Path) -> None:
    shutil.copy(DEPLOY / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copy(DEPLOY / "alerts.yml", tmp_path / "alerts.yml")
    r = run(PROMTOOL, "check", "config", "prometheus.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 rule files found" in r.stdout + r.stderr


@needs_promtool
def test_promtool_check_secure_config(tmp_path: Path) -> None:
    """prometheus-secure.yml, with the CA and password files where compose-secure.yaml
    mounts them moved into the test's directory (promtool reads them)."""
    text = (DEPLOY / "prometheus-secure.yml").read_text()
    for mounted in (
        "/etc/prometheus/minibroker-ca.pem",
        "/etc/prometheus/minibroker-metrics-password",
    ):
        assert text.count(mounted) == 1, mounted
        local = tmp_path / Path(mounted).name
        local.write_text("placeholder\n")
        text = text.replace(mounted, str(local))
    (tmp_path / "prometheus.yml").write_text(text)
    shutil.copy(DEPLOY / "alerts.yml", tmp_path / "alerts.yml")
    r = run(PROMTOOL, "check", "config", "prometheus.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 rule files found" in r.stdout + r.stderr


def test_every_alert_is_tested_and_documented() -> None:
    alerts = re.findall(r"^\s*- alert: (\w+)", (DEPLOY / "alerts.yml").read_text(), re.M)
    assert {
        "MinibrokerDown",
        "FsyncLatencyHigh",
        "DiskNearlyFull",
        "PartitionLsoStuck",
        "ProducerIdCapNearLimit",
        "TransactionOpenTooLong",
        "TransactionsTimingOut",
        "ConsumerLagGrowing",
        "AuthenticationFailuresBurst",
        "AuthorizationDenialsSustained",
    } <= set(alerts)
    tested = set(re.findall(r"alertname: (\w+)", (DEPLOY / "alerts_test.yml").read_text()))
    assert set(alerts) <= tested
    ops = (ROOT / "docs" / "operations.md").read_text()
    for alert in alerts:
        assert f"### {alert}" in ops, f"docs/operations.md does not explain {alert}"


def test_alert_rules_use_only_exported_metrics(tmp_path: Path) -> None:
    exported = exported_names(tmp_path)
    used = set(METRIC_NAME.findall((DEPLOY / "alerts.yml").read_text()))
    assert used, "no metric found in alerts.yml"
    assert used <= exported, (
        f"alerts.yml uses metrics the broker does not export: {used - exported}"
    )


# --------------------------------------------------------------------------- Grafana


def dashboard_exprs() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboard.json").read_text())
    exprs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "definition") and isinstance(value, str):
                    exprs.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(dashboard)
    return exprs


def test_dashboard_parses_and_queries_only_exported_metrics(tmp_path: Path) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboard.json").read_text())
    assert dashboard["uid"] == "minibroker"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for p in panels:
        assert p["targets"], p["title"]
        assert p["datasource"]["uid"] == "prometheus", p["title"]
    exported = exported_names(tmp_path)
    used = {name for e in dashboard_exprs() for name in METRIC_NAME.findall(e)}
    assert used <= exported, f"the dashboard queries metrics nobody exports: {used - exported}"
    # The dashboard covers the broker's metric families, not a handful of them.
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used if n.startswith("minibroker_")}
    exported_families = {
        re.sub(r"_(bucket|sum|count)$", "", n) for n in exported if n.startswith("minibroker_")
    }
    missing = exported_families - families - {"minibroker_metrics_collect_errors_total"}
    assert not missing, f"metrics without a dashboard panel: {missing}"


def test_dashboard_panels_do_not_overlap() -> None:
    """Grafana would push an overlapping panel somewhere else, silently; rows sit between
    their panels, in the order of the panel list."""
    dashboard = json.loads((DEPLOY / "grafana" / "dashboard.json").read_text())
    cells: dict[tuple[int, int], str] = {}
    last_y = -1
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        assert g["y"] >= last_y, f"{p['title']} is listed after a panel below it"
        last_y = g["y"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_grafana_provisioning_points_at_the_dashboard_and_datasource() -> None:
    prov = DEPLOY / "grafana" / "provisioning"
    ds = load_yaml(prov / "datasources" / "prometheus.yaml")
    assert ds["apiVersion"] == 1
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus"
    assert source["uid"] == "prometheus"  # what dashboard.json refers to
    dashboards = load_yaml(prov / "dashboards" / "minibroker.yaml")
    (provider,) = dashboards["providers"]
    compose = load_yaml(DEPLOY / "compose.yaml")
    mounts = compose["services"]["grafana"]["volumes"]
    mounted = [m for m in mounts if m.startswith("./grafana/dashboard.json:")]
    assert mounted, mounts
    target = mounted[0].split(":")[1]
    assert os.path.dirname(target) == provider["options"]["path"]
    assert any(m.startswith("./grafana/provisioning:/etc/grafana/provisioning") for m in mounts)


# --------------------------------------------------------------------------- compose


def test_compose_file() -> None:
    compose = load_yaml(DEPLOY / "compose.yaml")
    services = compose["services"]
    assert set(services) >= {"minibroker", "prometheus", "grafana"}
    broker = services["minibroker"]
    assert broker["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (DEPLOY / broker["build"]["context"] / broker["build"]["dockerfile"]).is_file()
    assert any(str(p).endswith("9092") for p in broker["ports"])
    assert any(v.endswith(":/var/lib/minibroker") for v in broker["volumes"])
    prom = services["prometheus"]
    for volume in prom["volumes"]:
        src = volume.split(":")[0]
        if src.startswith("./"):
            assert (DEPLOY / src).exists(), volume
    # prometheus.yml scrapes the compose service by its name, on the metrics port.
    assert "minibroker:9644" in (DEPLOY / "prometheus.yml").read_text()
    assert "alerts.yml" in " ".join(prom["volumes"])
    if shutil.which("docker") and run("docker", "compose", "version").returncode == 0:
        r = run("docker", "compose", "-f", str(DEPLOY / "compose.yaml"), "config", "--quiet")
        assert r.returncode == 0, r.stderr


def test_secure_compose_file() -> None:
    """compose-secure.yaml runs the secured broker: its settings file, the certificates
    and the first admin from ./secrets, a health check over HTTPS, and Prometheus with
    the secured scrape configuration and what it needs to authenticate."""
    compose = load_yaml(DEPLOY / "compose-secure.yaml")
    services = compose["services"]
    assert set(services) >= {"minibroker", "prometheus", "grafana"}
    broker = services["minibroker"]
    assert broker["build"]["dockerfile"] == "deploy/Dockerfile"
    volumes = broker["volumes"]
    assert "./minibroker-secure.toml:/etc/minibroker/minibroker.toml:ro" in volumes
    assert "./secrets/tls:/etc/minibroker/tls:ro" in volumes
    assert any(v.endswith(":/var/lib/minibroker") for v in volumes)
    assert broker["env_file"] == ["./secrets/bootstrap.env"]
    # [[listeners]] and --host exclude each other: the image's command must not come along.
    assert broker["command"] == ["serve", "--config", "/etc/minibroker/minibroker.toml"]
    assert "9093:9093" in broker["ports"]
    check = " ".join(broker["healthcheck"]["test"])
    assert "https://localhost:9644/healthz" in check and "/etc/minibroker/tls/ca.pem" in check
    prom = services["prometheus"]["volumes"]
    assert "./prometheus-secure.yml:/etc/prometheus/prometheus.yml:ro" in prom
    assert "./alerts.yml:/etc/prometheus/alerts.yml:ro" in prom
    scrape = (DEPLOY / "prometheus-secure.yml").read_text()
    for volume in prom:
        src, _, target = volume.partition(":")
        target = target.removesuffix(":ro")
        if src.startswith("./secrets/"):
            assert target in scrape, volume  # mounted where the scrape config reads it
        elif src.startswith("./"):
            assert (DEPLOY / src).exists(), volume
    if shutil.which("docker") and run("docker", "compose", "version").returncode == 0:
        r = run("docker", "compose", "-f", str(DEPLOY / "compose-secure.yaml"), "config", "-q")
        assert r.returncode == 0 or "secrets" in r.stderr, r.stderr


# --------------------------------------------------------------------------- Dockerfile


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text()
    logical = re.sub(r"\\\n", " ", text)
    out = []
    for line in logical.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile() -> None:
    ins = dockerfile_instructions()
    froms = [rest for word, rest in ins if word == "FROM"]
    assert len(froms) >= 2, "multi-stage build expected"
    args = dict(rest.split("=", 1) for word, rest in ins if word == "ARG" and "=" in rest)
    assert args.get("PYTHON_IMAGE") == "python:3.11-slim"
    # The final stage runs as a non-root user, declared before the entrypoint.
    final = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM") :]
    users = [rest for word, rest in final if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert ("VOLUME", "/var/lib/minibroker") in final
    expose = " ".join(rest for word, rest in final if word == "EXPOSE").split()
    assert {"9092", "9644"} <= set(expose)
    (health,) = [rest for word, rest in final if word == "HEALTHCHECK"]
    assert "/healthz" in health and "urllib" in health and "curl" not in health
    entry = " ".join(rest for word, rest in final if word in ("ENTRYPOINT", "CMD"))
    assert "minibroker" in entry and "serve" in entry
    assert "/etc/minibroker/minibroker.toml" in entry
    # The build stage has a compiler before it builds the wheel: without one pip leaves
    # out the optional C extensions, and the image runs on their Python references.
    build = ins[: max(i for i, (w, _) in enumerate(ins) if w == "FROM")]
    runs = [i for i, (w, rest) in enumerate(build) if w == "RUN" and "install" in rest]
    wheel = next(i for i, (w, rest) in enumerate(build) if w == "RUN" and "pip wheel" in rest)
    assert any("gcc" in build[i][1] and i < wheel for i in runs), "no compiler for the wheel"
    # Every file the Dockerfile copies from the context exists.
    for word, rest in ins:
        if word == "COPY" and "--from" not in rest:
            *sources, _dest = rest.split()
            for src in sources:
                assert (ROOT / src).exists(), f"COPY source {src} missing"


def test_dockerfile_healthcheck_command_works() -> None:
    """The HEALTHCHECK's python one-liner, run against a real /healthz and a dead port."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    (health,) = [rest for word, rest in dockerfile_instructions() if word == "HEALTHCHECK"]
    argv = json.loads(health[health.index("CMD") + 3 :].strip())
    assert argv[0] == "python"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()
            self.wfile.write(b"ok\n")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code = argv[2].replace("127.0.0.1:9644", f"127.0.0.1:{server.server_port}")
        assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0
    finally:
        server.shutdown()
    code = argv[2].replace("127.0.0.1:9644", f"127.0.0.1:{server.server_port}")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30)
    assert r.returncode != 0


# --------------------------------------------------------------------------- TOML


def test_example_config_loads_with_the_broker_settings() -> None:
    import tomllib

    data = tomllib.loads((DEPLOY / "minibroker.toml").read_text())
    expected = {
        "host",
        "port",
        "data_dir",
        "backend",
        "log_level",
        "log_format",
        "metrics_host",
        "metrics_port",
        "segment_bytes",
        "segment_ms",
        "retention_bytes",
        "retention_ms",
        "producer_id_expiration_ms",
        "max_producers_per_partition",
        "auto_create_topics",
        "default_partitions",
        "max_frame_bytes",
        "message_max_bytes",
        "max_connections",
    }
    assert set(data) == expected
    assert data["data_dir"].startswith("/var/lib/minibroker")
    assert data["port"] == 9092 and data["metrics_port"] == 9644
    try:
        from broker import config as cfg
    except ImportError:
        pytest.skip("broker.config not there yet")
    # The broker's own loader accepts the file (unknown keys and bad values are errors).
    config = cfg.load(DEPLOY / "minibroker.toml")
    for key, value in data.items():
        assert getattr(config, key) == value, key


def test_secure_config_loads_with_the_broker_settings() -> None:
    from broker import config as cfg

    config = cfg.load(DEPLOY / "minibroker-secure.toml")
    (listener,) = config.listeners
    assert (listener.security, listener.host, listener.port) == ("sasl_tls", "0.0.0.0", 9093)
    assert config.authorizer and config.super_users == ("User:admin",)
    assert "PLAIN" not in config.sasl_mechanisms
    assert config.tls_certfile == config.metrics_tls_certfile == "/etc/minibroker/tls/broker.pem"
    assert config.tls_keyfile == config.metrics_tls_keyfile == "/etc/minibroker/tls/broker.key"
    assert [user for user, _ in config.metrics_basic_auth_users] == ["prometheus"]


def test_secure_config_serves_tls_scram_acls_and_secured_metrics(tmp_path: Path) -> None:
    """The real broker on minibroker-secure.toml, changed only where a test must: the
    certificate files (trustme's), loopback and free ports, and a hash of a password the
    test knows. The first admin comes from MINIBROKER_BOOTSTRAP_USERS; a plaintext or
    unauthenticated client gets nothing; the admin creates a topic; /metrics wants the
    password over HTTPS."""
    import base64
    import http.client

    import bcrypt

    from harness.broker_process import BrokerProcess
    from harness.wire import WireClient
    from tests.security_fixtures import Pki

    pki = Pki.create(tmp_path / "tls")
    text = (DEPLOY / "minibroker-secure.toml").read_text()
    known_hash = bcrypt.hashpw(b"metrics-password", bcrypt.gensalt(4)).decode()
    shipped_hash = re.search(r'prometheus = "([^"]+)"', text)
    assert shipped_hash
    for old, new in (
        ("/etc/minibroker/tls/broker.pem", str(pki.certfile)),
        ("/etc/minibroker/tls/broker.key", str(pki.keyfile)),
        ('\nhost = "0.0.0.0"', '\nhost = "127.0.0.1"'),
        ("port = 9093", "port = 0"),
        ('metrics_host = "0.0.0.0"', 'metrics_host = "127.0.0.1"'),
        (shipped_hash.group(1), known_hash),
    ):
        assert old in text, old
        text = text.replace(old, new)
    broker = BrokerProcess(
        tmp_path / "data",
        config=text,
        env={"MINIBROKER_BOOTSTRAP_USERS": "admin:first-admin-password"},
    ).start()
    try:
        context = pki.client_context()
        address = broker.address("clients")
        with WireClient(address, ssl_context=context) as anonymous:
            refused = anonymous.call("Metadata", topics=["orders"], allow_auto_create=True)
            assert refused["error"] == 58, refused  # SASL_AUTHENTICATION_FAILED
        with WireClient(address, ssl_context=context) as admin:
            admin.authenticate("admin", "first-admin-password", "SCRAM-SHA-512")
            assert admin.create_topic("orders", 3) == 0
            metadata = admin.call("Metadata", topics=["orders"])
            assert [b["host"] for b in metadata["brokers"]] == ["localhost"]
        assert broker.metrics_port is not None
        for authorization, status in (
            (None, 401),
            ("Basic " + base64.b64encode(b"prometheus:metrics-password").decode(), 200),
        ):
            conn = http.client.HTTPSConnection(
                "localhost", broker.metrics_port, timeout=10, context=context
            )
            conn.request("GET", "/metrics", headers={"Authorization": authorization or ""})
            assert conn.getresponse().status == status
            conn.close()
        assert "first-admin-password" not in broker.log_text()
    finally:
        broker.kill()


# --------------------------------------------------------------------------- systemd


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_unit_is_hardened() -> None:
    s = unit_settings()
    expected = {
        "User": "minibroker",
        "ProtectSystem": "strict",
        "ReadWritePaths": "/var/lib/minibroker",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "LimitNOFILE": "65536",
        "Restart": "on-failure",
        "KillSignal": "SIGTERM",
        "TimeoutStopSec": "30",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "ExecStart": f"{EXEC_START_BINARY} serve --config /etc/minibroker/minibroker.toml",
    }
    for key, value in expected.items():
        assert s.get(key) == [value], key
    sysusers = (DEPLOY / "minibroker.sysusers").read_text()
    assert re.search(r"^u minibroker ", sysusers, re.M)


@needs_systemd_analyze
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` on the unit as shipped. On a machine where minibroker is
    not installed it can only complain that ExecStart's binary is missing: that one
    message is tolerated (and only then), everything else fails the test."""
    r = run(SYSTEMD_ANALYZE, "verify", str(UNIT))
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    missing_binary = (
        f"minibroker.service: Command {EXEC_START_BINARY} is not executable: "
        "No such file or directory"
    )
    if os.access(EXEC_START_BINARY, os.X_OK):
        assert r.returncode == 0 and not lines, lines
    else:
        assert all(ln == missing_binary for ln in lines), lines

    # And the same unit with ExecStart pointing at an executable that exists must be
    # entirely clean, so the tolerated message above cannot hide anything.
    stub = tmp_path / "minibroker"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    copy = tmp_path / "minibroker.service"
    copy.write_text(UNIT.read_text().replace(EXEC_START_BINARY, str(stub)))
    r = run(SYSTEMD_ANALYZE, "verify", str(copy))
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


@needs_systemd_analyze
def test_systemd_security_exposure_is_low() -> None:
    r = run(SYSTEMD_ANALYZE, "security", "--offline=true", "--no-pager", str(UNIT))
    if r.returncode != 0 and "offline" in r.stderr:
        pytest.skip(f"systemd-analyze security --offline unsupported here: {r.stderr.strip()}")
    m = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 2.5, r.stdout


@pytest.mark.skipif(
    shutil.which("systemd-sysusers") is None, reason="systemd-sysusers not installed"
)
def test_sysusers_entry_creates_the_user(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    r = run("systemd-sysusers", f"--root={tmp_path}", str(DEPLOY / "minibroker.sysusers"))
    assert r.returncode == 0, r.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text()
    (entry,) = [ln for ln in passwd.splitlines() if ln.startswith("minibroker:")]
    fields = entry.split(":")
    assert fields[5] == "/var/lib/minibroker"
    assert fields[6] == "/usr/sbin/nologin"
    assert int(fields[2]) < 1000  # a system user


def test_deploy_directory_has_no_unchecked_files() -> None:
    """A new file in deploy/ needs a check here; this list is the inventory."""
    checked = {
        "Dockerfile",
        "Dockerfile.dockerignore",
        "alerts.yml",
        "alerts_test.yml",
        "compose.yaml",
        "compose-secure.yaml",
        "grafana/dashboard.json",
        "grafana/provisioning/dashboards/minibroker.yaml",
        "grafana/provisioning/datasources/prometheus.yaml",
        "minibroker.service",
        "minibroker.sysusers",
        "minibroker.toml",
        "minibroker-secure.toml",
        "prometheus.yml",
        "prometheus-secure.yml",
    }
    # secrets/ is the operator's, made by following docs/operations.md; never in git.
    present = {
        str(p.relative_to(DEPLOY))
        for p in DEPLOY.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and p.relative_to(DEPLOY).parts[0] != "secrets"
    }
    assert present == checked


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv", "data"} <= set(ignored)
    # The image must never carry the operator's keys and passwords.
    assert "deploy/secrets" in ignored
    assert "/deploy/secrets/" in (ROOT / ".gitignore").read_text().split()
