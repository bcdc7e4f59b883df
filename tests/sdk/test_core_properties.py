"""Property tests of the engine core over random interleavings (hypothesis state machine).

Checked after every step:
* no two records of one shard run at once (ordered modes), and a record starts only when
  every earlier record of its shard is complete;
* no record starts at or beyond its partition's release limit;
* the committable offset never passes an incomplete record, and never goes backwards;
* held counts equal what the model says is registered and incomplete;
* records given back (forgotten to be fetched again) never include one that started,
  completed or failed, and come back with the next fetch;
* a partition revoked while its records wait in the workers' queue gets them back not
  started, and its next assignment runs them;
* once everything succeeds, every record completes (nothing is lost or stuck).
"""

from __future__ import annotations

import contextlib
import gc
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sdk.consumer._runners import Work
from sdk.engine._core import NOT_STARTED, Item, ItemShape, WorkCore
from sdk.engine._failures import SKIP, Decision, FailurePolicy, TerminalError
from sdk.engine._offsets import decode_offset_map, read_offset_map
from sdk.engine._options import Options, Ordering
from sdk.engine._partition import Counts, PartitionState
from sdk.engine._record import Record
from sdk.engine._shards import BLOCKED, DEAD, IDLE, READY, RUNNING, STUCK, WAITING, Entry, Shard

TOPIC = "t"


class Message(NamedTuple):
    """What the core reads of a fetched confluent-kafka message."""

    tp: tuple[str, int]
    offset_: int
    key_: bytes | None

    def topic(self) -> str:
        return self.tp[0]

    def partition(self) -> int:
        return self.tp[1]

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)

    def error(self) -> None:
        return None


@dataclass(frozen=True)
class WatchedPolicy(FailurePolicy):
    """The failure policy, telling the model which records it skipped: the model learns what
    is complete from the handlers' outcomes and the policy, never from the core."""

    skipped: list[Entry] = field(default_factory=list)

    def decide(self, entry: Entry, error: BaseException, now: float) -> Decision:
        decision = super().decide(entry, error, now)
        if decision == SKIP:
            self.skipped.append(entry)
        return decision


