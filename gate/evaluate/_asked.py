"""Which records' timestamps a gate asks for, and taking them in (pure).

Records older than the gate's first poll have only lower bounds for their age, until their
own timestamps place them in the partition's history: :class:`TimesAsked` names the records
whose timestamps would make an age exact (each once, again after ``ASK_AGAIN_AFTER`` when no
answer came), and takes in what the poller read for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gate.evaluate._group import GroupResult
from gate.evaluate._lag import EndHistory
from gate.evaluate._state import GateState, RecordAt
from gate.evaluate._watermark import Partition

WANTED_AT_MOST = 64
"""Records whose timestamps are read at most per poll, over all gates."""
WANTED_PER_PARTITION = 8
"""Records whose timestamps a gate asks for at once per partition, at most."""
ASK_AGAIN_AFTER = 60.0
"""Seconds after which a record whose timestamp was asked for but not answered (the read
failed or timed out) is asked for again."""
OLDEST_TIMESTAMP = 1e9
"""Record timestamps before this (September 2001, in seconds since the epoch) are taken as
unset: a producer's 0 or a clock that was never set."""
MAX_TRIED = 4096
"""Records remembered as asked for per partition, at most (the lowest offsets go first)."""
PRUNE_TRIED_AT = 256
"""Records remembered as asked for on a partition beyond which those below the lowest offset
that counts there are forgotten."""
_NEVER = float("inf")


@dataclass
class TimesAsked:
    """The records whose timestamps a gate asked for (see the module's docstring)."""

    tried: dict[Partition, dict[int, float]] = field(default_factory=dict)
    """Per partition, the offsets whose records' timestamps were asked for, and when they may
    be asked for again (never, once answered)."""

    def wanted(
        self,
        state: GateState,
        ends: Mapping[Partition, EndHistory],
        reevaluated: Mapping[str, GroupResult],
        now: float,
        limit: int = WANTED_AT_MOST,
    ) -> list[RecordAt]:
        """The records whose timestamps would make ages of the last state exact: per
        partition, the watermark and the groups' committed offsets whose ages are not exact
        and that are older than the gate's history (below the first end offset it saw), the
        oldest first, at most ``WANTED_PER_PARTITION`` of them, and ``limit`` in all. Each is
        handed out once (again after ``ASK_AGAIN_AFTER`` seconds when :meth:`seed` got no
        answer for it). Once every watermark is within the history, nothing is wanted and
        this costs a look at each partition; before, a look at the positions of the groups
        the last poll evaluated (those with lag: only they can have records older than the
        history left to process): ``reevaluated``. ``now``: the present on the histories'
        clock."""
        firsts = self._before_history(state, ends)
        if not firsts:
            return []
        lowest, offsets = _inexact_offsets(state, firsts, reevaluated)
        wanted: list[RecordAt] = []
        for tp in firsts:
            room = min(WANTED_PER_PARTITION, limit - len(wanted))
            if room <= 0:
                break
            asked = self._to_ask(tp, lowest[tp], sorted(offsets[tp]), now)[:room]
            self._note_asked(tp, asked, now)
            wanted.extend((tp[0], tp[1], offset) for offset in asked)
        return wanted

    def _before_history(
        self, state: GateState, ends: Mapping[Partition, EndHistory]
    ) -> dict[Partition, int]:
        """The partitions whose watermark is below the first end offset their history saw
        (or has none), with that end; the others forget what was asked there."""
        firsts: dict[Partition, int] = {}
        for tp, part in state.partitions.items():
            history = ends.get(tp)
            watermark = part.watermark
            if history is None or (watermark is not None and watermark >= history.ends[0]):
                self.tried.pop(tp, None)  # every offset that counts is within the history
            else:
                firsts[tp] = history.ends[0]
        return firsts

    def _to_ask(
        self, tp: Partition, lowest: int | None, offsets: list[int], now: float
    ) -> list[int]:
        """Those of ``offsets`` not asked for yet on ``tp``, or whose asking is due again;
        when many were asked, those below ``lowest`` are forgotten."""
        tried = self.tried.setdefault(tp, {})
        if len(tried) > PRUNE_TRIED_AT:
            kept = sorted(o for o in tried if lowest is None or o >= lowest)[-MAX_TRIED:]
            tried = self.tried[tp] = {offset: tried[offset] for offset in kept}
        return [offset for offset in offsets if tried.get(offset, now) <= now]

    def _note_asked(self, tp: Partition, offsets: list[int], now: float) -> None:
        tried = self.tried[tp]
        for offset in offsets:
            tried[offset] = now + ASK_AGAIN_AFTER

    def seed(
        self,
        times: Mapping[RecordAt, float | None],
        ends: Mapping[Partition, EndHistory],
        shift: float,
    ) -> int:
        """Take in the timestamps read for records (seconds since the epoch, on the clock of
        the broker or the producer; None: the record is gone, or has none): each places its
        record in its partition's history (see :meth:`gate.evaluate._lag.EndHistory.seed`), and the
        next state's ages there are exact. Records on other partitions are left alone. A
        record answered is never asked for again, whether its time was taken or not.
        Returns how many were taken. ``shift``: the poll's wall clock less the histories'."""
        taken = 0
        for (topic, partition, offset), timestamp in times.items():
            tp = (topic, partition)
            history = ends.get(tp)
            if history is None:
                continue
            self.tried.setdefault(tp, {})[offset] = _NEVER
            if timestamp is not None and timestamp >= OLDEST_TIMESTAMP:
                # On the histories' clock: the poll's wall clock less its offset to it.
                taken += history.seed(offset, timestamp - shift)
        return taken


def _inexact_offsets(
    state: GateState, firsts: Mapping[Partition, int], reevaluated: Mapping[str, GroupResult]
) -> tuple[dict[Partition, int | None], dict[Partition, set[int]]]:
    """Per partition of ``firsts``: the lowest offset below its first end that counts
    (the watermark, or a group's committed offset; None: none), and the offsets below it
    whose ages are not exact."""
    lowest: dict[Partition, int | None] = {}
    found: dict[Partition, set[int]] = {}
    for tp in firsts:
        part = state.partitions[tp]
        lowest[tp] = watermark = part.watermark
        found[tp] = {watermark} if watermark is not None and not part.waiting_exact else set()
    for result in reevaluated.values():
        for tp, position in result.positions.items():
            first = firsts.get(tp)
            committed = position[0]
            if first is None or committed is None or committed >= first:
                continue
            below = lowest[tp]
            if below is None or committed < below:
                lowest[tp] = committed
            if not position[5]:
                found[tp].add(committed)
    return lowest, found
