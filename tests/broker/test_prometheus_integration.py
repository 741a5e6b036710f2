"""A real Prometheus scrapes a real broker under a small produce load.

The broker is `minibroker serve --metrics-port 0` (harness/broker_process.py);
Prometheus is the binary of Debian's `prometheus` package, started on loopback
with deploy/prometheus.yml and deploy/alerts.yml, adapted only in the target
address and the intervals. The load speaks the wire contract with raw frames.
The test asks Prometheus's HTTP API for the target's health, for the
`minibroker_` series that the load moved, and evaluates every expression of the
alert rules and of the Grafana dashboard, which must parse and run.

The transaction metrics are checked on the broker's own /metrics, after real
transactions over the wire that commit, abort, get fenced, time out or stay open.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.broker_process import BrokerProcess
from harness.txn import Txn
from harness.wire import WireClient
from protocol.batch import build_batch
from protocol.framing import LENGTH, decode_body, encode_frame

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS = shutil.which("prometheus")
WAIT_S = 60.0

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus not installed "
    "(Debian: apt-get install -y --no-install-recommends prometheus)",
)

TOPIC = "metrics-it"
BATCHES = 40
RECORDS_PER_BATCH = 25


# --------------------------------------------------------------------------- wire


class Wire:
    """One connection speaking raw frames: request maps in, response maps out."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.cid = 0

    def close(self) -> None:
        self.sock.close()

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return bytes(buf)

    def send(self, api: str, **fields: Any) -> int:
        self.cid += 1
        self.sock.sendall(encode_frame({"api": api, "v": 1, "cid": self.cid, **fields}))
        return self.cid

    def receive(self) -> dict[str, Any]:
        (length,) = LENGTH.unpack(self._read_exact(LENGTH.size))
        return decode_body(self._read_exact(length))

    def call(self, api: str, **fields: Any) -> dict[str, Any]:
        cid = self.send(api, **fields)
        response = self.receive()
        assert response["cid"] == cid
        return response


def produce_request(batch: bytes, partition: int = 0) -> dict[str, Any]:
    return {
        "acks": -1,
        "timeout_ms": 10_000,
        "transactional_id": None,
        "topics": [{"topic": TOPIC, "partitions": [{"partition": partition, "records": batch}]}],
    }


def run_load(port: int) -> dict[str, int]:
    """CreateTopics, InitProducerId, pipelined idempotent Produce, one retried batch
    (a duplicate), one Fetch. Returns what the metrics must then show."""
    wire = Wire(port)
    try:
        r = wire.call("CreateTopics", topics=[{"name": TOPIC, "partitions": 2, "config": None}])
        assert r["error"] == 0 and r["topics"][0]["error"] == 0, r
        r = wire.call(
            "InitProducerId",
            transactional_id=None,
            transaction_timeout_ms=None,
            producer_id=-1,
            producer_epoch=-1,
        )
        assert r["error"] == 0, r
        pid, epoch = r["producer_id"], r["producer_epoch"]

        now_ms = int(time.time() * 1000)
        batches = []
        for i in range(BATCHES):
            records = [
                (now_ms + j, f"k{i}-{j}".encode(), b"v" * 100, None)
                for j in range(RECORDS_PER_BATCH)
            ]
            batches.append(
                build_batch(
                    records,
                    producer_id=pid,
                    producer_epoch=epoch,
                    base_sequence=i * RECORDS_PER_BATCH,
                )
            )
        # Pipelined: every request on the wire before the first response is read.
        cids = [wire.send("Produce", **produce_request(b)) for b in batches]
        for i, cid in enumerate(cids):
            r = wire.receive()
            assert r["cid"] == cid
            (part,) = r["topics"][0]["partitions"]
            assert part["error"] == 0, part
            assert part["base_offset"] == i * RECORDS_PER_BATCH
            assert not part["duplicate"]

        # A retry of the last batch, as after a lost response: answered, not appended.
        r = wire.call("Produce", **produce_request(batches[-1]))
        (part,) = r["topics"][0]["partitions"]
        assert part["error"] == 0 and part["duplicate"], part

        r = wire.call(
            "Fetch",
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=1 << 24,
            isolation_level=0,
            topics=[
                {
                    "topic": TOPIC,
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 24}
                    ],
                }
            ],
        )
        (part,) = r["topics"][0]["partitions"]
        assert part["error"] == 0, part
        fetched = len(part["records"])
        assert fetched == sum(len(b) for b in batches)
    finally:
        wire.close()
    return {
        "records": BATCHES * RECORDS_PER_BATCH,
        "bytes": sum(len(b) for b in batches),
        "produce_requests": BATCHES + 1,
        "fetched_bytes": fetched,
    }


