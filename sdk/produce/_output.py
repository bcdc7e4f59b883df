"""Records a handler hands back (:class:`Output`), and the engine's producer that writes them.

A handler returns ``None``, one ``Output`` or an iterable of them; workers produce them as
soon as the handler returns, in the order of their inputs (so per shard in input order, per
key or per partition), and for a batch handler in its order.

Two commit modes decide when an input with outputs counts as done:

- ``CONSUMER`` (at least once): when the broker acknowledged every one of its outputs. A
  worker does not wait for them: the consumer's thread keeps the item's results aside until
  every report is in (:mod:`sdk.produce._deliveries`); a delivery failure fails the input (and holds
  back the rest of its shard in the item), exactly like a handler failure.
- ``TRANSACTIONAL`` (exactly once): at once, because its outputs are in the open transaction,
  which commits together with the inputs' offsets (:mod:`sdk.consumer._transactions`). A worker
  holds the :class:`~sdk.produce._deliveries.TransactionLock` from the start of its item until its
  results are in the consumer's inbox, so a transaction is closed only between items: every output
  in it belongs to an input whose offset goes into the same transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, Producer

from sdk.produce._deliveries import Awaiting, Deliveries, Source, TransactionLock, sources_of

__all__ = [
    "Awaiting",
    "Deliveries",
    "Output",
    "Outputs",
    "ProduceError",
    "TransactionLock",
    "outputs_of",
]

log = logging.getLogger("sdk")

Headers = Mapping[str, bytes | str | None] | Sequence[tuple[str, bytes | str | None]]

_QUEUE_FULL_WAIT = 30.0
"""Seconds a worker waits for room in the producer's queue before the input fails."""
_SERVE_TRANSACTION_AT = 10_000
"""Exactly once: outputs produced since the reports were last served before the consumer's
thread serves them between two closes of the transaction (librdkafka's queue holds 100,000
by default; a worker that finds it full serves them too)."""


class ProduceError(Exception):
    """An output of the record could not be produced (serialisation, an unknown topic, a
    delivery report's error). It fails the input like a handler's exception."""


class _Fields(NamedTuple):
    topic: str
    value: bytes | str | None
    key: bytes | str | None
    headers: Headers | None
    partition: int | None


_PLAIN = frozenset({bytes, str, type(None)})


