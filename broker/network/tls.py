"""TLS on the `tls` and `sasl_tls` listeners: the server's context from the settings, the
handshake with its deadline, and the principal a client certificate names
(docs/protocol.md section 7).

The protocol work is the standard library's `ssl` through AnyIO's `TLSStream`, which
runs over any byte stream: trio's sockets and asyncio's read-ahead connections alike.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
from anyio.abc import ByteStream
from anyio.streams.tls import TLSAttribute, TLSStream

from broker.config import BrokerConfig, ConfigError

CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


TRANSPORT_RECEIVE_BYTES = 256 * 1024


class HandshakeFailed(Exception):
    """The TLS handshake did not finish: its message says why, for the log."""


class _EncryptedKey(Exception):
    """The key file asks for a password the broker does not have."""


def _no_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for it.
    raise _EncryptedKey


def server_context(config: BrokerConfig) -> ssl.SSLContext:
    """A server context from tls_certfile, tls_keyfile, tls_cafile and tls_client_auth,
    TLS 1.2 or later; the files are read now. ConfigError says which file failed and why.

    Client certificates are checked against tls_cafile alone, never the system's CAs:
    any certificate a public CA issued would otherwise be a principal here."""
    context = _context(config.tls_certfile, config.tls_keyfile, "tls_")
    context.verify_mode = CLIENT_AUTH[config.tls_client_auth]
    if config.tls_cafile:
        try:
            context.load_verify_locations(cafile=config.tls_cafile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"tls_cafile={config.tls_cafile!r} cannot be loaded: {_reason(exc)}"
            ) from None
    return context


def metrics_context(config: BrokerConfig) -> ssl.SSLContext:
    """The metrics server's context from metrics_tls_certfile and metrics_tls_keyfile, TLS
    1.2 or later, no client certificates (scrapers authenticate with basic auth);
    ConfigError says which file failed and why."""
    return _context(config.metrics_tls_certfile, config.metrics_tls_keyfile, "metrics_tls_")


def _context(certfile: str, keyfile: str, prefix: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # A renegotiation would make a send wait for a receive, which the connection's
    # writer and reader do in separate tasks.
    context.options |= ssl.OP_NO_RENEGOTIATION
    files = f"{prefix}certfile={certfile!r} with {prefix}keyfile={keyfile!r}"
    try:
        context.load_cert_chain(certfile, keyfile, password=_no_password)
    except _EncryptedKey:
        raise ConfigError(f"{files}: the key is encrypted; give an unencrypted key") from None
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{files} cannot be loaded: {_reason(exc)}") from None
    return context


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"{exc.reason}: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    return exc.strerror or str(exc)


class _Transport(ByteStream):
    """The connection under TLS, read TRANSPORT_RECEIVE_BYTES at a time: a `TLSStream`
    asks its transport for its default amount, 64 KiB, four batches of 16 KiB, where a
    plaintext connection's read takes up to 256 KiB."""

    def __init__(self, inner: ByteStream) -> None:
        self.inner = inner

    async def receive(self, max_bytes: int = TRANSPORT_RECEIVE_BYTES) -> bytes:
        return await self.inner.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        await self.inner.send(item)

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return self.inner.extra_attributes


async def handshake(stream: ByteStream, context: ssl.SSLContext, timeout_ms: int) -> TLSStream:
    """The server side of a TLS handshake on `stream`, within `timeout_ms`; HandshakeFailed
    when the peer does not finish it in time, sends what is not TLS, or presents a
    certificate `context` refuses. The caller closes `stream` then."""
    with anyio.move_on_after(timeout_ms / 1000):
        try:
            # Not standard_compatible: a client that closes without close_notify is
            # simply gone (as Kafka treats it), not an error.
            return await TLSStream.wrap(
                _Transport(stream),
                server_side=True,
                ssl_context=context,
                standard_compatible=False,
            )
        except ssl.SSLError as exc:
            raise HandshakeFailed(_reason(exc)) from None
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError) as exc:
            raise HandshakeFailed(f"connection ended during the handshake ({exc!r})") from None
    raise HandshakeFailed(f"not finished within tls_handshake_timeout_ms={timeout_ms}")


def receiver(stream: TLSStream) -> Callable[[int], Awaitable[bytes]]:
    """`stream`'s receive as the reader wants it: up to `max_bytes` of plaintext, one
    receive of `stream` and every whole TLS record its transport has already read behind
    it.

    A `TLSStream` hands out one record (at most 16 KiB) per receive, so a pipelining
    client's 16 KiB Produce batches arrived one per read: each was handled, written and
    answered alone, at four times the broker's CPU per batch of a plaintext connection,
    whose reads hold several that append together. The records behind the first are
    decrypted from the buffer without a wait; what they leave to send (a TLS 1.3 key
    update's answer) goes out with the stream's next send."""
    ssl_object = stream.extra(TLSAttribute.ssl_object)

    async def receive(max_bytes: int) -> bytes:
        data = await stream.receive(max_bytes)
        chunks = [data]
        size = len(data)
        while size < max_bytes:
            try:
                more = ssl_object.read(max_bytes - size)
            except ssl.SSLError:
                # No whole record buffered (SSLWantReadError), or the connection's end
                # or failure, which the stream's next receive meets and reports.
                break
            if not more:
                break
            chunks.append(more)
            size += len(more)
        return data if len(chunks) == 1 else b"".join(chunks)

    return receive


def certificate_principal(stream: ByteStream) -> str | None:
    """`User:<CN>` of the client certificate the handshake verified, or None when the
    client sent none (or its subject has no common name)."""
    certificate: Mapping[str, Any] | None = stream.extra(TLSAttribute.peer_certificate, None)
    for rdn in (certificate or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return f"User:{value}"
    return None
