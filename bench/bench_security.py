"""What security costs (issue 26): TLS against plaintext, the authorizer with 10,000 ACLs
against none, and SCRAM authentications, on both backends.

- **TLS.** One broker serves a plaintext and a `tls` listener; each round produces 16 KiB
  batches at acks=1 through one and then the other (ABBA), and fetches one stored topic
  through each with 1 MiB Fetches. The produce load is one connection pipelining WINDOW
  pre-encoded frames from one thread (the broker suite's two-thread generator would
  read and write one TLS connection at once, which OpenSSL does not allow), the same
  for both listeners. Plaintext Fetches are served as the broker serves them (sendfile
  on trio, copied on asyncio); TLS ones are always read and encrypted.
- **Authorizer.** Two brokers with a `sasl_plaintext` listener, one with `authorizer =
  true` and bench_acl's 10,000 bindings (literal and prefixed, 999 principals and
  `User:*`), one without; the producer authenticates with SCRAM-SHA-256 as `User:u500`,
  whose prefixed `write` on `p500-1-` allows its topics (plus one binding that lets it
  create them). The cost is broker CPU per batch, judged by the broker suite's paired
  rounds and bootstrap interval (`bench_broker.paired_rounds`, `cost_row`).
- **SCRAM.** Clients of a forked asyncio process each connect, ask ApiVersions, run the
  two SaslAuthenticate rounds of SCRAM-SHA-256 and close, AUTH_CONCURRENCY at a time,
  for a while; the rate, and the CPU each authentication costs the broker and the
  clients, which says which of them bounds the rate. The clients keep the salted
  password (Hi, 8,192 PBKDF2 iterations) once computed, so the rate is the broker's; a
  row beside it computes Hi every time, as a real client does, to show what one core of
  clients reaches then. A failed authentication waits
  `authentication_failure_delay_ms`; a success never does.
- **Authentication storm.** A probe producer sends one 16 KiB batch every PROBE_GAP_S
  at acks=1 on an authenticated connection and times each answer: alone, while waves of
  STORM_CLIENTS clients authenticate at once on its broker (logins taking turns,
  `max_authenticating_connections` at its default), the same on a broker that lets
  every login run at once (as before issue 40), and while the same waves go to a twin
  broker (the part of the effect that is the two shared cores', not the broker's), in
  rotating rounds; each p99 and what the storms add to it per round.

    python -m bench.bench_security [--scale S]

prints the rows and the verdicts without touching docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import hmac
import multiprocessing
import secrets
import shutil
import socket
import ssl
import statistics
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import trustme

from bench import progress
from bench.bench_acl import ME, bindings
from bench.bench_broker import (
    COST_BATCHES,
    COST_ROUNDS,
    WINDOW,
    _batch_template,
    _cpu_s,
    _fetch_all,
    _frames,
    _produce,
    cost_row,
    paired_rounds,
)
from bench.stats import min_max, percentile, verdict
from harness.broker_process import BrokerProcess
from harness.wire import WireClient
from protocol.framing import LENGTH, FrameDecoder, decode_body, encode_frame

BACKENDS = ("trio", "asyncio")
ROUNDS = 6
TLS_BATCHES = 6000  # per produce round at scale 1, as the broker suite's
FETCH_BATCHES = 6000  # the stored topic the fetch rounds read whole
AUTH_SECONDS = 2.0  # per authentication round at scale 1
AUTH_CONCURRENCY = 64  # 16 left both the broker and the clients under 0.75 of a core
STORM_CLIENTS = 200
STORM_SECONDS = 3.0  # per storm round at scale 1
PROBE_GAP_S = 0.002
MECHANISM = "SCRAM-SHA-256"
PASSWORDS = {"admin": "admin-bench-pw", ME.removeprefix("User:"): "u500-bench-pw"}
TOPIC_PREFIX = "p500-1-bench"  # under User:u500's prefixed write `p500-1-`
ACLS_PER_REQUEST = 1000
LISTENER = """
[[listeners]]
name = "{name}"
host = "127.0.0.1"
port = 0
security = "{security}"
"""


# ---------------------------------------------------------------------------- TLS


def _certificates(directory: Path) -> tuple[str, ssl.SSLContext]:
    """The TLS settings of a broker whose certificate (for localhost and 127.0.0.1, from a
    throwaway CA) is written to `directory`, and a client context that trusts it."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    certfile, keyfile = directory / "broker.pem", directory / "broker.key"
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return f'tls_certfile = "{certfile}"\ntls_keyfile = "{keyfile}"\n', context


