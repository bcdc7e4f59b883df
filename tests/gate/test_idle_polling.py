"""Idle groups read less often (``idle_poll_interval_ms``), on a real broker and on a scripted
admin client: a group found at the end of every partition is not read again until the idle
interval passes, while records arriving past it wake it in the same poll, so no watermark ever
rises on an old read. An offset beyond the end is never at the end, and an end offset that
goes down (the topic deleted and recreated) wakes every idle group of its topic."""

from __future__ import annotations

import time
from typing import cast

import httpx
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from gate import DependencyStatus, GateEvaluator, PollResult
from gate.poll._isolated import IsolatedPoller
from gate.poll._poller import OffsetPoller
from tests.gate.scripted import ScriptedAdmin
from tests.support import Kafka, gate_config, serve_gate, unique, wait_until


def test_a_caught_up_group_is_read_once_per_idle_interval(kafka: Kafka) -> None:
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 5, 1: 5})
    idle, behind = unique("CG-idle"), unique("CG-behind")
    kafka.commit(idle, topic, {0: 5, 1: 5})
    kafka.commit(behind, topic, {0: 2, 1: 5})
    poller = OffsetPoller(
        {"bootstrap.servers": kafka.bootstrap}, {idle: [topic], behind: [topic]},
        idle_interval=4.0,
    )  # fmt: skip
    first = poller.poll()
    assert first.carried == {} and first.committed[idle] == {(topic, 0): 5, (topic, 1): 5}
    started = time.monotonic()
    second = poller.poll()
    # The caught-up group's last read counts; the group with lag is read at every poll.
    assert set(second.carried) == {idle} and second.carried[idle] == first.started_at
    assert second.committed[idle] == {(topic, 0): 5, (topic, 1): 5}
    assert second.committed[behind] == {(topic, 0): 2, (topic, 1): 5}
    kafka.commit(idle, topic, {0: 4, 1: 5})  # a rewind: seen once the interval has passed
    assert poller.poll().committed[idle] == {(topic, 0): 5, (topic, 1): 5}
    time.sleep(max(0.0, 4.1 - (time.monotonic() - started)))
    later = poller.poll()
    assert later.carried == {} and later.committed[idle] == {(topic, 0): 4, (topic, 1): 5}


def test_records_arriving_wake_an_idle_group_in_the_same_poll(kafka: Kafka) -> None:
    """The group is read again in the poll whose end offsets show records past its last read:
    its old read never stands for records it has not seen."""
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 3, 1: 3})
    group = unique("CG")
    kafka.commit(group, topic, {0: 3, 1: 3})
    poller = IsolatedPoller(
        {"bootstrap.servers": kafka.bootstrap}, {group: [topic]}, idle_interval=600
    )
    evaluator = GateEvaluator("a", [topic], [group])
    try:
        polls: list[PollResult] = [poller.poll(), poller.poll()]
        assert group in polls[-1].carried
        kafka.produce(topic, {1: 2})
        kafka.commit(group, topic, {0: 3, 1: 4})
        polls.append(poller.poll())
        polls.append(poller.poll())  # it has lag now: read at every poll
        kafka.commit(group, topic, {0: 3, 1: 5})
        polls.append(poller.poll())
        polls.append(poller.poll())  # caught up again: idle
    finally:
        poller.close()
    assert [group in p.carried for p in polls] == [False, True, False, False, False, True]
    assert polls[2].committed[group] == {(topic, 0): 3, (topic, 1): 4}
    assert polls[2].end_offsets[(topic, 1)] == 5
    states = [evaluator.observe(p) for p in polls]
    assert [s.snapshot.watermarks[(topic, 1)] for s in states] == [3, 3, 4, 4, 5, 5]
    assert [s.carried.get(group) is not None for s in states] == [group in p.carried for p in polls]


def test_the_status_shows_how_old_carried_offsets_are(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 4})
    idle, behind = unique("CG-idle"), unique("CG-behind")
    kafka.commit(idle, topic, {0: 4})
    kafka.commit(behind, topic, {0: 1})
    config = gate_config(
        kafka.bootstrap,
        {"a": {"topics": [topic], "depends_on": [idle, behind]}},
        idle_poll_interval_ms=60_000,
    )
    with serve_gate(config) as gate:

        def carried() -> dict | None:
            response = httpx.get(f"{gate.url}/status/a", timeout=5)
            if response.status_code != 200:
                return None  # no snapshot yet
            groups = response.json()["groups"]
            return groups if groups[idle]["offsets_age_s"] is not None else None

        groups = wait_until(carried, what="a carried read")
        assert groups[idle]["offsets_age_s"] >= 0 and groups[idle]["status"] == "OK"
        assert groups[behind]["offsets_age_s"] is None
        metrics = httpx.get(f"{gate.url}/metrics", timeout=5).text
        assert "gate_poll_groups_carried 1.0" in metrics
        # The dependent's own group (no commits: not caught up) is read at every poll too.
        assert "gate_poll_groups_read 2.0" in metrics


def scripted_poller(admin: ScriptedAdmin, topics_by_group: dict[str, list[str]]) -> OffsetPoller:
    """A poller that reads idle groups every 600 s and partition counts once: a topic deleted
    and recreated with as many partitions between two metadata reads."""
    return OffsetPoller(
        {"bootstrap.servers": "scripted:9092"},
        topics_by_group,
        admin=cast(AdminClient, admin),
        idle_interval=600.0,
        metadata_interval=600.0,
    )


