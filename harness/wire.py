"""A raw-protocol client for tests and benchmarks: plain sockets, frames and maps, no SDK.

Integration tests speak the wire contract directly so they prove the broker
against docs/protocol.md, not against our own client's habits. For the security
listeners it speaks TLS (`ssl_context`) and SASL (`authenticate`, with `scramp`'s
client for SCRAM).
"""

from __future__ import annotations

import itertools
import socket
import ssl
import struct
from typing import Any

from scramp import ScramClient

from protocol.batch import build_batch, iter_records, scan_batches
from protocol.framing import FrameDecoder, encode_frame

TIMEOUT_S = 15.0


class AuthenticationError(Exception):
    """A SaslAuthenticate answered with an error; `response` is the answer."""

    def __init__(self, response: dict[str, Any]) -> None:
        super().__init__(f"error {response['error']}: {response.get('error_message')}")
        self.response = response


class WireClient:
    def __init__(
        self,
        bootstrap: str,
        timeout_s: float = TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str = "localhost",
    ) -> None:
        host, port = bootstrap.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            try:
                sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        self.decoder = FrameDecoder(1 << 30)
        self._pending: list[Any] = []
        self._cids = itertools.count(1)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def send(self, api: str, **fields: Any) -> int:
        """Send one request without waiting; returns its cid."""
        cid = fields.pop("cid", None)
        if cid is None:
            cid = next(self._cids)
        self.send_raw(encode_frame({"api": api, "v": fields.pop("v", 1), "cid": cid, **fields}))
        return cid

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> dict[str, Any]:
        while not self._pending:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self._pending.extend(self.decoder.feed(chunk))
        return self._pending.pop(0)

    def call(self, api: str, **fields: Any) -> dict[str, Any]:
        cid = self.send(api, **fields)
        response = self.recv()
        assert response["cid"] == cid, (response, cid)
        return response

    def is_closed_by_peer(self) -> bool:
        """True when the broker closes this connection (EOF, reset, or a TLS alert that
        ends it) within the socket's timeout; False when it stays open that long or sends
        something instead."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
        except ssl.SSLError as exc:
            # A timeout on a TLS socket is an SSLError too on some versions.
            return "timed out" not in str(exc)

    # SASL -----------------------------------------------------------------

    def sasl(self, mechanism: str, auth_bytes: bytes) -> dict[str, Any]:
        """One SaslAuthenticate round, answered as it is."""
        return self.call("SaslAuthenticate", mechanism=mechanism, auth_bytes=auth_bytes)

    def authenticate(
        self, user: str, password: str, mechanism: str = "SCRAM-SHA-256"
    ) -> dict[str, Any]:
        """Authenticate with PLAIN or SCRAM (scramp's client, which also checks the
        broker's server-final); the last answer, or AuthenticationError."""
        if mechanism == "PLAIN":
            response = self.sasl(mechanism, f"\0{user}\0{password}".encode())
            if response["error"]:
                raise AuthenticationError(response)
            return response
        client = ScramClient([mechanism], user, password)
        first = self.sasl(mechanism, client.get_client_first().encode())
        if first["error"]:
            raise AuthenticationError(first)
        client.set_server_first(first["auth_bytes"].decode())
        final = self.sasl(mechanism, client.get_client_final().encode())
        if final["error"]:
            raise AuthenticationError(final)
        client.set_server_final(final["auth_bytes"].decode())
        return final

    # Convenience wrappers ------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, config: dict | None = None) -> int:
        r = self.call(
            "CreateTopics", topics=[{"name": name, "partitions": partitions, "config": config}]
        )
        return r["topics"][0]["error"]

    def init_producer(self, **fields: Any) -> tuple[int, int]:
        r = self.call("InitProducerId", **fields)
        assert r["error"] == 0, r
        return r["producer_id"], r["producer_epoch"]

    def produce(
        self,
        topic: str,
        partition: int,
        batch: bytes,
        acks: int = 1,
        timeout_ms: int = 10_000,
        transactional_id: str | None = None,
    ) -> dict[str, Any]:
        r = self.call(
            "Produce",
            acks=acks,
            timeout_ms=timeout_ms,
            transactional_id=transactional_id,
            topics=[{"topic": topic, "partitions": [{"partition": partition, "records": batch}]}],
        )
        return r["topics"][0]["partitions"][0]

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
        partition_max_bytes: int = 1 << 20,
        isolation_level: int = 0,
    ) -> dict[str, Any]:
        r = self.call(
            "Fetch",
            max_wait_ms=max_wait_ms,
            min_bytes=min_bytes,
            max_bytes=50 << 20,
            isolation_level=isolation_level,
            topics=[
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": partition,
                            "fetch_offset": offset,
                            "partition_max_bytes": partition_max_bytes,
                        }
                    ],
                }
            ],
        )
        return r["topics"][0]["partitions"][0]


def values_batch(
    values: list[bytes],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp_ms: int = 1_700_000_000_000,
    transactional: bool = False,
) -> bytes:
    return build_batch(
        [(timestamp_ms, None, v, None) for v in values],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        transactional=transactional,
    )


def frame_of_length(length: int) -> bytes:
    """Just a length prefix: what a hostile client sends to make the broker allocate."""
    return struct.pack(">I", length)


def fetched_values(records: bytes, from_offset: int = 0) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record at or after `from_offset` in fetched bytes."""
    out = []
    for pos, header in scan_batches(records):
        for r in iter_records(records, pos, header):
            if r.offset >= from_offset:
                out.append((r.offset, r.value))
    return out
