"""A gated Kafka source for PySpark Structured Streaming, and the Spark job's own commits.

``GatedKafkaSource`` is a Python data source (``pyspark.sql.datasource``) registered as
``gated-kafka``. It reads Kafka with confluent-kafka on the executors and never puts into a
micro-batch a record at or beyond its gate's watermark: each batch ends, per partition, at
min(end of the partition, watermark), capped further by ``maxOffsetsPerTrigger``::

    from sdk.spark import GatedKafkaSource, ProgressCommitter

    spark.dataSource.register(GatedKafkaSource)
    spark.streams.addListener(ProgressCommitter({"bootstrap.servers": "kafka:9092"}, "enrich-job"))
    payments = (
        spark.readStream.format("gated-kafka")
        .option("kafka.bootstrap.servers", "kafka:9092")
        .option("subscribe", "payments")
        .option("gate.name", "enrich-job")
        .option("gate.redis.url", "redis://redis:6379/0")
        .load()
    )

Options (those of Spark's JVM Kafka source where they fit):

=============================  =============================================================
``subscribe`` (or ``topic``)   topics, comma-separated (required)
``kafka.<property>``           any librdkafka property (``kafka.bootstrap.servers`` required),
                               consumer properties included: the executors' consumers get
                               them all (the driver's admin client the ones it understands)
``kafka.isolation.level``      ``read_committed`` (default) or ``read_uncommitted``: batches
                               are planned and read at this level
``startingOffsets``            ``earliest`` (default), ``latest``, or JSON such as
                               ``{"payments": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest)
``maxOffsetsPerTrigger``       most records per micro-batch, spread over partitions
``maxRecordsPerPartition``     split larger ranges over several Spark tasks (default 100000)
``includeHeaders``             ``true`` adds the ``headers`` column (default ``false``)
``failOnDataLoss``             ``true`` (default): a planned range that retention or deletion
                               removed from Kafka fails the query, naming the partition and
                               the missing offsets; ``false``: logged, counted, and reading
                               continues from the log start
``gate.name``                  the gate (required unless ``gate.enabled`` is ``false``)
``gate.redis.url``             follow the gate service through Redis (``gate.redis.prefix``)
``gate.http.url``              follow the gate service's HTTP API (``gate.http.token``)
``gate.dependsOn``             poll the admin API directly for these groups (comma-separated)
``gate.pollIntervalMs``        embedded polling interval (default 200)
``gate.enabled``               ``false`` turns gating off (reads up to the end)
=============================  =============================================================

The schema is the JVM source's: ``key``, ``value`` (binary), ``topic``, ``partition``,
``offset``, ``timestamp``, ``timestampType``, and with ``includeHeaders`` ``headers``.
Offsets are ``{"topic": {"partition": next offset}}`` with sorted keys, so an unchanged offset
compares equal and a replayed batch reads the identical range.

Batches are planned and read at one isolation level. Under ``read_committed`` a batch ends at
most at the last stable offset (before the first record of a transaction still open), so
whatever it covers is decided and reads the same on a replay; under ``read_uncommitted`` it
may end at the high watermark. Offsets are not contiguous (transaction markers, aborted
records, compaction): a task ends when its consumer's position reaches the range's end.

Spark calls a source's ``commit`` one batch late and never for a run's last batch, so the
job's progress is committed to Kafka by :class:`ProgressCommitter`, a streaming query
listener that runs after Spark has written its commit log: gates and services can then
depend on the Spark job like on any consumer group.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

try:
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming import StreamingQueryListener
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError as missing:
    # One line naming the extra, not a traceback into pyspark's imports.
    module = (missing.name or "pyspark").split(".")[0]
    raise ModuleNotFoundError(
        f"sdk.spark needs {module}, which is not installed: install the 'spark' extra "
        "(pip install '.[spark]' in the kafka-gate checkout)",
        name=module,
    ) from None

from gate._kafkalog import KafkaLog
from gate._watermark import Snapshot
from sdk._options import CONSUMER_ONLY

log = logging.getLogger("sdk.spark")
LOG = KafkaLog("sdk.spark.kafka")

NAME = "gated-kafka"
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS = "headers array<struct<key: string, value: binary>>"
EARLIEST, LATEST = -2, -1
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_ARROW = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", _TIMESTAMP),
        ("timestampType", pa.int32()),
    ]
)
_ARROW_HEADERS = _ARROW.append(pa.field("headers", _HEADERS))
ISOLATION_LEVELS = {
    "read_committed": IsolationLevel.READ_COMMITTED,
    "read_uncommitted": IsolationLevel.READ_UNCOMMITTED,
}
# Consumer properties the source sets itself, rejected as options like Spark's JVM source does.
MANAGED = {
    "auto.offset.reset": "set startingOffsets (and failOnDataLoss) instead",
    "enable.auto.commit": "the query's offsets are Spark's (ProgressCommitter commits them)",
}
STALL_SECONDS = 120.0  # a task whose consumer does not move for this long fails

Offsets = dict[str, dict[str, int]]


class SourceOptionError(ValueError):
    """An option of the gated Kafka source is missing or invalid; the message names it."""


def _bad(option: str, message: str) -> SourceOptionError:
    return SourceOptionError(f"{NAME}: option '{option}' {message}")


class _Settings:
    """The source's options, parsed and validated when the query starts."""

    def __init__(self, options: Mapping[str, str]) -> None:
        lowered = {k.lower(): v for k, v in options.items()}
        self.kafka = {
            k[len("kafka.") :]: v for k, v in options.items() if k.lower().startswith("kafka.")
        }
        if not self.kafka.get("bootstrap.servers"):
            raise _bad("kafka.bootstrap.servers", "is required")
        for key, instead in MANAGED.items():
            if key in self.kafka:
                raise _bad(f"kafka.{key}", f"is not supported: {instead}")
        given = self.kafka.get("isolation.level", "read_committed")
        level = given.strip().lower()
        if level not in ISOLATION_LEVELS:
            raise _bad(
                "kafka.isolation.level",
                f"must be read_committed or read_uncommitted (got {given!r})",
            )
        self.kafka["isolation.level"] = level
        self.isolation = ISOLATION_LEVELS[level]
        topics = lowered.get("subscribe") or lowered.get("topic") or ""
        self.topics = sorted({t.strip() for t in topics.split(",") if t.strip()})
        if not self.topics:
            raise _bad("subscribe", "is required (comma-separated topics)")
        self.starting = self._starting(lowered.get("startingoffsets", "earliest"))
        self.max_per_trigger = self._positive(
            lowered, "maxoffsetspertrigger", "maxOffsetsPerTrigger", None
        )
        self.max_per_task = self._positive(
            lowered, "maxrecordsperpartition", "maxRecordsPerPartition", 100_000
        )
        self.headers = self._boolean(lowered, "includeheaders", "includeHeaders", False)
        self.fail_on_data_loss = self._boolean(lowered, "failondataloss", "failOnDataLoss", True)
        self.gated = self._boolean(lowered, "gate.enabled", "gate.enabled", True)
        self.gate_name = lowered.get("gate.name", "")
        self.redis_url = lowered.get("gate.redis.url")
        self.redis_prefix = lowered.get("gate.redis.prefix", "gate")
        self.http_url = lowered.get("gate.http.url")
        self.http_token = lowered.get("gate.http.token")
        self.depends_on = [
            g.strip() for g in lowered.get("gate.dependson", "").split(",") if g.strip()
        ]
        self.poll_interval = (
            self._positive(lowered, "gate.pollintervalms", "gate.pollIntervalMs", 200) / 1000
        )
        if self.gated:
            if not self.gate_name:
                raise _bad("gate.name", "is required (or set gate.enabled to false)")
            if not (self.redis_url or self.http_url or self.depends_on):
                raise _bad("gate.redis.url", "or gate.http.url or gate.dependsOn is required")

    def _starting(self, value: str) -> str | dict[str, dict[str, int]]:
        value = value.strip()
        if value.lower() in ("earliest", "latest"):
            return value.lower()
        try:
            parsed = json.loads(value)
            if not isinstance(parsed, dict):
                raise ValueError
            return {
                t: {str(int(p)): int(o) for p, o in parts.items()} for t, parts in parsed.items()
            }
        except (ValueError, TypeError, AttributeError):
            raise _bad(
                "startingOffsets", 'must be earliest, latest or JSON like {"t": {"0": 5}}'
            ) from None

    @staticmethod
    def _positive(options: Mapping[str, str], key: str, name: str, default: int | None) -> Any:
        if key not in options:
            return default
        try:
            value = int(options[key])
        except ValueError:
            raise _bad(name, f"must be a positive integer (got {options[key]!r})") from None
        if value < 1:
            raise _bad(name, f"must be a positive integer (got {value})")
        return value

    @staticmethod
    def _boolean(options: Mapping[str, str], key: str, name: str, default: bool) -> bool:
        value = options.get(key)
        if value is None:
            return default
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise _bad(name, f"must be true or false (got {value!r})")

    def client_config(self) -> dict[str, str]:
        """For the driver's admin client and the gate: without consumer-only properties."""
        return {k: v for k, v in self.kafka.items() if k not in CONSUMER_ONLY}

    def consumer_config(self) -> dict[str, str]:
        """For the executors' consumers: every ``kafka.*`` property, and what reading needs."""
        return {
            "group.id": f"{NAME}-reader",  # never joined, never committed: offsets are Spark's
            **self.kafka,
            "enable.auto.commit": "false",
            # A range Kafka no longer holds is an error, never a jump to the end.
            "auto.offset.reset": "error",
        }

    def check_consumer_config(self) -> None:
        """Fails when the query starts if librdkafka rejects the readers' configuration."""
        try:
            consumer = Consumer({**self.consumer_config(), "logger": LOG})
        except (KafkaException, TypeError, ValueError) as exc:
            reason = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
            raise SourceOptionError(f"{NAME}: invalid kafka.* options: {reason}") from None
        consumer.close()


