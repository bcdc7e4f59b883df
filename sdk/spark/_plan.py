"""Offsets and the ranges Spark tasks read: the pure part of planning a batch."""

from __future__ import annotations

import heapq
import json
from collections.abc import Collection, Mapping, Sequence

from pyspark.sql.datasource import InputPartition

from gate import Snapshot
from sdk.spark._settings import NAME

Offsets = dict[str, dict[str, int]]
# A Spark task costs Spark tens of milliseconds of scheduling (0.1 to 0.2 s between one task
# and the next on a busy 2-core machine, where a task reads about 200,000 records a second),
# and a batch's tasks beyond the executors' cores run in waves: ranges holding fewer records
# than this share a task, read one after the other, until it holds at least this many.
SHARED_TASK_RECORDS = 50_000


class OffsetRange(InputPartition):
    """One Spark task: records [start, end) of one Kafka partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class OffsetRanges(InputPartition):
    """One Spark task reading several small ranges, one after the other."""

    def __init__(self, ranges: Sequence[OffsetRange]) -> None:
        super().__init__(tuple((r.topic, r.partition, r.start, r.end) for r in ranges))
        self.ranges = list(ranges)


def tasks(
    start: Offsets, end: Offsets, max_per_task: int | None, min_partitions: int | None = None
) -> list[InputPartition]:
    """The Spark tasks of a batch: its ranges (see ``ranges``), the small ones sharing tasks
    of at least ``SHARED_TASK_RECORDS`` records (``shared``) unless ``maxRecordsPerPartition``
    or ``minPartitions`` sets the tasks' sizes. Deterministic, as ``ranges``."""
    planned = ranges(start, end, max_per_task, min_partitions)
    if max_per_task is not None or min_partitions is not None:
        return list(planned)
    return shared(planned)


def shared(
    planned: Sequence[OffsetRange], fewest: int = SHARED_TASK_RECORDS
) -> list[InputPartition]:
    """The tasks of ``planned``: a range of ``fewest`` records or more is a task, smaller ones
    share tasks, taken in order until a task holds ``fewest`` (a task of one range stays an
    ``OffsetRange``). A live query's batch of a few records per partition is one task; a
    backlog's large ranges keep a task each."""
    found: list[InputPartition] = []
    group: list[OffsetRange] = []
    for task in planned:
        if task.end - task.start >= fewest:
            found.append(task)
            continue
        group.append(task)
        if sum(r.end - r.start for r in group) >= fewest:
            found.append(group[0] if len(group) == 1 else OffsetRanges(group))
            group = []
    if group:
        found.append(group[0] if len(group) == 1 else OffsetRanges(group))
    return found