def _pipeline_one_thread(sock: socket.socket, frames: list[bytes]) -> float:
    """Send every frame with at most WINDOW unanswered from one thread, as many as the
    window has room for at a time; return elapsed seconds. One thread, because a TLS
    connection may not be read and written from two at once. Produce answers are small,
    so the broker never waits to send them while this thread sends."""
    decoder = FrameDecoder(1 << 30)
    sent = answered = 0
    started = time.perf_counter()
    while answered < len(frames):
        room = min(WINDOW - (sent - answered), len(frames) - sent)
        if room:
            sock.sendall(b"".join(frames[sent : sent + room]))
            sent += room
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the broker closed the connection")
        for answer in decoder.feed(data):
            if answer["topics"][0]["partitions"][0]["error"]:
                raise RuntimeError(f"produce error: {answer}")
            answered += 1
    return time.perf_counter() - started


def _tls_produce(
    broker: BrokerProcess, listener: str, context: ssl.SSLContext | None, n_batches: int
) -> tuple[float, float, float]:
    """(MB/s, broker CPU µs per batch, load generator CPU µs per batch) of one one-thread
    pipelined run into a fresh topic through `listener`, over TLS when `context` is
    given."""
    with WireClient(broker.address(listener), ssl_context=context) as c:
        topic = f"tls-{listener}-{time.monotonic_ns()}"
        c.create_topic(topic, 1)
        pid, epoch = c.init_producer()
        frames = _frames(n_batches, 1, pid, epoch, topic, 1)
        cpu, client_cpu = _cpu_s(broker.pid), time.thread_time()
        elapsed = _pipeline_one_thread(c.sock, frames)
        cpu, client_cpu = _cpu_s(broker.pid) - cpu, time.thread_time() - client_cpu
    return (
        sum(map(len, frames)) / elapsed / 1e6,
        cpu / n_batches * 1e6,
        client_cpu / n_batches * 1e6,
    )


def tls_rows(tmp: Path, backend: str, n_batches: int) -> list[dict[str, Any]]:
    """Produce and fetch through the plaintext and the TLS listener of one broker, in
    ABBA rounds; MB/s and broker CPU of each, and TLS's fraction of plaintext per round."""
    settings, context = _certificates(tmp)
    config = (
        settings
        + LISTENER.format(name="plain", security="plaintext")
        + LISTENER.format(name="tls", security="tls")
    )
    contexts = {"plain": None, "tls": context}
    produced: dict[str, list[tuple[float, ...]]] = {name: [] for name in contexts}
    fetched: dict[str, list[tuple[float, ...]]] = {name: [] for name in contexts}
    broker = BrokerProcess(tmp / f"data-tls-{backend}", backend=backend, config=config).start()
    try:
        with WireClient(broker.address("plain")) as c:
            c.create_topic("fetch", 1)
            _pipeline_one_thread(c.sock, _frames(FETCH_BATCHES, 1, -1, -1, "fetch", 1))
        connect = {
            name: functools.partial(WireClient, broker.address(name), ssl_context=ctx)
            for name, ctx in contexts.items()
        }
        for round_ in progress.rounds(ROUNDS, f"TLS and plaintext, {backend}"):
            order = ["plain", "tls"] if round_ % 2 == 0 else ["tls", "plain"]
            for name in order:
                produced[name].append(_tls_produce(broker, name, contexts[name], n_batches))
            for name in order[::-1]:
                fetched[name].append(_fetch_all(broker, "fetch", connect[name]))
    finally:
        broker.kill()
        shutil.rmtree(tmp / f"data-tls-{backend}", ignore_errors=True)
    plain_fetch = "sendfile" if backend == "trio" else "copy"
    rows = []
    for what, figures, cpu_unit, plain_label in (
        ("produce", produced, "broker_cpu_us_per_batch", "plaintext"),
        ("fetch", fetched, "broker_cpu_s_per_gb", f"plaintext ({plain_fetch})"),
    ):
        ratios = [t[0] / p[0] for t, p in zip(figures["tls"], figures["plain"], strict=True)]
        tls_label = "TLS (copy)" if what == "fetch" else "TLS"
        for name, label in (("plain", plain_label), ("tls", tls_label)):
            values = figures[name]
            row: dict[str, Any] = {
                "benchmark": f"{what} {backend} {label}"
                + (", acks=1 16 KiB batches" if what == "produce" else ", 1 MiB Fetches"),
                "value": statistics.median(v[0] for v in values),
                "unit": "MB/s",
                "min_max": min_max([v[0] for v in values]),
                "rounds": len(values),
                cpu_unit: statistics.median(v[1] for v in values),
            }
            if what == "produce":
                row["client_cpu_us_per_batch"] = statistics.median(v[2] for v in values)
            if name == "tls":
                row["of_plaintext"] = _spread(ratios)
            rows.append(row)
    return rows