def test_an_end_offset_that_goes_down_wakes_the_idle_groups_of_its_topic() -> None:
    """The topic is deleted and recreated with fewer records, and its group's offsets go with
    it: the group's read of the old log (100, beyond the new end) is not carried, so its
    records are not released on it. An idle group of another topic stays idle."""
    admin = ScriptedAdmin({"orders": 1, "audit": 1})
    admin.ends = {("orders", 0): 100, ("audit", 0): 5}
    admin.committed = {"CG-orders": {("orders", 0): 100}, "CG-audit": {("audit", 0): 5}}
    poller = scripted_poller(admin, {"CG-orders": ["orders"], "CG-audit": ["audit"]})
    evaluator = GateEvaluator("a", ["orders"], ["CG-orders"])
    polls = [poller.poll(), poller.poll()]
    assert set(polls[-1].carried) == {"CG-orders", "CG-audit"}
    admin.ends[("orders", 0)] = 50  # deleted and recreated: 50 records on the new log
    del admin.committed["CG-orders"]
    reads = admin.group_reads
    polls.append(poller.poll())
    assert admin.group_reads == reads + 1  # the woken group alone
    assert set(polls[-1].carried) == {"CG-audit"}
    assert polls[-1].committed["CG-orders"] == {}
    states = [evaluator.observe(p) for p in polls]
    assert [s.snapshot.watermarks[("orders", 0)] for s in states] == [100, 100, None]
    assert states[-1].groups["CG-orders"] == DependencyStatus.MISSING
    # Read at every poll now (no committed offset); committed on the new log, then idle again.
    admin.committed["CG-orders"] = {("orders", 0): 50}
    polls += [poller.poll(), poller.poll()]
    assert ["CG-orders" in p.carried for p in polls[3:]] == [False, True]
    assert evaluator.observe(polls[-1]).snapshot.watermarks[("orders", 0)] == 50


def test_a_committed_offset_beyond_the_end_is_not_at_the_end() -> None:
    """A group's offset past the end of the log (committed on the log a recreated topic had
    before, and kept by the broker) is read at every poll: it is the truth while it is read,
    never carried; its deletion is seen at the next poll."""
    admin = ScriptedAdmin({"orders": 2})
    admin.ends = {("orders", 0): 50, ("orders", 1): 7}
    admin.committed = {"CG": {("orders", 0): 100, ("orders", 1): 7}}
    poller = scripted_poller(admin, {"CG": ["orders"]})
    evaluator = GateEvaluator("a", ["orders"], ["CG"])
    polls = [poller.poll(), poller.poll()]
    assert [p.carried for p in polls] == [{}, {}]
    assert polls[-1].committed["CG"] == {("orders", 0): 100, ("orders", 1): 7}  # not clamped
    del admin.committed["CG"]
    polls.append(poller.poll())
    assert polls[-1].carried == {} and polls[-1].committed["CG"] == {}
    states = [evaluator.observe(p) for p in polls]
    assert [s.snapshot.watermarks[("orders", 0)] for s in states] == [100, 100, None]
    assert states[-1].groups["CG"] == DependencyStatus.MISSING


def test_a_carried_read_is_at_the_end_of_every_partition_it_is_read_on() -> None:
    """Whatever the end offsets do, an offset carried is the end of its partition at that
    poll: a carried read never puts a watermark beyond the end of the log."""
    admin = ScriptedAdmin({"orders": 2})
    admin.ends = {("orders", 0): 100, ("orders", 1): 100}
    admin.committed = {"CG": {("orders", 0): 100, ("orders", 1): 100}}
    poller = scripted_poller(admin, {"CG": ["orders"]})
    for end in [100, 100, 40, 40, 100, 100, 100, 0, 0, 100, 100, 120, 120]:
        admin.ends[("orders", 0)] = end  # recreated, grown, or emptied again
        poll = poller.poll()
        for group in poll.carried:
            for tp, offset in poll.committed[group].items():
                assert offset == poll.end_offsets[tp]


def test_a_recreated_topic_wakes_its_idle_groups(kafka: Kafka) -> None:
    """A topic deleted and recreated with fewer records between two metadata reads: its idle
    group's read of the old log is not carried into the new one."""
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 100})
    group = unique("CG")
    kafka.commit(group, topic, {0: 100})
    poller = OffsetPoller(
        {"bootstrap.servers": kafka.bootstrap},
        {group: [topic]},
        idle_interval=600.0,
        metadata_interval=600.0,
    )
    evaluator = GateEvaluator("a", [topic], [group])
    polls = [poller.poll(), poller.poll()]
    assert group in polls[-1].carried
    for future in kafka.admin.delete_topics([topic]).values():
        future.result(10)
    wait_until(lambda: topic not in kafka.admin.list_topics(timeout=5).topics, what="deleted")
    kafka.create_topic(1, name=topic)
    kafka.produce(topic, {0: 50})
    # Tansu deletes a deleted topic's group offsets, noida-db keeps them: the group is deleted
    # too, so that it has no committed offset on either.
    for future in kafka.admin.delete_consumer_groups([group]).values():
        try:
            future.result(10)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.GROUP_ID_NOT_FOUND:
                raise
    polls.append(poller.poll())
    assert polls[-1].end_offsets[(topic, 0)] == 50
    assert group not in polls[-1].carried and polls[-1].committed[group] == {}
    states = [evaluator.observe(p) for p in polls]
    assert [s.snapshot.watermarks[(topic, 0)] for s in states] == [100, 100, None]
    assert states[-1].groups[group] == DependencyStatus.MISSING
