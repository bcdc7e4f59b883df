"""The consumer's side of gating: watermarks become release limits, and long holds are told.

When a gate's snapshot changes, every assigned partition's release limit becomes its
watermark (records at or beyond it may not start). How long partitions were held until
released is measured, and a partition whose first held record has waited longer than the
gate's ``hold_log_after`` gets a rate-limited log line naming the dependency groups it waits
for. That record's wait counts from when it was first seen held, however often the watermark
moved meanwhile: a dependency far behind that commits now and then still holds records long.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

from sdk.consumer._runners import Latency
from sdk.engine._core import TP, WorkCore
from sdk.gating._gating import Gate

log = logging.getLogger("sdk")


class Holds:
    def __init__(self, gate: Gate, core: WorkCore) -> None:
        self.gate = gate
        self.core = core
        self.latency = Latency()  # how long gated partitions waited for release
        self._logged: dict[TP, float] = {}
        # Per partition, (end, seen): at ``seen`` the records below offset ``end`` were held.
        self._seen_held: dict[TP, deque[tuple[int, float]]] = {}

    def apply(self, now: float) -> None:
        """Make the snapshot in force the release limits."""
        gate, core = self.gate, self.core
        for tp in list(core.partitions):
            held_for = core.set_limit(tp, gate.limit(*tp), now)
            if held_for is not None:
                self.latency.observe(held_for)

    def held_for(self, tp: TP, view: Mapping[str, Any], now: float) -> float:
        """How long the first record ``tp`` holds (at its limit) has been seen held; 0 when
        it holds none. Called about every half second, with the partition's view."""
        limit, held = view.get("limit"), view.get("gate_held", 0)
        if limit is None or not held:
            self._seen_held.pop(tp, None)
            return 0.0
        seen = self._seen_held.setdefault(tp, deque())
        while seen and seen[0][0] <= limit:  # those records were released since
            seen.popleft()
        end = limit + held
        if not seen or seen[-1][0] < end:
            seen.append((end, now))
        return now - seen[0][1]

    def log_long(self, now: float, partitions: Mapping[TP, Mapping[str, Any]]) -> None:
        """A line per partition whose first held record has waited longer than
        ``hold_log_after`` (at most that often), explained in the background: a source may
        ask the network."""
        every = self.gate.hold_log_after
        for tp in [tp for tp in self._seen_held if tp not in partitions]:
            del self._seen_held[tp]  # revoked
        for tp, view in partitions.items():
            held_for = self.held_for(tp, view, now)
            if held_for < every or now - self._logged.get(tp, -every) < every:
                continue
            self._logged[tp] = now
            offset = view["limit"] if view["limit"] is not None else 0
            threading.Thread(
                target=log_hold,
                args=(self.gate, tp, offset, held_for),
                name="gate-explain",
                daemon=True,
            ).start()


def log_hold(gate: Gate, tp: TP, offset: int, held_for: float) -> None:
    """One line saying which dependency groups a held partition waits for."""
    why = gate.explain(tp[0], tp[1], offset)
    waiting = why.get("waiting_for")
    if waiting:
        detail = ", ".join(_behind(w) for w in waiting)
    elif why["snapshot_version"] is None:
        errors = [f"{name}: {s['error']}" for name, s in why["sources"].items() if s["error"]]
        detail = "a first snapshot (none yet from its sources" + (
            f"; {'; '.join(errors)})" if errors else ")"
        )
    elif why["watermark"] is None:
        detail = "a watermark (none there yet: a dependency has not committed there)"
    else:
        detail = f"the watermark to pass it (at {why['watermark']})"
    log.warning(
        "%s[%d]: records from offset %d held for %.0fs by gate %s: waiting for %s",
        tp[0],
        tp[1],
        offset,
        held_for,
        gate.name,
        detail,
    )


def _behind(waiting: dict[str, Any]) -> str:
    """One dependency group a held record waits for, as :meth:`Gate.explain` gives it."""
    if waiting.get("committed") is None:
        return f"{waiting['group']} (no committed offset there)"
    return (
        f"{waiting['group']} (committed {waiting['committed']}, behind by {waiting['behind_by']})"
    )
