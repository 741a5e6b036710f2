"""Length-prefixed msgpack frames, sans IO: bytes in, messages out.

| size | field                                  |
|-----:|----------------------------------------|
|    4 | length, uint32 big-endian              |
|  len | one msgpack value (a map for messages) |

`FrameDecoder` never touches a socket. It refuses a declared length over its
limit as soon as the 4 length bytes arrive, before buffering the body, so a
hostile peer cannot make the broker allocate a large frame. It hands out at most
`frames_max` bodies per call when asked to, so a read of many small requests costs
a bounded number of views at a time, not one per request.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgpack

LENGTH = struct.Struct(">I")
LENGTH_BYTES = 4
DEFAULT_FRAME_BYTES_MAX = 16 * 1024 * 1024
# A read of a begun frame at least this long is kept as a view of the read's bytes
# (which it keeps alive: at most one read's worth more than the frame), a shorter one
# is copied into the frame's last part.
_VIEW_BYTES_MIN = 64 * 1024


class FrameError(Exception):
    """The byte stream cannot be framed or decoded; the connection must close."""


class OtherProtocol(FrameError):
    """A frame of the other protocol the broker speaks, on a listener that does not speak
    it: a Kafka client at a minibroker listener, or minibroker's SDK at a kafka one.
    `protocol` is a listener's `protocol` setting ("kafka", "minibroker")."""

    def __init__(self, protocol: str, what: str) -> None:
        super().__init__(what)
        self.protocol = protocol


class FrameTooLarge(FrameError):
    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame of {length} bytes exceeds max_frame_bytes {limit}")
        self.length = length
        self.limit = limit


def encode_frame(message: Any) -> bytes:
    """One frame holding `message` as msgpack (str for text, bin for bytes)."""
    return frame(msgpack.packb(message, use_bin_type=True))


def decode_body(body: bytes | memoryview) -> Any:
    """Decode one frame's msgpack body, mapping every decoder failure to FrameError."""
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise FrameError(f"frame body is not msgpack: {exc}") from exc


