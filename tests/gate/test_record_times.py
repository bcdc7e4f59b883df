"""Ages of records older than the gate, exact from the records' own timestamps.

The gate learns when records were appended from its history of end offsets, so records
produced before its first poll only have lower bounds (``≥``). The records it needs (at the
watermarks, at the groups' committed offsets) are read once for their timestamps, and their
ages are exact from the next state on. Pure tests of the history's seeding rules and of which
records a gate asks for, and real-broker tests of the reading.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from gate import GateEvaluator, PollResult
from gate.evaluate._asked import ASK_AGAIN_AFTER, WANTED_PER_PARTITION
from gate.evaluate._lag import EXACT_GAP, MAX_SEEDS, EndHistory
from gate.evaluate._state import RecordAt
from gate.poll._isolated import IsolatedPoller
from gate.poll._poller import OffsetPoller
from gate.poll._record_times import (
    RecordReader,
    answer,
    offsets_by_partition,
    reader_properties,
    seed_record_times,
)
from gate.report._report import gate_status
from tests.support import KEEP_FOREVER, Kafka, unique

T0 = 10_000.0
"""When the gate's first poll starts, in the pure tests of the history."""
W = 1_700_000_000.0
"""The wall clock's origin in the pure tests of the evaluator (timestamps before 2001 are
taken as unset)."""


# The history's seeding rules -------------------------------------------------------------


@st.composite
def older_records(draw: st.DrawFn) -> tuple[list[float], list[int]]:
    """Records appended before the gate's first poll at ``T0`` (their append times, in order,
    the last at or before ``T0``), and the offsets whose timestamps were read."""
    gaps = draw(
        st.lists(
            st.one_of(st.just(0.0), st.floats(0.0, 3.0), st.floats(3.0, 400.0)),
            min_size=1,
            max_size=300,
        )
    )
    last = T0 - draw(st.floats(0.0, 30.0))
    appended = [last]
    for gap in reversed(gaps[1:]):
        appended.append(appended[-1] - gap)
    appended.reverse()
    seeded = draw(st.sets(st.integers(0, len(appended) - 1), max_size=80))
    return appended, sorted(seeded)


def history_from(end: int, later: int = 3) -> EndHistory:
    """The gate's history: the first poll at ``T0`` saw ``end``; ``later`` polls a second
    apart saw a record more each."""
    history = EndHistory()
    for k in range(later + 1):
        history.observe(T0 + k, end + k)
    return history


@settings(max_examples=150, deadline=None)
@given(older_records(), st.floats(0.0, 5000.0))
def test_seeded_records_are_exact_and_the_rest_are_exact_or_lower_bounds(
    log: tuple[list[float], list[int]], after: float
) -> None:
    appended, seeded = log
    history = history_from(len(appended))
    for offset in seeded:
        assert history.seed(offset, appended[offset])
    now = T0 + 3 + after
    kept = set(history.seed_offsets)
    assert len(kept) <= MAX_SEEDS and kept == set(seeded[-MAX_SEEDS:])  # the oldest go first
    for offset, at in enumerate(appended):
        truth = now - at
        lag = history.lag(offset, now)
        if offset in kept:
            assert lag.exact and lag.seconds == pytest.approx(truth, abs=1e-6), offset
        elif lag.exact:
            slack = max(EXACT_GAP, 0.2 * lag.seconds)
            assert abs(lag.seconds - truth) <= slack + 1e-6, (offset, lag, truth)
        else:
            assert lag.seconds <= truth + 1e-6, (offset, lag, truth)  # a lower bound


@settings(max_examples=60, deadline=None)
@given(older_records())
def test_seeds_leave_the_records_the_history_places_as_they_were(
    log: tuple[list[float], list[int]],
) -> None:
    appended, seeded = log
    seeded_history, plain = history_from(len(appended)), history_from(len(appended))
    for offset in seeded:
        seeded_history.seed(offset, appended[offset])
    for offset in range(len(appended), len(appended) + 4):
        assert seeded_history.lag(offset, T0 + 10) == plain.lag(offset, T0 + 10)


