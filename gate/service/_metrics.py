"""Prometheus metrics of the gate.

The service's own series (polls, their duration and errors, Redis) are counted as things
happen; the gates' series are produced from their latest states (a custom collector,
:mod:`gate.service._series`), so a poll costs nothing extra however many groups and partitions are
watched, built once per poll cycle and kept; what depends on the moment of a scrape (each
snapshot's age, whether the last poll refreshed each gate, the time since the cluster last
answered, Redis' health) is made at each scrape (:class:`_Live`).
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gate.publish._publish import RedisPublisher, SnapshotStore
from gate.service._config import GateConfig
from gate.service._series import GateSeries


class Watched(Protocol):
    """What the metrics read of the service (its state, not how it polls)."""

    config: GateConfig
    store: SnapshotStore
    failing: dict[str, tuple[str, ...]]
    answered_at: float | None
    redis: RedisPublisher | None


# Counters are exposed without their ``_created`` series: they double the series count and
# no query of the gate's needs them.
disable_created_metrics()


def build_version() -> str:
    """The installed kafka-gate version ("unknown" when running from sources)."""
    try:
        return version("kafka-gate")
    except PackageNotFoundError:
        return "unknown"


class GateMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.polls = Counter("gate_polls", "Polls of the admin API.", registry=registry)
        self.poll_errors = Counter(
            "gate_poll_errors",
            "Polls, or parts of polls, that failed (the last snapshot stays in force).",
            ["kind"],
            registry=registry,
        )
        self.poll_duration = Histogram(
            "gate_poll_duration_seconds",
            "Duration of one poll of all dependency groups.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.evaluation_duration = Histogram(
            "gate_evaluation_duration_seconds",
            "Duration of evaluating all gates from one poll.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        self.groups_read = Gauge(
            "gate_poll_groups_read",
            "Groups whose offsets the last poll read; the others were idle and caught up, their "
            "last read carried (idle_poll_interval_ms).",
            registry=registry,
        )
        self.groups_carried = Gauge(
            "gate_poll_groups_carried",
            "Groups whose offsets the last poll carried from an earlier read (idle and caught "
            "up: idle_poll_interval_ms).",
            registry=registry,
        )
        self.poll_overruns = Counter(
            "gate_poll_overruns",
            "Poll cycles that took longer than the poll interval (from when due to when done): the "
            "next started when it ended, late (cycles are never queued).",
            registry=registry,
        )
        self.rewinds = Counter(
            "gate_rewinds",
            "Times a dependency group's committed offset went backwards.",
            ["gate", "group"],
            registry=registry,
        )
        self.lost_offsets = Counter(
            "gate_dependency_offsets_lost",
            "Committed offsets that disappeared (group deleted or offsets expired).",
            ["gate", "group"],
            registry=registry,
        )

        self.build_info = Gauge(
            "gate_build_info",
            "Always 1: the gate's version and Python version as labels.",
            ["version", "python"],
            registry=registry,
        )
        self.build_info.labels(build_version(), platform.python_version()).set(1)
        self.series: GateSeries | None = None
        """The gates' series, once :meth:`watch` is called."""

    def watch(self, service: Watched) -> None:
        """Expose the series of ``service``'s gates (and of its polls' freshness)."""
        self.series = GateSeries(service)
        self.registry.register(self.series)
        self.registry.register(_Live(service))

    def exposition(self, building: threading.Lock) -> bytes:
        """A scrape: the gates' series as kept for the latest states (built, under
        ``building``, if a poll brought new ones), and the rest of the registry's, made
        now."""
        series = self.series
        if series is None:
            return generate_latest(self.registry)
        with building:
            kept = series.text()
        with series.muted():
            made = generate_latest(self.registry)
        return made + kept


class _Live(Collector):
    """The series that depend on the moment of the scrape."""

    def __init__(self, service: Watched) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        service = self._service
        age = GaugeMetricFamily(
            "gate_snapshot_age_seconds", "Age of the latest snapshot.", labels=["gate"]
        )
        failing = GaugeMetricFamily(
            "gate_read_failing",
            "1 while the last poll could not refresh the gate (its dependency groups' offsets "
            "or its topics' partitions could not be read): it serves its last snapshot.",
            labels=["gate"],
        )
        for name in service.store.gates:
            state = service.store.latest(name)
            if state is not None:
                now = state.now(time.monotonic(), time.time())  # the time that passed
                age.add_metric([name], max(0.0, now - state.snapshot.polled_at))
            failing.add_metric([name], int(name in service.failing))
        yield age
        yield failing

        last_ok = GaugeMetricFamily(
            "gate_last_successful_poll_age_seconds",
            "Seconds since the last poll the cluster answered (absent before the first).",
        )
        if service.answered_at is not None:
            last_ok.add_metric([], max(0.0, time.monotonic() - service.answered_at))
        yield last_ok
        publisher = service.redis
        if publisher is not None:
            healthy = GaugeMetricFamily("gate_redis_healthy", "1 when the last Redis write worked.")
            healthy.add_metric([], int(publisher.healthy))
            yield healthy
            writes = CounterMetricFamily(
                "gate_redis_writes", "Snapshot writes to Redis by result.", labels=["result"]
            )
            writes.add_metric(["ok"], publisher.writes)
            writes.add_metric(["failed"], publisher.failures)
            writes.add_metric(["stale"], publisher.stale_rejections)
            writes.add_metric(["overlapping"], publisher.overlapping_rejections)
            yield writes
