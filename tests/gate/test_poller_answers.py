"""Answers of the groups' offset requests arriving at different times: those that come while
the poll waits are all in it, one that comes after the poll stopped waiting is a failure of
that poll (its last snapshot stays) and never changes the poll already returned."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any, cast

from confluent_kafka.admin import AdminClient

from gate._poller import OffsetPoller
from tests.gate.scripted import ScriptedAdmin


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
