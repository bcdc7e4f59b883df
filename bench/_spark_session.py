"""The Spark side of the Spark source benchmark: a session per master with both sources
registered, and the ceiling, a Python source yielding prebuilt Arrow batches with no Kafka
(what Spark can take from a Python source; see ``bench.spark_bench``)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from bench._topics import VALUE

PARTITIONS = 4
ROOT = Path(__file__).resolve().parent.parent


class PrebuiltStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``records`` rows in ``PARTITIONS`` tasks a batch, each yielding one prebuilt batch
    repeatedly; at most ``most`` rows a batch when given (maxOffsetsPerTrigger)."""

    def __init__(self, records: int, most: int | None = None) -> None:
        self.records = records
        self.most = most

    def initialOffset(self) -> dict[str, int]:
        return {"rows": 0}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        if isinstance(limit, ReadMaxRows):
            return {"rows": min(self.records, start["rows"] + limit.max_rows)}
        return {"rows": self.records}

    def getDefaultReadLimit(self) -> Any:
        return ReadAllAvailable() if self.most is None else ReadMaxRows(self.most)

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        count = end["rows"] - start["rows"]
        return [
            InputPartition(count // PARTITIONS + (1 if i < count % PARTITIONS else 0))
            for i in range(PARTITIONS)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from sdk.spark._read import _ARROW

        size = 10_000
        batch = pa.RecordBatch.from_arrays(
            [
                pa.nulls(size, pa.binary()),
                pa.array([VALUE] * size, pa.binary()),
                pa.repeat(pa.scalar("t"), size),
                pa.repeat(pa.scalar(0, pa.int32()), size),
                pa.array(range(size), pa.int64()),
                pa.array([time.time_ns() // 1000] * size, pa.int64()).cast(_ARROW.field(5).type),
                pa.repeat(pa.scalar(0, pa.int32()), size),
            ],
            schema=_ARROW,
        )
        left = partition.value
        while left > 0:
            yield batch if left >= size else batch.slice(0, left)
            left -= size

    def commit(self, end: dict[str, int]) -> None:
        pass


class PrebuiltSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "prebuilt-arrow"

    def schema(self) -> str:
        from sdk.spark._source import SCHEMA

        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        most = self.options.get("maxOffsetsPerTrigger")
        return PrebuiltStreamReader(
            int(self.options["records"]), None if most is None else int(most)
        )


def session(master: str) -> Any:
    """A SparkSession on ``master`` with both sources registered; executors run this
    interpreter with this checkout importable."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    from sdk.spark import GatedKafkaSource

    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = path
    conf = (
        SparkConf()
        .setMaster(master)
        .setAppName("gated-kafka-read-bench")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.pyspark.python", sys.executable)
        .set("spark.executorEnv.PYTHONPATH", path)
        .set("spark.driver.extraJavaOptions", "-Xss32m")
        # On a loaded machine a new Python worker may take longer than the default 15 s.
        .set("spark.python.authenticate.socketTimeout", "120s")
    )
    for name in ("KAFKA_GATE_PURE_CORE",):
        if name in os.environ:
            conf = conf.set(f"spark.executorEnv.{name}", os.environ[name])
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(GatedKafkaSource)
    spark.dataSource.register(PrebuiltSource)
    return spark
