"""The driver's side of a read, shared by the stream and the batch reader."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from gate import Snapshot
from sdk.spark._bounds import Partitions, at_times, starting, wanted_times
from sdk.spark._plan import (
    Offsets,
    beyond_end,
    beyond_end_error,
    sorted_offsets,
)
from sdk.spark._settings import LOG, NAME, Settings

log = logging.getLogger("sdk.spark")


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
            (tp.topic, tp.partition): answered(tp, future.result(timeout=15).offset)
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
                offset = answered(tp, future.result(timeout=15).offset)
                offsets.setdefault(tp.topic, {})[str(tp.partition)] = offset
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
            from sdk.gating._gating import Gate
            from sdk.gating._sources import EmbeddedSource, HttpSource, RedisSource

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


def answered(tp: TopicPartition, offset: int) -> int:
    """An offset of a ListOffsets answer; librdkafka's "no offset" (-1001, seen while a
    broker hung) raises, since planning with it would take the log for empty or moved back
    (its partition read again from its start). A lookup by timestamp past the last record
    answers -1 (the end), which stands."""
    if offset == OFFSET_INVALID:
        raise KafkaException(
            KafkaError(
                KafkaError._NO_OFFSET,
                f"no offset for {tp.topic}[{tp.partition}] in the broker's answer",
                retriable=True,
            )
        )
    return offset
