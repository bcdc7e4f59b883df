"""Combined conditions that once broke the engine, replayed on the real shell with simulated
clients (``simulated.py``): each test names the failure it guards against."""

from __future__ import annotations

import asyncio
import base64
import ctypes
import queue
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from sdk import (
    CommitMode,
    EngineError,
    Options,
    Ordering,
    Output,
    ParallelConsumer,
    RetriableError,
    TerminalError,
)
from sdk.consumer._batches import Batches
from sdk.consumer._runners import AsyncRunner, Work
from sdk.consumer._transactions import TransactionError
from sdk.engine._core import NOT_STARTED
from sdk.engine._failures import DecodeError
from sdk.engine._offsets import _varints, encode_offset_map, read_offset_map
from sdk.engine._options import OptionsError
from sdk.engine._shards import Entry, Item
from sdk.produce._producer import Outputs
from tests.sdk.simulated import (
    Clock,
    Cluster,
    SimEngine,
    SimFailure,
    SimProducer,
    offer,
    sim_gate,
)

TOPIC = "t"
TP0 = (TOPIC, 0)
OUT = "out"


class Shell:
    """An engine on simulated clients, and the few moves these tests make."""

    def __init__(
        self,
        options: Options,
        *,
        partitions: int = 1,
        gated: bool = False,
        keeps_metadata: bool = False,
        cluster: Cluster | None = None,
    ) -> None:
        self.clock = Clock() if cluster is None else cluster.clock
        self.cluster = cluster or Cluster(TOPIC, partitions, self.clock, keeps_metadata)
        self.producer = SimProducer(self.cluster)
        self.gate = sim_gate() if gated else None
        self.version = 1
        self.engine = SimEngine(self.cluster, self.clock, self.producer, options, self.gate)
        self.sim = self.engine.sim
        self.started: list[tuple[int, int]] = []  # (partition, offset) as handed to workers
        self.engine.runner.on_submit = lambda item: self.started.extend(
            (e.tp[1], e.offset) for e in item.entries
        )
        self.sim.rebalance("assign", list(self.cluster.logs))

    def open_gate(self, **watermarks: int | None) -> None:
        """``open_gate(p0=5)``: partition 0's watermark is 5 (None: nothing released)."""
        assert self.gate is not None
        self.version += 1
        marks = {(TOPIC, int(k[1:])): v for k, v in watermarks.items()}
        offer(self.gate, self.version, marks, self.clock.now)

    def turn(self, times: int = 1, seconds: float = 0.005) -> float:
        wait = 0.0
        for _ in range(times):
            self.clock.advance(seconds)
            result = self.engine._turn()
            assert result is not None, "the consumer stopped"
            wait = result
        return wait

    def running(self) -> list[Item]:
        return sorted(self.engine.runner.running.values(), key=lambda item: item.id)

    def finish(self, item: Item, results: list[Any] | None = None) -> None:
        self.engine.runner.report(item, results or [None] * len(item.entries))

    def fail(self, item: Item, error: BaseException, offsets: set[int]) -> None:
        """Report ``item`` as a worker would when the records at ``offsets`` raise ``error``:
        in the ordered modes, the rest of a failed record's shard is not started."""
        results: list[Any] = []
        failed: set[object] = set()
        ordered = self.engine.options.ordering != "unordered"
        for entry in item.entries:
            if ordered and failed and Work.stopped(entry, failed):
                results.append(NOT_STARTED)
            elif entry.offset in offsets:
                results.append(error)
                failed.add(Work.stop_mark(entry))
            else:
                results.append(None)
        self.finish(item, results)

    def finish_all(self, turns: int = 50, seconds: float = 0.05) -> None:
        """Let every started record succeed, turn after turn."""
        for _ in range(turns):
            for item in self.running():
                self.finish(item)
            self.turn(seconds=seconds)

    def committed(self, partition: int = 0) -> int | None:
        found = self.cluster.commits.get((TOPIC, partition))
        return None if found is None else found[0]

    # ---- outputs ------------------------------------------------------------------------

    def run(self, item: Item, ran: list[int] | None = None) -> None:
        """A worker runs ``item`` through the engine's own ``Work``: each record's handler
        returns one output (``"<partition>:<offset>"``); the item is reported once its
        outputs are acknowledged (at least once) or at once (exactly once)."""
        worker = self.engine.runner.start(item)
        assert worker is not None, "a commit is closing the transaction"

        def handle(entries: list[Entry], record: Any) -> Output:
            (entry,) = entries
            if ran is not None:
                ran.append(entry.offset)
            return Output(OUT, f"{entry.tp[1]}:{entry.offset}", key=entry.payload.key())

        while worker.next_entry() is not None:
            worker.step(handle)
        worker.ended = True
        if worker.settled:
            self.engine.runner.report(item, worker.end())

    def in_open_transaction(self, keys: list[bytes]) -> Any:
        """Records with ``keys`` arrive on partition 0 and run: their outputs are in the open
        transaction. Returns the producer of outputs."""
        self.cluster.produce(0, keys)
        self.turn(2)
        for item in self.running():
            self.run(item)
        self.turn()
        producer = self.engine.output_producer
        assert producer is not None
        return producer

    def run_all(self, turns: int = 50, seconds: float = 0.05, ran: list[int] | None = None) -> None:
        """Every record succeeds with its output, acknowledged, turn after turn."""
        runner = self.engine.runner
        for _ in range(turns):
            for item in self.running():
                if item.id not in runner.workers and runner.start(item) is not None:
                    self.run(item, ran)
            producer = self.engine.output_producer
            if producer is not None and producer.pending:
                producer.deliver([True] * len(producer.pending))
            for worker in list(runner.workers.values()):
                if worker.ended and worker.settled:
                    runner.report(worker.item, worker.end())
            self.turn(seconds=seconds)

    def outputs(self) -> list[str]:
        """The outputs a ``read_committed`` reader sees, in order."""
        return [
            w.value.decode()
            for w in self.cluster.transactions.visible
            if w.topic == OUT and w.value is not None
        ]


# ---- 1: a paused partition revoked and assigned again is fetched again ------------------


@pytest.mark.parametrize("rebalance", ["eager", "cooperative", "lost"])
def test_a_partition_paused_for_back_pressure_is_fetched_again_after_a_rebalance(
    rebalance: str,
) -> None:
    """Its gate is closed and its share of the buffer is full, so the partition is paused;
    a rebalance takes it away and gives it back. librdkafka keeps the application's pause
    across that: the engine must tell it to fetch again, or the partition stalls for good."""
    shell = Shell(Options(ordering=Ordering.KEY, max_buffered=4), gated=True)
    shell.cluster.produce(0, [b"k%d" % i for i in range(20)])
    shell.turn(3)
    assert TP0 in shell.sim.paused, "the full partition is paused"
    if rebalance == "eager":
        shell.sim.rebalance("revoke", [TP0])
        shell.sim.rebalance("assign", [TP0])
    elif rebalance == "cooperative":  # revoked now, returned by the next rebalance
        shell.sim.rebalance("revoke", [TP0])
        shell.turn()
        shell.sim.rebalance("assign", [TP0])
    else:
        shell.sim.rebalance("lost", [TP0])
        shell.turn()
        shell.sim.rebalance("assign", [TP0])
    shell.turn(3)
    shell.open_gate(p0=20)
    shell.finish_all()
    assert shell.committed() == 20, "the re-assigned partition was never fetched again"


# ---- 2: a record is done only when processed, dead-lettered or skipped by choice --------


