"""Records a handler hands back (:class:`Output`), and the engine's producer that writes them.

A handler returns ``None``, one ``Output`` or an iterable of them; workers produce them as
soon as the handler returns, in the order of their inputs (so per shard in input order, per
key or per partition), and for a batch handler in its order.

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
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from confluent_kafka import KafkaError, KafkaException, Producer

log = logging.getLogger("sdk")

Headers = Mapping[str, bytes | str | None] | Sequence[tuple[str, bytes | str | None]]

Source = tuple[str, int, int]
"""An input: topic, partition, offset."""

_QUEUE_FULL_WAIT = 30.0
"""Seconds a worker waits for room in the producer's queue before the input fails."""


class ProduceError(Exception):
    """An output of the record could not be produced (serialisation, an unknown topic, a
    delivery report's error). It fails the input like a handler's exception."""


class _Fields(NamedTuple):
    topic: str
    value: bytes | str | None
    key: bytes | str | None
    headers: Headers | None
    partition: int | None


_PLAIN = (bytes, str, type(None))


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
        return tuple.__new__(cls, (topic, value, key, headers, partition))


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


class Deliveries:
    """The acknowledgements of one item's outputs, by the index of the record (or batch
    call) they belong to. The consumer's thread serves delivery reports (``Outputs.poll``);
    each is appended to a list."""

    __slots__ = ("_calls", "_expected", "_reports")

    def __init__(self) -> None:
        self._calls = 0
        self._expected = 0  # outputs produced (the worker's count)
        self._reports: list[tuple[int, str] | None] = []

    def new_call(self) -> int:
        """A fresh index for one batch handler call's outputs (counted apart from records)."""
        self._calls -= 1
        return self._calls

    def callback(self, index: int) -> Callable[[KafkaError | None, Any], None]:
        """The delivery callback of the outputs of the record (or call) at ``index``."""
        reports = self._reports

        def delivered(error: KafkaError | None, _: Any) -> None:
            reports.append(None if error is None else (index, error.str()))

        return delivered

    def produced(self) -> None:
        self._expected += 1

    @property
    def settled(self) -> bool:
        return len(self._reports) >= self._expected

    def errors(self) -> dict[int, str]:
        """The failed deliveries, by record index (once :attr:`settled`)."""
        errors: dict[int, str] = {}
        for report in self._reports:
            if report is not None:
                errors.setdefault(*report)
        return errors


class Awaiting(list[Any]):
    """An item's results whose records with outputs count as done only once their outputs
    are acknowledged: the consumer's thread keeps them aside until :attr:`deliveries` are
    settled, then :meth:`settle` applies the failures (serving delivery reports is its job:
    no worker waits for them)."""

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
        self._settle(results, self.deliveries.errors())
        return results


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

    def poll(self) -> None:
        """Serve delivery reports (on the consumer's thread, every turn of its loop)."""
        producer = self._producer
        if producer is not None:
            producer.poll(0)

    def send(
        self,
        outputs: list[Output],
        deliveries: Deliveries | None,
        index: int,
        sources: list[Source] = (),  # type: ignore[assignment]
    ) -> str | None:
        """Produce one input's outputs; returns why it failed (the input fails), or None. In
        transactional mode (``deliveries`` None) only failed deliveries are reported: one
        breaks the transaction (it is aborted, its inputs processed again), and so does a
        failure after some of the input's outputs went into it. The inputs (``sources``)
        that broke transactions are remembered across the aborts (:meth:`broke`)."""
        try:
            produce = self.producer.produce
        except KafkaException as exc:
            return f"the producer could not be created: {_text(exc)} (check producer_config)"
        callback = deliveries.callback(index) if deliveries is not None else self._breaks(sources)
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
                    return self._failed(problem, sent, deliveries, sources)
            except (KafkaException, TypeError, ValueError) as exc:
                problem = f"producing to {topic}: {_text(exc)}"
                return self._failed(problem, sent, deliveries, sources)
            if deliveries is not None:
                deliveries.produced()
            sent += 1
        self.produced += sent  # (a statistic: an increment lost to a race is harmless)
        if deliveries is None:
            self.in_transaction += sent
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
        """The producer's queue is full: wait for room (the polling thread frees it as
        acknowledgements come) for up to 30 s."""
        deadline = time.monotonic() + _QUEUE_FULL_WAIT
        while time.monotonic() < deadline and not self._closed:
            time.sleep(0.005)
            try:
                self._produce(produce, topic, value, key, headers, partition, callback)
                return None
            except BufferError:
                continue
            except (KafkaException, TypeError, ValueError) as exc:
                return f"producing to {topic}: {_text(exc)}"
        return f"the producer's queue stayed full producing to {topic}"

    def _failed(
        self, problem: str, sent: int, deliveries: Deliveries | None, sources: list[Source]
    ) -> str:
        with self._counting:
            self.failures += 1
        if deliveries is None and sent:
            self.broken = f"an input's outputs went into it in part: {problem}"
            self._blame(sources, problem)
        return problem

    def _breaks(self, sources: list[Source]) -> Callable[[KafkaError | None, Any], None]:
        """Transactional: the delivery callback of an input's outputs (the producer reports
        failed deliveries only)."""

        def delivered(error: KafkaError | None, _: Any) -> None:
            if error is not None:
                self.break_transaction(sources, f"an output's delivery failed: {error.str()}")

        return delivered

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