# --------------------------------------------------------------------------- Prometheus


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def adapted_config(metrics_port: int) -> str:
    """deploy/prometheus.yml with the test's target and 1 s intervals; nothing else."""
    text = (DEPLOY / "prometheus.yml").read_text()
    for old, new in (
        ('"minibroker:9644"', f'"127.0.0.1:{metrics_port}"'),
        ("scrape_interval: 15s", "scrape_interval: 1s"),
        ("evaluation_interval: 15s", "evaluation_interval: 1s"),
        ("scrape_timeout: 10s", "scrape_timeout: 1s"),
    ):
        assert text.count(old) == 1, f"deploy/prometheus.yml no longer has {old!r}"
        text = text.replace(old, new)
    return text


class Prometheus:
    def __init__(self, workdir: Path, metrics_port: int, config: str | None = None) -> None:
        """Prometheus on `config` (deploy/prometheus.yml adapted to `metrics_port` by
        default)."""
        self.workdir = workdir
        (workdir / "prometheus.yml").write_text(config or adapted_config(metrics_port))
        shutil.copy(DEPLOY / "alerts.yml", workdir / "alerts.yml")
        self.port = free_port()
        self.log = (workdir / "prometheus.log").open("w")
        assert PROMETHEUS is not None
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )

    def url(self, path: str, **params: str) -> str:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return f"http://127.0.0.1:{self.port}{path}{query}"

    def get_json(self, path: str, **params: str) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(self.url(path, **params), timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:  # 400/422 carry a JSON error body
            return json.load(e)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(self.url("/-/ready"), timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready after {WAIT_S}s:\n{self.log_text()}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = self.get_json("/api/v1/query", query=expr)
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    def value(self, expr: str) -> float | None:
        """The single value of an instant query, or None while it has no result."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    def wait_for(self, expr: str, predicate: Any, what: str) -> float:
        deadline = time.monotonic() + WAIT_S
        last = None
        while time.monotonic() < deadline:
            last = self.value(expr)
            if last is not None and predicate(last):
                return last
            time.sleep(0.25)
        raise AssertionError(f"{what}: {expr} = {last} after {WAIT_S}s\n{self.log_text()}")

    def log_text(self) -> str:
        self.log.flush()
        return (self.workdir / "prometheus.log").read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@pytest.fixture(params=["trio", "asyncio"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(
        tmp_path / "data", backend=request.param, extra_args=["--metrics-port", "0"]
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def prometheus(broker: BrokerProcess, tmp_path: Path) -> Iterator[Prometheus]:
    assert broker.metrics_port, f"no event=metrics_listening line:\n{broker.log_text()}"
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    prom = Prometheus(workdir, broker.metrics_port)
    try:
        prom.wait_ready()
        yield prom
    finally:
        prom.stop()


def http_get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# --------------------------------------------------------------------------- the test


def test_prometheus_scrapes_the_broker_under_load(
    broker: BrokerProcess, prometheus: Prometheus
) -> None:
    port = broker.metrics_port
    assert port is not None
    assert http_get(port, "/healthz") == (200, b"ok\n")
    assert http_get(port, "/readyz") == (200, b"ready\n")  # listening implies recovered
    status, body = http_get(port, "/metrics")
    assert status == 200 and b"minibroker_build_info" in body

    # The target is up, and Prometheus has the broker's series before the load.
    job = 'job="minibroker"'
    prometheus.wait_for(f"up{{{job}}}", lambda v: v == 1, "target never came up")
    prometheus.wait_for(
        f"minibroker_connections_accepted_total{{{job}}}", lambda v: v >= 0, "no broker series"
    )
    before = prometheus.value(f'minibroker_records_in_total{{{job}, topic="{TOPIC}"}}')
    assert before is None  # the topic does not exist yet

    expected = run_load(broker.port)

    sel = f'{job}, topic="{TOPIC}"'
    records = prometheus.wait_for(
        f"minibroker_records_in_total{{{sel}}}",
        lambda v: v >= expected["records"],
        "produced records never showed",
    )
    assert records == expected["records"]  # the duplicate retry was not counted
    assert prometheus.value(f"minibroker_bytes_in_total{{{sel}}}") == expected["bytes"]
    prometheus.wait_for(
        f"minibroker_bytes_out_total{{{sel}}}",
        lambda v: v >= expected["fetched_bytes"],
        "fetched bytes never showed",
    )
    produce = prometheus.wait_for(
        f'minibroker_requests_total{{{job}, api="Produce"}}',
        lambda v: v >= expected["produce_requests"],
        "Produce requests never counted",
    )
    assert produce == expected["produce_requests"]
    assert prometheus.value(f'minibroker_requests_total{{{job}, api="CreateTopics"}}') == 1
    assert prometheus.value(f'minibroker_requests_total{{{job}, api="InitProducerId"}}') == 1
    assert (
        prometheus.value(f'minibroker_request_duration_seconds_count{{{job}, api="Produce"}}')
        == expected["produce_requests"]
    )
    assert prometheus.value(f'minibroker_producer_events_total{{{job}, kind="duplicate"}}') == 1
    assert prometheus.value(f"sum(minibroker_request_errors_total{{{job}}})") in (None, 0)
    # acks=-1: every batch waited for an fsync; group commit may have shared them.
    fsyncs = prometheus.value(f"minibroker_fsyncs_total{{{job}}}")
    assert fsyncs is not None and 1 <= fsyncs <= BATCHES
    assert prometheus.value(f"minibroker_group_commit_batches_count{{{job}}}") == fsyncs

    # Per-partition gauges, collected at scrape time.
    p0 = f'{sel}, partition="0"'
    leo = prometheus.wait_for(
        f"minibroker_log_end_offset{{{p0}}}",
        lambda v: v >= expected["records"],
        "log end offset never moved",
    )
    assert leo == expected["records"]
    assert prometheus.value(f'minibroker_log_end_offset{{{sel}, partition="1"}}') == 0
    assert prometheus.value(f"minibroker_log_start_offset{{{p0}}}") == 0
    assert prometheus.value(f"minibroker_last_stable_offset{{{p0}}}") == expected["records"]
    assert prometheus.value(f"minibroker_log_size_bytes{{{p0}}}") == expected["bytes"]
    assert prometheus.value(f"minibroker_active_producer_ids{{{p0}}}") == 1

    # The standard collectors came along.
    assert prometheus.value(f"process_resident_memory_bytes{{{job}}}") > 0
    assert prometheus.value(f"minibroker_connections_open{{{job}}}") is not None

    # The rules of deploy/alerts.yml load and evaluate without errors against real data,
    # and none fires for a healthy broker.
    deadline = time.monotonic() + WAIT_S
    while True:
        groups = prometheus.get_json("/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r.get("lastEvaluation", "").startswith("2") for r in rules):
            break
        assert time.monotonic() < deadline, rules
        time.sleep(0.5)
    assert len(rules) >= 5
    # DiskNearlyFull watches the machine's real filesystem: below 40% free, the test's
    # own writes are a trend to full, and the alert is right to be pending.
    # FsyncLatencyHigh watches the real disk too: on a busy shared machine one fsync of
    # the few dozen here may take over 100 ms, and then it is right to be pending.
    usage = shutil.disk_usage(broker.data_dir)
    machine_disk_low = usage.free / usage.total < 0.40
    for rule in rules:
        assert rule["health"] == "ok", rule
        if rule["name"] == "DiskNearlyFull" and machine_disk_low:
            continue
        if rule["name"] == "FsyncLatencyHigh":
            assert rule["state"] != "firing", rule  # its `for` is minutes: never in a test
            continue
        assert rule["state"] == "inactive", rule

    # Every expression of the dashboard parses and runs (Grafana's variables filled in).
    dashboard = json.loads((DEPLOY / "grafana" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    with_data = 0
    for expr in exprs:
        concrete = expr.replace("$__rate_interval", "1m").replace("$instance", ".*")
        assert "$" not in concrete, expr
        if prometheus.query(concrete):
            with_data += 1
    # Most panels show data for a broker that has just served a load.
    assert with_data >= len(exprs) * 0.7, (with_data, len(exprs))
    assert re.search(r"minibroker_", " ".join(exprs))


# --------------------------------------------------------------------------- readiness


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_readyz_answers_ready_only_after_recovery(backend: str, tmp_path: Path) -> None:
    """/healthz answers while the broker recovers, /readyz only once it has recovered.

    2000 partitions left by a SIGKILL make recovery last long enough (~0.4 s here) for
    the test to see the broker between "metrics_listening" and "listening"."""
    data = tmp_path / "data"
    first = BrokerProcess(data, backend=backend, extra_args=["--metrics-port", "0"]).start()
    try:
        wire = Wire(first.port)
        topics = [{"name": f"r{i}", "partitions": 100, "config": None} for i in range(20)]
        r = wire.call("CreateTopics", topics=topics)
        assert all(t["error"] == 0 for t in r["topics"]), r
        wire.close()
    finally:
        first.kill()  # unclean: the next start recovers every partition

    second = BrokerProcess(data, backend=backend, extra_args=["--metrics-port", "0"])
    proc = subprocess.Popen(
        second.command(0),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    found: dict[str, int] = {}
    metrics_up = threading.Event()
    listening = threading.Event()

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"event=metrics_listening .*port=(\d+)", line)
            if m:
                found["metrics_port"] = int(m.group(1))
                metrics_up.set()
            if "event=listening" in line:
                listening.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        assert metrics_up.wait(WAIT_S), "".join(lines)
        metrics_port = found["metrics_port"]
        deadline = time.monotonic() + WAIT_S
        seen: list[int] = []
        while not listening.is_set() and time.monotonic() < deadline:
            status, _ = http_get(metrics_port, "/readyz")
            seen.append(status)
            assert http_get(metrics_port, "/healthz")[0] == 200
            if status == 200:
                break
            time.sleep(0.005)
        assert listening.wait(WAIT_S), "".join(lines)
        assert seen and seen[0] == 503, f"never saw the broker recovering: {seen}"
        assert set(seen) <= {503, 200}, seen
        # Once listening it is ready, and stays so.
        for _ in range(5):
            assert http_get(metrics_port, "/readyz") == (200, b"ready\n")
        body = http_get(metrics_port, "/metrics")[1].decode()
        m = re.search(r"^minibroker_recovery_duration_seconds (\S+)$", body, re.M)
        assert m and float(m.group(1)) > 0, body[:2000]
        assert re.search(
            r'^minibroker_log_end_offset\{partition="99",topic="r19"\} 0\.0$', body, re.M
        )
    finally:
        proc.kill()
        proc.wait(10)


def test_alert_inputs_are_exported(tmp_path: Path) -> None:
    """The gauges that DiskNearlyFull and ProducerIdCapNearLimit compare with are only
    there when the broker hands BrokerMetrics its data dir and producer-id cap."""
    broker = BrokerProcess(tmp_path / "data", extra_args=["--metrics-port", "0"]).start()
    try:
        assert broker.metrics_port
        body = http_get(broker.metrics_port, "/metrics")[1].decode()
    finally:
        broker.kill()
    assert re.search(r"^minibroker_producer_ids_max 100000\.0$", body, re.M), (
        "the broker must call metrics.set_producer_ids_max(config.max_producers_per_partition)"
    )
    assert re.search(r"^minibroker_data_dir_free_bytes \d", body, re.M), (
        "the broker must call metrics.set_data_dir(config.data_path)"
    )
    assert re.search(r"^minibroker_data_dir_capacity_bytes \d", body, re.M)


# --------------------------------------------------------------------------- transactions


def scrape(metrics_port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the broker's /metrics, keyed by (name, sorted labels)."""
    status, body = http_get(metrics_port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def by_label(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> dict:
    return {labels[0][1]: v for (n, labels), v in samples.items() if n == name}


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_transaction_metrics_of_a_real_broker(backend: str, tmp_path: Path) -> None:
    """Commits, aborts by cause (client, fenced, timeout), the state gauge and the age of
    an open transaction, as /metrics shows them after real transactions."""
    config = tmp_path / "broker.toml"
    config.write_text("transaction_abort_timed_out_transaction_cleanup_interval_ms = 50\n")
    broker = BrokerProcess(tmp_path / "data", backend=backend, extra_args=["--config", str(config)])
    broker.start()
    try:
        assert broker.metrics_port, broker.log_text()
        s = scrape(broker.metrics_port)
        assert set(by_label(s, "minibroker_transactions").values()) == {0}
        assert s[("minibroker_transactions_committed_total", ())] == 0
        assert set(by_label(s, "minibroker_transactions_aborted_total").values()) == {0}
        with WireClient(broker.bootstrap) as c:
            assert c.create_topic("tx", 3) == 0
            committed = Txn(c, "committed")
            assert committed.send("tx", 0, [b"v"])["error"] == 0
            assert committed.send("tx", 1, [b"v"])["error"] == 0
            assert committed.end(committed=True)["error"] == 0
            aborted = Txn(c, "aborted")
            assert aborted.send("tx", 0, [b"v"])["error"] == 0
            assert aborted.end(committed=False)["error"] == 0
            zombie = Txn(c, "zombie")
            assert zombie.send("tx", 1, [b"v"])["error"] == 0
            Txn(c, "zombie")  # a new instance: the old one's transaction is aborted
            assert Txn(c, "slow", timeout_ms=200).send("tx", 1, [b"v"])["error"] == 0
            Txn(c, "idle")
            opened_s = time.time()
            assert Txn(c, "open").send("tx", 2, [b"v"])["error"] == 0
            sent_s = time.time()

            # The coordinator aborts "slow" past its 200 ms within a cleanup interval;
            # by then "open" is a visible age old.
            deadline = time.monotonic() + WAIT_S
            while True:
                before_s = time.time()
                s = scrape(broker.metrics_port)
                after_s = time.time()
                aborts = by_label(s, "minibroker_transactions_aborted_total")
                states = by_label(s, "minibroker_transactions")
                if (
                    aborts["timeout"] == 1
                    and states["COMPLETE_ABORT"] == 2
                    and before_s - sent_s >= 0.3
                ):
                    break
                assert time.monotonic() < deadline, (aborts, states, broker.log_text())
                time.sleep(0.1)
    finally:
        broker.kill()

    assert s[("minibroker_transactions_committed_total", ())] == 1
    assert aborts == {"client": 1, "timeout": 1, "fenced": 1, "recovery": 0}
    assert states == {
        "EMPTY": 2,  # "zombie" after its new InitProducerId, and "idle"
        "ONGOING": 1,  # "open"
        "PREPARED": 0,
        "PREPARE_COMMIT": 0,
        "PREPARE_ABORT": 0,
        "COMPLETE_COMMIT": 1,  # "committed"
        "COMPLETE_ABORT": 2,  # "aborted" by its client, "slow" by the timeout
    }
    # Only tx-2 holds an open transaction; its age is the time from its first batch's
    # admission (in epoch ms, by the broker's clock: this machine's) to the scrape.
    ages = {
        labels: v
        for (name, labels), v in s.items()
        if name == "minibroker_oldest_open_transaction_age_seconds"
    }
    assert list(ages) == [(("partition", "2"), ("topic", "tx"))]
    (age,) = ages.values()
    # (1 ms of slack: the start is truncated to whole milliseconds.)
    assert before_s - sent_s - 0.001 <= age <= after_s - opened_s + 0.001, (
        age,
        before_s - sent_s,
        after_s - opened_s,
    )


# --------------------------------------------------------------------------- secured


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_prometheus_scrapes_over_tls_with_basic_auth(backend: str, tmp_path: Path) -> None:
    """deploy/prometheus-secure.yml (adapted in the target, the files it reads and the
    intervals) scrapes a broker whose metrics port wants HTTPS and a password; the same
    job with a wrong password sees the target down with a 401."""
    import bcrypt

    from tests.security_fixtures import Pki

    pki = Pki.create(tmp_path / "tls")
    password = "prometheus-password"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    broker = BrokerProcess(
        tmp_path / "data",
        backend=backend,
        config=(
            f'metrics_tls_certfile = "{pki.certfile}"\n'
            f'metrics_tls_keyfile = "{pki.keyfile}"\n'
            f'metrics_basic_auth_users = {{ prometheus = "{hashed}" }}\n'
        ),
    ).start()
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    pki.server_ca.cert_pem.write_to_path(str(workdir / "ca.pem"))
    (workdir / "right").write_text(password)
    (workdir / "wrong").write_text(password + "!")
    text = (DEPLOY / "prometheus-secure.yml").read_text()
    assert broker.metrics_port is not None
    for old, new in (
        ('"minibroker:9644"', f'"127.0.0.1:{broker.metrics_port}"'),
        ("server_name: minibroker", "server_name: localhost"),
        ("/etc/prometheus/minibroker-ca.pem", str(workdir / "ca.pem")),
        ("scrape_interval: 15s", "scrape_interval: 1s"),
        ("evaluation_interval: 15s", "evaluation_interval: 1s"),
        ("scrape_timeout: 10s", "scrape_timeout: 1s"),
    ):
        assert text.count(old) == 1, f"deploy/prometheus-secure.yml no longer has {old!r}"
        text = text.replace(old, new)
    job = text.split("scrape_configs:\n", 1)[1]
    secret = "/etc/prometheus/minibroker-metrics-password"
    config = text.replace(secret, str(workdir / "right")) + job.replace(
        "job_name: minibroker", "job_name: wrong"
    ).replace(secret, str(workdir / "wrong"))
    shutil.copy(DEPLOY / "alerts.yml", workdir / "alerts.yml")
    prom = Prometheus(workdir, broker.metrics_port, config)
    try:
        prom.wait_ready()
        prom.wait_for('up{job="minibroker"}', lambda v: v == 1, "the secured target never came up")
        prom.wait_for(
            'minibroker_build_info{job="minibroker"}', lambda v: v == 1, "no series scraped"
        )
        prom.wait_for('up{job="wrong"}', lambda v: v == 0, "a wrong password was let in")
        deadline = time.monotonic() + WAIT_S
        while True:
            targets = prom.get_json("/api/v1/targets")["data"]["activeTargets"]
            wrong = [t for t in targets if t["labels"]["job"] == "wrong"]
            if wrong and "401" in wrong[0]["lastError"]:
                break
            assert time.monotonic() < deadline, targets
            time.sleep(0.25)
    finally:
        prom.stop()
        broker.kill()
