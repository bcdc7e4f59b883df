"""A stateful, model-based test of the consumer shell: the real ``ParallelConsumer`` (its loop
turns, rebalance callbacks, commits, pauses, dead letters, gating and stopping) driven
against simulated clients that behave as librdkafka does (see ``simulated.py``).

Hypothesis interleaves records arriving (with gaps and transaction markers), eager and
cooperative rebalances, lost partitions, partitions committed further by another member
while away, failing commits, gate snapshots (newer, older, lower: while records wait in
handed-out items), handler successes, failures, cancellations and hangs, partial progress of
long items, workers that finished before a record joined their item, a handler stopping the
consumer, the user's pause and resume, time passing, dead-letter outages, and stopping and
restarting. After every step it checks:

* no record starts before its dependencies committed past it (its gate released it): when
  it is handed out, when it joins a running item, and when its worker starts it (a
  watermark may have gone down since it was handed out);
* in the ordered modes, no record runs before every earlier record of its partition (or
  key) is done or given up;
* no commit passes a record that was not done (processed, dead-lettered with an acknowledged
  copy, or skipped by the chosen policy), and offset maps only list done records;
* what librdkafka was told about fetching matches what the core believes, and a partition
  is paused only when the buffer is full or it is stalled with its share used (no stuck
  pause, no pause of a partition that flows);
* the memory bound holds: fetching stops at the buffer, and only partitions stalled beyond
  their share (counted as their share, so they cannot starve the others) let the records
  in memory exceed it, by one share at most; the offsets kept behind a failing head stay
  within the window; what the core reports as committed is what the broker has;
* the loop does not spin: a short wait is always for a record it can start then.

In the long exploration, at the end of each example, no record of its stopped consumers is
kept alive (by a failure it kept, by anything that outlives a consumer). At the end, with the gate open and every handler
succeeding, everything not held for good (a terminal failure with no dead-letter topic) is
processed and committed, up to the end of each log (past its transaction markers).
"""

from __future__ import annotations

import asyncio
import gc
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from gate._watermark import Snapshot
from sdk import Gate, Options, Ordering, RetriableError, TerminalError
from sdk._core import NOT_STARTED
from sdk._offsets import read_offset_map
from sdk._partition import PAUSED, WINDOW_SHARES
from sdk._runners import Work
from sdk._shards import Entry, Item
from tests.sdk.simulated import TP, Clock, Cluster, SimEngine, SimProducer, sim_gate

TOPIC = "t"
PARTITIONS = 3
GATE = "g"
FAILURE_POLICIES: dict[str, dict[str, Any]] = {
    # A record that fails for good has nowhere to go: it is held (stuck), never committed.
    "hold": {"max_attempts": None, "on_exhausted": "dead_letter", "dead_letter_topic": None},
    "dead_letter": {"max_attempts": 2, "on_exhausted": "dead_letter", "dead_letter_topic": "d"},
    "dead_letter_terminal": {"on_exhausted": "dead_letter", "dead_letter_topic": "d"},
    "skip": {"max_attempts": 1, "on_exhausted": "skip"},
    "skip_terminal": {"on_exhausted": "skip"},
}


