"""Records a handler hands back (:class:`Output`), and the engine's producer that writes them.

A handler returns ``None``, one ``Output`` or a list of them; workers produce them as soon as
the handler returns, in the order of their inputs (so per shard in input order, per key or
per partition), and for a batch handler in list order.

Two commit modes decide when an input with outputs counts as done:

- ``CONSUMER`` (at least once): when the broker acknowledged every one of its outputs. The
  worker waits for the acknowledgements at the end of its item; a delivery failure fails the
  input (and holds back the rest of its shard in the item), exactly like a handler failure.
- ``TRANSACTIONAL`` (exactly once): at once, because its outputs are in the open transaction,
  which commits together with the inputs' offsets (:mod:`sdk._transactions`). A worker holds
  the :class:`TransactionLock` from the start of its item until its results are in the
  consumer's inbox, so a transaction is closed only between items: every output in it
  belongs to an input whose offset goes into the same transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

log = logging.getLogger("sdk")

Headers = Mapping[str, bytes | str | None] | Sequence[tuple[str, bytes | str | None]]

_QUEUE_FULL_WAIT = 30.0
"""Seconds a worker waits for room in the producer's queue before the input fails."""


class ProduceError(Exception):
    """An output of the record could not be produced (serialisation, an unknown topic, a
    delivery report's error). It fails the input like a handler's exception."""


