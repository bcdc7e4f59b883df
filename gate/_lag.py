"""Lag in seconds, from the gate's own history of each partition's end offset.

A group's lag in seconds on a partition is the age of the oldest record it has not processed:
how long ago the record at its committed offset was appended. The gate does not read records
to learn that; it remembers, per partition, when it saw the end offset move (a bounded,
thinned history), and the record at offset ``o`` was appended between the last poll that saw
the end at or below ``o`` and the first that saw it above: the time is interpolated between
the two. Accurate to about a poll interval; when the record is older than the history, the
answer is a lower bound (``exact`` is false). Nothing here performs I/O.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

MAX_SAMPLES = 64
"""End-offset samples kept per partition; the older half is thinned when it is full, so the
history reaches back further at a coarser grain."""


class Lag(NamedTuple):
    seconds: float
    exact: bool
    """False when the record is older than the history: ``seconds`` is then a lower bound."""


class EndHistory:
    """When a partition's end offset reached which value (times in seconds since the epoch)."""

    __slots__ = ("ends", "times")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.ends: list[int] = []

    def observe(self, now: float, end: int) -> None:
        """The end offset seen by the poll started at ``now``."""
        if self.ends and end <= self.ends[-1]:
            return  # unchanged (a log moving backwards is reset by the evaluator)
        if len(self.ends) >= MAX_SAMPLES:
            half = MAX_SAMPLES // 2
            self.times[:half] = self.times[:half:2]
            self.ends[:half] = self.ends[:half:2]
        self.times.append(now)
        self.ends.append(end)

    def appended_at(self, offset: int) -> tuple[float, bool] | None:
        """When the record at ``offset`` was appended: (time, exact), or None when the end
        has not passed it yet."""
        ends = self.ends
        i = bisect.bisect_right(ends, offset)  # first sample whose end passed the offset
        if i == len(ends):
            return None
        if i == 0:
            return self.times[0], False
        before, after = ends[i - 1], ends[i]
        t0, t1 = self.times[i - 1], self.times[i]
        fraction = (offset + 1 - before) / (after - before)
        return t0 + fraction * (t1 - t0), True

    def lag(self, committed: int, now: float) -> Lag:
        """The lag in seconds of a group that committed ``committed``."""
        found = self.appended_at(committed)
        if found is None:
            return Lag(0.0, True)
        at, exact = found
        return Lag(max(0.0, now - at), exact)
