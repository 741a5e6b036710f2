"""How far a long command-line run is (perf-produce, perf-consume, consume), for the person
waiting on it.

On a terminal it is a live line (tqdm): the records so far, of how many when that is
known, the rate, MB/s and the time elapsed. Anywhere else (a pipe, a file, a CI log)
it is a plain line every `--reporting-interval` ms (Kafka's perf tools' option and
default), which a log keeps readably. `summary()` says what was done, also after Ctrl-C.
"""

from __future__ import annotations

import time
from typing import TextIO

from tqdm import tqdm

REPORT_INTERVAL_MS = 5_000
MB = 1024 * 1024


class Progress:
    """Records and bytes done so far, shown on `stream` as the module doc says.

    `live=False` shows no live line, `plain=False` no periodic lines (perf-produce prints
    Kafka's itself); `delay_s` holds the live line back, so a short run shows none."""

    def __init__(
        self,
        stream: TextIO,
        verb: str,
        *,
        total: int | None = None,
        interval_ms: float = REPORT_INTERVAL_MS,
        live: bool = True,
        plain: bool = True,
        delay_s: float = 0.0,
    ) -> None:
        self.stream = stream
        self.verb = verb
        self.total = total
        self.records = 0
        self.bytes = 0
        self.start = time.monotonic()
        self._interval_s = interval_ms / 1000
        self._next_line = self.start + self._interval_s
        tty = stream.isatty()
        self._plain = plain and not tty
        self._bar: tqdm | None = None
        if live and tty:
            self._bar = tqdm(
                total=total,
                desc=verb,
                unit=" records",
                unit_scale=True,
                file=stream,
                dynamic_ncols=True,
                mininterval=0.2,
                delay=delay_s,
                leave=False,
            )

    def restart(self) -> None:
        """Count time from now (after set-up that should not weigh on the rate)."""
        self.start = time.monotonic()
        self._next_line = self.start + self._interval_s
        if self._bar is not None:
            self._bar.reset(total=self.total)

    def show(self, records: int, nbytes: int) -> None:
        """`records` and `nbytes` are done in all: move the live line, or print a plain line
        when the interval is up."""
        self.records, self.bytes = records, nbytes
        now = time.monotonic()
        bar = self._bar
        if bar is not None:
            if records > bar.n:
                bar.set_postfix_str(f"{self._mb_per_s(now):.2f} MB/s", refresh=False)
                bar.update(records - bar.n)
        elif self._plain and now >= self._next_line:
            self._next_line = now + self._interval_s
            self.write(self.summary())

    def write(self, line: str) -> None:
        """Print `line` on the stream without garbling the live line."""
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def summary(self) -> str:
        """'N records consumed in E s (R records/sec, M MB/sec)'."""
        now = time.monotonic()
        elapsed = now - self.start
        rate = self.records / elapsed if elapsed > 0 else 0.0
        of = "" if self.total is None else f" of {self.total}"
        return (
            f"{self.records}{of} records {self.verb} in {elapsed:.1f} s "
            f"({rate:.1f} records/sec, {self._mb_per_s(now):.2f} MB/sec)"
        )

    def close(self) -> None:
        """Take the live line away (the summary, printed next, replaces it)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _mb_per_s(self, now: float) -> float:
        elapsed = now - self.start
        return self.bytes / MB / elapsed if elapsed > 0 else 0.0
