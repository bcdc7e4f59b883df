"""The gates' series in ``/metrics``: built from their latest states once per poll cycle and
kept, formatted, until a poll brings new states.

The series per partition and per group and partition are a function of the states alone
(their ages, as their lags, are as of each state's poll), so every scrape between two polls
gets the same bytes; what depends on the moment of the scrape (the snapshots' ages, whether
the last poll refreshed a gate, the service's counters) is in :mod:`gate.service._metrics`, made at
each scrape. The series per partition (a gate's own: watermark, end offset, waiting; and each
of its groups': committed offset, lags, commit age, status) are exposed for at most
``status.metrics_group_partitions_max`` partition rows over the whole service, a gate's
partitions counting one row each for the gate and one for each of its groups: gates in the
configuration's order have theirs while they fit in what is left. Every gate's own series and
its groups' series over all partitions always are.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import NamedTuple, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gate.evaluate._state import SEVERITY, DependencyStatus, GateState, position_tuples
from gate.publish._publish import SnapshotStore
from gate.service._config import GateConfig

log = logging.getLogger("gate.metrics")


class Watched(Protocol):
    """What the gates' series read of the service."""

    config: GateConfig
    store: SnapshotStore


STATUS_CODES = {
    DependencyStatus.OK: 0,
    DependencyStatus.LAGGING: 1,
    DependencyStatus.REWOUND: 2,
    DependencyStatus.STALLED: 3,
    DependencyStatus.MISSING: 4,
    DependencyStatus.BEHIND: 5,
}
_CODE_BY_RANK = tuple(STATUS_CODES[status] for status in SEVERITY)

NAMED = 5
"""Gates a log line names before it says how many more."""


class _Kept(NamedTuple):
    states: tuple[GateState | None, ...]
    families: list[Metric]