def test_a_terminal_failure_with_no_dead_letter_topic_is_held_and_never_committed_past() -> None:
    shell = Shell(Options(ordering=Ordering.KEY))  # the defaults: no dead-letter topic
    shell.cluster.produce(0, [b"a", b"b", b"c", b"a"])
    shell.turn(2)
    for item in shell.running():
        shell.fail(item, TerminalError("bad"), {0})
    shell.finish_all()
    assert shell.committed() == 0, "committed past a record that was written nowhere"
    shell.turn(seconds=1.0)
    stats = shell.engine.stats()
    assert stats["stuck"] == 1
    assert stats["partitions"][TP0]["stuck"] == [(0, "TerminalError: bad")]
    assert stats["counts"][TP0]["stuck"] == 1
    assert stats["counts"][TP0]["dead_lettered"] == 0
    # The held record holds its shard (key a: offset 3 waits behind it) and nothing else.
    (stuck,) = shell.engine.core.stuck
    assert [e.offset for e in stuck.shard.queue] == [0, 3]
    assert shell.engine.core.partitions[TP0].completed_beyond_head() == [1, 2]


def test_exhausted_attempts_with_no_dead_letter_topic_hold_the_record_too() -> None:
    with pytest.raises(OptionsError):  # asking to dead-letter needs a topic
        Options(max_attempts=2)
    shell = Shell(Options(max_attempts=2, on_exhausted="skip"))
    shell.cluster.produce(0, [b"a"])
    shell.turn(2)
    shell.fail(shell.running()[0], RetriableError("again"), {0})
    shell.turn(2, seconds=60)
    shell.fail(shell.running()[0], RetriableError("again"), {0})
    shell.finish_all()
    assert shell.committed() == 1  # skipped, as chosen
    assert shell.engine.core.counts[TP0].skipped == 1


def test_undecodable_records_reach_the_dead_letter_topic_when_exhausted_ones_are_skipped() -> None:
    shell = Shell(
        Options(on_decode_error="dead_letter", on_exhausted="skip", dead_letter_topic="dlt")
    )
    shell.cluster.produce(0, [b"a", b"b"])
    shell.turn(2)
    for item in shell.running():
        shell.fail(item, DecodeError("value: bad"), {0})
    shell.finish_all()
    assert [dict(m.headers())["dlt.original.offset"] for m in shell.cluster.dead_letters] == [b"0"]
    assert shell.committed() == 2
    assert shell.engine.core.counts[TP0].skipped == 0


# ---- 3: a coroutine raising CancelledError is a failure, not a lost item ----------------


def test_a_cancelled_error_from_a_coroutine_handler_is_reported_as_a_failure() -> None:
    async def handler(record: Any) -> None:
        raise asyncio.CancelledError()  # e.g. a timeout the handler let escape

    inbox: queue.SimpleQueue = queue.SimpleQueue()
    runner = AsyncRunner(Work(handler, Options()), 4, inbox)
    try:
        runner.submit(Item(1, [_entry(7)]))
        (done,) = _reports(inbox)
        assert done[1] == 1, "the item was never reported: its shard would wait for good"
        assert isinstance(done[2][0], asyncio.CancelledError)
    finally:
        runner.close()


def test_a_closing_async_runner_still_reports_every_item() -> None:
    async def handler(record: Any) -> None:
        await asyncio.sleep(3600)

    inbox: queue.SimpleQueue = queue.SimpleQueue()
    runner = AsyncRunner(Work(handler, Options()), 2, inbox)
    runner.submit(Item(1, [_entry(1), _entry(2)]))
    runner.close(wait=1.0)
    (done,) = _reports(inbox)
    assert done[1] == 1 and done[2] == []  # no results: the core counts them as not started


def _reports(inbox: queue.SimpleQueue) -> list[tuple[Any, ...]]:  # type: ignore[type-arg]
    message = inbox.get(timeout=10)
    return list(message[1]) if message[0] == "done_many" else [message]


