"""Micro-batches: the driver plans each batch (offsets, gating), executors read its ranges."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from confluent_kafka import KafkaException
from pyspark.sql.datasource import (
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from sdk.spark._bounds import Partitions, gated_end
from sdk.spark._plan import (
    Offsets,
    cap,
    data_loss,
    not_below,
    sorted_offsets,
    tasks,
)
from sdk.spark._planner import KafkaPlanner
from sdk.spark._progress import held_back_by_gate, offsets_behind_latest
from sdk.spark._read import read_task

log = logging.getLogger("sdk.spark")
# Planning a batch reuses the topics' partitions for this long (a partition added to a topic
# joins the query at most this much later); the offsets are asked for at every batch.
METADATA_REFRESH_SECONDS = 5.0


class GatedKafkaStreamReader(KafkaPlanner, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver (offsets, gating) and reads ranges on executors."""

    def __init__(self, options: Mapping[str, str], headers: bool) -> None:
        super().__init__(options)
        self.headers = headers
        self._target: Offsets | None = None
        self.lost_records = 0  # skipped because Kafka no longer had them (failOnDataLoss=false)
        self._losses: set[tuple[str, str, int]] = set()  # reported already
        # The last batch's planning: the partitions (and when they were listed), the log ends,
        # where the gate let the batch go, and the age of the watermark snapshot it used.
        self._listed: Partitions | None = None
        self._listed_at = 0.0
        self._latest: Offsets | None = None
        self._released: Offsets = {}
        self._snapshot_age: float | None = None

    def _log_bounds(self) -> tuple[Offsets, Offsets]:
        """Earliest and end offsets for planning a batch, in one round-trip: the partitions
        listed at most METADATA_REFRESH_SECONDS ago. On an error, the partitions are listed
        again, which says clearly what is wrong (a topic deleted, Kafka unreachable)."""
        now = time.monotonic()
        if self._listed is None or now - self._listed_at >= METADATA_REFRESH_SECONDS:
            self._listed, self._listed_at = self._partitions(), now
        try:
            return self._bounds(self._listed)
        except KafkaException:
            self._listed, self._listed_at = self._partitions(), time.monotonic()
            return self._bounds(self._listed)

    def _available(self, start: Offsets | None) -> tuple[Offsets, set[tuple[str, str]]]:
        """Per partition, how far a batch from ``start`` (None: from the earliest offsets) may
        go now: min(end, watermark); and the partitions moved back to their earliest offset
        because ``start`` is beyond their log end (failOnDataLoss=false; they end there, below
        their start, and are read from there by the next batch)."""
        low, high = self._log_bounds()
        if start is None:
            start = low
        elif any(
            offset > high.get(topic, {}).get(partition, offset)
            for topic, partitions in start.items()
            for partition, offset in partitions.items()
        ):
            # Rare: a position beyond the log end. The partitions listed may be up to
            # METADATA_REFRESH_SECONDS old: list them again, so that a topic deleted (and not
            # recreated) fails saying so, and the log ends judged are those of the topic now.
            self._listed, self._listed_at = self._partitions(), time.monotonic()
            low, high = self._bounds(self._listed)
        moved_back = self._beyond_the_end("the query's checkpoint", start, low, high)
        self._check_data_loss(start, low)
        snapshot = self._watermarks() if self.settings.gated else None
        self._latest = sorted_offsets(high)
        self._snapshot_age = None if snapshot is None else snapshot.age(time.time())
        end: Offsets = {}
        for topic, partitions in high.items():
            for partition, top in partitions.items():
                begin = start.get(topic, {}).get(partition)
                if begin is None:
                    # A partition added since the query started: it joins at its earliest offset
                    # (an empty range now, read from the next batch), so replays stay identical.
                    end.setdefault(topic, {})[partition] = low[topic][partition]
                    continue
                if (topic, partition) in moved_back:
                    # Never "nothing new yet": an empty batch moves the partition back to its
                    # earliest offset (deterministic: a replay of it reads nothing either).
                    end.setdefault(topic, {})[partition] = low[topic][partition]
                    continue
                limit = top
                if self.settings.gated:
                    watermark = (
                        None if snapshot is None else snapshot.watermark(topic, int(partition))
                    )
                    limit = gated_end(begin, limit, watermark)
                end.setdefault(topic, {})[partition] = max(begin, limit)
        self._released = end
        return end, moved_back

    def _check_data_loss(self, start: Offsets, low: Offsets) -> None:
        """Records between the query's position and the log start are gone from Kafka."""
        for topic, partitions in sorted(start.items()):
            for partition, begin in sorted(partitions.items()):
                first = low.get(topic, {}).get(partition)
                if first is None or begin >= first:
                    continue
                missing = data_loss(topic, int(partition), begin, first)
                if self.settings.fail_on_data_loss:
                    raise RuntimeError(missing)
                if (topic, partition, begin) not in self._losses:
                    self._losses.add((topic, partition, begin))
                    self.lost_records += first - begin
                    log.warning("%s; skipping them (failOnDataLoss is false)", missing)

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        end, moved_back = self._available(start)
        if self._target is not None:  # Trigger.AvailableNow: never beyond the target
            end = {
                t: {
                    p: o if (t, p) in moved_back else min(o, self._target.get(t, {}).get(p, o))
                    for p, o in parts.items()
                }
                for t, parts in end.items()
            }
        maximum = self.settings.max_per_trigger
        if isinstance(limit, ReadMaxRows):
            maximum = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            maximum = None
        if maximum is not None:
            end = cap(start, end, maximum)
        return sorted_offsets(not_below(start, end, moved_back))

    def getDefaultReadLimit(self) -> ReadLimit:
        maximum = self.settings.max_per_trigger
        return ReadAllAvailable() if maximum is None else ReadMaxRows(maximum)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        # From the earliest offsets, not from startingOffsets: a checkpoint governs where the
        # query is, and for a target that caps the batches' ends both give the same plan.
        self._target, _ = self._available(None)

    def reportLatestOffset(self) -> Offsets | None:
        """The log ends seen when the last batch was planned: Spark shows them as the source's
        ``latestOffset`` in the query's progress, beside the batch's ``endOffset``."""
        return self._latest

    def metrics(self, latest_consumed: Offsets | str | None) -> dict[str, str]:
        """The figures Spark's JVM Kafka source reports for a batch ending at
        ``latest_consumed`` (``min/avg/maxOffsetsBehindLatest``), and the gate's:
        ``recordsHeldBackByGate`` (records between the batch's end and the log end that the
        gate had not released) and ``watermarkSnapshotAgeMs`` (the age of the watermarks the
        batch was planned with). Strings, as Spark wants them; empty before a batch is planned.
        Spark 4.3 does not call this for a Python source (see docs/spark.md, "Progress")."""
        if self._latest is None or latest_consumed is None:
            return {}
        end = json.loads(latest_consumed) if isinstance(latest_consumed, str) else latest_consumed
        figures = offsets_behind_latest(end, self._latest)
        held = held_back_by_gate(end, self._released, self._latest) if self.settings.gated else 0
        figures["recordsHeldBackByGate"] = str(held)
        if self._snapshot_age is not None:
            figures["watermarkSnapshotAgeMs"] = str(round(self._snapshot_age * 1000))
        return figures

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        return tasks(start, end, self.settings.max_per_task, self.settings.min_partitions)

    def commit(self, end: Offsets) -> None:
        """Spark calls this a batch late; the job's Kafka commits come from ProgressCommitter."""

    # ---- reading (executors) -----------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_task(self.settings, partition, self.headers)
