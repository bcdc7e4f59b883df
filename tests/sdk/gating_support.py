"""Dependency services for gating tests, and the invariant check."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition

from tests.support import Kafka


@dataclass
class Commit:
    sent: float  # monotonic time just before the commit request was sent
    partition: int
    offset: int


class DependencyService(threading.Thread):
    """A plain consumer that processes records at a changing pace and commits as it goes,
    logging every commit with the moment it was sent."""

    def __init__(
        self,
        kafka: Kafka,
        topic: str,
        group: str,
        partitions: int,
        per_record: tuple[float, float],
        pause_every: float = 0.0,
        pause_for: float = 0.0,
        commit_every: float = 0.05,
        seed: int = 0,
    ) -> None:
        super().__init__(name=group, daemon=True)
        self.kafka, self.topic, self.group, self.partitions = kafka, topic, group, partitions
        self.per_record = per_record
        self.pause_every, self.pause_for = pause_every, pause_for
        self.commit_every = commit_every
        self.random = random.Random(seed)
        self.commits: list[Commit] = []
        self.processed = 0
        self.stop_event = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.kafka.bootstrap,
                "group.id": self.group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
        pending: dict[int, int] = {}
        started = last_commit = time.monotonic()
        try:
            while not self.stop_event.is_set():
                now = time.monotonic()
                if (
                    self.pause_every
                    and (now - started) % self.pause_every > self.pause_every - self.pause_for
                ):
                    time.sleep(0.02)
                else:
                    message = consumer.poll(0.02)
                    if message is not None and message.error() is None:
                        time.sleep(self.random.uniform(*self.per_record))
                        pending[message.partition()] = message.offset() + 1
                        self.processed += 1
                if pending and time.monotonic() - last_commit >= self.commit_every:
                    sent = time.monotonic()
                    consumer.commit(
                        offsets=[TopicPartition(self.topic, p, o) for p, o in pending.items()],
                        asynchronous=False,
                    )
                    with self.lock:
                        self.commits += [Commit(sent, p, o) for p, o in pending.items()]
                    pending.clear()
                    last_commit = time.monotonic()
        finally:
            consumer.close()

    def committed_past(self, partition: int, offset: int, before: float) -> bool:
        """Whether a commit past ``offset`` was sent before ``before``."""
        with self.lock:
            return any(
                c.partition == partition and c.offset > offset and c.sent <= before
                for c in self.commits
            )

    def stop(self) -> None:
        self.stop_event.set()
        self.join(10)


@dataclass
class Starts:
    """Every start of the dependent's handler."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    starts: list[tuple[float, int, int]] = field(default_factory=list)

    def __call__(self, record) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            self.starts.append((time.monotonic(), record.partition, record.offset))

    def done(self) -> set[tuple[int, int]]:
        with self.lock:
            return {(p, o) for _, p, o in self.starts}


def violations(starts: Starts, dependencies: list[DependencyService]) -> list[str]:
    """Records the dependent started before every dependency had committed past them."""
    found = []
    with starts.lock:
        records = list(starts.starts)
    for started, partition, offset in records:
        for dependency in dependencies:
            if not dependency.committed_past(partition, offset, started):
                found.append(
                    f"{partition}@{offset} started before {dependency.group} committed past it"
                )
    return found
