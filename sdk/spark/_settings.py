"""The gated Kafka source's options: parsed and validated when a query starts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaException

from gate._kafkalog import KafkaLog
from sdk._options import CONSUMER_ONLY

LOG = KafkaLog("sdk.spark.kafka")
NAME = "gated-kafka"
EARLIEST, LATEST = -2, -1
ISOLATION_LEVELS = {
    "read_committed": IsolationLevel.READ_COMMITTED,
    "read_uncommitted": IsolationLevel.READ_UNCOMMITTED,
}
# Consumer properties the source sets itself, rejected as options like Spark's JVM source does.
MANAGED = {
    "auto.offset.reset": "set startingOffsets (and failOnDataLoss) instead",
    "enable.auto.commit": "the query's offsets are Spark's (ProgressCommitter commits them)",
}


class SourceOptionError(ValueError):
    """An option of the gated Kafka source is missing or invalid; the message names it."""


def _bad(option: str, message: str) -> SourceOptionError:
    return SourceOptionError(f"{NAME}: option '{option}' {message}")


class Settings:
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
        self.max_per_task: int | None = self._positive(
            lowered, "maxrecordsperpartition", "maxRecordsPerPartition", None
        )
        self.min_partitions: int | None = self._positive(
            lowered, "minpartitions", "minPartitions", None
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