def _run_in_coroutines(work: Work, item: Item) -> list[Any]:
    """The results of ``item`` run by an ``AsyncRunner`` (a coroutine handler's runner)."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()  # type: ignore[type-arg]
    runner = AsyncRunner(work, 4, inbox)
    try:
        runner.submit(item)
        (done,) = _reports(inbox)
        return done[2]  # type: ignore[no-any-return]
    finally:
        runner.close()


def test_a_cancelled_record_in_the_shell_is_retried_and_its_commit_moves_on() -> None:
    shell = Shell(Options(ordering=Ordering.PARTITION, retry_delay=lambda a, e: 0.0))
    shell.cluster.produce(0, [b"a", b"a", b"a"])
    shell.turn(2)
    shell.fail(shell.running()[0], asyncio.CancelledError(), {0})
    shell.finish_all()
    assert shell.committed() == 3
    assert shell.engine.core.counts[TP0].retried == 1


# ---- 4: completed offsets behind a poison head are bounded --------------------------------


def test_a_partition_that_fills_the_buffer_is_not_paused_for_its_window_while_it_flows() -> None:
    """One partition's records fill the buffer (librdkafka hands a partition's fetched records
    over in bulk) and its head's item runs longest while the rest complete. Its window counts
    the offsets completed behind that head, not its incomplete records (the buffer bounds
    those): it keeps fetching until the completed ones alone reach ``WINDOW_SHARES`` shares.
    (A pause throws away what librdkafka had prefetched for it.)"""
    from sdk.engine._partition import WINDOW_SHARES

    shell = Shell(
        Options(ordering=Ordering.KEY, max_buffered=64, max_item_records=1, commit_interval=60),
        partitions=16,
    )
    shell.turn()
    share = shell.engine.core.share()  # (the buffer over the 16 partitions assigned)
    window = WINDOW_SHARES * share
    shell.cluster.produce(0, [b"k%d" % i for i in range(4 * window)])
    part = shell.engine.core.partitions[TP0]
    crowded_and_flowing = False
    for _ in range(400):
        for item in shell.running():
            if item.entries[0].offset != 0:  # the head's item runs on
                shell.finish(item)
        shell.turn(seconds=0.01)
        paused = TP0 in shell.sim.paused
        assert not paused or part.done_count >= window, (
            f"paused with {part.done_count} completed behind its head and "
            f"{part.incomplete} incomplete: its window is {window} completed offsets"
        )
        crowded_and_flowing |= not paused and part.held >= window
    assert crowded_and_flowing, "the partition never held a window's worth while fetching"
    assert TP0 in shell.sim.paused, "at its window's bound the partition pauses"
    assert shell.engine.core.in_memory() <= 64


@pytest.mark.parametrize("error", [RetriableError("no"), TerminalError("never")])
def test_a_poison_head_holds_back_its_own_key_only_within_the_buffer_and_the_window(
    error: Exception,
) -> None:
    """A partition's first record fails on every attempt (or for good, with no dead-letter
    topic: held) while its other keys succeed. Those keep flowing, far beyond the buffer: the
    partition is not stalled while its records complete, and the completed ones behind the
    failing head keep only their offsets. Records in memory stay within the buffer; the
    offsets completed behind the head are bounded by the window (``WINDOW_SHARES`` shares),
    where the partition pauses, saying why."""
    from sdk.engine._partition import WINDOW_SHARES

    shell = Shell(Options(ordering=Ordering.KEY, max_buffered=50, commit_interval=0.01))
    others = WINDOW_SHARES * 50 + 200
    shell.cluster.produce(0, [b"poison"] + [b"k%d" % (i % 40) for i in range(others)])
    encodes = _count_encodes()
    for _ in range(1000):
        for item in shell.running():
            shell.finish(
                item, [error if e.payload.key() == b"poison" else None for e in item.entries]
            )
        shell.turn(seconds=0.02)
        assert shell.engine.core.in_memory() <= 50
    part = shell.engine.core.partitions[TP0]
    done = len(part.completed_beyond_head())
    assert done >= WINDOW_SHARES * 50 - 1, f"other keys stopped after {done} records"
    assert part.held <= WINDOW_SHARES * 50 + 50, "the window grew past its bound"
    assert TP0 in shell.sim.paused, "at the window's bound the partition takes no new records"
    stats = shell.engine.core.partition_view(TP0, shell.clock.now)
    assert stats is not None and stats["paused_for"] == "window full"
    assert shell.committed() in (None, 0)
    # The map is encoded only when the completed offsets change, not every commit interval.
    assert encodes() < 60


def _count_encodes() -> Any:
    import sdk.engine._partition as partition

    original = partition.encode_offset_map
    calls = [0]

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    partition.encode_offset_map = counting  # type: ignore[assignment]
    return lambda: calls[0]


@pytest.fixture(autouse=True)
def _restore_encoder() -> Any:
    import sdk.engine._partition as partition

    original = partition.encode_offset_map
    yield
    partition.encode_offset_map = original  # type: ignore[assignment]


def test_a_huge_offset_map_is_restored_as_ranges_after_checking_its_base() -> None:
    """30 million completed offsets behind a stuck one: a tiny map, read as one range."""
    clock = Clock()
    cluster = Cluster(TOPIC, 1, clock, keeps_metadata=True)
    # Run lengths from the base: 1 incomplete (offset 5), then 30 million completed.
    text = "om1:5:r:" + base64.urlsafe_b64encode(_varints([1, 30_000_000])).decode()
    assert len(text) < 64
    cluster.commits[TP0] = (5, text)
    shell = Shell(Options(), cluster=cluster)
    shell.turn()
    part = shell.engine.core.partitions[TP0]
    assert list(part.restored) == [(6, 30_000_006)]
    # A map written for another committed offset is not even decoded.
    cluster.commits[TP0] = (4, text)
    shell.sim.rebalance("revoke", [TP0])
    shell.sim.rebalance("assign", [TP0])
    shell.turn()
    assert not shell.engine.core.partitions[TP0].restored


@pytest.mark.xfail(
    strict=True,
    reason="PartitionState.restored_beyond_fetched lists every restored offset one by one, "
    "and refresh_map encodes the map from that list at each commit (30 million offsets: "
    "about 20 s and 3 GB)",
)
def test_a_huge_restored_offset_map_is_committed_again_from_its_ranges() -> None:
    """A partition assigned with a map of a million completed offsets (a tiny text, read as
    one range) commits a map that keeps them, built from the range: the map's encoding is
    never handed the offsets one by one (a map describing millions of offsets costs only its
    runs)."""
    import sdk.engine._partition as partition

    original = partition.encode_offset_map
    largest = [0]

    def encode(base: int, completed: Any, limit: int = 4096) -> str | None:
        completed = list(completed)
        largest[0] = max(largest[0], len(completed))
        return original(base, completed, limit)

    partition.encode_offset_map = encode  # type: ignore[assignment]
    clock = Clock()
    cluster = Cluster(TOPIC, 1, clock, keeps_metadata=True)
    text = "om1:5:r:" + base64.urlsafe_b64encode(_varints([1, 1_000_000])).decode()
    cluster.commits[TP0] = (5, text)
    shell = Shell(Options(), cluster=cluster)
    shell.turn()
    shell.sim.rebalance("revoke", [TP0])
    shell.turn()
    assert read_offset_map(cluster.commits[TP0][1]) == (5, [(6, 1_000_006)], False)
    assert largest[0] < 1000, f"the map was encoded from {largest[0]} offsets listed one by one"


# ---- 9: revoking forgets parked records ----------------------------------------------------


def test_revoking_a_partition_forgets_its_parked_retries_and_delays() -> None:
    shell = Shell(Options(ordering=Ordering.KEY, retry_delay=lambda a, e: 3600.0), partitions=2)
    shell.cluster.produce(0, [b"a", b"b"])
    shell.cluster.produce(1, [b"a"])
    shell.turn(2)
    for item in shell.running():
        shell.fail(item, RuntimeError("later"), {e.offset for e in item.entries})
    shell.turn()
    assert len(shell.engine.core.parked()) == 3
    shell.sim.rebalance("revoke", [TP0])
    shell.turn()
    parked = shell.engine.core.parked()
    assert [shard.part.tp for shard in parked] == [(TOPIC, 1)]
    assert all(e.tp != TP0 for e in shell.engine.core.retrying)


# ---- 10: bad offset maps never break an assignment ----------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [
        "om1:\u00b2:r:AQE",  # a superscript two: isdigit() says yes, int() refuses it
        "om1:\u0665:r:AQE",  # an Arabic-Indic digit five: isdigit() and int() accept it
        "om1:5:R:" + "A" * 40,
        "om1:99999999999999999999:r:AQE",
        "om1:5:r:\u00e9",
    ],
)
def test_a_malformed_offset_map_is_ignored_and_the_partition_replays(metadata: str) -> None:
    clock = Clock()
    cluster = Cluster(TOPIC, 1, clock, keeps_metadata=True)
    cluster.produce(0, [b"a"] * 8)
    cluster.commits[TP0] = (5, metadata)
    shell = Shell(Options(), cluster=cluster)
    shell.finish_all()
    assert shell.committed() == 8


# ---- 11: a due timer that cannot be served does not spin the loop ------------------------


def test_a_due_retry_while_paused_by_the_user_does_not_spin() -> None:
    shell = Shell(Options(retry_delay=lambda a, e: 0.01))
    shell.cluster.produce(0, [b"a"])
    shell.turn(2)
    shell.fail(shell.running()[0], RuntimeError("again"), {0})
    shell.engine.pause()
    shell.turn()
    assert shell.turn(seconds=1.0) >= 0.005  # the retry is due but may not start


def test_a_due_retry_with_every_worker_busy_does_not_spin() -> None:
    shell = Shell(Options(ordering=Ordering.KEY, max_concurrency=1, retry_delay=lambda a, e: 0.01))
    shell.cluster.produce(0, [b"a", b"b", b"c", b"d", b"e"])
    shell.turn(2)
    shell.fail(shell.running()[0], RuntimeError("again"), {0})
    shell.turn(seconds=0.001)
    while len(shell.running()) < 2:  # fill the worker and its queue
        shell.cluster.produce(0, [b"x%d" % len(shell.cluster.logs[TP0])])
        shell.turn()
    assert shell.engine._free_slots() == 0
    assert shell.turn(seconds=1.0) >= 0.005


def _entry(offset: int) -> Entry:
    from sdk.engine._partition import Counts
    from sdk.engine._shards import Shard, ShardedPartition
    from tests.sdk.simulated import SimMessage

    part = ShardedPartition(TP0, None, [], Counts(), 0.0)
    shard = Shard(TP0, part)
    return Entry(offset, part, shard, SimMessage(TP0, offset, None, 0), 0.0)


# ---- a partition stuck with the whole buffer does not starve the others ------------------


def test_a_partition_stuck_with_the_whole_buffer_does_not_starve_the_others() -> None:
    """Partition 0 took the whole buffer in one fetch, then every record of it failed for
    good (no dead-letter topic: held). Counted at its share once stalled, it leaves room for
    partition 1, whose record is processed and committed."""
    shell = Shell(
        Options(ordering=Ordering.UNORDERED, max_concurrency=3, max_buffered=4), partitions=2
    )
    shell.cluster.produce(0, [b"a"] * 4)
    shell.turn()
    shell.cluster.produce(1, [b"a"])
    shell.turn()
    assert shell.engine.core.partitions[TP0].held == 4
    for item in shell.running():
        shell.finish(item, [TerminalError("never")] * len(item.entries))
    shell.finish_all(turns=20, seconds=0.5)
    assert shell.committed(1) == 1, "partition 1 starved behind the stuck partition 0"
    assert shell.committed(0) in (None, 0) and TP0 in shell.sim.paused


def test_partitions_held_up_by_records_failed_for_good_do_not_starve_a_third() -> None:
    """Partitions 0 and 1 each hold a record failed for good (no dead-letter topic: held)
    and the records completed after it, which the commit cannot pass: five records held
    with a buffer of four. Only their offsets stay in memory, and each stalled partition
    counts as its share: partition 2's record is fetched, processed and committed."""
    shell = Shell(
        Options(ordering=Ordering.UNORDERED, max_concurrency=4, max_buffered=4), partitions=3
    )
    for partition, count in ((0, 3), (1, 2)):
        shell.cluster.produce(partition, [b"a"] * count)
        for _ in range(10):  # each partition's first record fails for good, the others succeed
            shell.turn(seconds=0.5)
            for item in shell.running():
                shell.finish(
                    item, [TerminalError("never") if e.offset == 0 else None for e in item.entries]
                )
    parts = shell.engine.core.partitions
    assert [parts[(TOPIC, p)].held for p in (0, 1)] == [3, 2]
    assert [parts[(TOPIC, p)].incomplete for p in (0, 1)] == [1, 1]
    shell.cluster.produce(2, [b"a"])
    shell.finish_all(turns=20, seconds=0.5)
    assert shell.committed(2) == 1, "partition 2 starved behind the held records of 0 and 1"
    assert shell.committed(0) in (None, 0) and shell.committed(1) in (None, 0)


