"""Prometheus metrics of a parallel consumer, read from its published stats snapshot (never
from the live core, which belongs to the consumer's thread)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sdk.consumer._runners import LATENCY_BUCKETS


class Watched(Protocol):
    """What the metrics read of a consumer (:class:`~sdk.ParallelConsumer`): its group and
    its published stats snapshot."""

    group: str

    def stats(self) -> dict[str, Any]: ...


_COUNTS = {
    "processed": "Records processed successfully.",
    "failed": "Handler failures (each failed attempt).",
    "retried": "Failed attempts that were scheduled for retry.",
    "dead_lettered": "Records written to the dead-letter topic.",
    "skipped": "Records given up without a dead-letter topic (on_exhausted='skip').",
    "stuck": "Records that failed for good with nowhere to go (each is held).",
    "restored_skips": "Records skipped because the offset map said they were done before.",
    "given_back": "Unstarted records a stalled partition forgot to make room (fetched again).",
}


class EngineCollector(Collector):
    def __init__(self, consumer: Watched) -> None:
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
            "sdk_stuck_records",
            "Records that failed for good with no dead-letter topic: held, never committed past.",
            group,
            stats["stuck"],
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
        pauses = CounterMetricFamily(
            "sdk_partition_pauses",
            "Times the partition was paused for back-pressure (each costs a refetch).",
            labels=labels,
        )
        paused_with_work = CounterMetricFamily(
            "sdk_paused_with_work_seconds",
            "Seconds the partition was paused while its records could have run.",
            labels=labels,
        )
        for (topic, partition), counts in stats["counts"].items():
            values = [group, topic, str(partition)]
            for name, family in families.items():
                family.add_metric(values, counts[name])
            pauses.add_metric(values, counts["pauses"])
            paused_with_work.add_metric(values, counts["paused_with_work_s"])
        yield from families.values()
        yield from (pauses, paused_with_work)

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

        yield from _gate_metrics(group, stats)
        yield from _output_metrics(group, stats.get("outputs"))

        counts, total = stats["latency"]
        if counts:
            yield _histogram(
                "sdk_handler_seconds",
                "Handler duration per record (per batch for batches).",
                group,
                counts,
                total,
            )


def _counter(name: str, help_text: str, group: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=["group"])
    family.add_metric([group], value)
    return family


def _output_metrics(group: str, outputs: dict[str, Any] | None) -> Iterator[Metric]:
    if not outputs:
        return
    yield _counter("sdk_outputs_produced", "Handler outputs produced.", group, outputs["produced"])
    yield _counter(
        "sdk_produce_failures",
        "Outputs that could not be produced or were not delivered.",
        group,
        outputs["failures"],
    )
    transactions = outputs.get("transactions")
    if not transactions:
        return
    yield _counter(
        "sdk_transactions_committed", "Transactions committed.", group, transactions["committed"]
    )
    yield _counter(
        "sdk_transactions_aborted",
        "Transactions aborted (their inputs were processed again).",
        group,
        transactions["aborted"],
    )
    yield _counter(
        "sdk_transaction_seconds",
        "Time spent committing transactions (offsets and commit).",
        group,
        transactions["seconds"],
    )
    yield _gauge(
        "sdk_transaction_outputs",
        "Outputs in the last committed transaction.",
        group,
        transactions["last_outputs"],
    )


def _gauge(name: str, help_text: str, group: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=["group"])
    family.add_metric([group], value)
    return family


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


def _histogram(name: str, help_text: str, group: str, counts: list[int], total: float) -> Metric:
    cumulative, running = [], 0
    for bound, count in zip((*LATENCY_BUCKETS, float("inf")), counts, strict=True):
        running += count
        cumulative.append((_bound(bound), running))
    family = HistogramMetricFamily(name, help_text, labels=["group"])
    family.add_metric([group], cumulative, sum_value=total)
    return family


def _gate_metrics(group: str, stats: dict) -> Iterator[Metric]:
    gate = stats.get("gate")
    if gate is None:
        return
    labels = ["group", "topic", "partition"]
    held = GaugeMetricFamily(
        "sdk_gate_held_records",
        "Records held because their dependencies have not committed past them.",
        labels=labels,
    )
    for (topic, partition), view in stats["partitions"].items():
        held.add_metric([group, topic, str(partition)], view["gate_held"])
    yield held
    counts, total = stats["holds"]
    if any(counts):
        yield _histogram(
            "sdk_gate_hold_seconds",
            "How long gated partitions waited until released.",
            group,
            counts,
            total,
        )
    name = gate["name"]
    version = GaugeMetricFamily(
        "sdk_gate_snapshot_version", "Version of the snapshot in force.", labels=["group", "gate"]
    )
    age = GaugeMetricFamily(
        "sdk_gate_snapshot_age_seconds", "Age of the snapshot in force.", labels=["group", "gate"]
    )
    stale = GaugeMetricFamily(
        "sdk_gate_stale",
        "1 while no source has sent news for stale_after.",
        labels=["group", "gate"],
    )
    if gate["version"] is not None:
        version.add_metric([group, name], gate["version"])
        age.add_metric([group, name], gate["age"] or 0.0)
    stale.add_metric([group, name], int(gate["stale"]))
    up = GaugeMetricFamily(
        "sdk_gate_source_up",
        "1 while a watermark source works.",
        labels=["group", "gate", "source"],
    )
    rejected = CounterMetricFamily(
        "sdk_gate_rejected_snapshots",
        "Snapshots a source delivered and the consumer refused.",
        labels=["group", "gate", "source", "reason"],
    )
    for source, state in gate["sources"].items():
        up.add_metric([group, name, source], int(state["up"]))
        for reason, count in state["rejected"].items():
            rejected.add_metric([group, name, source, reason], count)
    yield from (version, age, stale, up, rejected)
