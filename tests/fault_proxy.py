"""A loopback TCP proxy that injects faults between a client and the real broker.

It understands frames (uint32 length + msgpack) in both directions, so faults
land on request and response boundaries, at random points chosen by a seeded RNG:

- `drop_request`: a Produce request is swallowed and the connection closed
  (the broker never saw it).
- `drop_response`: a Produce response is discarded after the broker appended
  and answered, and the connection closed (the client cannot know the outcome).
- `corrupt_fetch`: one byte of a Fetch response's records is flipped (the
  consumer must report a CRC mismatch with topic, partition and offset).
- `reject_unknown_producer` / `reject_out_of_order`: a Produce request's batch is
  rewritten (producer id to one never issued, or base sequence far ahead; CRC
  redone) so that the broker itself rejects it with UNKNOWN_PRODUCER_ID or
  OUT_OF_ORDER_SEQUENCE_NUMBER and appends nothing.

Why rewrite the request rather than the response's error code: a rejection that
the broker did not actually make (its batch is appended) would tell the client
"not stored" about a stored batch, and no client can then avoid a duplicate. A
real broker only says UNKNOWN_PRODUCER_ID or OUT_OF_ORDER for batches it did not
append, which is what these rewrites produce. Only a batch's first attempt under
its epoch is rewritten, since the broker answers a retry of an appended batch as
a duplicate.

Runs on plain threads (one acceptor, two pumps per connection) so it works the
same under any client event loop.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from protocol.batch import CRC_START, read_header, with_sequence

_LENGTH = struct.Struct(">I")
UNISSUED_PRODUCER_ID = 2**62
SEQUENCE_JUMP = 1_000_000


class FaultProxy:
    def __init__(
        self,
        target: Callable[[], tuple[str, int]],
        *,
        seed: int = 0,
        drop_request: float = 0.0,
        drop_response: float = 0.0,
        reject_unknown_producer: float = 0.0,
        reject_out_of_order: float = 0.0,
        corrupt_fetch: float = 0.0,
        port: int = 0,
    ) -> None:
        """`target` returns the broker's (host, port) at connect time (it may restart);
        the proxy listens on 127.0.0.1:`port` (0: a free one)."""
        self.target = target
        self.rates = {
            "drop_request": drop_request,
            "drop_response": drop_response,
            "reject_unknown_producer": reject_unknown_producer,
            "reject_out_of_order": reject_out_of_order,
            "corrupt_fetch": corrupt_fetch,
        }
        self.injected: Counter[str] = Counter()
        self.enabled = True
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._attempted: set[tuple[Any, ...]] = set()
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self._sockets: set[socket.socket] = set()
        self._closed = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        threading.Thread(target=self._accept, daemon=True, name="fault-proxy").start()
        return self

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _kill(sock)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _roll(self, fault: str) -> bool:
        rate = self.rates[fault]
        with self._lock:
            hit = self.enabled and rate > 0 and self._rng.random() < rate
            if hit:
                self.injected[fault] += 1
            return hit

    # ------------------------------------------------------------------ plumbing

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target(), timeout=5)
                upstream.settimeout(None)
            except OSError:
                _kill(client)
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets |= {client, upstream}
            link = _Link(client, upstream)
            threading.Thread(target=self._requests, args=(link,), daemon=True).start()
            threading.Thread(target=self._responses, args=(link,), daemon=True).start()

    def _requests(self, link: _Link) -> None:
        """Client to broker; a fault cuts the client off and half-closes towards the broker."""
        try:
            for frame in _frames(link.client):
                out = self._request(frame, link.apis)
                if out is None:
                    break
                link.upstream.sendall(out)
        except OSError:
            pass
        link.cut()

    def _responses(self, link: _Link) -> None:
        """Broker to client, until the broker closes; after a cut, answers are discarded."""
        try:
            for frame in _frames(link.upstream):
                if link.dead:
                    continue
                out = self._response(frame, link.apis)
                if out is None:
                    link.cut()
                    continue
                try:
                    link.client.sendall(out)
                except OSError:
                    link.cut()
        except OSError:
            pass
        link.cut()
        _kill(link.upstream)
        with self._lock:
            self._sockets -= {link.client, link.upstream}

    def _request(self, frame: bytes, apis: dict[int, str]) -> bytes | None:
        message = msgpack.unpackb(frame[4:], raw=False, strict_map_key=False)
        if not isinstance(message, dict):
            return frame
        apis[message.get("cid")] = message.get("api")
        if message.get("api") != "Produce":
            return frame
        if self._roll("drop_request"):
            return None
        changed = False
        for topic in message.get("topics") or []:
            for part in topic.get("partitions") or []:
                rewritten = self._rewrite(topic["topic"], part["partition"], part["records"])
                if rewritten is not None:
                    part["records"] = rewritten
                    changed = True
        if not changed:
            return frame
        body = msgpack.packb(message, use_bin_type=True)
        return _LENGTH.pack(len(body)) + body

    def _rewrite(self, topic: str, partition: int, batch: bytes) -> bytes | None:
        header = read_header(batch)
        if header.producer_id < 0:
            return None
        attempt = (
            topic,
            partition,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
        )
        with self._lock:
            first = attempt not in self._attempted
            self._attempted.add(attempt)
        if not first:
            return None
        if self._roll("reject_unknown_producer"):
            buf = bytearray(batch)
            struct.pack_into(">q", buf, 38, UNISSUED_PRODUCER_ID)
            struct.pack_into(">I", buf, 12, zlib.crc32(memoryview(buf)[CRC_START:]))
            return bytes(buf)
        if self._roll("reject_out_of_order"):
            jumped = (header.base_sequence + SEQUENCE_JUMP) % 2**31
            return with_sequence(batch, header.producer_epoch, jumped)
        return None

    def _response(self, frame: bytes, apis: dict[int, str]) -> bytes | None:
        message = msgpack.unpackb(frame[4:], raw=False, strict_map_key=False)
        api = apis.pop(message.get("cid"), None) if isinstance(message, dict) else None
        if api == "Produce" and self._roll("drop_response"):
            return None
        if api == "Fetch" and self._corrupt_records(message):
            body = msgpack.packb(message, use_bin_type=True)
            return _LENGTH.pack(len(body)) + body
        return frame

    def _corrupt_records(self, message: dict[str, Any]) -> bool:
        for topic in message.get("topics") or []:
            for part in topic.get("partitions") or []:
                records = part.get("records")
                if records and len(records) > 60 and self._roll("corrupt_fetch"):
                    flipped = bytearray(records)
                    flipped[-1] ^= 0xFF  # inside the last batch's records: its CRC fails
                    part["records"] = bytes(flipped)
                    return True
        return False


class _Link:
    """One proxied connection.

    A cut closes the client side at once but only half-closes the broker side,
    which then drains its answers and closes by itself, as after a client that
    sent its last request and went away."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.apis: dict[int, str] = {}  # cid -> api of requests awaiting their answer
        self.dead = False

    def cut(self) -> None:
        self.dead = True
        _kill(self.client)
        with contextlib.suppress(OSError):
            self.upstream.shutdown(socket.SHUT_WR)


def _frames(sock: socket.socket) -> Iterator[bytes]:
    """Whole frames (length prefix included) as they arrive; ends when the peer closes."""
    buf = bytearray()
    while True:
        data = sock.recv(256 * 1024)
        if not data:
            return
        buf += data
        while len(buf) >= 4:
            (length,) = _LENGTH.unpack_from(buf)
            if len(buf) < 4 + length:
                break
            yield bytes(buf[: 4 + length])
            del buf[: 4 + length]


def _kill(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
