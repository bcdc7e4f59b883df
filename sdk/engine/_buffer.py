"""Memory and fetching: the part of the buffer in use, which partitions pause, and what a
stalled partition gives back.

Part of the engine's core (:class:`~sdk.engine._core.WorkCore` owns one); the rules are the
core's *Memory* paragraph. Each partition's own reason to pause is
:meth:`~sdk.engine._partition.PartitionState.pause_reason`; what is decided here is the
engine-wide part: the buffer full, too many records parked for retry, stopping.
"""

from __future__ import annotations

from collections.abc import Iterable

from sdk.engine._partition import FETCHING, PAUSED, STALL_AFTER, TP, UNKNOWN
from sdk.engine._scheduler import Scheduler
from sdk.engine._shards import Entry, Shard, ShardedPartition


class Buffer:
    """The records in memory against the buffer, and librdkafka's fetching per partition."""

    def __init__(
        self,
        partitions: dict[TP, ShardedPartition],
        scheduler: Scheduler,
        retrying: set[Entry],
        buffer_limit: int,
        max_retrying: int,
    ) -> None:
        """``partitions``, ``scheduler`` and ``retrying``: the core's own (shared, never
        replaced)."""
        self.partitions = partitions
        self.scheduler = scheduler
        self.retrying = retrying
        self.buffer_limit = buffer_limit
        self.max_retrying = max_retrying
        self.reserve = buffer_limit // 16  # room for records that arrive with callbacks
        self.full = False  # every partition paused until the buffer in use is below the reserve
        self.fetch_stopped = False  # pause every partition (stopping)

    def stop_fetching(self) -> None:
        """Every partition is to be paused from now on (the engine is stopping)."""
        self.fetch_stopped = True

    def share(self) -> int:
        return max(1, self.buffer_limit // max(1, len(self.partitions)))

    def used(self, now: float) -> int:
        """The part of the buffer in use: the records in memory, a stalled partition's
        counted at no more than its share (it is paused there, and what it holds beyond its
        share must not starve the others), but never less than the records in memory minus
        one share (so they stay within the buffer plus a share)."""
        share = self.share()
        used = in_memory = 0
        for part in self.partitions.values():
            incomplete = part.incomplete
            in_memory += incomplete
            used += share if incomplete > share and part.stalled(now) else incomplete
        return max(used, in_memory - share)

    def in_memory(self) -> int:
        """The records in memory (the incomplete ones, which keep their message)."""
        return sum(part.incomplete for part in self.partitions.values())

    def pressure(self) -> str | None:
        """Why every partition must pause now, or None (see :meth:`decide_pauses`)."""
        if self.fetch_stopped:
            return "stopping"
        if self.full:
            return "buffer full"
        if len(self.retrying) >= self.max_retrying:
            return "too many retries"
        return None

    def room(self, now: float) -> int:
        """How many records a fetch may take now (the reserve is kept for callbacks)."""
        return self.buffer_limit - self.reserve - self.used(now)

    def decide_pauses(self, now: float) -> tuple[list[TP], list[TP]]:
        """Partitions whose fetching librdkafka must be told to pause, and to resume, now
        (see *Memory* above; :meth:`PartitionState.pause_reason` decides for each). A
        partition whose state at librdkafka is unknown (just assigned) is always told one or
        the other. A state change: whether the buffer is full is decided here, and the time
        paused partitions spent paused is accounted for."""
        used = self.used(now)
        if used >= self.buffer_limit:
            self.full = True
        elif used < self.buffer_limit - self.reserve:
            self.full = False
        pressure = self.pressure()
        crowded = self.in_memory() >= self.buffer_limit
        share = self.share()
        pause: list[TP] = []
        resume: list[TP] = []
        for tp, part in self.partitions.items():
            if part.revoked:
                continue
            if part.fetch == PAUSED:
                part.account_pause(now)
            paused = part.pause_reason(share, pressure, crowded, now) is not None
            if paused != (part.fetch == PAUSED) or part.fetch == UNKNOWN:
                (pause if paused else resume).append(tp)
        return pause, resume

    def plan_give_back(self, now: float) -> list[tuple[TP, int]]:
        """While the buffer is used up to its reserve: the paused, stalled partitions that
        hold more than their share, and from which offset each gives back its newest records
        that have not started (the shell seeks there first, then :meth:`give_back`). Each
        partition is looked at no more than once per ``STALL_AFTER`` (a state change: when
        it was looked at is remembered)."""
        if self.in_memory() < self.buffer_limit - self.reserve:
            return []
        share = self.share()
        plan = []
        for tp, part in self.partitions.items():
            if (
                part.fetch != PAUSED
                or part.revoked
                or part.incomplete <= share
                or now - part.given_back_at < STALL_AFTER
                or not part.stalled(now)
            ):
                continue
            part.given_back_at = now
            offset = part.unstarted_tail(share)
            if offset is not None:
                plan.append((tp, offset))
        return plan

    def give_back(self, tp: TP, offset: int) -> int:
        """Forget ``tp``'s records from ``offset`` on, none of them started (the shell has
        sought back there: they are fetched again once the partition resumes). Returns how
        many."""
        part = self.partitions.get(tp)
        if part is None or part.revoked:
            return 0
        forgotten = self.scheduler.give_back(part, offset)  # (emptied shards are let go)
        if part.live_keys:
            part.live_keys = {
                key: live
                for key, live in part.live_keys.items()
                if isinstance(live, Shard) or live.offset < offset
            }
        part.forget_from(offset)
        part.counts.given_back += forgotten
        return forgotten

    def fetch_changed(self, paused: Iterable[TP], resumed: Iterable[TP], now: float) -> None:
        """librdkafka was told to pause ``paused`` and resume ``resumed``."""
        for tps, state in ((paused, PAUSED), (resumed, FETCHING)):
            for tp in tps:
                part = self.partitions.get(tp)
                if part is not None:
                    if state == PAUSED:
                        part.counts.pauses += 1
                        part.pause_checked = now
                    else:
                        part.account_pause(now)
                        part.pause_checked = None
                    part.fetch = state

    def fetch_unknown(self, tps: Iterable[TP]) -> None:
        """Telling librdkafka failed: decide these partitions again next time."""
        for tp in tps:
            part = self.partitions.get(tp)
            if part is not None:
                part.fetch = UNKNOWN

    def paused_partitions(self) -> list[TP]:
        return sorted(tp for tp, part in self.partitions.items() if part.fetch == PAUSED)
