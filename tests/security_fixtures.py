"""Certificates and settings files for the listener, TLS and SASL tests.

Certificates are made by `trustme` in each test: a CA for the broker's certificate,
another for the clients' certificates (so trusting one does not trust the other).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import ssl
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import trustme

from harness.broker_process import BrokerProcess


@dataclass
class Pki:
    """The broker's CA and certificate files, and the CA that client certificates chain to."""

    directory: Path
    server_ca: trustme.CA
    client_ca: trustme.CA

    @classmethod
    def create(cls, directory: Path) -> Pki:
        pki = cls(directory, trustme.CA(), trustme.CA())
        directory.mkdir(parents=True, exist_ok=True)
        pki.issue_server_certificate(pki.server_ca)
        pki.client_ca.cert_pem.write_to_path(str(pki.cafile))
        return pki

    @property
    def certfile(self) -> Path:
        return self.directory / "broker.pem"

    @property
    def keyfile(self) -> Path:
        return self.directory / "broker.key"

    @property
    def cafile(self) -> Path:
        return self.directory / "clients-ca.pem"

    def issue_server_certificate(self, ca: trustme.CA) -> None:
        """(Re)write the broker's certificate and key, issued by `ca`, in place."""
        cert = ca.issue_cert("localhost", "127.0.0.1")
        cert.private_key_pem.write_to_path(str(self.keyfile))
        cert.cert_chain_pems[0].write_to_path(str(self.certfile))

    def client_certificate(
        self, common_name: str, *, ca: trustme.CA | None = None, expired: bool = False
    ) -> trustme.LeafCert:
        now = datetime.datetime.now(datetime.UTC)
        window = (
            {
                "not_before": now - datetime.timedelta(days=2),
                "not_after": now - datetime.timedelta(days=1),
            }
            if expired
            else {}
        )
        return (ca or self.client_ca).issue_cert(
            f"{common_name}@example.com", common_name=common_name, **window
        )

    def client_context(
        self, *, trust: trustme.CA | None = None, certificate: trustme.LeafCert | None = None
    ) -> ssl.SSLContext:
        """A client context trusting `trust` (the broker's CA by default), presenting
        `certificate` when given."""
        context = ssl.create_default_context()
        (trust or self.server_ca).configure_trust(context)
        if certificate is not None:
            certificate.configure_cert(context)
        return context

    def settings(self, client_auth: str = "none") -> str:
        """The TLS keys of a settings file (before any [[listeners]] table)."""
        return (
            f'tls_certfile = "{self.certfile}"\n'
            f'tls_keyfile = "{self.keyfile}"\n'
            f'tls_cafile = "{self.cafile}"\n'
            f'tls_client_auth = "{client_auth}"\n'
        )


ALICE = {"MINIBROKER_BOOTSTRAP_USERS": "alice:alice-pw"}
"""The environment that makes `alice` (password `alice-pw`) the first SCRAM user."""


@contextlib.contextmanager
def broker_with_alice(data_dir: Path, backend: str, config: str) -> Iterator[BrokerProcess]:
    """A broker with `config` and the user `alice`, killed on leaving."""
    proc = BrokerProcess(data_dir, backend=backend, config=config, env=ALICE).start()
    try:
        yield proc
    finally:
        proc.kill()


def listeners(*entries: tuple[str, str] | tuple[str, str, str]) -> str:
    """[[listeners]] tables on 127.0.0.1, port 0: (name, security[, host])."""
    out = []
    for entry in entries:
        name, security, host = (*entry, "127.0.0.1")[:3]
        out.append(
            f'[[listeners]]\nname = "{name}"\nhost = "{host}"\nport = 0\nsecurity = "{security}"\n'
        )
    return "".join(out)


def toml_list(values: Sequence[str]) -> str:
    return json.dumps(list(values))


def metric(broker: BrokerProcess, name: str, labels: dict[str, str] | None = None) -> float | None:
    """The value of one sample on the broker's /metrics, or None when it is absent."""
    assert broker.metrics_port is not None
    url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = reply.read().decode()
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted((labels or {}).items()))
    for line in body.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        sample, _, rest = key.partition("{")
        found = ",".join(sorted(rest.rstrip("}").split(","))) if rest else ""
        if sample == name and found == wanted:
            return float(value)
    return None


def wait_for(predicate: Callable[[], object], timeout_s: float = 10.0) -> bool:
    """Poll `predicate()` until true or the deadline: a loaded machine is slow, never
    wrong."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
