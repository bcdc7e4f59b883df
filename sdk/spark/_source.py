"""The gated Kafka source: Spark's entry point (format ``gated-kafka``)."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
)

from sdk.spark._batch import GatedKafkaBatchReader
from sdk.spark._settings import NAME
from sdk.spark._stream import GatedKafkaStreamReader

SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS = "headers array<struct<key: string, value: binary>>"


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
        return GatedKafkaBatchReader(self.options, self._headers())