@pytest.mark.parametrize("partitions", [1, 2])
def test_flowing_partitions_are_not_paused_when_the_buffer_fills(partitions: int) -> None:
    """Backlogs larger than the buffer, every record succeeding: the engine stops taking
    records at the buffer instead of pausing partitions (a pause throws away librdkafka's
    prefetched records and costs a refetch), whatever share each one holds."""
    shell = Shell(
        Options(ordering=Ordering.KEY, max_concurrency=4, max_buffered=64), partitions=partitions
    )
    for p in range(partitions):
        shell.cluster.produce(p, [b"k%d" % (i % 8) for i in range(1000 - 300 * p)])
    for _ in range(500):
        for item in shell.running():
            shell.finish(item)
        shell.turn(seconds=0.005)
        assert shell.engine.core.in_memory() <= 64
        assert not shell.sim.paused, "a flowing partition was paused"
    assert [shell.committed(p) for p in range(partitions)] == [
        1000 - 300 * p for p in range(partitions)
    ]
    assert all(c.pauses == 0 for c in shell.engine.core.counts.values())


# ---- records behind a poison record are given back when others need the room ------------


def test_records_waiting_behind_stalled_heads_are_given_back_and_fetched_again() -> None:
    """Partition 0 took the whole buffer, all of one key, and its head waits for a retry due
    in 30 s; partition 1's head failed for good (held). Counted at their shares, the two left
    no room: partition 2 was never fetched. Now partition 0 gives back its newest records
    (none started): partition 2 flows at once, and once partition 0's head succeeds, the
    records it gave back are fetched again and each runs exactly once."""
    shell = Shell(
        Options(
            ordering=Ordering.KEY,
            max_concurrency=4,
            max_buffered=8,
            retry_delay=lambda attempt, error: 30.0,
        ),
        partitions=3,
    )
    share = 8 // 3
    shell.cluster.produce(0, [b"a"] * 8)
    shell.turn()
    assert shell.engine.core.partitions[TP0].held == 8
    for item in shell.running():
        shell.fail(item, RetriableError("not yet"), {0})
    shell.turn(times=30, seconds=0.05)  # partition 0 is stalled: its head waits
    shell.cluster.produce(1, [b"b"] * 2)
    shell.turn(times=2)
    for item in shell.running():
        shell.fail(item, TerminalError("never"), {0})
    shell.turn(times=30, seconds=0.05)  # partition 1 is stalled too
    shell.cluster.produce(2, [b"c", b"d", b"e"])
    shell.finish_all(turns=40, seconds=0.05)
    core = shell.engine.core
    assert shell.committed(2) == 3, "partition 2 starved behind the stalled partitions"
    assert core.partitions[TP0].held <= share
    assert core.counts[TP0].given_back > 0
    assert shell.committed(0) in (None, 0) and shell.committed(1) in (None, 0)
    succeeded = []
    for _ in range(120):  # the retry becomes due: partition 0 moves again
        for item in shell.running():
            succeeded += [entry.offset for entry in item.entries if entry.tp == TP0]
            shell.finish(item)
        shell.turn(seconds=0.3)
    assert shell.committed(0) == 8
    assert sorted(succeeded) == list(range(8)), "a record given back was lost or ran twice"
    assert shell.committed(1) in (None, 0)  # its head is held for good


# ---- a running item takes its shard's next records, only those that may start ------------


def test_a_record_of_a_running_shard_joins_its_item_only_when_it_may_start() -> None:
    """A record whose shard is running joins that item (its worker runs it next, no new
    item), but not one its gate has not released; a record that joined after the worker's
    last look is reported without a result and runs in the next item."""
    shell = Shell(Options(ordering=Ordering.KEY, max_concurrency=2), gated=True)
    shell.open_gate(p0=1)
    shell.cluster.produce(0, [b"a"])
    shell.turn()
    [first] = shell.running()
    shell.cluster.produce(0, [b"a"])  # offset 1: not released
    shell.turn()
    assert [e.offset for e in first.entries] == [0], "a record joined beyond its gate"
    shell.open_gate(p0=10)
    shell.turn()
    assert [e.offset for e in first.entries] == [0]  # it waits in its shard's queue
    shell.finish(first)
    shell.turn()
    [second] = shell.running()
    assert [e.offset for e in second.entries] == [1]
    shell.cluster.produce(0, [b"a", b"b"])  # offsets 2 (joins) and 3 (another key)
    shell.turn()
    assert [e.offset for e in second.entries] == [1, 2]
    assert sorted(o for _, o in shell.started) == [0, 1, 3], "the joining record got an item"
    for item in shell.running():
        if item is second:
            shell.finish(item, [None])  # its worker had finished before offset 2 joined
        else:
            shell.finish(item)
    shell.turn()
    [third] = shell.running()
    assert [e.offset for e in third.entries] == [2]
    shell.finish_all()
    assert shell.committed(0) == 4


def test_a_record_never_joins_a_running_item_under_a_watermark_the_gate_lowered() -> None:
    """The gate lowered a partition's watermark (its dependencies' offsets went back, as
    when a topic is recreated) just before the partition's next record was fetched: the
    record is registered under the lowered limit, so it does not join its key's running
    item."""
    shell = Shell(Options(ordering=Ordering.KEY, max_concurrency=2), gated=True)
    shell.open_gate(p0=5)
    shell.cluster.produce(0, [b"a"])
    shell.turn()
    [first] = shell.running()
    shell.open_gate(p0=1)  # lowered: offset 1 is no longer released
    shell.cluster.produce(0, [b"a"])
    shell.turn()
    assert [e.offset for e in first.entries] == [0], "it joined under the old watermark"
    assert shell.engine.core.partitions[(TOPIC, 0)].limit == 1


# ---- a long item's finished records free their room before the item ends ---------------


def test_records_a_running_item_finished_free_buffer_room_before_the_item_ends() -> None:
    """One shard's records fill the buffer in one item that runs for long (a slow key); its
    worker has finished the first ten. Applied only at the item's end or the next commit,
    they would keep the buffer full all that time, and the records after them (other keys,
    in the real case) would wait in the broker while workers sit idle. They free their room
    as soon as the buffer has none left."""
    shell = Shell(Options(ordering=Ordering.PARTITION, max_buffered=16, commit_interval=60))
    shell.cluster.produce(0, [b"a"] * 40)
    shell.turn()
    [item] = shell.running()
    assert [e.offset for e in item.entries] == list(range(15))  # the buffer less its reserve
    item.finished = 10  # the worker's progress so far; the item goes on running
    shell.turn(times=4)
    part = shell.engine.core.partitions[TP0]
    assert part.highest >= 24, "the finished records kept their room until the item ended"
    assert part.held <= 16
    assert shell.committed() in (None, 0)  # nothing committed meanwhile: no commit was due
    shell.finish_all()
    shell.turn(seconds=60)  # the next commit
    assert shell.committed() == 40


# ---- a record handed out before its partition was revoked is not started -----------------


