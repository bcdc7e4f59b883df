"""Prometheus metrics of the gate.

Per-partition gauges are produced at scrape time from the latest gate states (a custom
collector), so a poll costs nothing extra however many groups and partitions are watched. The
series per group and partition are exposed for at most
``status.metrics_group_partitions_max`` groups x partitions over the whole service: gates in
the configuration's order have theirs while they fit in what is left; every gate's groups'
series over all partitions always are.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gate._config import GateConfig
from gate._publish import RedisPublisher, SnapshotStore
from gate._state import SEVERITY, DependencyStatus, position_tuples


class Watched(Protocol):
    """What the metrics read of the service (its state, not how it polls)."""

    config: GateConfig
    store: SnapshotStore
    failing: dict[str, tuple[str, ...]]
    answered_at: float | None
    redis: RedisPublisher | None


log = logging.getLogger("gate.metrics")

# Counters are exposed without their ``_created`` series: they double the series count and
# no query of the gate's needs them.
disable_created_metrics()


def build_version() -> str:
    """The installed kafka-gate version ("unknown" when running from sources)."""
    try:
        return version("kafka-gate")
    except PackageNotFoundError:
        return "unknown"


STATUS_CODES = {
    DependencyStatus.OK: 0,
    DependencyStatus.LAGGING: 1,
    DependencyStatus.REWOUND: 2,
    DependencyStatus.STALLED: 3,
    DependencyStatus.MISSING: 4,
    DependencyStatus.BEHIND: 5,
}
_CODE_BY_RANK = tuple(STATUS_CODES[status] for status in SEVERITY)


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

    def watch(self, service: Watched) -> None:
        self.registry.register(_StateCollector(service))


class _StateCollector(Collector):
    def __init__(self, service: Watched) -> None:
        self._service = service
        self._limited: set[str] = set()
        """Gates whose series per group and partition are left out (logged once each time)."""

    def _say_when_limited(self, gate: str, pairs: int, left: int, limit: int) -> None:
        """Log when a gate's series per group and partition go (and come back): dashboards
        built on them see them absent."""
        if pairs > left and gate not in self._limited:
            self._limited.add(gate)
            log.warning(
                "gate %s: its %d groups x partitions exceed what is left (%d) of "
                "status.metrics_group_partitions_max (%d for the whole service, the gates "
                "before it in the configuration first): its metrics per group and partition "
                "are left out, its groups' series over all partitions stay "
                "(gate_group_partition_series is 0)",
                gate,
                pairs,
                left,
                limit,
            )
        elif pairs <= left and gate in self._limited:
            self._limited.discard(gate)
            log.info("gate %s: its metrics per group and partition are exposed again", gate)

    def collect(self) -> Iterator[Metric]:
        service = self._service
        watermark = GaugeMetricFamily(
            "gate_watermark",
            "Released below this offset (absent while nothing is released on the partition).",
            labels=["gate", "topic", "partition"],
        )
        end_offset = GaugeMetricFamily(
            "gate_end_offset", "End offset of the partition.", labels=["gate", "topic", "partition"]
        )
        committed = GaugeMetricFamily(
            "gate_committed_offset",
            "Committed offset of a dependency group (absent when it has none).",
            labels=["gate", "group", "topic", "partition"],
        )
        lag_seconds = GaugeMetricFamily(
            "gate_dependency_lag_seconds",
            "Age of the oldest record a dependency group has not processed (absent: unknown).",
            labels=["gate", "group", "topic", "partition"],
        )
        unmoved = GaugeMetricFamily(
            "gate_dependency_commit_age_seconds",
            "Seconds since the group's committed offset last moved (absent: no commit).",
            labels=["gate", "group", "topic", "partition"],
        )
        waiting = GaugeMetricFamily(
            "gate_records_waiting", "Records held back, over all partitions.", labels=["gate"]
        )
        waiting_seconds = GaugeMetricFamily(
            "gate_waiting_seconds",
            "Age of the oldest record held back (absent: unknown).",
            labels=["gate", "topic", "partition"],
        )
        stuck = GaugeMetricFamily(
            "gate_stuck",
            "1 while records wait at a watermark that has not moved for stall_after.",
            labels=["gate"],
        )
        unprocessed = GaugeMetricFamily(
            "gate_dependent_released_unprocessed",
            "Records released to the dependent that it has not committed yet.",
            labels=["gate", "group"],
        )
        lag = GaugeMetricFamily(
            "gate_dependency_lag",
            "Records between a dependency group's committed offset and the end.",
            labels=["gate", "group", "topic", "partition"],
        )
        partition_status = GaugeMetricFamily(
            "gate_dependency_partition_status",
            "0 OK, 1 LAGGING, 2 REWOUND, 3 STALLED, 4 MISSING, 5 BEHIND.",
            labels=["gate", "group", "topic", "partition"],
        )
        group_lag = GaugeMetricFamily(
            "gate_dependency_group_lag",
            "Records between a dependency group's committed offsets and the ends, over all "
            "partitions where both are known.",
            labels=["gate", "group"],
        )
        group_lag_seconds = GaugeMetricFamily(
            "gate_dependency_group_lag_seconds",
            "Age of the oldest record a dependency group has not processed, over all "
            "partitions (absent: unknown).",
            labels=["gate", "group"],
        )
        detailed = GaugeMetricFamily(
            "gate_group_partition_series",
            "1 when the gate's series per group and partition are exposed; 0 when its groups "
            "x partitions exceed what is left of status.metrics_group_partitions_max (for the "
            "whole service, gates in the configuration's order).",
            labels=["gate"],
        )
        group_status = GaugeMetricFamily(
            "gate_dependency_status",
            "1 for the group's current overall status (its worst partition).",
            labels=["gate", "group", "status"],
        )
        missing = GaugeMetricFamily(
            "gate_dependency_missing_partitions",
            "Partitions where a dependency group has no committed offset (alarm when > 0).",
            labels=["gate", "group"],
        )
        held = GaugeMetricFamily(
            "gate_partitions_unreleased",
            "Partitions on which nothing is released (no watermark).",
            labels=["gate"],
        )
        topic_missing = GaugeMetricFamily(
            "gate_topic_missing",
            "1 while the topic, or one of its partitions, does not exist (an alarm: nothing "
            "there is released).",
            labels=["gate", "topic"],
        )
        version = GaugeMetricFamily(
            "gate_snapshot_version", "Version of the latest snapshot.", labels=["gate"]
        )
        age = GaugeMetricFamily(
            "gate_snapshot_age_seconds", "Age of the latest snapshot.", labels=["gate"]
        )
        limit = service.config.status.metrics_group_partitions_max
        left = limit  # for the whole service: the gates in the configuration's order first
        for name in service.store.gates:
            state = service.store.latest(name)
            if state is None:
                continue
            pairs = len(state.groups) * len(state.partitions)
            per_partition = pairs <= left
            detailed.add_metric([name], int(per_partition))
            self._say_when_limited(name, pairs, left, limit)
            if per_partition:
                left -= pairs
            now = state.now(time.monotonic(), time.time())  # ages: the time that passed
            version.add_metric([name], state.version)
            age.add_metric([name], max(0.0, now - state.snapshot.polled_at))
            absent = {*state.missing_topics, *(t for t, _ in state.missing_partitions)}
            for topic in service.config.gates[name].topics:
                topic_missing.add_metric([name, topic], int(topic in absent))
            unreleased = 0
            missing_count = dict.fromkeys(state.groups, 0)
            for (topic, partition), part in state.partitions.items():
                p = str(partition)
                if part.watermark is None:
                    unreleased += 1
                else:
                    watermark.add_metric([name, topic, p], part.watermark)
                if part.end_offset is not None:
                    end_offset.add_metric([name, topic, p], part.end_offset)
                if part.waiting_seconds is not None:
                    waiting_seconds.add_metric([name, topic, p], part.waiting_seconds)
                positions = position_tuples(part.groups)
                if not per_partition:
                    for group, position in positions.items():
                        if position[0] is None and group in missing_count:
                            missing_count[group] += 1
                    continue
                for group, (offset, records, rank, moved_at, seconds, _) in positions.items():
                    labels = [name, group, topic, p]
                    partition_status.add_metric(labels, _CODE_BY_RANK[rank])
                    if offset is None:
                        if group in missing_count:
                            missing_count[group] += 1
                        continue
                    committed.add_metric(labels, offset)
                    if records is not None:
                        lag.add_metric(labels, records)
                    if seconds is not None:
                        lag_seconds.add_metric(labels, seconds)
                    if moved_at is not None:
                        unmoved.add_metric(labels, max(0.0, now - moved_at))
            verdict = state.verdict
            waiting.add_metric([name], verdict.records_waiting)
            stuck.add_metric([name], int(verdict.state == "stuck"))
            if state.dependent:
                unprocessed.add_metric([name, state.dependent], verdict.released_unprocessed)
            held.add_metric([name], unreleased)
            for group, status in state.groups.items():
                for candidate in SEVERITY:
                    group_status.add_metric(
                        [name, group, candidate.value], int(candidate == status)
                    )
                missing.add_metric([name, group], missing_count[group])
            for group, overall in state.group_lags.items():
                if overall.records is not None:  # absent: no commit where records are
                    group_lag.add_metric([name, group], overall.records)
                if overall.seconds is not None:
                    group_lag_seconds.add_metric([name, group], overall.seconds)

        yield from (watermark, end_offset, committed, lag, lag_seconds, unmoved)
        yield from (partition_status, group_status, missing, topic_missing, held, version, age)
        yield from (group_lag, group_lag_seconds, detailed)
        yield from (waiting, waiting_seconds, stuck, unprocessed)

        failing = GaugeMetricFamily(
            "gate_read_failing",
            "1 while the last poll could not refresh the gate (its dependency groups' offsets "
            "or its topics' partitions could not be read): it serves its last snapshot.",
            labels=["gate"],
        )
        for name in service.store.gates:
            failing.add_metric([name], int(name in service.failing))
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
            yield writes
