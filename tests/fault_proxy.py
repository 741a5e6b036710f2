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
- `drop_end_txn_request`: an EndTxn request is swallowed and the connection closed
  (the broker never saw it; requests before it in the same write did reach it).
- `drop_end_txn_response`: an EndTxn answer is discarded after the broker acted on
  it (committed, aborted or refused), and the connection closed.

Each fault that happened is counted in `injected`. `limits` caps how many times a
fault may happen (with a rate of 1.0 and a limit of 1: exactly the first chance),
`after` holds a fault back until another one has happened (every Produce request
dropped once the first Produce answer was: the batches' resends never arrive),
and `record` names the APIs whose requests and answers the proxy keeps, in the
order it saw them, in `seen` (whether each passed or was dropped, so a test can
tell what the broker answered to a request whose answer the client never got).

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
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, NamedTuple, Self

import msgpack

from protocol.batch import CRC_START, read_header, with_sequence

_LENGTH = struct.Struct(">I")
UNISSUED_PRODUCER_ID = 2**62
SEQUENCE_JUMP = 1_000_000


class Seen(NamedTuple):
    """A request or answer of a recorded API, as the proxy saw it."""

    api: str
    direction: str  # "request" (client to broker) or "response"
    message: dict[str, Any]
    passed: bool  # False: dropped by a fault, or discarded after a cut
    connection: int  # which connection (numbered from 1): with the cid, pairs an answer


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
        drop_end_txn_request: float = 0.0,
        drop_end_txn_response: float = 0.0,
        limits: Mapping[str, int] | None = None,
        after: Mapping[str, str] | None = None,
        record: Collection[str] = (),
        port: int = 0,
    ) -> None:
        """`target` returns the broker's (host, port) at connect time (it may restart);
        the proxy listens on 127.0.0.1:`port` (0: a free one). `limits`: at most this
        many injections of the named faults; `after`: {fault: the fault that must have
        happened before it may}; `record`: the APIs kept in `seen`."""
        self.target = target
        self.rates = {
            "drop_request": drop_request,
            "drop_response": drop_response,
            "reject_unknown_producer": reject_unknown_producer,
            "reject_out_of_order": reject_out_of_order,
            "corrupt_fetch": corrupt_fetch,
            "drop_end_txn_request": drop_end_txn_request,
            "drop_end_txn_response": drop_end_txn_response,
        }
        self.limits = dict(limits or {})
        self.after = dict(after or {})
        unknown = (set(self.limits) | set(self.after) | set(self.after.values())) - set(self.rates)
        if unknown:
            raise ValueError(f"limits or after name unknown faults: {sorted(unknown)}")
        self.record = frozenset(record)
        self.seen: list[Seen] = []
        self.injected: Counter[str] = Counter()
        self.enabled = True
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._attempted: set[tuple[Any, ...]] = set()
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._connections = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Self:
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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _roll(self, fault: str) -> bool:
        rate = self.rates[fault]
        limit = self.limits.get(fault)
        with self._lock:
            if limit is not None and self.injected[fault] >= limit:
                return False
            gate = self.after.get(fault)
            if gate is not None and not self.injected[gate]:
                return False
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
            self._connections += 1
            link = _Link(client, upstream, self._connections)
            threading.Thread(target=self._requests, args=(link,), daemon=True).start()
            threading.Thread(target=self._responses, args=(link,), daemon=True).start()

    def _requests(self, link: _Link) -> None:
        """Client to broker; a fault cuts the client off and half-closes towards the broker.

        The frames that arrived together go on in one write, so requests the client
        wrote at once (a transaction's last Produce and its EndTxn) reach the broker
        before any of them can be answered, even if the frame after them is dropped."""
        try:
            for frames in _frame_runs(link.client):
                out: list[bytes] = []
                link.apis.noted = []
                for frame in frames:
                    passed = self._request(frame, link.apis)
                    if passed is None:
                        break
                    out.append(passed)
                if out:
                    try:
                        link.upstream.sendall(b"".join(out))
                    except OSError:
                        # Cut meanwhile (an answer was dropped): the broker never saw them.
                        self._not_passed(link.apis.noted)
                        raise
                if len(out) < len(frames):
                    break
        except OSError:
            pass
        link.cut()

    def _responses(self, link: _Link) -> None:
        """Broker to client, until the broker closes; after a cut, answers are discarded."""
        try:
            for frame in _frames(link.upstream):
                if link.dead:
                    if self.record:
                        self._discarded(frame, link.apis)
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
        """The frame to forward (rewritten, perhaps), or None to drop it and cut."""
        message = msgpack.unpackb(frame[4:], raw=False, strict_map_key=False)
        if not isinstance(message, dict):
            return frame
        cid: Any = message.get("cid")
        api: Any = message.get("api")
        apis[cid] = api
        if api == "EndTxn":
            dropped = self._roll("drop_end_txn_request")
            self._note(apis, api, "request", message, not dropped)
            return None if dropped else frame
        if api != "Produce":
            self._note(apis, api, "request", message, True)
            return frame
        if self._roll("drop_request"):
            self._note(apis, api, "request", message, False)
            return None
        changed = False
        for topic in message.get("topics") or []:
            for part in topic.get("partitions") or []:
                rewritten = self._rewrite(topic["topic"], part["partition"], part["records"])
                if rewritten is not None:
                    part["records"] = rewritten
                    changed = True
        self._note(apis, api, "request", message, True)
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
        cid: Any = message.get("cid") if isinstance(message, dict) else None
        api = apis.pop(cid, None)
        if api == "Produce" and self._roll("drop_response"):
            self._note(apis, api, "response", message, False)
            return None
        if api == "EndTxn" and self._roll("drop_end_txn_response"):
            self._note(apis, api, "response", message, False)
            return None
        self._note(apis, api, "response", message, True)
        if api == "Fetch" and self._corrupt_records(message):
            body = msgpack.packb(message, use_bin_type=True)
            return _LENGTH.pack(len(body)) + body
        return frame

    def _discarded(self, frame: bytes, apis: dict[int, str]) -> None:
        """An answer that arrived after the cut: the client never gets it."""
        message = msgpack.unpackb(frame[4:], raw=False, strict_map_key=False)
        if isinstance(message, dict):
            cid: Any = message.get("cid")
            self._note(apis, apis.pop(cid, None), "response", message, False)

    def _note(
        self, apis: dict[int, str], api: str | None, direction: str, message: Any, passed: bool
    ) -> None:
        """Record it in `seen` if its API is recorded (a forwarded request's index goes to
        its connection's `noted`, in case the write fails)."""
        if api not in self.record or not isinstance(message, dict):
            return
        connection = apis.connection if isinstance(apis, _Apis) else 0
        with self._lock:
            self.seen.append(Seen(api, direction, message, passed, connection))
            if passed and direction == "request" and isinstance(apis, _Apis):
                apis.noted.append(len(self.seen) - 1)

    def _not_passed(self, noted: list[int]) -> None:
        with self._lock:
            for index in noted:
                self.seen[index] = self.seen[index]._replace(passed=False)

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


