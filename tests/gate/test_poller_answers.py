"""Answers of the groups' offset requests arriving at different times: those that come while
the poll waits are all in it, one that comes after the poll stopped waiting is a failure of
that poll (its last snapshot stays) and never changes the poll already returned; an answer is
read the same whatever the order of its partitions."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any, cast

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
from hypothesis import given
from hypothesis import strategies as st

from gate.poll._poller import OffsetPoller, read_offsets
from tests.gate.scripted import ScriptedAdmin
from tests.support import Kafka, unique


class LateAdmin(ScriptedAdmin):
    """Answers each group's offsets from another thread after ``delays[group]`` seconds."""

    def __init__(self, delays: dict[str, float]) -> None:
        super().__init__({"t": 2})
        self.delays = delays
        self.answered = threading.Event()
        self.late: list[threading.Thread] = []

    def list_consumer_group_offsets(self, requests: Any, request_timeout: Any = None) -> Any:
        ready = super().list_consumer_group_offsets(requests, request_timeout)
        ((group, done),) = ready.items()
        future: Future[Any] = Future()

        def answer() -> None:
            time.sleep(self.delays[group])
            future.set_result(done.result())

        thread = threading.Thread(target=answer)
        thread.start()
        self.late.append(thread)
        return {group: future}


def test_answers_in_time_are_read_and_a_late_one_fails_the_group_alone() -> None:
    delays = {f"g{i}": 0.01 * i for i in range(20)} | {"slow": 2.0}
    admin = LateAdmin(delays)
    admin.ends = {("t", 0): 100, ("t", 1): 100}
    admin.committed = {g: {("t", 0): i, ("t", 1): i + 1} for i, g in enumerate(delays)}
    poller = OffsetPoller(
        {"bootstrap.servers": "scripted:9092"},
        {g: ["t"] for g in delays},
        request_timeout=0.5,
        admin=cast(AdminClient, admin),
    )
    poll = poller.poll()
    assert set(poll.committed) == set(delays) - {"slow"}
    for i, group in enumerate(delays):
        if group != "slow":
            assert poll.committed[group] == {("t", 0): i, ("t", 1): i + 1}
    assert poll.failed_groups == {"slow"}
    assert any(e.startswith("group slow:") for e in poll.errors)
    before = {g: dict(o) for g, o in poll.committed.items()}
    for thread in admin.late:
        thread.join(5)  # the slow answer arrives after the poll
    assert poll.committed == before and "slow" not in poll.committed


class Answered:
    """An answered partition as the poller reads it (confluent-kafka cannot build a
    ``TopicPartition`` with an error): equal to another with the same topic and partition,
    whatever their offsets, as ``TopicPartition`` is."""

    def __init__(self, topic: str, partition: int, offset: int, error: object = None) -> None:
        self.topic, self.partition, self.offset, self.error = topic, partition, offset, error

    def __eq__(self, other: object) -> bool:
        return (self.topic, self.partition) == (other.topic, other.partition)  # type: ignore[attr-defined]

    def __ne__(self, other: object) -> bool:
        return not self == other


def by_name(answer: list[Answered]) -> dict[tuple[str, int], int]:
    """Each answered partition read by its name: what ``read_offsets`` must give."""
    return {
        (tp.topic, tp.partition): tp.offset for tp in answer if tp.error is None and tp.offset >= 0
    }


partitions = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 5)), unique=True, max_size=12
).map(sorted)


@st.composite
def asked_and_answered(draw: st.DrawFn) -> tuple[list[tuple[str, int]], list[Answered]]:
    asked = draw(partitions)
    answer = [
        Answered(
            topic,
            partition,
            draw(st.sampled_from([-1001, -1, 0, 7, 2**40])),
            draw(st.sampled_from([None, None, None, "NOT_COORDINATOR"])),
        )
        for topic, partition in asked
    ]
    # The answer in the order asked, or shuffled, short of some partitions, or with others.
    how = draw(st.sampled_from(["as asked", "shuffled", "fewer", "others", "replaced"]))
    if how == "shuffled":
        answer = draw(st.permutations(answer))
    elif how == "fewer" and answer:
        del answer[draw(st.integers(0, len(answer) - 1))]
    elif how == "others":
        answer += [Answered("d", p, 3) for p in draw(st.lists(st.integers(0, 3), max_size=2))]
    elif how == "replaced" and answer:
        at = draw(st.integers(0, len(answer) - 1))
        topic, partition = answer[at].topic, answer[at].partition
        other = draw(st.sampled_from([(topic, partition + 1), ("d", partition)]))
        answer[at] = Answered(*other, 9)
    return asked, answer


@given(asked_and_answered())
def test_an_answer_reads_the_same_in_the_order_asked_as_by_name(
    case: tuple[list[tuple[str, int]], list[Answered]],
) -> None:
    asked, answer = case
    requested = [Answered(topic, partition, -1001) for topic, partition in asked]
    read = read_offsets(cast(Any, answer), cast(Any, requested), asked)
    assert read == by_name(answer)


def test_confluent_kafka_compares_partitions_by_topic_and_number_alone() -> None:
    """``read_offsets`` relies on it: a partition answered at the place of another one asked
    must compare unequal to it, whatever its offset."""
    assert TopicPartition("t", 1, 42) == TopicPartition("t", 1)
    assert TopicPartition("t", 1, 42) != TopicPartition("u", 1)
    assert TopicPartition("t", 1, 42) != TopicPartition("t", 2)
    assert TopicPartition("tt", 1) != TopicPartition("t", 1)


