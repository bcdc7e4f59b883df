"""Helpers for engine tests: a recording handler and a consumer that reads a topic back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition

from sdk import Options, ParallelConsumer, Record
from tests.support import unique, wait_until

CONSUMER = {"session.timeout.ms": 6000, "auto.offset.reset": "earliest"}


@dataclass
class Started:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    attempt: int
    start: float
    end: float = 0.0
    ok: bool = False


@dataclass
class Recorder:
    """A handler that records every start and end, optionally failing or sleeping."""

    sleep: Callable[[Record], float] = lambda record: 0.0
    fail: Callable[[Record], BaseException | None] = lambda record: None
    calls: list[Started] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: dict[object, int] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)
    shard_of: Callable[[Record], object] | None = None

    def __call__(self, record: Record) -> None:
        started = Started(
            record.topic,
            record.partition,
            record.offset,
            record.raw_key,
            record.attempt,
            time.monotonic(),
        )
        shard = self.shard_of(record) if self.shard_of else None
        with self.lock:
            self.calls.append(started)
            if shard is not None:
                if self.running.get(shard):
                    self.overlaps.append(f"{shard} ran twice at once (offset {record.offset})")
                self.running[shard] = self.running.get(shard, 0) + 1
        try:
            delay = self.sleep(record)
            if delay:
                time.sleep(delay)
            error = self.fail(record)
            if error is not None:
                raise error
            started.ok = True
        finally:
            started.end = time.monotonic()
            if shard is not None:
                with self.lock:
                    self.running[shard] -= 1

    def done(self) -> set[tuple[int, int]]:
        """(partition, offset) of every record whose handler returned without error."""
        with self.lock:
            return {(c.partition, c.offset) for c in self.calls if c.ok}

    def offsets(self, partition: int) -> list[int]:
        with self.lock:
            return [c.offset for c in self.calls if c.partition == partition]


def start_engine(
    bootstrap: str,
    topic: str,
    handler: Any,
    options: Options,
    group: str | None = None,
    **config: Any,
) -> ParallelConsumer:
    consumer = ParallelConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group or unique("group"),
            **CONSUMER,
            **config,
        },
        [topic],
        handler,
        options,
        registry=None,
    )
    return consumer.start()


def read_all(
    bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 20.0
) -> list[Message]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    found: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(found) < expected and time.monotonic() < deadline:
            found += [m for m in consumer.consume(100, 0.2) if m.error() is None]
    finally:
        consumer.close()
    return found


def wait_committed(
    kafka: Any, group: str, topic: str, expected: dict[int, int], timeout: float = 20.0
) -> None:
    wait_until(
        lambda: kafka.committed(group, topic, len(expected)) == expected,
        timeout=timeout,
        what=f"commits {expected}",
    )


class FedSource:
    """A watermark source the test feeds."""

    def __init__(self) -> None:
        from sdk.gating._view import SourceState

        self.state = SourceState("fed")
        self.view = None

    def start(self, view) -> None:  # type: ignore[no-untyped-def]
        self.view = view

    def stop(self) -> None:
        pass

    def explain(self, topic: str, partition: int, offset: int) -> None:
        return None

    def send(self, version: Any, watermarks: dict[Any, Any], gate: Any = "g") -> bool:
        """Offer a snapshot as a source would; returns whether the view took it."""
        from gate import Snapshot

        assert self.view is not None
        return self.view.offer(Snapshot(gate, version, time.time(), watermarks), self.state)
