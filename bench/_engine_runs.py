"""Running the engine in a benchmark: until its handler has counted the records expected,
with the counting handlers the engine's benchmarks share."""

from __future__ import annotations

import random
import time
from typing import Any

from bench._rounds import wait_until
from bench._topics import CONSUMER
from sdk import Gate, Options, ParallelConsumer


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, record: Any) -> None:
        self.count += 1


class BatchCounter(Counter):
    def __call__(self, records: list[Any]) -> None:  # type: ignore[override]
        self.count += len(records)


class FirstTimed:
    """Wraps a counting handler and notes when the first record arrived and, given the
    number ``expected``, when the last of them was handled."""

    def __init__(self, inner: Counter, expected: int | None = None) -> None:
        self.inner = inner
        self.expected = expected
        self.first = 0.0
        self.last = 0.0

    @property
    def count(self) -> int:
        return self.inner.count

    def __call__(self, argument: Any) -> None:
        if not self.first:
            self.first = time.perf_counter()
        self.inner(argument)
        if self.expected is not None and self.inner.count >= self.expected and not self.last:
            self.last = time.perf_counter()


def new_engine(
    bootstrap: str,
    topic: str,
    handler: Any,
    options: Options,
    group: str,
    gate: Gate | None = None,
    **config: Any,
) -> ParallelConsumer:
    """The engine on ``topic`` in a new group named after ``group``, with the benchmarks'
    consumer settings and ``config``, gated by ``gate`` when given; not started."""
    return ParallelConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{group}-{random.random()}",
            **CONSUMER,
            **config,
        },
        [topic],
        handler,
        options,
        gate=gate,
        registry=None,
    )


def run_engine(
    bootstrap: str, topic: str, handler: Any, options: Options, expected: int, timeout: float = 600
) -> dict[str, Any]:
    """Run the engine until ``handler.count`` reaches ``expected``; returns its last stats."""
    consumer = new_engine(bootstrap, topic, handler, options, f"bench-{topic}")
    consumer.start()
    try:
        if not wait_until(lambda: handler.count >= expected, timeout):
            raise SystemExit(f"{topic}: only {handler.count} of {expected} records processed")
        wait_until(lambda: consumer.stats().get("at", 0) > time.time() - 0.4, 2)  # fresh stats
        return consumer.stats()
    finally:
        consumer.stop(timeout=10)
