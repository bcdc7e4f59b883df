"""Batch reads, ``spark.read.format("gated-kafka")``: what the gate has released now."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from sdk.spark._bounds import ending, snapshot_watermark
from sdk.spark._plan import tasks
from sdk.spark._planner import KafkaPlanner
from sdk.spark._read import read_task


class GatedKafkaBatchReader(KafkaPlanner, DataSourceReader):
    """Reads, per partition, [start, end): the start from ``startingOffsets`` (or a starting
    timestamp), the end from ``endingOffsets`` and, with gating on, never at or past the
    gate's watermark. Planned once on the driver; the gate is stopped when planning ends."""

    def __init__(self, options: Mapping[str, str], headers: bool) -> None:
        super().__init__(options, batch=True)
        self.headers = headers

    def plan(self) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        """The start and end offsets of every partition read."""
        try:
            partitions = self._partitions()
            low, high = self._bounds(partitions)
            start = self._starting(partitions, low, high)
            watermark = snapshot_watermark(self._watermarks()) if self.settings.gated else None
            return start, ending(self.settings.ending, start, high, watermark)
        finally:
            self.stop()

    def partitions(self) -> Sequence[InputPartition]:
        start, end = self.plan()
        return tasks(start, end, self.settings.max_per_task, self.settings.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_task(self.settings, partition, self.headers)
