"""What the service tells an operator tailing its log: one line when something changes (a gate
turns stuck or missing and flows again, a group enters or leaves STALLED, MISSING or REWOUND,
a group rewinds, a log moves backwards, offsets are lost, poll cycles overrun the interval),
never one per poll. Nothing here performs I/O but logging."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from gate.evaluate._state import MISSING, REWOUND, STALLED, DependencyStatus, GateState
from gate.report._report import verdict_json
from gate.service._metrics import GateMetrics

log = logging.getLogger("gate")

ALARMS = (STALLED, MISSING, REWOUND)
"""The group statuses whose start and end are logged."""
FIT_AGAIN_CYCLES = 3
"""Cycles in a row within the poll interval before overrunning is said to be over."""


class GateEvents:
    """Logs each gate's changes, remembering what it last said so as to say it once."""

    def __init__(self, metrics: GateMetrics, rewind_policy: str) -> None:
        self.metrics = metrics
        self.rewind_policy = rewind_policy
        self._verdicts: dict[str, str] = {}
        """Per gate, the verdict state last logged ("flowing" and "released" count as one)."""
        self._statuses: dict[str, Mapping[str, DependencyStatus]] = {}
        self._missing: dict[str, tuple[str, ...]] = {}
        """Per gate, the topics and partitions last logged as not existing."""

    def record(self, state: GateState, now: float) -> None:
        """Log what changed with ``state`` (``now``: the present on its wall clock)."""
        self._log_offsets(state)
        self._log_missing(state)
        self._log_groups(state)
        self._log_verdict(state, now)

    def _log_verdict(self, state: GateState, now: float) -> None:
        """One line when the gate turns stuck, and one when it flows (or is released) again.
        A missing topic or partition has its own lines (:meth:`_log_missing`)."""
        shown = state.verdict.state
        if shown == "released":
            shown = "flowing"
        before = self._verdicts.get(state.gate, "flowing")
        if shown == before:
            return
        self._verdicts[state.gate] = shown
        if shown == "stuck":
            log.warning("gate %s: %s (alarm)", state.gate, verdict_json(state, now)["text"])
        elif shown == "flowing":
            text = verdict_json(state, now)["text"]
            log.info("gate %s: no longer %s: %s", state.gate, before, text)

    def _log_groups(self, state: GateState) -> None:
        """One line when a group enters STALLED, MISSING or REWOUND, one when it leaves. A
        rewind or lost offsets already said in detail (:meth:`_log_offsets`) is not repeated."""
        before = self._statuses.get(state.gate, {})
        self._statuses[state.gate] = state.groups
        detailed = {r.group for r in state.rewinds} | {lost.group for lost in state.lost}
        for group, status in state.groups.items():
            was = before.get(group)
            if status == was:
                continue
            if status in ALARMS and group not in detailed:
                log.warning(
                    "gate %s: group %s is %s: %s",
                    state.gate,
                    group,
                    status.value,
                    _meaning(status, group in state.verdict.holding),
                )
            elif was in ALARMS and status not in ALARMS:
                log.info(
                    "gate %s: group %s is no longer %s (now %s)",
                    state.gate,
                    group,
                    was.value,
                    status.value,
                )

    def _log_missing(self, state: GateState) -> None:
        """One line when topics or partitions of a gate stop existing, one when they appear."""
        missing = state.verdict.missing
        before = self._missing.get(state.gate, ())
        if missing == before:
            return
        self._missing[state.gate] = missing
        gone = [name for name in missing if name not in before]
        back = [name for name in before if name not in missing]
        if gone:
            log.warning(
                "gate %s: %s not exist on the cluster: nothing there is released (alarm)",
                state.gate,
                f"{', '.join(gone)} {'does' if len(gone) == 1 else 'do'}",
            )
        if back:
            log.info("gate %s: %s exist(s) now", state.gate, ", ".join(back))

    def _log_offsets(self, state: GateState) -> None:
        """Rewinds, logs moving backwards and lost offsets, each as it is seen."""
        for rewind in state.rewinds:
            self.metrics.rewinds.labels(state.gate, rewind.group).inc()
            log.warning(
                "gate %s: group %s rewound %s[%d] from %d to %d; the watermark follows policy %r",
                state.gate,
                rewind.group,
                rewind.topic,
                rewind.partition,
                rewind.before,
                rewind.after,
                self.rewind_policy,
            )
        for reset in state.resets:
            log.warning(
                "gate %s: the log of %s[%d] moved backwards (end %s -> %s: the topic was "
                "deleted or recreated); its dependency history starts afresh",
                state.gate,
                reset.topic,
                reset.partition,
                "unknown" if reset.before is None else reset.before,
                "gone" if reset.after is None else reset.after,
            )
        for lost in state.lost:
            self.metrics.lost_offsets.labels(state.gate, lost.group).inc()
            log.warning(
                "gate %s: group %s no longer has a committed offset on %s[%d] (was %d): "
                "group deleted or offsets expired; nothing is released there until it commits",
                state.gate,
                lost.group,
                lost.topic,
                lost.partition,
                lost.last,
            )