class FrameDecoder:
    """Incremental decoder: `feed` bytes as they arrive, get whole messages back."""

    __slots__ = ("_filled", "_length", "_parts", "_waiting", "frame_bytes_max")

    def __init__(self, frame_bytes_max: int = DEFAULT_FRAME_BYTES_MAX) -> None:
        self.frame_bytes_max = frame_bytes_max
        # A frame begun in earlier reads, as views of them (each read is bytes nobody
        # changes; short reads copied together, _keep): joined once when whole, instead
        # of appended to a growing buffer read by read and copied out again (a 1 MiB
        # produce arrives in several reads).
        self._parts: list[memoryview | bytearray] = []
        self._filled = 0
        # Its body's length once its 4 length bytes arrived, else -1.
        self._length = -1
        # What a call that stopped at frames_max left unread of its data: views, not
        # copies, handed out by the next call.
        self._waiting: list[memoryview] = []

    @property
    def buffered_bytes(self) -> int:
        """Bytes of a frame begun but not yet whole (a frame at the end of the waiting
        ones is counted once they are taken)."""
        return self._filled

    @property
    def frames_waiting(self) -> bool:
        """Whether bytes already fed wait to be decoded (a call stopped at its frames_max):
        whole frames, or the rest of a frame begun, fed as several reads. Take them
        with `feed_views()` before feeding more."""
        return bool(self._waiting)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]:
        """Append `data` and return every message now complete, decoded as plain msgpack."""
        return [decode_body(body) for body in self.feed_bodies(data)]

    def feed_bodies(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Append `data` and return the body of every frame now complete, in order:
        for callers that decode with a typed decoder of their own."""
        return [bytes(body) for body in self.feed_views(data)]

    def feed_views(
        self,
        data: bytes | bytearray | memoryview | list[bytes] = b"",
        frames_max: int | None = None,
    ) -> list[bytes | memoryview]:
        """As `feed_bodies`, without copying what need not be: a body lying whole in
        `data` comes back as a view of it, which holds the whole of `data` alive. Only
        a body split across reads is copied, once. The broker's path for 16 KiB
        batches, where each copy costs as much as the CRC check. `data` may also be
        several reads in order (a read-ahead's chunks), taken as if joined, without
        the copy joining them costs.

        With `frames_max`, at most that many bodies; the bytes left wait
        (`frames_waiting`) for the next call, which must then feed nothing new."""
        if frames_max is not None and frames_max < 1:
            raise ValueError(f"frames_max must be at least 1, not {frames_max}")
        bodies: list[bytes | memoryview] = []
        if self._waiting:
            if data:
                raise ValueError("feed_views() the waiting frames before feeding more bytes")
            views, self._waiting = self._waiting, []
        else:
            # A view must not see the caller change its buffer: bytes are kept as they
            # are, anything else copied.
            views = [
                memoryview(read if isinstance(read, bytes) else bytes(read))
                for read in (data if isinstance(data, list) else [data])
            ]
        room = -1 if frames_max is None else frames_max
        for k, view in enumerate(views):
            if len(bodies) == room:
                self._waiting = views[k:]
                return bodies
            if self._filled:
                view = self._finish_buffered(view, bodies)
                if self._filled:
                    continue
            pos = 0
            end = len(view)
            while end - pos >= LENGTH_BYTES:
                (length,) = LENGTH.unpack_from(view, pos)
                if length > self.frame_bytes_max:
                    self._keep(view[pos:])
                    raise FrameTooLarge(length, self.frame_bytes_max)
                start = pos + LENGTH_BYTES
                if end - start < length:
                    break
                if len(bodies) == room:
                    self._waiting = [view[pos:], *views[k + 1 :]]
                    return bodies
                bodies.append(view[start : start + length])
                pos = start + length
            if pos < end:
                self._keep(view[pos:])
        return bodies

    def _finish_buffered(self, view: memoryview, bodies: list[bytes | memoryview]) -> memoryview:
        """Complete the frame begun in earlier reads from the front of `view`; return the
        rest of `view`. The frame stays begun (`_filled`) while it is still partial."""
        if self._length < 0:
            take = LENGTH_BYTES - self._filled
            self._keep(view[:take])
            view = view[take:]
            if self._length < 0:
                return view
            if self._length > self.frame_bytes_max:
                raise FrameTooLarge(self._length, self.frame_bytes_max)
        take = LENGTH_BYTES + self._length - self._filled
        if take > len(view):
            self._keep(view)
            return view[len(view) :]
        parts = self._parts
        parts.append(view[:take])
        # Drop the length bytes from the front (they may span parts), join the body once.
        skip = LENGTH_BYTES
        while skip:
            first = parts[0]
            if len(first) > skip:
                parts[0] = first[skip:]
                break
            skip -= len(first)
            del parts[0]
        bodies.append(b"".join(parts))
        self._parts = []
        self._filled = 0
        self._length = -1
        return view[take:]

    def _keep(self, view: memoryview) -> None:
        """Hold `view` as the next bytes of the frame begun, without copying it; read
        the body's length once its 4 bytes are there."""
        if len(view) >= _VIEW_BYTES_MIN:
            self._parts.append(view)
        elif view:
            # Small reads are copied together: a peer trickling a frame byte by byte
            # must not cost an object per byte.
            last = self._parts[-1] if self._parts else None
            if isinstance(last, bytearray):
                last += view
            else:
                self._parts.append(bytearray(view))
        self._filled += len(view)
        if self._length < 0 and self._filled >= LENGTH_BYTES:
            head = b"".join(part[:LENGTH_BYTES] for part in self._parts)
            (self._length,) = LENGTH.unpack_from(head)


def _bin_header(length: int) -> bytes:
    if length < 1 << 8:
        return b"\xc4" + length.to_bytes(1, "big")
    if length < 1 << 16:
        return b"\xc5" + length.to_bytes(2, "big")
    return b"\xc6" + length.to_bytes(4, "big")


def frame(body: bytes) -> bytes:
    """One frame around an already encoded msgpack body."""
    return LENGTH.pack(len(body)) + body


def splice_frame(body: bytes, holes: list[tuple[bytes, int]]) -> list[bytes | int]:
    """A frame whose `bin` values are sent separately (zero-copy from a file).

    `body` carries, in place of each such value, a unique placeholder; `holes`
    lists (placeholder, real length). The result alternates bytes to send with
    the index of the hole whose bytes go there, and the length prefix already
    counts the real lengths. Pure: the caller does the file IO."""
    numbered = [(index, placeholder, length) for index, (placeholder, length) in enumerate(holes)]
    pieces, total = splice_holes(body, 0, numbered, _bin_header)
    pieces[0] = LENGTH.pack(total) + pieces[0]  # type: ignore[operator]
    return pieces


def splice_holes(
    data: bytes,
    start: int,
    holes: list[tuple[int, bytes, int]],
    length_field: Callable[[int], bytes],
) -> tuple[list[bytes | int], int]:
    """`data` from `start` on, cut where values are sent separately, and how many bytes
    it all sends. `data` carries, in place of each value, a unique placeholder after
    its length field (`length_field(length)`, the format's); `holes` lists (index,
    placeholder, real length). The pieces alternate bytes to send with the index whose
    bytes go there, the length fields rewritten to the real lengths: the caller puts
    the frame's own length prefix before the first."""
    pieces: list[bytes | int] = []
    total = len(data) - start
    cursor = start
    for index, placeholder, length in holes:
        encoded = length_field(len(placeholder)) + placeholder
        at = data.find(encoded, cursor)
        assert at >= 0 and data.find(encoded, at + 1) < 0, "placeholder must occur once"
        header = length_field(length)
        pieces += [data[cursor:at] + header, index]
        total += len(header) + length - len(encoded)
        cursor = at + len(encoded)
    pieces.append(data[cursor:])
    return pieces, total