@pytest.mark.parametrize("mode", ["single", "batch", "coroutine"])
def test_a_worker_does_not_start_records_of_a_partition_revoked_after_they_were_handed_out(
    mode: str,
) -> None:
    """Revoking waits for what runs, not for what waits in the workers' queue: a record of a
    revoked partition is reported not started (its next owner runs it, in order); the
    records of other partitions in the same item run. What the item reports as finished
    while it runs (what a commit may apply before its end) stops before the record not
    started: a commit must never pass it."""
    kept, revoked, later = _entry(0), _entry(1), _entry(2)
    revoked.part.revoked = True
    ran: list[int] = []
    entries = [kept, revoked, later]
    item = Item(1, entries)
    if mode == "coroutine":

        async def handler(record: Any) -> None:
            ran.append(record.offset)

        results = _run_in_coroutines(Work(handler, Options()), item)
    elif mode == "batch":

        def handle_batch(records: list[Any]) -> None:
            ran.extend(record.offset for record in records)

        results = Batches(Work(handle_batch, Options(batch_size=3))).run(item)
    else:
        results = Work(lambda record: ran.append(record.offset), Options()).run(item)
    assert ran == [0, 2]
    assert results == [None, NOT_STARTED, None]
    assert item.finished == (0 if mode == "batch" else 1)  # (a batch reports at its end)


class _PauseClosingOnce:
    """The producer's pause as a worker sees it when the consumer's thread closes it and
    opens it again while an item runs: closed at the second look, open from the third."""

    def __init__(self) -> None:
        self.looks = 0
        self.waits = 0

    @property
    def closing(self) -> bool:
        self.looks += 1
        return self.looks == 2

    def wait(self) -> None:
        self.waits += 1


@pytest.mark.parametrize("mode", ["thread", "coroutine"])
def test_an_item_paused_once_waits_or_starts_no_further_record(mode: str) -> None:
    """At least once the pause opens again while items run (their outputs acknowledged). A
    worker's thread waits at it before its next record, then goes on; a coroutine (which
    must not block its event loop) leaves the rest of its item unstarted, and must leave all
    of it so even once the pause ended, or a later record of the shard would run before the
    one sent back."""
    entries = [_entry(0), _entry(1), _entry(2)]
    item = Item(1, entries)
    ran: list[int] = []
    outputs = Outputs(lambda: None, transactional=False)  # type: ignore[arg-type,return-value]
    outputs.pause = _PauseClosingOnce()  # type: ignore[assignment]
    if mode == "coroutine":

        async def handler(record: Any) -> None:
            ran.append(record.offset)

        work = Work(handler, Options())
        work.outputs = outputs
        results = _run_in_coroutines(work, item)
    else:
        work = Work(lambda record: ran.append(record.offset), Options())
        work.outputs = outputs
        results = work.run(item)
        assert outputs.pause.waits == 1  # type: ignore[attr-defined]
        assert ran == [0, 1, 2] and results == [None, None, None]
        return
    assert ran == [0], "a record started after one of its shard went back unstarted"
    assert results == [None, NOT_STARTED, NOT_STARTED]


def test_a_wall_clock_set_back_does_not_delay_parked_retries() -> None:
    """The core's timers run on a clock that never steps: the engine reads a monotonic clock
    for them, and the wall clock only dates records (process delay) and stats. A wall clock
    set back by an hour leaves a retry due after its 0.5 s."""
    consumer = ParallelConsumer(
        {"group.id": "g", "bootstrap.servers": "unused:9092"}, ["t"], lambda r: None, registry=None
    )
    assert consumer._time is time.monotonic and consumer._wall is time.time
    shell = Shell(Options(ordering=Ordering.PARTITION, retry_delay=lambda a, e: 0.5))
    wall = [shell.clock.now]
    shell.engine._wall = lambda: wall[0]
    shell.cluster.produce(0, [b"a"])
    shell.turn(2)
    shell.fail(shell.running()[0], RetriableError("again"), {0})
    shell.turn()
    wall[0] -= 3600  # the wall clock is set back
    shell.turn(times=12, seconds=0.05)
    assert [e.attempts for item in shell.running() for e in item.entries] == [1], (
        "the retry was not due after its delay"
    )


# ---- outputs: an input is done only when its outputs are -------------------------------


def test_the_producer_of_outputs_opens_with_the_consumer() -> None:
    """At least once too, the producer of outputs opens and connects when the consumer does,
    not at the first output: librdkafka's idempotent producer sends nothing until a timer
    (after half a second) finds a broker up to ask for its producer id, and outputs produced
    before then waited a second, holding back the buffer behind them."""
    shell = Shell(Options(commit_mode=CommitMode.CONSUMER))
    producer = shell.engine.output_producer
    assert producer is not None, "no producer until the first output"
    assert producer.connected, "it was not connected at once"
    assert producer.calls == [], "it produced before any output"


def test_an_input_whose_output_was_not_delivered_is_not_committed_and_runs_again() -> None:
    """At least once: the worker reports its item at once, and the consumer's thread keeps
    it aside until its outputs' delivery reports are in; a failed delivery fails the input
    (and sends the rest of its shard in the item back unstarted), so the commit stops before
    it until its retry's output is acknowledged."""
    shell = Shell(Options(ordering=Ordering.PARTITION, retry_delay=lambda a, e: 0.0))
    shell.cluster.produce(0, [b"a", b"a", b"a"])
    shell.turn(2)
    [item] = shell.running()
    shell.run(item)  # (reported at once)
    shell.turn(seconds=1.0)
    assert item.id in shell.engine._acknowledging, "applied before its acknowledgements"
    assert item.finished == 0
    assert shell.committed() in (None, 0)  # nothing past an unacknowledged input
    producer = shell.engine.output_producer
    assert producer is not None
    producer.deliver([True, False, True])  # the output of offset 1 is lost
    shell.turn(seconds=1.0)
    assert not shell.engine._acknowledging
    assert shell.committed() == 1
    ran: list[int] = []
    shell.run_all(ran=ran)
    assert ran == [1, 2]  # its input runs again, and the rest of its shard after it
    assert shell.committed() == 3
    assert shell.outputs() == ["0:0", "0:2", "0:1", "0:2"]  # at least once, in order again


@pytest.mark.parametrize("failure", ["delivery", "send_offsets", "commit"])
def test_a_transaction_that_cannot_commit_commits_neither_offsets_nor_outputs(
    failure: str,
) -> None:
    """confluentinc/parallel-consumer#830: the broker forgot the producer id
    (``INVALID_PRODUCER_ID_MAPPING``) and a batch was marked succeeded, its offsets committed,
    for records never produced. Here an output's delivery, sending the offsets or the commit
    itself fails with an abortable error: the transaction is aborted, so neither the offsets
    nor the outputs are committed; every input since the last commit is processed again, and
    once a transaction commits each output is visible exactly once."""
    shell = Shell(
        Options(
            ordering=Ordering.KEY,
            commit_mode=CommitMode.TRANSACTIONAL,
            commit_interval=0.1,
        ),
        keeps_metadata=True,
    )
    shell.cluster.produce(0, [b"a", b"b", b"a", b"b"])
    shell.turn(2)
    first: list[int] = []
    for item in shell.running():
        shell.run(item, first)
    shell.turn()  # the inputs are done: their outputs are in the open transaction
    assert sorted(first) == [0, 1, 2, 3]
    producer = shell.engine.output_producer
    assert producer is not None
    committer = shell.engine._committer
    assert committer.aborted == 0
    before = committer.committed
    forgotten = KafkaError(KafkaError.INVALID_PRODUCER_ID_MAPPING, "unknown producer id")
    if failure == "delivery":
        producer.deliver([True, False], error=forgotten)
    else:
        producer.fail(failure, "abortable")
    shell.turn(seconds=0.2)  # the commit is due
    assert committer.aborted == 1 and committer.committed == before, committer.last_abort
    assert "producer id" in (committer.last_abort or "")
    assert shell.committed() in (None, 0), "offsets committed for outputs never written"
    assert shell.outputs() == []
    assert shell.cluster.transactions.aborted_count() == 1
    again: list[int] = []
    shell.run_all(ran=again)
    assert sorted(again) == [0, 1, 2, 3], "the inputs of the aborted transaction did not run again"
    assert shell.committed() == 4
    assert sorted(shell.outputs()) == ["0:0", "0:1", "0:2", "0:3"]


