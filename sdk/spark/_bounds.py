"""Where a read starts and ends, per partition: the pure part of the driver's planning."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gate import Snapshot
from sdk.spark._settings import EARLIEST, LATEST, NAME, Offsets, SourceOptionError

Partitions = dict[str, list[int]]  # topic -> its partitions the options select


def gated_end(begin: int, end: int, watermark: int | None) -> int:
    """How far a gated read of [begin, end) may go: not to or past the watermark, and a
    partition without one (nothing released) does not move."""
    return min(end, begin if watermark is None else max(begin, watermark))


def starting(given: str | Offsets, low: Offsets, high: Offsets) -> Offsets:
    """``startingOffsets``: earliest, latest, or JSON (-2 earliest, -1 latest; a partition the
    JSON does not name starts at its earliest offset)."""
    start: Offsets = {}
    for topic, partitions in high.items():
        for partition, top in partitions.items():
            first = low[topic][partition]
            offset = first
            if given == "latest":
                offset = top
            elif isinstance(given, dict) and partition in given.get(topic, {}):
                offset = {EARLIEST: first, LATEST: top}.get(
                    given[topic][partition], given[topic][partition]
                )
            start.setdefault(topic, {})[partition] = offset
    return start


def wanted_times(
    partitions: Partitions, every: int | None, by_partition: Offsets | None
) -> dict[tuple[str, int], int]:
    """The timestamp (ms) to start each partition at: ``startingTimestamp`` for all of them,
    else ``startingOffsetsByTimestamp``, which must name every selected partition."""
    if every is not None:
        return {(t, p): every for t, parts in partitions.items() for p in parts}
    given = by_partition or {}
    missing = [
        f"{t}[{p}]"
        for t, parts in partitions.items()
        for p in parts
        if str(p) not in given.get(t, {})
    ]
    if missing:
        raise SourceOptionError(
            f"{NAME}: option 'startingOffsetsByTimestamp' must give a timestamp for every "
            f"partition read (as in Spark's Kafka source); missing: {', '.join(missing)}"
        )
    return {(t, p): given[t][str(p)] for t, parts in partitions.items() for p in parts}


def at_times(
    found: Mapping[tuple[str, int], int],
    wanted: Mapping[tuple[str, int], int],
    high: Offsets,
    strategy: str,
) -> Offsets:
    """Start offsets from Kafka's answer to "the first offset at or after this timestamp"
    (-1: no such record). Strategy ``error`` fails naming such partitions, ``latest`` starts
    them at the end."""
    start: Offsets = {}
    none: list[str] = []
    for (topic, partition), offset in sorted(found.items()):
        top = high[topic][str(partition)]
        if offset < 0:
            none.append(f"{topic}[{partition}] (timestamp {wanted[(topic, partition)]})")
            offset = top
        start.setdefault(topic, {})[str(partition)] = min(offset, top)
    if none and strategy == "error":
        raise RuntimeError(
            f"{NAME}: no record at or after the starting timestamp in {', '.join(none)}; set "
            "startingOffsetsByTimestampStrategy to latest to start such partitions at their end"
        )
    return start


def ending(
    given: str | Offsets,
    start: Offsets,
    high: Offsets,
    watermark: Callable[[str, int], int | None] | None,
) -> Offsets:
    """A batch read's end: ``endingOffsets`` (latest, or JSON with -1 latest; a partition the
    JSON does not name ends at latest), never past the end of the partition, with a gate
    (``watermark`` given) never at or past its watermark, and never below the start."""
    end: Offsets = {}
    for topic, partitions in high.items():
        for partition, top in partitions.items():
            begin = start[topic][partition]
            limit = top
            if isinstance(given, dict):
                wanted = given.get(topic, {}).get(partition, LATEST)
                limit = top if wanted == LATEST else min(wanted, top)
            if watermark is not None:
                limit = gated_end(begin, limit, watermark(topic, int(partition)))
            end.setdefault(topic, {})[partition] = max(begin, limit)
    return end


def snapshot_watermark(snapshot: Snapshot | None) -> Callable[[str, int], int | None]:
    """The watermark of a partition in a gate's snapshot (None: nothing released)."""
    return lambda topic, partition: (
        None if snapshot is None else snapshot.watermark(topic, partition)
    )