def _escaped(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def exposition(families: Sequence[Metric]) -> bytes:
    """Gauge families in Prometheus' text format, the bytes ``generate_latest`` writes for
    them (labels sorted by name, values as Go formats floats) at a fraction of its cost per
    series: the label names are sorted once per family, not once per series. A fleet's
    13,000 series format in about a fifth of the time."""
    lines: list[str] = []
    add = lines.append
    for family in families:
        if family.type != "gauge":
            raise ValueError(f"{family.name} is a {family.type}: only gauges are formatted here")
        name = family.name
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        add(f"# HELP {name} {doc}\n# TYPE {name} gauge\n")
        keys: list[str] | None = None
        for sample in family.samples:
            labels = sample.labels
            if keys is None:
                keys = sorted(labels)
            value = floatToGoString(sample.value)
            if keys:
                text = ",".join([f'{key}="{_escaped(labels[key])}"' for key in keys])
                add(f"{name}{{{text}}} {value}\n")
            else:
                add(f"{name} {value}\n")
    return "".join(lines).encode()


def _named(names: Sequence[str]) -> str:
    more = len(names) - NAMED
    return ", ".join(names[:NAMED]) + (f" and {more} more" if more > 0 else "")


class GateSeries(Collector):
    """The gates' series, kept per set of states (one build per poll cycle)."""

    def __init__(self, service: Watched) -> None:
        self._service = service
        self._kept: _Kept | None = None
        self._text: tuple[_Kept, bytes] | None = None
        self._limited: set[str] = set()
        """Gates whose series per group and partition are left out (said when it changes)."""
        self._muted = threading.local()

    def _states(self) -> tuple[GateState | None, ...]:
        store = self._service.store
        return tuple(store.latest(name) for name in store.gates)

    def kept(self) -> list[Metric]:
        """The families of the latest states, built if they are not kept."""
        states = self._states()
        kept = self._kept
        if kept is None or any(a is not b for a, b in zip(kept.states, states, strict=True)):
            kept = self._kept = _Kept(states, list(self._build(states)))
        return kept.families

    def text(self) -> bytes:
        """The families of the latest states in Prometheus' text format, formatted if they
        are not kept."""
        self.kept()
        kept = self._kept
        assert kept is not None
        formatted = self._text
        if formatted is None or formatted[0] is not kept:
            formatted = self._text = (kept, exposition(kept.families))
        return formatted[1]

    @contextlib.contextmanager
    def muted(self) -> Iterator[None]:
        """Collect nothing in this thread meanwhile (their text is added as it is kept)."""
        self._muted.on = True
        try:
            yield
        finally:
            self._muted.on = False

    def collect(self) -> Iterator[Metric]:
        if getattr(self._muted, "on", False):
            return
        yield from self.kept()

    def _say_which_are_limited(self, left_out: dict[str, tuple[int, int]], limit: int) -> None:
        """One line when gates' series per partition go, one when they come back (dashboards
        built on them see them absent): a fleet has hundreds of gates."""
        gone = [name for name in left_out if name not in self._limited]
        back = [name for name in self._limited if name not in left_out]
        self._limited = set(left_out)
        if gone:
            rows, left = left_out[gone[0]]
            log.warning(
                "%d %s: partition rows beyond what is left of "
                "status.metrics_group_partitions_max (%d for the whole service, the gates "
                "earlier in the configuration first): %s (the first: %d rows, partitions x "
                "(groups + 1), %d left); series per partition left out, the gates' own series "
                "and their groups' over all partitions stay (gate_group_partition_series is 0)",
                len(gone),
                "gate" if len(gone) == 1 else "gates",
                limit,
                _named(gone),
                rows,
                left,
            )
        if back:
            log.info("metrics per partition exposed again: %s", _named(back))

    def _build(self, states: Sequence[GateState | None]) -> Iterator[Metric]:
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
            "Age of the oldest record a dependency group has not processed, at the latest "
            "poll (absent: unknown).",
            labels=["gate", "group", "topic", "partition"],
        )
        unmoved = GaugeMetricFamily(
            "gate_dependency_commit_age_seconds",
            "Seconds since the group's committed offset last moved, at the latest poll "
            "(absent: no commit).",
            labels=["gate", "group", "topic", "partition"],
        )
        waiting = GaugeMetricFamily(
            "gate_records_waiting", "Records held back, over all partitions.", labels=["gate"]
        )
        waiting_seconds = GaugeMetricFamily(
            "gate_waiting_seconds",
            "Age of the oldest record held back, at the latest poll (absent: unknown).",
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
            "partitions, at the latest poll (absent: unknown).",
            labels=["gate", "group"],
        )
        detailed = GaugeMetricFamily(
            "gate_group_partition_series",
            "1 when the gate's series per partition (its own and its groups') are exposed; 0 "
            "when its partitions x (groups + 1) exceed what is left of "
            "status.metrics_group_partitions_max (for the whole service, gates in the "
            "configuration's order).",
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
        limit = service.config.status.metrics_group_partitions_max
        left = limit  # for the whole service: the gates in the configuration's order first
        left_out: dict[str, tuple[int, int]] = {}
        for state in states:
            if state is None:
                continue
            name = state.gate
            # A row per partition for the gate's own series, and one for each group's.
            rows = len(state.partitions) * (len(state.groups) + 1)
            per_partition = rows <= left
            detailed.add_metric([name], int(per_partition))
            if per_partition:
                left -= rows
            else:
                left_out[name] = (rows, left)
            now = state.snapshot.polled_at  # ages as of the poll, as the lags are
            version.add_metric([name], state.version)
            absent = {*state.missing_topics, *(t for t, _ in state.missing_partitions)}
            for topic in service.config.gates[name].topics:
                topic_missing.add_metric([name, topic], int(topic in absent))
            unreleased = 0
            missing_count = dict.fromkeys(state.groups, 0)
            for (topic, partition), part in state.partitions.items():
                if part.watermark is None:
                    unreleased += 1
                positions = position_tuples(part.groups)
                if not per_partition:
                    for group, position in positions.items():
                        if position[0] is None and group in missing_count:
                            missing_count[group] += 1
                    continue
                p = str(partition)
                if part.watermark is not None:
                    watermark.add_metric([name, topic, p], part.watermark)
                if part.end_offset is not None:
                    end_offset.add_metric([name, topic, p], part.end_offset)
                if part.waiting_seconds is not None:
                    waiting_seconds.add_metric([name, topic, p], part.waiting_seconds)
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
        self._say_which_are_limited(left_out, limit)

        yield from (watermark, end_offset, committed, lag, lag_seconds, unmoved)
        yield from (partition_status, group_status, missing, topic_missing, held, version)
        yield from (group_lag, group_lag_seconds, detailed)
        yield from (waiting, waiting_seconds, stuck, unprocessed)
