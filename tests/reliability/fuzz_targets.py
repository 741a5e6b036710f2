"""Fuzz targets shared by Hypothesis, atheris (`make fuzz`) and the crash replays.

`one_input(data)` treats the first byte as a selector: the rest of the bytes go
through the frame decoder (fed in chunks) and every body it yields through
`decode_request`, or straight into `decode_request`, or into the batch
validator. Each may raise only the errors the contract names: FrameError or
RequestRefused for frames and requests, BatchError for batches. Anything else
escapes, and the fuzzer keeps the input as a crash file.
"""

from __future__ import annotations

import contextlib

from protocol.batch import BatchError, validate
from protocol.framing import FrameDecoder, FrameError
from protocol.messages import RequestRefused, decode_request

FRAME_BYTES_MAX = 1 << 16


def frames(data: bytes, chunk: int) -> None:
    decoder = FrameDecoder(FRAME_BYTES_MAX)
    for start in range(0, len(data), max(chunk, 1)):
        try:
            bodies = decoder.feed_bodies(data[start : start + max(chunk, 1)])
        except FrameError:
            return
        for body in bodies:
            request_bytes(body)


def request_bytes(body: bytes) -> None:
    with contextlib.suppress(FrameError, RequestRefused):
        decode_request(body)


def batch_bytes(data: bytes) -> None:
    with contextlib.suppress(BatchError):
        validate(data, max_bytes=1 << 20)


def one_input(data: bytes) -> None:
    if not data:
        return
    selector, rest = data[0], data[1:]
    if selector % 3 == 0:
        frames(rest, 1 + selector // 3)
    elif selector % 3 == 1:
        request_bytes(rest)
    else:
        batch_bytes(rest)
