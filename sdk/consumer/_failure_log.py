"""How failed handler attempts are told: the first failure of each record as a warning, the
attempts after it at debug level, and a summary of what failed (how many records, how many
attempts, the first error) every ``SUMMARY_EVERY`` seconds while records keep failing and when
the consumer stops. A record retried forever is then a line a minute, not a line an attempt.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

SUMMARY_EVERY = 60.0
"""Seconds between two summaries of failed attempts."""


@dataclass
class FailureWindow:
    """Failed attempts since ``since`` (the wall clock); pure counting."""

    since: float
    records: set[tuple[str, int, int]] = field(default_factory=set)
    attempts: int = 0
    first: str = ""

    def add(self, where: tuple[str, int, int], error: str) -> None:
        if not self.attempts:
            self.first = f"{where[0]}[{where[1]}]@{where[2]} {error}"
        self.attempts += 1
        self.records.add(where)

    def summary(self) -> str:
        records = len(self.records)
        return (
            f"{records} record{'' if records == 1 else 's'} failed {self.attempts} "
            f"attempt{'' if self.attempts == 1 else 's'} since "
            f"{time.strftime('%H:%M:%S', time.localtime(self.since))}; first: {self.first}"
        )


class FailureLog:
    """Told from the handlers' threads; a lock keeps the window whole."""

    def __init__(self, log: logging.Logger, every: float = SUMMARY_EVERY) -> None:
        self.log = log
        self.every = every
        self._lock = threading.Lock()
        self._window: FailureWindow | None = None
        self._opened = 0.0  # monotonic time the window opened

    def failed(self, where: tuple[str, int, int], attempt: int, error: str) -> None:
        if attempt <= 1:
            self.log.warning("%s[%d]@%d failed: %s", *where, error)
        else:
            self.log.debug("%s[%d]@%d failed attempt %d: %s", *where, attempt, error)
        with self._lock:
            if self._window is None:
                self._window, self._opened = FailureWindow(time.time()), time.monotonic()
            self._window.add(where, error)
            due = time.monotonic() - self._opened >= self.every
        if due:
            self.flush()

    def flush(self) -> None:
        """The summary of the attempts not summarised yet, if any (at stop, and when due)."""
        with self._lock:
            window, self._window = self._window, None
        if window is not None and window.attempts:
            self.log.warning("%s", window.summary())