@settings(max_examples=200, deadline=None)
@given(
    offset=st.integers(-1, 30),
    stamped=st.floats(-10_000.0, 100.0),
    again=st.floats(-10_000.0, 0.0),
)
def test_a_timestamp_is_taken_only_where_it_agrees_with_the_history(
    offset: int, stamped: float, again: float
) -> None:
    """Only a record below the first end seen is seeded; a timestamp later than the first
    poll (which saw the record already) by up to EXACT_GAP is that poll's time, later than
    that a clock that is off (ignored); a record seeded keeps its first time."""
    history = history_from(20)
    at = T0 + stamped
    taken = history.seed(offset, at)
    assert taken == (0 <= offset < 20 and at <= T0 + EXACT_GAP)
    lag = history.lag(offset, T0 + 100)
    if taken:
        assert lag.exact and lag.seconds == pytest.approx(T0 + 100 - min(at, T0))
        assert not history.seed(offset, T0 + again)
        assert history.lag(offset, T0 + 100) == lag
    elif 0 <= offset < 20:
        assert not lag.exact and lag.seconds == pytest.approx(100.0)  # since the first poll


def test_without_a_history_nothing_is_seeded() -> None:
    assert not EndHistory().seed(0, T0)


def test_timestamps_out_of_order_give_a_lower_bound() -> None:
    """A producer's clock that went back: the record between them is not interpolated."""
    history = history_from(10)
    history.seed(2, T0 - 100)
    history.seed(6, T0 - 300)
    lag = history.lag(4, T0)
    assert not lag.exact and lag.seconds == pytest.approx(300.0)


# Which records a gate asks for, and what their timestamps do -----------------------------


def poll(
    at: float,
    committed: Mapping[str, Mapping[int, int]],
    end: Mapping[int, int],
    monotonic: float | None = None,
) -> PollResult:
    """A poll ``at`` seconds after ``W`` (``monotonic``: on that clock, when given)."""
    return PollResult(
        started_at=W + at,
        finished_at=W + at + 0.01,
        partition_counts={"t": len(end)},
        end_offsets={("t", p): o for p, o in end.items()},
        committed={g: {("t", p): o for p, o in offs.items()} for g, offs in committed.items()},
        monotonic=monotonic,
    )


def test_an_age_from_before_the_gate_is_exact_once_its_record_is_read() -> None:
    """b waits at 10 since records produced 13 minutes before the gate started."""
    ev = GateEvaluator("a", ["t"], ["b"])
    before = ev.observe(poll(1000.0, {"b": {0: 10}}, {0: 50}))
    assert ev.wanted_times() == [("t", 0, 10)]
    assert ev.wanted_times() == []  # asked once
    assert ev.seed({("t", 0, 10): W + 1000.0 - 780}) == 1
    state = ev.observe(poll(1015.0, {"b": {0: 10}}, {0: 50}))
    part = state.partitions[("t", 0)]
    assert not before.partitions[("t", 0)].waiting_exact
    assert part.waiting_exact and part.waiting_seconds == pytest.approx(795.0)
    position = part.groups["b"]
    assert position.lag_exact and position.lag_seconds == pytest.approx(795.0)
    status = gate_status(state, W + 1015.0)
    verdict = status["verdict"]
    assert verdict["released_within_exact"] is True and "≥" not in verdict["text"]
    assert status["partitions"][0]["waiting_s_exact"] is True
    assert status["groups"]["b"]["lag_s_exact"] is True
    assert ev.wanted_times() == []


def test_a_group_below_the_watermark_and_the_watermark_are_asked_for_oldest_first() -> None:
    ev = GateEvaluator("a", ["t"], ["b", "c", "d"])
    ev.observe(poll(1000.0, {"b": {0: 10, 1: 5}, "c": {0: 30, 1: 5}, "d": {0: 60}}, {0: 50, 1: 5}))
    # b and c wait at records older than the gate; d committed past the first end seen (the
    # history places its records). On partition 1 d never committed: no watermark, nothing
    # to read there.
    assert ev.wanted_times() == [("t", 0, 10), ("t", 0, 30)]


def test_a_fleet_asks_for_a_few_records_per_partition_and_a_few_in_all() -> None:
    groups = [f"g{i:03d}" for i in range(1000)]
    ev = GateEvaluator("a", ["t"], groups)
    committed = {g: {p: 1000 + i for p in range(16)} for i, g in enumerate(groups)}
    ev.observe(poll(1000.0, committed, dict.fromkeys(range(16), 5000)))
    wanted = ev.wanted_times()
    assert len(wanted) == 64
    per_partition = [sum(1 for _, p, _ in wanted if p == q) for q in range(16)]
    assert per_partition[:8] == [WANTED_PER_PARTITION] * 8 and sum(per_partition[8:]) == 0
    assert [o for _, p, o in wanted if p == 0] == list(range(1000, 1008))  # the oldest
    assert set(ev.wanted_times(limit=1000)).isdisjoint(wanted)  # each asked once
    assert len(ev.wanted_times(limit=5)) == 5


