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

What a worker does with an item is :class:`~sdk.consumer._work.Work`'s (the asynchronous runner
follows the same steps, awaiting coroutine handlers).
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

from sdk.consumer._batches import Batches
from sdk.consumer._work import BREAKS_BEFORE_HOLDING, Work, forget_frames
from sdk.engine._record import Record
from sdk.engine._shards import NOT_STARTED, Entry, Item
from sdk.produce._deliveries import Awaiting, Deliveries

__all__ = [
    "BREAKS_BEFORE_HOLDING",
    "LATENCY_BUCKETS",
    "AsyncRunner",
    "Latency",
    "Runner",
    "ThreadRunner",
    "Work",
    "forget_frames",
    "is_coroutine_handler",
]

log = logging.getLogger("sdk.handler")

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
        work = self.work
        items, inbox = self.items, self.inbox
        run = Batches(work).run if work.batch else work.run
        outputs = self.work.outputs
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
            elif outputs is not None and type(results) is Awaiting:
                outputs.serve()  # (the delivery reports of items before it, at least)
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
        self.batches = Batches(work)
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
        return self.work.emit(returned, deliveries, index, argument)

    async def _run_single(self, item: Item, results: list[Any]) -> list[Any]:
        """Appends one result per record to ``results`` as it goes (returned as
        :class:`~sdk.produce._output.Awaiting` when outputs wait for acknowledgements)."""
        work = self.work
        stopped: set[object] = set()
        failed = False
        deliveries = work.deliveries()
        lock = work.transaction_lock
        pause = None if work.outputs is None else work.outputs.pause
        # At least once: the records whose outputs wait for their acknowledgement.
        waiting: list[Any] | tuple[()] = () if deliveries is None or lock else deliveries.sent
        # At least once a coroutine does not wait at the pause (it would block the event
        # loop): the rest of its item goes back unstarted, even if the pause ends meanwhile.
        halted = False
        for entry in item.entries:
            if pause is not None and pause.closing and results:
                halted = True
            if (
                halted
                or (stopped and work.stopped(entry, stopped))
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
                error = await self._call(record, deliveries, len(results))
                if error is None:
                    work.hook("after_handle", record)
            results.append(error)
            if error is None:
                if not failed and not waiting:
                    item.finished = len(results)
            else:
                failed = True
                work.failed(record, error)
                if work.ordered:
                    stopped.add(work.stop_mark(entry))
        if deliveries is not None and deliveries.awaited:
            return Awaiting(results, deliveries, work.settle_records(item.entries, deliveries))
        return results

    async def _run_batch(self, entries: list[Entry]) -> list[Any]:
        work, batches = self.work, self.batches
        results, records, runnable = batches.prepare(entries)
        if records:
            deliveries = work.deliveries()
            error = await self._call_batch(records, deliveries)
            if error is not None and batches.isolates(error, records):
                forget_frames(error)
                for i, record in zip(runnable, records, strict=True):
                    alone = await self._call_batch([record], deliveries)
                    if alone is not None:
                        results[i] = alone
                        work.failed(record, alone)
            elif error is not None:
                batches.failed(results, records, runnable, error)
            if deliveries is not None and deliveries.awaited:
                settle = batches.settle(records, runnable, deliveries)
                return Awaiting(results, deliveries, settle)
        return results

    async def _call_batch(
        self, records: list[Record], deliveries: Deliveries | None
    ) -> BaseException | None:
        work = self.work
        for record in records:
            work.hook("before_handle", record)
        call = 0 if deliveries is None else deliveries.new_call()
        error = await self._call(records, deliveries, call)
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


def is_coroutine_handler(handler: Callable[..., Any]) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = inspect.getattr_static(type(handler), "__call__", None)
    return call is not None and inspect.iscoroutinefunction(call)
