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
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from gate import Snapshot
from sdk.spark._bounds import Partitions, at_times, gated_end, starting, wanted_times
from sdk.spark._plan import (
    Offsets,
    beyond_end,
    beyond_end_error,
    cap,
    data_loss,
    not_below,
    sorted_offsets,
    tasks,
)
from sdk.spark._progress import held_back_by_gate, offsets_behind_latest
from sdk.spark._read import read_task
from sdk.spark._settings import LOG, NAME, Settings

log = logging.getLogger("sdk.spark")
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS = "headers array<struct<key: string, value: binary>>"
# Planning a batch reuses the topics' partitions for this long (a partition added to a topic
# joins the query at most this much later); the offsets are asked for at every batch.
METADATA_REFRESH_SECONDS = 5.0


class KafkaPlanner:
    """The driver's side of a read, shared by the stream and the batch reader: the partitions
    the options select, their offsets, where reading starts, and the gate's watermarks."""

    def __init__(self, options: Mapping[str, str], batch: bool = False) -> None:
        self.settings = Settings(options, batch)  # fails when the read starts, naming the option
        self.settings.check_consumer_config()
        self._admin: AdminClient | None = None
        self._gate: Any = None
        self._topics: list[str] = []  # the topics planned last (subscribePattern: they change)
        self._gate_topics: list[str] = []
        self._beyond_reported: set[tuple[str, str, int]] = set()  # warned about already

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

    def _partitions(self) -> Partitions:
        """The partitions to read: of the subscribed topics, of the topics matching
        ``subscribePattern`` now, or the assigned ones."""
        try:
            metadata = self._admin_client().list_topics(timeout=10)
        except KafkaException as exc:
            servers = self.settings.kafka.get("bootstrap.servers")
            raise RuntimeError(
                f"{NAME}: cannot reach Kafka at {servers}: {exc.args[0].str()}"
            ) from None
        settings = self.settings
        found: Partitions = {}
        if settings.pattern is not None:
            for topic, meta in sorted(metadata.topics.items()):
                # Kafka's internal topics are never matched, as with a consumer's pattern.
                if topic.startswith("__") or meta.error is not None or not meta.partitions:
                    continue
                if settings.pattern.fullmatch(topic):
                    found[topic] = sorted(meta.partitions)
            self._topics = list(found)
            return found
        wanted: Mapping[str, list[int] | None] = settings.assign or dict.fromkeys(settings.topics)
        for topic, chosen in wanted.items():
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise RuntimeError(f"{NAME}: topic '{topic}' does not exist (or no longer does)")
            missing = [p for p in chosen or [] if p not in meta.partitions]
            if missing:
                raise RuntimeError(
                    f"{NAME}: option 'assign': topic '{topic}' has no partition "
                    f"{', '.join(map(str, missing))} (it has {len(meta.partitions)})"
                )
            found[topic] = sorted(meta.partitions) if chosen is None else list(chosen)
        self._topics = list(found)
        return found

    def _offsets(self, specs: Mapping[TopicPartition, OffsetSpec]) -> dict[tuple[str, int], int]:
        """One ListOffsets request at the readers' isolation level."""
        if not specs:
            return {}
        futures = self._admin_client().list_offsets(
            dict(specs), isolation_level=self.settings.isolation, request_timeout=10
        )
        return {
            (tp.topic, tp.partition): future.result(timeout=15).offset
            for tp, future in futures.items()
        }

    def _bounds(self, partitions: Partitions) -> tuple[Offsets, Offsets]:
        """Earliest and end offset of every partition: two ListOffsets requests, both sent
        before either answer is awaited (one round-trip). The end is the one the readers see:
        under read_committed the last stable offset (where the first open transaction begins),
        under read_uncommitted the high watermark."""
        chosen = [TopicPartition(t, p) for t, parts in partitions.items() for p in parts]
        if not chosen:
            return {}, {}
        admin = self._admin_client()
        pending = [
            admin.list_offsets(
                dict.fromkeys(chosen, spec),
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
            found.append(sorted_offsets(offsets))
        return found[0], found[1]

    def _starting(self, partitions: Partitions, low: Offsets, high: Offsets) -> Offsets:
        """Where reading starts: ``startingTimestamp``, else ``startingOffsetsByTimestamp``,
        else ``startingOffsets`` (the precedence of Spark's Kafka source)."""
        settings = self.settings
        if settings.starting_timestamp is None and settings.starting_by_timestamp is None:
            start = starting(settings.starting, low, high)
            for topic, partition in self._beyond_the_end(
                "the start startingOffsets gives", start, low, high
            ):
                start[topic][partition] = low[topic][partition]
            return sorted_offsets(start)
        wanted = wanted_times(
            partitions, settings.starting_timestamp, settings.starting_by_timestamp
        )
        found = self._offsets(
            {TopicPartition(t, p): OffsetSpec.for_timestamp(ms) for (t, p), ms in wanted.items()}
        )
        return sorted_offsets(at_times(found, wanted, high, settings.timestamp_strategy))

    def _beyond_the_end(
        self, where: str, start: Offsets, low: Offsets, high: Offsets
    ) -> set[tuple[str, str]]:
        """The partitions whose position in ``start`` is beyond the log end: the log it was
        taken on is gone (topic recreated, broker data lost), so the records of the new log
        below it were never read. That is data loss, never "no new data yet": with
        failOnDataLoss it fails naming the partition, the offset and the log end; without,
        it warns (once per partition and offset) and the partitions returned are read again
        from their earliest offset."""
        found: set[tuple[str, str]] = set()
        for topic, partitions in sorted(start.items()):
            for partition, offset in sorted(partitions.items(), key=lambda item: int(item[0])):
                end = high.get(topic, {}).get(partition)
                if end is None or offset <= end:
                    continue
                if self.settings.fail_on_data_loss:
                    raise RuntimeError(beyond_end_error(topic, int(partition), where, offset, end))
                found.add((topic, partition))
                if (topic, partition, offset) not in self._beyond_reported:
                    self._beyond_reported.add((topic, partition, offset))
                    log.warning(
                        "%s; reading the partition from its earliest offset %d "
                        "(failOnDataLoss is false)",
                        beyond_end(topic, int(partition), where, offset, end),
                        low[topic][partition],
                    )
        return found

    def initialOffset(self) -> Offsets:
        partitions = self._partitions()
        low, high = self._bounds(partitions)
        return self._starting(partitions, low, high)

    def _watermarks(self) -> Snapshot | None:
        gate = self._gate
        if gate is not None and self.settings.depends_on and self._gate_topics != self._topics:
            # Polling the admin API watches a fixed set of topics: a topic matched since by
            # subscribePattern needs a new poller.
            gate.stop()
            gate = self._gate = None
        if gate is None:
            from sdk._gating import Gate
            from sdk._sources import EmbeddedSource, HttpSource, RedisSource

            settings = self.settings
            sources: list[Any] = []
            if settings.redis_url:
                sources.append(RedisSource(settings.redis_url, prefix=settings.redis_prefix))
            if settings.http_url:
                sources.append(HttpSource(settings.http_url, token=settings.http_token))
            if settings.depends_on and not self._topics:
                return None  # no topic to read yet, nothing to gate
            self._gate_topics = list(self._topics)
            if settings.depends_on:
                sources.append(
                    EmbeddedSource(
                        settings.client_config(),
                        self._gate_topics,
                        settings.depends_on,
                        poll_interval=settings.poll_interval,
                    )
                )
            gate = self._gate = Gate(settings.gate_name, sources).start()
            gate.wait_for_snapshot(10)
        return gate.snapshot

    def stop(self) -> None:
        """Stops the gate's threads and drops the admin client."""
        if self._gate is not None:
            self._gate.stop()
        self._gate = self._admin = None


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

    def reader(self, schema: Any) -> DataSourceReader:
        from sdk.spark._batch import GatedKafkaBatchReader

        return GatedKafkaBatchReader(self.options, self._headers())