def test_a_record_not_answered_is_asked_for_again_after_a_while_one_answered_never() -> None:
    ev = GateEvaluator("a", ["t"], ["b", "c"])
    ev.observe(poll(1000.0, {"b": {0: 10}, "c": {0: 20}}, {0: 50}))
    assert ev.wanted_times() == [("t", 0, 10), ("t", 0, 20)]
    ev.seed({("t", 0, 10): None})  # gone (deleted by retention): never asked again
    ev.observe(poll(1000.0 + ASK_AGAIN_AFTER - 1, {"b": {0: 10}, "c": {0: 20}}, {0: 50}))
    assert ev.wanted_times() == []
    state = ev.observe(poll(1000.0 + ASK_AGAIN_AFTER, {"b": {0: 10}, "c": {0: 20}}, {0: 50}))
    assert ev.wanted_times() == [("t", 0, 20)]
    assert not state.partitions[("t", 0)].waiting_exact  # b's record is gone: a lower bound


@pytest.mark.parametrize(
    "timestamp",
    [None, 0.0, 1.0, W + 1000.0 + 60, W + 1000.0 + 3600],
    ids=["none", "zero", "unset-clock", "a-minute-ahead", "an-hour-ahead"],
)
def test_a_timestamp_the_gate_cannot_trust_leaves_a_lower_bound(timestamp: float | None) -> None:
    ev = GateEvaluator("a", ["t"], ["b"])
    ev.observe(poll(1000.0, {"b": {0: 10}}, {0: 50}))
    assert ev.seed({("t", 0, 10): timestamp}) == 0
    part = ev.observe(poll(1015.0, {"b": {0: 10}}, {0: 50})).partitions[("t", 0)]
    assert not part.waiting_exact and part.waiting_seconds == pytest.approx(15.0)
    assert ev.wanted_times() == []  # answered: not asked again


def test_a_timestamp_a_moment_after_the_first_poll_started_is_that_poll() -> None:
    """The first poll reads the end offsets a moment after it starts: a record appended
    meanwhile has a timestamp after the poll's start."""
    ev = GateEvaluator("a", ["t"], ["b"])
    ev.observe(poll(1000.0, {"b": {0: 10}}, {0: 50}))
    assert ev.seed({("t", 0, 10): W + 1000.3}) == 1
    part = ev.observe(poll(1015.0, {"b": {0: 10}}, {0: 50})).partitions[("t", 0)]
    assert part.waiting_exact and part.waiting_seconds == pytest.approx(15.0)


def test_timestamps_count_on_the_polls_monotonic_clock() -> None:
    """Ages are measured on the monotonic clock: a record's wall-clock timestamp is placed
    by the poll's offset between the two clocks, and a wall clock stepped later moves no
    age."""
    ev = GateEvaluator("a", ["t"], ["b"])
    ev.observe(poll(1000.0, {"b": {0: 10}}, {0: 50}, monotonic=5.0))
    ev.seed({("t", 0, 10): W + 400.0})
    part = ev.observe(poll(1010.0, {"b": {0: 10}}, {0: 50}, monotonic=15.0)).partitions[("t", 0)]
    assert part.waiting_exact and part.waiting_seconds == pytest.approx(610.0)
    stepped = ev.observe(poll(5000.0, {"b": {0: 10}}, {0: 50}, monotonic=20.0))
    assert stepped.partitions[("t", 0)].waiting_seconds == pytest.approx(615.0)


def test_records_between_two_read_ones_are_placed_between_them() -> None:
    """c committed 10 records after b, whose records arrived a second apart: both read, the
    records between them are interpolated (exact: they are close for their age)."""
    ev = GateEvaluator("a", ["t"], ["b", "c"])
    ev.observe(poll(1000.0, {"b": {0: 10}, "c": {0: 20}}, {0: 50}))
    ev.seed({("t", 0, 10): W + 400.0, ("t", 0, 20): W + 410.0})
    state = ev.observe(poll(1001.0, {"b": {0: 15}, "c": {0: 20}}, {0: 50}))
    position = state.partitions[("t", 0)].groups["b"]
    assert position.lag_exact and position.lag_seconds == pytest.approx(596.0)


