"""A tiny progress bar for the command line. It draws on stderr only when stderr is a terminal,
so piped or captured output never contains progress noise.

    with Progress(total=n_bytes, label="restore", unit="B") as bar:
        for piece in pieces:
            ...
            bar.update(len(piece))

With ``total=None`` it is a spinner with the elapsed time, redrawn by a background thread
(for single long calls such as compaction that report no progress of their own).
Set ``SNAPSTORE_PROGRESS=0`` in the environment to turn it off even on a terminal.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO, Optional

from snapstore.formatting import human_bytes


def enabled_for(stream: Optional[IO]) -> bool:
    """True when progress should be drawn on `stream` (a terminal, not disabled by env)."""
    if stream is None or os.environ.get("SNAPSTORE_PROGRESS", "1") == "0":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Progress:
    """A one-line progress bar (or spinner when total is None). Thread-safe update()."""

    WIDTH = 24
    SPIN = "|/-\\"

    def __init__(self, total: Optional[float] = None, label: str = "", *, unit: str = "",
                 stream: Optional[IO] = None, enabled: Optional[bool] = None,
                 min_interval: float = 0.1) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled_for(self.stream) if enabled is None else bool(enabled)
        self.total = total
        self.label = label
        self.unit = unit
        self.done = 0.0
        self.min_interval = min_interval
        self._start = time.monotonic()
        self._last = 0.0
        self._drawn = 0
        self._tick = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if self.enabled and total is None:
            self._thread = threading.Thread(target=self._spin, name="snapstore-progress",
                                            daemon=True)
            self._thread.start()

    # ---- public ----------------------------------------------------------------------
    def update(self, n: float = 1) -> None:
        """Adds n units of work done; redraws at most every min_interval seconds."""
        if not self.enabled:
            self.done += n
            return
        with self._lock:
            self.done += n
            now = time.monotonic()
            if now - self._last >= self.min_interval:
                self._last = now
                self._draw(now)

    def set_label(self, label: str) -> None:
        with self._lock:
            self.label = label
            if self.enabled:
                self._draw(time.monotonic())

    def close(self) -> None:
        """Stops the spinner and erases the line (so the command's own output starts clean)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.enabled and self._drawn:
            with self._lock:
                self._write("\r" + " " * self._drawn + "\r")
                self._drawn = 0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- drawing -----------------------------------------------------------------------
    def render(self, now: Optional[float] = None) -> str:
        elapsed = (time.monotonic() if now is None else now) - self._start
        head = f"{self.label} " if self.label else ""
        if self.total is None:
            self._tick += 1
            return f"{head}{self.SPIN[self._tick % len(self.SPIN)]} {elapsed:.1f}s"
        frac = min(1.0, self.done / self.total) if self.total > 0 else 1.0
        filled = int(frac * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        if self.unit == "B":
            amount = f"{human_bytes(self.done)}/{human_bytes(self.total)}"
        else:
            amount = f"{self.done:g}/{self.total:g}" + (f" {self.unit}" if self.unit else "")
        return f"{head}[{bar}] {frac * 100:3.0f}% {amount} {elapsed:.1f}s"

    def _draw(self, now: float) -> None:
        text = self.render(now)
        pad = max(0, self._drawn - len(text))
        self._write("\r" + text + " " * pad)
        self._drawn = len(text)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False

    def _spin(self) -> None:
        while not self._stop.wait(self.min_interval):
            with self._lock:
                self._draw(time.monotonic())


def spinner(label: str, *, stream: Optional[IO] = None, enabled: Optional[bool] = None
            ) -> Progress:
    """A spinner for one long call: ``with spinner("compacting"): store.compact()``."""
    return Progress(None, label, stream=stream, enabled=enabled)
