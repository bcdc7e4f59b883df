"""The engine's core: which record may start next, what may be committed, what must pause.

A plain state machine in the sans-I/O style: no Kafka, no threads, no clock (time is passed
in). The shell (``sdk._engine``) feeds it fetched records and completions and carries out what
it decides. The rules it keeps:

* **Shards.** Records are grouped into shards: a partition (PARTITION ordering), a
  (topic, partition, key) (KEY ordering; null keys share one shard per partition or get one
  each), or a partition whose records may all run at once (UNORDERED). A shard of an ordered
  mode has at most one owner at a time and gives out its records strictly in offset order.
  Ready shards are served round-robin, so a hot or slow shard never starves the others.
* **Commits.** Every fetched offset is registered as incomplete and leaves that state only
  when its record succeeded, was skipped, or reached the dead-letter topic. A partition may
  commit the lowest incomplete offset (or one past the highest registered offset when none
  is incomplete) - never derived from the fetch position. Completed offsets beyond it form
  the offset map.
* **Held records.** Everything registered and not complete is held in memory: buffered, in
  flight or parked for retry. It is counted per partition from the registration structures
  (never by separate increments), and a partition whose share of the buffer is full is
  paused; records parked for retry are bounded on their own.
* **Revocation.** Dropping a partition removes every trace of it at once and marks its state
  dead; results that arrive later for its records are ignored.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sdk._offsets import MAX_METADATA_BYTES, encode_offset_map
from sdk._options import Ordering
from sdk._record import TerminalError

TP = tuple[str, int]


class _NotStarted:
    def __repr__(self) -> str:
        return "NOT_STARTED"


NOT_STARTED: Any = _NotStarted()
"""Result of a record a worker did not start because an earlier record of its shard failed."""


@dataclass
class Counts:
    """Lifetime statistics per partition (for metrics; never used to take decisions)."""

    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    restored_skips: int = 0


class _Partition:
    """The state of one assigned partition (a new object for every assignment)."""

    __slots__ = (
        "blocked",
        "blocked_since",
        "counts",
        "dead",
        "done",
        "head_since",
        "highest",
        "last_committed",
        "last_map",
        "limit",
        "map_cap",
        "paused",
        "pending",
        "restored",
        "revoked",
        "start",
        "tp",
    )

    def __init__(
        self, tp: TP, start: int | None, restored: set[int], counts: Counts, now: float
    ) -> None:
        self.tp = tp
        self.counts = counts
        self.dead = False  # revoked and dropped: anything still referring to it is stale
        self.start = start
        self.pending: deque[int] = deque()  # registered offsets from the lowest incomplete on
        self.done: set[int] = set()  # completed offsets above the lowest incomplete
        self.highest = -1
        self.restored = restored  # completed before a restart: skipped when fetched again
        self.revoked = False
        # While the offset map is near its size limit, records beyond its highest completed
        # offset wait (they could only grow it); gaps below it may always run and shrink it.
        self.map_cap: int | None = None
        self.limit: int | None = None  # release limit (watermark); None: everything
        self.blocked: list[Shard] = []  # shards waiting for the limit or the offset map
        self.blocked_since: float | None = None  # when the first of them started waiting
        self.last_committed = start
        self.last_map = ""
        self.head_since = now
        self.paused = False

    @property
    def held(self) -> int:
        return len(self.pending) - len(self.done)

    def committable(self) -> int | None:
        if self.pending:
            return self.pending[0]
        if self.highest >= 0:
            return self.highest + 1
        return self.start

    def release_limit(self) -> int | None:
        limit, cap = self.limit, self.map_cap
        if cap is not None and (limit is None or limit > cap + 1):
            return cap + 1
        return limit


class Shard:
    """The unit of ordering. ``place`` says where it waits, so it is in one place only.

    In the ordered modes, emptied shards are recycled (KEY ordering needs one for almost
    every record): nothing may keep a shard once its queue is empty and no item owns it."""

    __slots__ = ("busy", "key", "part", "place", "queue")

    def __init__(self, key: object, part: _Partition) -> None:
        self.key = key
        self.part = part
        self.queue: deque[Entry] = deque()
        self.busy = False
        self.place: str | None = None  # "ready", "waiting", "blocked" or None

    @property
    def tp(self) -> TP:
        return self.part.tp


class Entry:
    """One registered record, with its partition's state (which says when it is stale)."""

    __slots__ = ("attempts", "last_error", "not_before", "offset", "part", "payload", "shard")

    def __init__(
        self, offset: int, part: _Partition, shard: Shard, payload: Any, not_before: float
    ) -> None:
        self.offset = offset
        self.part = part
        self.shard = shard
        self.payload = payload
        self.not_before = not_before
        self.attempts = 0
        self.last_error: BaseException | None = None

    @property
    def tp(self) -> TP:
        return self.part.tp

    def __repr__(self) -> str:
        topic, partition = self.part.tp
        return f"Entry({topic}[{partition}]@{self.offset}, attempts={self.attempts})"