def test_a_log_that_moved_backwards_is_asked_for_afresh() -> None:
    ev = GateEvaluator("a", ["t"], ["b"])
    ev.observe(poll(1000.0, {"b": {0: 10}}, {0: 50}))
    assert ev.wanted_times() == [("t", 0, 10)]
    ev.seed({("t", 0, 10): W + 400.0})
    ev.observe(poll(1001.0, {"b": {0: 10}}, {0: 5}))  # the topic was deleted and recreated
    ev.observe(poll(1002.0, {"b": {0: 10}}, {0: 30}))
    state = ev.observe(poll(1003.0, {"b": {0: 2}}, {0: 30}))
    assert not state.partitions[("t", 0)].waiting_exact  # the old record's time is gone
    assert ev.wanted_times() == [("t", 0, 2)]


def test_nothing_is_wanted_once_the_watermarks_are_within_the_history() -> None:
    ev = GateEvaluator("a", ["t"], ["b"])
    ev.observe(poll(1000.0, {"b": {0: 10}}, {0: 50}))
    ev.wanted_times()
    ev.observe(poll(1001.0, {"b": {0: 50}}, {0: 60}))
    assert ev.wanted_times() == []
    assert ev._asked.tried == {}  # nothing kept for it either


class Reads:
    """A stand-in for the poller's ``record_times``: answers from ``times``."""

    def __init__(self, times: Mapping[RecordAt, float | None]) -> None:
        self.times = times
        self.asked: list[list[RecordAt]] = []

    def __call__(self, records: list[RecordAt]) -> dict[RecordAt, float | None]:
        self.asked.append(list(records))
        return {r: self.times[r] for r in records if r in self.times}


def test_gates_are_seeded_together_and_nothing_is_read_when_none_wants_anything() -> None:
    """Two gates on the same topic: a record is read once for both."""
    a, b = GateEvaluator("a", ["t"], ["x"]), GateEvaluator("b", ["t"], ["x", "y"])
    polled = poll(1000.0, {"x": {0: 10}, "y": {0: 20}}, {0: 50})
    a.observe(polled)
    b.observe(polled)
    reads = Reads({("t", 0, 10): W + 400.0, ("t", 0, 20): W + 410.0})
    assert seed_record_times([a, b], reads) == 2
    assert reads.asked == [[("t", 0, 10), ("t", 0, 20)]]
    assert seed_record_times([a, b], reads) == 0 and len(reads.asked) == 1
    later = poll(1010.0, {"x": {0: 10}, "y": {0: 20}}, {0: 50})
    for gate in (a, b):
        part = gate.observe(later).partitions[("t", 0)]
        assert part.waiting_exact and part.waiting_seconds == pytest.approx(610.0)


def test_at_most_so_many_records_are_read_at_once_over_all_gates() -> None:
    gates = [GateEvaluator(f"a{i}", ["t"], [f"g{i}{j}" for j in range(8)]) for i in range(4)]
    committed = {f"g{i}{j}": {0: 100 * i + j} for i in range(4) for j in range(8)}
    polled = poll(1000.0, committed, {0: 1000})
    for gate in gates:
        gate.observe(polled)
    reads = Reads({})
    assert seed_record_times(gates, reads, limit=20) == 20
    assert len(reads.asked[0]) == 20


# Reading the records ---------------------------------------------------------------------


def test_the_first_record_read_past_an_offset_says_the_offset_is_gone() -> None:
    found: dict[RecordAt, float | None] = {}
    offsets = [3, 5, 9]
    assert not answer(("t", 0), offsets, 2, 1.0, found)  # before the first asked: read on
    assert answer(("t", 0), offsets, 6, 7.0, found)
    assert found == {("t", 0, 3): None, ("t", 0, 5): None} and offsets == [9]
    assert answer(("t", 0), offsets, 9, 9.5, found)
    assert found[("t", 0, 9)] == 9.5 and offsets == []


def test_offsets_are_read_per_partition_in_order_each_once() -> None:
    records = [("t", 1, 9), ("t", 0, 5), ("t", 1, 2), ("t", 1, 9), ("u", 0, 0), ("t", 0, -1)]
    assert offsets_by_partition(records) == {("t", 1): [2, 9], ("t", 0): [5], ("u", 0): [0]}


