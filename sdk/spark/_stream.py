"""The gated Kafka source: Spark's entry point, and the driver's planning of micro-batches."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from gate._watermark import Snapshot
from sdk.spark._plan import (
    OffsetRange,
    Offsets,
    cap,
    data_loss,
    not_below,
    ranges,
    sorted_offsets,
)
from sdk.spark._progress import held_back_by_gate, offsets_behind_latest
from sdk.spark._read import read_range
from sdk.spark._settings import EARLIEST, LATEST, LOG, NAME, Settings

log = logging.getLogger("sdk.spark")
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS = "headers array<struct<key: string, value: binary>>"
# Planning a batch reuses the topics' partitions for this long (a partition added to a topic
# joins the query at most this much later); the offsets are asked for at every batch.
METADATA_REFRESH_SECONDS = 5.0


class GatedKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver (offsets, gating) and reads ranges on executors."""

    def __init__(self, options: Mapping[str, str], headers: bool) -> None:
        self.settings = Settings(options)  # fails when the query starts, naming the option
        self.settings.check_consumer_config()
        self.headers = headers
        self._admin: AdminClient | None = None
        self._gate: Any = None
        self._target: Offsets | None = None
        self.lost_records = 0  # skipped because Kafka no longer had them (failOnDataLoss=false)
        self._losses: set[tuple[str, str, int]] = set()  # reported already
        # The last batch's planning: partitions (and when listed), log ends, where the gate
        # let the batch go, and the age of the watermark snapshot it used.
        self._counts: dict[str, int] | None = None
        self._counts_at = 0.0
        self._latest: Offsets | None = None
        self._released: Offsets = {}
        self._snapshot_age: float | None = None

    # Kafka clients and the gate's threads live on the driver only: never pickled to tasks.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_admin"] = state["_gate"] = None
        return state

    # ---- planning (driver) -------------------------------------------------------------

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({**self.settings.client_config(), "logger": LOG})
        return self._admin

    def _partitions(self) -> dict[str, int]:
        try:
            metadata = self._admin_client().list_topics(timeout=10)
        except KafkaException as exc:
            servers = self.settings.kafka.get("bootstrap.servers")
            raise RuntimeError(
                f"{NAME}: cannot reach Kafka at {servers}: {exc.args[0].str()}"
            ) from None
        counts = {}
        for topic in self.settings.topics:
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                raise RuntimeError(f"{NAME}: topic '{topic}' does not exist (or no longer does)")
            counts[topic] = len(found.partitions)
        return counts

    def _bounds(self, counts: Mapping[str, int]) -> tuple[Offsets, Offsets]:
        """Earliest and end offset of every partition (two admin requests). The end is the one
        the readers see: under read_committed the last stable offset (where the first open
        transaction begins), under read_uncommitted the high watermark."""
        admin = self._admin_client()
        partitions = [TopicPartition(t, p) for t, n in counts.items() for p in range(n)]
        found: list[Offsets] = []
        for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
            futures = admin.list_offsets(
                {tp: spec for tp in partitions},
                isolation_level=self.settings.isolation,
                request_timeout=10,
            )
            offsets: Offsets = {}
            for tp, future in futures.items():
                offsets.setdefault(tp.topic, {})[str(tp.partition)] = future.result(
                    timeout=15
                ).offset
            found.append(offsets)
        return found[0], found[1]

    def initialOffset(self) -> Offsets:
        counts = self._partitions()
        low, high = self._bounds(counts)
        start: Offsets = {}
        starting = self.settings.starting
        for topic, partitions in high.items():
            for partition in partitions:
                if starting == "latest":
                    offset = high[topic][partition]
                elif isinstance(starting, dict) and partition in starting.get(topic, {}):
                    given = starting[topic][partition]
                    offset = {EARLIEST: low[topic][partition], LATEST: high[topic][partition]}.get(
                        given, given
                    )
                else:
                    offset = low[topic][partition]
                start.setdefault(topic, {})[partition] = offset
        return sorted_offsets(start)

    def _watermarks(self) -> Snapshot | None:
        gate = self._gate
        if gate is None:
            from sdk._gating import Gate
            from sdk._sources import EmbeddedSource, HttpSource, RedisSource

            settings = self.settings
            sources: list[Any] = []
            if settings.redis_url:
                sources.append(RedisSource(settings.redis_url, prefix=settings.redis_prefix))
            if settings.http_url:
                sources.append(HttpSource(settings.http_url, token=settings.http_token))
            if settings.depends_on:
                sources.append(
                    EmbeddedSource(
                        settings.client_config(),
                        settings.topics,
                        settings.depends_on,
                        poll_interval=settings.poll_interval,
                    )
                )
            gate = self._gate = Gate(settings.gate_name, sources).start()
            gate.wait_for_snapshot(10)
        return gate.snapshot

    def _log_bounds(self) -> tuple[Offsets, Offsets]:
        """Earliest and end offsets for planning a batch, in one round-trip: the partitions
        listed at most METADATA_REFRESH_SECONDS ago, and both ListOffsets requests sent before
        either answer is awaited. On any error, the full path (metadata, then offsets) says
        what is wrong."""
        now = time.monotonic()
        if self._counts is None or now - self._counts_at >= METADATA_REFRESH_SECONDS:
            self._counts, self._counts_at = self._partitions(), now
        admin = self._admin_client()
        partitions = [TopicPartition(t, p) for t, n in self._counts.items() for p in range(n)]
        try:
            pending = [
                admin.list_offsets(
                    {tp: spec for tp in partitions},
                    isolation_level=self.settings.isolation,
                    request_timeout=10,
                )
                for spec in (OffsetSpec.earliest(), OffsetSpec.latest())
            ]
            found: list[Offsets] = []
            for futures in pending:
                offsets: Offsets = {}
                for tp, future in futures.items():
                    offsets.setdefault(tp.topic, {})[str(tp.partition)] = future.result(
                        timeout=15
                    ).offset
                found.append(offsets)
        except KafkaException:
            self._counts = self._partitions()  # a topic deleted or changed: fails clearly
            self._counts_at = time.monotonic()
            return self._bounds(self._counts)
        return found[0], found[1]

    def _available(self, start: Offsets) -> Offsets:
        """Per partition, how far a batch may go now: min(end, watermark)."""
        low, high = self._log_bounds()
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
                limit = top
                if self.settings.gated:
                    watermark = (
                        None if snapshot is None else snapshot.watermark(topic, int(partition))
                    )
                    limit = min(limit, begin if watermark is None else max(begin, watermark))
                end.setdefault(topic, {})[partition] = max(begin, limit)
        self._released = end
        return end

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
        end = self._available(start)
        if self._target is not None:  # Trigger.AvailableNow: never beyond the target
            end = {
                t: {p: min(o, self._target.get(t, {}).get(p, o)) for p, o in parts.items()}
                for t, parts in end.items()
            }
        maximum = self.settings.max_per_trigger
        if isinstance(limit, ReadMaxRows):
            maximum = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            maximum = None
        if maximum is not None:
            end = cap(start, end, maximum)
        return sorted_offsets(not_below(start, end))

    def getDefaultReadLimit(self) -> ReadLimit:
        maximum = self.settings.max_per_trigger
        return ReadAllAvailable() if maximum is None else ReadMaxRows(maximum)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._available(self.initialOffset())

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
        return ranges(start, end, self.settings.max_per_task, self.settings.min_partitions)

    def commit(self, end: Offsets) -> None:
        """Spark calls this a batch late; the job's Kafka commits come from ProgressCommitter."""

    def stop(self) -> None:
        if self._gate is not None:
            self._gate.stop()

    # ---- reading (executors) -----------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.settings, partition, self.headers)


class GatedKafkaSource(DataSource):
    """Register with ``spark.dataSource.register(GatedKafkaSource)``; format ``gated-kafka``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return f"{SCHEMA}, {HEADERS}" if self._headers() else SCHEMA

    def _headers(self) -> bool:
        return (
            str(
                self.options.get("includeHeaders", self.options.get("includeheaders", "false"))
            ).lower()
            == "true"
        )

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return GatedKafkaStreamReader(self.options, self._headers())
