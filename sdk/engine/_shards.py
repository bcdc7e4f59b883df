"""Shards, the records they queue, the partitions they belong to, and the work items handed
to workers.

A **shard** is the unit of ordering: a partition (PARTITION ordering), a (partition, key)
(KEY ordering), or a partition whose records may all run at once (UNORDERED). In KEY
ordering each partition also has a **lane**: the records whose key has no earlier record
queued or running. They may run side by side (the lane holds at most one record per key), so
the common case with many keys costs no shard per record. A record whose key's earlier record
is in the lane gets a shard of its own: if that record has not started, it moves there too
(it stays behind in the lane's queue as a stale entry, skipped when the lane is served);
if it runs, the new shard is RUNNING, owned by that record's item (the record's
``follower``), until the item is over. Each partition maps every key with a record queued or
running to that record in the lane, or to the key's shard (``ShardedPartition.live_keys``), so
a new record's key is looked up once, and a lane's record frees its key with one delete.
A shard queues its records in offset order and is always in exactly one of these states::

    IDLE ──records──> READY ──take──> RUNNING ──results──> READY / WAITING / IDLE
                        │  ^                                  (recycled when empty)
                        │  └──────────── wake, unblock ───────────┐
                        ├──head not due──> WAITING (timer heap) ──┤
                        └──head at the limit──> BLOCKED ──────────┘
    RUNNING ──terminal failure, nowhere to send it──> STUCK (until its partition goes)
    any state ──partition dropped──> DEAD

Only the ordered modes use RUNNING (one owner at a time); an UNORDERED shard and a lane stay
READY while they have records, whoever runs them. Each state has one container (the ready
queue, the timer heap, the partition's blocked list, an item), and a shard leaves a container
only by changing state, so no container ever holds a stale shard. This module holds the data; the
transitions are :class:`~sdk.engine._core.WorkCore`'s.

A partition's offsets and commit points are its :class:`~sdk.engine._partition.PartitionState`;
the partition the core runs, :class:`ShardedPartition`, adds its shards, its lane, its live keys
and its blocked list.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Any, Final, NamedTuple

from sdk.engine._offsets import Ranges
from sdk.engine._partition import TP, Counts, PartitionState

# Final: the compiled core inlines them (a plain module global is a dictionary lookup).
IDLE: Final = 0
READY: Final = 1
WAITING: Final = 2
BLOCKED: Final = 3
RUNNING: Final = 4
STUCK: Final = 5
DEAD: Final = 6
STATE_NAMES = ("idle", "ready", "waiting", "blocked", "running", "stuck", "dead")


class _NotStarted:
    def __repr__(self) -> str:
        return "NOT_STARTED"


NOT_STARTED: Any = _NotStarted()
"""Result of a record a worker did not start: an earlier record of its shard failed in the same
item, or its partition was revoked."""


LANE: Any = type("Lane", (), {"__repr__": lambda self: "LANE"})()
"""The key of a partition's lane in ``ShardedPartition.shards`` (equal to no record's key)."""


class Shard:
    """Records of one ordering unit, in offset order, and the shard's state."""

    __slots__ = ("key", "lane", "part", "queue", "run", "state")

    def __init__(self, key: object, part: ShardedPartition, lane: bool = False) -> None:
        self.key = key
        self.part = part
        self.queue: deque[Entry] = deque()
        self.state = IDLE
        self.run: list[Entry] | None = None  # RUNNING: the entries of the item running it
        self.lane = lane  # KEY ordering: records of distinct keys that may run side by side

    def __repr__(self) -> str:
        where = self.part.tp if self.part is not None else "?"
        return f"Shard({where}, {self.key!r}, {STATE_NAMES[self.state]}, {len(self.queue)} queued)"


class Entry:
    """One registered record: its offset, partition, shard, the message, and its attempts;
    ``seq`` is its place among its partition's registered records (``PartitionState``)."""

    __slots__ = (
        "attempts",
        "follower",
        "key",
        "last_error",
        "not_before",
        "offset",
        "part",
        "payload",
        "run",
        "seq",
        "shard",
    )

    def __init__(
        self,
        offset: int,
        part: ShardedPartition,
        shard: Shard,
        payload: Any,
        not_before: float,
        seq: int = -1,
    ) -> None:
        self.offset = offset
        self.seq = seq
        self.part = part
        self.shard = shard
        self.payload = payload
        self.not_before = not_before
        self.attempts = 0
        self.last_error: str | None = None  # what its last failed attempt raised ("Type: text")
        self.key: object  # a lane's record: its key (as its shard would have it)
        self.run: list[Entry] | None  # a lane's record while it runs: its item's entries
        self.follower: Shard | None = None  # a lane's running record: its key's shard

    @property
    def tp(self) -> tuple[str, int]:
        return self.part.tp

    def __repr__(self) -> str:
        topic, partition = self.part.tp
        return f"Entry({topic}[{partition}]@{self.offset}, attempts={self.attempts})"


