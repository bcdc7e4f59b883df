"""Whether the broker keeps commit metadata (where offset maps go) is probed at start: members
of one group starting together must each find what the broker does, never each other's probe
half done (a probe that found "dropped" turns offset maps off for the run: exactly once, a
crash then writes twice the outputs of records completed beyond the committed offset)."""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka import Consumer

from sdk.consumer._maps import broker_keeps_metadata
from tests.support import Kafka, unique


class HeldRead:
    """A consumer whose probe commits at once but reads its commit back only when told."""

    def __init__(self, config: dict[str, Any], committed: threading.Event, go: threading.Event):
        self._consumer = Consumer(config)
        self._committed, self._go = committed, go

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        answer = self._consumer.commit(*args, **kwargs)
        self._committed.set()
        return answer

    def committed(self, *args: Any, **kwargs: Any) -> Any:
        self._go.wait(30)
        return self._consumer.committed(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def test_a_member_probing_while_another_does_finds_what_the_broker_does(kafka: Kafka) -> None:
    """One member commits its probe; another member of the group probes from start to end
    (its probe's clean-up included) before the first reads its commit back."""
    topic = kafka.create_topic(1)
    group = unique("probed")
    config: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap, "group.id": group}
    committed, go = threading.Event(), threading.Event()
    found: list[bool | None] = []

    def first() -> None:
        held = lambda c: HeldRead(c, committed, go)  # noqa: E731
        found.append(broker_keeps_metadata(config, group, topic, held))  # type: ignore[arg-type]

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert committed.wait(30), "the first member's probe did not commit"
        second = broker_keeps_metadata(config, group, topic, Consumer)
    finally:
        go.set()
        thread.join(60)
    assert second == kafka.broker.keeps_metadata
    assert found == [kafka.broker.keeps_metadata]
