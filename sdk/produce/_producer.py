"""The engine's producer of handler outputs (and, exactly once, of dead-letter copies).

Workers send an item's outputs through :class:`Outputs` as the handler returns them (see
:mod:`sdk.produce._deliveries` for what the two commit modes make of them); the consumer's
thread and the workers serve the delivery reports (of failed deliveries only). At least once,
the items waiting settle together once the producer holds no output that is neither
acknowledged nor reported failed (:meth:`Outputs.acknowledged`); exactly once, the outputs
belong to the open transaction, and an output whose delivery failed breaks it (the
transaction is aborted and its inputs run again).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException, Producer

from sdk.produce._deliveries import Deliveries, Pause, Source, TransactionLock, sources_of
from sdk.produce._output import Headers, Output

log = logging.getLogger("sdk")

_QUEUE_FULL_WAIT = 30.0
"""Seconds a worker waits for room in the producer's queue before the input fails."""
_DRAIN_WAIT = 0.005
"""At least once: seconds the consumer's thread waits at most, with nothing running, for the
outputs on their way to be acknowledged (a flush, which sends what lingers at once)."""
_SERVE_TRANSACTION_AT = 10_000
"""Exactly once: outputs produced since the reports were last served before the consumer's
thread serves them between two closes of the transaction (librdkafka's queue holds 100,000
by default; a worker that finds it full serves them too)."""


class Outputs:
    """The producer of handler outputs (and, in transactional mode, of dead-letter copies),
    shared by the workers; the consumer's thread serves its delivery reports."""

    def __init__(self, new_producer: Callable[[], Producer], transactional: bool) -> None:
        self.transactional = transactional
        self.lock: TransactionLock | None = TransactionLock() if transactional else None
        # At least once: what workers look at before each record (see sdk.produce._deliveries).
        self.pause: Pause | None = None if transactional else Pause()
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

    def poll(self, running: bool) -> None:
        """On the consumer's thread, every turn of its loop (but those that ask
        :meth:`acknowledged`, which serves them itself): serve delivery reports when they are
        due (see :meth:`serve`). ``running``: whether items are in flight."""
        self._raise_failure()
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

    def acknowledged(self, drain: bool) -> bool:
        """At least once, on the consumer's thread: whether every output produced so far is
        acknowledged or its failure reported (and its callback run): the producer's queue
        holds none (confluent-kafka counts an output there until its report, failed or not,
        is served). The reports are served first; with ``drain`` (nothing runs), the
        producer is flushed for up to ``_DRAIN_WAIT`` (a flush sends what lingers at once).
        False while another thread serves reports."""
        self._raise_failure()
        producer = self._producer
        if producer is None:
            return True
        if not self._serving.acquire(blocking=False):
            return False
        try:
            if drain:
                producer.flush(_DRAIN_WAIT)
            else:
                producer.poll(0)
            return len(producer) == 0
        except:  # noqa: E722 (what is no exception too: see kafka_error)
            raise_as_kafka_exception()
        finally:
            self._serving.release()

    def _raise_failure(self) -> None:
        """A fatal error of the producer is raised on the consumer's thread, wherever the
        poll that met it ran."""
        failure = self.failure
        if failure is not None:
            self.failure = None
            raise failure

    def serve(self) -> None:
        """Serve the producer's delivery reports from a worker's thread, unless another
        thread is at it (a fatal error is kept for the consumer's thread).

        confluent-kafka takes the interpreter's lock back for each report it serves (a
        callback or not: it filters out the successful ones itself), so serving them costs
        most where threads compete for that lock: at least once, workers serve them after
        each item (they have work queued meanwhile) and the consumer's thread only on the
        turns after which none did; exactly once, the close of each transaction serves them
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
        except:  # noqa: E722 (what is no exception too: see kafka_error)
            raise_as_kafka_exception()
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
        self.produced += sent  # (a statistic: an increment lost to a race is harmless)
        if self.transactional:
            self.in_transaction += sent
            self.unserved += sent  # (a threshold: an increment lost to a race is harmless)
        return None

    def send_one(
        self,
        output: Output,
        deliveries: Deliveries,
        callback: Callable[[KafkaError | None, Any], None],
        index: int,
        given: Any,
    ) -> str | None:
        """:meth:`send` for a handler's most common return, one ``Output`` without headers,
        with nothing made for it but its note in ``deliveries.sent`` (at least once, where the
        output itself stands for its outputs). Anything else, or a ``produce`` that raised,
        takes :meth:`send`'s way."""
        producer = self._producer
        if producer is None or output[3] is not None or self.tracing:
            return self.send((output,), deliveries, callback, index, given)
        transactional = self.transactional
        if not transactional:
            deliveries.sent.append((index, given, output))  # (noted before its report)
        partition = output[4]
        try:
            producer.produce(
                output[0], output[1], output[2], -1 if partition is None else partition, callback
            )
        except Exception:  # (a full queue, a bad field: send() tells, waits or fails it)
            if not transactional:
                deliveries.sent.pop()  # (nothing was produced: no report comes for it)
            return self.send((output,), deliveries, callback, index, given)
        self.produced += 1  # (statistics and thresholds: see send)
        if transactional:
            self.in_transaction += 1
            self.unserved += 1
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


@contextmanager
def kafka_errors() -> Iterator[None]:
    """Around a producer's call: what confluent-kafka raises in place of a
    ``KafkaException`` is raised as that ``KafkaException`` (see :func:`kafka_error`)."""
    try:
        yield
    except:  # noqa: E722 (what is no exception too: see kafka_error)
        raise_as_kafka_exception()


def raise_as_kafka_exception() -> NoReturn:
    """In an ``except`` clause: raise the ``KafkaException`` behind what was caught (see
    :func:`kafka_error`), or what was caught, as it is."""
    raised = sys.exc_info()[1]
    found = kafka_error(raised)
    if found is None or found is raised:
        raise  # (the exception being handled)
    raise found from None


def kafka_error(raised: object) -> KafkaException | None:
    """The ``KafkaException`` behind what a producer's call raised, if any. When
    confluent-kafka meets a fatal error (a fenced producer's) while it serves callbacks, it
    sets that error and goes on serving those already due (the producer's log lines): the
    call then raises a ``SystemError`` caused by it, or the ``KafkaError`` itself, which is not
    an exception (no ``except`` clause but a bare one catches it)."""
    if isinstance(raised, KafkaError):
        return KafkaException(raised)
    seen: set[int] = set()
    found = raised if isinstance(raised, BaseException) else None
    while found is not None and id(found) not in seen:
        if isinstance(found, KafkaException):
            return found
        seen.add(id(found))
        found = found.__cause__
    return None
