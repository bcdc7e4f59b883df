"""A bounded in-memory history of each gate, for the status page's charts.

One point every ``step`` seconds (the last state seen in that step); points older than
``span`` seconds are dropped (and never more than ``span / step`` are kept):
per dependency group its lag in records (over all partitions) and in seconds (the oldest
record it has not processed, over all partitions), and for the gate the sum of its
watermarks (its rise is the release rate), the records held back, and the records released
to the dependent that it has not processed. Pure: fed with gate states. Points are placed by
the wall clock, as charts show them: when it is stepped back, the history starts afresh.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from typing import Any

from gate.evaluate._state import GateState


class GateHistory:
    def __init__(self, step: float = 5.0, span: float = 900.0) -> None:
        self.step = step
        self.span = span
        self.points: deque[dict[str, Any]] = deque(maxlen=max(2, int(span / step)))

    def record(self, state: GateState) -> None:
        """Keep ``state`` as the point of its step (the step's last state wins)."""
        at = state.snapshot.polled_at
        slot = at - at % self.step
        point = point_of(state, slot)
        points = self.points
        if points and slot < points[-1]["t"]:
            points.clear()  # the wall clock went back: the old points are of another time
        if points and points[-1]["t"] == slot:
            points[-1] = point
        else:
            points.append(point)
        while points and points[0]["t"] < slot - self.span:
            points.popleft()

    def to_json(
        self,
        groups: Collection[str] | None = None,
        points: Sequence[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The points, with every group's lag, or only those of ``groups``. ``points``: the
        points taken earlier (``list(history.points)``, on the thread that records them),
        for building the answer on another thread."""
        shown: list[dict[str, Any]] = list(self.points if points is None else points)
        if groups is not None:
            shown = [
                {**point, "groups": {g: point["groups"][g] for g in groups if g in point["groups"]}}
                for point in shown
            ]
        return {"step_s": self.step, "span_s": self.span, "points": shown}


def point_of(state: GateState, slot: float) -> dict[str, Any]:
    groups = {
        group: {"lag": lag.records, "lag_s": lag.seconds} for group, lag in state.group_lags.items()
    }
    released = sum(part.watermark or 0 for part in state.partitions.values())
    verdict = state.verdict
    return {
        "t": slot,
        "released": released,
        "waiting": verdict.records_waiting,
        "unprocessed": verdict.released_unprocessed,
        "groups": groups,
    }