@dataclass(frozen=True, slots=True)
class Output:
    """A record for the engine to produce: return one (or a list) from a handler.

    ``value`` and ``key`` are bytes, str (encoded as UTF-8) or None; ``headers`` a mapping or a
    list of (name, value) pairs; ``partition`` None lets the producer's partitioner choose
    (by key)."""

    topic: str
    value: bytes | str | None
    key: bytes | str | None = None
    headers: Headers | None = None
    partition: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise TypeError(f"Output.topic must be a non-empty str (got {self.topic!r})")
        for name in ("value", "key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bytes | str):
                raise TypeError(
                    f"Output.{name} must be bytes, str or None (got {type(value).__name__}): "
                    "serialise it in the handler"
                )
        if self.partition is not None and (
            not isinstance(self.partition, int)
            or isinstance(self.partition, bool)
            or self.partition < 0
        ):
            raise TypeError(f"Output.partition must be None or an int >= 0 ({self.partition!r})")
        headers = self.headers
        if headers is not None:
            pairs = headers.items() if isinstance(headers, Mapping) else headers
            for pair in pairs:
                if (
                    not isinstance(pair, tuple)
                    or len(pair) != 2
                    or not isinstance(pair[0], str)
                    or not (pair[1] is None or isinstance(pair[1], bytes | str))
                ):
                    raise TypeError(
                        f"Output.headers: each header is (str, bytes | str | None), got {pair!r}"
                    )


def outputs_of(returned: Any) -> list[Output]:
    """The outputs in a handler's return value. Values that hold no ``Output`` at all are
    ignored (a handler written before outputs existed may return anything); a list mixing
    outputs with other values is an error."""
    if isinstance(returned, Output):
        return [returned]
    if isinstance(returned, list | tuple) and returned:
        found = [value for value in returned if isinstance(value, Output)]
        if found and len(found) != len(returned):
            odd = next(value for value in returned if not isinstance(value, Output))
            raise TypeError(
                f"the handler returned a list holding {type(odd).__name__}: return None, an "
                "Output or a list of Outputs"
            )
        return found
    return []


class Deliveries:
    """The acknowledgements one item waits for, by the index of the record they belong to
    (delivery reports arrive on the producer's polling thread)."""

    __slots__ = ("_calls", "_done", "_errors", "_lock", "_pending")

    def __init__(self) -> None:
        self._calls = 0
        self._lock = threading.Lock()
        self._pending = 0
        self._errors: dict[int, str] = {}
        self._done = threading.Event()
        self._done.set()

    def new_call(self) -> int:
        """A fresh index for one batch handler call's outputs (counted apart from records)."""
        self._calls -= 1
        return self._calls

    def expect(self, index: int) -> Callable[[KafkaError | None, Any], None]:
        with self._lock:
            self._pending += 1
            self._done.clear()

        def delivered(error: KafkaError | None, _: Any) -> None:
            with self._lock:
                if error is not None:
                    self._errors.setdefault(index, error.str())
                self._pending -= 1
                if self._pending == 0:
                    self._done.set()

        return delivered

    def failed(self, index: int, why: str) -> None:
        with self._lock:
            self._errors.setdefault(index, why)

    @property
    def settled(self) -> bool:
        return self._done.is_set()

    def wait(self, closed: Callable[[], bool]) -> dict[int, str] | None:
        """Block until every output is acknowledged (or failed); the errors by record index,
        or None when the producer closed first (no input with outputs is done)."""
        while not self._done.wait(0.1):
            if closed():
                return None
        return self._errors


class TransactionLock:
    """Workers hold it (shared) while an item runs; the consumer's thread closes a
    transaction only when no worker holds it. Once a close is requested, workers wait before
    starting an item (so a close waits at most for the items already running)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._holders = 0
        self._closing = False

    def enter(self) -> None:
        with self._condition:
            while self._closing:
                self._condition.wait()
            self._holders += 1

    def try_enter(self) -> bool:
        with self._condition:
            if self._closing:
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
            self._closing = True
            return self._holders == 0

    def wait_closed(self, timeout: float) -> bool:
        with self._condition:
            self._closing = True
            return self._condition.wait_for(lambda: self._holders == 0, timeout)

    def reopen(self) -> None:
        with self._condition:
            self._closing = False
            self._condition.notify_all()

    @property
    def holders(self) -> int:
        return self._holders

    @property
    def closing(self) -> bool:
        """A close waits: a running item starts no further record (they go back unstarted,
        in order), so the close waits for at most one record per worker."""
        return self._closing


class Outputs:
    """The producer of handler outputs (and, in transactional mode, of dead-letter copies),
    shared by the workers; a thread of its own serves its delivery reports."""

    def __init__(self, new_producer: Callable[[], Producer], transactional: bool) -> None:
        self.transactional = transactional
        self.lock: TransactionLock | None = TransactionLock() if transactional else None
        self._new_producer = new_producer
        self._producer: Producer | None = None
        self._opening = threading.Lock()
        self._closed = False
        self._counting = threading.Lock()
        self.produced = 0
        self.failures = 0
        self.in_transaction = 0  # outputs produced into the open transaction
        self.broken: str | None = None  # why the open transaction must be aborted
        self._poller: threading.Thread | None = None

    @property
    def producer(self) -> Producer:
        producer = self._producer
        if producer is None:
            with self._opening:
                if self._producer is None:
                    self._producer = self._new_producer()
                    self._poller = threading.Thread(
                        target=self._poll, name="output-deliveries", daemon=True
                    )
                    self._poller.start()
                producer = self._producer
        return producer

    @property
    def opened(self) -> bool:
        return self._producer is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def _poll(self) -> None:
        while not self._closed:
            producer = self._producer
            if producer is not None:
                producer.poll(0.05)

    def send(self, outputs: list[Output], deliveries: Deliveries | None, index: int) -> str | None:
        """Produce one input's outputs; returns why it failed (the input fails), or None. In
        transactional mode (``deliveries`` None) a failure after some of them went into the
        transaction breaks the transaction (it is aborted, its inputs processed again)."""
        try:
            producer = self.producer
        except KafkaException as exc:
            return f"the producer could not be created: {_text(exc)} (check producer_config)"
        sent = 0
        for output in outputs:
            callback = self._counted if deliveries is None else deliveries.expect(index)
            problem = self._produce(producer, output, callback)
            if problem is not None:
                if deliveries is not None:
                    callback(_LocalError(problem), None)  # (its expectation is settled)
                elif sent:
                    self.broken = f"an input's outputs went into it in part: {problem}"
                with self._counting:
                    self.failures += 1
                return problem
            sent += 1
        with self._counting:
            self.produced += sent
            if deliveries is None:
                self.in_transaction += sent
        return None

    def _produce(
        self, producer: Producer, output: Output, callback: Callable[[Any, Any], None]
    ) -> str | None:
        arguments: dict[str, Any] = {"value": output.value, "on_delivery": callback}
        if output.key is not None:
            arguments["key"] = output.key
        if output.headers is not None:
            headers = output.headers
            arguments["headers"] = (
                list(headers.items()) if isinstance(headers, Mapping) else (list(headers))
            )
        if output.partition is not None:
            arguments["partition"] = output.partition
        deadline = time.monotonic() + _QUEUE_FULL_WAIT
        while True:
            try:
                producer.produce(output.topic, **arguments)
                return None
            except BufferError:
                if time.monotonic() >= deadline or self._closed:
                    return f"the producer's queue stayed full producing to {output.topic}"
                time.sleep(0.005)  # (the polling thread frees room as acknowledgements come)
            except (KafkaException, TypeError, ValueError) as exc:
                return f"producing to {output.topic}: {_text(exc)}"

    def _counted(self, error: KafkaError | None, _: Any) -> None:
        if error is not None:
            with self._counting:
                self.failures += 1
            self.broken = f"an output's delivery failed: {error.str()}"

    def close(self, timeout: float) -> None:
        producer = self._producer
        if producer is not None and not self.transactional:
            left = producer.flush(timeout)
            if left:
                log.warning("%d outputs were not acknowledged before closing", left)
        self._closed = True
        if self._poller is not None:
            self._poller.join(1.0)


def _text(exc: BaseException) -> str:
    error = exc.args[0] if exc.args else exc
    return error.str() if isinstance(error, KafkaError) else str(error)


class _LocalError:
    """A produce call's own failure, shaped like a delivery report's error."""

    def __init__(self, text: str) -> None:
        self.text = text

    def str(self) -> str:
        return self.text
