"""``gate check``: a configuration checked against itself (cycles) and the live cluster."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from gate.evaluate._status import closest
from gate.poll._poller import OFFSET_INVALID, describe_kafka_error
from gate.service._config import GateConfig, GateSpec

_QUIET = logging.getLogger("gate.check.kafka")
_QUIET.propagate = False  # failures are reported as problems, not as librdkafka log lines


@dataclass(frozen=True, slots=True)
class Problem:
    severity: str  # "error" or "warning"
    where: str
    message: str

    def line(self) -> str:
        return f"{self.severity}: {self.where}: {self.message}"


def find_cycles(gates: Mapping[str, GateSpec], limit: int = 50) -> list[tuple[str, list[str]]]:
    """Dependency cycles on a shared topic, as (topic, [group, ..., group]) with the first
    group repeated at the end. Each gate is the consumer group ``spec.group or name``; a
    cycle on one topic means every member waits for another member: a deadlock."""
    cycles: list[tuple[str, list[str]]] = []
    topics = sorted({t for spec in gates.values() for t in spec.topics})
    for topic in topics:
        edges: dict[str, set[str]] = {}
        for name, spec in gates.items():
            if topic in spec.topics:
                edges.setdefault(spec.group or name, set()).update(spec.depends_on)
        for start in sorted(edges):
            # Canonical form: the smallest group of a cycle is where it is found from.
            stack: list[tuple[str, list[str]]] = [(start, [start])]
            while stack and len(cycles) < limit:
                node, path = stack.pop()
                for nxt in sorted(edges.get(node, ()), reverse=True):
                    if nxt == start:
                        cycles.append((topic, [*path, start]))
                    elif nxt > start and nxt not in path:
                        stack.append((nxt, [*path, nxt]))
    return cycles


def check_static(config: GateConfig) -> list[Problem]:
    problems = []
    for topic, path in find_cycles(config.gates):
        problems.append(
            Problem(
                "error",
                "gates",
                f"dependency cycle on topic {topic!r}: {' -> '.join(path)} "
                "(each waits for the next: nothing would ever be released)",
            )
        )
    return problems


def check_live(config: GateConfig, *, timeout: float = 5.0) -> list[Problem]:
    """Redis answers; topics exist; dependency groups have committed on the gated topics."""
    problems: list[Problem] = check_redis(config, timeout)
    try:
        admin = AdminClient(config.kafka_properties(), logger=_QUIET)
    except KafkaException as exc:
        return [*problems, Problem("error", "kafka", describe_kafka_error(exc))]
    servers = config.kafka.get("bootstrap.servers")
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        return [
            *problems,
            Problem(
                "error",
                "kafka",
                f"cannot reach bootstrap servers {servers} within {timeout:.0f}s "
                f"({describe_kafka_error(exc)})",
            ),
        ]
    counts: dict[str, int] = {}
    for name, spec in config.gates.items():
        for topic in spec.topics:
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                hint = did_you_mean(topic, [t for t in metadata.topics if not t.startswith("__")])
                problems.append(
                    Problem(
                        "error", f"gates.{name}.topics", f"topic {topic!r} does not exist{hint}"
                    )
                )
            else:
                counts[topic] = len(found.partitions)
    known_groups = _group_ids(admin, timeout)
    for name, spec in config.gates.items():
        wanted = [TopicPartition(t, p) for t in spec.topics for p in range(counts.get(t, 0))]
        if not wanted:
            continue
        for group in spec.depends_on:
            request = [ConsumerGroupTopicPartitions(group, wanted)]
            try:
                result = admin.list_consumer_group_offsets(request, request_timeout=timeout)[
                    group
                ].result(timeout=timeout + 1)
            except Exception as exc:
                problems.append(
                    Problem(
                        "error",
                        f"gates.{name}.depends_on",
                        f"cannot read offsets of group {group!r}: {describe_kafka_error(exc)}",
                    )
                )
                continue
            missing = [
                f"{tp.topic}[{tp.partition}]"
                for tp in result.topic_partitions
                if tp.error is not None or tp.offset == OFFSET_INVALID or tp.offset < 0
            ]
            if len(missing) == len(wanted):
                hint = "" if group in known_groups else did_you_mean(group, known_groups)
                problems.append(
                    Problem(
                        "warning",
                        f"gates.{name}.depends_on",
                        f"group {group!r} has not committed on {', '.join(spec.topics)} yet "
                        f"(nothing is released until it does){hint}",
                    )
                )
            elif missing:
                problems.append(
                    Problem(
                        "warning",
                        f"gates.{name}.depends_on",
                        f"group {group!r} has no committed offset on {', '.join(missing)} "
                        "(nothing is released there until it commits)",
                    )
                )
    return problems


def did_you_mean(name: str, candidates: list[str]) -> str:
    close = closest(name, candidates)
    return f"; did you mean {close!r}?" if close else ""


def _group_ids(admin: AdminClient, timeout: float) -> list[str]:
    """The cluster's consumer groups (empty when the broker cannot list them)."""
    try:
        listed = admin.list_consumer_groups(request_timeout=timeout).result(timeout + 1)
    except Exception:
        return []
    return [group.group_id for group in listed.valid]


def check_redis(config: GateConfig, timeout: float) -> list[Problem]:
    """Redis answers (when one is configured), with the configured credentials."""
    if config.redis is None:
        return []
    import redis

    settings = config.redis
    client = redis.Redis.from_url(
        settings.url.get_secret_value(),
        password=settings.password.get_secret_value() if settings.password else None,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        where = _redacted(settings.url.get_secret_value())
        return [Problem("error", "redis.url", f"cannot reach Redis at {where} ({exc})")]
    finally:
        client.close()
    return []


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"