class _Apis(dict[int, str]):
    """cid -> api of a connection's requests awaiting their answer; also which connection
    it is, and where `seen` holds the requests of the write being forwarded."""

    def __init__(self, connection: int) -> None:
        super().__init__()
        self.connection = connection
        self.noted: list[int] = []


class _Link:
    """One proxied connection.

    A cut closes the client side at once but only half-closes the broker side,
    which then drains its answers and closes by itself, as after a client that
    sent its last request and went away."""

    def __init__(self, client: socket.socket, upstream: socket.socket, number: int = 0) -> None:
        self.client = client
        self.upstream = upstream
        self.apis = _Apis(number)  # number: the proxy's count of connections, this one too
        self.dead = False

    def cut(self) -> None:
        self.dead = True
        _kill(self.client)
        with contextlib.suppress(OSError):
            self.upstream.shutdown(socket.SHUT_WR)


def _frames(sock: socket.socket) -> Iterator[bytes]:
    """Whole frames (length prefix included) as they arrive; ends when the peer closes."""
    for frames in _frame_runs(sock):
        yield from frames


def _frame_runs(sock: socket.socket) -> Iterator[list[bytes]]:
    """The whole frames (length prefix included) each read completed, in order (never an
    empty list); ends when the peer closes."""
    buf = bytearray()
    while True:
        data = sock.recv(256 * 1024)
        if not data:
            return
        buf += data
        frames: list[bytes] = []
        while len(buf) >= 4:
            (length,) = _LENGTH.unpack_from(buf)
            if len(buf) < 4 + length:
                break
            frames.append(bytes(buf[: 4 + length]))
            del buf[: 4 + length]
        if frames:
            yield frames


def _kill(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
