"""Records in: fetched messages registered with their partitions and queued in shards.

Part of the engine's core (:class:`~sdk.engine._core.WorkCore` owns one). A fetch holds runs
of one partition's records; each run is registered in one go (its offsets and sequence
numbers) and queued by the ordering: in the partition's one shard (PARTITION, UNORDERED), or
by key (KEY: in the partition's lane while no earlier record of the key is queued or running,
else in the key's shard). A record whose shard is running may join the running item
(``follow_on``), so the worker runs it without a hand-off.
"""

from __future__ import annotations

from typing import Any

from sdk.engine._partition import TP
from sdk.engine._scheduler import Scheduler
from sdk.engine._shards import IDLE, READY, RUNNING, Entry, Shard, ShardedPartition


def _no_method(message: Any) -> Any:
    raise AssertionError("replaced by the message class's method before use")


def _due(message: Any, delay: float, wall_offset: float) -> float:
    """When a record may start under a process delay, on the core's clock (``wall_offset``:
    the wall clock minus the core's; at once without a timestamp)."""
    kind, stamp = message.timestamp()
    return stamp / 1000 + delay - wall_offset if kind else 0.0


class Intake:
    """Registers fetched records and queues them in their shards."""

    def __init__(
        self,
        partitions: dict[TP, ShardedPartition],
        scheduler: Scheduler,
        *,
        key_ordered: bool,
        null_keys_unordered: bool,
        process_delay: float,
        follow_on: int,
        sole_topic: str | None,
    ) -> None:
        """``partitions`` and ``scheduler``: the core's own (shared, never replaced)."""
        self.partitions = partitions
        self.scheduler = scheduler
        self.key_ordered = key_ordered
        self.null_keys_unordered = null_keys_unordered
        self.process_delay = process_delay
        self.follow_on = follow_on
        self.joining = follow_on  # follow_on, or 0 while nothing may start
        self.sole_topic = sole_topic

    def add_messages(
        self,
        messages: list[Any],
        now: float,
        wall_offset: float | None = None,
        paused: bool = False,
    ) -> list[Any]:
        """Register fetched confluent-kafka messages (anything with ``error()``, ``topic()``,
        ``partition()``, ``offset()``, ``key()`` and ``timestamp()``). Returns the messages
        that carry an error: they are not registered. Messages of unknown or revoked
        partitions, and offsets already seen, are ignored. ``wall_offset`` (the wall clock
        minus the clock of ``now``) is given when records wait ``process_delay`` after their
        timestamps: the core's timers run on a clock that never steps (a monotonic one), and
        only a record's due time is converted from the wall clock, once. ``paused``: nothing
        may start now (no record joins a running item)."""
        self.joining = 0 if paused else self.follow_on
        partitions = self.partitions
        sole_topic = self.sole_topic
        delay = self.process_delay if wall_offset is not None else 0.0
        wall = wall_offset or 0.0
        # A fetch holds runs of one partition's records: each run is registered in one go.
        runs: list[tuple[ShardedPartition, list[Any], list[int]]] = []
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
        part: ShardedPartition,
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
        part: ShardedPartition, run: list[Any], now: float
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
        part: ShardedPartition,
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
        if state == RUNNING and self.joining and not queue:
            entries = entries[self._join(shard, entries, now) :]
        queue.extend(entries)
        if state == IDLE:
            shard.state = READY
            self.scheduler.ready.append(shard)

    def _enqueue_keyed(
        self,
        part: ShardedPartition,
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
        follow_on = self.joining
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
        if run is None:
            return 0
        part = shard.part
        limit = part.limit if part.map_cap is None else part.release_limit()
        room = self.joining - len(run)
        joined = 0
        for entry in entries:
            if joined >= room or entry.not_before > now:
                break
            if limit is not None and entry.offset >= limit:
                break
            run.append(entry)
            joined += 1
        return joined
