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

from sdk.engine._failures import DEAD_LETTER, RETRY, SKIP, FailurePolicy
from sdk.engine._offsets import MAX_METADATA_BYTES, Ranges
from sdk.engine._options import Ordering
from sdk.engine._partition import FETCHING, PAUSED, STALL_AFTER, TP, UNKNOWN, Counts, PartitionState
from sdk.engine._scheduler import Scheduler
from sdk.engine._shards import (
    IDLE,
    LANE,
    NOT_STARTED,
    READY,
    RUNNING,
    STUCK,
    Entry,
    Item,
    ItemShape,
    Shard,
)

__all__ = ["NOT_STARTED", "TP", "Commit", "Entry", "Item", "ItemShape", "Outcome", "WorkCore"]


def _no_method(message: Any) -> Any:
    raise AssertionError("replaced by the message class's method before use")


def _due(message: Any, delay: float, wall_offset: float) -> float:
    """When a record may start under a process delay, on the core's clock (``wall_offset``:
    the wall clock minus the core's; at once without a timestamp)."""
    kind, stamp = message.timestamp()
    return stamp / 1000 + delay - wall_offset if kind else 0.0


class Commit(NamedTuple):
    tp: TP
    offset: int
    metadata: str


class Outcome(NamedTuple):
    """What applying results left for the shell: copies to write to the dead-letter topic,
    and records that failed terminally with nowhere to go (now STUCK)."""

    dead_letters: list[Entry]
    stuck: list[Entry]


NOTHING = Outcome([], [])


