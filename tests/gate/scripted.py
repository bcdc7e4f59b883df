"""A scripted admin client and clocks the tests set, for driving the gate service's poll
cycle without a broker and without waiting."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition

Partition = tuple[str, int]


def _failed(code: int) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(KafkaException(KafkaError(code)))
    return future


def _done(value: object) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class ScriptedAdmin:
    """Stands in for ``confluent_kafka.admin.AdminClient`` where the gate's poller uses it:
    topics and their partition counts, end offsets, committed offsets per group, groups whose
    reads the cluster refuses (``denied``) and a cluster that does not answer (``down``)."""

    def __init__(self, topics: Mapping[str, int]) -> None:
        self.topics = dict(topics)
        self.ends: dict[Partition, int] = {}
        self.committed: dict[str, dict[Partition, int]] = {}
        self.denied: set[str] = set()
        self.down = False
        self.group_reads = 0
        self.delay = 0.0
        """Seconds each end-offset read takes (a slow cluster)."""

    def list_topics(self, timeout: float | None = None) -> SimpleNamespace:
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return SimpleNamespace(
            topics={
                name: SimpleNamespace(error=None, partitions=dict.fromkeys(range(count)))
                for name, count in self.topics.items()
            }
        )

    def list_consumer_group_offsets(
        self, requests: list[ConsumerGroupTopicPartitions], request_timeout: float | None = None
    ) -> dict[str, Future[Any]]:
        (request,) = requests
        group = request.group_id
        self.group_reads += 1
        if self.down:
            return {group: _failed(KafkaError._TRANSPORT)}
        if group in self.denied:
            return {group: _failed(KafkaError.GROUP_AUTHORIZATION_FAILED)}
        offsets = self.committed.get(group, {})
        found = [
            TopicPartition(tp.topic, tp.partition, offsets.get((tp.topic, tp.partition), -1001))
            for tp in request.topic_partitions
        ]
        return {group: _done(SimpleNamespace(topic_partitions=found))}

    def list_offsets(
        self, request: Iterable[TopicPartition], request_timeout: float | None = None
    ) -> dict[TopicPartition, Future[Any]]:
        time.sleep(self.delay)
        if self.down:
            return {tp: _failed(KafkaError._TRANSPORT) for tp in request}
        return {
            tp: _done(SimpleNamespace(offset=self.ends.get((tp.topic, tp.partition), 0)))
            for tp in request
        }

    def poll(self, timeout: float | None = None) -> int:
        return 0


class Clocks:
    """The wall clock (``time.time``) and the monotonic clock (``time.monotonic``) as the
    gate reads them, moved by the test alone: ``advance`` moves both, as time passing does;
    ``step_wall`` moves the wall clock alone, as an operator or NTP stepping the system clock
    does. With ``follow_real`` they also follow the real clocks (for code that sleeps)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, follow_real: bool = False) -> None:
        real_wall, real_monotonic = time.time, time.monotonic
        start_wall, start_monotonic = real_wall(), real_monotonic()
        self._wall = real_wall if follow_real else lambda: start_wall
        self._monotonic = real_monotonic if follow_real else lambda: start_monotonic
        self.wall_offset = 0.0
        self.monotonic_offset = 0.0
        monkeypatch.setattr(time, "time", self.time)
        monkeypatch.setattr(time, "monotonic", self.monotonic)

    def time(self) -> float:
        return self._wall() + self.wall_offset

    def monotonic(self) -> float:
        return self._monotonic() + self.monotonic_offset

    def advance(self, seconds: float) -> None:
        self.wall_offset += seconds
        self.monotonic_offset += seconds

    def step_wall(self, seconds: float) -> None:
        self.wall_offset += seconds