class Output(_Fields):
    """A record for the engine to produce: return one (or a list) from a handler.

    ``value`` and ``key`` are bytes, str (encoded as UTF-8) or None; ``headers`` a mapping or a
    list of (name, value) pairs; ``partition`` None lets the producer's partitioner choose
    (by key). A wrong type raises ``TypeError`` where it is built (failing the input)."""

    __slots__ = ()

    def __new__(
        cls,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> Output:
        if (
            type(topic) is str
            and topic
            and type(value) in _PLAIN
            and type(key) in _PLAIN
            and headers is None
            and partition is None
        ):  # (the common case, checked by exact types at once)
            return _new_tuple(cls, (topic, value, key, None, None))
        if (type(topic) is not str and not isinstance(topic, str)) or not topic:
            raise TypeError(f"Output.topic must be a non-empty str (got {topic!r})")
        if type(value) not in _PLAIN and not isinstance(value, bytes | str):
            raise TypeError(_not_serialised("value", value))
        if type(key) not in _PLAIN and not isinstance(key, bytes | str):
            raise TypeError(_not_serialised("key", key))
        if partition is not None and (
            type(partition) is not int or partition < 0  # (a bool is not a partition)
        ):
            raise TypeError(f"Output.partition must be None or an int >= 0 ({partition!r})")
        if headers is not None:
            _check_headers(headers)
        return _new_tuple(cls, (topic, value, key, headers, partition))


_new_tuple = tuple.__new__


def _not_serialised(name: str, value: object) -> str:
    return (
        f"Output.{name} must be bytes, str or None (got {type(value).__name__}): serialise it "
        "in the handler"
    )


def _check_headers(headers: Headers) -> None:
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
    """The outputs in a handler's return value: one ``Output`` (a subclass's too), or any
    iterable of them (a list, a tuple, a set, a generator, a ``map``...), taken once and in
    its order. Values that hold no ``Output`` at all are ignored (a handler written before
    outputs existed may return anything); a value holding outputs in a form the engine cannot
    take (mixed with other values, nested, in a mapping, an async generator) is an error,
    raised as ``TypeError`` (the input fails)."""
    kind = type(returned)
    if kind is Output:  # (the common cases first)
        return [returned]
    if kind is list or kind is tuple:
        found = returned
    elif kind in _SCALARS:
        return []
    elif isinstance(returned, Output):
        return [returned]
    elif isinstance(returned, _NOT_OUTPUTS):
        return []
    elif isinstance(returned, Mapping):
        if any(_holds_outputs(value) for value in returned.values()):
            raise TypeError(_WRONG_FORM.format(kind="a mapping"))
        return []
    elif isinstance(returned, Iterable):
        found = list(returned)
    elif isinstance(returned, AsyncIterable):
        raise TypeError(_WRONG_FORM.format(kind="an async iterable"))
    else:
        return []
    if not found:
        return []
    outputs = [value for value in found if isinstance(value, Output)]
    if len(outputs) == len(found):
        return outputs if type(outputs) is list else list(outputs)
    if outputs:
        odd = next(value for value in found if not isinstance(value, Output))
        raise TypeError(
            f"the handler returned outputs mixed with {type(odd).__name__}: return None, an "
            "Output or an iterable of Outputs"
        )
    if any(_holds_outputs(value) for value in found):
        raise TypeError(_WRONG_FORM.format(kind="nested iterables"))
    return []


_NOT_OUTPUTS = (str, bytes, bytearray, memoryview)
_SCALARS = frozenset({int, float, bool, str, bytes})
_WRONG_FORM = (
    "the handler returned outputs in {kind}: return None, an Output or an iterable of Outputs"
)


def _holds_outputs(value: Any) -> bool:
    """Whether a value (not itself an output) holds outputs one level down."""
    if isinstance(value, Output):
        return True
    if isinstance(value, list | tuple | set | frozenset):
        return any(isinstance(inner, Output) for inner in value)
    if isinstance(value, Mapping):
        return any(isinstance(inner, Output) for inner in value.values())
    return False


class Outputs:
    """The producer of handler outputs (and, in transactional mode, of dead-letter copies),
    shared by the workers; the consumer's thread serves its delivery reports."""

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
        # Transactional: the inputs whose outputs broke a transaction (aborted, so their
        # partitions were rewound and their attempts forgotten), with how often and why.
        self.breakers: dict[Source, tuple[int, str]] = {}
        self.broken: str | None = None  # why the open transaction must be aborted
        # Transactional: whether workers note which input each output came from. Not while
        # transactions commit (a transaction's worth of notes would cost the garbage
        # collector dearly), but from a failed delivery that could not be traced back to its
        # input until a transaction commits again.
        self.tracing = False
        # At least once: the items whose outputs all have their delivery reports, for the
        # consumer's thread to take (whichever thread served the reports).
        self.settled: deque[Deliveries] = deque()
        self._serving = threading.Lock()  # one thread serves delivery reports at a time
        self._served_elsewhere = False  # a worker served them since the consumer's last turn
        self.unserved = 0  # transactional: outputs produced since reports were last served
        self.failure: KafkaException | None = None  # raised by a poll off the consumer's thread

    @property
    def producer(self) -> Producer:
        producer = self._producer
        if producer is None:
            with self._opening:
                if self._producer is None:
                    self._producer = self._new_producer()
                producer = self._producer
        return producer

    @property
    def opened(self) -> bool:
        return self._producer is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def renew(self) -> None:
        """Let the current producer go (it failed for good); the next use opens another."""
        with self._opening:
            self._producer = None

    def poll(self, running: bool) -> list[Deliveries]:
        """On the consumer's thread, every turn of its loop: serve delivery reports when they
        are due (see :meth:`serve`), and return the items whose outputs all have their reports
        now (at least once). ``running``: whether items are in flight. A fatal error of the
        producer is raised here, wherever the poll that met it ran."""
        failure = self.failure
        if failure is not None:
            self.failure = None
            raise failure
        producer = self._producer
        if producer is not None:
            if not running:
                self._serve(producer)  # (nothing competes for the interpreter now)
            elif self.transactional:
                if self.unserved >= _SERVE_TRANSACTION_AT:
                    self._serve(producer)
            elif self._served_elsewhere:
                self._served_elsewhere = False
            else:
                self._serve(producer)
        settled = self.settled
        found = []
        while settled:
            found.append(settled.popleft())
        return found

    def serve(self) -> None:
        """Serve the producer's delivery reports from a worker's thread, unless another
        thread is at it (a fatal error is kept for the consumer's thread).

        confluent-kafka takes the interpreter's lock back for each report it serves (a
        callback or not), so serving them costs most where threads compete for that lock:
        at least once, workers serve them after each item (they have work queued meanwhile)
        and the consumer's thread only on the turns after which none did; exactly once,
        where only failed deliveries call back, the close of each transaction serves them
        (it flushes the producer while workers wait), and the consumer's thread in between
        only when 10,000 outputs wait for theirs or nothing runs."""
        producer = self._producer
        if producer is None:
            return
        try:
            if self._serve(producer):
                self._served_elsewhere = True
        except KafkaException as exc:
            if self.failure is None:
                self.failure = exc

    def _serve(self, producer: Producer) -> bool:
        """Serve the reports unless another thread is at it (whether this one did)."""
        if not self._serving.acquire(blocking=False):
            return False
        try:
            self.unserved = 0
            producer.poll(0)
        finally:
            self._serving.release()
        return True

    def send(
        self,
        outputs: Sequence[Output],
        deliveries: Deliveries,
        callback: Callable[[KafkaError | None, Any], None],
        index: int,
        given: Any,
    ) -> str | None:
        """Produce the outputs of one record (or batch handler call) at ``index`` of its item,
        ``given`` the record (or the batch's records); ``callback`` is the item's
        ``deliveries.delivered``. Returns why it failed (the input fails), or None.

        In transactional mode only failed deliveries are reported: one breaks the transaction
        (it is aborted, its inputs processed again), and so does a failure after some of the
        input's outputs went into it. The inputs that broke transactions are remembered
        across the aborts (:meth:`broke`)."""
        producer = self._producer
        if producer is None:
            try:
                producer = self.producer
            except KafkaException as exc:
                return f"the producer could not be created: {_text(exc)} (check producer_config)"
        produce = producer.produce
        # (Noted before a report can come back; see Deliveries.sent.)
        if not self.transactional:
            deliveries.sent.append((index, given, outputs))
        elif self.tracing:
            if len(outputs) == 1:
                output = outputs[0]
                kept: Sequence[Any] = ((output[0], output[2], output[1]),)
            else:
                kept = tuple([(output[0], output[2], output[1]) for output in outputs])
            deliveries.sent.append((index, sources_of(given), kept))
        sent = 0
        for topic, value, key, headers, partition in outputs:
            try:
                if headers is None:
                    produce(topic, value, key, -1 if partition is None else partition, callback)
                else:
                    self._produce(produce, topic, value, key, headers, partition, callback)
            except BufferError:
                problem = self._when_room(produce, topic, value, key, headers, partition, callback)
                if problem is not None:
                    return self._failed(problem, sent, deliveries, given)
            except (KafkaException, TypeError, ValueError) as exc:
                problem = f"producing to {topic}: {_text(exc)}"
                return self._failed(problem, sent, deliveries, given)
            sent += 1
        deliveries.expected += sent
        self.produced += sent  # (a statistic: an increment lost to a race is harmless)
        if self.transactional:
            self.in_transaction += sent
            self.unserved += sent  # (a threshold: an increment lost to a race is harmless)
        return None

    @staticmethod
    def _produce(
        produce: Callable[..., None],
        topic: str,
        value: Any,
        key: Any,
        headers: Headers | None,
        partition: int | None,
        callback: Callable[..., None] | None,
    ) -> None:
        arguments: dict[str, Any] = {"partition": -1 if partition is None else partition}
        if callback is not None:
            arguments["on_delivery"] = callback
        if headers is not None:
            arguments["headers"] = (
                list(headers.items()) if isinstance(headers, Mapping) else list(headers)
            )
        produce(topic, value, key, **arguments)

    def _when_room(
        self,
        produce: Callable[..., None],
        topic: str,
        value: Any,
        key: Any,
        headers: Headers | None,
        partition: int | None,
        callback: Callable[..., None] | None,
    ) -> str | None:
        """The producer's queue is full: wait for room (serving delivery reports frees it as
        acknowledgements come) for up to 30 s."""
        deadline = time.monotonic() + _QUEUE_FULL_WAIT
        while time.monotonic() < deadline and not self._closed:
            self.serve()
            time.sleep(0.005)
            try:
                self._produce(produce, topic, value, key, headers, partition, callback)
                return None
            except BufferError:
                continue
            except (KafkaException, TypeError, ValueError) as exc:
                return f"producing to {topic}: {_text(exc)}"
        return f"the producer's queue stayed full producing to {topic}"

    def _failed(self, problem: str, sent: int, deliveries: Deliveries, given: Any) -> str:
        deliveries.expected += sent  # (their reports come all the same)
        with self._counting:
            self.failures += 1
        if self.transactional and sent:
            self.in_transaction += sent
            self.broken = f"an input's outputs went into it in part: {problem}"
            self._blame(sources_of(given), problem)
        return problem

    def break_transaction(self, sources: list[Source], why: str) -> None:
        """Something written into the open transaction for ``sources`` failed: the
        transaction must be aborted, and the inputs are blamed for it."""
        self.failures += 1
        self.broken = why
        self._blame(sources, why)

    def _blame(self, sources: list[Source], why: str) -> None:
        for source in sources:
            count, _ = self.breakers.get(source, (0, ""))
            self.breakers[source] = (count + 1, why)

    def broke(self, source: Source) -> tuple[int, str]:
        """How many transactions the input's outputs broke, and the last reason."""
        return self.breakers.get(source, (0, ""))

    def delivery_failed(self, count: int) -> None:
        with self._counting:
            self.failures += count

    def close(self, timeout: float) -> None:
        producer = self._producer
        if producer is not None and not self.transactional:
            left = producer.flush(timeout)
            if left:
                log.warning("%d outputs were not acknowledged before closing", left)
        self._closed = True


def _text(exc: BaseException) -> str:
    error = exc.args[0] if exc.args else exc
    return error.str() if isinstance(error, KafkaError) else str(error)
