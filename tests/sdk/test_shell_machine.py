"""A stateful, model-based test of the consumer shell: the real ``ParallelConsumer`` (its loop
turns, rebalance callbacks, commits, pauses, dead letters, gating and stopping) driven
against simulated clients that behave as librdkafka does (see ``simulated.py``).

Hypothesis interleaves records arriving (with gaps and transaction markers), eager and
cooperative rebalances, lost partitions, partitions committed further by another member
while away, failing commits, gate snapshots (newer, older, lower: while records wait in
handed-out items), handler successes, failures, cancellations and hangs, partial progress of
long items, workers that finished before a record joined their item, a handler stopping the
consumer, the user's pause and resume, time passing, dead-letter outages, stopping and
restarting, and a process dying.

Handlers return outputs (none, one or two per record, by key), which the engine's own code
produces (``SimWorker``: ``Work.emit``, ``Outputs``); in both commit modes. Hypothesis decides
when their delivery reports arrive and whether they fail, and a handler may return an output
``produce()`` refuses at once. At least once (``CommitMode.CONSUMER``), a worker waits for its
item's reports. Exactly once (``CommitMode.TRANSACTIONAL``), workers hold the transaction
lock while they run an item (a commit waits for them); every transactional call (init, begin,
send offsets, commit, abort) may fail with each of librdkafka's error classes: abortable (the
``INVALID_PRODUCER_ID_MAPPING`` of confluentinc/parallel-consumer#830), retriable (a timeout,
an outage: repeated), applied with its answer lost, fatal, and fenced with messages in flight
(the next call answered ``_CONFLICT``); another process may fence the producer (the consumer
stops with an error, making no further transactional call, and a new one starts); and a
member may lose its partitions while a worker runs one of their records, which returns its
outputs after the loss.

After every step it checks:

* no record starts before its dependencies committed past it (its gate released it): when
  it is handed out, when it joins a running item, and when its worker starts it (a
  watermark may have gone down since it was handed out);
* in the ordered modes, no record runs before every earlier record of its partition (or
  key) is done or given up;
* no commit passes a record that was not done (processed, dead-lettered with an acknowledged
  copy, or skipped by the chosen policy), and offset maps only list done records; a
  committed offset map never forgets an offset the map committed before it listed (unless
  the commit passed it);
* what librdkafka was told about fetching matches what the core believes, and a partition
  is paused only when the buffer is full or it is stalled with its share used (no stuck
  pause, no pause of a partition that flows);
* the memory bound holds: fetching stops at the buffer, and only partitions stalled beyond
  their share (counted as their share, so they cannot starve the others) let the records
  in memory exceed it, by one share at most; the offsets kept behind a failing head stay
  within the window; what the core reports as committed is what the broker has;
* the loop does not spin: a short wait is always for a record it can start then;
* at least once: no commit passes (and no offset map lists) an input unless every output of
  one of its handler calls had been acknowledged when the commit was made (or the input was
  dead-lettered or skipped); workers pause only while items wait for their outputs, and
  no item is handed out during a pause;
* exactly once: the group's commits and what a ``read_committed`` reader of the outputs sees
  agree. Every visible handler call has all its outputs visible, once. Every input below the
  committed offset or in the committed offset map has the outputs of exactly one handler
  call visible (or its dead-letter copy, once; nothing if it was skipped), and no input that
  is not committed has anything visible. Without offset maps in the commit's metadata the
  documented exception holds: an input completed beyond the committed offset has its outputs
  visible before its offset is committed, and may be processed again (written twice).

In the long exploration, at the end of each example, no record of its stopped consumers is
kept alive (by a failure it kept, by anything that outlives a consumer). At the end, with the gate open and every handler
succeeding, everything not held for good (a terminal failure with no dead-letter topic) is
processed and committed, up to the end of each log (past its transaction markers).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import Callable
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

from gate.evaluate._watermark import Snapshot
from sdk import CommitMode, Gate, Options, Ordering, Output, RetriableError, TerminalError
from sdk.consumer._loop import _IDLE_COMMIT_GAP
from sdk.consumer._transactions import TransactionError
from sdk.engine._offsets import encode_offset_map, parse_base, read_offset_map
from sdk.engine._partition import PAUSED, WINDOW_SHARES
from sdk.engine._shards import Entry, Item
from tests.sdk.simulated import (
    FAILURES,
    OUTPUT_PARTITIONS,
    TP,
    Clock,
    Cluster,
    SimEngine,
    SimProducer,
    Written,
    records_logged,
    sim_gate,
)

TOPIC = "t"
PARTITIONS = 3
GATE = "g"
OUTPUT = "out"
OUTPUTS_PER_KEY: dict[bytes | None, int] = {b"a": 1, b"b": 2, b"c": 0, None: 1}
"""How many outputs a handler returns for a record, by its key."""
Input = tuple[TP, int]
FAILURE_POLICIES: dict[str, dict[str, Any]] = {
    # A record that fails for good has nowhere to go: it is held (stuck), never committed.
    "hold": {"max_attempts": None, "on_exhausted": "dead_letter", "dead_letter_topic": None},
    "dead_letter": {"max_attempts": 2, "on_exhausted": "dead_letter", "dead_letter_topic": "d"},
    "dead_letter_terminal": {"on_exhausted": "dead_letter", "dead_letter_topic": "d"},
    "skip": {"max_attempts": 1, "on_exhausted": "skip"},
    "skip_terminal": {"on_exhausted": "skip"},
}


class LogsHoldingRecords(logging.Handler):
    """Notes the engine's log records whose arguments are records: a handler that keeps log
    records (a test's capture, an error tracker's recent history) keeps their arguments, and
    a record keeps its message and the engine's state around it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        for arg in records_logged(record):
            self.found.append(f"{record.msg!r} is given a {type(arg).__name__}")


