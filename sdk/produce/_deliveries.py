"""What a work item's outputs wait for: their acknowledgement, and the transaction lock.

The producer of outputs reports failed deliveries only (``delivery.report.only.error``), in
both commit modes: every output of one work item is produced with the same delivery callback,
the bound :meth:`Deliveries.delivered` of the item's :class:`Deliveries`, made once per item,
which runs only for an output whose delivery failed. Nothing is made per output or per record
but one entry in :attr:`Deliveries.sent` (the index of the record or batch call, what the
handler was given, and its outputs), so that a failed delivery can be traced back to its
input.

- **At least once** (``CommitMode.CONSUMER``): the consumer's thread keeps the results of an
  item whose records produced outputs aside (:class:`Awaiting`) until the producer holds no
  output that is neither acknowledged nor reported failed
  (:meth:`~sdk.produce._producer.Outputs.acknowledged`): every item kept aside then settles
  at once, each with the failures its callback noted. Outputs are acknowledged together
  rather than report by report (a report costs the interpreter's lock and a message object
  in confluent-kafka): when items have waited a while (or a revocation waits for them), a
  :class:`Pause` has workers wait before their next record, so the producer's queue
  empties.
- **Exactly once** (``CommitMode.TRANSACTIONAL``): a failed delivery breaks the open
  transaction and blames the inputs it came from
  (:meth:`~sdk.produce._output.Outputs.break_transaction`). The reports are served when
  the transaction closes, so whatever an item notes for them lives as long as the
  transaction: nothing is noted while transactions commit (the first failed delivery breaks
  its transaction untraced), and from then until a transaction commits again each record
  notes its inputs' sources and its outputs' topic, key and value
  (:attr:`~sdk.produce._output.Outputs.tracing`).

A failed delivery report holds the output that failed (its topic, key and value), not the
input: it is traced back by comparing it with the outputs of the item's records. When
several records of the item produced the very same output (topic, key and value), each of
them counts as failed (at least once: they run again, their outputs may be written twice;
exactly once: each is blamed for the transaction); when none matches (it cannot, but a
producer might report an output altered), every record of the item with outputs does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sdk.engine._shards import Entry

if TYPE_CHECKING:
    from confluent_kafka import KafkaError

Source = tuple[str, int, int]
"""An input: topic, partition, offset."""


class Reported(Protocol):
    """Where an item's failed deliveries go: the engine's producer of outputs
    (:class:`~sdk.produce._output.Outputs`)."""

    transactional: bool
    tracing: bool  # exactly once: records note where their outputs come from

    def break_transaction(self, sources: list[Source], why: str) -> None: ...


class Deliveries:
    """The failed deliveries of one work item's outputs (see the module's docstring).

    Workers append to :attr:`sent` before producing an output; the failure reports are
    served by one thread at a time, and noted in :attr:`errors` by record (or call)."""

    __slots__ = ("_calls", "_outputs", "errors", "sent")

    def __init__(self, outputs: Reported) -> None:
        self._outputs = outputs
        # Each record's (or call's) index, what it was given and its outputs, appended by the
        # worker before they are produced. At least once: its entry (or the records of a
        # batch) and its ``Output``s (a lone ``Output`` stands for itself, not wrapped in a
        # sequence), kept until the item settles.
        # Exactly once, where the reports are served when the transaction closes: only the
        # inputs' sources and the outputs' topic, key and value, in plain tuples (which the
        # garbage collector stops tracking), so that a transaction's worth of them costs it
        # nothing.
        self.sent: list[tuple[int, Any, Any]] = []
        self.errors: dict[int, str] = {}  # failed deliveries, by record (or call) index
        self._calls = 0

    def new_call(self) -> int:
        """A fresh index for one batch handler call's outputs (counted apart from records)."""
        self._calls -= 1
        return self._calls

    def delivered(self, error: KafkaError | None, message: Any) -> None:
        """The delivery callback of every output of the item (called for failures only)."""
        if error is not None:
            self._failed(error.str(), message)

    @property
    def awaited(self) -> bool:
        """At least once: some records have outputs, so the item waits for them to be
        acknowledged."""
        return bool(self.sent) and not self._outputs.transactional

    def given(self) -> dict[int, Any]:
        """What the handler was given, by the index of each record (or call) with outputs."""
        return {index: given for index, given, _ in self.sent}

    def _failed(self, why: str, message: Any) -> None:
        culprits = self.culprits(message)
        outputs = self._outputs
        if outputs.transactional:
            sources = [source for _, given in culprits for source in sources_of(given)]
            if not self.sent:  # untraced: the next transactions note where outputs come from
                outputs.tracing = True
            outputs.break_transaction(sources, f"an output's delivery failed: {why}")
            return
        for index, _ in culprits:
            self.errors.setdefault(index, why)

    def culprits(self, message: Any) -> list[tuple[int, Any]]:
        """The records (or calls) whose outputs match a delivery report's message: its
        topic, key and value (see the module's docstring)."""
        try:
            topic, key, value = message.topic(), message.key(), message.value()
        except Exception:  # (a message that cannot say what it was: every record)
            return [(index, given) for index, given, _ in self.sent]
        found = [
            (index, given)
            for index, given, outputs in self.sent
            if any(
                fields[0] == topic and _raw(fields[1]) == key and _raw(fields[2]) == value
                for fields in map(_fields, _each(outputs))
            )
        ]
        return found or [(index, given) for index, given, _ in self.sent]