class Item:
    """Work handed to one worker: records run one after another (or as one batch).

    ``finished`` is the one field another thread writes: the worker running the item sets it
    to the number of its leading records that succeeded so far (it only grows, and stops at
    the first failure). ``reported`` is how many of those the core has already applied."""

    __slots__ = ("entries", "finished", "id", "reported")

    def __init__(self, item_id: int, entries: list[Entry]) -> None:
        self.id = item_id
        self.entries = entries
        self.finished = 0
        self.reported = 0


class Commit(NamedTuple):
    tp: TP
    offset: int
    metadata: str


class _Fetched(NamedTuple):
    """A record given to :meth:`WorkCore.add` one at a time, shaped like a message (it is
    the entry's payload)."""

    tp: TP
    offset_: int
    key_: bytes | None
    timestamp_: float | None
    payload: Any

    def topic(self) -> str:
        return self.tp[0]

    def partition(self) -> int:
        return self.tp[1]

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def timestamp(self) -> tuple[int, int]:
        return (0, 0) if self.timestamp_ is None else (1, int(self.timestamp_ * 1000))


_FREE_SHARDS = 4096


class WorkCore:
    def __init__(
        self,
        ordering: Ordering,
        *,
        null_keys: str = "ordered",
        max_attempts: int | None = None,
        retry_delay: Callable[[int, BaseException], float] = lambda attempt, error: 0.0,
        on_exhausted: str = "dead_letter",
        max_retrying: int = 10_000,
        process_delay: float = 0.0,
        buffer_limit: int = 1000,
        map_limit: int = MAX_METADATA_BYTES,
    ) -> None:
        self.ordering = ordering
        self.unordered = ordering is Ordering.UNORDERED
        self.key_ordered = ordering is Ordering.KEY
        self.null_keys_unordered = null_keys == "unordered"
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self.on_exhausted = on_exhausted
        self.max_retrying = max_retrying
        self.process_delay = process_delay
        self.buffer_limit = buffer_limit
        self.map_limit = map_limit
        self.paused_all = False
        self.partitions: dict[TP, _Partition] = {}
        self.shards: dict[object, Shard] = {}
        self.outstanding: dict[int, Item] = {}
        self.retrying: set[Entry] = set()
        self.dead_letter_pending: set[Entry] = set()
        self.counts: dict[TP, Counts] = {}
        self._free_shards: list[Shard] = []
        self._ready: deque[Shard] = deque()
        self._waiting: list[tuple[float, int, Shard]] = []
        self._items = itertools.count(1)
        self._seq = itertools.count()

    # ---- assignment ---------------------------------------------------------------------

    def assign(
        self, tp: TP, committed: int | None, completed: Iterable[int] = (), now: float = 0.0
    ) -> None:
        """Start tracking a partition whose consumption starts at ``committed``."""
        self.drop([tp])
        restored = {o for o in completed if committed is not None and o > committed}
        counts = self.counts.setdefault(tp, Counts())
        self.partitions[tp] = _Partition(tp, committed, restored, counts, now)

    def revoke(self, tps: Iterable[TP]) -> None:
        """Stop starting work for these partitions (their in-flight work may still finish)."""
        for tp in tps:
            part = self.partitions.get(tp)
            if part is not None:
                part.revoked = True

    def in_flight_partitions(self) -> set[TP]:
        return {
            entry.part.tp
            for item in self.outstanding.values()
            for entry in item.entries
            if not entry.part.dead
        }

    def drop(self, tps: Iterable[TP]) -> None:
        """Forget partitions entirely: state, shards, queues, parked retries, at once."""
        gone = [self.partitions.pop(tp) for tp in tps if tp in self.partitions]
        if not gone:
            return
        for part in gone:
            part.dead = True
        for key in [k for k, shard in self.shards.items() if shard.part.dead]:
            del self.shards[key]
        self.retrying = {e for e in self.retrying if not e.part.dead}
        self.dead_letter_pending = {e for e in self.dead_letter_pending if not e.part.dead}

    # ---- records in ---------------------------------------------------------------------

    def add(
        self,
        tp: TP,
        offset: int,
        key: bytes | None,
        timestamp: float | None,
        payload: Any,
        now: float,
    ) -> bool:
        """Register one fetched record; False when it is ignored (unknown, revoked or seen)."""
        part = self.partitions.get(tp)
        if part is None or part.revoked or offset <= part.highest:
            return False
        record = _Fetched(tp, offset, key, timestamp, payload)
        self.add_messages([record], now, with_timestamps=timestamp is not None)
        return True

    def add_messages(
        self, messages: Iterable[Any], now: float, with_timestamps: bool = False
    ) -> None:
        """Register fetched confluent-kafka messages (anything with ``topic()``,
        ``partition()``, ``offset()``, ``key()`` and ``timestamp()``) without errors.
        Messages of unknown or revoked partitions, and offsets already seen, are ignored."""
        tp: TP | None = None
        part: _Partition | None = None
        shards, ready = self.shards, self._ready
        key_ordered, null_keys_unordered = self.key_ordered, self.null_keys_unordered
        delay = self.process_delay if with_timestamps else 0.0
        for message in messages:
            topic, number = message.topic(), message.partition()
            if tp is None or tp[1] != number or tp[0] != topic:
                tp = (topic, number)
                part = self.partitions.get(tp)
            if part is None or part.revoked:
                continue
            offset = message.offset()
            if offset <= part.highest:
                continue
            part.highest = offset
            pending = part.pending
            if not pending:
                part.head_since = now
            pending.append(offset)
            if part.restored and offset in part.restored:
                part.restored.discard(offset)
                part.counts.restored_skips += 1
                self._mark_done(part, offset, now)
                continue
            if not key_ordered:
                shard_key: object = tp
            else:
                key = message.key()
                shard_key = (tp, None, offset) if key is None and null_keys_unordered else (tp, key)
            shard = shards.get(shard_key)
            if shard is None:
                shard = shards[shard_key] = self._new_shard(shard_key, part)
            not_before = 0.0
            if delay:
                kind, stamp = message.timestamp()
                if kind:
                    not_before = stamp / 1000 + delay
            shard.queue.append(Entry(offset, part, shard, message, not_before))
            if shard.place is None and not shard.busy:
                shard.place = "ready"
                ready.append(shard)

    def _new_shard(self, key: object, part: _Partition) -> Shard:
        if self._free_shards:
            shard = self._free_shards.pop()
            shard.key = key
            shard.part = part
            return shard
        return Shard(key, part)

    # ---- scheduling ---------------------------------------------------------------------

    def take(
        self,
        now: float,
        slots: int,
        item_size: int = 1,
        run_max: int = 1,
        max_runs: int | None = None,
    ) -> list[Item]:
        """Up to ``slots`` items of up to ``item_size`` records each, ready to start now.

        ``run_max`` is how many consecutive records of one shard an item may hold (they run
        one after another on the same worker). The first shard's run may exceed
        ``item_size`` (its records are sequential anyway); further shards join an item only
        while it stays within ``item_size`` records and ``max_runs`` shards.
        """
        runs_per_item = max_runs or item_size
        items: list[Item] = []
        if self.paused_all or slots <= 0:
            return items
        self._wake(now)
        unordered = self.unordered
        ready = self._ready
        retrying = self.retrying
        entries: list[Entry] = []
        runs = 0
        while ready and len(items) < slots:
            shard = ready.popleft()
            shard.place = None
            queue = shard.queue
            part = shard.part
            if not queue or part.revoked or part.dead:
                continue
            head = queue[0]
            if head.not_before > now:
                self._park(shard, head.not_before)
                continue
            limit = part.limit if part.map_cap is None else part.release_limit()
            if limit is not None and head.offset >= limit:
                shard.place = "blocked"
                if not part.blocked:
                    part.blocked_since = now
                part.blocked.append(shard)
                continue
            room = min(run_max, item_size - len(entries)) if entries else run_max
            while room and queue:
                entry = queue[0]
                if entry.not_before > now or (limit is not None and entry.offset >= limit):
                    break
                entries.append(queue.popleft())
                if entry.attempts:
                    retrying.discard(entry)
                room -= 1
            if unordered:
                if queue:
                    shard.place = "ready"
                    ready.append(shard)
            else:
                shard.busy = True
            runs += 1
            if len(entries) >= item_size or runs >= runs_per_item:
                items.append(self._item(entries))
                entries = []
                runs = 0
        if entries:
            items.append(self._item(entries))
        return items

    def _item(self, entries: list[Entry]) -> Item:
        item = Item(next(self._items), entries)
        self.outstanding[item.id] = item
        return item

    def _park(self, shard: Shard, until: float) -> None:
        shard.place = "waiting"
        heapq.heappush(self._waiting, (until, next(self._seq), shard))

    def _wake(self, now: float) -> None:
        waiting = self._waiting
        while waiting and waiting[0][0] <= now:
            _, _, shard = heapq.heappop(waiting)
            if shard.place == "waiting":  # else moved on (or recycled) since it was parked
                shard.place = None
                self._make_ready(shard)

    def _make_ready(self, shard: Shard) -> None:
        if shard.place is None and not shard.busy and shard.queue and not shard.part.dead:
            shard.place = "ready"
            self._ready.append(shard)

    def next_wakeup(self) -> float | None:
        """When a parked shard (retry or process delay) becomes due, if any."""
        waiting = self._waiting
        while waiting and waiting[0][2].place != "waiting":
            heapq.heappop(waiting)
        return waiting[0][0] if waiting else None

    def has_ready(self, now: float) -> bool:
        """Whether :meth:`take` would find work now (parked shards that are due included)."""
        if self.paused_all:
            return False
        self._wake(now)
        return bool(self._ready)

    # ---- results ------------------------------------------------------------------------

    def collect_progress(self, now: float) -> None:
        """Apply the records running items have already finished (their ``finished``
        counts), so commits need not wait for a long item's end. The items keep their shards
        until :meth:`complete`."""
        for item in self.outstanding.values():
            finished = item.finished
            if finished <= item.reported:
                continue
            for entry in item.entries[item.reported : finished]:
                part = entry.part
                if not part.dead:
                    part.counts.processed += 1
                    self._mark_done(part, entry.offset, now)
            item.reported = finished

    def complete(self, item_id: int, results: Sequence[Any], now: float) -> list[Entry]:
        """Apply a worker's results, one per record of the item (``None`` success, an
        exception, or NOT_STARTED); records already applied by :meth:`collect_progress` are
        skipped. Returns the records that must now go to the dead-letter topic."""
        item = self.outstanding.pop(item_id, None)
        if item is None:
            return []
        entries = item.entries
        if item.reported:
            entries = entries[item.reported :]
            results = results[item.reported :]
        if not any(results):
            self._all_succeeded(entries, now)
            to_dead_letter: list[Entry] = []
        else:
            to_dead_letter = self._apply_results(entries, results, now)
        if item.reported:
            # Shards of records reported earlier, and not released with the rest above.
            released = {entry.shard for entry in entries}
            for shard in dict.fromkeys(e.shard for e in item.entries[: item.reported]):
                if shard not in released and not shard.part.dead:
                    self._release(shard, now)
        return to_dead_letter

    def _all_succeeded(self, entries: Sequence[Entry], now: float) -> None:
        """The common case, kept short with ``_mark_done`` and ``_release`` inlined."""
        shards, free = self.shards, self._free_shards
        recycle = not self.unordered
        for entry in entries:
            part = entry.part
            if part.dead:
                continue
            part.counts.processed += 1
            offset = entry.offset
            pending = part.pending
            if pending[0] == offset:
                pending.popleft()
                done = part.done
                while pending and pending[0] in done:
                    done.remove(pending.popleft())
                part.head_since = now
            else:
                part.done.add(offset)
            shard = entry.shard
            shard.busy = False
            if shard.place is not None:
                continue
            if shard.queue:
                self._release(shard, now)
            elif shards.get(shard.key) is shard:
                del shards[shard.key]
                if recycle and len(free) < _FREE_SHARDS:
                    free.append(shard)

    def _apply_results(
        self, entries: Sequence[Entry], results: Sequence[Any], now: float
    ) -> list[Entry]:
        to_dead_letter: list[Entry] = []
        returned: dict[Shard, list[Entry]] = {}
        for entry, result in zip(entries, results, strict=True):
            part = entry.part
            if part.dead:
                continue  # its partition was revoked meanwhile
            back = returned.setdefault(entry.shard, [])
            if result is None:
                part.counts.processed += 1
                self._mark_done(part, entry.offset, now)
            elif result is NOT_STARTED:
                back.append(entry)
            else:
                outcome = self._failed(entry, result, now)
                if outcome == "retry":
                    if self.unordered:
                        self._retry_alone(entry)
                    else:
                        back.append(entry)
                elif outcome == "dead_letter":
                    self.dead_letter_pending.add(entry)
                    to_dead_letter.append(entry)
                else:
                    part.counts.skipped += 1
                    self._mark_done(part, entry.offset, now)
        for shard, back in returned.items():
            if back:
                shard.queue.extendleft(reversed(back))
            self._release(shard, now)
        return to_dead_letter

    def _release(self, shard: Shard, now: float) -> None:
        """A shard's work item finished: it may be served again (or recycled if empty)."""
        shard.busy = False
        if shard.place is not None or shard.part.dead:
            return
        queue = shard.queue
        if not queue:
            if self.shards.get(shard.key) is shard:
                del self.shards[shard.key]
                # Only an ordered shard has no other owner once released (in UNORDERED mode
                # several items share a partition's shard), so only those are recycled.
                if not self.unordered and len(self._free_shards) < _FREE_SHARDS:
                    self._free_shards.append(shard)
            return
        head = queue[0]
        if head.not_before > now:
            self._park(shard, head.not_before)
        else:
            shard.place = "ready"
            self._ready.append(shard)

    def _failed(self, entry: Entry, error: BaseException, now: float) -> str:
        counts = entry.part.counts
        counts.failed += 1
        entry.attempts += 1
        entry.last_error = error
        terminal = isinstance(error, TerminalError)
        if terminal or (self.max_attempts is not None and entry.attempts >= self.max_attempts):
            return self.on_exhausted
        counts.retried += 1
        entry.not_before = now + max(0.0, float(self.retry_delay(entry.attempts, error)))
        self.retrying.add(entry)
        return "retry"

    def _retry_alone(self, entry: Entry) -> None:
        """UNORDERED: a failed record waits in a shard of its own, holding nothing else up."""
        key = ("retry", entry.part.tp, entry.offset)
        shard = self.shards[key] = self._new_shard(key, entry.part)
        entry.shard = shard
        shard.queue.append(entry)
        self._park(shard, entry.not_before)

    def dead_lettered(self, entry: Entry, now: float) -> None:
        """The dead-letter topic acknowledged the record: it is complete."""
        self.dead_letter_pending.discard(entry)
        part = entry.part
        if not part.dead:
            part.counts.dead_lettered += 1
            self._mark_done(part, entry.offset, now)

    @staticmethod
    def _mark_done(part: _Partition, offset: int, now: float) -> None:
        pending = part.pending
        if pending and pending[0] == offset:
            pending.popleft()
            done = part.done
            while pending and pending[0] in done:
                done.remove(pending.popleft())
            part.head_since = now
        else:
            part.done.add(offset)

    # ---- release limits (gating) and global pause ---------------------------------------

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
            self._unblock(part)
            return None if since is None else max(0.0, now - since)
        return None

    def _unblock(self, part: _Partition) -> None:
        blocked, part.blocked = part.blocked, []
        part.blocked_since = None
        for shard in blocked:
            if shard.place == "blocked":
                shard.place = None
                self._make_ready(shard)

    def pause_all(self) -> None:
        self.paused_all = True

    def resume_all(self) -> None:
        self.paused_all = False

    # ---- commits ------------------------------------------------------------------------

    def commits(self, tps: Iterable[TP] | None = None, *, with_maps: bool = True) -> list[Commit]:
        """Offsets (and offset maps) that changed since they were last handed out."""
        result = []
        for tp in list(self.partitions) if tps is None else tps:
            part = self.partitions.get(tp)
            if part is None:
                continue
            offset = part.committable()
            if offset is None:
                continue
            metadata = ""
            cap = None
            if with_maps and part.done:
                encoded = encode_offset_map(offset, part.done, self.map_limit)
                metadata = encoded or ""
                if encoded is None or len(encoded) > 0.75 * self.map_limit:
                    cap = max(part.done)
            if part.map_cap is not None and cap is None:
                part.map_cap = None
                self._unblock(part)
            elif cap is not None and part.map_cap is None:
                part.map_cap = cap
            if offset == part.last_committed and metadata == part.last_map:
                continue
            part.last_committed = offset
            part.last_map = metadata
            result.append(Commit(tp, offset, metadata))
        return result

    def commit_failed(self, tp: TP) -> None:
        """Hand the partition's offset out again at the next :meth:`commits`."""
        part = self.partitions.get(tp)
        if part is not None:
            part.last_committed = None
            part.last_map = ""

    # ---- back-pressure ------------------------------------------------------------------

    def pause_changes(self) -> tuple[list[TP], list[TP]]:
        """Partitions to pause and to resume fetching now.

        A partition pauses when its records held in memory reach its share of the buffer
        (or when too many records are parked for retry) and resumes below half its share.
        """
        if not self.partitions:
            return [], []
        share = max(1, self.buffer_limit // len(self.partitions))
        retry_full = len(self.retrying) >= self.max_retrying
        pause, resume = [], []
        for tp, part in self.partitions.items():
            if part.revoked:
                continue
            held = part.held
            if not part.paused and (held >= share or retry_full):
                part.paused = True
                pause.append(tp)
            elif part.paused and held <= share // 2 and not retry_full:
                part.paused = False
                resume.append(tp)
        return pause, resume

    # ---- introspection ------------------------------------------------------------------

    def held(self) -> int:
        return sum(p.held for p in self.partitions.values())

    def in_flight(self) -> int:
        return sum(len(item.entries) - item.reported for item in self.outstanding.values())

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
        waiting_retry = sum(1 for e in self.retrying if e.part is part)
        blocking = part.pending[0] if part.pending else None
        return {
            "held": part.held,
            "in_flight": in_flight,
            "retrying": waiting_retry,
            "buffered": part.held - in_flight - waiting_retry,
            "incomplete_beyond_head": len(part.done),
            "committable": part.committable(),
            "blocking_offset": blocking,
            "blocked_for": (now - part.head_since) if blocking is not None else 0.0,
            "limit": part.limit,
            "gate_held": 0
            if part.limit is None
            else sum(1 for o in part.pending if o >= part.limit),
            "held_for": 0.0 if part.blocked_since is None else now - part.blocked_since,
            "paused": part.paused,
            "map_full": part.map_cap is not None,
        }
