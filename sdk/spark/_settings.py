"""The gated Kafka source's options: parsed and validated when a query starts."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaException

from gate import KafkaLog
from sdk.engine._options import CONSUMER_ONLY

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


Offsets = dict[str, dict[str, int]]
# Options of Spark's JVM Kafka source the gated source does not have; a clear error, not ignored.
UNSUPPORTED = {
    "endingtimestamp": ("endingTimestamp", "is not supported: use endingOffsets"),
    "endingoffsetsbytimestamp": ("endingOffsetsByTimestamp", "is not supported: use endingOffsets"),
    "minoffsetspertrigger": (
        "minOffsetsPerTrigger",
        "is not supported: a batch holds what the gate released (see maxOffsetsPerTrigger)",
    ),
    "maxtriggerdelay": ("maxTriggerDelay", "is not supported (it goes with minOffsetsPerTrigger)"),
}


class SourceOptionError(ValueError):
    """An option of the gated Kafka source is missing or invalid; the message names it."""


def _bad(option: str, message: str) -> SourceOptionError:
    return SourceOptionError(f"{NAME}: option '{option}' {message}")


class Settings:
    """The source's options, parsed and validated when the query starts."""

    def __init__(self, options: Mapping[str, str], batch: bool = False) -> None:
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
        for key, (name, message) in UNSUPPORTED.items():
            if key in lowered:
                raise _bad(name, message)
        self.topics, self.pattern, self.assign = subscription(lowered)
        self.starting = starting_offsets(lowered.get("startingoffsets", "earliest"), batch)
        self.starting_timestamp: int | None = None
        if "startingtimestamp" in lowered:
            self.starting_timestamp = timestamp(lowered["startingtimestamp"], "startingTimestamp")
        self.starting_by_timestamp: Offsets | None = None
        if "startingoffsetsbytimestamp" in lowered:
            self.starting_by_timestamp = offsets_json(
                lowered["startingoffsetsbytimestamp"],
                "startingOffsetsByTimestamp",
                '{"t": {"0": 1700000000000}} (milliseconds since the epoch)',
                minimum=0,
            )
        strategy = lowered.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise _bad(
                "startingOffsetsByTimestampStrategy", f"must be error or latest (got {strategy!r})"
            )
        self.timestamp_strategy = strategy
        self.ending: str | Offsets = "latest"
        if "endingoffsets" in lowered:
            if not batch:
                raise _bad(
                    "endingOffsets",
                    "is for batch reads only (spark.read), as in Spark's Kafka source",
                )
            self.ending = ending_offsets(lowered["endingoffsets"])
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


def subscription(
    options: Mapping[str, str],
) -> tuple[list[str], re.Pattern[str] | None, dict[str, list[int]] | None]:
    """Exactly one of ``subscribe`` (or ``topic``), ``subscribePattern`` and ``assign``: the
    topics, the pattern, or the partitions per topic (the other two empty)."""
    given = [name for key, name in SUBSCRIPTIONS.items() if key in options]
    if len(given) != 1:
        names = ", ".join(SUBSCRIPTIONS.values())
        found = f"got {' and '.join(given)}" if given else "got none"
        raise SourceOptionError(f"{NAME}: exactly one of the options {names} is required ({found})")
    if given[0] == "subscribePattern":
        value = options["subscribepattern"]
        if not value.strip():
            raise _bad("subscribePattern", "must be a regular expression over topic names")
        try:
            return [], re.compile(value.strip()), None
        except re.error as exc:
            raise _bad("subscribePattern", f"is not a valid regular expression ({exc})") from None
    if given[0] == "assign":
        return [], None, assignment(options["assign"])
    value = options.get("subscribe") or options.get("topic") or ""
    topics = sorted({t.strip() for t in value.split(",") if t.strip()})
    if not topics:
        raise _bad(given[0], "is required (comma-separated topics)")
    return topics, None, None


SUBSCRIPTIONS = {
    "subscribe": "subscribe",
    "topic": "topic",
    "subscribepattern": "subscribePattern",
    "assign": "assign",
}


def assignment(value: str) -> dict[str, list[int]]:
    """``assign``: JSON such as ``{"payments": [0, 1]}``."""
    usage = 'must be JSON like {"payments": [0, 1]} (topics and their partitions)'
    try:
        parsed = json.loads(value)
    except ValueError:
        raise _bad("assign", usage) from None
    if not isinstance(parsed, dict) or not parsed:
        raise _bad("assign", usage)
    found: dict[str, list[int]] = {}
    for topic, partitions in parsed.items():
        if (
            not topic
            or not isinstance(partitions, list)
            or not partitions
            or not all(type(p) is int and p >= 0 for p in partitions)
        ):
            raise _bad("assign", f"{usage}; got {topic!r}: {partitions!r}")
        found[topic] = sorted(set(partitions))
    return dict(sorted(found.items()))


def offsets_json(value: str, option: str, example: str, minimum: int) -> Offsets:
    """JSON ``{"topic": {"partition": number}}`` with numbers at least ``minimum``."""
    usage = f"must be JSON like {example}"
    try:
        parsed = json.loads(value)
    except ValueError:
        raise _bad(option, usage) from None
    if not isinstance(parsed, dict):
        raise _bad(option, usage)
    found: Offsets = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise _bad(option, f"{usage}; got {topic!r}: {partitions!r}")
        for partition, number in partitions.items():
            if not _partition_number(partition) or type(number) is not int or number < minimum:
                raise _bad(option, f"{usage}; got {topic!r}: {{{partition!r}: {number!r}}}")
            found.setdefault(topic, {})[str(int(partition))] = number
    return found


def _partition_number(partition: str) -> bool:
    return partition.strip().isdigit()


def starting_offsets(value: str, batch: bool) -> str | Offsets:
    """``startingOffsets``: earliest, latest (streams only) or JSON (-2 earliest, -1 latest)."""
    word = value.strip().lower()
    if word == "earliest" or (word == "latest" and not batch):
        return word
    if word == "latest":
        raise _bad("startingOffsets", "cannot be latest for a batch read (a read of nothing)")
    example = '{"t": {"0": 5, "1": -2}} (-2 earliest' + (")" if batch else ", -1 latest)")
    offsets = offsets_json(value, "startingOffsets", example, minimum=EARLIEST)
    if batch and any(o == LATEST for parts in offsets.values() for o in parts.values()):
        raise _bad("startingOffsets", "cannot use -1 (latest) for a batch read")
    return offsets


def ending_offsets(value: str) -> str | Offsets:
    """``endingOffsets`` of a batch read: latest, or JSON in which -1 means latest."""
    word = value.strip().lower()
    if word == "latest":
        return word
    if word == "earliest":
        raise _bad("endingOffsets", "cannot be earliest (a read of nothing)")
    return offsets_json(value, "endingOffsets", '{"t": {"0": 50, "1": -1}} (-1 latest)', LATEST)


def timestamp(value: str, option: str) -> int:
    """A timestamp in milliseconds since the epoch."""
    try:
        number = int(value.strip())
    except ValueError:
        number = -1
    if number < 0:
        raise _bad(option, f"must be a timestamp in milliseconds since the epoch (got {value!r})")
    return number