class CoreMachine(RuleBasedStateMachine):
    @initialize(
        ordering=st.sampled_from(list(Ordering)),
        null_keys=st.sampled_from(["ordered", "unordered"]),
        max_attempts=st.sampled_from([None, 1, 3]),
        on_exhausted=st.sampled_from(["dead_letter", "skip"]),
        dead_letters=st.booleans(),
        follow_on=st.sampled_from([3, 0]),
    )
    def setup(
        self,
        ordering: Ordering,
        null_keys: str,
        max_attempts: int | None,
        on_exhausted: str,
        dead_letters: bool,
        follow_on: int,
    ) -> None:
        self.ordering = ordering
        self.null_keys = null_keys
        self.core = WorkCore(
            ordering,
            null_keys=null_keys,
            failures=WatchedPolicy(
                max_attempts=max_attempts,
                retry_delay=lambda attempt, error: 0.5 * attempt,
                on_exhausted=on_exhausted,
                dead_letters=dead_letters,
            ),
            buffer_limit=40,
            map_limit=200,
            follow_on=follow_on,
        )
        self.now = 0.0
        self.records: dict[tuple[str, int], dict[int, bytes | None]] = {}  # registered
        self.complete_offsets: dict[tuple[str, int], set[int]] = {}
        self.next_offset: dict[tuple[str, int], int] = {}
        self.given_back: dict[tuple[str, int], dict[int, bytes | None]] = {}  # to fetch again
        self.last_commit: dict[tuple[str, int], int] = {}
        self.items: dict[int, Item] = {}
        self.stopped: set[int] = set()  # items whose worker reached a revoked partition's record
        self.dead_letters: list = []
        self.stuck: list = []
        for p in range(2):
            self.assign((TOPIC, p), committed=None)

    def assign(
        self, tp: tuple[str, int], committed: int | None, completed: frozenset[int] = frozenset()
    ) -> None:
        ranges = [(o, o + 1) for o in sorted(completed)]
        self.core.assign(tp, committed, ranges, now=self.now)
        self.core.partitions[tp].cut_at = 2  # the done prefix is cut off all the time
        self.records[tp] = {}
        self.given_back.pop(tp, None)
        self.complete_offsets[tp] = set(completed)
        self.next_offset.setdefault(tp, 0)
        if committed is not None:
            self.next_offset[tp] = committed
            self.last_commit[tp] = committed
        else:
            self.last_commit.pop(tp, None)

    def shard_of(self, tp: tuple[str, int], offset: int) -> object:
        if self.ordering is not Ordering.KEY:
            return tp
        key = self.records[tp][offset]
        if key is None and self.null_keys == "unordered":
            return (tp, None, offset)
        return (tp, key)

    # ---- rules --------------------------------------------------------------------------

    @rule(
        partition=st.integers(0, 1),
        keys=st.lists(st.sampled_from([b"a", b"b", b"c", None]), min_size=1, max_size=6),
        gap=st.integers(0, 2),
        other_keys=st.lists(st.sampled_from([b"a", b"b", None]), max_size=3),
        seen_again=st.integers(0, 2),
    )
    def fetch(
        self,
        partition: int,
        keys: list[bytes | None],
        gap: int,
        other_keys: list[bytes | None],
        seen_again: int,
    ) -> None:
        """One fetch: a run of records of one partition, maybe after a run of the other
        partition's; the records given back come first, and records seen before (fetched
        again after them: ignored) may follow."""
        tp = (TOPIC, partition)
        if not self.fetching(tp):
            return
        messages = []
        other = (TOPIC, 1 - partition)
        if other_keys and self.fetching(other):
            messages += self.given_back_messages(other)
            messages += self.new_messages(other, other_keys, 0)
        messages += self.given_back_messages(tp)
        seen = sorted(self.records[tp])[-seen_again:] if seen_again else []
        messages += [Message(tp, offset, self.records[tp][offset]) for offset in seen]
        messages += self.new_messages(tp, keys, gap)
        self.add(messages)

    def fetching(self, tp: tuple[str, int]) -> bool:
        """Whether records of ``tp`` are fetched (it is assigned and not revoked)."""
        part = self.core.partitions.get(tp)
        return part is not None and not part.revoked

    def new_messages(
        self, tp: tuple[str, int], keys: list[bytes | None], gap: int
    ) -> list[Message]:
        offset = self.next_offset[tp] + gap  # offsets need not be contiguous
        messages = []
        for key in keys:
            self.records[tp][offset] = key
            messages.append(Message(tp, offset, key))
            offset += 1
        self.next_offset[tp] = offset
        return messages

    @precondition(lambda self: self.items)
    @rule(data=st.data())
    def fetch_for_a_running_shard(self, data: st.DataObject) -> None:
        """A record arrives for a shard whose item runs (it may join that item)."""
        item = self.items[data.draw(st.sampled_from(sorted(self.items)))]
        entry = item.entries[-1]
        tp = entry.tp
        if entry.part.dead or not self.fetching(tp) or tp in self.given_back:
            return
        key = self.records[tp][entry.offset]
        offset = self.next_offset[tp]
        self.records[tp][offset] = key
        self.add([Message(tp, offset, key)])
        self.next_offset[tp] = offset + 1

    def add(self, messages: list[Message]) -> None:
        """Register a fetch; a record that joins a running item must be allowed to start
        there: its gate released it and it runs after its shard's earlier records."""
        lengths = {item_id: len(item.entries) for item_id, item in self.items.items()}
        self.core.add_messages(messages, self.now)
        fetched = {(m.tp, m.offset_) for m in messages}
        joined = set()
        for item_id, item in self.items.items():
            for index in range(lengths[item_id], len(item.entries)):
                entry = item.entries[index]
                where = (entry.tp, entry.offset)
                assert where in fetched and where not in joined, "an item took a record twice"
                joined.add(where)
                limit = self.core.partitions[entry.tp].release_limit()  # watermark or map cap
                assert limit is None or entry.offset < limit, "joined beyond the release limit"
                shard = self.shard_of(entry.tp, entry.offset)
                earlier = [e for e in item.entries[:index] if not e.part.dead]  # (others gone)
                assert any(self.shard_of(e.tp, e.offset) == shard for e in earlier), (
                    "a record joined an item that does not run its shard"
                )

    def given_back_messages(self, tp: tuple[str, int]) -> list[Message]:
        """The fetch after a seek back: the records given back come first, in order."""
        again = self.given_back.pop(tp, {})
        self.records[tp].update(again)
        return [Message(tp, offset, key) for offset, key in sorted(again.items())]

    @rule(partition=st.integers(0, 1), keep=st.integers(0, 8))
    def give_back(self, partition: int, keep: int) -> None:
        """The shell sought back: the newest unstarted records are forgotten."""
        tp = (TOPIC, partition)
        part = self.core.partitions.get(tp)
        if part is None or part.revoked or tp in self.given_back:
            return
        offset = part.unstarted_tail(keep)
        if offset is None:
            return
        gone = sorted(o for o in self.records[tp] if o >= offset)
        running = {e.offset for item in self.items.values() for e in item.entries if e.part is part}
        queued = {e.offset: e for shard in part.shards.values() for e in shard.queue}
        for o in gone:
            assert o not in self.complete_offsets[tp], f"{o} is given back but was completed"
            assert o not in running, f"{o} is given back while it runs"
            assert o in queued and queued[o].attempts == 0, f"{o} is given back but started"
        assert part.held - len(gone) >= keep
        assert self.core.give_back(tp, offset) == len(gone)
        self.given_back[tp] = {o: self.records[tp].pop(o) for o in gone}

    @rule(
        slots=st.integers(1, 4),
        records=st.integers(1, 4),
        run=st.integers(1, 4),
        shards=st.integers(1, 4),
    )
    def take(self, slots: int, records: int, run: int, shards: int) -> None:
        # The shell only takes work when the core says some is ready: that must be true
        # whenever take() would find something (parked retries that are due included).
        shape = ItemShape(records, run, shards)
        if not self.core.has_ready(self.now):
            assert self.core.take(self.now, slots, shape) == []
            return
        for item in self.core.take(self.now, slots, shape):
            self.items[item.id] = item
            for entry in item.entries:
                limit = self.core.partitions[entry.tp].release_limit()  # watermark or map cap
                assert limit is None or entry.offset < limit, "started beyond the release limit"

    def check_may_start(self, entry, finished_before: frozenset[int] = frozenset()) -> None:
        """``finished_before``: offsets that ran earlier in the same item."""
        if entry.part.dead or self.ordering is Ordering.UNORDERED:
            return
        shard = self.shard_of(entry.tp, entry.offset)
        earlier = [
            o
            for o in self.records[entry.tp]
            if o < entry.offset
            and self.shard_of(entry.tp, o) == shard
            and o not in self.complete_offsets[entry.tp]
            and o not in self.given_up(entry.tp)
            and o not in finished_before
        ]
        assert not earlier, f"{entry} started before {earlier} of its shard completed"

    @precondition(lambda self: self.items)
    @rule(data=st.data())
    def report_progress(self, data: st.DataObject) -> None:
        """A worker finishes the next records of a long item; the core may collect them."""
        item_id = data.draw(st.sampled_from(sorted(self.items)))
        item = self.items[item_id]
        remaining = len(item.entries) - item.finished
        if remaining < 2 or item_id in self.stopped:
            return
        count = data.draw(st.integers(1, remaining - 1))
        for i in range(item.finished, item.finished + count):
            if item.entries[i].part.revoked:  # not started: what it counts as finished ends
                self.stopped.add(item_id)
                count = i - item.finished
                break
            ran = frozenset(e.offset for e in item.entries[:i])
            self.check_may_start(item.entries[i], ran)
        item.finished += count
        if data.draw(st.booleans()):
            self.collect()

    def collect(self) -> None:
        """What the engine does before every commit: apply finished records of running items."""
        self.core.collect_progress(self.now)
        for item in self.items.values():
            for entry in item.entries[: item.reported]:
                if not entry.part.dead:
                    self.complete_offsets[entry.tp].add(entry.offset)

    @precondition(lambda self: self.items)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        item_id = data.draw(st.sampled_from(sorted(self.items)))
        item = self.items.pop(item_id)
        self.stopped.discard(item_id)
        results: list = [None] * item.finished  # succeeded earlier (see report_progress)
        for entry in item.entries[: item.finished]:
            if not entry.part.dead:
                self.complete_offsets[entry.tp].add(entry.offset)
        failed_shards: set[object] = set()
        # Records that joined after the worker's last look get no result (not started).
        seen = data.draw(st.integers(item.finished, len(item.entries)))
        for entry in item.entries[item.finished : seen]:
            current = not entry.part.dead
            shard = self.shard_of(entry.tp, entry.offset) if current else None
            if current and shard in failed_shards and self.ordering is not Ordering.UNORDERED:
                results.append(NOT_STARTED)  # the worker stops a shard's run after a failure
                continue
            if current and entry.part.revoked:
                results.append(NOT_STARTED)  # its partition's next owner runs it
                continue
            self.check_may_start(entry)
            outcome = data.draw(st.sampled_from(["ok", "ok", "retry", "terminal"]))
            if outcome == "ok":
                results.append(None)
                if current:
                    self.complete_offsets[entry.tp].add(entry.offset)
            else:
                results.append(
                    TerminalError("no") if outcome == "terminal" else RuntimeError("again")
                )
                if shard is not None:
                    failed_shards.add(shard)
        outcome = self.core.complete(item_id, results, self.now)
        self.dead_letters.extend(outcome.dead_letters)
        self.stuck.extend(outcome.stuck)
        self._record_skips()

    def given_up(self, tp: tuple[str, int]) -> set[int]:
        return {e.offset for e in self.dead_letters if e.tp == tp}

    def _record_skips(self) -> None:
        """Records the policy skipped (exhausted with ``on_exhausted="skip"``) are complete."""
        skipped = self.core.failures.skipped
        for entry in skipped:
            if self.core.partitions.get(entry.tp) is entry.part:  # (not of a dropped one)
                self.complete_offsets[entry.tp].add(entry.offset)
        skipped.clear()

    @precondition(lambda self: self.dead_letters)
    @rule()
    def acknowledge_dead_letter(self) -> None:
        entry = self.dead_letters.pop(0)
        self.core.dead_lettered(entry, self.now)
        if not entry.part.dead:
            self.complete_offsets[entry.tp].add(entry.offset)

    @rule(seconds=st.floats(0.1, 3.0))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @rule(partition=st.integers(0, 1), limit=st.one_of(st.none(), st.integers(0, 40)))
    def gate(self, partition: int, limit: int | None) -> None:
        self.core.set_limit((TOPIC, partition), limit)

    @rule()
    def commit(self) -> None:
        self.collect()
        self.core.refresh_offset_maps()
        commits = self.core.commit_points()
        self.core.commits_sent(commits)
        assert self.core.commit_points() == [], "a query changed what it answers"
        for commit in commits:
            registered = self.records[commit.tp]
            incomplete = [
                o
                for o in registered
                if o not in self.complete_offsets[commit.tp] and o not in self.given_up(commit.tp)
            ]
            assert all(commit.offset <= o for o in incomplete), (
                f"commit {commit} passes {incomplete}"
            )
            previous = self.last_commit.get(commit.tp)
            assert previous is None or commit.offset >= previous, "commit went backwards"
            self.last_commit[commit.tp] = commit.offset
            if commit.metadata:
                base, completed = decode_offset_map(commit.metadata)
                assert base == commit.offset
                assert completed <= self.complete_offsets[commit.tp] | self.given_up(commit.tp)

    @rule(partition=st.integers(0, 1))
    def revoke(self, partition: int) -> None:
        """A rebalance begins: nothing more of the partition starts, and its records waiting
        in the workers' queue come back not started; results, commits and every other rule
        go on until ``rebalance`` drops it."""
        tp = (TOPIC, partition)
        if self.fetching(tp):
            self.core.revoke([tp])

    @rule(partition=st.integers(0, 1))
    def rebalance(self, partition: int) -> None:
        """Revoke (committing what completed) and assign again, as after a restart."""
        tp = (TOPIC, partition)
        if tp not in self.core.partitions:
            return
        self.core.revoke([tp])
        self.collect()
        self.core.refresh_offset_maps()
        final = self.core.commit_points([tp])
        self.core.commits_sent(final)
        committed = final[0].offset if final else self.last_commit.get(tp)
        completed: frozenset[int] = frozenset()
        metadata = final[0].metadata if final else self.core.partitions[tp].sent[1]
        if metadata:
            _, completed = decode_offset_map(metadata)
            assert read_offset_map(metadata)[1] == [(o, o + 1) for o in sorted(completed)] or (
                {o for a, b in read_offset_map(metadata)[1] for o in range(a, b)} == completed
            )
        self.core.drop([tp])
        self.dead_letters = [e for e in self.dead_letters if e.tp != tp]
        self.stuck = [e for e in self.stuck if e.tp != tp]
        assert not any(shard.part.tp == tp for shard in self.core.parked()), "a timer outlived"
        self.assign(tp, committed, completed)

    # ---- invariants ---------------------------------------------------------------------

    @invariant()
    def one_owner_per_shard(self) -> None:
        if not hasattr(self, "core") or self.ordering is Ordering.UNORDERED:
            return
        owners: dict[object, int] = {}
        for item in self.items.values():
            for entry in item.entries:
                if entry.part.dead:
                    continue
                shard = self.shard_of(entry.tp, entry.offset)
                assert owners.setdefault(shard, item.id) == item.id, f"shard {shard} owned twice"
        for item in self.items.values():
            offsets_by_shard: dict[object, list[int]] = {}
            for entry in item.entries:
                if not entry.part.dead:
                    offsets_by_shard.setdefault(self.shard_of(entry.tp, entry.offset), []).append(
                        entry.offset
                    )
            for offsets in offsets_by_shard.values():
                assert offsets == sorted(offsets), "a run is out of offset order"

    @invariant()
    def held_matches_the_model(self) -> None:
        if not hasattr(self, "core"):
            return
        for tp, partition in self.core.partitions.items():
            incomplete = {o for o in self.records[tp] if o not in self.complete_offsets[tp]}
            assert partition.incomplete == len(incomplete), (tp, partition.incomplete)
            # Held: everything from the lowest incomplete on, completed beyond it included.
            low = min(incomplete, default=None)
            held = 0 if low is None else sum(1 for o in self.records[tp] if o >= low)
            assert partition.held == held, (tp, partition.held, held)

    @invariant()
    def every_shard_is_in_the_container_of_its_state(self) -> None:
        if not hasattr(self, "core"):
            return
        scheduler = self.core.scheduler
        ready = list(scheduler.ready)
        parked = self.core.parked()
        assert len(set(map(id, ready))) == len(ready), "a shard is twice in the ready queue"
        assert len(set(map(id, parked))) == len(parked), "a shard is twice in the timers"
        blocked = [s for p in self.core.partitions.values() for s in p.blocked]
        running = {id(e.shard) for item in self.core.outstanding.values() for e in item.entries}
        followed = {
            id(e.follower)
            for item in self.core.outstanding.values()
            for e in item.entries
            if e.follower is not None
        }
        every = [(p, k, s) for p in self.core.partitions.values() for k, s in p.shards.items()]
        for shard in ready + blocked:
            assert shard.part.shards.get(shard.key) is shard, f"{shard} is not in its partition"
        for part, key, shard in every:
            assert shard.part is part and shard.key == key and not part.dead, shard
            if part.revoked:  # out of scheduling: its records wait for its next assignment
                assert shard.state in (DEAD, RUNNING), shard
                continue
            state = shard.state
            assert (state == READY) == any(s is shard for s in ready), shard
            assert (state == WAITING) == any(s is shard for s in parked), shard
            assert (state == BLOCKED) == any(s is shard for s in blocked), shard
            if state in (READY, WAITING, BLOCKED, STUCK):
                assert shard.queue, f"{shard} has no records"
            if state == IDLE and self.ordering is not Ordering.UNORDERED:
                assert not shard.queue, f"{shard} is idle with records"
            if state == RUNNING:  # in an item, or owned by the item of its key's lane record
                assert id(shard) in running or id(shard) in followed, (
                    f"{shard} runs without an item"
                )
            if state == STUCK:
                assert shard.queue[0] in self.core.stuck
            assert state != DEAD
        for shard in ready + parked:
            assert not shard.part.revoked, f"{shard} of a revoked partition is scheduled"

    @invariant()
    def a_lane_holds_one_live_record_per_key(self) -> None:
        """KEY ordering: each key with a record queued or running is live once, to its record
        in the lane (queued there or running, the only one of its key) or to its shard; a
        lane record's key has a shard only while the record runs (owned by its item)."""
        if not hasattr(self, "core") or self.ordering is not Ordering.KEY:
            return
        in_flight = {id(e) for item in self.core.outstanding.values() for e in item.entries}
        for part in self.core.partitions.values():
            lane, live = part.lane, part.live_keys
            assert lane is not None and part.shards.get(lane.key) is lane
            queued = [e for e in lane.queue if e.shard is lane]
            running = [
                e
                for item in self.core.outstanding.values()
                for e in item.entries
                if e.part is part and e.shard is lane
            ]
            for entry in queued:
                assert live.get(entry.key) is entry and entry.follower is None, f"{entry} queued"
            for entry in running:
                if entry.follower is None:
                    assert live.get(entry.key) is entry, f"{entry} runs, not listed"
                else:
                    assert entry.follower.state == RUNNING, f"{entry.follower} not owned"
                    assert live.get(entry.key) is entry.follower, f"{entry}: not its key's shard"
            for key, shard in part.shards.items():
                assert shard is lane or live.get(key) is shard, f"{shard} is not its key's"
            for key, record in live.items():
                if isinstance(record, Shard):
                    assert part.shards.get(key) is record, f"{record} is not its partition's"
                else:
                    assert record.shard is lane and record.key == key, record
                    assert record in queued or id(record) in in_flight, f"{record} is nowhere"

    @invariant()
    def stuck_records_are_never_committed_past(self) -> None:
        if not hasattr(self, "core"):
            return
        for entry in self.stuck:
            part = self.core.partitions.get(entry.tp)
            if part is not None and part is entry.part:
                committable = part.committable()
                assert committable is not None and committable <= entry.offset

    def teardown(self) -> None:
        """Liveness: with the limits lifted and every handler succeeding, all completes."""
        if not hasattr(self, "core"):
            return
        for tp, part in list(self.core.partitions.items()):
            if part.revoked:
                self.rebalance(tp[1])  # its next assignment runs what it held
        for tp in list(self.core.partitions):
            self.core.set_limit(tp, None)
        for entry in self.dead_letters:
            self.core.dead_lettered(entry, self.now)
        if self.core.stuck:
            return  # held for good by design: liveness is about everything else
        for tp in list(self.given_back):
            self.add(self.given_back_messages(tp))
        for item_id in list(self.items):
            item = self.items.pop(item_id)
            self.core.complete(item_id, [None] * len(item.entries), self.now)
        for _ in range(500):
            self.now += 100.0
            items = self.core.take(self.now, 10, ItemShape(4, 4, 4))
            if not items and not self.core.dead_letter_pending:
                break
            for item in items:
                self.core.complete(item.id, [None] * len(item.entries), self.now)
            for entry in list(self.core.dead_letter_pending):
                self.core.dead_lettered(entry, self.now)
        for tp, partition in self.core.partitions.items():
            assert partition.held == 0, f"{tp} still holds {partition.held} records"
            committed = partition.committable()
            if committed is None or not self.records[tp]:
                continue
            # Past the last record, and past the offsets completed before a rebalance that
            # follow it (the map restored says so: not fetched again, they are not records).
            expected = max(self.records[tp]) + 1
            while expected in self.complete_offsets[tp]:
                expected += 1
            assert committed == expected


CoreMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestCore = CoreMachine.TestCase


class WindowMachine(RuleBasedStateMachine):
    """A partition's completion window against a plain model (a dict of offset -> done):
    offsets registered in fetch-sized runs with gaps between them, completed in any order in
    runs of any size, the newest unstarted ones forgotten (given back); enough records that
    the done prefix is cut off many times."""

    def __init__(self) -> None:
        super().__init__()
        self.part = PartitionState((TOPIC, 0), 7, [], Counts(), 0.0)
        self.part.cut_at = 16  # cut off often (1,024 by default)
        self.model: dict[int, bool] = {}  # registered offset -> done
        self.seqs: dict[int, int] = {}  # registered offset -> its sequence number
        self.next_offset = 7
        self.highest = -1  # the highest offset the fetches have passed

    @rule(count=st.integers(1, 100), gap=st.integers(0, 3), gaps_inside=st.booleans())
    def register(self, count: int, gap: int, gaps_inside: bool) -> None:
        start = self.next_offset + gap
        step = 2 if gaps_inside else 1
        offsets = list(range(start, start + count * step, step))
        first = self.part.register(offsets, 0.0)
        for i, offset in enumerate(offsets):
            self.model[offset] = False
            self.seqs[offset] = first + i
        self.next_offset = offsets[-1] + 1
        self.highest = offsets[-1]

    @rule(rng=st.randoms(use_true_random=False), share=st.floats(0.0, 1.0), oldest=st.booleans())
    def complete(self, rng: random.Random, share: float, oldest: bool) -> None:
        open_ = [o for o, done in self.model.items() if not done]
        if not open_:
            return
        count = max(1, int(len(open_) * share))
        chosen = open_[:count] if oldest else rng.sample(open_, count)
        for offset in chosen:
            self.part.finish(self.seqs[offset])
            self.model[offset] = True
        self.part.finish(self.seqs[chosen[0]])  # a second report of a record changes nothing
        self.part.advance(1.0)

    @rule(keep=st.integers(0, 50))
    def forget_newest(self, keep: int) -> None:
        """Give back the newest incomplete records, leaving ``keep`` held at least."""
        held = self.held()
        tail = []
        for offset in reversed(held):
            if self.model[offset] or len(held) - len(tail) <= keep:
                break
            tail.append(offset)
        if not tail:
            return
        self.part.forget_from(tail[-1])
        for offset in tail:
            del self.model[offset], self.seqs[offset]
        self.next_offset = tail[-1]
        self.highest = tail[-1] - 1  # fetched again from there

    def held(self) -> list[int]:
        open_ = [o for o, done in self.model.items() if not done]
        if not open_:
            return []
        lowest = min(open_)
        return [o for o in self.model if o >= lowest]

    @invariant()
    def the_window_agrees_with_the_model(self) -> None:
        part, held = self.part, self.held()
        assert part.held_offsets() == held
        assert part.held == len(held)
        assert part.completed_beyond_head() == [o for o in held if self.model[o]]
        assert part.incomplete == sum(1 for o in held if not self.model[o])
        lowest = held[0] if held else None
        assert part.lowest_incomplete() == lowest
        passed = self.highest + 1 if self.highest >= 0 else 7
        assert part.committable() == (lowest if lowest is not None else passed)
        assert part.highest == self.highest
        part.limit = held[len(held) // 2] if held else None
        assert part.gate_held() == sum(
            1 for o in held if not self.model[o] and part.limit is not None and o >= part.limit
        )

    def teardown(self) -> None:
        while self.part.held:  # everything completes: nothing is held, and the offset passed
            self.complete(random.Random(0), 0.5, False)
            self.the_window_agrees_with_the_model()
        event("the done prefix was cut off" if self.part.base else "nothing cut off")
        if self.highest >= 0:
            assert self.part.committable() == self.highest + 1


WindowMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestWindow = WindowMachine.TestCase


@pytest.mark.parametrize("holds_back", ["watermark", "offset map cap"])
def test_a_record_joins_a_running_item_only_below_its_release_limit(holds_back: str) -> None:
    """The join of a running shard's next record follows the same release limit as take():
    the gate's watermark, or the end of an offset map near its size limit."""
    core = WorkCore(Ordering.KEY, follow_on=8)
    tp = (TOPIC, 0)
    core.assign(tp, None)
    core.add_messages([Message(tp, 0, b"a")], 0.0)
    [item] = core.take(0.0, 1, ItemShape(8, 8, 8))
    if holds_back == "watermark":
        core.set_limit(tp, 2)
    else:
        core.partitions[tp].map_cap = 1  # records beyond offset 1 wait for the map
    core.add_messages([Message(tp, 1, b"a"), Message(tp, 2, b"a")], 0.0)
    assert [e.offset for e in item.entries] == [0, 1]
    core.complete(item.id, [None, None], 0.0)
    assert core.take(0.0, 1, ItemShape(8, 8, 8)) == []  # offset 2 waits in its shard


def test_distinct_keys_run_side_by_side_from_the_lane_and_a_key_keeps_its_order() -> None:
    """KEY ordering: records whose key has nothing queued or running share the partition's
    lane (a batch takes many of them at once); the next record of a key that runs from the
    lane waits for it, and a key's records that arrive together stay in one shard."""
    core = WorkCore(Ordering.KEY)
    tp = (TOPIC, 0)
    core.assign(tp, None)
    batch = ItemShape(8, 1, 8)  # a batch: one record per shard
    core.add_messages([Message(tp, 0, b"a"), Message(tp, 1, b"b"), Message(tp, 2, b"c")], 0.0)
    [item] = core.take(0.0, 4, batch)
    assert [e.offset for e in item.entries] == [0, 1, 2]
    core.add_messages([Message(tp, 3, b"a"), Message(tp, 4, b"x"), Message(tp, 5, b"x")], 0.0)
    [other] = core.take(0.0, 4, batch)
    assert [e.offset for e in other.entries] == [4], "a@3 waits for a@0; x@5 follows x@4"
    core.complete(other.id, [None], 0.0)
    assert [e.offset for i in core.take(0.0, 4, batch) for e in i.entries] == [5]
    core.complete(item.id, [None, RuntimeError("again"), None], 0.0)
    # b@1 failed: it is retried from a shard of its own; a@3 may go now.
    assert sorted(e.offset for i in core.take(0.0, 4, batch) for e in i.entries) == [1, 3]
    assert core.partitions[tp].committable() == 1


def test_a_failed_lane_record_stops_its_key_not_the_lane() -> None:
    """A worker running a lane's records: after one fails, the record of its key that
    joined the item is not started; records of other keys still run."""
    core = WorkCore(Ordering.KEY, follow_on=8)
    tp = (TOPIC, 0)
    core.assign(tp, None)
    core.add_messages([Message(tp, 0, b"a"), Message(tp, 1, b"b")], 0.0)
    [item] = core.take(0.0, 1, ItemShape(8, 8, 8))
    core.add_messages([Message(tp, 2, b"a")], 0.0)  # joins the item that runs a@0
    assert [e.offset for e in item.entries] == [0, 1, 2]
    ran: list[int] = []

    def handler(record: Record) -> None:
        ran.append(record.offset)
        if record.offset == 0:
            raise RuntimeError("again")

    results = Work(handler, Options(ordering=Ordering.KEY)).run(item)
    assert ran == [0, 1]
    assert [type(r).__name__ for r in results] == ["RuntimeError", "NoneType", "_NotStarted"]
    core.complete(item.id, results, 0.0)
    [again] = core.take(10.0, 1, ItemShape(8, 8, 8))
    assert [e.offset for e in again.entries] == [0, 2], "a's records, still in order"


@pytest.mark.parametrize("ordering", list(Ordering))
def test_a_fetch_mixing_topics_with_equal_partition_numbers_registers_each_record_once(
    ordering: Ordering,
) -> None:
    """A fetch is registered run by run (records of one partition in a row). Two topics'
    partitions with the same number may alternate in it; and a record of a partition no
    longer assigned is ignored without taking the records next to it along."""
    core = WorkCore(ordering)
    first, second = ("a", 0), ("b", 0)
    core.assign(first, None)
    core.assign(second, None)
    core.add_messages(
        [
            Message(("gone", 0), 0, b"k"),
            Message(first, 0, b"k"),
            Message(second, 0, b"k"),
            Message(first, 1, b"k"),
            Message(second, 1, b"j"),
            Message(second, 0, b"k"),  # seen before: ignored
        ],
        0.0,
    )
    assert core.partitions[first].held == core.partitions[second].held == 2
    taken = [
        (e.tp, e.offset) for item in core.take(0.0, 8, ItemShape(8, 8, 8)) for e in item.entries
    ]
    assert sorted(taken) == [(first, 0), (first, 1), (second, 0), (second, 1)]


class ErrorMessage(Message):
    def error(self) -> str:  # type: ignore[override]
        return "broker: offset out of range"


@pytest.mark.parametrize("ordering", list(Ordering))
@pytest.mark.parametrize("sole_topic", [None, TOPIC])
def test_a_fetch_is_registered_in_runs_and_its_errors_are_handed_back(
    ordering: Ordering, sole_topic: str | None
) -> None:
    """With one topic subscribed, the records' topics are not read (they are all of it): the
    same records register the same way. A record carrying an error is not registered and is
    returned; out-of-order offsets in a run are registered one by one, each once."""
    core = WorkCore(ordering, sole_topic=sole_topic)
    tp0, tp1 = (TOPIC, 0), (TOPIC, 1)
    core.assign(tp0, None)
    core.assign(tp1, None)
    bad = ErrorMessage(tp0, 2, b"k")
    errors = core.add_messages(
        [
            Message(tp0, 0, b"k"),
            Message(tp0, 1, b"j"),
            bad,
            Message(tp1, 5, b"k"),
            Message(tp1, 4, b"k"),  # lower than the record before it
            Message(tp1, 6, b"j"),
            Message(tp0, 1, b"j"),  # seen before: ignored
            Message(tp0, 3, b"k"),
        ],
        0.0,
    )
    assert errors == [bad]
    assert core.partitions[tp0].held_offsets() == [0, 1, 3]
    assert core.partitions[tp1].held_offsets() == [5, 6]
    taken = [
        (e.tp, e.offset) for item in core.take(0.0, 8, ItemShape(8, 8, 8)) for e in item.entries
    ]
    assert sorted(taken) == [(tp0, 0), (tp0, 1), (tp0, 3), (tp1, 5), (tp1, 6)]


@pytest.mark.parametrize("ordering", list(Ordering))
def test_a_fetch_over_restored_ranges_skips_the_records_completed_before(
    ordering: Ordering,
) -> None:
    """Offsets the restored offset map lists as completed are skipped, even in the middle
    of a fetch's run of records; the others run, and the commit goes past all of them."""
    core = WorkCore(ordering)
    tp = (TOPIC, 0)
    core.assign(tp, 0, [(1, 3), (5, 6)])
    core.add_messages([Message(tp, offset, b"k%d" % offset) for offset in range(7)], 0.0)
    assert core.partitions[tp].counts.restored_skips == 3
    items = core.take(0.0, 8, ItemShape(8, 8, 8))
    assert sorted(e.offset for item in items for e in item.entries) == [0, 3, 4, 6]
    for item in items:
        core.complete(item.id, [None] * len(item.entries), 0.0)
    assert core.partitions[tp].committable() == 7


def _topic_of(found: object) -> str | None:
    """The topic of one of the engine's objects (None for anything else)."""
    if isinstance(found, Item):
        return _topic_of(found.entries[0]) if found.entries else TOPIC
    if isinstance(found, Entry | Shard):
        found = found.part
    return found.tp[0] if isinstance(found, PartitionState) else None


@contextlib.contextmanager
def no_cycles_left() -> Iterator[None]:
    """The body runs with the collector off; then the collector must find none of the
    engine's objects of ``TOPIC`` in reference cycles (reference counting freed them all).
    (The collector is off for the whole process: in a run of the whole suite, an engine of an
    earlier test still closing on a thread of its own may leave garbage meanwhile, of its
    own topic.)"""
    gc.collect()
    gc.disable()
    try:
        yield
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds stays in gc.garbage
        gc.collect()
        ours = [o for o in gc.garbage if _topic_of(o) == TOPIC]
        assert not ours, f"{len(ours)} of the engine's objects were left in reference cycles"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.parametrize("ordering", list(Ordering))
def test_records_leave_no_reference_cycles_behind(ordering: Ordering) -> None:
    """Finished records are freed by reference counting: the collector finds nothing (a
    cycle per record made it the largest cost of a fast consumer)."""
    core = WorkCore(ordering, follow_on=8)
    tp = (TOPIC, 0)
    core.assign(tp, None)
    with no_cycles_left():
        for turn in range(20):
            base = turn * 4
            keys = [b"a", b"b", b"a", b"c"]
            core.add_messages([Message(tp, base + i, k) for i, k in enumerate(keys)], 0.0)
            for item in core.take(0.0, 4, ItemShape(8, 8, 8)):
                core.add_messages([Message(tp, base + 4, b"c")], 0.0)  # may join the item
                results = [RuntimeError("again") if turn % 5 == 0 else None] * len(item.entries)
                core.complete(item.id, results, 0.0)
        while core.partitions[tp].held:
            items = core.take(1e6, 4, ItemShape(8, 8, 8))
            for item in items:
                core.complete(item.id, [None] * len(item.entries), 1e6)


def test_an_item_completed_after_its_partition_was_dropped_leaves_no_cycle_behind() -> None:
    """A KEY item whose lane record has a follower (the next record of its key joined the
    item) completes after its partition was dropped: the links between them are let go as
    when the partition lives, so reference counting frees them."""
    core = WorkCore(Ordering.KEY, follow_on=4)
    tp = (TOPIC, 0)
    core.assign(tp, None)
    with no_cycles_left():
        core.add_messages([Message(tp, 0, b"a")], 0.0)
        (item,) = core.take(0.0, 1, ItemShape(8, 8, 8))
        core.add_messages([Message(tp, 1, b"a")], 0.0)  # follows a running record: joins it
        assert [e.offset for e in item.entries] == [0, 1]
        core.drop([tp])
        core.complete(item.id, [None, None], 0.0)
        del item


class FalsyError(Exception):
    """An error that reports its problems, with none listed: its truth value is False."""

    def __len__(self) -> int:
        return 0


@pytest.mark.parametrize("ordering", list(Ordering))
def test_a_failure_whose_exception_is_false_is_still_a_failure(ordering: Ordering) -> None:
    """A result is a success only when it is None: an exception whose truth value is False
    (a ``__len__`` of 0) must not be committed past."""
    core = WorkCore(ordering, failures=FailurePolicy(max_attempts=1, on_exhausted="skip"))
    tp = (TOPIC, 0)
    core.assign(tp, 0)
    core.add_messages([Message(tp, 0, b"a"), Message(tp, 1, b"b")], 0.0)
    (item,) = core.take(0.0, 1, ItemShape(8, 8, 8))
    core.complete(item.id, [FalsyError("bad"), None][: len(item.entries)], 0.0)
    part = core.partitions[tp]
    assert part.counts.skipped == 1 and part.counts.failed == 1


class OtherMessage(Message):
    """A message of another class (its methods are looked up anew)."""

    def key(self) -> bytes | None:
        return b"other:" + (self.key_ or b"")


@pytest.mark.parametrize("ordering", list(Ordering))
def test_a_fetch_may_mix_message_classes(ordering: Ordering) -> None:
    core = WorkCore(ordering)
    first, second = (TOPIC, 0), (TOPIC, 1)
    core.assign(first, None)
    core.assign(second, None)
    fetch = [
        Message(first, 0, b"a"),
        OtherMessage(first, 1, b"a"),
        OtherMessage(second, 0, b"b"),
        Message(second, 1, b"b"),
    ]
    assert core.add_messages(fetch, 0.0) == []
    assert [core.partitions[tp].held_offsets() for tp in (first, second)] == [[0, 1], [0, 1]]
    if ordering is Ordering.KEY:  # each class's own key() was read: no two records share one
        assert len(core.partitions[first].live_keys) == 2
    items = core.take(0.0, 8, ItemShape(8, 8, 8))
    taken = sorted((e.tp, e.offset) for item in items for e in item.entries)
    assert taken == sorted((m.tp, m.offset_) for m in fetch)


@settings(max_examples=300, deadline=None)
@given(
    committed=st.integers(0, 50),
    done=st.sets(st.integers(1, 120), max_size=40),
    fetched=st.integers(0, 130),
    processed=st.integers(0, 130),
)
def test_a_commit_never_stops_at_an_offset_the_restored_map_says_was_completed(
    committed: int, done: set[int], fetched: int, processed: int
) -> None:
    """A partition assigned with an offset map (offsets completed beyond the committed one)
    has fetched some of its records and processed the first ``processed`` of them: the
    offset it commits is never one the map says was completed, fetched or not (a committed
    offset is the next to process, its map lists only the completed offsets above it: a
    completed one there would run a second time), every offset below it is done, and the map
    it commits still names every restored offset above it."""
    completed = sorted(o for o in done if o > committed)
    ranges = [(o, o + 1) for o in completed]
    part = PartitionState((TOPIC, 0), committed, ranges, Counts(), 0.0)
    offsets = list(range(committed, committed + fetched))
    if offsets:
        first = part.register(offsets, 0.0)
        for seq, offset in enumerate(offsets, first):
            if part.take_restored(offset) or offset < committed + processed:
                part.finish(seq)
        part.advance(0.0)
    part.refresh_map(4000)
    base = part.committable()
    assert base is not None
    assert base not in completed
    below = range(committed, base)
    assert all(o in completed or o < min(committed + processed, committed + fetched) for o in below)
    text = part.offset_map(base)
    kept = set(decode_offset_map(text)[1]) if text else set()
    assert kept == {o for o in completed if o > base}
