"""Lag in seconds, from the gate's own history of each partition's end offset.

A group's lag in seconds on a partition is the age of the oldest record it has not processed:
how long ago the record at its committed offset was appended. The gate does not read records
to learn that; it remembers, per partition, when it saw the end offset move, and the record
at offset ``o`` was appended between the last poll that saw the end at or below ``o`` and the
first that saw it above: the time is interpolated between the two (accurate to a poll
interval while the history holds both polls).

The history is bounded and thinned by age: recent samples are kept densely, older ones ever
more sparsely, so the gap around a record is at most about a tenth of its age (a record a
minute old is placed within about 6 s, one an hour old within about 6 minutes). An answer is
``exact`` when it comes from two successive polls, or the thinned gap around the record is at
most a fifth of its age or 2 s, whichever is more; when the record is older than the whole
history, the answer is a lower bound.

A record older than the history can be placed by its own timestamp (:meth:`EndHistory.seed`,
read from the broker by the poller): its age is then exact, and a record between two such
points is interpolated between them (exact by the same rule, a lower bound otherwise).
Nothing here performs I/O.
"""

from __future__ import annotations

import bisect
import itertools
from typing import NamedTuple

MAX_SAMPLES = 128
"""End-offset samples kept per partition at most."""
SPREAD = 0.1
"""Thinning keeps the gap between kept samples within this fraction of their age."""
EXACT_GAP = 2.0
"""Seconds of gap around a record that always count as exact."""
MAX_SEEDS = 64
"""Record timestamps kept per partition at most (the oldest records' go first)."""


class Lag(NamedTuple):
    seconds: float
    exact: bool
    """False when the estimate is coarse: the record is older than the history (``seconds``
    is then a lower bound), or the samples around it are far apart for its age."""


class EndHistory:
    """When a partition's end offset reached which value (times in seconds, on the clock the
    polls are timed by: durations between them are what counts).

    ``ends`` never decreases. Besides each new end, the history keeps the last poll that still
    saw the previous end when the end had been still for a while, so records appended after a
    quiet spell are placed after it, not spread over it.

    ``seed_offsets`` and ``seed_times``: records older than the history (below the first end
    seen) and when each was appended, from their own timestamps (sorted by offset)."""

    __slots__ = ("_seen_at", "ends", "seed_offsets", "seed_times", "thinned", "times")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.ends: list[int] = []
        self.thinned: list[bool] = []  # samples were dropped just before this one
        self._seen_at = 0.0  # the last poll that saw ``ends[-1]``
        self.seed_offsets: list[int] = []
        self.seed_times: list[float] = []

    def observe(self, now: float, end: int) -> None:
        """The end offset seen by the poll started at ``now``."""
        ends = self.ends
        if ends and end <= ends[-1]:
            self._seen_at = max(self._seen_at, now)  # unchanged (a log moving backwards is
            return  # reset by the evaluator)
        if ends and self._seen_at > self.times[-1]:
            self._append(self._seen_at, ends[-1], now)
        self._append(now, end, now)
        self._seen_at = now

    def _append(self, at: float, end: int, now: float) -> None:
        if len(self.ends) >= MAX_SAMPLES:
            self._thin(now)
        self.times.append(at)
        self.ends.append(end)
        self.thinned.append(False)

    def _thin(self, now: float) -> None:
        """Drop samples, newest to oldest, wherever the gap left behind stays within
        ``spread`` of its age; widen ``spread`` until a quarter of the room is free. The
        newest and the oldest samples always stay."""
        times = self.times
        spread = SPREAD
        while True:
            keep = [len(times) - 1]
            for i in range(len(times) - 2, 0, -1):
                newer = times[keep[-1]]
                if newer - times[i - 1] > spread * (now - newer):
                    keep.append(i)  # dropping it would leave too wide a gap for its age
            keep.append(0)
            if len(keep) <= MAX_SAMPLES * 3 // 4:
                break
            spread *= 2
        keep.reverse()
        thinned = [False] + [
            self.thinned[i] or i - before > 1 for before, i in itertools.pairwise(keep)
        ]
        self.times = [times[i] for i in keep]
        self.ends = [self.ends[i] for i in keep]
        self.thinned = thinned

    def seed(self, offset: int, at: float) -> bool:
        """The record at ``offset`` was appended at ``at`` (its own timestamp, on the clock of
        the polls). Taken only for a record older than the history (below the first end seen:
        the history places the others), and only when ``at`` is not later than the first poll,
        which saw the record already; up to ``EXACT_GAP`` later is taken as that poll's time
        (the poll read the end a moment after it started, and clocks differ a little), later
        than that is a clock that is off and ignored. A record seeded before keeps its time.
        Returns whether it was taken."""
        ends = self.ends
        if not ends or not 0 <= offset < ends[0]:
            return False
        first = self.times[0]
        if at > first + EXACT_GAP:
            return False
        offsets = self.seed_offsets
        i = bisect.bisect_left(offsets, offset)
        if i < len(offsets) and offsets[i] == offset:
            return False
        offsets.insert(i, offset)
        self.seed_times.insert(i, min(at, first))
        if len(offsets) > MAX_SEEDS:
            del offsets[0], self.seed_times[0]
        return True

    def appended_at(self, offset: int) -> tuple[float, bool] | None:
        """When the record at ``offset`` was appended: (time, whether the samples around it
        were thinned; also true when it is older than the history), or None when the end has
        not passed it yet."""
        ends = self.ends
        i = bisect.bisect_right(ends, offset)  # first sample whose end passed the offset
        if i == len(ends):
            return None
        if i == 0:
            return self.times[0], True
        before, after = ends[i - 1], ends[i]
        t0, t1 = self.times[i - 1], self.times[i]
        fraction = (offset + 1 - before) / (after - before)
        return t0 + fraction * (t1 - t0), self.thinned[i]

    def lag(self, committed: int, now: float) -> Lag:
        """The lag in seconds of a group that committed ``committed``."""
        if self.ends and committed < self.ends[0]:
            return self._before_history(committed, now)
        found = self.appended_at(committed)
        if found is None:
            return Lag(0.0, True)
        at, coarse = found
        seconds = max(0.0, now - at)
        if not coarse:
            return Lag(seconds, True)  # between two successive polls
        i = bisect.bisect_right(self.ends, committed)
        gap = float("inf") if i == 0 else self.times[i] - self.times[i - 1]
        return Lag(seconds, gap <= max(EXACT_GAP, 0.2 * seconds))

    def _before_history(self, offset: int, now: float) -> Lag:
        """The lag at an offset below the first end seen: exact at a seeded record; between
        two seeded records, interpolated (exact when they are close for its age, as between
        two polls); otherwise the age of the next record placed above it (a seeded one, or
        the first poll): a lower bound, as the record was appended before that one."""
        offsets, times = self.seed_offsets, self.seed_times
        i = bisect.bisect_left(offsets, offset)
        if i < len(offsets) and offsets[i] == offset:
            return Lag(max(0.0, now - times[i]), True)
        if i < len(offsets):
            high, high_at = offsets[i], times[i]
        else:
            high, high_at = self.ends[0] - 1, self.times[0]  # the first poll saw it appended
        at_least = Lag(max(0.0, now - high_at), False)
        if i == 0 or times[i - 1] > high_at:
            return at_least  # nothing placed below it, or timestamps out of order
        low, low_at = offsets[i - 1], times[i - 1]
        at = low_at + (offset - low) / (high - low) * (high_at - low_at)
        seconds = max(0.0, now - at)
        if high_at - low_at <= max(EXACT_GAP, 0.2 * seconds):
            return Lag(seconds, True)
        return at_least
