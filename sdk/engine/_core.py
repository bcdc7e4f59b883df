"""The engine's core: which record may start next, what may be committed, what must pause.

A plain state machine in the sans-I/O style: no Kafka, no threads, no clock (time is passed
in). The shell (``sdk.consumer._parallel``) feeds it fetched records and results and carries out
what it decides. Queries (``take`` aside, which hands out work) change nothing; every state change
is a named method. The rules it keeps:

* **Shards** (``sdk.engine._shards``): an ordered shard has at most one owner and gives out its
  records strictly in offset order; ready shards are served round-robin, so a hot or slow
  shard never starves the others. In KEY ordering, a record whose key has nothing queued or
  running waits in its partition's lane (at most one record per key, run side by side).
* **Done** means processed, dead-lettered with an acknowledged copy, or skipped by a policy
  the user chose (``on_exhausted="skip"``). A terminal failure with nowhere to send it (no
  dead-letter topic) is never done: it holds its shard as STUCK and is reported.
* **Commits** (``sdk.engine._partition``) never pass a record that is not done.
* **Memory.** The records in memory (the incomplete ones: a completed record beyond its
  partition's head keeps only its offset) count against the buffer. Fetching takes records
  while the buffer in use is below the buffer minus a small reserve; beyond that only single
  records (from the polls that serve librdkafka's callbacks) enter, and at the full buffer
  every partition pauses until the engine is back below the reserve. A partition whose
  records in memory reach its share while it is stalled (nothing it holds can start, or none
  of its records completed for a while) is paused, and counts as its share only, so it does
  not starve the others; the records in memory stay within the buffer plus one share. While
  the engine's records in memory fill a whole buffer, every stalled partition is paused, so
  the room beyond goes to partitions that flow. While the buffer is used up, a paused stalled
  partition beyond its share gives back its newest records that have not started (the shell
  seeks back to them). A flowing one is not paused, because every pause throws away
  librdkafka's prefetched records and costs a refetch; a partition whose head fails again
  and again while its other records complete flows, until its window of offsets (the
  completed ones behind that head) reaches ``WINDOW_SHARES`` shares. Every partition also
  pauses while too many records are parked for retry, and while stopping. Why a partition
  is paused has one answer: :meth:`PartitionState.pause_reason`.
* **Revocation** stops a partition's scheduling at once; dropping it removes every trace;
  results that arrive later for its records are ignored.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from sdk.engine._buffer import Buffer
from sdk.engine._failures import FailurePolicy
from sdk.engine._intake import Intake
from sdk.engine._offsets import MAX_METADATA_BYTES, Ranges
from sdk.engine._options import Ordering
from sdk.engine._partition import TP, Counts
from sdk.engine._results import NOTHING, Outcome, Results
from sdk.engine._scheduler import Scheduler
from sdk.engine._shards import (
    LANE,
    NOT_STARTED,
    READY,
    Entry,
    Item,
    ItemShape,
    Shard,
    ShardedPartition,
)

__all__ = [
    "NOTHING",
    "NOT_STARTED",
    "TP",
    "Commit",
    "Entry",
    "Item",
    "ItemShape",
    "Outcome",
    "WorkCore",
]


class Commit(NamedTuple):
    tp: TP
    offset: int
    metadata: str


class WorkCore:
    """The core's state and the shell's one entry to it. Its parts, each one job: records in
    (:class:`~sdk.engine._intake.Intake`), results in (:class:`~sdk.engine._results.Results`),
    memory and fetching (:class:`~sdk.engine._buffer.Buffer`); the scheduler hands out work
    (:class:`~sdk.engine._scheduler.Scheduler`). Assignment, release limits and commits are
    kept here."""

    def __init__(
        self,
        ordering: Ordering,
        *,
        null_keys: str = "ordered",
        failures: FailurePolicy | None = None,
        max_retrying: int = 10_000,
        process_delay: float = 0.0,
        buffer_limit: int = 1000,
        map_limit: int = MAX_METADATA_BYTES,
        follow_on: int = 0,
        sole_topic: str | None = None,
    ) -> None:
        """``follow_on``: in the ordered modes, a record whose shard is RUNNING and may start
        at once joins the running item (the worker runs it without a hand-off) while the
        item holds fewer records than this; 0: never (batches: a batch has started).
        ``sole_topic``: the one topic the consumer subscribed to, when it names one (every
        fetched record is of it, so a record's topic is not read)."""
        self.ordering = ordering
        self.sole_topic = sole_topic
        self.unordered = ordering is Ordering.UNORDERED
        self.key_ordered = ordering is Ordering.KEY
        self.max_retrying = max_retrying
        self.buffer_limit = buffer_limit
        self.map_limit = map_limit
        self.paused_all = False  # start nothing (the user's pause, or a stop)
        self.partitions: dict[TP, ShardedPartition] = {}
        self.counts: dict[TP, Counts] = {}
        self.scheduler = Scheduler(self.unordered, keep_free=buffer_limit)
        self.intake = Intake(
            self.partitions,
            self.scheduler,
            key_ordered=self.key_ordered,
            null_keys_unordered=null_keys == "unordered",
            process_delay=process_delay,
            follow_on=0 if self.unordered else follow_on,
            sole_topic=sole_topic,
        )
        self.results = Results(self.scheduler, failures or FailurePolicy(), self.unordered)
        # (The results' collections, shared: never replaced.)
        self.outstanding = self.results.outstanding
        self.retrying = self.results.retrying
        self.dead_letter_pending = self.results.dead_letter_pending
        self.stuck = self.results.stuck
        self.buffer = Buffer(
            self.partitions, self.scheduler, self.retrying, buffer_limit, max_retrying
        )
        self._items = itertools.count(1)

    @property
    def failures(self) -> FailurePolicy:
        return self.results.failures

    @failures.setter
    def failures(self, policy: FailurePolicy) -> None:
        self.results.failures = policy

    @property
    def full(self) -> bool:
        """Every partition paused until the buffer in use is below its reserve."""
        return self.buffer.full

    @property
    def fetch_stopped(self) -> bool:
        return self.buffer.fetch_stopped

    # ---- assignment ---------------------------------------------------------------------

    def assign(
        self, tp: TP, committed: int | None, restored: Ranges | tuple[()] = (), now: float = 0.0
    ) -> None:
        """Start tracking a partition whose consumption starts at ``committed``; ``restored``:
        ranges of offsets completed before (from an offset map written for ``committed``)."""
        self.drop([tp])
        counts = self.counts.setdefault(tp, Counts())
        part = self.partitions[tp] = ShardedPartition(tp, committed, list(restored), counts, now)
        if self.key_ordered:
            part.lane = part.shards[LANE] = Shard(LANE, part, lane=True)

    def revoke(self, tps: Iterable[TP]) -> None:
        """Start nothing more of these partitions (their in-flight records may finish)."""
        for tp in tps:
            part = self.partitions.get(tp)
            if part is not None and not part.revoked:
                part.revoked = True
                self.scheduler.retire(part)

    def drop(self, tps: Iterable[TP]) -> None:
        """Forget partitions entirely: state, shards, queues, timers, parked records."""
        gone = [self.partitions.pop(tp) for tp in tps if tp in self.partitions]
        if not gone:
            return
        for part in gone:
            part.revoked = part.dead = True
            self.scheduler.retire(part)
            self.scheduler.forget(part)
        self.results.forget_dead()

    # ---- records in ---------------------------------------------------------------------

    def add_messages(
        self, messages: list[Any], now: float, wall_offset: float | None = None
    ) -> list[Any]:
        """Register fetched confluent-kafka messages and queue them (see
        :meth:`Intake.add_messages <sdk.engine._intake.Intake.add_messages>`). Returns the
        messages that carry an error: they are not registered."""
        return self.intake.add_messages(messages, now, wall_offset, self.paused_all)

    # ---- scheduling ---------------------------------------------------------------------

    def take(self, now: float, slots: int, shape: ItemShape) -> list[Item]:
        """Up to ``slots`` work items of records that may start now (see
        :class:`~sdk.engine._shards.ItemShape`); nothing while paused."""
        if self.paused_all or slots <= 0:
            return []
        items = []
        for entries in self.scheduler.take(now, slots, shape, self.retrying):
            item = Item(next(self._items), entries)
            self.outstanding[item.id] = item
            items.append(item)
        return items

    def has_ready(self, now: float) -> bool:
        """Whether :meth:`take` may find work now (parked records that are due included)."""
        return not self.paused_all and self.scheduler.has_ready(now)

    def ready_shards(self) -> int:
        """How many shards have a record that may start now (due timers not counted); each
        record of a lane counts as a shard."""
        count = len(self.scheduler.ready)
        if self.key_ordered:
            for part in self.partitions.values():
                lane = part.lane
                if lane is not None and lane.state == READY:
                    count += len(lane.queue) - 1
        return count

    def next_due(self) -> float | None:
        """When the next parked record (retry or process delay) becomes due, if any."""
        return self.scheduler.timers.next_due()

    # ---- results ------------------------------------------------------------------------

    def collect_progress(self, now: float) -> None:
        """Apply the records running items have finished already (``Item.finished``), so
        commits need not wait for a long item's end."""
        self.results.collect_progress(now)

    def complete(self, item_id: int, results: Sequence[Any], now: float) -> Outcome:
        """Apply a worker's results, one per record of the item (``None`` success, an
        exception, or NOT_STARTED)."""
        return self.results.complete(item_id, results, now)

    def dead_lettered(self, entry: Entry, now: float) -> None:
        """The dead-letter topic acknowledged the record's copy: it is done."""
        self.results.dead_lettered(entry, now)

    # ---- release limits (gating) and pausing --------------------------------------------

    def set_limit(self, tp: TP, limit: int | None, now: float = 0.0) -> float | None:
        """Records of ``tp`` at or beyond ``limit`` may not start; None lifts the limit.
        Returns how long the partition's records had been held when raising the limit
        released them, else None."""
        part = self.partitions.get(tp)
        if part is None or part.limit == limit:
            return None
        raised = part.limit is not None and (limit is None or limit > part.limit)
        part.limit = limit
        if raised and part.blocked:
            since = part.blocked_since
            self.scheduler.unblock(part)
            return None if since is None else max(0.0, now - since)
        return None

    def pause_all(self) -> None:
        self.paused_all = True

    def resume_all(self) -> None:
        self.paused_all = False

    def stop_fetching(self) -> None:
        """Every partition is to be paused from now on (the engine is stopping)."""
        self.buffer.stop_fetching()

    # ---- memory and fetching (the buffer's) -----------------------------------------------

    def share(self) -> int:
        return self.buffer.share()

    def used(self, now: float) -> int:
        return self.buffer.used(now)

    def in_memory(self) -> int:
        return self.buffer.in_memory()

    def pressure(self) -> str | None:
        return self.buffer.pressure()

    def room(self, now: float) -> int:
        return self.buffer.room(now)

    def decide_pauses(self, now: float) -> tuple[list[TP], list[TP]]:
        return self.buffer.decide_pauses(now)

    def plan_give_back(self, now: float) -> list[tuple[TP, int]]:
        return self.buffer.plan_give_back(now)

    def give_back(self, tp: TP, offset: int) -> int:
        return self.buffer.give_back(tp, offset)

    def fetch_changed(self, paused: Iterable[TP], resumed: Iterable[TP], now: float) -> None:
        self.buffer.fetch_changed(paused, resumed, now)

    def fetch_unknown(self, tps: Iterable[TP]) -> None:
        self.buffer.fetch_unknown(tps)

    def paused_partitions(self) -> list[TP]:
        return self.buffer.paused_partitions()

    # ---- commits ------------------------------------------------------------------------

    def refresh_offset_maps(self) -> None:
        """Re-encode the offset maps that changed (and lift map caps that no longer apply)."""
        for part in self.partitions.values():
            if part.refresh_map(self.map_limit) and part.blocked:
                self.scheduler.unblock(part)

    def commit_points(
        self, tps: Iterable[TP] | None = None, with_maps: bool = True
    ) -> list[Commit]:
        """Offsets (and offset maps) that differ from what was last handed out."""
        result = []
        for tp in list(self.partitions) if tps is None else tps:
            part = self.partitions.get(tp)
            if part is None:
                continue
            offset = part.committable()
            if offset is None:
                continue
            metadata = part.offset_map(offset) if with_maps else ""
            if (offset, metadata) != part.sent:
                result.append(Commit(tp, offset, metadata))
        return result

    def commits_sent(self, commits: Iterable[Commit]) -> None:
        for commit in commits:
            part = self.partitions.get(commit.tp)
            if part is not None:
                part.sent = (commit.offset, commit.metadata)

    def idle_partitions(self) -> list[TP]:
        """Partitions that hold nothing (whose commit the consumer's position may move)."""
        return [
            tp
            for tp, part in self.partitions.items()
            if not part.revoked and part.head == len(part.offsets)
        ]

    def positions(self, found: dict[TP, int]) -> None:
        """The consumer's positions of partitions, taken between fetches while every record
        it returned was registered (see :meth:`PartitionState.reached`)."""
        for tp, position in found.items():
            part = self.partitions.get(tp)
            if part is not None and not part.revoked:
                part.reached(position)

    def commits_acknowledged(self, done: dict[TP, int]) -> None:
        """The broker acknowledged these commits."""
        for tp, offset in done.items():
            part = self.partitions.get(tp)
            if part is not None:
                part.committed = offset

    def commit_failed(self, tps: Iterable[TP]) -> None:
        """Hand these partitions' offsets out again at the next :meth:`commit_points`."""
        for tp in tps:
            part = self.partitions.get(tp)
            if part is not None:
                part.sent = (None, "")

    # ---- introspection ------------------------------------------------------------------

    def held(self) -> int:
        return sum(part.held for part in self.partitions.values())

    def in_flight(self) -> int:
        return sum(len(item.entries) - item.reported for item in self.outstanding.values())

    def in_flight_partitions(self) -> set[TP]:
        return {
            entry.part.tp
            for item in self.outstanding.values()
            for entry in item.entries[item.reported :]
            if not entry.part.dead
        }

    def parked(self) -> list[Shard]:
        """Shards waiting for a timer (for tests and diagnostics)."""
        return self.scheduler.timers.shards()

    def partition_view(self, tp: TP, now: float) -> dict[str, Any] | None:
        part = self.partitions.get(tp)
        if part is None:
            return None
        in_flight = sum(
            1
            for item in self.outstanding.values()
            for e in item.entries[item.reported :]
            if e.part is part
        )
        retrying = sum(1 for e in self.retrying if e.part is part)
        stuck = [(e.offset, e.last_error or "") for e in self.stuck if e.part is part]
        crowded = self.buffer.in_memory() >= self.buffer_limit
        paused_for = part.pause_reason(self.share(), self.pressure(), crowded, now)
        return part.view(now, in_flight, retrying, stuck, paused_for)