class OffsetRange(InputPartition):
    """One Spark task: records [start, end) of one Kafka partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class GatedKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver (offsets, gating) and reads ranges on executors."""

    def __init__(self, options: Mapping[str, str], headers: bool) -> None:
        self.settings = _Settings(options)  # fails when the query starts, naming the option
        self.settings.check_consumer_config()
        self.headers = headers
        self._admin: AdminClient | None = None
        self._gate: Any = None
        self._target: Offsets | None = None
        self.lost_records = 0  # skipped because Kafka no longer had them (failOnDataLoss=false)
        self._losses: set[tuple[str, str, int]] = set()  # reported already

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
        return _sorted(start)

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

    def _available(self, start: Offsets) -> Offsets:
        """Per partition, how far a batch may go now: min(end, watermark)."""
        counts = self._partitions()
        low, high = self._bounds(counts)
        self._check_data_loss(start, low)
        snapshot = self._watermarks() if self.settings.gated else None
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
            end = _cap(start, end, maximum)
        return _sorted(_not_below(start, end))

    def getDefaultReadLimit(self) -> ReadLimit:
        maximum = self.settings.max_per_trigger
        return ReadAllAvailable() if maximum is None else ReadMaxRows(maximum)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._available(self.initialOffset())

    def reportLatestOffset(self) -> Offsets | None:
        return None

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        ranges: list[InputPartition] = []
        step = self.settings.max_per_task
        for topic, partitions in sorted(end.items()):
            for partition, stop in sorted(partitions.items(), key=lambda item: int(item[0])):
                begin = start.get(topic, {}).get(partition, stop)
                for first in range(begin, stop, step):
                    ranges.append(
                        OffsetRange(topic, int(partition), first, min(stop, first + step))
                    )
        return ranges

    def commit(self, end: Offsets) -> None:
        """Spark calls this a batch late; the job's Kafka commits come from ProgressCommitter."""

    def stop(self) -> None:
        if self._gate is not None:
            self._gate.stop()

    # ---- reading (executors) -----------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        consumer = Consumer({**self.settings.consumer_config(), "logger": LOG})
        try:
            task = self._readable(consumer, partition)
            if task.start < task.end:
                consumer.assign([TopicPartition(task.topic, task.partition, task.start)])
                for messages in self._chunks(consumer, task):
                    yield _record_batch(messages, task, self.headers)
        finally:
            consumer.close()

    def _readable(self, consumer: Consumer, task: OffsetRange) -> OffsetRange:
        """The part of ``task`` Kafka still holds (failOnDataLoss=false), or the range."""
        low, _ = consumer.get_watermark_offsets(
            TopicPartition(task.topic, task.partition), timeout=10, cached=False
        )
        if task.start >= low:
            return task
        missing = data_loss(task.topic, task.partition, task.start, min(low, task.end))
        if self.settings.fail_on_data_loss:
            raise RuntimeError(missing)
        log.warning("%s; skipping them (failOnDataLoss is false)", missing)
        return OffsetRange(task.topic, task.partition, min(low, task.end), task.end)

    def _chunks(self, consumer: Consumer, task: OffsetRange) -> Iterator[list[Message]]:
        """The range's records, in the chunks the consumer hands them over. Offsets are not
        contiguous (transaction markers, aborted records, compaction): the range is done when
        the consumer's position reaches its end, whatever record it handed over last."""
        tp = TopicPartition(task.topic, task.partition)
        position = task.start
        moved = time.monotonic()
        while position < task.end:
            # A batch consume waits for as many records as it asks for, or for the timeout:
            # never ask for more than the range's offsets, and do not wait long for a range
            # holding fewer records than offsets.
            messages = consumer.consume(min(10_000, task.end - position), 0.1)
            chunk: list[Message] = []
            beyond = False
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    if error.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise RuntimeError(
                            data_loss(task.topic, task.partition, position, task.end)
                            + f" ({error.str()})"
                        )
                    raise RuntimeError(
                        f"{NAME}: reading {task.topic}[{task.partition}]: {error.str()}"
                    )
                if message.offset() >= task.end:  # never beyond the planned end: the watermark
                    beyond = True
                    break
                chunk.append(message)
            if chunk:
                yield chunk
            # The position passes the records handed over and the markers and aborted records
            # the consumer skipped.
            reached = consumer.position([tp])[0].offset
            if chunk:
                reached = max(reached, chunk[-1].offset() + 1)
            if beyond:
                reached = task.end
            if reached > position:
                position, moved = reached, time.monotonic()
            elif time.monotonic() - moved > STALL_SECONDS:
                raise RuntimeError(
                    f"{NAME}: {task.topic}[{task.partition}]: the reader stayed at offset "
                    f"{position} for {STALL_SECONDS:.0f}s, below the planned end {task.end}; "
                    f"at isolation.level {self.settings.kafka['isolation.level']} the offsets "
                    "from there are not readable (a transaction still open?)"
                )


