"""How many records one work item carries, from how fast the handler has been.

Fast handlers (a full item runs in under 10 ms) get full items: one hand-off carries many
records, and spreading them over threads would only trade the GIL back and forth. Slower
handlers get guided self-scheduling: a quarter of the waiting records spread over the
workers, and no more than about 50 ms of work per item, so the last records are spread
evenly too. (Smaller items cost more hand-offs than they save: with 100 workers and 3 ms
handlers, 10 ms items kept a fifth of the workers waiting for the consumer's thread.)
Handler speed is the median per-record time of recent items: robust to the odd item that
waited for the GIL.

In the ordered modes an item of a slow handler takes other keys' records only when there
are more shards ready than workers: while every ready shard can have a worker of its own,
joining them would run keys one after another that could run side by side.
"""

from __future__ import annotations

import statistics
from collections import deque

from sdk.engine._options import Options
from sdk.engine._shards import ItemShape

FULL_ITEM_SECONDS = 0.01
"""Handlers that run a full item within this are fast: they get full items."""
ITEM_SECONDS = 0.05
"""About how long one work item may run when handlers are slow and there is a backlog."""


class ItemSizer:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.ordered = options.ordering != "unordered"
        self._samples: deque[float] = deque(maxlen=64)  # seconds per record, by item
        self._new = 0
        self.record_seconds: float | None = None

    def observe(self, seconds: float, records: int) -> None:
        """An item of ``records`` records ran for ``seconds``."""
        samples = self._samples
        samples.append(seconds / max(1, records))
        self._new += 1
        # Trust the median only once a few items were timed (one lucky fast record must not
        # make a slow handler look fast), then refresh it every 16 items.
        if len(samples) >= 8 and (self.record_seconds is None or self._new >= 16):
            self.record_seconds = statistics.median(samples)
            self._new = 0

    def shape(self, waiting: int, ready: int) -> ItemShape:
        """The shape of the next items, with ``waiting`` records not yet started, ``ready``
        shards of them may start now."""
        options = self.options
        if options.batch_size is not None:
            # A batch holds one record per shard in the ordered modes (the handler may treat
            # a batch's records in any order).
            size = options.batch_size
            return ItemShape(records=size, run=1 if self.ordered else size, shards=size)
        fast = self.fast()
        size = self.size(waiting, fast)
        if self.ordered:
            # A shard's records run one after another anyway, so a worker may take a long run
            # of them (no hand-off between them); other shards join only within ``size``.
            shards = size if fast else max(1, min(size, ready // options.max_concurrency))
            return ItemShape(records=size, run=options.max_item_records, shards=shards)
        return ItemShape(records=size, run=size, shards=size)

    def fast(self) -> bool:
        """Whether a full item of the handler's records runs within ``FULL_ITEM_SECONDS``."""
        per_record = self.record_seconds
        return (
            per_record is not None
            and per_record * self.options.max_item_records <= FULL_ITEM_SECONDS
        )

    def size(self, waiting: int, fast: bool) -> int:
        per_record = self.record_seconds
        largest = self.options.max_item_records
        if per_record is None:
            return 1
        if fast:
            return largest
        guided = waiting // (4 * self.options.max_concurrency)
        return max(1, min(largest, guided, int(ITEM_SECONDS / per_record)))
