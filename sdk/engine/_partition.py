"""The state of one assigned partition: what is held, what may be committed, and its map.

* **Held** records are every offset registered from the lowest incomplete one on: buffered,
  in flight, parked for retry, stuck, *and* completed beyond the lowest incomplete one (they
  are remembered until the commit passes them). The **incomplete** ones keep their message:
  they are what the memory bound limits. Of a completed one only the offset is kept (the
  *window*), bounded on its own by ``WINDOW_SHARES`` shares.
* **Completion** is kept as a window: the registered offsets in order, a flag per offset
  saying whether it is done, and the index of the lowest incomplete one (the head). Each
  registered record has a sequence number, its place in that order, so marking it done is
  one flag and the head moves over the flags already set; the done prefix is cut off in
  bulk. Offsets need not be contiguous (compaction and transaction markers leave gaps).
* The **committable** offset is the lowest incomplete offset, or one past the highest
  registered offset when none is incomplete. When it holds nothing, the consumer's position
  may move it further (:meth:`PartitionState.reached`): offsets no record was returned for
  (transaction markers, aborted records under ``read_committed``) are never registered, and a
  topic written in transactions ends with a marker.
* **Committed** is what the broker has for the group: the offset found at assignment (whoever
  committed it), then each commit of this member the broker acknowledged.
* The **offset map** lists the completed offsets beyond it; it is re-encoded only when they
  changed, and while it is near its size limit records beyond its end may not start.
* **Restored** ranges come from the map found at assignment: offsets completed before a
  restart, skipped (as completed) when they are fetched again. They are ranges, consumed as
  the fetch moves past them, so a map describing millions of offsets costs only its runs.
* **Fetch** is what librdkafka was last told about fetching this partition: UNKNOWN right
  after assignment (librdkafka keeps an application's pause across a re-assignment, so the
  first decision is always sent), then FETCHING or PAUSED.
* **Stalled**: nothing it holds can start (its lowest incomplete record is at or beyond its
  release limit) or none of its records has completed for ``STALL_AFTER`` seconds. A
  partition whose head fails again and again while its other records (other keys, or any in
  UNORDERED) complete is not stalled: it flows. Only a stalled partition is paused for using
  its share: pausing costs a refetch of everything librdkafka had prefetched (about one
  ``fetch.wait.max.ms``), which a flowing partition must not pay.
* **Why it pauses** has one answer, :meth:`PartitionState.pause_reason`: pressure on the
  whole engine, a full window, or stalled at its share of the records in memory.
* **Given back**: a paused stalled partition beyond its share may forget its newest records
  that have not started (the shell seeks back to the first of them), so records that wait
  behind a poison record do not take the room of partitions that flow.

It knows offsets, not shards: the partition the core runs is its subclass with the shards
that queue its records, :class:`~sdk.engine._shards.ShardedPartition` (which finds the
records that have not started).

Pure: no I/O, time is passed in.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sdk.engine._offsets import Ranges, encode_offset_map

TP = tuple[str, int]

UNKNOWN: Final = 0
FETCHING: Final = 1
PAUSED: Final = 2

STALL_AFTER: Final = 1.0
"""Seconds without progress at its head after which a partition counts as stalled."""

WINDOW_SHARES: Final = 16
"""A partition pauses while its window (the offsets completed beyond its lowest incomplete
one) reaches this many shares of the buffer: completed offsets cost about 50 bytes each, so a
record that never completes cannot make memory grow without bound. Its incomplete records
are not counted: the buffer bounds them already, and a partition whose records fill most of
the buffer (a fetch returns one partition's records in bulk) must not pause for them: every
pause throws away what librdkafka had prefetched."""

CUT_AT: Final = 1024
"""The done prefix of the completion window is cut off once it is this long (and at least as
long as what is held): each offset is copied at most once on average."""


@dataclass
class Counts:
    """Lifetime statistics per partition (for metrics; never used to take decisions)."""

    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    restored_skips: int = 0
    stuck: int = 0
    given_back: int = 0
    """Records forgotten unstarted by a stalled partition beyond its share (fetched again)."""
    pauses: int = 0
    """Times librdkafka was told to pause the partition."""
    paused_with_work_s: float = 0.0
    """Seconds it was paused while not stalled (a pause that slowed its records)."""


class PartitionState:
    """One assignment of one partition (a new object for every assignment): its offsets,
    commit points and limits."""

    __slots__ = (
        "base",
        "blocked_since",
        "committed",
        "counts",
        "cut_at",
        "dead",
        "done_changes",
        "done_count",
        "fetch",
        "finished",
        "given_back_at",
        "head",
        "head_since",
        "highest",
        "limit",
        "map_base",
        "map_cap",
        "map_changes",
        "map_text",
        "offsets",
        "pause_checked",
        "progress_at",
        "restored",
        "revoked",
        "sent",
        "start",
        "tp",
    )

    def __init__(
        self, tp: TP, start: int | None, restored: Ranges, counts: Counts, now: float
    ) -> None:
        self.tp = tp
        self.counts = counts
        self.start = start
        self.revoked = False  # no new work: in-flight records may still finish
        self.dead = False  # dropped: anything still referring to it is stale
        # The completion window: registered offsets in order, whether each is done, and the
        # index of the lowest incomplete one; ``base`` is the sequence number of offsets[0].
        self.offsets: list[int] = []
        self.finished: list[bool] = []
        self.head = 0
        self.base = 0
        self.done_count = 0  # done offsets beyond the head
        self.cut_at = CUT_AT
        self.done_changes = 0  # bumped whenever the done offsets beyond the head change
        self.highest = -1
        self.restored = deque(r for r in restored if start is None or r[1] > start)
        self.limit: int | None = None  # release limit (watermark); None: everything
        self.blocked_since: float | None = None
        self.head_since = now  # when the lowest incomplete offset became the lowest
        self.progress_at = now  # when one of its records last completed (or it got its first)
        self.map_cap: int | None = None  # records beyond it wait while the map is near full
        self.map_base: int | None = None  # the committable offset ``map_text`` was built for
        self.map_text = ""
        self.map_changes = -1  # ``done_changes`` when ``map_text`` was built
        self.sent: tuple[int | None, str] = (start, "")  # last commit handed out
        self.committed = start  # what the broker has for the group (see the module's docs)
        self.fetch = UNKNOWN
        self.pause_checked: float | None = None  # while paused: when last accounted for
        self.given_back_at = -STALL_AFTER  # when its newest records were last looked at

    # ---- held and completed -------------------------------------------------------------

    @property
    def held(self) -> int:
        """Records this partition holds in memory (completed beyond the head included)."""
        return len(self.offsets) - self.head

    @property
    def incomplete(self) -> int:
        return len(self.offsets) - self.head - self.done_count

    def lowest_incomplete(self) -> int | None:
        head = self.head
        return self.offsets[head] if head < len(self.offsets) else None

    def held_offsets(self) -> list[int]:
        """The offsets held, in order (for diagnostics and tests: O(held))."""
        return self.offsets[self.head :]

    def completed_beyond_head(self) -> list[int]:
        """The done offsets beyond the lowest incomplete one, in order (O(held))."""
        if not self.done_count:
            return []
        head = self.head
        offsets, finished = self.offsets, self.finished
        return [offsets[i] for i in range(head, len(offsets)) if finished[i]]

    def restored_beyond_fetched(self) -> list[int]:
        """Offsets the offset map restored at assignment says were completed, beyond those
        fetched so far: every map committed keeps them (or they would run again)."""
        first = self.highest + 1
        found: list[int] = []
        for low, high in self.restored:
            if high > first:
                found.extend(range(max(low, first), high))
        return found

    def register(self, offsets: list[int], now: float) -> int:
        """Hold these fetched offsets (increasing, beyond :attr:`highest`); returns the
        sequence number of the first (the others follow it)."""
        first = self.base + len(self.offsets)
        if self.head == len(self.offsets):
            self.head_since = self.progress_at = now
        self.offsets.extend(offsets)
        self.finished.extend([False] * len(offsets))
        self.highest = offsets[-1]
        return first

    def take_restored(self, offset: int) -> bool:
        """Whether the offset map restored at assignment says ``offset`` was completed; a
        state change: the ranges the fetch has moved past are let go (offsets are fetched in
        order)."""
        restored = self.restored
        while restored and restored[0][1] <= offset:
            restored.popleft()
        return bool(restored) and restored[0][0] <= offset

    def finish(self, seq: int) -> None:
        """The record of sequence number ``seq`` is done: processed, dead-lettered
        (acknowledged) or skipped by a policy the user chose. The head moves at
        :meth:`advance` (one call after a run of these)."""
        i = seq - self.base
        if i >= self.head and not self.finished[i]:
            self.finished[i] = True
            self.done_count += 1

    def advance(self, now: float) -> None:
        """Move the head over the records done (after :meth:`finish`); cut off the done
        prefix once it is at least as long as what is held."""
        self.progress_at = now
        finished = self.finished
        head = start = self.head
        end = len(finished)
        while head < end and finished[head]:
            head += 1
        if head != start:
            self.head = head
            self.done_count -= head - start
            self.head_since = now
            if head >= self.cut_at and 2 * head >= end:
                del self.offsets[:head]
                del finished[:head]
                self.base += head
                self.head = 0
        if head != start or self.done_count:
            self.done_changes += 1

    def complete(self, seq: int, now: float) -> None:
        """One record is done (:meth:`finish`, then :meth:`advance`)."""
        self.finish(seq)
        self.advance(now)

    def forget_from(self, offset: int) -> None:
        """Stop holding the offsets from ``offset`` on (none of them started, so none is
        done: they are fetched again)."""
        cut = bisect_left(self.offsets, offset, self.head)
        del self.offsets[cut:]
        del self.finished[cut:]
        self.highest = offset - 1

    # ---- commits and the offset map -----------------------------------------------------

    def committable(self) -> int | None:
        head = self.head
        if head < len(self.offsets):
            return self.offsets[head]
        offset = self.highest + 1 if self.highest >= 0 else self.start
        if offset is not None:
            # A committed offset is one still to process (its map lists only the completed
            # offsets above it): the commit passes the offsets the restored map says were
            # completed from there on, fetched or not.
            for low, high in self.restored:
                if low > offset:
                    break
                if high > offset:
                    offset = high
        return offset

    def reached(self, position: int) -> None:
        """The consumer's position is ``position`` (the next offset it returns) and every
        record it returned was registered: when nothing is held, the offsets below it were
        records processed or offsets no record was returned for (transaction markers,
        aborted records), so the commit may move to it."""
        if (
            self.head == len(self.offsets)
            and position > self.highest + 1
            and (self.start is None or position > self.start)
        ):
            self.highest = position - 1

    def refresh_map(self, limit: int) -> bool:
        """Re-encode the offset map if the completed offsets changed; update the cap.
        Returns whether the cap was lifted (blocked shards may go again)."""
        base = self.committable()
        if base == self.map_base and self.done_changes == self.map_changes:
            return False
        self.map_base, self.map_changes = base, self.done_changes
        cap = None
        if (not self.done_count and not self.restored) or base is None:
            self.map_text = ""
        else:
            done = self.completed_beyond_head() + self.restored_beyond_fetched()
            encoded = encode_offset_map(base, done, limit)
            self.map_text = encoded or ""
            if encoded is None or len(encoded) > 0.75 * limit:
                cap = done[-1]
        lifted = self.map_cap is not None and cap is None
        self.map_cap = cap
        return lifted

    def offset_map(self, offset: int) -> str:
        """The map to commit with ``offset``: only one built for exactly that offset."""
        return self.map_text if self.map_base == offset else ""

    def stalled(self, now: float) -> bool:
        """Nothing it holds can start, or none of its records has completed for
        ``STALL_AFTER`` seconds while it holds incomplete ones."""
        head = self.head
        if head == len(self.offsets):
            return False
        limit = self.release_limit()
        if limit is not None and self.offsets[head] >= limit:
            return True
        return now - self.progress_at >= STALL_AFTER

    def pause_reason(
        self, share: int, pressure: str | None, crowded: bool, now: float
    ) -> str | None:
        """Why librdkafka must not fetch this partition now, or None: ``pressure`` on the
        whole engine (a full buffer, too many retries, stopping); its window full (see
        ``WINDOW_SHARES``: its head does not complete while the rest does); stalled at its
        share of the records in memory, or at any size while the engine's records in memory
        fill a whole buffer (``crowded``: the room left is for partitions that flow). A
        paused one resumes at half its share, or below its share once it moves again. A
        flowing partition is never paused for its share: the engine stops taking records
        when the buffer is full instead."""
        if pressure is not None:
            return pressure
        if self.done_count >= WINDOW_SHARES * share:
            return "window full"
        incomplete = self.incomplete
        stalled = self.stalled(now)
        if stalled and (incomplete >= share or crowded):
            return "stalled at its share" if incomplete >= share else "stalled, buffer full"
        if self.fetch == PAUSED and incomplete > share // 2 and (incomplete >= share or stalled):
            return "stalled at its share"
        return None

    def account_pause(self, now: float) -> None:
        """While paused: add the time since the last check to ``paused_with_work_s`` unless
        the partition is stalled (then the pause costs nothing)."""
        checked, self.pause_checked = self.pause_checked, now
        if checked is not None and not self.stalled(now):
            self.counts.paused_with_work_s += now - checked

    # ---- release limit ------------------------------------------------------------------

    def release_limit(self) -> int | None:
        """Records at or beyond this offset may not start (the watermark, or the map cap)."""
        limit, cap = self.limit, self.map_cap
        if cap is not None and (limit is None or limit > cap + 1):
            return cap + 1
        return limit

    # ---- introspection ------------------------------------------------------------------

    def view(
        self,
        now: float,
        in_flight: int,
        retrying: int,
        stuck: Sequence[tuple[int, str]],
        paused_for: str | None,
    ) -> dict[str, Any]:
        """What it holds and why, for diagnostics: ``stuck`` lists the (offset, error) of
        each of its records held as STUCK."""
        blocking = self.lowest_incomplete()
        return {
            "held": self.held,
            "incomplete": self.incomplete,
            "in_flight": in_flight,
            "retrying": retrying,
            "stuck": list(stuck),
            "buffered": max(0, self.incomplete - in_flight - retrying - len(stuck)),
            "incomplete_beyond_head": self.done_count,
            "committable": self.committable(),
            "committed": self.committed,
            "blocking_offset": blocking,
            "blocked_for": (now - self.head_since) if blocking is not None else 0.0,
            "limit": self.limit,
            "gate_held": self.gate_held(),
            "held_for": 0.0 if self.blocked_since is None else now - self.blocked_since,
            "paused": self.fetch == PAUSED,
            "paused_for": paused_for if self.fetch == PAUSED else None,
            "map_full": self.map_cap is not None,
        }

    def gate_held(self) -> int:
        limit = self.limit
        if limit is None:
            return 0
        offsets, finished = self.offsets, self.finished
        first = bisect_left(offsets, limit, self.head)
        return sum(1 for i in range(first, len(offsets)) if not finished[i])