def test_the_reader_is_a_consumer_that_joins_no_group_and_commits_nothing() -> None:
    admin = {
        "bootstrap.servers": "b:9092",
        "security.protocol": "SASL_SSL",
        "sasl.password": "secret",
        "client.id": "gate",
        "group.instance.id": "x",
        "enable.idempotence": "true",
        "enable.auto.commit": "true",
    }
    config = reader_properties(admin)
    assert config["security.protocol"] == "SASL_SSL" and config["sasl.password"] == "secret"
    assert config["enable.auto.commit"] is False and config["enable.partition.eof"] is True
    assert config["group.id"] == "kafka-gate-record-times"
    assert "group.instance.id" not in config and "enable.idempotence" not in config


class FailingConsumer:
    """A consumer whose every call fails."""

    def __init__(self) -> None:
        self.calls = 0

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.calls += 1
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))

    def unassign(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_failed_read_is_logged_once_and_not_tried_again_for_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = FailingConsumer()
    reader = RecordReader({"bootstrap.servers": "b:9092"}, consumer=cast(Consumer, consumer))
    with caplog.at_level(logging.WARNING, logger="gate.poller"):
        assert reader.read([("t", 0, 1)]) == {}
        assert reader.read([("t", 0, 2)]) == {}  # not tried again (a minute)
    assert consumer.calls == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "gate.poller"]
    assert len(lines) == 1 and "broker down" in lines[0], lines
    assert reader.read([]) == {}


class SlowConsumer:
    """A consumer whose reads wait for ``go``; records whether it was closed."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.reading = threading.Event()
        self.closed = False

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.reading.set()
        self.go.wait(5)

    def poll(self, timeout: float) -> None:
        time.sleep(min(timeout, 0.01))

    def unassign(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_reader_closed_during_a_read_closes_its_consumer_as_the_read_ends() -> None:
    """The service may stop while a read runs in its worker thread: closing does not wait
    for the read, nor close the consumer under it."""
    consumer = SlowConsumer()
    reader = RecordReader(
        {"bootstrap.servers": "b:9092"}, timeout=0.2, consumer=cast(Consumer, consumer)
    )
    reading = threading.Thread(target=reader.read, args=([("t", 0, 1)],))
    reading.start()
    assert consumer.reading.wait(5)
    reader.close()
    assert not consumer.closed  # not under the read
    consumer.go.set()
    reading.join(5)
    assert consumer.closed
    assert reader.read([("t", 0, 1)]) == {}  # nothing after


# Real brokers ---------------------------------------------------------------------------


def produce_old(kafka: Kafka, topic: str, count: int, ago: float = 600.0) -> float:
    """``count`` records on partition 0, stamped (CreateTime) ``ago`` seconds ago and a
    second apart; returns the first one's timestamp."""
    producer = kafka.producer()
    first_ms = int((time.time() - ago) * 1000)
    for i in range(count):
        producer.produce(topic, value=str(i).encode(), partition=0, timestamp=first_ms + 1000 * i)
    producer.flush(30)
    return first_ms / 1000


def old_topic(kafka: Kafka, count: int = 10) -> tuple[str, float]:
    topic = kafka.create_topic(1, config=KEEP_FOREVER)
    return topic, produce_old(kafka, topic, count)


def with_poller(
    kafka: Kafka, groups: list[str], topic: str, test: Callable[[OffsetPoller], Any]
) -> Any:
    poller = OffsetPoller({"bootstrap.servers": kafka.bootstrap}, {g: [topic] for g in groups})
    try:
        return test(poller)
    finally:
        poller.close()


def test_ages_of_records_older_than_the_gate_are_exact_from_their_timestamps(
    kafka: Kafka,
) -> None:
    """Records produced ten minutes before the gate started; b committed at 3. The first
    state says "at least" how long they wait (since the gate's first poll); the records'
    timestamps are read once, and from the next state on the age is exact."""
    topic, first = old_topic(kafka)
    group = unique("CG")
    kafka.commit(group, topic, {0: 3})
    evaluator = GateEvaluator("a", [topic], [group])

    def run(poller: OffsetPoller) -> tuple[Any, Any, int, int]:
        before = evaluator.observe(poller.poll())
        asked = seed_record_times([evaluator], poller.record_times)
        after = evaluator.observe(poller.poll())
        return before, after, asked, seed_record_times([evaluator], poller.record_times)

    before, after, asked, again = with_poller(kafka, [group], topic, run)
    was, now = before.partitions[(topic, 0)], after.partitions[(topic, 0)]
    assert was.watermark == 3 and was.end_offset == 10
    assert not was.waiting_exact and was.waiting_seconds < 60  # since the gate's first poll
    assert asked == 1 and again == 0  # read once; then nothing is wanted: no read at all
    expected = after.snapshot.polled_at - (first + 3)
    assert 590 < expected < 660
    assert now.waiting_exact and now.waiting_seconds == pytest.approx(expected, abs=0.5)
    position = now.groups[group]
    assert position.lag_exact and position.lag_seconds == pytest.approx(expected, abs=0.5)
    verdict = gate_status(after, after.snapshot.polled_at)["verdict"]
    assert verdict["released_within_exact"] is True and "≥" not in verdict["text"]


