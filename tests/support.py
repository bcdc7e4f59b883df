"""Helpers for tests on real services: Kafka topics, commits, and a gate served over HTTP."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConsumerGroupDescription, NewTopic

from gate import GateConfig, GateService, parse_config
from gate.serve._serve import ServedGate

T = TypeVar("T")

# Records stamped long ago (a fixed date, so a test can name its timestamps) fall under a
# broker's time-based retention, which deletes them at its next sweep (noida-db sweeps every
# few seconds; Kafka every five minutes): topics holding such records keep them forever.
KEEP_FOREVER = {"retention.ms": "-1"}


def interruptible() -> None:
    """``preexec_fn`` of a child process a test will interrupt with SIGINT: a test run started
    as a background job inherits an ignored SIGINT, which the child would keep."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def keep_figures(path: Path, name: str, figures: Any) -> None:
    """Put a test's figures under ``name`` in the JSON file ``path`` (tests/artifacts/), which
    tests running at the same time in other processes update too: one at a time (a lock
    file), the file replaced whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:  # (a file left cut short by a run that was killed)
            data = {}
        data[name] = figures
        written = path.with_suffix(f".{os.getpid()}.tmp")
        written.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(written, path)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_until(
    condition: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.02,
    what: str = "",
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll ``condition`` until it returns something truthy; fail the test on timeout (a
    bound for a loaded machine, never a measure: the suite runs tests in parallel on two
    cores), with what ``explain`` then tells (the state a stall shows) in the message."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            told = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what or condition}{told}"
            )
        time.sleep(interval)


def describe_group(bootstrap: str, group: str) -> ConsumerGroupDescription:
    """A consumer group as the broker describes it (raises what the broker answered)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group], request_timeout=5)[group].result(10)


def group_at_broker(bootstrap: str, group: str) -> str:
    """A consumer group as the broker describes it: its state and each member's instance id
    and partitions (a group that never settles shows here), or why the broker did not say."""
    try:
        found = describe_group(bootstrap, group)
    except Exception as exc:  # (a broker down or busy: the report says so)
        return f"group {group} at the broker: unavailable ({exc})"
    members = [
        f"{m.group_instance_id or m.member_id} ({m.host}): "
        + ",".join(str(tp.partition) for tp in (m.assignment.topic_partitions or []))
        for m in found.members
    ]
    return f"group {group} at the broker: {found.state.name}, members {members}"


@dataclass(frozen=True)
class Broker:
    """The broker a test runs on, and what it can do (see ``demo._local``)."""

    name: str
    keeps_metadata: bool = False
    adds_partitions: bool = False
    keeps_data: bool = False
    cooperative_rebalances: bool = True
    evicts_dead_members: bool = True
    ends_every_round: bool = True

    def require_eviction(self) -> None:
        """Skip a test that kills a group member when this broker never evicts it."""
        import pytest

        if not self.evicts_dead_members:
            pytest.skip(
                f"{self.name} never evicts a group member that died without leaving: "
                "nobody could join the group again"
            )


@dataclass
class Kafka:
    """A handle on the test broker with the few operations tests need."""

    bootstrap: str
    broker: Broker = field(default_factory=lambda: Broker("unknown"))
    admin: AdminClient = field(init=False)

    def __post_init__(self) -> None:
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(
        self, partitions: int = 3, name: str | None = None, config: Mapping[str, str] | None = None
    ) -> str:
        name = name or unique("topic")
        futures = self.admin.create_topics(
            [NewTopic(name, partitions, 1, config=dict(config or {}))]
        )
        for future in futures.values():
            future.result(10)
        wait_until(lambda: name in self.admin.list_topics(timeout=5).topics, what=f"topic {name}")
        return name

    def producer(self, **extra: Any) -> Producer:
        # One record per batch keeps end offsets exact on brokers that report the end of a
        # partition from the base offset of its last batch.
        config = {"bootstrap.servers": self.bootstrap, "linger.ms": 0, "batch.num.messages": 1}
        config.update(extra)
        return Producer(config)

    def produce(
        self,
        topic: str,
        per_partition: Mapping[int, int],
        key: Callable[[int, int], bytes | None] | None = None,
    ) -> None:
        producer = self.producer()
        for partition, count in per_partition.items():
            for i in range(count):
                producer.produce(
                    topic,
                    value=f"{partition}:{i}".encode(),
                    key=key(partition, i) if key else None,
                    partition=partition,
                )
        producer.flush(30)

    def commit(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Commit offsets for a group without joining it (as a standalone consumer)."""
        consumer = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": group, "enable.auto.commit": False}
        )
        try:
            consumer.commit(
                offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                asynchronous=False,
            )
        finally:
            consumer.close()

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        consumer = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": group, "enable.auto.commit": False}
        )
        try:
            found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 10)
        finally:
            consumer.close()
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}


def gate_config(
    bootstrap: str,
    gates: Mapping[str, Mapping[str, Any]],
    *,
    redis_url: str | None = None,
    poll_interval_ms: int = 50,
    **extra: Any,
) -> GateConfig:
    data: dict[str, Any] = {
        "kafka": {"bootstrap.servers": bootstrap},
        "poll_interval_ms": poll_interval_ms,
        "gates": {name: dict(spec) for name, spec in gates.items()},
        "http": {"host": "127.0.0.1", "port": 0},
    }
    if redis_url:
        data["redis"] = {"url": redis_url, "prefix": unique("gate")}
    data.update(extra)
    return parse_config(data, env={})


def serve_gate(config: GateConfig) -> ServedGate:
    """The gate service and its HTTP API on a free loopback port, in a background thread."""
    return ServedGate(GateService(config))


def transactions(kafka: Kafka, topic: str, *steps: tuple[str, int]) -> Producer:
    """Transactions on partition 0, one per step: ("commit", n), ("abort", n) or ("open", n)
    (the last step only: begun, produced and delivered, left open). Values name the step and
    the record (``commit0-3``). Returns the producer, to end an open transaction with."""
    producer = kafka.producer(**{"transactional.id": unique("tx")})
    producer.init_transactions(30)
    for number, (kind, count) in enumerate(steps):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(topic, value=f"{kind}{number}-{i}".encode(), partition=0)
        producer.flush(30)  # delivered: an aborted transaction's records are in the log too
        if kind == "commit":
            producer.commit_transaction(30)
        elif kind == "abort":
            producer.abort_transaction(30)
    return producer


def aborted_records_visible(kafka: Kafka, topic: str) -> bool:
    """Whether a read_committed consumer of partition 0 (written by :func:`transactions`) is
    handed records of aborted transactions (Tansu 0.6 does: its fetch responses list no
    aborted transactions)."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": unique("probe"),
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        for _ in range(100):
            messages = consumer.consume(100, 1.0)
            values.extend(m.value() for m in messages if m.error() is None)
            if any(m.error() is not None for m in messages):  # the end of the partition
                break
        else:
            raise AssertionError(f"{topic}[0]: no end of partition")
    finally:
        consumer.close()
    return any(value.startswith(b"abort") for value in values)
