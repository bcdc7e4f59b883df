"""The article's three services, end to end: A waits for B and C.

B and C are real consumers committing at different, changing paces; A runs on the engine
with KEY ordering behind a gate. Every dependency commit is logged with the moment it was
sent, and every start of A's handler: for every single record, A must not have started it
before both B and C sent a commit past it. Run with each watermark source, with Redis and the
gate service killed and restarted mid-run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from demo._local import LocalRedis
from gate import GateService
from gate.serve._serve import ServedGate
from sdk import EmbeddedSource, Gate, HttpSource, Options, Ordering, ParallelConsumer, RedisSource
from tests.sdk.gating_support import DependencyService, Starts, violations
from tests.support import Kafka, gate_config, unique, wait_until

PARTITIONS = 3
PER_PARTITION = 150


class CommitLoggingConsumer(ParallelConsumer):
    """The engine, logging each commit with the moment just before it is sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[float, int, int]] = []

    def _new_consumer(self, config: dict) -> Any:
        return _LoggingClient(super()._new_consumer(config), self.sent)


class _LoggingClient:
    def __init__(self, consumer: Any, sent: list[tuple[float, int, int]]) -> None:
        self._consumer = consumer
        self._sent = sent

    def commit(self, *args: Any, offsets: Any = None, **kwargs: Any) -> Any:
        now = time.monotonic()
        self._sent.extend((now, tp.partition, tp.offset) for tp in offsets or [])
        return self._consumer.commit(*args, offsets=offsets, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def scenario(
    kafka: Kafka, gate_for: Callable[[str, str, str], tuple[Gate, Callable[[], None]]]
) -> None:
    """Run the three services; ``gate_for(topic, b, c)`` builds A's gate and a fault to inject."""
    topic = kafka.create_topic(PARTITIONS)
    b_group, c_group, a_group = unique("svc-b"), unique("svc-c"), unique("svc-a")
    service_b = DependencyService(kafka, topic, b_group, PARTITIONS, (0.001, 0.004), seed=1)
    service_c = DependencyService(
        kafka,
        topic,
        c_group,
        PARTITIONS,
        (0.002, 0.008),
        pause_every=3.0,
        pause_for=1.0,
        commit_every=0.12,
        seed=2,
    )
    gate, fault = gate_for(topic, b_group, c_group)
    starts = Starts()
    a = ParallelConsumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": a_group,
            "session.timeout.ms": 6000,
            "auto.offset.reset": "earliest",
        },
        [topic],
        starts,
        Options(ordering=Ordering.KEY, max_concurrency=8),
        gate=gate,
        registry=None,
    )
    producer_done = threading.Event()

    def produce() -> None:
        producer = kafka.producer()
        for i in range(PER_PARTITION):
            for partition in range(PARTITIONS):
                producer.produce(
                    topic, key=f"account-{i % 11}".encode(), value=b"payment", partition=partition
                )
            producer.poll(0)
            time.sleep(0.02)
        producer.flush(10)
        producer_done.set()

    a.start()
    service_b.start()
    service_c.start()
    threading.Thread(target=produce, daemon=True).start()
    total = PARTITIONS * PER_PARTITION
    try:
        wait_until(lambda: len(starts.done()) >= total // 3, timeout=60, what="A under way")
        fault()
        wait_until(
            lambda: len(starts.done()) == total, timeout=120, what="A processed every record"
        )
    finally:
        a.stop()
        service_b.stop()
        service_c.stop()
        gate.stop()
    assert violations(starts, [service_b, service_c]) == []
    assert starts.done() == {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}


def test_embedded_source(kafka: Kafka) -> None:
    def gate_for(topic: str, b: str, c: str) -> tuple[Gate, Callable[[], None]]:
        source = EmbeddedSource(
            {"bootstrap.servers": kafka.bootstrap}, [topic], [b, c], poll_interval=0.05
        )
        return Gate("svc-a", [source]), lambda: None

    scenario(kafka, gate_for)


def test_gate_with_redis_killed_and_restarted(kafka: Kafka, local_redis: LocalRedis) -> None:
    served: list[ServedGate] = []

    def gate_for(topic: str, b: str, c: str) -> tuple[Gate, Callable[[], None]]:
        config = gate_config(
            kafka.bootstrap,
            {"svc-a": {"topics": [topic], "depends_on": [b, c]}},
            redis_url=local_redis.url,
            heartbeat_ms=500,
        )
        assert config.redis is not None
        served.append(ServedGate(GateService(config)).start())
        gate = Gate("svc-a", [RedisSource(local_redis.url, prefix=config.redis.prefix)])

        def fault() -> None:
            local_redis.kill()
            time.sleep(2.0)
            local_redis.start()

        return gate, fault

    try:
        scenario(kafka, gate_for)
    finally:
        for gate in served:
            gate.stop()


def test_gate_http_stream_with_the_gate_restarted(kafka: Kafka) -> None:
    served: list[ServedGate] = []

    def gate_for(topic: str, b: str, c: str) -> tuple[Gate, Callable[[], None]]:
        config = gate_config(
            kafka.bootstrap, {"svc-a": {"topics": [topic], "depends_on": [b, c]}}, heartbeat_ms=500
        )
        first = ServedGate(GateService(config)).start()
        served.append(first)
        port = first.socket.getsockname()[1]
        gate = Gate("svc-a", [HttpSource(first.url, poll_interval=0.2)])

        def fault() -> None:
            first.stop()
            time.sleep(2.0)
            served.append(ServedGate(GateService(config), port=port).start())

        return gate, fault

    try:
        scenario(kafka, gate_for)
    finally:
        for gate in served:
            gate.stop()


def test_chain_a_waits_for_b_which_waits_for_c(kafka: Kafka) -> None:
    """C is a plain consumer; B runs on the engine behind C; A on the engine behind B."""
    topic = kafka.create_topic(2)
    a_group, b_group, c_group = unique("a"), unique("b"), unique("c")
    service_c = DependencyService(
        kafka, topic, c_group, 2, (0.002, 0.006), pause_every=2.0, pause_for=0.5, seed=3
    )
    starts_a, starts_b = Starts(), Starts()

    def consumer(group: str, handler: Starts, depends_on: str) -> CommitLoggingConsumer:
        source = EmbeddedSource(
            {"bootstrap.servers": kafka.bootstrap}, [topic], [depends_on], poll_interval=0.05
        )
        return CommitLoggingConsumer(
            {
                "bootstrap.servers": kafka.bootstrap,
                "group.id": group,
                "session.timeout.ms": 6000,
                "auto.offset.reset": "earliest",
            },
            [topic],
            handler,
            Options(
                ordering=Ordering.KEY,
                max_concurrency=4,
                commit_interval=0.1,
            ),
            gate=Gate(group, [source]),
            registry=None,
        )

    b = consumer(b_group, starts_b, c_group).start()
    a = consumer(a_group, starts_a, b_group).start()
    service_c.start()
    kafka.produce(topic, {0: 100, 1: 100}, key=lambda p, i: f"k{i % 5}".encode())
    try:
        wait_until(
            lambda: len(starts_a.done()) == 200, timeout=120, what="A at the end of the chain"
        )
    finally:
        a.stop()
        b.stop()
        service_c.stop()
    assert violations(starts_b, [service_c]) == []
    with starts_a.lock:
        a_records = list(starts_a.starts)
    b_commits = list(b.sent)
    for started, partition, offset in a_records:
        # B's commits are logged just before they are sent: a strict check.
        assert any(p == partition and o > offset and t <= started for t, p, o in b_commits), (
            f"A started {partition}@{offset} before B sent a commit past it"
        )


@pytest.mark.parametrize("closed_for", [10.0])
def test_a_closed_gate_causes_no_rebalance(kafka: Kafka, closed_for: float) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 20})
    dependency = unique("dep")
    assignments: list[float] = []
    starts = Starts()
    gate = Gate(
        "a",
        [
            EmbeddedSource(
                {"bootstrap.servers": kafka.bootstrap}, [topic], [dependency], poll_interval=0.05
            )
        ],
    )
    engine = ParallelConsumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": unique("a"),
            "session.timeout.ms": 6000,
            "max.poll.interval.ms": 6000,
            "auto.offset.reset": "earliest",
        },
        [topic],
        starts,
        Options(),
        gate=gate,
        registry=None,
    )
    original = engine._rebalancer.on_assign
    engine._rebalancer.on_assign = lambda c, p: (
        assignments.append(time.monotonic()),
        original(c, p),
    )  # type: ignore[method-assign]
    engine.start()
    try:
        time.sleep(closed_for)  # longer than max.poll.interval.ms, with everything held
        assert starts.done() == set()
        assert engine.stats()["partitions"][(topic, 0)]["gate_held"] == 20
        kafka.commit(dependency, topic, {0: 20})
        wait_until(lambda: len(starts.done()) == 20, timeout=30, what="release")
    finally:
        engine.stop()
    assert len(assignments) == 1, "holding records caused a rebalance"