def test_an_output_whose_delivery_timed_out_is_never_committed_by_a_later_transaction() -> None:
    """A broker stopped for longer than the message timeout: an output's delivery times out,
    but its request may still reach the broker after the abort, and a broker that does not
    fence the aborting producer's old epoch (noida-db 0.2) commits it with that producer's
    next transaction. The transaction is aborted by a new producer instead, so every output
    is visible once (before: the late output and its input's second run were both
    committed)."""
    shell = transactional_shell()
    first = shell.in_open_transaction([b"a", b"b"])
    first.deliver([True, False])  # the second output's delivery timed out
    shell.turn(seconds=0.2)  # the commit is due: it aborts
    assert shell.engine._committer.aborted == 1
    shell.run_all()
    assert shell.outputs() == ["0:0", "0:1"], "an output was committed twice"
    assert shell.committed() == 2
    assert shell.engine.output_producer is not first, "the aborting producer wrote on"


def test_partitions_lost_with_outputs_in_the_open_transaction_abort_it() -> None:
    """A partition is lost (the session expired: another member may own it already) while
    the open transaction holds outputs of its inputs. That transaction must not commit: the
    outputs would be visible without their inputs' offsets, and the partition's next owner
    (here this consumer again) writes them a second time."""
    shell = Shell(
        Options(commit_mode=CommitMode.TRANSACTIONAL, commit_interval=0.1), keeps_metadata=True
    )
    shell.cluster.produce(0, [b"a"])
    shell.turn(2)
    for item in shell.running():
        shell.run(item)
    shell.turn()  # done: its output is in the open transaction
    shell.sim.rebalance("lost", [TP0])
    shell.turn()
    shell.sim.rebalance("assign", [TP0])
    shell.run_all()
    assert shell.committed() == 1
    assert shell.outputs() == ["0:0"], "the lost input's output was committed twice"


def test_a_transaction_commit_that_timed_out_does_not_stop_the_consumer() -> None:
    """``commit_transaction`` timed out flushing the transaction's outputs (the broker was
    slow): a retriable error, after which librdkafka keeps the transaction committing and
    refuses ``abort_transaction`` and ``begin_transaction``. The consumer goes on (a new
    producer's initialisation aborts that transaction), its inputs run again, and the
    outputs and offsets commit once."""
    shell = Shell(
        Options(commit_mode=CommitMode.TRANSACTIONAL, commit_interval=0.1), keeps_metadata=True
    )
    producer = shell.in_open_transaction([b"a", b"b"])
    producer.fail("commit", "retriable")
    try:
        shell.turn(seconds=0.2)  # the commit is due, and times out
    except TransactionError as exc:
        pytest.fail(f"a retriable commit failure stopped the consumer: {exc}")
    shell.run_all()
    assert shell.committed() == 2
    assert sorted(shell.outputs()) == ["0:0", "0:1"]


def test_a_commit_keeps_the_restored_offsets_not_fetched_yet_in_its_offset_map() -> None:
    """The partition is assigned at committed offset 1 with a map saying 2 to 7 were
    completed; the buffer (4) takes 1 to 4 in the first fetch. The revoke's commit comes
    before the fetch passed the map's end: its map must still list 5 to 7, or the next owner
    processes them again (in exactly-once mode too: their outputs are then written twice)."""
    clock = Clock()
    cluster = Cluster(TOPIC, 1, clock, keeps_metadata=True)
    cluster.produce(0, [b"a"] * 8)
    cluster.commits[TP0] = (1, encode_offset_map(1, range(2, 8)))
    shell = Shell(Options(ordering=Ordering.KEY, max_buffered=4), cluster=cluster)
    shell.turn()
    assert shell.engine.core.partitions[TP0].held_offsets() == [1, 2, 3, 4]
    shell.sim.rebalance("revoke", [TP0])
    shell.turn()
    offset, metadata = cluster.commits[TP0]
    assert offset == 1
    assert read_offset_map(metadata)[1] == [(2, 8)], "the committed map forgot 5 to 7"
    shell.sim.rebalance("assign", [TP0])
    ran: list[int] = []
    shell.run_all(ran=ran)
    assert ran == [1]
    assert shell.committed() == 8


# ---- the transactional producer's life cycle --------------------------------------------------


def transactional_shell(partitions: int = 1, **options: Any) -> Shell:
    return Shell(
        Options(commit_mode=CommitMode.TRANSACTIONAL, commit_interval=0.1, **options),
        partitions=partitions,
        keeps_metadata=True,
    )


def test_a_record_running_when_its_partition_is_lost_never_commits_its_output() -> None:
    """The member is frozen in a long handler past its session: the partition is lost while
    the record runs and the open transaction is still empty. The handler then returns its
    output; the member gets the partition back and runs the record again. Only one of the
    two outputs may ever be visible, with the input's offset (before: both were, the first
    committed in a transaction without its input's offset)."""
    shell = transactional_shell()
    shell.cluster.produce(0, [b"a"])
    shell.turn(2)
    (item,) = shell.running()
    worker = shell.engine.runner.start(item)
    assert worker is not None
    assert shell.engine._outputs.in_transaction == 0

    def frozen(entries: list[Entry], record: Any) -> Output:
        shell.sim.rebalance("lost", [TP0])
        shell.turn()  # the loop serves the loss while the handler runs
        return Output(OUT, "0:0", key=b"a")

    worker.step(frozen)
    worker.ended = True
    shell.engine.runner.report(item, worker.end())
    shell.sim.rebalance("assign", [TP0])
    ran: list[int] = []
    shell.run_all(ran=ran)
    assert ran == [0], "the record did not run again after the loss"
    assert shell.committed() == 1
    assert shell.outputs() == ["0:0"], "the output of the lost run was committed too"


def test_a_fenced_producer_makes_no_further_transactional_call() -> None:
    """Another process took the ``transactional.id`` over while a commit had messages in
    flight: the commit fails fenced, and librdkafka answers the next transactional call with
    a non-fatal ``_CONFLICT``. The consumer stops with ``TransactionError``; closing it makes
    no transactional call and no new producer (before: closing committed again, got the
    ``_CONFLICT``, replaced the producer, and its initialisation fenced the process that had
    taken over)."""
    shell = transactional_shell()
    producer = shell.in_open_transaction([b"a", b"b"])
    producer.fail("commit", "fenced_in_flight")
    with pytest.raises(TransactionError, match="fenced"):
        shell.turn(seconds=0.2)
    epoch = shell.cluster.transactions.epochs[producer.transactional_id]  # the successor's
    calls = len(producer.calls)
    shell.engine._error = TransactionError("fenced")
    shell.engine._close()
    assert producer.calls[calls:] == [], "the fenced producer was called while closing"
    assert shell.engine.output_producer is producer, "a new producer was made"
    assert shell.cluster.transactions.epochs[producer.transactional_id] == epoch, (
        "the successor was fenced"
    )


def test_a_long_broker_outage_while_renewing_the_producer_does_not_stop_the_consumer() -> None:
    """A commit times out (the broker unreachable); the new producer's
    ``init_transactions`` then times out again and again (retriable: "retry call to
    resume"). The consumer keeps turning and hands nothing out meanwhile; once the broker
    answers, the partitions go back to their committed offsets and every input's output
    commits once (before: the first retriable init failure stopped the consumer)."""
    shell = transactional_shell()
    first = shell.in_open_transaction([b"a", b"b"])
    first.fail("commit", "retriable")
    original = shell.engine._new_output_producer

    def unreachable() -> Any:
        producer = original()
        producer.fail("init", "retriable", times=20)
        return producer

    shell.engine._new_output_producer = unreachable  # type: ignore[method-assign]
    shell.engine._outputs._new_producer = unreachable
    shell.turn(seconds=0.2)  # the commit is due, and times out
    shell.cluster.produce(0, [b"c"])
    handed_out = {item.id for item in shell.running()}
    for _ in range(15):
        shell.turn(seconds=0.2)
        now = {item.id for item in shell.running()}
        assert now <= handed_out, "work was handed out while the producer was not ready"
    renewed = shell.engine.output_producer
    assert renewed is not first and renewed.state == "uninit"
    ran: list[int] = []
    shell.run_all(ran=ran)
    assert sorted(ran) == [0, 1, 2]
    assert shell.committed() == 3
    assert sorted(shell.outputs()) == ["0:0", "0:1", "0:2"]