def _spread(values: list[float]) -> str:
    """Median and min-max of per-round ratios, as the docs quote them."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


# ---------------------------------------------------------------------------- SASL


def _sasl_config(authorizer: bool) -> str:
    head = 'authorizer = true\nsuper_users = ["User:admin"]\n' if authorizer else ""
    return head + LISTENER.format(name="sasl", security="sasl_plaintext")


def _sasl_broker(
    data: Path, backend: str, *, authorizer: bool, settings: str = ""
) -> BrokerProcess:
    users = ",".join(f"{user}:{password}" for user, password in PASSWORDS.items())
    return BrokerProcess(
        data,
        backend=backend,
        config=settings + _sasl_config(authorizer),
        env={"MINIBROKER_BOOTSTRAP_USERS": users},
    ).start()


def _login(broker: BrokerProcess, principal: str) -> WireClient:
    """A connection to the broker's SASL listener, authenticated as `principal`."""
    user = principal.removeprefix("User:")
    c = WireClient(broker.address("sasl"))
    c.authenticate(user, PASSWORDS[user], MECHANISM)
    return c


def install_acls(broker: BrokerProcess) -> int:
    """bench_acl's 10,000 bindings, and `create` for the bench's topics, made by the super
    user; the number of bindings in force."""
    wire = [b._asdict() for b in bindings()]
    wire.append(
        {
            "resource_type": "topic",
            "resource_name": TOPIC_PREFIX,
            "pattern_type": "prefixed",
            "principal": ME,
            "host": "*",
            "operation": "create",
            "permission": "allow",
        }
    )
    with _login(broker, "User:admin") as admin:
        for i in range(0, len(wire), ACLS_PER_REQUEST):
            answer = admin.call("CreateAcls", creations=wire[i : i + ACLS_PER_REQUEST])
            assert all(r["error"] == 0 for r in answer["results"]), answer
        every = dict.fromkeys(wire[0])
        listed = admin.call("DescribeAcls", filter={**every, "pattern_type": "any"})
    with _login(broker, ME) as me:
        # The authorizer is on: a topic outside the bench principal's bindings is refused.
        assert me.create_topic("t0-0", 1) != 0
    return len(listed["bindings"])


def authorizer_rows(tmp: Path, backend: str, rounds: int) -> list[dict[str, Any]]:
    """Broker CPU per 16 KiB batch (acks=1, idempotent, authenticated as User:u500) with
    the authorizer and 10,000 ACLs against without, in paired rounds."""
    installed: list[int] = []

    @contextlib.contextmanager
    def brokers(block: int) -> Iterator[Callable[[Any], float]]:
        data = {on: tmp / f"data-authz-{backend}-{on}-{block}" for on in (True, False)}
        started: dict[bool, BrokerProcess] = {}
        try:
            for on, directory in data.items():
                started[on] = _sasl_broker(directory, backend, authorizer=on)
            installed.append(install_acls(started[True]))

            def measure(on: bool) -> float:
                broker = started[on]
                return _produce(
                    broker,
                    acks=1,
                    idempotent=True,
                    n_batches=COST_BATCHES,
                    connect=functools.partial(_login, broker, ME),
                    topic_prefix=TOPIC_PREFIX,
                )[1]

            yield measure
        finally:
            for broker in started.values():
                broker.kill()
            for directory in data.values():
                shutil.rmtree(directory, ignore_errors=True)

    cpu = paired_rounds([True, False], rounds, f"authorizer on and off, {backend}", brokers)
    row = cost_row(
        f"cost of the authorizer {backend}, {installed[0]:,} ACLs, broker CPU per batch",
        [r[True] / r[False] for r in cpu],
    )
    row["cpu_us_per_batch_on_off"] = (
        f"{statistics.median(r[True] for r in cpu):.1f} / "
        f"{statistics.median(r[False] for r in cpu):.1f}"
    )
    return [row]


