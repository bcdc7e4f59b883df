"""Progress figures of the gated source: offsets behind latest, like Spark's JVM Kafka source.

Spark's JVM Kafka source puts ``minOffsetsBehindLatest``, ``avgOffsetsBehindLatest`` and
``maxOffsetsBehindLatest`` into ``query.lastProgress.sources[i].metrics``. Spark 4.3 asks a
Python source for the latest offsets it saw (``reportLatestOffset``, shown as the source's
``latestOffset``) but never for metrics, so :func:`source_metrics` computes the same figures
from a progress: per partition, the log end seen when the batch was planned minus the batch's
end offset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

Offsets = dict[str, dict[str, int]]


def offsets_behind_latest(end: Mapping[str, Mapping[str, int]], latest: Offsets) -> dict[str, str]:
    """Minimum, average and maximum over partitions of ``latest - end``, as the JVM source
    names and formats them (strings; the average a decimal). Partitions the batch has no end
    for are left out; empty when there is no partition to compare."""
    behind = [
        max(0, top - end[topic][partition])
        for topic, partitions in sorted(latest.items())
        for partition, top in sorted(partitions.items())
        if partition in end.get(topic, {})
    ]
    if not behind:
        return {}
    return {
        "minOffsetsBehindLatest": str(min(behind)),
        "avgOffsetsBehindLatest": str(sum(behind) / len(behind)),
        "maxOffsetsBehindLatest": str(max(behind)),
    }


def held_back_by_gate(
    end: Mapping[str, Mapping[str, int]], released: Offsets, latest: Offsets
) -> int:
    """Records between a batch's end and the log end that the gate did not release: per
    partition, the records from ``max(end, released)`` to the log end (``released`` is where
    the gate let the batch go, ``latest`` the log end)."""
    held = 0
    for topic, partitions in latest.items():
        for partition, top in partitions.items():
            consumed = end.get(topic, {}).get(partition)
            limit = released.get(topic, {}).get(partition, top)
            if consumed is not None:
                held += max(0, top - max(consumed, limit))
    return held


def source_metrics(progress: Mapping[str, Any] | str, index: int = 0) -> dict[str, str]:
    """Offsets behind latest (``minOffsetsBehindLatest``, ``avgOffsetsBehindLatest``,
    ``maxOffsetsBehindLatest``) of source ``index`` of a streaming query's progress:
    ``query.lastProgress``, the ``progress`` of a ``StreamingQueryListener``'s event, its
    JSON, or its dict. Computed from the source's ``endOffset`` and ``latestOffset`` (the log
    ends the gated source saw when it planned the batch). Empty when the progress has no
    latest offset (a source that does not report it, or no batch yet)."""
    if isinstance(progress, str):
        progress = json.loads(progress)
    assert not isinstance(progress, str)
    sources = progress.get("sources") or []
    if not isinstance(sources, list) or not -len(sources) <= index < len(sources):
        raise ValueError(f"the progress has {len(sources)} source(s), not one at index {index}")
    source = sources[index]
    end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
    if end is None or latest is None:
        return {}
    return offsets_behind_latest(end, latest)


def _offsets(value: Any) -> Offsets | None:
    """An offset of a progress (JSON text or already parsed) as ``{topic: {partition: n}}``;
    None when absent or not in the gated source's shape."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    parsed: Offsets = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, dict):
            return None
        for partition, offset in partitions.items():
            if not isinstance(offset, int):
                return None
            parsed.setdefault(str(topic), {})[str(partition)] = offset
    return parsed
