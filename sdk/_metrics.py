"""Prometheus metrics of a parallel consumer, read from its published stats snapshot (never
from the live core, which belongs to the consumer's thread)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sdk._runners import LATENCY_BUCKETS

if TYPE_CHECKING:
    from sdk._engine import ParallelConsumer

_COUNTS = {
    "processed": "Records processed successfully.",
    "failed": "Handler failures (each failed attempt).",
    "retried": "Failed attempts that were scheduled for retry.",
    "dead_lettered": "Records written to the dead-letter topic.",
    "skipped": "Records given up without a dead-letter topic (on_exhausted='skip').",
    "restored_skips": "Records skipped because the offset map said they were done before.",
}


class EngineCollector(Collector):
    def __init__(self, consumer: ParallelConsumer) -> None:
        self._consumer = consumer

    def collect(self) -> Iterator[Metric]:
        consumer = self._consumer
        stats = consumer.stats()
        group = consumer.group
        if not stats:
            return
        yield _gauge("sdk_in_flight_records", "Records being handled.", group, stats["in_flight"])
        yield _gauge(
            "sdk_held_records",
            "Records held in memory: buffered, in flight and waiting for retry.",
            group,
            stats["held"],
        )
        yield _gauge(
            "sdk_retrying_records", "Records waiting for a retry.", group, stats["retrying"]
        )
        yield _gauge(
            "sdk_paused_partitions",
            "Partitions paused for back-pressure.",
            group,
            len(stats["paused_partitions"]),
        )
        yield _gauge(
            "sdk_paused", "1 while processing is paused by the user.", group, int(stats["paused"])
        )

        labels = ["group", "topic", "partition"]
        families = {
            name: CounterMetricFamily(f"sdk_{name}_records", help_text, labels=labels)
            for name, help_text in _COUNTS.items()
        }
        for (topic, partition), counts in stats["counts"].items():
            for name, family in families.items():
                family.add_metric([group, topic, str(partition)], counts[name])
        yield from families.values()

        committed = GaugeMetricFamily(
            "sdk_committed_offset", "Last committed offset.", labels=labels
        )
        incomplete = GaugeMetricFamily(
            "sdk_incomplete_offsets",
            "Completed records beyond the commit point, waiting for an earlier one.",
            labels=labels,
        )
        blocking = GaugeMetricFamily(
            "sdk_blocking_offset",
            "The lowest incomplete offset: the one the commit waits for (-1: none).",
            labels=labels,
        )
        blocked_for = GaugeMetricFamily(
            "sdk_blocking_seconds",
            "How long the blocking offset has blocked commits.",
            labels=labels,
        )
        buffered = GaugeMetricFamily(
            "sdk_buffered_records", "Fetched records not started yet.", labels=labels
        )
        for (topic, partition), view in stats["partitions"].items():
            values = [group, topic, str(partition)]
            if view["committed"] is not None:
                committed.add_metric(values, view["committed"])
            incomplete.add_metric(values, view["incomplete_beyond_head"])
            blocking.add_metric(
                values, -1 if view["blocking_offset"] is None else view["blocking_offset"]
            )
            blocked_for.add_metric(values, view["blocked_for"])
            buffered.add_metric(values, view["buffered"])
        yield from (committed, incomplete, blocking, blocked_for, buffered)

        counts, total = stats["latency"]
        if counts:
            cumulative, running = [], 0
            for bound, count in zip((*LATENCY_BUCKETS, float("inf")), counts, strict=True):
                running += count
                cumulative.append((_bound(bound), running))
            latency = HistogramMetricFamily(
                "sdk_handler_seconds",
                "Handler duration per record (per batch for batches).",
                labels=["group"],
            )
            latency.add_metric([group], cumulative, sum_value=total)
            yield latency


def _gauge(name: str, help_text: str, group: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=["group"])
    family.add_metric([group], value)
    return family


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))