class ShardedPartition(PartitionState):
    """One assignment of one partition with the shards that queue its records (a new object
    for every assignment)."""

    __slots__ = ("blocked", "lane", "live_keys", "shards")

    def __init__(
        self, tp: TP, start: int | None, restored: Ranges, counts: Counts, now: float
    ) -> None:
        super().__init__(tp, start, restored, counts, now)
        self.shards: dict[object, Shard] = {}  # by key within the partition (sdk.engine._core)
        self.lane: Shard | None = None  # KEY ordering: its lane (see the module's docs)
        # KEY ordering: each key with a record queued or running, to its record in the lane or
        # to its own shard (see the module's docs).
        self.live_keys: dict[object, Entry | Shard] = {}
        self.blocked: list[Shard] = []  # BLOCKED shards: waiting for the limit or the map

    def unstarted_tail(self, keep: int) -> int | None:
        """The lowest offset of the newest records that have not started (queued in their
        shard, never attempted), leaving at least ``keep`` records held; None if there are
        none. Completed, running, retried and stuck records are never among them."""
        excess = self.incomplete - keep
        if excess <= 0:
            return None
        unstarted = set()
        for shard in self.shards.values():
            for entry in reversed(shard.queue):
                if entry.shard is not shard:
                    continue  # a lane's stale entry: its own shard tells
                if entry.attempts:
                    break
                unstarted.add(entry.offset)
        lowest = None
        offsets = self.offsets
        for i in range(len(offsets) - 1, self.head - 1, -1):
            offset = offsets[i]
            if excess <= 0 or offset not in unstarted:
                break
            lowest = offset
            excess -= 1
        return lowest


class Item:
    """Work handed to one worker: runs of records, each run consecutive records of one shard.

    The cross-thread protocol: the worker running the item sets ``finished`` to the number
    of leading records that succeeded so far (it only grows, and stops growing at the first
    failure), and the consumer's thread may append records to ``entries`` while the item is
    outstanding (a RUNNING shard's next records: the worker runs them without a hand-off).
    The worker reports one result per record it got to, in order; records appended after its
    last look have no result and count as not started. ``reported`` (the consumer's thread
    only) is how many finished records the core has applied already, so a long item's
    finished records can be committed before the item ends."""

    __slots__ = ("entries", "finished", "id", "reported")

    def __init__(self, item_id: int, entries: list[Entry]) -> None:
        self.id = item_id
        self.entries = entries
        self.finished = 0
        self.reported = 0


class ItemShape(NamedTuple):
    """How :meth:`~sdk.engine._core.WorkCore.take` fills an item.

    An item is a list of runs. A run is up to ``run`` consecutive records of one shard (they
    run one after another on the same worker). An item holds at most ``shards`` runs; after
    its first run, further runs join only while the item stays within ``records`` records (the
    first run alone may be longer: its records are sequential anyway). Records of an
    UNORDERED shard or of a lane could run side by side: each counts as a run of its own."""

    records: int
    run: int
    shards: int


class Timers:
    """The WAITING shards, by when their head record is due. A shard is in here exactly
    while its state is WAITING; :meth:`purge` removes those of dropped partitions."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Shard]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def park(self, shard: Shard, until: float) -> None:
        shard.state = WAITING
        heapq.heappush(self._heap, (until, next(self._seq), shard))

    def due(self, now: float) -> list[Shard]:
        """Remove and return the shards due at ``now`` (their state is left to the caller)."""
        heap = self._heap
        woken = []
        while heap and heap[0][0] <= now:
            woken.append(heapq.heappop(heap)[2])
        return woken

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def purge(self) -> None:
        """Forget the shards that are no longer WAITING (their partition was dropped)."""
        kept = [entry for entry in self._heap if entry[2].state == WAITING]
        if len(kept) != len(self._heap):
            heapq.heapify(kept)
            self._heap = kept

    def shards(self) -> list[Shard]:
        return [entry[2] for entry in self._heap]
