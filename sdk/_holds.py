"""The consumer's side of gating: watermarks become release limits, and long holds are told.

When a gate's snapshot changes, every assigned partition's release limit becomes its
watermark (records at or beyond it may not start). How long partitions were held until
released is measured, and a partition held longer than the gate's ``hold_log_after`` gets a
rate-limited log line naming the dependency groups it waits for.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from sdk._core import TP, WorkCore
from sdk._gating import Gate
from sdk._runners import Latency
from sdk._stats import log_hold


class Holds:
    def __init__(self, gate: Gate, core: WorkCore) -> None:
        self.gate = gate
        self.core = core
        self.latency = Latency()  # how long gated partitions waited for release
        self._logged: dict[TP, float] = {}

    def apply(self, now: float) -> None:
        """Make the snapshot in force the release limits."""
        gate, core = self.gate, self.core
        for tp in list(core.partitions):
            held_for = core.set_limit(tp, gate.limit(*tp), now)
            if held_for is not None:
                self.latency.observe(held_for)
                self._logged.pop(tp, None)

    def log_long(self, now: float, partitions: Mapping[TP, Mapping[str, Any]]) -> None:
        """A line per partition held longer than ``hold_log_after`` (at most that often),
        explained in the background: a source may ask the network."""
        every = self.gate.hold_log_after
        for tp, view in partitions.items():
            held_for = view.get("held_for", 0.0)
            if held_for < every or now - self._logged.get(tp, 0.0) < every:
                continue
            self._logged[tp] = now
            offset = view["limit"] if view["limit"] is not None else 0
            threading.Thread(
                target=log_hold,
                args=(self.gate, tp, offset, held_for),
                name="gate-explain",
                daemon=True,
            ).start()