def ranges(
    start: Offsets, end: Offsets, max_per_task: int | None, min_partitions: int | None = None
) -> list[OffsetRange]:
    """The ranges of a batch's tasks: one per Kafka partition with records in [start, end),
    that partition's range split evenly when it holds more than ``max_per_task`` records; then
    the largest ranges split further until there are at least ``min_partitions`` (while a
    range has records to split). Deterministic: a replayed batch plans the identical tasks."""
    spans: list[tuple[str, int, int, int]] = []  # topic, partition, first, stop
    for topic, partitions in sorted(end.items()):
        for partition, stop in sorted(partitions.items(), key=lambda item: int(item[0])):
            first = start.get(topic, {}).get(partition, stop)
            if first < stop:
                spans.append((topic, int(partition), first, stop))
    pieces = [
        1 if max_per_task is None else -(-(stop - first) // max_per_task)
        for _, _, first, stop in spans
    ]
    _split_largest(spans, pieces, min_partitions or 0)
    tasks: list[OffsetRange] = []
    for (topic, partition, first, stop), count in zip(spans, pieces, strict=True):
        size, longer = divmod(stop - first, count)
        for index in range(count):
            last = first + size + (1 if index < longer else 0)
            tasks.append(OffsetRange(topic, partition, first, last))
            first = last
    return tasks


def _split_largest(
    spans: Sequence[tuple[str, int, int, int]], pieces: list[int], wanted: int
) -> None:
    """Adds pieces to the spans whose pieces are largest (ties: the first span) until there
    are ``wanted`` pieces or every piece holds one record."""
    heap = [
        (-((stop - first) / count), index)
        for index, ((_, _, first, stop), count) in enumerate(zip(spans, pieces, strict=True))
    ]
    heapq.heapify(heap)
    total = sum(pieces)
    while total < wanted and heap:
        _, index = heapq.heappop(heap)
        _, _, first, stop = spans[index]
        if pieces[index] >= stop - first:
            continue  # one record per piece: cannot split further
        pieces[index] += 1
        total += 1
        heapq.heappush(heap, (-((stop - first) / pieces[index]), index))


def data_loss(topic: str, partition: int, first: int, end: int) -> str:
    return (
        f"{NAME}: {topic}[{partition}]: offsets {first} to {end - 1} are no longer in Kafka "
        "(removed by retention or deletion) and cannot be read; set the option "
        "failOnDataLoss to false to skip them"
    )


def beyond_end(topic: str, partition: int, where: str, offset: int, end: int) -> str:
    """A position beyond the log end: the log the position was taken on is gone (the topic
    was deleted and recreated, or the broker lost its data), and the records of the new log
    below it were never read. ``where`` names the position ("the query's checkpoint", "the
    start startingOffsets gives"); the caller says what follows (failing, or starting again)."""
    return (
        f"{NAME}: {topic}[{partition}]: {where} is at offset {offset}, beyond the log end {end} "
        "(the topic was deleted and recreated, or the broker lost its data): the records "
        "before it are gone and the log's records below it were never read"
    )


def beyond_end_error(topic: str, partition: int, where: str, offset: int, end: int) -> str:
    return (
        beyond_end(topic, partition, where, offset, end)
        + "; set the option failOnDataLoss to false to read the partition from its earliest "
        "offset"
    )


def not_below(
    start: Offsets, end: Offsets, moved_back: Collection[tuple[str, str]] = ()
) -> Offsets:
    """A plan never ends below its start (a dependency may have rewound below it), except in
    the partitions ``moved_back`` to their earliest offset (a position beyond the log end)."""
    return {
        topic: {
            p: o if (topic, p) in moved_back else max(o, start.get(topic, {}).get(p, o))
            for p, o in parts.items()
        }
        for topic, parts in end.items()
    }


def sorted_offsets(offsets: Offsets) -> Offsets:
    return {t: {p: offsets[t][p] for p in sorted(offsets[t], key=int)} for t in sorted(offsets)}


def cap(start: Offsets, end: Offsets, maximum: int) -> Offsets:
    """Spread at most ``maximum`` records over partitions, in proportion to what each has."""
    available = {
        (t, p): o - start.get(t, {}).get(p, o) for t, parts in end.items() for p, o in parts.items()
    }
    total = sum(n for n in available.values() if n > 0)
    if total <= maximum:
        return end
    capped: Offsets = {}
    given = 0
    for (topic, partition), count in sorted(available.items()):
        begin = start.get(topic, {}).get(partition, end[topic][partition])
        if count <= 0:  # nothing to read there (or moved back below its start): unchanged
            capped.setdefault(topic, {})[partition] = end[topic][partition]
            continue
        share = (count * maximum) // total
        capped.setdefault(topic, {})[partition] = begin + share
        given += share
    # Hand out what rounding left, one record at a time, in a fixed order.
    for (topic, partition), count in sorted(available.items()):
        if given >= maximum:
            break
        begin = start.get(topic, {}).get(partition, end[topic][partition])
        if count > 0 and capped[topic][partition] < begin + count:
            capped[topic][partition] += 1
            given += 1
    return capped


def kafka_ending_offsets(
    snapshot: Snapshot,
    topics: Sequence[str],
    starting: Mapping[str, Mapping[str, int]] | None = None,
) -> str:
    """``endingOffsets`` JSON for Spark's JVM Kafka source (``spark.read.format("kafka")``),
    capped at a gate's watermarks. A partition without a watermark (nothing released) ends
    where it starts, so ``starting`` must give its starting offset."""
    ending: dict[str, dict[str, int]] = {}
    for (topic, partition), watermark in sorted(snapshot.watermarks.items()):
        if topic not in topics:
            continue
        if watermark is None:
            begin = (starting or {}).get(topic, {}).get(str(partition))
            if begin is None:
                raise ValueError(
                    f"{topic}[{partition}] has no watermark (nothing released): give its start"
                )
            watermark = begin
        ending.setdefault(topic, {})[str(partition)] = watermark
    missing = [t for t in topics if t not in ending]
    if missing:
        raise ValueError(f"the gate's snapshot has no partitions of {', '.join(missing)}")
    return json.dumps(ending, sort_keys=True)