class ShellMachine(RuleBasedStateMachine):
    @initialize(
        ordering=st.sampled_from(list(Ordering)),
        concurrency=st.integers(1, 4),
        buffer=st.integers(3, 12),
        failures=st.sampled_from(sorted(FAILURE_POLICIES)),
        batch=st.sampled_from([None, None, 2]),
        process_delay=st.sampled_from([0.0, 0.0, 0.3]),
        gated=st.booleans(),
        keeps_metadata=st.booleans(),
        fetch_run=st.sampled_from([1, 4]),
    )
    def setup(
        self,
        ordering: Ordering,
        concurrency: int,
        buffer: int,
        failures: str,
        batch: int | None,
        process_delay: float,
        gated: bool,
        keeps_metadata: bool,
        fetch_run: int,
    ) -> None:
        self.options = Options(
            ordering=ordering,
            max_concurrency=concurrency,
            max_buffered=buffer,
            batch_size=batch,
            process_delay=process_delay,
            retry_delay=lambda attempt, error: 0.2 * attempt,
            commit_interval=0.1,
            revoke_timeout=0.5,
            **FAILURE_POLICIES[failures],
        )
        self.clock = Clock()
        self.cluster = Cluster(TOPIC, PARTITIONS, self.clock, keeps_metadata)
        self.cluster.fetch_run = fetch_run
        self.producer = SimProducer(self.cluster)
        self.gated = gated
        self.watermarks: dict[int, int | None] = dict.fromkeys(range(PARTITIONS))
        self.version = 1
        self.done: set[tuple[TP, int]] = set()  # processed at least once, or given up rightly
        self.skipped: set[tuple[TP, int]] = set()
        self.violations: list[str] = []
        self.checked_commits = 0
        self.checked_letters = 0
        self.wait = 0.0
        self.joined = 0
        self.engine: SimEngine | None = None
        self.start_engine()

    # ---- the engine's life --------------------------------------------------------------

    def start_engine(self) -> None:
        gate = None
        if self.gated:
            gate = sim_gate(GATE)
            self.offer(gate)
        self.engine = SimEngine(
            self.cluster, self.clock, self.producer, self.options, gate, skipped=self.skipped
        )
        self.engine.runner.on_submit = self.started
        self.watch_joins(self.engine)
        self.engine.sim.rebalance("assign", [(TOPIC, p) for p in range(PARTITIONS)])
        self.turn()

    def offer(self, gate: Gate | None = None) -> None:
        gate = gate or (self.engine.gate if self.engine else None)
        if gate is None:
            return
        watermarks = {(TOPIC, p): w for p, w in self.watermarks.items()}
        snapshot = Snapshot(GATE, self.version, self.clock.now, watermarks)
        gate.view.offer(snapshot, gate.sources[0].state)

    def started(self, item: Item, entries: list[Any] | None = None) -> None:
        """The runner received an item (or records joined one): each record must be
        released by the gate."""
        gate = self.engine.gate if self.engine else None
        for entry in item.entries if entries is None else entries:
            if gate is not None and not gate.released(entry.tp[0], entry.tp[1], entry.offset):
                self.violations.append(f"{entry} started before its gate released it")

    def watch_joins(self, engine: SimEngine) -> None:
        """Records that join a running item start there: check them as they join."""
        core = engine.core
        register = engine._register

        def registered(messages: Any, now: float) -> None:
            before = {item.id: len(item.entries) for item in core.outstanding.values()}
            register(messages, now)
            for item in core.outstanding.values():
                joined = item.entries[before.get(item.id, len(item.entries)) :]
                if joined:
                    self.joined += len(joined)
                    self.started(item, joined)

        engine._register = registered  # type: ignore[method-assign]

    def turn(self) -> None:
        """One turn of the consumer's loop; its wait must not be a spin."""
        engine = self.engine
        if engine is None:
            return
        self.clock.advance(0.003)  # time passes between turns
        self.largest_share = max(getattr(self, "largest_share", 0), engine.core.share())
        wait = engine._turn()
        self.largest_share = max(self.largest_share, engine.core.share())
        if wait is None:
            engine._close()
            self.engine = None
            return
        self.wait = wait
        if wait < 0.005:
            due = engine.core.next_due()
            now = self.clock.now
            assert due is not None and due <= now + wait + 1e-9, f"short wait {wait} for nothing"
            assert engine._free_slots() > 0 and not engine.core.paused_all, (
                f"short wait {wait} for a record it cannot start"
            )
        self.check_commits()

    def check_order(self, entry: Any) -> None:
        """A worker runs ``entry``: in the ordered modes every earlier record of its shard
        (its partition, or its key) is done, or was given up (dead-lettered or skipped)."""
        if self.options.ordering is Ordering.UNORDERED or self.engine is None:
            return
        self.check_commits()  # takes in the dead letters acknowledged and the skips
        key = entry.payload.key()
        by_key = self.options.ordering is Ordering.KEY
        leaving = {(e.tp, e.offset) for e in self.engine.core.dead_letter_pending}
        waiting = [
            m.offset_
            for m in self.cluster.records(entry.tp)
            if m.offset_ < entry.offset
            and (not by_key or m.key() == key)
            and (entry.tp, m.offset_) not in self.done
            and (entry.tp, m.offset_) not in leaving
        ]
        if waiting:
            self.violations.append(f"{entry} ran before {waiting} of its shard were done")

    def check_commits(self) -> None:
        for letter in self.cluster.dead_letters[self.checked_letters :]:
            headers = dict(letter.headers())
            tp = (headers["dlt.original.topic"].decode(), int(headers["dlt.original.partition"]))
            self.done.add((tp, int(headers["dlt.original.offset"])))
        self.checked_letters = len(self.cluster.dead_letters)
        self.done |= self.skipped
        history = self.cluster.commit_history
        for tp, offset, metadata in history[self.checked_commits :]:
            below = [m.offset_ for m in self.cluster.records(tp) if m.offset_ < offset]
            missing = [o for o in below if (tp, o) not in self.done]
            assert not missing, f"commit {tp}@{offset} passes records not done: {missing}"
            assert offset <= self.cluster.end(tp), f"commit {tp}@{offset} beyond the log"
            if metadata:
                _, ranges, _ = read_offset_map(metadata)
                listed = [o for start, stop in ranges for o in range(start, stop)]
                logged = {m.offset_ for m in self.cluster.records(tp)}
                wrong = [o for o in listed if o in logged and (tp, o) not in self.done]
                assert not wrong, f"offset map of {tp}@{offset} lists records not done: {wrong}"
        self.checked_commits = len(history)

    # ---- rules --------------------------------------------------------------------------

    @rule(
        partition=st.integers(0, PARTITIONS - 1),
        keys=st.lists(st.sampled_from([b"a", b"b", b"c", None]), min_size=1, max_size=8),
        gap=st.sampled_from([0, 0, 0, 2]),
        marker=st.sampled_from([False, False, True]),
    )
    def produce(self, partition: int, keys: list[bytes | None], gap: int, marker: bool) -> None:
        """Records arrive (after a gap, and closed by a transaction marker)."""
        self.cluster.produce(partition, keys, gap, marker)
        self.turn()

    @precondition(lambda self: self.engine is not None)
    @rule(turns=st.integers(1, 3), seconds=st.sampled_from([0.0, 0.01, 0.05, 0.3, 1.0]))
    def run_loop(self, turns: int, seconds: float) -> None:
        for _ in range(turns):
            self.clock.advance(max(seconds, self.wait))
            self.turn()

    @precondition(lambda self: self.engine is not None and self.engine.runner.running)
    @rule(data=st.data())
    def finish_items(self, data: st.DataObject) -> None:
        """Workers report some items: successes, failures, a cancelled coroutine, or a
        record not started after an earlier one of its shard failed or its partition was
        revoked."""
        running = sorted(self.engine.runner.running.values(), key=lambda i: i.id)
        count = data.draw(st.integers(1, len(running)))
        # (Indices are drawn, not items: Hypothesis may keep what it draws.)
        for index in data.draw(st.permutations(range(len(running))))[:count]:
            item = running[index]
            self.finish(item, data)
        self.turn()

    def finish(self, item: Item, data: st.DataObject) -> None:
        outcomes = st.sampled_from(["ok", "ok", "retry", "terminal", "cancelled"])
        results: list[Any] = []
        failed_shards: set[object] = set()
        ordered = self.options.ordering is not Ordering.UNORDERED
        batch = self.options.batch_size is not None
        batch_outcome = data.draw(outcomes) if batch else None
        # Records that joined the item after its worker's last look get no result.
        seen = len(item.entries) if batch else data.draw(st.integers(0, len(item.entries)))
        for index, entry in enumerate(item.entries[: max(seen, item.finished)]):
            if index < item.finished:
                results.append(None)
                continue
            if ordered and failed_shards and Work.stopped(entry, failed_shards) and not batch:
                results.append(NOT_STARTED)
                continue
            if not Work.may_start(entry):  # as the runners do: revoked, or a lowered limit
                results.append(NOT_STARTED)
                continue
            self.started(item, [entry])  # the worker starts it now
            self.check_order(entry)
            outcome = batch_outcome or data.draw(outcomes)
            if outcome == "ok":
                results.append(None)
                self.done.add((entry.tp, entry.offset))
            else:
                error = {
                    "retry": RetriableError("again"),
                    "terminal": TerminalError("never"),
                    "cancelled": asyncio.CancelledError(),
                }[outcome]
                results.append(error)
                failed_shards.add(Work.stop_mark(entry))  # as the runners do
        self.engine.runner.report(item, results)

    @precondition(lambda self: self.engine is not None and self.engine.runner.running)
    @rule(data=st.data(), drain=st.booleans())
    def handler_stops_the_consumer(self, data: st.DataObject, drain: bool) -> None:
        """A handler calls ``stop()`` ("stop after this record") and returns; the consumer
        winds down (the record completed: a commit may pass it), and a new one starts."""
        engine = self.engine
        running = sorted(engine.runner.running.values(), key=lambda i: i.id)
        item = running[data.draw(st.integers(0, len(running) - 1))]
        if self.options.batch_size is not None or item.finished >= len(item.entries):
            return
        entry = item.entries[item.finished]
        if not Work.may_start(entry):
            return
        self.started(item, [entry])
        self.check_order(entry)
        engine.stop(drain=drain, timeout=1.0)  # from the handler
        item.finished += 1
        self.done.add((entry.tp, entry.offset))
        del engine, running, item, entry  # (what the check after the stop counts)
        self.wind_down()

    @precondition(lambda self: self.engine is not None and self.engine.runner.running)
    @rule(data=st.data())
    def item_progress(self, data: st.DataObject) -> None:
        """A long item's worker finished its first records (the item keeps running)."""
        runner = self.engine.runner
        running = sorted(runner.running.values(), key=lambda i: i.id)
        item = running[data.draw(st.integers(0, len(running) - 1))]
        if self.options.batch_size is not None or item.finished >= len(item.entries) - 1:
            return
        item.finished += 1
        self.done.add((item.entries[item.finished - 1].tp, item.entries[item.finished - 1].offset))
        self.turn()

    @precondition(lambda self: self.engine is not None)
    @rule(
        kind=st.sampled_from(["eager", "cooperative", "lost"]),
        keep=st.sets(st.integers(0, PARTITIONS - 1)),
        finish_first=st.booleans(),
    )
    def rebalance(self, kind: str, keep: set[int], finish_first: bool) -> None:
        """A rebalance: eager (everything revoked, ``keep`` assigned again), cooperative
        (the rest revoked, ``keep`` kept or added) or lost (the rest lost, then returned)."""
        engine = self.engine
        sim = engine.sim
        if finish_first:  # the in-flight records finish while the revoke waits
            for item in list(engine.runner.running.values()):
                for entry in item.entries:
                    self.done.add((entry.tp, entry.offset))
                engine.runner.report(item, [None] * len(item.entries))
        keep_tps = {(TOPIC, p) for p in keep}
        everything = {(TOPIC, p) for p in range(PARTITIONS)}
        if kind == "eager":
            sim.rebalance("revoke", sim.assignment)
            sim.rebalance("assign", keep_tps)
        elif kind == "cooperative":
            sim.rebalance("revoke", sim.assignment - keep_tps)
            sim.rebalance("assign", keep_tps - sim.assignment)
        else:
            sim.rebalance("lost", sim.assignment - keep_tps)
        self.turn()
        if kind == "lost":
            sim.rebalance("assign", everything - keep_tps)
            self.turn()

    @precondition(lambda self: self.engine is not None)
    @rule(partition=st.integers(0, PARTITIONS - 1), further=st.integers(0, 3))
    def another_member_moves_on(self, partition: int, further: int) -> None:
        """A partition is revoked; another member of the group processes some of it and
        commits; the partition comes back. What the consumer reports as committed is then the
        group's offset, not its own last commit."""
        engine = self.engine
        tp = (TOPIC, partition)
        if tp not in engine.sim.assignment:
            return
        engine.sim.rebalance("revoke", [tp])
        self.turn()
        if self.engine is None or tp in engine.sim.assignment:
            return
        base = self.cluster.commits.get(tp, (0, ""))[0]
        records = [m.offset_ for m in self.cluster.records(tp) if m.offset_ >= base]
        if further and records:
            processed = records[: min(further, len(records))]
            offset = processed[-1] + 1
            for done in processed:
                self.done.add((tp, done))
            self.cluster.commits[tp] = (offset, "")
            self.cluster.commit_history.append((tp, offset, ""))
        engine.sim.rebalance("assign", [tp])
        self.turn()
        if self.engine is None:
            return
        part = engine.core.partitions.get(tp)
        if part is not None and not engine.sim.commit_reports:
            assert part.committed == self.cluster.commits.get(tp, (None, ""))[0], (
                f"{tp}: the core reports {part.committed} committed, the broker has "
                f"{self.cluster.commits.get(tp)}"
            )

    @precondition(lambda self: self.engine is not None and not self.engine.sim.assignment)
    @rule()
    def assign_everything(self) -> None:
        self.engine.sim.rebalance("assign", [(TOPIC, p) for p in range(PARTITIONS)])
        self.turn()

    @precondition(lambda self: self.engine is not None)
    @rule(count=st.integers(1, 2))
    def commits_fail(self, count: int) -> None:
        self.engine.sim.fail_commits += count
        self.turn()

    @precondition(lambda self: self.gated)
    @rule(
        partition=st.integers(0, PARTITIONS - 1),
        move=st.sampled_from(["up", "up", "to_end", "down", "none"]),
        older=st.booleans(),
    )
    def gate_snapshot(self, partition: int, move: str, older: bool) -> None:
        """The gate publishes: a watermark moves up (dependencies committed), jumps to the
        end, goes down (a dependency rewound) or disappears (a group's offsets expired); or
        a stale snapshot with an older version arrives late and must be ignored."""
        if older:
            saved = dict(self.watermarks)
            self.watermarks[partition] = self.cluster.end((TOPIC, partition))
            self.version -= 1
            self.offer()
            self.version += 1
            self.watermarks = saved
            self.turn()
            return
        current = self.watermarks[partition] or 0
        end = self.cluster.end((TOPIC, partition))
        self.watermarks[partition] = {
            "up": min(end, current + 2),
            "to_end": end,
            "down": max(0, current - 3),
            "none": None,
        }[move]
        self.version += 2
        self.offer()
        self.turn()

    @precondition(lambda self: self.engine is not None)
    @rule(paused=st.booleans())
    def user_pause(self, paused: bool) -> None:
        if paused:
            self.engine.pause()
        else:
            self.engine.resume()
        self.turn()

    @precondition(lambda self: self.options.dead_letter_topic is not None)
    @rule(broken=st.booleans())
    def dead_letter_topic(self, broken: bool) -> None:
        self.producer.broken = broken
        self.turn()

    @precondition(lambda self: self.engine is not None)
    @rule(drain=st.booleans())
    def stop(self, drain: bool) -> None:
        """Stop (gracefully or at once), let the loop wind down, and start a new consumer
        of the same group (restored from its commits and offset maps)."""
        self.engine.stop(drain=drain, timeout=1.0, wait=False)
        self.wind_down()

    def wind_down(self) -> None:
        """Let a stopping consumer's loop wind down, check what it left, and start a new
        consumer of the same group (restored from its commits and offset maps)."""
        for _ in range(200):
            if self.engine is None:
                break
            self.clock.advance(0.05)
            self.turn()
        assert self.engine is None, "the consumer did not stop within its drain timeout"
        self.check_commits()
        self.start_engine()

    # ---- invariants ---------------------------------------------------------------------

    @invariant()
    def nothing_started_early(self) -> None:
        assert not getattr(self, "violations", None), self.violations

    @invariant()
    def fetching_is_what_the_core_believes_and_never_stuck(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is None:
            return
        core, sim = engine.core, engine.sim
        share = core.share()
        pressure = core.fetch_stopped or len(core.retrying) >= core.max_retrying or core.full
        now = engine._time()
        for tp in sim.assignment:
            part = core.partitions.get(tp)
            assert part is not None, f"{tp} is assigned but the core does not track it"
            paused = tp in sim.paused
            assert paused == (part.fetch == PAUSED), (
                f"{tp}: librdkafka {'pauses' if paused else 'fetches'} it, the core believes "
                f"{'paused' if part.fetch == PAUSED else 'fetching'}"
            )
            crowded_out = core.in_memory() >= core.buffer_limit and part.stalled(now)
            window_full = part.held >= WINDOW_SHARES * share
            if paused and not pressure and not crowded_out and not window_full:
                assert part.incomplete > share // 2, (
                    f"{tp} is paused with room in its share ({part.incomplete} of {share})"
                )
                assert part.incomplete >= share or part.stalled(now), (
                    f"{tp} is paused while it flows ({part.incomplete} of {share}): a pause "
                    "costs a refetch of everything librdkafka had prefetched"
                )

    @invariant()
    def memory_is_bounded(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is None:
            return
        core = engine.core
        # Fetching stops at the buffer; a partition stalled beyond its share counts as its
        # share (so it cannot starve the others), which may let the records in memory (the
        # incomplete ones) exceed the buffer by one share, never more. A partition's
        # completed records beyond its head keep only their offsets, within its window (a
        # partition pauses when its window reaches WINDOW_SHARES shares; what it had
        # fetched by then may still complete). (A share is the buffer over the assigned
        # partitions: the largest one seen counts, since records fetched under it stay after
        # a rebalance shrinks it.)
        limit = core.buffer_limit
        self.largest_share = max(getattr(self, "largest_share", 0), core.share())
        bound = limit + self.largest_share
        in_memory = sum(part.incomplete for part in core.partitions.values())
        assert in_memory <= bound, (
            f"{in_memory} records in memory with a buffer of {limit} and shares of "
            f"{self.largest_share}"
        )
        window = WINDOW_SHARES * self.largest_share + bound
        for tp, part in core.partitions.items():
            assert part.incomplete <= bound, f"{tp} holds {part.incomplete}, beyond {bound}"
            assert part.held <= window, f"{tp}'s window holds {part.held}, beyond {window}"
            assert set(part.completed_beyond_head()) <= set(part.held_offsets()), (
                "a completed offset outside the held ones"
            )

    def teardown(self) -> None:
        """Liveness: with the gate open, handlers succeeding, the dead-letter topic up and
        the consumer resumed, everything not held for good is processed and committed, up to
        the end of each log (past a final transaction marker too)."""
        engine = getattr(self, "engine", None)
        if engine is None:
            return
        self.producer.broken = False
        self.watermarks = {p: self.cluster.end((TOPIC, p)) for p in range(PARTITIONS)}
        self.version += 2
        self.offer()
        engine.resume()
        for _ in range(400):
            everything = {(TOPIC, p) for p in range(PARTITIONS)}
            if engine.sim.assignment != everything and not engine.sim.events:
                engine.sim.rebalance("assign", everything - engine.sim.assignment)
            self.clock.advance(0.5)
            self.turn()
            if self.engine is None:
                return
            self.succeed_everything_running(engine)
            self.turn()
            if not engine.core.outstanding and self.all_committed(engine):
                break
        stuck_tps = {entry.tp for entry in engine.core.stuck}
        for p in range(PARTITIONS):
            tp = (TOPIC, p)
            if tp in stuck_tps:
                stuck = min(e.offset for e in engine.core.stuck if e.tp == tp)
                assert self.cluster.commits.get(tp, (0, ""))[0] <= stuck
                continue
            end = self.cluster.end(tp)
            committed = self.cluster.commits.get(tp, (0, ""))[0]
            assert committed == end, f"{tp} stalled: committed {committed}, log ends at {end}"
        engine.stop(drain=False, wait=False)
        del engine  # (what the check below counts)
        for _ in range(20):
            if self.engine is None:
                break
            self.clock.advance(0.05)
            self.turn()
        assert self.engine is None, "the consumer did not stop"
        if self.check_kept_alive:
            self.nothing_kept_alive()

    check_kept_alive = False
    """Whether each example ends by looking for records kept alive (a scan of every object
    in the process: the long exploration does it)."""

    def nothing_kept_alive(self) -> None:
        """No record of a stopped consumer of this example is kept alive (by a failure it
        kept, by anything that outlives the consumer)."""
        gc.collect()  # (a stopped engine itself is garbage: its callbacks refer to it)
        mine = {id(m) for log in self.cluster.logs.values() for m in log}
        left = sum(1 for o in gc.get_objects() if type(o) is Entry and id(o.payload) in mine)
        assert left == 0, f"{left} records of stopped consumers are kept alive"

    def succeed_everything_running(self, engine: SimEngine) -> None:
        for item in list(engine.runner.running.values()):
            for entry in item.entries:
                self.done.add((entry.tp, entry.offset))
            engine.runner.report(item, [None] * len(item.entries))

    def all_committed(self, engine: SimEngine) -> bool:
        stuck_tps = {entry.tp for entry in engine.core.stuck}
        for p in range(PARTITIONS):
            tp = (TOPIC, p)
            logged = self.cluster.logs[tp]
            if tp in stuck_tps or not logged:
                continue
            if self.cluster.commits.get(tp, (0, ""))[0] < logged[-1].offset_ + 1:
                return False
        return True


# The normal run: a fixed seed (the same examples every run, so CI is deterministic).
TestShell = ShellMachine.TestCase
TestShell.settings = settings(
    max_examples=1000,
    stateful_step_count=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# 1,000 examples take a few minutes: more than the usual limit on a loaded machine.
TestShell.pytestmark = [pytest.mark.timeout(1200)]


class LongShellMachine(ShellMachine):
    check_kept_alive = True


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 20,000 examples of 80 steps take longer than the usual limit
class TestShellLong(LongShellMachine.TestCase):  # type: ignore[name-defined,misc]
    """Exploration (--run-slow): new random examples every run, longer interleavings, and
    failures kept in Hypothesis' example database to be replayed first next time
    (``SHELL_MACHINE_EXAMPLES`` sets how many examples)."""

    settings = settings(
        max_examples=int(os.environ.get("SHELL_MACHINE_EXAMPLES", "20000")),
        stateful_step_count=80,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