def _meaning(status: DependencyStatus, holding: bool) -> str:
    held = "it holds records back" if holding else "it holds nothing back now"
    if status == STALLED:
        return f"it has lag and its committed offset has not moved ({held})"
    if status == MISSING:
        return f"it has no committed offset (never committed, deleted or expired; {held})"
    return f"its committed offset went backwards ({held})"


@dataclass(frozen=True, slots=True)
class CycleTiming:
    """Where the time of one poll cycle went, in seconds: its parts add up to ``total``, the
    time from when the cycle was due to when it ended."""

    interval: float
    started_late: float
    """The cycle began this long after it was due (the event loop was busy elsewhere)."""
    poll: float
    """Reading the cluster (the admin client's requests, and timestamps of old records)."""
    evaluation: float
    """Evaluating the gates from the poll."""
    rest: float
    """The rest of the cycle: handing it to a worker thread and back, publishing."""

    @property
    def total(self) -> float:
        return self.started_late + self.poll + self.evaluation + self.rest

    @property
    def late(self) -> bool:
        return self.total > self.interval

    def cause(self) -> str:
        """What made the cycle late: its largest part."""
        parts = {
            "reading the cluster": self.poll,
            "evaluating the gates": self.evaluation,
            "the event loop being busy before the cycle began (requests served meanwhile)": (
                self.started_late
            ),
            "waiting for a worker thread and publishing": self.rest,
        }
        return max(parts, key=lambda name: parts[name])


def cycle_timing(
    interval: float,
    due: float,
    started: float,
    ended: float,
    poll: float,
    evaluation: float,
) -> CycleTiming:
    """The parts of a cycle due at ``due`` that ran from ``started`` to ``ended`` (monotonic
    seconds), of which ``poll`` and ``evaluation`` were measured inside it. The parts are
    clamped so that they add up to ``ended - due`` whatever the clocks' rounding."""
    span = max(0.0, ended - started)
    poll = min(max(0.0, poll), span)
    evaluation = min(max(0.0, evaluation), span - poll)
    return CycleTiming(
        interval, max(0.0, started - due), poll, evaluation, span - poll - evaluation
    )


class Overruns:
    """Counts cycles longer than the interval and logs when they start and stop overrunning
    it: the warning's figures add up to the cycle's time and name what made it late; "fit
    again" only after :data:`FIT_AGAIN_CYCLES` cycles in a row fit (no line per cycle when
    they alternate)."""

    def __init__(self, metrics: GateMetrics) -> None:
        self.metrics = metrics
        self.count = 0
        self.overrunning = False
        self.last: CycleTiming | None = None
        self._fitting = 0

    def note(self, timing: CycleTiming) -> None:
        self.last = timing
        if timing.late:
            self.count += 1
            self.metrics.poll_overruns.inc()
            self._fitting = 0
            if not self.overrunning:
                self.overrunning = True
                log.warning(
                    "a poll cycle took %.0f ms, longer than the poll interval (%.0f ms), mostly "
                    "%s: began %.0f ms late, reading the cluster %.0f ms, evaluating %.0f ms, "
                    "thread hand-over and publishing %.0f ms; each cycle starts when the "
                    "previous ends, and snapshots are that much older",
                    timing.total * 1000,
                    timing.interval * 1000,
                    timing.cause(),
                    timing.started_late * 1000,
                    timing.poll * 1000,
                    timing.evaluation * 1000,
                    timing.rest * 1000,
                )
            return
        self._fitting += 1
        if self.overrunning and self._fitting >= FIT_AGAIN_CYCLES:
            self.overrunning = False
            log.info(
                "poll cycles fit the poll interval again (%d in a row, the last %.0f ms of "
                "%.0f ms)",
                self._fitting,
                timing.total * 1000,
                timing.interval * 1000,
            )
