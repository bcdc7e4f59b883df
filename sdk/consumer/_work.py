"""What a worker does with a work item: records built, the handler called, outputs produced.

:class:`Work` runs an item's records one after another (or a batch handler once) and
returns one result per record it got to: ``None`` (success), the exception raised, or
``NOT_STARTED`` for records of a shard whose earlier record in the same item failed, for
records of a partition revoked before they started (the partition's next owner runs them, in
order: a revocation never waits for them), and for records at or beyond their partition's
release limit when the worker reaches them (a watermark lowered since they were handed out:
they go back to their shard and wait, in order). The runners (:mod:`sdk.consumer._runners`) call it
from their threads or their event loop.

Outputs are produced as the handler returns them, all of an item's with one delivery
callback (:mod:`sdk.produce._deliveries`): at least once, an item with outputs is returned as
:class:`~sdk.produce._deliveries.Awaiting`, which the consumer's thread keeps aside until its
outputs are acknowledged. While the producer's pause is closing (at least once), a worker
waits before its next record; while the transaction lock is (exactly once), a running item
starts no further record (the rest go back unstarted, in order).

A failure's traceback is dropped once it was logged and shown to the ``on_failure`` hook: it
holds the worker's frames, whose locals hold the item's records, so a kept exception would
keep every record of its item (and, through their own earlier failures, earlier items) in
memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sdk.consumer._failure_log import FailureLog
from sdk.engine._failures import DecodeError, RetriableError, TerminalError, describe
from sdk.engine._options import Options
from sdk.engine._record import Record
from sdk.engine._shards import NOT_STARTED, Entry, Item
from sdk.produce._deliveries import Awaiting, Deliveries, Pause, TransactionLock
from sdk.produce._output import Output, ProduceError, outputs_of
from sdk.produce._producer import Outputs

log = logging.getLogger("sdk.handler")

BREAKS_BEFORE_HOLDING = 3
"""Transactional, without ``max_attempts``: an input whose outputs broke this many
transactions is held (its shard waits) instead of aborting every transaction."""


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
            if log.isEnabledFor(logging.DEBUG):  # (as text: a kept log record keeps its args)
                log.debug("%s failed, will retry: %s", repr(record), describe(error))
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
        results: list[Any] = []
        append = results.append
        stopped: set[object] = set()
        failed = False
        handler, plain, check_decoding = self.handler, self.plain, self.check_decoding
        key_deserializer, value_deserializer = self.deserializers
        may_start = self.may_start
        outputs = self.outputs
        lock: TransactionLock | None = None
        pause: Pause | None = None  # at least once: closing, wait before the next record
        deliveries: Deliveries | None = None
        callback: Callable[[Any, Any], None] | None = None
        waiting: list[Any] | tuple[()] = ()  # at least once: the records whose outputs wait
        if outputs is not None:
            deliveries = Deliveries(outputs)
            callback = deliveries.delivered  # (one for every output of the item)
            lock, pause = outputs.lock, outputs.pause
            if lock is None:
                waiting = deliveries.sent
        for entry in entries:
            part = entry.part
            if pause is not None and pause.closing and results:
                pause.wait()  # (until the outputs waiting are acknowledged)
            if (
                part.revoked
                or (stopped and self.stopped(entry, stopped))
                or ((part.limit is not None or part.map_cap is not None) and not may_start(entry))
                or (lock is not None and lock.closing and results)
            ):
                append(NOT_STARTED)
                failed = True  # (what ``item.finished`` counts ends here)
                continue
            record = Record(entry.payload, entry.attempts + 1, key_deserializer, value_deserializer)
            error: BaseException | None = self.undecodable(record) if check_decoding else None
            if error is None and lock is not None and outputs.breakers:  # type: ignore[union-attr]
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
                    if returned is not None and deliveries is not None:
                        if type(returned) is Output:  # (the common case: one output)
                            problem = outputs.send_one(  # type: ignore[union-attr]
                                returned, deliveries, callback, len(results), entry
                            )
                            if problem is not None:
                                error = ProduceError(problem)
                        else:
                            error = self.emit(returned, deliveries, len(results), entry, callback)
                    if error is None:
                        append(None)
                        if not failed and not waiting:
                            item.finished = len(results)
                        continue
            append(error)
            failed = True
            self.failed(record, error)
            if self.ordered:
                stopped.add(self.stop_mark(entry))
        if deliveries is not None and deliveries.awaited:
            return Awaiting(results, deliveries, self.settle_records(entries, deliveries))
        return results

    # ---- outputs ------------------------------------------------------------------------

    def deliveries(self) -> Deliveries | None:
        """What an item's outputs report to (None without a producer of outputs)."""
        outputs = self.outputs
        return None if outputs is None else Deliveries(outputs)

    @property
    def transaction_lock(self) -> TransactionLock | None:
        outputs = self.outputs
        return None if outputs is None else outputs.lock

    def settle_records(
        self, entries: list[Entry], deliveries: Deliveries
    ) -> Callable[[list[Any], dict[int, str]], None]:
        def settle(results: list[Any], errors: dict[int, str]) -> None:
            self.acknowledged(entries, results, deliveries.given(), errors)

        return settle

    def emit(
        self,
        returned: Any,
        deliveries: Deliveries | None,
        index: int,
        given: Any,
        callback: Callable[[Any, Any], None] | None = None,
    ) -> BaseException | None:
        """Produce the outputs a handler returned for the record (or batch) at ``index``
        (``given``: the record or its entry, or the batch's records); returns the failure of
        its input, if any. ``callback``: the item's ``deliveries.delivered``, when the caller
        has it."""
        outputs = self.outputs
        if outputs is None or deliveries is None:
            return None
        try:
            found = outputs_of(returned)
        except TypeError as exc:
            return exc
        if not found:
            return None
        problem = outputs.send(found, deliveries, callback or deliveries.delivered, index, given)
        return None if problem is None else ProduceError(problem)

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
        given: dict[int, Any],
        errors: dict[int, str],
    ) -> None:
        """Apply the failed deliveries of an item's outputs: an input whose outputs failed
        fails, and the records of its shard after it in the item go back unstarted (they run
        again after it, so their outputs keep the order of their inputs)."""
        if not errors:
            return
        if self.outputs is not None:
            self.outputs.delivery_failed(len(errors))
        stopped: set[object] = set()
        for i, entry in enumerate(entries[: len(results)]):
            if i in errors and i in given and results[i] is None:
                error = ProduceError(f"an output was not delivered: {errors[i]}")
                results[i] = error
                self.failed(self.record(entry), error)
                if self.ordered:
                    stopped.add(self.stop_mark(entry))
            elif results[i] is None and stopped and self.stopped(entry, stopped):
                results[i] = NOT_STARTED


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