class WorkCore:
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
        self.null_keys_unordered = null_keys == "unordered"
        self.failures = failures or FailurePolicy()
        self.max_retrying = max_retrying
        self.process_delay = process_delay
        self.buffer_limit = buffer_limit
        self.reserve = buffer_limit // 16  # room for records that arrive with callbacks
        self.full = False  # every partition paused until the buffer in use is below the reserve
        self.map_limit = map_limit
        self.follow_on = 0 if self.unordered else follow_on
        self.paused_all = False  # start nothing (the user's pause, or a stop)
        self.fetch_stopped = False  # pause every partition (stopping)
        self.partitions: dict[TP, PartitionState] = {}
        self.scheduler = Scheduler(self.unordered, keep_free=buffer_limit)
        self.outstanding: dict[int, Item] = {}
        self.retrying: set[Entry] = set()
        self.dead_letter_pending: set[Entry] = set()
        self.stuck: dict[Entry, None] = {}
        self.counts: dict[TP, Counts] = {}
        self._items = itertools.count(1)

    # ---- assignment ---------------------------------------------------------------------

    def assign(
        self, tp: TP, committed: int | None, restored: Ranges | tuple[()] = (), now: float = 0.0
    ) -> None:
        """Start tracking a partition whose consumption starts at ``committed``; ``restored``:
        ranges of offsets completed before (from an offset map written for ``committed``)."""
        self.drop([tp])
        counts = self.counts.setdefault(tp, Counts())
        part = self.partitions[tp] = PartitionState(tp, committed, list(restored), counts, now)
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
        self.retrying = {e for e in self.retrying if not e.part.dead}
        self.dead_letter_pending = {e for e in self.dead_letter_pending if not e.part.dead}
        self.stuck = {e: None for e in self.stuck if not e.part.dead}

    # ---- records in ---------------------------------------------------------------------

    def add_messages(
        self, messages: list[Any], now: float, wall_offset: float | None = None
    ) -> list[Any]:
        """Register fetched confluent-kafka messages (anything with ``error()``, ``topic()``,
        ``partition()``, ``offset()``, ``key()`` and ``timestamp()``). Returns the messages
        that carry an error: they are not registered. Messages of unknown or revoked
        partitions, and offsets already seen, are ignored. ``wall_offset`` (the wall clock
        minus the clock of ``now``) is given when records wait ``process_delay`` after their
        timestamps: the core's timers run on a clock that never steps (a monotonic one), and
        only a record's due time is converted from the wall clock, once."""
        partitions = self.partitions
        sole_topic = self.sole_topic
        delay = self.process_delay if wall_offset is not None else 0.0
        wall = wall_offset or 0.0
        # A fetch holds runs of one partition's records: each run is registered in one go.
        runs: list[tuple[PartitionState, list[Any], list[int]]] = []
        in_order: list[bool] = []  # for each run: whether its offsets increase
        errors: list[Any] = []
        run: list[Any] | None = None
        offsets: list[int] = []
        topic: str | None = None
        number = last = -1
        # A message's methods are taken from its class once (a fetch holds messages of one
        # class): calling them is cheaper than looking each up on every message.
        kind: type | None = None
        error_of = partition_of = offset_of = topic_of = _no_method
        for message in messages:
            if type(message) is not kind:
                kind = type(message)
                error_of, partition_of = kind.error, kind.partition
                offset_of, topic_of = kind.offset, kind.topic
            if error_of(message) is not None:
                errors.append(message)
                continue
            partition = partition_of(message)
            if partition != number or (sole_topic is None and topic_of(message) != topic):
                number = partition
                topic = topic_of(message) if sole_topic is None else sole_topic
                part = partitions.get((topic, number))
                if part is None or part.revoked:
                    run = None
                else:
                    run, offsets = [], []
                    runs.append((part, run, offsets))
                    in_order.append(True)
                    last = -1
            if run is not None:
                offset = offset_of(message)
                if offset <= last:
                    in_order[-1] = False
                last = offset
                run.append(message)
                offsets.append(offset)
        for i in range(len(runs)):
            part, run, offsets = runs[i]
            self._register_run(part, run, offsets, in_order[i], now, delay, wall)
        return errors

    def _register_run(
        self,
        part: PartitionState,
        run: list[Any],
        offsets: list[int],
        in_order: bool,
        now: float,
        delay: float,
        wall_offset: float,
    ) -> None:
        """Register a run of one partition's fetched records and queue them (``in_order``:
        its offsets increase)."""
        if in_order and offsets[0] > part.highest and not part.restored:
            first = part.register(offsets, now)
            seqs = list(range(first, first + len(offsets)))
        else:
            run, offsets, seqs = self._register_one_by_one(part, run, now)
            if not run:
                return
        not_before = [_due(message, delay, wall_offset) for message in run] if delay else None
        if self.key_ordered:
            self._enqueue_keyed(part, run, offsets, seqs, not_before, now)
        else:
            self._enqueue(part, run, offsets, seqs, not_before, now)

    @staticmethod
    def _register_one_by_one(
        part: PartitionState, run: list[Any], now: float
    ) -> tuple[list[Any], list[int], list[int]]:
        """Register a run's records one at a time, leaving out offsets already seen and those
        the restored offset map says were completed; returns the records left to queue, their
        offsets and their sequence numbers."""
        kept: list[Any] = []
        offsets: list[int] = []
        seqs: list[int] = []
        for message in run:
            offset = message.offset()
            if offset <= part.highest:
                continue
            seq = part.register([offset], now)
            if part.restored and part.take_restored(offset):
                part.counts.restored_skips += 1
                part.complete(seq, now)
                continue
            kept.append(message)
            offsets.append(offset)
            seqs.append(seq)
        return kept, offsets, seqs

    def _enqueue(
        self,
        part: PartitionState,
        run: list[Any],
        offsets: list[int],
        seqs: list[int],
        not_before: list[float] | None,
        now: float,
    ) -> None:
        """Queue a run of one partition's records in its one shard (PARTITION, UNORDERED)."""
        shard = part.shards.get(None)
        if shard is None:
            shard = self.scheduler.new_shard(None, part)
        # (Built one by one: the compiled core calls Entry directly, where map() would go
        # through the generic call, with an argument tuple, for each.)
        entries = [
            Entry(
                offsets[i],
                part,
                shard,
                run[i],
                0.0 if not_before is None else not_before[i],
                seqs[i],
            )
            for i in range(len(run))
        ]
        state = shard.state
        queue = shard.queue
        if state == RUNNING and self.follow_on and not queue:
            entries = entries[self._join(shard, entries, now) :]
        queue.extend(entries)
        if state == IDLE:
            shard.state = READY
            self.scheduler.ready.append(shard)

    def _enqueue_keyed(
        self,
        part: PartitionState,
        run: list[Any],
        offsets: list[int],
        seqs: list[int],
        not_before: list[float] | None,
        now: float,
    ) -> None:
        """Queue a run of one partition's records by key (KEY ordering): in the lane when no
        earlier record of the key is queued or running, else in the key's shard (one lookup
        of the key in the common case)."""
        scheduler = self.scheduler
        ready = scheduler.ready
        null_keys_unordered = self.null_keys_unordered
        follow_on = self.follow_on
        live_keys = part.live_keys
        lane = part.lane
        assert lane is not None
        lane_queue = lane.queue
        queue_in_lane = lane_queue.append
        kind: type | None = None
        key_of = _no_method
        for i in range(len(run)):
            message = run[i]
            offset = offsets[i]
            due = 0.0 if not_before is None else not_before[i]
            seq = seqs[i]
            if type(message) is not kind:
                kind = type(message)
                key_of = kind.key
            key = key_of(message)
            if key is None and null_keys_unordered:
                key = (None, offset)  # alone with its offset: unordered
            entry = Entry(offset, part, lane, message, due, seq)
            entry.key = key
            live = live_keys.setdefault(key, entry)
            if live is entry:  # no earlier record of its key is queued or running
                queue_in_lane(entry)
                continue
            if isinstance(live, Shard):
                shard = live
            else:  # it follows a record of its key in the lane: a shard of their own
                shard = scheduler.new_shard(key, part)  # the key's live shard from now on
                if lane_queue and lane_queue[0].offset <= live.offset:  # not started: it moves
                    live.shard = shard
                    shard.queue.append(live)
                else:  # owned by the item running the lane's record: it may join that item
                    shard.state = RUNNING
                    shard.run = live.run
                    live.follower = shard
            entry.shard = shard
            state = shard.state
            if (
                state == RUNNING
                and follow_on
                and not shard.queue
                and self._join(shard, [entry], now)
            ):
                continue  # the worker running its shard takes it next
            shard.queue.append(entry)
            if state == IDLE:
                shard.state = READY
                ready.append(shard)
        if lane_queue and lane.state == IDLE:
            lane.state = READY
            ready.append(lane)

    def _join(self, shard: Shard, entries: list[Entry], now: float) -> int:
        """A RUNNING shard with nothing queued: how many of ``entries`` (its next records, in
        order) join the item running it, which then runs them without a hand-off. A record
        joins while the item holds fewer than ``follow_on`` records and it may start now."""
        run = shard.run
        if run is None or self.paused_all:
            return 0
        part = shard.part
        limit = part.limit if part.map_cap is None else part.release_limit()
        room = self.follow_on - len(run)
        joined = 0
        for entry in entries:
            if joined >= room or entry.not_before > now:
                break
            if limit is not None and entry.offset >= limit:
                break
            run.append(entry)
            joined += 1
        return joined

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
        commits need not wait for a long item's end. The items keep their shards until
        :meth:`complete`."""
        for item in self.outstanding.values():
            finished = item.finished
            if finished <= item.reported:
                continue
            self._processed(item.entries[item.reported : finished], now)
            item.reported = finished

    def complete(self, item_id: int, results: Sequence[Any], now: float) -> Outcome:
        """Apply a worker's results, one per record of the item (``None`` success, an
        exception, or NOT_STARTED); records applied by :meth:`collect_progress` are skipped."""
        item = self.outstanding.pop(item_id, None)
        if item is None:
            return NOTHING
        entries = item.entries
        if len(results) < len(entries):  # joined after the worker's last look: not started
            results = [*results, *[NOT_STARTED] * (len(entries) - len(results))]
        reported = item.reported
        if reported:
            entries, results = entries[reported:], results[reported:]
        if results.count(None) != len(results):  # (an exception may be falsy: never any())
            outcome = self._apply_failures(entries, results, now)
        else:
            outcome = NOTHING
            self._processed(entries, now)
        if self.unordered:  # (UNORDERED shards were let go when take() emptied them)
            return outcome
        scheduler = self.scheduler
        last = None
        for entry in item.entries:
            shard = entry.shard
            if shard is last:
                continue
            if not shard.lane:
                last = shard
                scheduler.hand_back(shard, now)
                continue
            # A lane's record is over (done, or on its way to the dead-letter topic): its key
            # is free, or the next record of its key, in a shard owned by this item, may go.
            # (Its item's list refers to it, and to its follower's records: links dropped
            # here, a dead partition's too, leave no cycle for the collector.)
            entry.run = None
            follower = entry.follower
            if follower is not None:
                entry.follower = None
                scheduler.hand_back(follower, now)  # (a dead partition's lets go of the item)
            elif not entry.part.dead:
                del entry.part.live_keys[entry.key]
        return outcome

    @staticmethod
    def _processed(entries: list[Entry], now: float) -> None:
        """These records were processed (each partition's head moves once per run of its
        records)."""
        part: PartitionState | None = None
        count = 0
        for entry in entries:
            if entry.part is not part:
                if part is not None and not part.dead:
                    part.counts.processed += count
                    part.advance(now)
                part, count = entry.part, 0
            part.finish(entry.seq)
            count += 1
        if part is not None and not part.dead:
            part.counts.processed += count
            part.advance(now)

    def _own_shard(self, entry: Entry) -> Shard:
        """The shard a record returns to when it did not complete: a lane's record moves to a
        shard of its own key, at the head of the records following it."""
        shard = entry.shard
        if not shard.lane:
            return shard
        entry.run = None
        own = entry.follower  # the key's shard, owned by this record's item
        if own is None:
            own = self.scheduler.new_shard(entry.key, entry.part)  # replaces it as live
            own.state = RUNNING  # owned by this item until it is handed back
        else:
            entry.follower = None
        entry.shard = own
        return own

    def _apply_failures(
        self, entries: Sequence[Entry], results: Sequence[Any], now: float
    ) -> Outcome:
        outcome = Outcome([], [])
        returned: dict[Shard, list[Entry]] = {}
        for entry, result in zip(entries, results, strict=True):
            part = entry.part
            if part.dead:
                continue
            if result is None:
                part.counts.processed += 1
                part.complete(entry.seq, now)
            elif result is NOT_STARTED:
                if self.unordered:  # its shard may be gone: it waits in one of its own
                    self.scheduler.alone(entry, "not started")
                else:
                    returned.setdefault(self._own_shard(entry), []).append(entry)
            else:
                decision = self.failures.decide(entry, result, now)
                if decision == RETRY:
                    self.retrying.add(entry)
                    if self.unordered:
                        self.scheduler.alone(entry, "retry")
                    else:
                        returned.setdefault(self._own_shard(entry), []).append(entry)
                elif decision == DEAD_LETTER:
                    self.dead_letter_pending.add(entry)
                    outcome.dead_letters.append(entry)
                elif decision == SKIP:
                    part.counts.skipped += 1
                    part.complete(entry.seq, now)
                else:
                    part.counts.stuck += 1
                    self.stuck[entry] = None
                    outcome.stuck.append(entry)
                    if self.unordered:
                        self.scheduler.alone(entry, "stuck")
                    else:
                        returned.setdefault(self._own_shard(entry), []).append(entry)
        for shard, back in returned.items():
            shard.queue.extendleft(reversed(back))
            if back[0] in self.stuck and shard.state == RUNNING:
                shard.state = STUCK
        return outcome

    def dead_lettered(self, entry: Entry, now: float) -> None:
        """The dead-letter topic acknowledged the record's copy: it is done."""
        self.dead_letter_pending.discard(entry)
        part = entry.part
        if not part.dead:
            part.counts.dead_lettered += 1
            part.complete(entry.seq, now)

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
        stuck = [e for e in self.stuck if e.part is part]
        crowded = self.in_memory() >= self.buffer_limit
        paused_for = part.pause_reason(self.share(), self.pressure(), crowded, now)
        return part.view(now, in_flight, retrying, stuck, paused_for)