def _raw(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def sources_of(given: Any) -> tuple[Source, ...]:
    """The inputs of what a handler was given: a record (or its entry), or a batch's list of
    records (their sources already, as a tuple, are returned as they are)."""
    if isinstance(given, tuple):
        return given
    if isinstance(given, list):
        return tuple((record.topic, record.partition, record.offset) for record in given)
    if isinstance(given, Entry):
        topic, partition = given.tp
        return ((topic, partition, given.offset),)
    return ((given.topic, given.partition, given.offset),)


def _each(outputs: Any) -> Sequence[Any]:
    """The outputs noted for a record (or call): a sequence of them, or a lone ``Output``
    (a tuple whose first field is its topic) standing for itself."""
    return (outputs,) if outputs and isinstance(outputs[0], str) else outputs


def _fields(output: Any) -> tuple[Any, Any, Any]:
    """Topic, key and value of an ``Output`` (or of those fields kept alone)."""
    return (output[0], output[2], output[1]) if len(output) == 5 else output


class Awaiting(list[Any]):
    """An item's results whose records with outputs count as done only once their outputs
    are acknowledged: the consumer's thread keeps them aside until every output produced so
    far is, then :meth:`settle` applies the failures (no worker waits for them)."""

    def __init__(
        self,
        results: list[Any],
        deliveries: Deliveries,
        settle: Callable[[list[Any], dict[int, str]], None],
    ) -> None:
        super().__init__(results)
        self.deliveries = deliveries
        self._settle = settle

    def settle(self) -> list[Any]:
        results = list(self)
        errors = self.deliveries.errors
        if errors:
            self._settle(results, errors)
        return results


class Pause:
    """At least once: while :attr:`closing` is set, workers start no further record (each
    waits before its next one, in :meth:`wait`), so that the producer's queue empties and the
    outputs waiting are acknowledged together. Read by workers before each record without a
    lock, as :attr:`TransactionLock.closing` is exactly once; a worker never waits longer
    than ``WAIT_AT_MOST`` (should the consumer's thread not end the pause, it goes on)."""

    WAIT_AT_MOST = 1.0

    __slots__ = ("_opened", "closing")

    def __init__(self) -> None:
        self._opened = threading.Event()
        self._opened.set()
        self.closing = False

    def close(self) -> None:
        self._opened.clear()
        self.closing = True

    def open(self) -> None:
        self.closing = False
        self._opened.set()

    def wait(self) -> None:
        self._opened.wait(self.WAIT_AT_MOST)


class TransactionLock:
    """Workers hold it (shared) while an item runs; the consumer's thread closes a
    transaction only when no worker holds it. Once a close is requested, workers wait before
    starting an item (so a close waits at most for the items already running).

    :attr:`closing` is a plain attribute, read by workers before each record without taking
    the lock: a running item starts no further record once it is set (they go back
    unstarted, in order), so the close waits for at most one record per worker."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._holders = 0
        self.closing = False

    def enter(self) -> None:
        with self._condition:
            while self.closing:
                self._condition.wait()
            self._holders += 1

    def try_enter(self) -> bool:
        with self._condition:
            if self.closing:
                return False
            self._holders += 1
            return True

    def leave(self) -> None:
        with self._condition:
            self._holders -= 1
            if self._holders == 0:
                self._condition.notify_all()

    def close(self) -> bool:
        """Ask workers to wait; True when none holds it (the transaction may close now)."""
        with self._condition:
            self.closing = True
            return self._holders == 0

    def wait_closed(self, timeout: float) -> bool:
        with self._condition:
            self.closing = True
            return self._condition.wait_for(lambda: self._holders == 0, timeout)

    def reopen(self) -> None:
        with self._condition:
            self.closing = False
            self._condition.notify_all()

    @property
    def holders(self) -> int:
        return self._holders