def test_a_dead_letter_copy_that_cannot_be_delivered_holds_its_input_alone() -> None:
    """Transactional, the dead-letter topic missing: the copy of a record that failed for
    good breaks each transaction it is in. It counts against its input like an output:
    after 3 (``max_attempts`` or 3) the input is held, and the other partition commits
    (before: every transaction aborted, for ever, and no partition moved). Once the topic
    is there, the copy commits with its input's offset."""
    shell = transactional_shell(
        partitions=2, dead_letter_topic="dlt", on_exhausted="dead_letter", max_attempts=1
    )
    shell.cluster.transactions.dead_letter_topic = "dlt"
    shell.cluster.transactions.down = {"dlt"}
    shell.cluster.produce(0, [b"a"])
    for _ in range(120):
        shell.cluster.produce(1, [b"b"])
        for item in shell.running():
            if item.entries[0].tp == TP0:
                shell.fail(item, TerminalError("never"), {0})
            elif shell.engine.runner.start(item) is not None:
                shell.run(item)
        producer = shell.engine.output_producer
        if producer is not None and producer.pending:
            producer.flush()
        shell.turn(seconds=0.1)
    assert shell.committed(0) in (None, 0), "the held input was passed"
    assert (shell.committed(1) or 0) >= 100, "the other partition did not commit"
    aborted = shell.engine._committer.aborted
    assert aborted <= 6, f"{aborted} transactions aborted: the input was not held"
    shell.cluster.transactions.down = set()
    for _ in range(300):
        for item in shell.running():
            if item.entries[0].tp == TP0:
                shell.fail(item, TerminalError("never"), {0})
            elif shell.engine.runner.start(item) is not None:
                shell.run(item)
        producer = shell.engine.output_producer
        if producer is not None and producer.pending:
            producer.flush()
        shell.turn(seconds=0.5)
        if shell.committed(0) == 1:
            break
    assert shell.committed(0) == 1, "the copy never committed once the topic was there"
    assert len(shell.cluster.dead_letters) == 1


def test_a_fatal_error_raised_by_the_output_producer_s_poll_stops_with_an_engine_error() -> None:
    """librdkafka raises a fatal error from ``poll()`` and ``flush()`` (confluent-kafka raises
    fatal errors there even without an ``error_cb``; the consumer's thread flushes while an
    item's outputs wait and nothing runs): at least once, the consumer stops with
    ``EngineError`` naming it (before: a raw ``KafkaException``)."""
    shell = Shell(Options(commit_interval=0.1))
    shell.cluster.produce(0, [b"a"])
    shell.turn(2)
    for item in shell.running():
        shell.run(item)
    producer = shell.engine.output_producer
    assert producer is not None

    def fatal(timeout: float = 0) -> int:
        raise KafkaException(
            KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence broken", fatal=True)
        )

    producer.poll = producer.flush = fatal  # type: ignore[method-assign]
    with pytest.raises(EngineError, match="sequence broken") as raised:
        shell.turn()
    assert not isinstance(raised.value, KafkaException)


def test_a_fenced_error_raised_by_the_output_producer_s_poll_stops_with_a_transaction_error() -> (
    None
):
    shell = transactional_shell()
    shell.turn(2)
    producer = shell.engine.output_producer
    assert producer is not None

    def fenced(timeout: float = 0) -> int:
        raise KafkaException(KafkaError(KafkaError._FENCED, "producer fenced", fatal=True))

    producer.poll = fenced  # type: ignore[method-assign]
    with pytest.raises(TransactionError, match="fenced"):
        shell.turn()
    assert shell.engine._committer.dead


def system_error_from(cause: BaseException | None, call: str = "flush") -> SystemError:
    """What Python raises when confluent-kafka returns from ``call`` with an exception set
    by a callback (``cause``: the fatal error it had set before, if any)."""
    error = SystemError(f"<built-in method {call} of cimpl.Producer object> returned a result")
    error.__cause__ = cause
    return error


def fenced_error() -> KafkaError:
    return KafkaError(KafkaError._FENCED, "producer fenced", fatal=True)


def raise_kafka_error_itself(error: KafkaError) -> None:
    """Raise what confluent-kafka's calls sometimes raise on a fatal error: the ``KafkaError``
    itself, which is no exception (set as C code sets it)."""
    ctypes.pythonapi.PyErr_SetObject(ctypes.py_object(KafkaError), ctypes.py_object(error))


@pytest.mark.parametrize("raised", ["system-error", "kafka-error-itself"])
@pytest.mark.parametrize("call", ["flush", "poll"])
def test_a_fenced_error_raised_oddly_by_the_producer_stops_with_a_transaction_error(
    call: str, raised: str
) -> None:
    """confluent-kafka meets the fencing while it serves callbacks, and its log callbacks
    still run: the commit's flush (or a poll) raises a ``SystemError`` caused by the
    fencing error, or the ``KafkaError`` itself, which no ``except`` clause but a bare one
    catches (both seen on noida-db with a fenced producer's outputs lingering). The
    consumer stops with ``TransactionError`` naming the fencing, makes no new producer and
    no further transactional call (before: the first ended it with an error that did not say
    it was fenced; the second killed its thread, and ``stop()`` reported nothing)."""
    shell = transactional_shell()
    producer = shell.in_open_transaction([b"a", b"b"])

    def fails(timeout: float = 0) -> int:
        if raised == "system-error":
            raise system_error_from(KafkaException(fenced_error()), call)
        raise_kafka_error_itself(fenced_error())
        raise AssertionError("not raised")

    setattr(producer, call, fails)
    calls = len(producer.calls)
    with pytest.raises(TransactionError, match="fenced"):
        shell.turn(seconds=0.2)
    assert shell.engine._committer.dead
    assert shell.engine.output_producer is producer, "a new producer was made"
    assert [c for c in producer.calls[calls:] if c != "flush"] == [], producer.calls[calls:]


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "not-fenced"])
def test_a_system_error_without_a_cause_aborts_and_stops_with_a_transaction_error(
    fenced: bool,
) -> None:
    """The commit's flush raises a ``SystemError`` with no error behind it (confluent-kafka
    lost it: "returned NULL without setting an exception", seen on noida-db with a fenced
    producer). The abort that follows tells: fenced (another producer took the
    ``transactional.id`` over), the consumer stops with ``TransactionError`` naming the
    fencing; otherwise the abort succeeds and it stops with ``TransactionError`` saying so.
    Either way no new producer is made, which would fence whoever holds the id now (before:
    it stopped with the bare ``SystemError``)."""
    shell = transactional_shell()
    producer = shell.in_open_transaction([b"a", b"b"])
    if fenced:
        shell.cluster.transactions.epochs[producer.transactional_id] += 1  # a successor

    def fails(timeout: float = 0) -> int:
        raise system_error_from(None)

    producer.flush = fails
    expected = "fenced" if fenced else "without an error from the client.*was aborted"
    with pytest.raises(TransactionError, match=expected):
        shell.turn(seconds=0.2)
    assert producer.calls[-1] == "abort", producer.calls
    assert shell.engine._committer.dead
    assert shell.engine.output_producer is producer, "a new producer was made"


# ---- a static member fenced by its own previous session after a long outage -------------

FENCED = (
    "Fatal error: Broker: Static consumer fenced by other consumer with same "
    "group.instance.id: Fatal consumer error"
)


def fenced(shell: Shell) -> None:
    """librdkafka's consumer fails for good: its static membership was fenced."""
    error = KafkaError(KafkaError._FATAL, FENCED, fatal=True)
    shell.engine.sim.failures.append(SimFailure(error))


