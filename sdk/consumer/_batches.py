"""What a worker does with a batch handler's item: one call for the item's records.

:class:`Batches` runs on a :class:`~sdk.consumer._work.Work` (the records built, failures
logged, outputs produced) and returns one result per record, as ``Work.run`` does for a
record handler. Records that may not start (a revoked partition, a lowered release limit) are
``NOT_STARTED`` and records that cannot be decoded fail, without the call; the call's failure
is every record's. A failure that is final for its records (a ``TerminalError``, or the last
attempt of one of them) is isolated first: each record is tried again alone, so only a record
that fails by itself is given up. The asynchronous runner makes the same steps with an
awaited call (:mod:`sdk.consumer._runners`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sdk.consumer._work import Work, forget_frames
from sdk.engine._failures import TerminalError
from sdk.engine._record import Record, batch_records
from sdk.engine._shards import NOT_STARTED, Entry, Item
from sdk.produce._deliveries import Awaiting, Deliveries
from sdk.produce._output import ProduceError


class Batches:
    """A batch handler's items: prepared, called (isolated when final), settled."""

    def __init__(self, work: Work) -> None:
        self.work = work

    def run(self, item: Item) -> list[Any]:
        """Call the handler once for the item's records that may run (see the module)."""
        work = self.work
        results, records, runnable = self.prepare(item.entries)
        if records:
            deliveries = work.deliveries()
            error = self.call(records, deliveries)
            if error is not None and self.isolates(error, records):
                forget_frames(error)
                for i, record in zip(runnable, records, strict=True):
                    alone = self.call([record], deliveries)
                    if alone is not None:
                        results[i] = alone
                        work.failed(record, alone)
            elif error is not None:
                self.failed(results, records, runnable, error)
            if deliveries is not None and deliveries.awaited:
                return Awaiting(results, deliveries, self.settle(records, runnable, deliveries))
        return results

    def prepare(self, entries: list[Entry]) -> tuple[list[Any], list[Record], list[int]]:
        """Records of a batch that may run, and results already known: undecodable records,
        and records that may not start (a revoked partition, a lowered release limit)."""
        work = self.work
        results: list[Any] = [None] * len(entries)
        may_start = work.may_start
        outputs = work.outputs
        if not work.check_decoding and (outputs is None or not outputs.breakers):
            for entry in entries:
                if not may_start(entry):
                    break
            else:
                records = batch_records(entries, *work.deserializers)
                return results, records, list(range(len(entries)))
        records, runnable = [], []
        for i, entry in enumerate(entries):
            if not may_start(entry):
                results[i] = NOT_STARTED
                continue
            record = work.record(entry)
            bad = work.undecodable(record) or work.broke_transactions(entry)
            if bad is not None:
                results[i] = bad
                work.failed(record, bad)
            else:
                records.append(record)
                runnable.append(i)
        return results, records, runnable

    def call(self, records: list[Record], deliveries: Deliveries | None) -> BaseException | None:
        """Call the batch handler (with the hooks around it) and produce its outputs; returns
        what it raised, or the outputs' failure."""
        work = self.work
        try:
            if work.plain:
                returned = work.handler(records)
            else:
                for record in records:
                    work.hook("before_handle", record)
                returned = work.handler(records)
                for record in records:
                    work.hook("after_handle", record)
        except BaseException as exc:  # SystemExit too: a worker must never die of it
            return exc
        if returned is None or deliveries is None:
            return None
        return work.emit(returned, deliveries, deliveries.new_call(), records)

    def isolates(self, error: BaseException, records: list[Record]) -> bool:
        """Whether a batch's failure is final for its records (a ``TerminalError``, or the
        last attempt of one of them): then each is tried again on its own first, so only a
        record that fails by itself is given up (dead-lettered, skipped or held)."""
        if len(records) < 2:
            return False
        if isinstance(error, TerminalError):
            return True
        most = self.work.options.max_attempts
        return most is not None and any(record.attempt >= most for record in records)

    def failed(
        self, results: list[Any], records: list[Record], runnable: list[int], error: BaseException
    ) -> None:
        """The call failed: so did each of its records."""
        for i, record in zip(runnable, records, strict=True):
            results[i] = error
            self.work.failed(record, error, forget=False)
        forget_frames(error)

    def settle(
        self, records: list[Record], runnable: list[int], deliveries: Deliveries
    ) -> Callable[[list[Any], dict[int, str]], None]:
        """What applies the delivery reports of the item's outputs to its results."""

        def settle(results: list[Any], errors: dict[int, str]) -> None:
            self.acknowledged(results, records, runnable, deliveries.given(), errors)

        return settle

    def acknowledged(
        self,
        results: list[Any],
        records: list[Record],
        runnable: list[int],
        calls: dict[int, list[Record]],
        errors: dict[int, str],
    ) -> None:
        """A handler call whose outputs failed fails every record it was given."""
        if not errors:
            return
        work = self.work
        if work.outputs is not None:
            work.outputs.delivery_failed(len(errors))
        where = {id(record): i for i, record in zip(runnable, records, strict=True)}
        for call, why in errors.items():
            given = calls.get(call)
            if given is None:
                continue
            error = ProduceError(f"an output was not delivered: {why}")
            for record in given:
                i = where[id(record)]
                if results[i] is None:
                    results[i] = error
                    work.failed(record, error, forget=False)
            forget_frames(error)
