"""A progress line for long work (a corpus tokenized, a checkpoint converted): what is done, MB/s
and, the total being known, the share done and the time left. On stderr, redrawn in place on a
terminal and every 10 s otherwise, so work shorter than that prints nothing until `finish`."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

TTY_EVERY_S, LOG_EVERY_S = 0.2, 10.0


def clock(seconds: float) -> str:
    """`seconds` as h:mm:ss."""
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


class ProgressLine:
    """Bytes done of `total_bytes` (0: unknown), `done_bytes` of them before this process (a
    resumed run: not counted in the rate). `advance` may be called from several threads; the
    advance that reaches the total ends a drawn line (`finish`)."""

    def __init__(
        self,
        total_bytes: int,
        what: str = "",
        stream: TextIO | None = None,
        done_bytes: int = 0,
    ) -> None:
        self.total, self.what = total_bytes, what
        self.stream = stream or sys.stderr  # the stderr of now, not of import
        self.tty = self.stream.isatty()
        self.start = self.shown = time.monotonic()
        self.before = self.done = done_bytes
        self.drawn = False
        self._lock = threading.Lock()

    def advance(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            if self.total and self.done >= self.total:
                self.finish(always=False)
            else:
                self.tick()

    def tick(self) -> None:
        """Draw the line if its interval has passed."""
        now = time.monotonic()
        if now - self.shown >= (TTY_EVERY_S if self.tty else LOG_EVERY_S):
            self.shown = now
            self._show(end="\r" if self.tty else "\n")

    def finish(self, always: bool = True) -> None:
        """The last line; with `always` false only where a line was drawn before (a short
        conversion stays silent)."""
        if always or self.drawn:
            self._show(end="\n")
            self.drawn = False  # one last line

    def counts(self) -> list[str]:
        """What is done, before the rate (a subclass names its own units)."""
        scale, unit = (1e9, "GB") if max(self.total, self.done) >= 1e9 else (1e6, "MB")
        done = f"{self.done / scale:,.2f}"
        return [f"{done} of {self.total / scale:,.2f} {unit}" if self.total else f"{done} {unit}"]

    def _show(self, end: str) -> None:
        self.drawn = True
        rate = (self.done - self.before) / max(time.monotonic() - self.start, 1e-9)
        parts = [*self.counts(), f"{rate / 1e6:.1f} MB/s"]
        if self.total:
            parts.append(f"{min(100 * self.done / self.total, 100):.0f}%")
            if rate > 0 and self.done < self.total:
                parts.append(f"ETA {clock((self.total - self.done) / rate)}")
        prefix = f"{self.what}: " if self.what else ""
        self.stream.write("\r" * self.tty + prefix + " · ".join(parts) + end)
        self.stream.flush()
