"""The Spark job's own progress, committed to a Kafka consumer group others can depend on."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from pyspark.sql.streaming import StreamingQueryListener

from sdk.engine._options import CONSUMER_ONLY
from sdk.spark._settings import LOG

log = logging.getLogger("sdk.spark")


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