def test_the_brokers_answer_a_group_on_two_topics_in_the_order_asked(kafka: Kafka) -> None:
    """librdkafka answers a group's partitions in the order asked (sorted by topic, then
    partition) on both brokers, so the poller reads them without naming each; the offsets it
    reads are those committed, partitions without a commit left out."""
    prefix = unique("topic")
    first, second = kafka.create_topic(3, f"{prefix}-a"), kafka.create_topic(2, f"{prefix}-b")
    kafka.produce(first, {0: 2, 1: 2, 2: 4})
    kafka.produce(second, {0: 5, 1: 7})
    group = unique("CG-order")
    kafka.commit(group, second, {0: 4, 1: 6})
    kafka.commit(group, first, {0: 1, 2: 3})
    asked = [TopicPartition(t, p) for t, n in ((first, 3), (second, 2)) for p in range(n)]
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    request = [ConsumerGroupTopicPartitions(group, asked)]
    answer = admin.list_consumer_group_offsets(request)[group].result(10).topic_partitions
    assert [(tp.topic, tp.partition) for tp in answer] == [(tp.topic, tp.partition) for tp in asked]
    poller = OffsetPoller({"bootstrap.servers": kafka.bootstrap}, {group: [second, first]})
    assert poller.poll().committed[group] == {
        (first, 0): 1, (first, 2): 3, (second, 0): 4, (second, 1): 6
    }  # fmt: skip


class SlowMetadata(ScriptedAdmin):
    """Takes ``delay`` seconds to answer the metadata request a poll starts with."""

    def __init__(self, delay: float) -> None:
        super().__init__({"t": 1})
        self.delay = delay

    def list_topics(self, timeout: float | None = None) -> Any:
        time.sleep(self.delay)
        return super().list_topics(timeout)


def test_a_poll_says_when_it_asked_for_the_offsets_after_refreshing_metadata() -> None:
    """The snapshot's version comes from when the offsets were asked for, not from the poll's
    start: a replica slow to refresh its metadata reads later than another that started after
    it, and must not lose to that replica's older read."""
    admin = SlowMetadata(0.3)
    admin.ends = {("t", 0): 10}
    admin.committed = {"g": {("t", 0): 4}}
    poller = OffsetPoller(
        {"bootstrap.servers": "scripted:9092"}, {"g": ["t"]}, admin=cast(AdminClient, admin)
    )
    poll = poller.poll()
    assert poll.committed == {"g": {("t", 0): 4}}
    assert poll.asked_at is not None
    assert poll.started_at + 0.3 <= poll.asked_at <= poll.finished_at


def test_a_group_whose_reads_keep_timing_out_gets_a_new_client_while_others_answer() -> None:
    """After a broker restart librdkafka's admin client can time out on one group's reads for
    good while the others answer (a gate then serves its last snapshot for minutes): once a
    group's reads have timed out for ``rebuild_after`` seconds, the poller starts a new
    client, and says so."""
    delays = {"answers": 0.0, "stuck": 1.5}
    committed = {g: {("t", 0): 3, ("t", 1): 4} for g in delays}
    admin = LateAdmin(delays)
    admin.ends, admin.committed = {("t", 0): 10, ("t", 1): 10}, committed
    mended = LateAdmin(dict.fromkeys(delays, 0.0))
    mended.ends, mended.committed = admin.ends, committed
    poller = OffsetPoller(
        {"bootstrap.servers": "scripted:9092"},
        {g: ["t"] for g in delays},
        request_timeout=0.1,
        rebuild_after=1.0,
        admin=cast(AdminClient, admin),
    )
    poller._new_admin = lambda: cast(AdminClient, mended)  # type: ignore[method-assign]
    errors: list[str] = []
    for _ in range(3):
        poll = poller.poll()
        errors.extend(poll.errors)
        assert "answers" in poll.committed
        if poller.rebuilds:
            break
    assert poller.rebuilds == 1, errors
    assert any("group stuck timed out" in e and "new client" in e for e in errors), errors
    again = poller.poll()
    assert again.committed["stuck"] == {("t", 0): 3, ("t", 1): 4} and not again.errors
    for thread in admin.late:
        thread.join(5)


def test_an_end_offset_missing_from_the_answer_is_an_error_not_an_empty_log() -> None:
    """librdkafka can answer an end-offset read with no offset (OFFSET_INVALID, -1001: seen
    while a broker hung). It is a failed read: never an end, which would read as a log with
    nothing in it (every record released). A partition whose end was never read fails its
    topic for that poll (no gate on it is evaluated from it); once read, it does not."""
    admin = ScriptedAdmin({"t": 2})
    admin.committed = {"g": {("t", 0): 4, ("t", 1): 4}}
    admin.ends = {("t", 0): 10, ("t", 1): -1001}
    poller = OffsetPoller(
        {"bootstrap.servers": "scripted:9092"}, {"g": ["t"]}, admin=cast(AdminClient, admin)
    )
    first = poller.poll()
    assert first.end_offsets == {("t", 0): 10}
    assert first.failed_topics == {"t"}
    assert any("no end offset for t[1]" in error for error in first.errors), first.errors
    assert first.committed["g"] == {("t", 0): 4, ("t", 1): 4}  # watermarks are read all the same

    admin.ends[("t", 1)] = 20
    assert poller.poll().end_offsets == {("t", 0): 10, ("t", 1): 20}
    admin.ends[("t", 1)] = -1001
    later = poller.poll()
    assert later.end_offsets == {("t", 0): 10}
    assert not later.failed_topics  # the last end read stands in (the evaluator's)
    assert any("no end offset for t[1]" in error for error in later.errors), later.errors