@pytest.mark.parametrize("mode", [CommitMode.CONSUMER, CommitMode.TRANSACTIONAL])
def test_a_static_member_fenced_right_after_its_session_timed_out_joins_again(
    mode: CommitMode,
) -> None:
    """A broker outage longer than the session: librdkafka loses the partitions, rejoins,
    and its rejoin is fenced by the member's own previous session (a fatal error for
    librdkafka's consumer, seen after a broker stopped for 9 s). A new consumer takes the
    old one's place; the records are processed from the committed offsets, once (before:
    the consumer stopped with an EngineError)."""
    shell = Shell(Options(commit_mode=mode, commit_interval=0.1), keeps_metadata=True)
    shell.cluster.produce(0, [b"a", b"b"])
    shell.run_all(turns=10)
    assert shell.committed() == 2
    shell.cluster.produce(0, [b"c"])
    shell.turn(2)
    old = shell.engine.sim
    old.rebalance("lost", [TP0])
    shell.turn()
    fenced(shell)
    shell.turn(2)
    new = shell.engine.sim
    assert new is not old and old.closed, "the fenced consumer was not replaced"
    new.rebalance("assign", [TP0])
    ran: list[int] = []
    shell.run_all(ran=ran)
    assert ran == [2], f"after the new consumer joined, records ran: {ran}"
    assert shell.committed() == 3
    if mode == CommitMode.TRANSACTIONAL:
        assert shell.outputs() == ["0:0", "0:1", "0:2"]


@pytest.mark.parametrize("since_loss", [None, 100.0])
def test_a_static_member_fenced_without_losing_its_session_stops(since_loss: float | None) -> None:
    """Fenced with no loss of its own (or long after one): another process has the same
    ``group.instance.id``; the consumer stops with an EngineError naming the fencing, and
    does not fence that process in turn."""
    shell = Shell(Options(commit_interval=0.1))
    shell.cluster.produce(0, [b"a"])
    shell.run_all(turns=10)
    old = shell.engine.sim
    if since_loss is not None:
        old.rebalance("lost", [TP0])
        shell.turn()
        shell.clock.advance(since_loss)  # (sessions of 45 s: two of them have passed)
    fenced(shell)
    with pytest.raises(EngineError, match="fenced"):
        shell.turn(2)
    assert shell.engine.sim is old


# ---- a consumer that caught up commits at once ----------------------------------------------


@pytest.mark.parametrize("mode", [CommitMode.CONSUMER, CommitMode.TRANSACTIONAL])
def test_a_consumer_that_caught_up_commits_without_waiting_for_its_interval(
    mode: CommitMode,
) -> None:
    """Its backlog done, a consumer waited out the commit interval (a minute here) before
    committing: the services gated on its group, and ``read_committed`` readers of its
    outputs, waited as long for records it had finished. Nothing it fetched is running or
    waiting now, so it commits (closes its transaction) within a turn or two."""
    shell = Shell(Options(commit_mode=mode, commit_interval=60), keeps_metadata=True)
    shell.turn()  # (the first commit of all is due at once)
    shell.cluster.produce(0, [b"a", b"b", b"c"])
    shell.run_all(turns=5, seconds=0.05)  # a quarter of a second
    assert shell.committed() == 3
    if mode == CommitMode.TRANSACTIONAL:
        assert shell.outputs() == ["0:0", "0:1", "0:2"]


def test_a_busy_consumer_commits_on_its_interval_and_a_trickle_not_per_record() -> None:
    """While a record of another partition is running, what completed waits for the interval
    (committing it then costs a commit per interval, not per item); records arriving one at a
    time, each done before the next, are committed about every tenth of a second, not one
    commit each."""
    shell = Shell(Options(ordering=Ordering.PARTITION, commit_interval=60), partitions=2)
    shell.turn()
    shell.cluster.produce(0, [b"a"])
    shell.cluster.produce(1, [b"b"])
    shell.turn()
    first, second = shell.running()
    shell.finish(first)
    shell.turn(times=20, seconds=0.05)
    assert shell.committed(first.entries[0].tp[1]) is None, "committed while a record ran"
    shell.finish(second)
    shell.turn(times=2, seconds=0.05)
    assert (shell.committed(0), shell.committed(1)) == (1, 1)
    commits = len(shell.cluster.commit_history)
    for _ in range(50):  # a record every 10 ms for half a second, each done at once
        shell.cluster.produce(0, [b"a"])
        shell.turn(seconds=0.005)
        shell.finish_all(turns=1, seconds=0.005)
    shell.turn(times=30, seconds=0.01)
    assert shell.committed(0) == 51
    made = len(shell.cluster.commit_history) - commits
    assert 3 <= made <= 8, f"{made} commits for 50 records over 0.8 s"


def test_a_consumer_told_not_to_commit_when_idle_commits_on_its_interval_only() -> None:
    """``commit_when_idle=False``: caught up or not, progress waits for the interval."""
    shell = Shell(Options(commit_interval=60, commit_when_idle=False))
    shell.turn()
    shell.cluster.produce(0, [b"a", b"b", b"c"])
    shell.finish_all(turns=20, seconds=0.05)
    assert shell.committed() is None
    shell.turn(seconds=60)
    assert shell.committed() == 3


def test_workers_that_keep_producing_pause_until_the_outputs_waiting_are_acknowledged() -> None:
    """At least once, an item with outputs waits until the producer holds none on its way,
    and workers that keep producing always leave some there: once items have waited 50 ms,
    workers pause (they wait before their next record: ``Work.run``) and nothing is handed
    out until the outputs are acknowledged; then every item waiting settles at once and work
    goes on. A pause the broker does not end within 250 ms is lifted, for another 50 ms."""
    shell = Shell(Options(ordering=Ordering.PARTITION), partitions=3)
    engine, runner = shell.engine, shell.engine.runner
    pause = engine._outputs.pause
    for partition in (0, 1):
        shell.cluster.produce(partition, [b"a"] * 3)
    shell.turn(2)
    waiting, busy = shell.running()
    assert (waiting.entries[0].tp[1], busy.entries[0].tp[1]) == (0, 1)
    shell.run(waiting)  # (reported at once: its outputs on their way)
    worker = runner.start(busy)
    assert worker is not None

    def handle(entries: list[Entry], record: Any) -> Output:
        (entry,) = entries
        return Output(OUT, f"{entry.tp[1]}:{entry.offset}")

    assert worker.step(handle) is not None  # p1@0's output on its way too
    shell.turn(seconds=0.01)
    assert waiting.id in engine._acknowledging and not pause.closing
    producer = engine.output_producer
    assert producer is not None and len(producer.pending) == 4

    shell.cluster.produce(2, [b"c"])
    shell.turn(seconds=0.05)  # the item has waited 50 ms
    assert pause.closing, "no pause while outputs kept waiting"
    assert shell.running() == [busy], "handed out during the pause"
    producer.deliver([True] * 4)
    shell.turn()
    assert not pause.closing and not engine._acknowledging
    assert [item.entries[0].tp[1] for item in shell.running()] == [1, 2]

    worker.results += [NOT_STARTED, NOT_STARTED]  # (it stops: p1@1 and p1@2 go back)
    worker.ended = True
    runner.report(busy, worker.end())
    shell.turn()
    assert shell.committed(1) is None or shell.committed(1) <= 1
    [other] = [item for item in shell.running() if item.entries[0].tp[1] == 2]
    shell.run(other)  # p2@0's output on its way
    shell.turn()
    shell.turn(seconds=0.05)
    assert pause.closing
    shell.turn(seconds=0.25)  # the broker does not answer: the pause is lifted
    assert not pause.closing and other.id in engine._acknowledging
    assert shell.committed(2) in (None, 0), "committed past an input whose output is on its way"
    shell.run_all()
    assert [shell.committed(p) for p in (0, 1, 2)] == [3, 3, 1]
    outputs = shell.outputs()
    for partition, count in ((0, 3), (1, 3), (2, 1)):  # each once, in order
        mine = [o for o in outputs if o.startswith(f"{partition}:")]
        assert mine == [f"{partition}:{offset}" for offset in range(count)]
