"""A minimal progress bar for long command-line work (stderr, terminals only)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Shows ``label  42% 1.2/2.9 GB  850 MB/s`` on one line of a terminal.

    Silent unless ``stream`` is a terminal and ``total`` reaches ``threshold`` bytes.
    """

    def __init__(self, total: int, label: str, *, threshold: int = 64 << 20, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        # the bar's own "\r" must reach the terminal: past the CLI's escaping stream
        # (icecrypt.cli._text.SafeStream); the label is the CLI's, never from storage
        self.stream = getattr(self.stream, "unescaped", self.stream)
        self.total = total
        self.label = label
        self.done = 0
        self.enabled = total >= threshold and getattr(self.stream, "isatty", lambda: False)()
        self._start = time.monotonic()
        self._last = 0.0

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and self.done < self.total:
            return
        self._last = now
        rate = self.done / max(now - self._start, 1e-9)
        pct = 100 * self.done / self.total if self.total else 100
        self.stream.write(
            f"\r{self.label}  {pct:3.0f}% {self.done / 1e9:.2f}/{self.total / 1e9:.2f} GB  {rate / 1e6:,.0f} MB/s"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
