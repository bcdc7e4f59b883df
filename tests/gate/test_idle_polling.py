"""Idle groups read less often (``idle_poll_interval_ms``), on a real broker: a group found at
the end of every partition is not read again until the idle interval passes, while records
arriving past it wake it in the same poll, so no watermark ever rises on an old read."""

from __future__ import annotations

import time

import httpx

from gate import GateEvaluator, PollResult
from gate._isolated import IsolatedPoller
from gate._poller import OffsetPoller
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
