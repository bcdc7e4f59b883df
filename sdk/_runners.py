"""Where handlers run: a pool of threads (plain functions) or one asyncio loop (coroutines).

A runner receives work items from the consumer's thread and returns, through the consumer's
inbox, one result per record it got to: ``None`` (success), the exception raised, or
``NOT_STARTED`` for records of a shard whose earlier record in the same item failed, for
records of a partition revoked before they started (the partition's next owner runs them, in
order: a revocation never waits for them), and for records at or beyond their partition's
release limit when the worker reaches them (a watermark lowered since they were handed out:
they go back to their shard and wait, in order). Records it did not get to (they joined the
item after its last look, or the runner closed) have no result: the core counts them as not
started.

A failure's traceback is dropped once it was logged and shown to the ``on_failure`` hook: it
holds the worker's frames, whose locals hold the item's records, so a kept exception would
keep every record of its item (and, through their own earlier failures, earlier items) in
memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import queue
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from typing import Any

from sdk._failure_log import FailureLog
from sdk._failures import DecodeError, RetriableError, TerminalError, describe
from sdk._options import Options
from sdk._output import Awaiting, Deliveries, Outputs, ProduceError, TransactionLock, outputs_of
from sdk._record import Record, batch_records
from sdk._shards import NOT_STARTED, Entry, Item

log = logging.getLogger("sdk.handler")

BREAKS_BEFORE_HOLDING = 3
"""Transactional, without ``max_attempts``: an input whose outputs broke this many
transactions is held (its shard waits) instead of aborting every transaction."""

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
)


class Latency:
    """Handler latency histogram kept per worker (no locks), merged when scraped."""

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float, records: int = 1) -> None:
        """``records`` handled in ``seconds`` each (one observation per work item)."""
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += records
        self.total += seconds * records


class Work:
    """Turns entries into records, calls the handler and collects per-record results."""

    def __init__(self, handler: Callable[..., Any], options: Options) -> None:
        self.handler = handler
        self.options = options
        self.ordered = options.ordering != "unordered"
        self.batch = options.batch_size is not None
        self.deserializers = (options.key_deserializer, options.value_deserializer)
        self.check_decoding = options.on_decode_error == "dead_letter" and any(self.deserializers)
        hooks = options.hooks
        self.plain = hooks.before_handle is None and hooks.after_handle is None
        self.outputs: Outputs | None = None  # the engine's producer of handler outputs
        self.failures = FailureLog(log)

    @staticmethod
    def may_start(entry: Entry) -> bool:
        """Whether a worker may start the record now: its partition was not revoked, and its
        release limit (the watermark, or the offset map's cap) has not fallen to it since it
        was handed out."""
        part = entry.part
        if part.revoked:
            return False
        if part.limit is None and part.map_cap is None:
            return True
        limit = part.release_limit()
        return limit is None or entry.offset < limit

    @staticmethod
    def stop_mark(entry: Entry) -> object:
        """What a failed record stops for the rest of its item: its shard's records, or for a
        record of a lane (whose records are unrelated) the records of its key."""
        shard = entry.shard
        return ("key", entry.key) if shard.lane else shard

    @staticmethod
    def stopped(entry: Entry, stopped: set[object]) -> bool:
        shard = entry.shard
        return shard in stopped or ("key", entry.key if shard.lane else shard.key) in stopped

    def record(self, entry: Entry) -> Record:
        return Record(entry.payload, entry.attempts + 1, *self.deserializers)

    def undecodable(self, record: Record) -> DecodeError | None:
        if self.check_decoding:
            problem = record.decode_error
            if problem:
                return DecodeError(problem)
        return None

    def failed(self, record: Record, error: BaseException, forget: bool = True) -> None:
        """Log a failed attempt and show it to the ``on_failure`` hook, then drop its
        traceback (see the module's docstring)."""
        if isinstance(error, RetriableError):
            log.debug("%r failed, will retry: %s", record, error)
        else:
            where = (record.topic, record.partition, record.offset)
            self.failures.failed(where, record.attempt, describe(error))
        hook = self.options.hooks.on_failure
        if hook is not None:
            try:
                hook(record, error)
            except Exception:
                log.exception("on_failure hook raised")
        if forget:
            forget_frames(error)

    def hook(self, name: str, record: Record) -> None:
        hook = getattr(self.options.hooks, name)
        if hook is not None:
            try:
                hook(record)
            except Exception:
                log.exception("%s hook raised", name)

    def run(self, item: Item) -> list[Any]:
        """Run an item's records one after another, records that join it while it runs
        included; a failure stops the rest of its shard. Until a record fails or has outputs
        to wait for, ``item.finished`` counts the records done so far (the consumer's thread
        reads it, so a long item's commits need not wait for its end)."""
        entries = item.entries
        if self.batch:
            return self.run_batch(entries)
        results: list[Any] = []
        stopped: set[object] = set()
        failed = False
        handler, plain, check_decoding = self.handler, self.plain, self.check_decoding
        key_deserializer, value_deserializer = self.deserializers
        may_start = self.may_start
        deliveries = self.deliveries()
        awaiting: dict[int, Record] = {}
        lock = self.transaction_lock
        for entry in entries:
            if (
                (stopped and self.stopped(entry, stopped))
                or not may_start(entry)
                or (lock is not None and lock.closing and results)
            ):
                results.append(NOT_STARTED)
                failed = True  # (what ``item.finished`` counts ends here)
                continue
            record = Record(entry.payload, entry.attempts + 1, key_deserializer, value_deserializer)
            error: BaseException | None = self.undecodable(record) if check_decoding else None
            if error is None and lock is not None:
                error = self.broke_transactions(entry)
            if error is None:
                try:
                    if plain:
                        returned = handler(record)
                    else:
                        self.hook("before_handle", record)
                        returned = handler(record)
                        self.hook("after_handle", record)
                except BaseException as exc:  # SystemExit too: a worker must never die of it
                    error = exc
                else:
                    if returned is not None:
                        error = self.emit(returned, deliveries, len(results), record, awaiting)
                    if error is None:
                        results.append(None)
                        if not failed and not awaiting:
                            item.finished = len(results)
                        continue
            results.append(error)
            failed = True
            self.failed(record, error)
            if self.ordered:
                stopped.add(self.stop_mark(entry))
        if awaiting:
            assert deliveries is not None
            return Awaiting(results, deliveries, self.settle_records(entries, awaiting))
        return results

    # ---- outputs ------------------------------------------------------------------------

    def deliveries(self) -> Deliveries | None:
        """What an item's outputs wait for (at least once); None when nothing is awaited."""
        outputs = self.outputs
        return None if outputs is None or outputs.transactional else Deliveries()

    @property
    def transaction_lock(self) -> TransactionLock | None:
        outputs = self.outputs
        return None if outputs is None else outputs.lock

    def settle_records(
        self, entries: list[Entry], awaiting: dict[int, Record]
    ) -> Callable[[list[Any], dict[int, str]], None]:
        def settle(results: list[Any], errors: dict[int, str]) -> None:
            self.acknowledged(entries, results, awaiting, errors)

        return settle

    def settle_batch(
        self, records: list[Record], runnable: list[int], awaiting: dict[int, list[Record]]
    ) -> Callable[[list[Any], dict[int, str]], None]:
        def settle(results: list[Any], errors: dict[int, str]) -> None:
            self.batch_acknowledged(results, records, runnable, awaiting, errors)

        return settle

    def emit(
        self,
        returned: Any,
        deliveries: Deliveries | None,
        index: int,
        record: Any,
        awaiting: dict[int, Any],
    ) -> BaseException | None:
        """Produce the outputs a handler returned for the record (or batch) at ``index``;
        returns the failure of its input, if any."""
        outputs = self.outputs
        if outputs is None:
            return None
        try:
            found = outputs_of(returned)
        except TypeError as exc:
            return exc
        if not found:
            return None
        sources = () if deliveries is not None else self.sources(record)
        problem = outputs.send(found, deliveries, index, sources)  # type: ignore[arg-type]
        if problem is not None:
            return ProduceError(problem)
        if deliveries is not None:
            awaiting[index] = record
        return None

    @staticmethod
    def sources(record: Any) -> list[tuple[str, int, int]]:
        records = record if isinstance(record, list) else [record]
        return [(r.topic, r.partition, r.offset) for r in records]

    def broke_transactions(self, entry: Entry) -> BaseException | None:
        """Transactional: an input whose outputs broke as many transactions as it has
        attempts (each abort forgets its attempts) fails for good without running again:
        dead-lettered, skipped or held like any record that failed for good."""
        outputs = self.outputs
        if outputs is None or not outputs.breakers:
            return None
        topic, partition = entry.tp
        count, why = outputs.broke((topic, partition, entry.offset))
        if count < (self.options.max_attempts or BREAKS_BEFORE_HOLDING):
            return None
        return TerminalError(f"its outputs broke {count} transactions: {why}")

    def acknowledged(
        self,
        entries: list[Entry],
        results: list[Any],
        awaiting: dict[int, Record],
        errors: dict[int, str],
    ) -> None:
        """Apply the delivery reports of an item's outputs: an input whose outputs failed
        fails, and the records of its shard after it in the item go back unstarted (they run
        again after it, so their outputs keep the order of their inputs)."""
        if not errors:
            return
        if self.outputs is not None:
            self.outputs.delivery_failed(len(errors))
        stopped: set[object] = set()
        for i, entry in enumerate(entries[: len(results)]):
            if i in errors and i in awaiting:
                error = ProduceError(f"an output was not delivered: {errors[i]}")
                results[i] = error
                self.failed(awaiting[i], error)
                if self.ordered:
                    stopped.add(self.stop_mark(entry))
            elif results[i] is None and stopped and self.stopped(entry, stopped):
                results[i] = NOT_STARTED

    def prepare_batch(self, entries: list[Entry]) -> tuple[list[Any], list[Record], list[int]]:
        """Records of a batch that may run, and results already known: undecodable records,
        and records that may not start (a revoked partition, a lowered release limit)."""
        results: list[Any] = [None] * len(entries)
        may_start = self.may_start
        outputs = self.outputs
        if not self.check_decoding and (outputs is None or not outputs.breakers):
            for entry in entries:
                if not may_start(entry):
                    break
            else:
                records = batch_records(entries, *self.deserializers)
                return results, records, list(range(len(entries)))
        records, runnable = [], []
        for i, entry in enumerate(entries):
            if not may_start(entry):
                results[i] = NOT_STARTED
                continue
            record = self.record(entry)
            bad = self.undecodable(record) or self.broke_transactions(entry)
            if bad is not None:
                results[i] = bad
                self.failed(record, bad)
            else:
                records.append(record)
                runnable.append(i)
        return results, records, runnable

    def batch_failed(
        self, results: list[Any], records: list[Record], runnable: list[int], error: BaseException
    ) -> None:
        for i, record in zip(runnable, records, strict=True):
            results[i] = error
            self.failed(record, error, forget=False)
        forget_frames(error)

    def isolates(self, error: BaseException, records: list[Record]) -> bool:
        """Whether a batch's failure is final for its records (a ``TerminalError``, or the
        last attempt of one of them): then each is tried again on its own first, so only a
        record that fails by itself is given up (dead-lettered, skipped or held)."""
        if len(records) < 2:
            return False
        if isinstance(error, TerminalError):
            return True
        most = self.options.max_attempts
        return most is not None and any(record.attempt >= most for record in records)

    def call_batch(
        self, records: list[Record], deliveries: Deliveries | None, awaiting: dict[int, Any]
    ) -> BaseException | None:
        """Call a batch handler (with the hooks around it) and produce its outputs; returns
        what it raised, or the outputs' failure."""
        try:
            if self.plain:
                returned = self.handler(records)
            else:
                for record in records:
                    self.hook("before_handle", record)
                returned = self.handler(records)
                for record in records:
                    self.hook("after_handle", record)
        except BaseException as exc:  # SystemExit too: a worker must never die of it
            return exc
        if returned is None:
            return None
        call = 0 if deliveries is None else deliveries.new_call()
        return self.emit(returned, deliveries, call, records, awaiting)

    def run_batch(self, entries: list[Entry]) -> list[Any]:
        results, records, runnable = self.prepare_batch(entries)
        if records:
            deliveries = self.deliveries()
            awaiting: dict[int, list[Record]] = {}  # the outputs of each handler call
            error = self.call_batch(records, deliveries, awaiting)
            if error is not None and self.isolates(error, records):
                forget_frames(error)
                for i, record in zip(runnable, records, strict=True):
                    alone = self.call_batch([record], deliveries, awaiting)
                    if alone is not None:
                        results[i] = alone
                        self.failed(record, alone)
            elif error is not None:
                self.batch_failed(results, records, runnable, error)
            if awaiting:
                assert deliveries is not None
                return Awaiting(results, deliveries, self.settle_batch(records, runnable, awaiting))
        return results

    def batch_acknowledged(
        self,
        results: list[Any],
        records: list[Record],
        runnable: list[int],
        awaiting: dict[int, list[Record]],
        errors: dict[int, str],
    ) -> None:
        """A handler call whose outputs failed fails every record it was given."""
        if not errors:
            return
        if self.outputs is not None:
            self.outputs.delivery_failed(len(errors))
        where = {id(record): i for i, record in zip(runnable, records, strict=True)}
        for call, why in errors.items():
            given = awaiting.get(call)
            if given is None:
                continue
            error = ProduceError(f"an output was not delivered: {why}")
            for record in given:
                i = where[id(record)]
                if results[i] is None:
                    results[i] = error
                    self.failed(record, error, forget=False)
            forget_frames(error)


class ThreadRunner:
    """``max_concurrency`` threads taking items from one queue.

    A few items more than there are threads wait in the queue, so a thread that finishes
    takes its next item at once instead of waiting for the consumer's thread to hand one
    out (the threads still bound how many handlers run at once)."""

    def __init__(
        self, work: Work, concurrency: int, inbox: queue.SimpleQueue[tuple[Any, ...]]
    ) -> None:
        self.queued_items = max(1, concurrency // 4)
        self.work = work
        self.inbox = inbox
        self.items: queue.SimpleQueue[Item | None] = queue.SimpleQueue()
        self.latencies: list[Latency] = []
        self.threads = [
            threading.Thread(target=self._worker, name=f"handler-{i}", daemon=True)
            for i in range(concurrency)
        ]
        for thread in self.threads:
            thread.start()

    def _worker(self) -> None:
        latency = Latency()
        self.latencies.append(latency)
        items, inbox, run = self.items, self.inbox, self.work.run
        while True:
            item = items.get()
            if item is None:
                return
            lock = self.work.transaction_lock
            if lock is not None:
                lock.enter()  # (left once its results are in the inbox)
            started = time.perf_counter()
            try:
                results = run(item)
            except BaseException as exc:  # never leave an item unreported (its shard waits)
                log.exception("the worker failed running %d records", len(item.entries))
                results = [exc] * len(item.entries)
            seconds = time.perf_counter() - started
            count = max(1, len(results))  # records joined after its last look did not run
            latency.observe(seconds / count, 1 if self.work.batch else count)
            inbox.put(("done", item.id, results, seconds, count))
            if lock is not None:
                lock.leave()
            del item, results  # (the last item's records are not kept while the worker waits)

    def submit(self, item: Item) -> None:
        self.items.put(item)

    def close(self, wait: float = 0.0) -> None:
        for _ in self.threads:
            self.items.put(None)
        deadline = time.monotonic() + wait
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when it is installed (it comes with uvicorn[standard]): its timers and task
    switches cost a fraction of asyncio's, which is most of what a coroutine handler costs."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class AsyncRunner:
    """One asyncio loop in its own thread; each item runs as a task, at most ``concurrency``
    at once. A few more items wait in the loop, so a finishing task's place is taken at once
    instead of after a round trip through the consumer's thread."""

    def __init__(
        self, work: Work, concurrency: int, inbox: queue.SimpleQueue[tuple[Any, ...]]
    ) -> None:
        self.work = work
        self.inbox = inbox
        self.limit = concurrency
        self.queued_items = max(1, concurrency // 4)
        self.latency = Latency()
        self.latencies = [self.latency]
        self.loop = new_event_loop()
        self._pending: list[Item] = []  # handed over by the consumer's thread
        self._lock = threading.Lock()
        self._waiting: deque[Item] = deque()  # loop thread only
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._finished: list[tuple[Any, ...]] = []  # results waiting to cross to the inbox
        self._entered = 0  # of their items, how many hold the transaction lock
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="handler-loop", daemon=True
        )
        self.threads = [self.thread]
        self.thread.start()

    def submit(self, item: Item) -> None:
        with self._lock:
            self._pending.append(item)
            first = len(self._pending) == 1
        if first:  # one wake-up per burst of items, not per item
            self.loop.call_soon_threadsafe(self._take_pending)

    def _take_pending(self) -> None:
        with self._lock:
            items, self._pending = self._pending, []
        self._waiting.extend(items)
        self._start_more()

    def _start_more(self) -> None:
        while self._waiting and self._running < self.limit:
            self._running += 1
            task = self.loop.create_task(self._run(self._waiting.popleft()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, item: Item) -> None:
        """Run one item and always report it, whatever happens: records the item did not get
        to (the runner closing) get no result, which the core counts as not started."""
        lock = self.work.transaction_lock
        entered = False
        started = time.perf_counter()
        results: list[Any] = []
        try:
            if lock is not None:
                while not lock.try_enter():  # a transaction is closing: wait for the next one
                    await asyncio.sleep(0.001)
                entered = True  # (left once its results are in the inbox)
            if self.work.batch:
                results = await self._run_batch(item.entries)
            else:
                results = await self._run_single(item, results)
        except asyncio.CancelledError:
            pass  # the runner is closing
        except BaseException as exc:
            log.exception("the handler loop failed running %d records", len(item.entries))
            results += [exc] * (len(item.entries) - len(results))
        finally:
            self._running -= 1
        count = max(1, len(results))  # records without a result did not run
        seconds = time.perf_counter() - started
        self.latency.observe(seconds / count, 1 if self.work.batch else count)
        if not self._finished:  # results of one loop iteration cross threads together
            self.loop.call_soon(self._flush)
        self._finished.append(("done", item.id, results, seconds, count))
        self._entered += entered
        self._start_more()

    def _flush(self) -> None:
        finished, self._finished = self._finished, []
        self.inbox.put(("done_many", finished))
        entered, self._entered = self._entered, 0
        lock = self.work.transaction_lock
        for _ in range(entered):
            assert lock is not None
            lock.leave()

    async def _call(
        self,
        argument: Any,
        deliveries: Deliveries | None,
        index: int,
        awaiting: dict[int, Any],
    ) -> BaseException | None:
        """Call the handler and produce its outputs; returns the failure, if any."""
        try:
            returned = self.work.handler(argument)
            if inspect.isawaitable(returned):
                returned = await returned
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # cancelled from outside: the runner is closing
            return exc  # raised by the handler itself: a failure like any other
        except BaseException as exc:
            return exc
        if returned is None:
            return None
        return self.work.emit(returned, deliveries, index, argument, awaiting)

    async def _run_single(self, item: Item, results: list[Any]) -> list[Any]:
        """Appends one result per record to ``results`` as it goes (returned as
        :class:`~sdk._output.Awaiting` when outputs wait for acknowledgements)."""
        work = self.work
        stopped: set[object] = set()
        failed = False
        deliveries = work.deliveries()
        awaiting: dict[int, Record] = {}
        lock = work.transaction_lock
        for entry in item.entries:
            if (
                (stopped and work.stopped(entry, stopped))
                or not work.may_start(entry)
                or (lock is not None and lock.closing and results)
            ):
                results.append(NOT_STARTED)
                failed = True
                continue
            record = work.record(entry)
            error = work.undecodable(record)
            if error is None and lock is not None:
                error = work.broke_transactions(entry)
            if error is None:
                work.hook("before_handle", record)
                error = await self._call(record, deliveries, len(results), awaiting)
                if error is None:
                    work.hook("after_handle", record)
            results.append(error)
            if error is None:
                if not failed and not awaiting:
                    item.finished = len(results)
            else:
                failed = True
                work.failed(record, error)
                if work.ordered:
                    stopped.add(work.stop_mark(entry))
        if awaiting:
            assert deliveries is not None
            return Awaiting(results, deliveries, work.settle_records(item.entries, awaiting))
        return results

    async def _run_batch(self, entries: list[Entry]) -> list[Any]:
        work = self.work
        results, records, runnable = work.prepare_batch(entries)
        if records:
            deliveries = work.deliveries()
            awaiting: dict[int, list[Record]] = {}
            error = await self._call_batch(records, deliveries, awaiting)
            if error is not None and work.isolates(error, records):
                forget_frames(error)
                for i, record in zip(runnable, records, strict=True):
                    alone = await self._call_batch([record], deliveries, awaiting)
                    if alone is not None:
                        results[i] = alone
                        work.failed(record, alone)
            elif error is not None:
                work.batch_failed(results, records, runnable, error)
            if awaiting:
                assert deliveries is not None
                return Awaiting(results, deliveries, work.settle_batch(records, runnable, awaiting))
        return results

    async def _call_batch(
        self, records: list[Record], deliveries: Deliveries | None, awaiting: dict[int, Any]
    ) -> BaseException | None:
        work = self.work
        for record in records:
            work.hook("before_handle", record)
        call = 0 if deliveries is None else deliveries.new_call()
        error = await self._call(records, deliveries, call, awaiting)
        if error is None:
            for record in records:
                work.hook("after_handle", record)
        return error

    def close(self, wait: float = 0.0) -> None:
        async def cancel() -> None:
            for task in list(self._tasks):
                task.cancel()

        if self.loop.is_running():
            future = asyncio.run_coroutine_threadsafe(cancel(), self.loop)
            with contextlib.suppress(Exception):
                future.result(max(wait, 1.0))
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(max(wait, 1.0))


Runner = ThreadRunner | AsyncRunner


def forget_frames(error: BaseException) -> None:
    """Drop the tracebacks of ``error`` and of the exceptions it chains to."""
    pending: list[BaseException | None] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        pending += (current.__cause__, current.__context__)


def is_coroutine_handler(handler: Callable[..., Any]) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = inspect.getattr_static(type(handler), "__call__", None)
    return call is not None and inspect.iscoroutinefunction(call)