LOGS_HOLDING_RECORDS = LogsHoldingRecords()
logging.getLogger("sdk").addHandler(LOGS_HOLDING_RECORDS)


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
        commit_mode=st.sampled_from(list(CommitMode)),
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
        commit_mode: CommitMode,
    ) -> None:
        self.options = Options(
            commit_mode=commit_mode,
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
        LOGS_HOLDING_RECORDS.found.clear()
        self.checked_commits = 0
        self.checked_letters = 0
        self.wait = 0.0
        self.joined = 0
        self.transactional = commit_mode is CommitMode.TRANSACTIONAL
        self.calls = 0  # handler calls (each call's outputs carry its number)
        self.given_up: set[Input] = set()  # dead-lettered (the copy visible) or skipped
        # What a read_committed reader of the outputs sees: per input, per handler call, the
        # position in the visible records of each of the call's outputs.
        self.visible_calls: dict[Input, dict[str, dict[int, int]]] = {}
        self.copies: dict[Input, int] = {}  # dead-letter copies visible, per input
        self.checked_visible = 0
        self.exposed: set[Input] = set()  # visible before committed (no offset maps kept)
        self.listed: dict[TP, set[int]] = {}  # what the last committed map lists, per partition
        self.outputs_checked: tuple[int, int] | None = None
        self.cluster.transactions.on_commit = self.check_transaction
        self.engine: SimEngine | None = None
        self.start_engine()

    # ---- the engine's life --------------------------------------------------------------

    def start_engine(self) -> None:
        gate = None
        if self.gated:
            gate = sim_gate(GATE)
            self.offer(gate)
        try:
            self.engine = SimEngine(
                self.cluster, self.clock, self.producer, self.options, gate, skipped=self.skipped
            )
        except TransactionError:  # initialising its producer failed for good
            if gate is not None:
                gate.stop()
            self.engine = None
            return
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

    def started(self, item: Item | None, entries: list[Any] | None = None) -> None:
        """The runner received an item (or records joined one): each record must be
        released by the gate."""
        gate = self.engine.gate if self.engine else None
        for entry in item.entries if entries is None and item is not None else entries or []:
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

    @staticmethod
    def idle_commit_due(engine: SimEngine, at: float) -> bool:
        """Whether the commit of a consumer that caught up falls due by ``at`` (a short wait
        for it is no spin: see ``ConsumerLoop._commit_due``)."""
        catching_up = engine._progressed and engine.options.commit_when_idle and engine._idle()
        return catching_up and engine._commit_at + _IDLE_COMMIT_GAP <= at + 1e-9

    def turn(self) -> None:
        """One turn of the consumer's loop; its wait must not be a spin."""
        engine = self.engine
        if engine is None:
            return
        self.clock.advance(0.003)  # time passes between turns
        self.largest_share = max(getattr(self, "largest_share", 0), engine.core.share())
        handed_out = set(engine.runner.running)
        try:
            wait = engine._turn()
        except TransactionError as exc:
            # A newer producer with its transactional.id fenced it (or initialising one
            # failed for good): the consumer stops with the error (as ``run()`` does), making
            # no further transactional call (a new producer's initialisation would fence the
            # process that took over); a new one is started by ``start_again``.
            producer = engine.output_producer
            assert producer is not None and (producer.fenced or producer.fatal is not None), exc
            calls = len(producer.calls)
            engine._error = exc
            engine._close()
            assert engine.output_producer is producer, "a fenced consumer made a new producer"
            assert producer.calls[calls:] == [], (
                f"a fenced producer was called again while closing: {producer.calls[calls:]}"
            )
            self.engine = None
            self.check_commits()
            return
        self.largest_share = max(self.largest_share, engine.core.share())
        pause = engine._outputs.pause
        if pause is not None and pause.closing:  # (at least once: see Inbox._acknowledge)
            assert engine._acknowledging, "workers pause with no output waiting"
            assert set(engine.runner.running) <= handed_out, "an item handed out in a pause"
        if wait is None:
            engine._close()
            self.engine = None
            return
        self.wait = wait
        now = self.clock.now
        if wait < 0.005 and not self.idle_commit_due(engine, now + wait):
            due = engine.core.next_due()
            assert due is not None and due <= now + wait + 1e-9, f"short wait {wait} for nothing"
            assert engine._free_slots() > 0 and not engine.core.paused_all, (
                f"short wait {wait} for a record it cannot start"
            )
        self.check_commits()

    def check_order(self, entry: Any, along: set[Input] | frozenset[Input] = frozenset()) -> None:
        """A worker runs ``entry`` (in a batch with ``along``): in the ordered modes every
        earlier record of its shard (its partition, or its key) is done, or was given up
        (dead-lettered or skipped), or runs in the same batch."""
        if self.options.ordering is Ordering.UNORDERED or self.engine is None:
            return
        self.check_commits()  # takes in the dead letters acknowledged and the skips
        key = entry.payload.key()
        by_key = self.options.ordering is Ordering.KEY
        leaving = {(e.tp, e.offset) for e in self.engine.core.dead_letter_pending}
        leaving |= self.copies_in_transaction()
        waiting = [
            m.offset_
            for m in self.cluster.records(entry.tp)
            if m.offset_ < entry.offset
            and (not by_key or m.key() == key)
            and (entry.tp, m.offset_) not in self.done
            and (entry.tp, m.offset_) not in leaving
            and (entry.tp, m.offset_) not in along
        ]
        if waiting:
            self.violations.append(f"{entry} ran before {waiting} of its shard were done")

    def check_commits(self) -> None:
        for letter in self.cluster.dead_letters[self.checked_letters :]:
            headers = dict(letter.headers())
            tp = (headers["dlt.original.topic"].decode(), int(headers["dlt.original.partition"]))
            self.done.add((tp, int(headers["dlt.original.offset"])))
            self.given_up.add((tp, int(headers["dlt.original.offset"])))
        self.checked_letters = len(self.cluster.dead_letters)
        self.done |= self.skipped
        self.given_up |= self.skipped
        self.take_in_outputs()
        history = self.cluster.commit_history
        for index in range(self.checked_commits, len(history)):
            tp, offset, metadata = history[index]
            seen = self.cluster.commit_visible[index]
            records = self.cluster.records(tp)
            below = [m for m in records if m.offset_ < offset]
            missing = [m.offset_ for m in below if (tp, m.offset_) not in self.done]
            assert not missing, f"commit {tp}@{offset} passes records not done: {missing}"
            assert offset <= self.cluster.end(tp), f"commit {tp}@{offset} beyond the log"
            unwritten = [m.offset_ for m in below if not self.outputs_written(tp, m, seen)]
            assert not unwritten, (
                f"commit {tp}@{offset} passes inputs whose outputs were not all acknowledged: "
                f"{unwritten}"
            )
            listed = set()
            if metadata:
                _, ranges, _ = read_offset_map(metadata)
                listed = {o for start, stop in ranges for o in range(start, stop)}
            before = self.listed.get(tp, set())
            forgotten = [m.offset_ for m in records if m.offset_ in before]
            forgotten = [o for o in forgotten if o >= offset and o not in listed]
            assert not forgotten, (
                f"commit {tp}@{offset}: its offset map forgets {forgotten}, completed and listed "
                "by the map committed before (they would run again)"
            )
            self.listed[tp] = listed
            if metadata:
                logged = [m for m in records if m.offset_ in listed]
                wrong = [m.offset_ for m in logged if (tp, m.offset_) not in self.done]
                assert not wrong, f"offset map of {tp}@{offset} lists records not done: {wrong}"
                unwritten = [m.offset_ for m in logged if not self.outputs_written(tp, m, seen)]
                assert not unwritten, (
                    f"offset map of {tp}@{offset} lists inputs whose outputs were not all "
                    f"acknowledged: {unwritten}"
                )
        self.checked_commits = len(history)

    # ---- outputs ------------------------------------------------------------------------

    def copies_in_transaction(self) -> set[Input]:
        """Records whose dead-letter copies are in the open transaction (done for the
        engine: the copy commits with their offsets). Until the engine ends the transaction,
        so are those whose copy failed delivery (the failure aborts it, and every record of
        it runs again, in order) and those of a transaction a newer producer with its
        ``transactional.id`` aborted (the engine, fenced, learns of it later): what it started
        meanwhile ran after them, in its own order."""
        producer = self.engine.output_producer if self.engine is not None else None
        if producer is None or producer.txn is None:
            return set()
        transactions = self.cluster.transactions
        written = [w for w, _ in producer.pending] + producer.failed_in_transaction
        written += transactions.written.get(producer.txn) or transactions.fenced_away.get(
            producer.txn, []
        )
        found = set()
        for copy in written:
            if copy.topic == self.options.dead_letter_topic and copy.txn == producer.txn:
                headers = dict(copy.headers)
                tp = (
                    headers["dlt.original.topic"].decode(),
                    int(headers["dlt.original.partition"]),
                )
                found.add((tp, int(headers["dlt.original.offset"])))
        return found

    def outputs(self, entries: list[Entry]) -> list[Output]:
        """What a handler call returns for ``entries``: its outputs say which record and
        which call they are of."""
        self.calls += 1
        return [
            Output(OUTPUT, f"{e.tp[1]}:{e.offset}:{self.calls}:{i}", key=e.payload.key())
            for e in entries
            for i in range(OUTPUTS_PER_KEY[e.payload.key()])
        ]

    def take_in_outputs(self) -> None:
        """Index the outputs (and dead-letter copies) that became visible."""
        visible = self.cluster.transactions.visible
        for position in range(self.checked_visible, len(visible)):
            written = visible[position]
            if written.topic == OUTPUT:
                assert written.value is not None
                partition, offset, call, index = written.value.decode().split(":")
                calls = self.visible_calls.setdefault(((TOPIC, int(partition)), int(offset)), {})
                indices = calls.setdefault(call, {})
                assert int(index) not in indices, f"an output written twice: {written}"
                indices[int(index)] = position
            elif written.topic == self.options.dead_letter_topic:
                headers = dict(written.headers)
                tp = (
                    headers["dlt.original.topic"].decode(),
                    int(headers["dlt.original.partition"]),
                )
                key = (tp, int(headers["dlt.original.offset"]))
                self.copies[key] = self.copies.get(key, 0) + 1
        self.checked_visible = len(visible)

    def outputs_written(self, tp: TP, message: Any, seen: int) -> bool:
        """Whether every output of one handler call for the input was visible (acknowledged,
        or committed in a transaction) among the first ``seen`` visible records, or the
        input was given up (dead-lettered or skipped)."""
        key = (tp, message.offset_)
        wanted = OUTPUTS_PER_KEY[message.key()]
        if wanted == 0 or key in self.given_up:
            return True
        for indices in self.visible_calls.get(key, {}).values():
            if len(indices) == wanted and max(indices.values()) < seen:
                return True
        return False

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
        """Workers run some items to their end: successes (with their outputs), failures, a
        cancelled coroutine, an output ``produce()`` refuses, or a record not started after
        an earlier one of its shard failed or its partition was revoked. An item whose
        outputs wait for their acknowledgements is reported once they arrive."""
        running = sorted(self.engine.runner.running.values(), key=lambda i: i.id)
        count = data.draw(st.integers(1, len(running)))
        # (Indices are drawn, not items: Hypothesis may keep what it draws.)
        for index in data.draw(st.permutations(range(len(running))))[:count]:
            item = running[index]
            self.finish(item, data)
        if data.draw(st.booleans()):  # some of their outputs' reports arrive at once
            self.deliver(data)
        self.turn()

    OUTCOMES = st.sampled_from(["ok", "ok", "retry", "terminal", "cancelled", "refused"])

    def handler(
        self,
        data: st.DataObject | None,
        outcome: str | None = None,
        meanwhile: Callable[[], None] | None = None,
    ) -> Any:
        """A handler for ``SimWorker``: checks that the records may run now, then draws what
        happens (or does ``outcome``); ``meanwhile`` happens while it runs (after it started)."""

        def handle(entries: list[Entry], argument: Any) -> Any:
            along = {(e.tp, e.offset) for e in entries} if len(entries) > 1 else frozenset()
            for entry in entries:
                self.started(None, [entry])  # the worker starts it now
                self.check_order(entry, along)
            if meanwhile is not None:
                meanwhile()
            happens = outcome or (data.draw(self.OUTCOMES) if data is not None else "ok")
            if happens == "ok":
                self.done.update((e.tp, e.offset) for e in entries)
                outputs = self.outputs(entries)
                if len(outputs) == 1 and data is not None and data.draw(st.booleans()):
                    return outputs[0]  # (one Output, not in a list)
                return outputs or None
            if happens == "refused":  # an output to a partition the topic does not have
                return [*self.outputs(entries), Output(OUTPUT, "x", partition=OUTPUT_PARTITIONS)]
            raise {
                "retry": RetriableError("again"),
                "terminal": TerminalError("never"),
                "cancelled": asyncio.CancelledError(),
            }[happens]

        return handle

    def finish(self, item: Item, data: st.DataObject | None, outcome: str | None = None) -> None:
        """A worker runs ``item`` to its end (with ``data``: the records that joined it
        after its last look may get no result) and reports it, or waits for its outputs'
        acknowledgements. In transactional mode a worker that has not started the item
        cannot while a commit closes the transaction."""
        assert self.engine is not None
        runner = self.engine.runner
        worker = runner.start(item)
        if worker is None or worker.ended:
            return
        handle = self.handler(data, outcome)
        if self.options.batch_size is not None:
            worker.run_batch(handle)
        else:
            # Records that joined the item after its worker's last look get no result.
            last = len(item.entries)
            seen = last if data is None else data.draw(st.integers(worker.looked_at, last))
            while worker.looked_at < seen:
                worker.step(handle)
        worker.ended = True
        if worker.settled:
            runner.report(item, worker.end())

    def report_settled(self) -> None:
        """Workers whose outputs were all acknowledged (or failed) report their items."""
        if self.engine is None:
            return
        runner = self.engine.runner
        for worker in list(runner.workers.values()):
            if worker.ended and worker.settled:
                runner.report(worker.item, worker.end())

    @precondition(
        lambda self: (
            self.engine is not None
            and self.engine.output_producer is not None
            and self.engine.output_producer.pending
        )
    )
    @rule(data=st.data())
    def deliveries_arrive(self, data: st.DataObject) -> None:
        """Delivery reports of the oldest outputs waiting arrive: acknowledged, or failed
        (in transactional mode, the transaction must then abort)."""
        self.deliver(data)
        self.turn()

    def deliver(self, data: st.DataObject) -> None:
        """Reports of the oldest outputs waiting arrive (if any): acknowledged or failed."""
        producer = self.engine.output_producer if self.engine is not None else None
        if producer is None or not producer.pending:
            return
        count = data.draw(st.integers(1, len(producer.pending)))
        outcomes = data.draw(
            st.lists(st.sampled_from([True, True, False]), min_size=count, max_size=count)
        )
        producer.deliver(outcomes)
        self.report_settled()

    @precondition(lambda self: self.engine is not None and self.engine.runner.running)
    @rule(data=st.data(), drain=st.booleans())
    def handler_stops_the_consumer(self, data: st.DataObject, drain: bool) -> None:
        """A handler calls ``stop()`` ("stop after this record") and returns; the consumer
        winds down (the record completed: a commit may pass it), and a new one starts."""
        engine = self.engine
        running = sorted(engine.runner.running.values(), key=lambda i: i.id)
        item = running[data.draw(st.integers(0, len(running) - 1))]
        if self.options.batch_size is not None:
            return
        worker = engine.runner.start(item)
        if worker is None or worker.ended or worker.next_entry() is None:
            return
        succeed = self.handler(data, "ok")
        stopped = []

        def stopping(entries: list[Entry], record: Any) -> Any:
            assert self.engine is not None
            self.engine.stop(drain=drain, timeout=1.0)  # from the handler
            stopped.append(True)
            return succeed(entries, record)

        worker.step(stopping)
        del engine, running, item, worker  # (what the check after the stop counts)
        if stopped:
            self.wind_down()
        else:  # the record was not started
            self.turn()

    @precondition(lambda self: self.engine is not None and self.engine.runner.running)
    @rule(data=st.data())
    def item_progress(self, data: st.DataObject) -> None:
        """A long item's worker finished its first records (the item keeps running)."""
        runner = self.engine.runner
        running = sorted(runner.running.values(), key=lambda i: i.id)
        item = running[data.draw(st.integers(0, len(running) - 1))]
        if self.options.batch_size is not None:
            return
        worker = runner.start(item)
        if worker is None or worker.ended or worker.looked_at >= len(item.entries) - 1:
            return
        worker.step(self.handler(data))
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
            self.succeed_everything_running(engine)
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
        if further:
            self.other_member_processes(tp, further)
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

    def other_member_processes(self, tp: TP, further: int) -> None:
        """Another member (the same engine) processes up to ``further`` records from the
        committed offset, skipping those the committed offset map lists, and commits with
        the offset map carried on; their outputs are visible with the commit."""
        cluster = self.cluster
        base, metadata = cluster.commits.get(tp, (0, ""))
        completed: set[int] = set()
        if metadata and parse_base(metadata) == base:
            _, ranges, _ = read_offset_map(metadata)
            completed = {o for start, stop in ranges for o in range(start, stop)}
        records = [m for m in cluster.records(tp) if m.offset_ >= base]
        processed = [m for m in records if m.offset_ not in completed][:further]
        if not processed:
            return
        done = completed | {m.offset_ for m in processed}
        offset = next((m.offset_ for m in records if m.offset_ not in done), None)
        if offset is None:
            offset = records[-1].offset_ + 1
        carried = encode_offset_map(offset, [o for o in done if o > offset]) or ""
        self.calls += 1
        for message in processed:
            self.done.add((tp, message.offset_))
            for i in range(OUTPUTS_PER_KEY[message.key()]):
                value = f"{tp[1]}:{message.offset_}:other{self.calls}:{i}".encode()
                written = Written(OUTPUT, 0, message.key(), value, [])
                cluster.transactions.visible.append(written)
        cluster.record_commit(tp, offset, carried if cluster.keeps_metadata else "")

    @precondition(lambda self: self.engine is not None and not self.engine.sim.assignment)
    @rule()
    def assign_everything(self) -> None:
        self.engine.sim.rebalance("assign", [(TOPIC, p) for p in range(PARTITIONS)])
        self.turn()

    @precondition(lambda self: self.engine is not None and not self.transactional)
    @rule(count=st.integers(1, 2))
    def commits_fail(self, count: int) -> None:
        self.engine.sim.fail_commits += count
        self.turn()

    @precondition(lambda self: self.engine is not None and self.transactional)
    @rule(
        failure=st.sampled_from(
            [(call, kind) for call, kinds in FAILURES.items() for kind in kinds]
        ),
        times=st.sampled_from([1, 1, 3]),
    )
    def transaction_call_fails(self, failure: tuple[str, str], times: int) -> None:
        """The next call of a kind (init, begin, send offsets, commit, abort) fails with one
        of librdkafka's error classes (``times`` times in a row): abortable (the broker
        forgot the producer id: ``INVALID_PRODUCER_ID_MAPPING``, as in
        confluentinc/parallel-consumer#830), retriable (a timeout: a broker outage; an
        init retried across turns), applied but its answer lost, fatal, or fenced with
        messages in flight (the next call answered ``_CONFLICT``). See ``FAILURES``."""
        call, kind = failure
        self.cluster.transactions.failures[call] = (kind, times)
        self.turn()

    @precondition(lambda self: self.engine is not None and self.engine.runner.running)
    @rule(data=st.data())
    def partitions_lost_while_a_record_runs(self, data: st.DataObject) -> None:
        """A worker has started a record (its handler runs) when the member loses its
        partitions (away longer than its session: frozen in a long handler, say); the
        handler then returns its outputs, and the member gets its partitions back."""
        engine = self.engine
        if self.options.batch_size is not None:
            return
        running = sorted(engine.runner.running.values(), key=lambda i: i.id)
        item = running[data.draw(st.integers(0, len(running) - 1))]
        worker = engine.runner.start(item)
        if worker is None or worker.ended or worker.next_entry() is None:
            return
        sim = engine.sim

        def lost() -> None:
            sim.rebalance("lost", set(sim.assignment))
            self.turn()  # (the loop serves the loss)

        # (Whether the record may start is checked when it starts, before the loss: the loss
        # forgets the dead-letter copies its partitions awaited, which let it start.)
        worker.step(self.handler(data, "ok", meanwhile=lost))
        del running, item, worker
        if self.engine is engine:
            everything = {(TOPIC, p) for p in range(PARTITIONS)}
            sim.rebalance("assign", everything - sim.assignment)
            self.turn()

    @precondition(
        lambda self: (
            self.engine is not None
            and self.transactional
            and self.engine._outputs.in_transaction > 0
        )
    )
    @rule()
    def another_process_fences_the_producer(self) -> None:
        """A newer process with the same ``transactional.id`` initialises it while the open
        transaction holds outputs: the broker aborts that transaction, and the consumer stops
        with an error at its next exchange with the broker (a new one starts later)."""
        assert self.engine.output_producer is not None
        tid = self.engine.output_producer.transactional_id
        assert tid is not None
        self.cluster.transactions.fence(tid)
        self.turn()

    @precondition(lambda self: self.engine is None)
    @rule()
    def start_again(self) -> None:
        """A consumer that stopped with an error is started again (by its supervisor)."""
        self.start_engine()

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
        self.cluster.transactions.down = {self.options.dead_letter_topic} if broken else set()
        self.turn()

    @precondition(lambda self: self.engine is not None)
    @rule()
    def crash(self) -> None:
        """The process dies: nothing is committed, closed or aborted, and outputs waiting for
        their reports are lost. A new process takes its partitions; in transactional mode
        its producer fences the dead one's, and the broker aborts its open transaction."""
        engine = self.engine
        engine.runner.close()  # (its workers die with it, and its gate's threads)
        if engine.gate is not None:
            engine.gate.stop()
        self.engine = None
        del engine
        self.start_engine()

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
    def log_records_hold_no_record(self) -> None:
        assert not LOGS_HOLDING_RECORDS.found, LOGS_HOLDING_RECORDS.found

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
            window_full = part.done_count >= WINDOW_SHARES * share
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

    def check_transaction(self) -> None:
        """A transaction committed (inside the engine's call: what is wrong is reported
        after the step)."""
        try:
            self.outputs_exactly_once()
        except AssertionError as exc:
            self.violations.append(f"after a transaction committed: {exc}")

    @invariant()
    def outputs_exactly_once(self) -> None:
        """Exactly once: the group's commits and the outputs a ``read_committed`` reader sees
        agree (see the module's docstring)."""
        if not getattr(self, "transactional", False):
            return
        self.check_commits()  # (takes in the outputs and the maps committed)
        state = (len(self.cluster.commit_history), len(self.cluster.transactions.visible))
        if state == self.outputs_checked:
            return
        self.outputs_checked = state
        strict = self.cluster.keeps_metadata
        for p in range(PARTITIONS):
            tp = (TOPIC, p)
            committed, metadata = self.cluster.commits.get(tp, (0, ""))
            completed: set[int] = set()
            if metadata and parse_base(metadata) == committed:
                _, ranges, _ = read_offset_map(metadata)
                completed = {o for start, stop in ranges for o in range(start, stop)}
            for message in self.cluster.records(tp):
                key = (tp, message.offset_)
                calls = self.visible_calls.get(key, {})
                copies = self.copies.get(key, 0)
                wanted = OUTPUTS_PER_KEY[message.key()]
                for call, indices in calls.items():
                    assert sorted(indices) == list(range(wanted)), (
                        f"{key}: handler call {call} has outputs {sorted(indices)} visible, "
                        f"of {wanted}"
                    )
                if not (message.offset_ < committed or message.offset_ in completed):
                    if calls or copies:
                        assert not strict, (
                            f"{key} is not committed (the group is at {committed}, its map lists "
                            f"{sorted(completed)}) but its outputs are visible: {sorted(calls)}"
                            f"{f', dead-letter copies {copies}' if copies else ''}"
                        )
                        self.exposed.add(key)
                    continue
                times = len(calls) + copies
                assert times <= 1 or key in self.exposed, (
                    f"{key} is committed with outputs of {sorted(calls)} and {copies} "
                    "dead-letter copies visible: more than once"
                )
                assert times >= 1 or wanted == 0 or key in self.given_up, (
                    f"{key} is committed but none of its outputs is visible"
                )

    def teardown(self) -> None:
        """Liveness: with the gate open, handlers succeeding, the dead-letter topic up and
        the consumer resumed, everything not held for good is processed and committed, up to
        the end of each log (past a final transaction marker too)."""
        if not hasattr(self, "options"):
            return
        self.cluster.transactions.failures.clear()
        if self.engine is None:  # it stopped with an error: its supervisor starts it again
            self.start_engine()
        engine = self.engine
        if engine is None:
            return
        self.producer.broken = False
        self.cluster.transactions.down = set()
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
        self.check_commits()
        self.outputs_exactly_once()
        engine.stop(drain=False, wait=False)
        del engine  # (what the check below counts)
        for _ in range(20):
            if self.engine is None:
                break
            self.clock.advance(0.05)
            self.turn()
        assert self.engine is None, "the consumer did not stop"
        self.log_records_hold_no_record()
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
        """Every item a worker can run succeeds, and their outputs are acknowledged."""
        for item in list(engine.runner.running.values()):
            self.finish(item, None, "ok")
        producer = engine.output_producer
        if producer is not None and producer.pending:
            producer.deliver([True] * len(producer.pending))
        self.report_settled()

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
