"""The dead-letter topic: copies of given-up records, and when their originals count as done.

A record sent here counts as done only once the broker acknowledged its copy; a failed write
is retried every second for as long as it takes (the commit waits meanwhile). Everything
runs on the consumer's thread: delivery reports arrive in :meth:`DeadLetters.poll`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from sdk._core import Entry, WorkCore
from sdk._output import Outputs

log = logging.getLogger("sdk")

HEADERS = (
    "dlt.original.topic",
    "dlt.original.partition",
    "dlt.original.offset",
    "dlt.error",
    "dlt.attempts",
)
RETRY_AFTER = 1.0


class DeadLetters:
    def __init__(
        self,
        topic: str,
        core: WorkCore,
        new_producer: Callable[[], Producer],
        clock: Callable[[], float] = time.time,
        transaction: Outputs | None = None,
    ) -> None:
        self.topic = topic
        self.transaction = transaction  # copies go into the open transaction
        self.core = core
        self._new_producer = new_producer
        self._clock = clock
        self._producer: Producer | None = None
        self._retry: list[tuple[float, Entry]] = []

    def send(self, entry: Entry) -> None:
        """Write a copy of the record with the ``dlt.*`` headers (opens the producer lazily)."""
        transaction = self.transaction
        if transaction is not None:
            self._producer = transaction.producer  # (replaced after a fatal error)
        elif self._producer is None:
            self._producer = self._new_producer()
        message: Message = entry.payload
        error = entry.last_error
        topic, partition = entry.tp
        headers = list(message.headers() or [])
        headers += [
            ("dlt.original.topic", topic.encode()),
            ("dlt.original.partition", str(partition).encode()),
            ("dlt.original.offset", str(entry.offset).encode()),
            ("dlt.error", (error or "").encode(errors="replace")[:4000]),
            ("dlt.attempts", str(entry.attempts).encode()),
        ]

        def delivered(err: KafkaError | None, _: Any) -> None:
            if self.transaction is not None:
                if err is not None:
                    self.transaction.broken = f"a dead-letter copy failed: {err.str()}"
            elif err is None:
                self.core.dead_lettered(entry, self._clock())
            else:
                self._failed(entry, err.str())

        try:
            self._producer.produce(
                self.topic,
                value=message.value(),
                key=message.key(),
                headers=headers,
                on_delivery=delivered,
            )
        except (BufferError, KafkaException) as exc:
            self._failed(entry, str(exc))
            return
        if self.transaction is not None:
            # In the open transaction: it counts as done now, its offset and the copy commit
            # together (a failed delivery aborts the transaction).
            self.transaction.in_transaction += 1
            self.core.dead_lettered(entry, self._clock())

    def _failed(self, entry: Entry, why: str) -> None:
        log.warning("dead-letter write of %s failed, will retry: %s", repr(entry), why)
        self._retry.append((self._clock() + RETRY_AFTER, entry))

    def poll(self) -> None:
        """Serve delivery reports and resend failed copies that are due."""
        if self._producer is not None and self.transaction is None:
            self._producer.poll(0)
        if not self._retry:
            return
        now = self._clock()
        due = [entry for at, entry in self._retry if at <= now]
        self._retry = [(at, entry) for at, entry in self._retry if at > now]
        for entry in due:
            if entry in self.core.dead_letter_pending:  # else its partition is gone
                self.send(entry)

    def close(self, timeout: float = 5.0) -> None:
        if self._producer is None or self.transaction is not None:
            return
        remaining = self._producer.flush(timeout)
        if remaining:
            log.warning("%d dead-letter records were not acknowledged before closing", remaining)