def _record_batch(messages: list[Message], task: OffsetRange, headers: bool) -> pa.RecordBatch:
    """One Arrow record batch in the source's schema (Spark takes it without per-row work)."""
    stamps = [message.timestamp() for message in messages]
    columns = [
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.array([task.topic] * len(messages), pa.string()),
        pa.array([task.partition] * len(messages), pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64()),
        pa.array([stamp * 1000 if kind else None for kind, stamp in stamps], _TIMESTAMP),
        # The JVM source's codes: 0 CreateTime, 1 LogAppendTime (librdkafka counts from 1).
        pa.array([kind - 1 if kind else -1 for kind, _ in stamps], pa.int32()),
    ]
    if headers:
        columns.append(pa.array([m.headers() or [] for m in messages], _HEADERS))
    return pa.RecordBatch.from_arrays(columns, schema=_ARROW_HEADERS if headers else _ARROW)


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


def data_loss(topic: str, partition: int, first: int, end: int) -> str:
    return (
        f"{NAME}: {topic}[{partition}]: offsets {first} to {end - 1} are no longer in Kafka "
        "(removed by retention or deletion) and cannot be read; set the option "
        "failOnDataLoss to false to skip them"
    )


def _not_below(start: Offsets, end: Offsets) -> Offsets:
    """A plan never ends below its start (a dependency may have rewound below it)."""
    return {
        topic: {p: max(o, start.get(topic, {}).get(p, o)) for p, o in parts.items()}
        for topic, parts in end.items()
    }