# ---------------------------------------------------------------------------- SCRAM

_KEPT_HI: dict[tuple[str, bytes, int], bytes] = {}
"""(password, salt, iterations) -> Hi, for the logins that keep it."""


class ScramLogin:
    """RFC 5802's client side of SCRAM-SHA-256, for a load generator: the salted password
    Hi(password, salt, i) is computed once per (salt, i) and kept when `keep_hi`, as if
    the client were on another machine, so the rate measured is the broker's; without,
    every login pays Hi as a real client does. The server's signature is checked."""

    def __init__(self, user: str, password: str, *, keep_hi: bool) -> None:
        self.password = password
        self.keep_hi = keep_hi
        self.bare = f"n={user},r={secrets.token_urlsafe(18)}"
        self._expected = b""

    def client_first(self) -> bytes:
        return f"n,,{self.bare}".encode()

    def client_final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        fields = dict(item.split("=", 1) for item in text.split(","))
        salt, iterations = base64.b64decode(fields["s"]), int(fields["i"])
        salted = self._hi(salt, iterations)
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        stored_key = hashlib.sha256(client_key).digest()
        without_proof = f"c=biws,r={fields['r']}"
        message = f"{self.bare},{text},{without_proof}".encode()
        signature = hmac.new(stored_key, message, hashlib.sha256).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
        verifier = hmac.new(server_key, message, hashlib.sha256).digest()
        self._expected = b"v=" + base64.b64encode(verifier)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check(self, server_final: bytes) -> None:
        if not hmac.compare_digest(server_final, self._expected):
            raise RuntimeError("the broker's server-final does not verify")

    def _hi(self, salt: bytes, iterations: int) -> bytes:
        key = (self.password, salt, iterations)
        salted = _KEPT_HI.get(key) if self.keep_hi else None
        if salted is None:
            salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(), salt, iterations)
            _KEPT_HI[key] = salted
        return salted


