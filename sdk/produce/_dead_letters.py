"""The dead-letter topic: copies of given-up records, and when their originals count as done.

A record sent here counts as done only once the broker acknowledged its copy; a failed write
is retried every second for as long as it takes (the commit waits meanwhile). Everything
runs on the consumer's thread: delivery reports arrive in :meth:`DeadLetters.poll`.

In transactional mode the copy goes into the open transaction and counts as done at once
(it commits with its original's offset). A copy whose delivery fails breaks the transaction
(it is aborted) and counts against its original like an output that broke one; once an
original's copies broke ``limit`` transactions (the dead-letter topic missing, say), its
copy is held out of the transactions: the original is held (the commit of its partition
stays below it, every other partition commits), and its copy is tried again in a
transaction after 5 s, then at doubling intervals up to a minute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from sdk.engine._core import Entry, WorkCore
from sdk.produce._producer import Outputs

log = logging.getLogger("sdk")

HEADERS = (
    "dlt.original.topic",
    "dlt.original.partition",
    "dlt.original.offset",
    "dlt.error",
    "dlt.attempts",
)
RETRY_AFTER = 1.0
HELD_RETRY_FIRST = 5.0
"""Seconds before a held copy (transactional) is tried again in a transaction, at first."""
HELD_RETRY_MAX = 60.0


class DeadLetters:
    def __init__(
        self,
        topic: str,
        core: WorkCore,
        new_producer: Callable[[], Producer],
        clock: Callable[[], float] = time.time,
        transaction: Outputs | None = None,
        limit: int = 3,
    ) -> None:
        self.topic = topic
        self.transaction = transaction  # copies go into the open transaction
        self.limit = limit  # transactions an original's copies may break before it is held
        self._held: dict[tuple[str, int, int], tuple[float, float]] = {}  # next try, interval
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
        source = (topic, partition, entry.offset)
        if transaction is not None and not self._may_try(source, entry):
            return
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
                    self.transaction.break_transaction(
                        [source], f"a dead-letter copy failed: {err.str()}"
                    )
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

    def _may_try(self, source: tuple[str, int, int], entry: Entry) -> bool:
        """Transactional: whether the copy may go into the open transaction now. An original
        whose copies broke ``limit`` transactions is held: its copy is tried again at
        growing intervals (meanwhile it waits in the retries, and its partition's commit
        stays below it)."""
        assert self.transaction is not None
        breaks, why = self.transaction.broke(source)
        if breaks < self.limit:
            return True
        now = self._clock()
        at, interval = self._held.get(source, (0.0, 0.0))
        if not interval:
            interval = HELD_RETRY_FIRST
            at = now + interval
            log.error(  # (the record as text: a handler keeping log records keeps their args)
                "the dead-letter copy of %s broke %d transactions (%s): it is held, and its "
                "partition's commit stays below it; its copy is tried again in %.0f s",
                repr(entry),
                breaks,
                why,
                interval,
            )
        elif now >= at:
            interval = min(HELD_RETRY_MAX, interval * 2)
            self._held[source] = (now + interval, interval)
            return True
        self._held[source] = (at, interval)
        self._retry.append((at, entry))
        return False

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
