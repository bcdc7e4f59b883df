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

Options (those of Spark's JVM Kafka source where they fit; docs/spark.md compares them all):

=====================================  =====================================================
``subscribe`` (or ``topic``)           topics, comma-separated; exactly one of ``subscribe``,
                                       ``subscribePattern`` and ``assign``
``subscribePattern``                   a regular expression over topic names, matched
                                       against the topics listed (at most every 5 s) when a
                                       batch is planned (new topics join at earliest)
``assign``                             JSON such as ``{"payments": [0, 2]}``
``kafka.<property>``                   any librdkafka property (``kafka.bootstrap.servers``
                                       required), consumer properties included: the
                                       executors' consumers get them all (the driver's admin
                                       client the ones it understands)
``kafka.isolation.level``              ``read_committed`` (default) or ``read_uncommitted``:
                                       batches are planned and read at this level
``startingOffsets``                    ``earliest`` (default), ``latest`` (streams), or JSON
                                       such as ``{"payments": {"0": 23, "1": -2}}`` (-2
                                       earliest, -1 latest)
``startingTimestamp``                  start at the first record at or after this timestamp
                                       (ms), in every partition; comes first
``startingOffsetsByTimestamp``         the same per partition (JSON naming every partition)
``startingOffsetsByTimestampStrategy`` ``error`` (default) or ``latest``: a partition with no
                                       record at or after its timestamp
``endingOffsets``                      batch reads: ``latest`` (default) or JSON (-1 latest);
                                       gated, never past the watermarks
``maxOffsetsPerTrigger``               most records per micro-batch, spread over partitions
``minPartitions``                      at least this many Spark tasks per batch: the
                                       largest ranges are split
``maxRecordsPerPartition``             split larger ranges over several Spark tasks (default:
                                       a task per Kafka partition, ranges of fewer than
                                       50,000 records sharing tasks)
``includeHeaders``                     ``true`` adds the ``headers`` column (default
                                       ``false``)
``failOnDataLoss``                     ``true`` (default): a planned range that retention or
                                       deletion removed from Kafka fails the query, naming the
                                       partition and the missing offsets, and so does a
                                       checkpoint (or ``startingOffsets``) beyond the log end
                                       (topic recreated, broker data lost); ``false``: logged,
                                       counted, and reading continues from the log start (a
                                       position beyond the end: one warning, then the
                                       partition is read from its earliest offset)
``gate.name``                          the gate (required unless ``gate.enabled`` is
                                       ``false``)
``gate.redis.url``                     follow the gate service through Redis
                                       (``gate.redis.prefix``)
``gate.http.url``                      follow the gate service's HTTP API
                                       (``gate.http.token``)
``gate.dependsOn``                     poll the admin API directly for these groups
                                       (comma-separated)
``gate.pollIntervalMs``                embedded polling interval (default 200)
``gate.enabled``                       ``false`` turns gating off (reads up to the end)
=====================================  =====================================================

``spark.read.format("gated-kafka")`` reads once what the gate has released now: from
``startingOffsets`` to min(``endingOffsets``, watermark) per partition.

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

try:
    import numpy  # noqa: F401
    import pyarrow  # noqa: F401
    import pyspark.sql.datasource  # noqa: F401
except ImportError as missing:
    # One line naming the extra, not a traceback into pyspark's imports.
    module = (missing.name or "pyspark").split(".")[0]
    raise ModuleNotFoundError(
        f"sdk.spark needs {module}, which is not installed: install the 'spark' extra "
        "(pip install '.[spark]' in the kafka-gate checkout)",
        name=module,
    ) from None

from sdk.spark._batch import GatedKafkaBatchReader
from sdk.spark._commit import ProgressCommitter
from sdk.spark._plan import OffsetRange, kafka_ending_offsets
from sdk.spark._progress import source_metrics
from sdk.spark._session import local_session
from sdk.spark._settings import NAME, SourceOptionError
from sdk.spark._source import GatedKafkaSource
from sdk.spark._stream import GatedKafkaStreamReader

__all__ = [
    "NAME",
    "GatedKafkaBatchReader",
    "GatedKafkaSource",
    "GatedKafkaStreamReader",
    "OffsetRange",
    "ProgressCommitter",
    "SourceOptionError",
    "kafka_ending_offsets",
    "local_session",
    "source_metrics",
]