async def _call(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, api: str, **fields: Any
) -> dict[str, Any]:
    writer.write(encode_frame({"api": api, "v": 1, "cid": 1, **fields}))
    (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
    answer = decode_body(await reader.readexactly(length))
    if answer.get("error"):
        raise RuntimeError(f"{api} answered {answer}")
    return dict(answer)


async def authenticate_once(host: str, port: int, user: str, *, keep_hi: bool) -> None:
    """Connect, ApiVersions, SCRAM-SHA-256's two rounds, close (with a reset, so that tens
    of thousands of logins leave no TIME_WAIT ports behind)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await _call(reader, writer, "ApiVersions")
        login = ScramLogin(user, PASSWORDS[user], keep_hi=keep_hi)
        first = await _call(
            reader, writer, "SaslAuthenticate", mechanism=MECHANISM, auth_bytes=login.client_first()
        )
        final = await _call(
            reader,
            writer,
            "SaslAuthenticate",
            mechanism=MECHANISM,
            auth_bytes=login.client_final(first["auth_bytes"]),
        )
        login.check(final["auth_bytes"])
    finally:
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        writer.close()


async def _logins_for(address: str, seconds: float, concurrency: int, keep_hi: bool) -> int:
    host, port = address.rsplit(":", 1)
    deadline = time.perf_counter() + seconds
    done = 0

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await authenticate_once(host, int(port), "u500", keep_hi=keep_hi)
            done += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return done


def _login_process(address: str, seconds: float, concurrency: int, keep_hi: bool, out: Any) -> None:
    started, cpu = time.perf_counter(), time.process_time()
    done = asyncio.run(_logins_for(address, seconds, concurrency, keep_hi))
    out.put((done, time.perf_counter() - started, time.process_time() - cpu))


def _login_rate(broker: BrokerProcess, seconds: float, keep_hi: bool) -> tuple[float, float, float]:
    """(authentications per second, broker and client CPU µs per authentication) of one
    forked client process running AUTH_CONCURRENCY logins at a time for `seconds`."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    args = (broker.address("sasl"), seconds, AUTH_CONCURRENCY, keep_hi, out)
    proc = ctx.Process(target=_login_process, args=args)
    cpu = _cpu_s(broker.pid)
    proc.start()
    done, elapsed, client_cpu = out.get(timeout=seconds + 120)
    cpu = _cpu_s(broker.pid) - cpu
    proc.join()
    if proc.exitcode:
        raise RuntimeError(f"login process failed: exit {proc.exitcode}")
    return done / elapsed, cpu / done * 1e6, client_cpu / done * 1e6


def _hi_ms(iterations: int = 8192, calls: int = 20) -> float:
    """What one Hi costs the client here: PBKDF2-HMAC-SHA-256 of `iterations`."""
    started = time.perf_counter()
    for _ in range(calls):
        hashlib.pbkdf2_hmac("sha256", b"password", b"s" * 32, iterations)
    return (time.perf_counter() - started) / calls * 1e3


def scram_rows(tmp: Path, backend: str, seconds: float) -> list[dict[str, Any]]:
    """The authentication rate with Hi kept and with Hi every time, in alternating rounds,
    with the broker's CPU per authentication."""
    data = tmp / f"data-scram-{backend}"
    broker = _sasl_broker(data, backend, authorizer=False)
    figures: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    try:
        for round_ in progress.rounds(ROUNDS, f"SCRAM logins, {backend}"):
            for keep_hi in (True, False) if round_ % 2 == 0 else (False, True):
                figures[keep_hi].append(_login_rate(broker, seconds, keep_hi))
    finally:
        broker.kill()
        shutil.rmtree(data, ignore_errors=True)
    hi_ms = _hi_ms()
    rows = []
    for keep_hi, label in ((True, "client keeps Hi"), (False, "client computes Hi every time")):
        values = figures[keep_hi]
        rows.append(
            {
                "benchmark": f"SCRAM-SHA-256 logins {backend}, {label}",
                "value": statistics.median(v[0] for v in values),
                "unit": "logins/s",
                "min_max": min_max([v[0] for v in values]),
                "rounds": len(values),
                "broker_cpu_us_per_login": statistics.median(v[1] for v in values),
                "client_cpu_us_per_login": statistics.median(v[2] for v in values),
                "client_hi_ms": hi_ms,
            }
        )
    return rows


# ---------------------------------------------------------------------------- storm


async def _storm(address: str, clients: int, stop: Any, ready: Any) -> tuple[int, int]:
    """Waves of `clients` logins at once (Hi kept), one wave after the other, until
    `stop` is set; (logins, waves)."""
    host, port = address.rsplit(":", 1)
    logins = waves = 0
    while not stop.is_set():
        await asyncio.gather(
            *(authenticate_once(host, int(port), "u500", keep_hi=True) for _ in range(clients))
        )
        logins += clients
        waves += 1
        ready.set()
    return logins, waves


def _storm_process(address: str, clients: int, stop: Any, ready: Any, out: Any) -> None:
    out.put(asyncio.run(_storm(address, clients, stop, ready)))


def _probe(c: WireClient, topic: str, seconds: float) -> list[float]:
    """Produce latencies (ms) of one 16 KiB batch every PROBE_GAP_S, acks=1, for `seconds`."""
    batch, _ = _batch_template(-1, -1)
    latencies = []
    deadline = time.perf_counter() + seconds
    next_s = time.perf_counter()
    while next_s < deadline:
        pause = next_s - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        sent = time.perf_counter()
        answer = c.produce(topic, 0, batch, acks=1)
        latencies.append((time.perf_counter() - sent) * 1e3)
        if answer["error"]:
            raise RuntimeError(f"probe produce error: {answer}")
        next_s += PROBE_GAP_S
    return latencies


STORM_CASES = ("alone", "here", "unbounded", "elsewhere")
"""The probe's broker with no logins, with the storm on it, the same on a broker that
lets every login run at once (`max_authenticating_connections` unbounded, as before
issue 40), and with the storm on a twin broker: the last is what the storm costs the
probe through the shared cores alone."""
UNBOUNDED_TURNS = "max_authenticating_connections = 1000000\n"


def storm_rows(tmp: Path, backend: str, seconds: float) -> list[dict[str, Any]]:
    """The probe's p99 alone, during waves of STORM_CLIENTS logins to its broker, and
    during the same waves to a twin broker, in rotating rounds (`paired_rounds`)."""
    storms: dict[str, list[tuple[int, int]]] = {case: [] for case in STORM_CASES}
    ctx = multiprocessing.get_context("fork")

    @contextlib.contextmanager
    def brokers(block: int) -> Iterator[Callable[[Any], float]]:
        wheres = ("here", "unbounded", "twin")
        data = {where: tmp / f"data-storm-{backend}-{where}-{block}" for where in wheres}
        started: dict[str, BrokerProcess] = {}
        try:
            for where, directory in data.items():
                settings = UNBOUNDED_TURNS if where == "unbounded" else ""
                started[where] = _sasl_broker(
                    directory, backend, authorizer=False, settings=settings
                )
            with _login(started["here"], ME) as here, _login(started["unbounded"], ME) as other:
                for probe in (here, other):
                    probe.create_topic("probe", 1)

                def measure(case: str) -> float:
                    stop, ready, out = ctx.Event(), ctx.Event(), ctx.Queue()
                    proc = None
                    probe = other if case == "unbounded" else here
                    if case != "alone":
                        target = started["twin" if case == "elsewhere" else case]
                        args = (target.address("sasl"), STORM_CLIENTS, stop, ready, out)
                        proc = ctx.Process(target=_storm_process, args=args)
                        proc.start()
                        if not ready.wait(60):
                            raise RuntimeError("the storm's first wave did not finish")
                    try:
                        latencies = _probe(probe, "probe", seconds)
                    finally:
                        stop.set()
                    if proc is not None:
                        storms[case].append(out.get(timeout=120))
                        proc.join()
                    return percentile(latencies, 0.99)

                yield measure
        finally:
            for broker in started.values():
                broker.kill()
            for directory in data.values():
                shutil.rmtree(directory, ignore_errors=True)

    p99 = paired_rounds(
        list(STORM_CASES), ROUNDS, f"produce p99 and login storms, {backend}", brokers
    )
    labels = {
        "alone": "alone",
        "here": f"during waves of {STORM_CLIENTS} logins to its broker",
        "unbounded": f"during waves of {STORM_CLIENTS} logins to its broker, every login "
        "at once (no max_authenticating_connections)",
        "elsewhere": "during the same waves to a twin broker",
    }
    rows = [
        {
            "benchmark": f"probe produce p99 {backend}, {labels[case]}",
            "value": statistics.median(r[case] for r in p99),
            "unit": "ms",
            "min_max": min_max([r[case] for r in p99], 2),
            "rounds": len(p99),
        }
        for case in STORM_CASES
    ]
    for case, what in (
        ("here", "login storms"),
        ("unbounded", "login storms, every login at once"),
        ("elsewhere", "login storms to a twin broker"),
    ):
        raised = [r[case] - r["alone"] for r in p99]
        rows.append(
            {
                "benchmark": f"p99 raised by {what} {backend}",
                "value": statistics.median(raised),
                "unit": "ms",
                "min_max": min_max(raised, 2),
                "rounds": len(raised),
                "storm_logins_per_s": sum(n for n, _ in storms[case])
                / (seconds * len(storms[case])),
            }
        )
    return rows


# ---------------------------------------------------------------------------- suite


def run(scale: float = 1.0) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=".") as directory:
        tmp = Path(directory)
        for backend in BACKENDS:
            rows += tls_rows(tmp, backend, max(WINDOW * 2, round(TLS_BATCHES * scale)))
        for backend in BACKENDS:
            rows += authorizer_rows(tmp, backend, max(12, round(COST_ROUNDS * scale)))
        for backend in BACKENDS:
            rows += scram_rows(tmp, backend, max(0.5, AUTH_SECONDS * scale))
        for backend in BACKENDS:
            rows += storm_rows(tmp, backend, max(1.0, STORM_SECONDS * scale))
    return rows