def test_the_admin_clients_process_reads_the_timestamps_for_the_gates_it_evaluates(
    kafka: Kafka,
) -> None:
    topic, first = old_topic(kafka)
    group = unique("CG")
    kafka.commit(group, topic, {0: 4})
    poller = IsolatedPoller({"bootstrap.servers": kafka.bootstrap}, {group: [topic]})
    poller.evaluate({"a": GateEvaluator("a", [topic], [group])})
    try:
        poller.poll()
        before = poller.evaluated["a"]
        poller.poll()  # the child read the record's timestamp after answering the first
        after = poller.evaluated["a"]
        direct = poller.record_times([(topic, 0, 4), (topic, 0, 10)])
    finally:
        poller.close()
    assert not isinstance(before, str) and not isinstance(after, str)
    assert not before.partitions[(topic, 0)].waiting_exact
    part = after.partitions[(topic, 0)]
    expected = after.snapshot.polled_at - (first + 4)
    assert part.waiting_exact and part.waiting_seconds == pytest.approx(expected, abs=0.5)
    # Through the pipe: the record's timestamp, and none past the end of the partition.
    assert direct == {(topic, 0, 4): pytest.approx(first + 4), (topic, 0, 10): None}


def test_a_record_deleted_since_is_skipped_and_not_asked_for_again(kafka: Kafka) -> None:
    """Records 0-4 deleted (as retention does): b's record at 2 is gone, its age stays a
    lower bound and is not asked for again; c's record at 6 is read."""
    topic, first = old_topic(kafka)
    try:
        for future in kafka.admin.delete_records([TopicPartition(topic, 0, 5)]).values():
            future.result(10)
    except KafkaException as exc:
        pytest.skip(f"{kafka.broker.name} does not delete records (DeleteRecords: {exc})")
    b, c = unique("CG-b"), unique("CG-c")
    kafka.commit(b, topic, {0: 2})
    kafka.commit(c, topic, {0: 6})
    evaluator = GateEvaluator("a", [topic], [b, c])

    def run(poller: OffsetPoller) -> tuple[Any, int, list[RecordAt]]:
        evaluator.observe(poller.poll())
        asked = seed_record_times([evaluator], poller.record_times)
        return evaluator.observe(poller.poll()), asked, evaluator.wanted_times()

    state, asked, wanted = with_poller(kafka, [b, c], topic, run)
    assert asked == 2 and wanted == []
    part = state.partitions[(topic, 0)]
    assert not part.waiting_exact and not part.groups[b].lag_exact
    expected = state.snapshot.polled_at - (first + 6)
    assert part.groups[c].lag_exact
    assert part.groups[c].lag_seconds == pytest.approx(expected, abs=0.5)


def test_records_are_read_where_they_are_far_apart_and_none_past_the_end(kafka: Kafka) -> None:
    """One read of records far apart on a partition (sought, not read through) and of an
    offset past its end; a second read with the same consumer."""
    topic = kafka.create_topic(2, config=KEEP_FOREVER)
    first = produce_old(kafka, topic, 3000)
    reader = RecordReader({"bootstrap.servers": kafka.bootstrap})
    wanted: Collection[RecordAt] = [(topic, 0, o) for o in (5, 2500, 40, 3000, 2999)]
    try:
        started = time.monotonic()
        times = reader.read([*wanted, (topic, 1, 0)])
        again = reader.read([(topic, 0, 7)])
        took = time.monotonic() - started
    finally:
        reader.close()
    assert times == {
        (topic, 0, 5): pytest.approx(first + 5),
        (topic, 0, 40): pytest.approx(first + 40),
        (topic, 0, 2500): pytest.approx(first + 2500),
        (topic, 0, 2999): pytest.approx(first + 2999),
        (topic, 0, 3000): None,
        (topic, 1, 0): None,  # an empty partition
    }
    assert again == {(topic, 0, 7): pytest.approx(first + 7)}
    assert took < 4.0