def _sorted(offsets: Offsets) -> Offsets:
    return {t: {p: offsets[t][p] for p in sorted(offsets[t], key=int)} for t in sorted(offsets)}


def _cap(start: Offsets, end: Offsets, maximum: int) -> Offsets:
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
        share = (count * maximum) // total if count > 0 else 0
        capped.setdefault(topic, {})[partition] = begin + share
        given += share
    # Hand out what rounding left, one record at a time, in a fixed order.
    for (topic, partition), count in sorted(available.items()):
        if given >= maximum:
            break
        begin = start.get(topic, {}).get(partition, end[topic][partition])
        if capped[topic][partition] < begin + count:
            capped[topic][partition] += 1
            given += 1
    return capped


class ProgressCommitter(StreamingQueryListener):
    """Commits each micro-batch's end offsets to a Kafka consumer group once Spark has made it
    durable (``onQueryProgress`` fires after the commit log is written), so gates and services
    can depend on the Spark job. ``query_name`` limits it to one query."""

    def __init__(self, kafka: Mapping[str, Any], group: str, query_name: str | None = None) -> None:
        # Values are passed as they are: callables such as ``error_cb`` or ``oauth_cb`` too.
        self.kafka = {k: v for k, v in kafka.items() if k not in CONSUMER_ONLY}
        self.group = group
        self.query_name = query_name
        self.committed: dict[tuple[str, int], int] = {}
        self._consumer: Consumer | None = self._open()  # a bad configuration fails here

    def _open(self) -> Consumer:
        try:
            return Consumer(
                {**self.kafka, "group.id": self.group, "enable.auto.commit": False, "logger": LOG}
            )
        except (KafkaException, TypeError, ValueError) as exc:
            raise ValueError(f"ProgressCommitter: invalid Kafka configuration: {exc}") from None

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self.close()

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if self.query_name is not None and progress.name != self.query_name:
            return
        for source in progress.sources:
            if not source.endOffset:
                continue
            try:
                offsets = json.loads(source.endOffset)
            except (TypeError, ValueError):
                continue
            if isinstance(offsets, dict):
                self.commit(offsets)

    def commit(self, offsets: Mapping[str, Mapping[str, int]]) -> None:
        changed = [
            TopicPartition(topic, int(partition), int(offset))
            for topic, partitions in offsets.items()
            if isinstance(partitions, Mapping)
            for partition, offset in partitions.items()
            if self.committed.get((topic, int(partition))) != int(offset)
        ]
        if not changed:
            return
        if self._consumer is None:
            self._consumer = self._open()
        try:
            self._consumer.commit(offsets=changed, asynchronous=False)
        except KafkaException as exc:
            log.warning(
                "committing the Spark job's progress to %s failed (next batch retries): %s",
                self.group,
                exc,
            )
            return
        for tp in changed:
            self.committed[(tp.topic, tp.partition)] = tp.offset

    def close(self) -> None:
        """Closes the committing consumer (a later batch opens a new one)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()


def local_session(app_name: str = NAME, cores: int = 2) -> Any:
    """A SparkSession in local mode with the gated source registered, for examples, tests and
    trying things out. Executors run this Python interpreter, and the driver's JVM gets the
    stack Spark's stop handling needs (a query stopped mid-batch otherwise prints a
    ``StackOverflowError``). Set these options yourself for a cluster."""
    import os
    import sys

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = (
        SparkConf()
        .setMaster(f"local[{cores}]")
        .setAppName(app_name)
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.sql.shuffle.partitions", str(cores))
        .set("spark.driver.extraJavaOptions", "-Xss32m")
    )
    if SparkContext._gateway is None:
        # The JVM (and the Python workers it starts) in a session of its own: Ctrl-C in a
        # terminal, or SIGTERM to the process group, reaches this Python process only, which
        # stops the queries and the session itself; the JVM ends when this process does.
        gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True})
        SparkContext(conf=conf, gateway=gateway)
    session = SparkSession.builder.config(conf=conf).getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    session.dataSource.register(GatedKafkaSource)
    return session


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