def _find(rows: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    return next(row for row in rows if str(row["benchmark"]).startswith(prefix))


def _first_ratio(row: dict[str, Any]) -> float:
    return float(str(row["of_plaintext"]).split()[0])


def targets(rows: list[dict[str, Any]]) -> list[str]:
    from bench.__main__ import _cost_verdict

    out = []
    for backend in BACKENDS:
        produce = _find(rows, f"produce {backend} TLS")
        fetch = _find(rows, f"fetch {backend} TLS")
        cost = _find(rows, f"cost of the authorizer {backend}")
        kept = _find(rows, f"SCRAM-SHA-256 logins {backend}, client keeps Hi")
        each = _find(rows, f"SCRAM-SHA-256 logins {backend}, client computes Hi")
        raised = _find(rows, f"p99 raised by login storms {backend}")
        login_cpu = float(kept["broker_cpu_us_per_login"])
        rate = float(kept["value"])
        broker_cores = login_cpu * rate / 1e6
        client_cores = float(kept["client_cpu_us_per_login"]) * rate / 1e6
        bound = (
            "the broker's CPU (its event loop runs on one core) bounds it"
            if broker_cores >= 0.9
            else "the load generator's CPU bounds it"
            if client_cores >= 0.9
            else "neither is saturated: the round trips and the machine's other load bound it"
        )
        elsewhere = _find(rows, f"p99 raised by login storms to a twin broker {backend}")
        at_once = _find(rows, f"p99 raised by login storms, every login at once {backend}")
        out += [
            f"- {backend}: produce over TLS (acks=1, 16 KiB) is {produce['of_plaintext']} of "
            f"plaintext, per round (median, min-max; at least 0.70 wanted): "
            f"{verdict(_first_ratio(produce) >= 0.7)}.",
            f"- {backend}: fetch over TLS is {fetch['of_plaintext']} of plaintext (at least "
            f"0.50 wanted): {verdict(_first_ratio(fetch) >= 0.5)}.",
            f"- {backend}: the authorizer with 10,000 ACLs costs {cost['value']:+.1f}% broker "
            f"CPU per batch, median of {cost['rounds']} paired rounds, 95% CI "
            f"{cost['ci95_low']:+.1f} to {cost['ci95_high']:+.1f}% (at most 5% wanted): "
            f"{_cost_verdict(cost, 5.0)}.",
            f"- {backend}: {rate:,.0f} SCRAM-SHA-256 logins/s with the client's Hi kept (at "
            f"least 1,000 wanted): {verdict(rate >= 1000)}; the broker spends "
            f"{login_cpu:,.0f} µs of CPU on each (a ceiling of {1e6 / login_cpu:,.0f}/s on "
            f"one core) and used {broker_cores:.2f} cores, the load generator "
            f"{client_cores:.2f}: {bound}. A client that computes Hi every time "
            f"({kept['client_hi_ms']:.1f} ms here) reaches {each['value']:,.0f}/s from one "
            "process; the failure delay applies to failures only.",
            f"- {backend}: waves of {STORM_CLIENTS} logins at once raise another client's "
            f"produce p99 by {raised['value']:+.2f} ms (median of {raised['rounds']} rounds, "
            f"{raised['min_max']}; at most 10 ms wanted): "
            f"{verdict(float(raised['value']) <= 10)}; with every login at once (no turns) "
            f"{at_once['value']:+.2f} ms ({at_once['min_max']}); the same waves to a twin "
            f"broker raise it by {elsewhere['value']:+.2f} ms ({elsewhere['min_max']}), the "
            "part that is the shared cores' rather than the broker's.",
        ]
    return out


def main() -> None:
    from bench.__main__ import standalone

    standalone("security", __doc__.split("\n")[0])


if __name__ == "__main__":
    main()
