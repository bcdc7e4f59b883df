"""Results in: what a worker's results do to the records, their shards and partitions.

Part of the engine's core (:class:`~sdk.engine._core.WorkCore` owns one). A record is done when
processed, dead-lettered with an acknowledged copy, or skipped by a policy the user chose; a
failed record is retried, copied to the dead-letter topic, skipped, or held as STUCK (its
failure policy decides). A record that did not complete goes back to the head of its shard;
an item's shards are handed back to the scheduler when it completes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sdk.engine._failures import DEAD_LETTER, RETRY, SKIP, FailurePolicy
from sdk.engine._scheduler import Scheduler
from sdk.engine._shards import NOT_STARTED, RUNNING, STUCK, Entry, Item, Shard, ShardedPartition


class Outcome(NamedTuple):
    """What applying results left for the shell: copies to write to the dead-letter topic,
    and records that failed terminally with nowhere to go (now STUCK)."""

    dead_letters: list[Entry]
    stuck: list[Entry]


NOTHING = Outcome([], [])


class Results:
    """The items out with workers, and the records that failed: retrying, on their way to
    the dead-letter topic, or stuck."""

    def __init__(self, scheduler: Scheduler, failures: FailurePolicy, unordered: bool) -> None:
        self.scheduler = scheduler
        self.failures = failures
        self.unordered = unordered
        self.outstanding: dict[int, Item] = {}
        self.retrying: set[Entry] = set()
        self.dead_letter_pending: set[Entry] = set()
        self.stuck: dict[Entry, None] = {}

    def forget_dead(self) -> None:
        """Forget the failed records of dropped partitions (in place: the core shares these
        collections)."""
        for pending in (self.retrying, self.dead_letter_pending):
            pending.difference_update([e for e in pending if e.part.dead])
        for entry in [e for e in self.stuck if e.part.dead]:
            del self.stuck[entry]

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
        part: ShardedPartition | None = None
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
