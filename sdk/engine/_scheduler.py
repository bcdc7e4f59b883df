"""Which record may start next: the shards' transitions between the states of
``sdk.engine._shards``.

Each partition maps its shards by key (``ShardedPartition.shards``; the core registers new
ones there, from the scheduler's free list of empty shards). The scheduler owns the
containers of the states: the ready queue (served round-robin, so a hot or slow shard never
starves the others), the timer heap (retry and process delays) and the partitions' blocked
lists (records at or beyond a release limit). Every method is one transition of the
lifecycle drawn in ``sdk.engine._shards``. Pure: no I/O, time is passed in.
"""

from __future__ import annotations

from collections import deque

from sdk.engine._shards import (
    BLOCKED,
    DEAD,
    IDLE,
    READY,
    RUNNING,
    STUCK,
    WAITING,
    Entry,
    ItemShape,
    Shard,
    ShardedPartition,
    Timers,
)


class Scheduler:
    def __init__(self, unordered: bool, keep_free: int = 10_000) -> None:
        """``keep_free``: how many empty ordered shards are kept for reuse (KEY ordering
        needs one for almost every record; the buffer's size keeps every shard of a full
        buffer, so a new one is rarely built and memory stays within what a full buffer
        took)."""
        self.unordered = unordered
        self.keep_free = keep_free
        self.ready: deque[Shard] = deque()  # READY shards: live partitions, records queued
        self.timers = Timers()  # WAITING shards
        self.free: list[Shard] = []  # empty ordered shards for reuse

    # ---- shards come and go -------------------------------------------------------------

    def new_shard(self, key: object, part: ShardedPartition) -> Shard:
        """An empty IDLE ordered shard for ``key`` (recycled when one is free), registered in
        its partition (in KEY ordering, as its key's live shard too)."""
        if self.free:
            shard = self.free.pop()
            shard.key, shard.part = key, part
        else:
            shard = Shard(key, part)
        part.shards[key] = shard
        if part.lane is not None:
            part.live_keys[key] = shard
        return shard

    def discard(self, shard: Shard) -> None:
        """An empty shard nobody owns: forget it (ordered shards are recycled; a lane stays
        with its partition)."""
        shard.state = IDLE
        if shard.lane:
            return
        part = shard.part
        shards = part.shards
        if shards.get(shard.key) is shard:
            del shards[shard.key]
            if part.live_keys.get(shard.key) is shard:
                del part.live_keys[shard.key]
            # An UNORDERED shard may still be referenced by several items: never recycled.
            if not self.unordered and len(self.free) < self.keep_free:
                self.free.append(shard)

    def retire(self, part: ShardedPartition) -> None:
        """A partition was revoked: its shards leave scheduling at once (RUNNING ones when
        their item is handed back)."""
        for shard in part.shards.values():
            if shard.state != RUNNING:
                shard.state = DEAD
        part.blocked = []
        if any(shard.part is part for shard in self.ready):
            self.ready = deque(s for s in self.ready if s.part is not part)
        self.timers.purge()

    def forget(self, part: ShardedPartition) -> None:
        """A partition was dropped: forget its shards (items still running one of them find
        it DEAD when they are handed back)."""
        for shard in part.shards.values():
            shard.state = DEAD
        part.shards = {}
        part.live_keys = {}
        part.lane = None  # (it refers to its partition: no cycle is left for the collector)

    def give_back(self, part: ShardedPartition, offset: int) -> int:
        """Forget the queued records of ``part`` from ``offset`` on (none of them started);
        shards left empty leave their container. Returns how many were forgotten."""
        forgotten = 0
        emptied = False
        for shard in part.shards.values():
            queue = shard.queue
            while queue and queue[-1].offset >= offset:
                if queue.pop().shard is shard:  # a lane's stale entries are counted elsewhere
                    forgotten += 1
            if not queue and shard.state in (READY, WAITING, BLOCKED):
                shard.state = IDLE  # leaves its container below
                emptied = True
        if emptied:
            self.ready = deque(shard for shard in self.ready if shard.state == READY)
            self.timers.purge()
            part.blocked = [shard for shard in part.blocked if shard.state == BLOCKED]
            if not part.blocked:
                part.blocked_since = None
            for shard in [s for s in part.shards.values() if s.state == IDLE and not s.queue]:
                self.discard(shard)
        return forgotten

    def alone(self, entry: Entry, kind: str) -> None:
        """UNORDERED: a failed or unstarted record waits in a shard of its own (``kind``
        "retry": until its retry is due; "not started": until the next take; "stuck": until
        its partition goes), holding nothing else up."""
        key = (kind, entry.offset)
        shard = entry.part.shards[key] = Shard(key, entry.part)
        entry.shard = shard
        shard.queue.append(entry)
        if entry.part.revoked:
            shard.state = DEAD
        elif kind == "stuck":
            shard.state = STUCK
        else:
            self.timers.park(shard, entry.not_before)

    # ---- handing out work ---------------------------------------------------------------

    def take(
        self, now: float, slots: int, shape: ItemShape, retrying: set[Entry]
    ) -> list[list[Entry]]:
        """Up to ``slots`` items (lists of records) shaped by ``shape``, of records that may
        start now; records taken leave ``retrying``."""
        self.wake(now)
        ready, timers = self.ready, self.timers
        unordered = self.unordered
        max_records, max_run, max_shards = shape
        items: list[list[Entry]] = []
        entries: list[Entry] = []
        runs = 0
        while ready and len(items) < slots:
            shard = ready.popleft()
            queue = shard.queue
            part = shard.part
            lane = shard.lane
            side_by_side = unordered or lane
            if lane:
                while queue and queue[0].shard is not shard:
                    queue.popleft()  # moved to a shard of its own (a record of its key followed)
                if not queue:
                    shard.state = IDLE
                    continue
            head = queue[0]
            if head.not_before > now:
                timers.park(shard, head.not_before)
                continue
            limit = part.limit if part.map_cap is None else part.release_limit()
            if limit is not None and head.offset >= limit:
                self.block(shard, now)
                continue
            if side_by_side:  # every record counts as a run of its own
                room = min(max_records - len(entries), max_shards - runs)
            else:
                room = min(max_run, max_records - len(entries)) if entries else max_run
            taken = 0
            popleft = queue.popleft
            if lane:
                while taken < room and queue:
                    entry = popleft()
                    if entry.shard is not shard:
                        continue  # a stale entry: it moved to a shard of its own
                    if entry.not_before > now or (limit is not None and entry.offset >= limit):
                        queue.appendleft(entry)
                        break
                    entry.run = entries  # the next record of its key may join it there
                    entries.append(entry)
                    taken += 1
            else:
                while taken < room and queue:
                    entry = popleft()
                    if entry.not_before > now or (limit is not None and entry.offset >= limit):
                        queue.appendleft(entry)
                        break
                    entries.append(entry)
                    if entry.attempts:
                        retrying.discard(entry)
                    taken += 1
            if side_by_side:
                runs += taken
                if queue:
                    ready.append(shard)
                else:
                    self.discard(shard)  # items may still refer to it: never recycled
            else:
                runs += 1
                shard.state = RUNNING
                shard.run = entries
            if len(entries) >= max_records or runs >= max_shards:
                items.append(entries)
                entries = []
                runs = 0
        if entries:
            items.append(entries)
        return items

    def wake(self, now: float) -> None:
        for shard in self.timers.due(now):
            shard.state = READY
            self.ready.append(shard)

    def block(self, shard: Shard, now: float) -> None:
        part = shard.part
        shard.state = BLOCKED
        if not part.blocked:
            part.blocked_since = now
        part.blocked.append(shard)

    def unblock(self, part: ShardedPartition) -> None:
        blocked, part.blocked = part.blocked, []
        part.blocked_since = None
        for shard in blocked:
            shard.state = READY
            self.ready.append(shard)

    def hand_back(self, shard: Shard, now: float) -> None:
        """A RUNNING shard's item is over: serve it again, park it, or forget it."""
        shard.run = None
        if shard.state != RUNNING:
            return  # STUCK now, or its partition is gone
        if shard.part.revoked:
            shard.state = DEAD
            return
        queue = shard.queue
        if not queue:
            self.discard(shard)
        elif queue[0].not_before > now:
            self.timers.park(shard, queue[0].not_before)
        else:
            shard.state = READY
            self.ready.append(shard)

    def has_ready(self, now: float) -> bool:
        """Whether :meth:`take` may find work now (shards whose timer is due included)."""
        due = self.timers.next_due()
        return bool(self.ready) or (due is not None and due <= now)
