"""The benchmarks' topics: names, creating them, filling them, committing a group's offsets
on them, and writing to them steadily while a run goes on."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich.progress import Progress

from bench._report import console

CONSUMER = {"session.timeout.ms": 6000, "auto.offset.reset": "earliest"}
"""What every consumer of the benchmarks sets (a 6 s session, from the start)."""
WHOLE_FETCH = {"receive.message.max.bytes": 2_147_483_647}
"""noida-db answers a fetch with all it holds from the offset asked, beyond
``fetch.max.bytes`` (see tests/sdk/test_spark_read.py): a reader of a large partition there
raises librdkafka's limit on an answer, as the Spark source's readers do."""
VALUE = b"x" * 100


def unique(prefix: str) -> str:
    """A name no earlier run used: ``prefix-`` and a random number."""
    return f"{prefix}-{random.randrange(10**9)}"


def create_topic(
    admin: AdminClient | str, name: str, partitions: int, appear: bool = False
) -> None:
    """A topic of ``partitions`` partitions (``admin``: a client, or the bootstrap servers);
    with ``appear``, once the broker lists it too."""
    if isinstance(admin, str):
        admin = AdminClient({"bootstrap.servers": admin})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while appear and name not in admin.list_topics(timeout=10).topics:
        if time.monotonic() > deadline:
            raise SystemExit(f"topic {name} did not appear")
        time.sleep(0.05)


def fill(
    bootstrap: str,
    topic: str,
    count: int,
    key: Callable[[int], bytes | None],
    partitions: int = 1,
    value: Callable[[int], bytes] = lambda i: VALUE,
    config: dict[str, Any] | None = None,
) -> None:
    """Writes ``count`` records to ``topic``, the i-th with ``key(i)`` and ``value(i)`` to
    partition ``i % partitions``, and waits until every one is acknowledged."""
    producer = Producer(
        config
        or {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 2_000_000,
        }
    )
    failed: list[str] = []

    def delivered(error: KafkaError | None, _: Message) -> None:
        if error is not None:
            failed.append(error.str())

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"producing {count:,} records to {topic}", total=count)
        for i in range(count):
            producer.produce(
                topic, key=key(i), value=value(i), partition=i % partitions, on_delivery=delivered
            )
            if i % 20_000 == 0:
                producer.poll(0)
                progress.update(task, completed=i)
        progress.update(task, completed=count, description="flushing")
        if producer.flush(120) or failed:
            raise SystemExit(f"producing to {topic} failed: {failed[:3]}")


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commits ``offsets`` (partition: offset) of ``topic`` for ``group``."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("ends")})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        ]
    finally:
        consumer.close()


def group_far_ahead(bootstrap: str, topic: str, partitions: int) -> tuple[str, list[int]]:
    """A new consumer group committed beyond the end of every partition (a dependency that
    has released everything), and the partitions' end offsets."""
    group = unique("far-ahead")
    ends = end_offsets(bootstrap, topic, partitions)
    commit(bootstrap, group, topic, {p: end + 10**6 for p, end in enumerate(ends)})
    return group, ends


class Writing:
    """Writes to a topic from a thread while the ``with`` block runs: every ``every``
    seconds, the records ``turn(i)`` gives for the i-th turn (value, partition or None);
    ``flush`` waits for each turn's acknowledgements before the next."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        every: float,
        turn: Callable[[int], list[tuple[bytes, int | None]]],
        flush: bool = False,
    ) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic, self.every, self.turn, self.flush = topic, every, turn, flush
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._write, name=f"writing-{topic}", daemon=True)

    def _write(self) -> None:
        i = 0
        while not self.stop.wait(self.every):
            for value, partition in self.turn(i):
                if partition is None:
                    self.producer.produce(self.topic, value)
                else:
                    self.producer.produce(self.topic, value, partition=partition)
            if self.flush:
                self.producer.flush(5)
            else:
                self.producer.poll(0)
            i += 1
        self.producer.flush(10)

    def __enter__(self) -> Writing:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
