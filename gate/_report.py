"""What ``/status`` says about a gate, and the documented shape of it (the API's schema).

One shape everywhere: ``GET /status`` gives each gate's :class:`GateSummary`,
``GET /status/{gate}`` (and its stream) a :class:`GateStatus`: the summary plus
``partitions``, always a list. Ages are computed here, by the server, when the answer is
built (clients never need their own clock); times are ISO 8601 in UTC.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from gate._state import (
    _RANK,
    SEVERITY,
    GateState,
    GroupPosition,
    GroupPositions,
    PartitionState,
    Position,
)
from gate._watermark import format_time


class VerdictBody(BaseModel):
    state: Literal["released", "flowing", "stuck", "missing", "unknown"] = Field(
        description="released: nothing waits; flowing: records wait but the watermarks move "
        "(healthy); stuck: records have waited for stall_after at a watermark that has not "
        "moved for as long (an alarm); missing: a topic or partition of the gate does not "
        "exist, so nothing on it is released (an alarm); unknown: no poll has succeeded for "
        "stale_after_s (the other fields are the last snapshot's)."
    )
    text: str = Field(description="The verdict in one line, as the status page shows it.")
    records_waiting: int = Field(description="Records held back, over all partitions.")
    released_within_s: float | None = Field(
        description="Flowing: the age of the oldest record held back."
    )
    stuck_since: str | None = Field(
        description="Stuck: since when records have waited with the watermark still (the "
        "later of its last move and the oldest waiting record's arrival)."
    )
    stuck_for_s: float | None = Field(description="Stuck: seconds since then.")
    stuck_on: list[str] = Field(description="Stuck: the groups holding those partitions.")
    released_unprocessed: int = Field(
        description="Records released to the dependent that it has not committed yet."
    )
    bottleneck: Literal["dependencies", "dependent"] | None = Field(
        description="Who records wait for: the dependencies (held back) or the dependent."
    )
    holding: list[str] = Field(
        description="The groups holding records back, the one holding most partitions first."
    )
    missing: list[str] = Field(
        description="Missing: the topics, and partitions as topic[partition], that do not exist."
    )


DependencyStatusName = Literal["OK", "LAGGING", "BEHIND", "REWOUND", "STALLED", "MISSING"]


class GroupSummary(BaseModel):
    status: DependencyStatusName = Field(description="Its worst partition's status.")
    holding: int = Field(description="Partitions it holds back (it is at the watermark).")
    lag: int = Field(description="Records behind the end, over all partitions.")
    lag_s: float | None = Field(
        description="Age of the oldest record it has not processed (null: unknown)."
    )
    lag_s_exact: bool = Field(
        description="False when lag_s is coarse: a lower bound (the record is older than the "
        "gate's history) or from samples far apart for its age."
    )
    unmoved_s: float | None = Field(
        description="Seconds since its committed offset last moved on a partition where it "
        "has lag (null: it has lag nowhere)."
    )
    offsets_age_s: float | None = Field(
        default=None,
        description="Seconds since its offsets shown were read, when the last poll carried "
        "them from an earlier read (idle and caught up: idle_poll_interval_ms); null: the "
        "last poll read them.",
    )


class DependentSummary(BaseModel):
    group: str = Field(description="The dependent's own consumer group.")
    committed: bool = Field(description="Whether it has committed offsets on these topics.")
    released_unprocessed: int = Field(
        description="Records released to it that it has not committed yet."
    )


class GateSummary(BaseModel):
    gate: str
    version: int = Field(description="The snapshot's version (milliseconds, increasing).")
    polled_at: str = Field(description="When the poll behind this snapshot started.")
    age_s: float = Field(description="Age of the snapshot when this answer was built.")
    stale_after_s: float | None = Field(
        description="Beyond this age the verdict is unknown (the service's readiness limit)."
    )
    partition_count: int
    held_partitions: int = Field(description="Partitions where records wait.")
    unreleased_partitions: list[str] = Field(
        description="Partitions with no watermark (nothing released), as topic[partition]."
    )
    records_waiting: int
    missing_topics: list[str]
    missing_partitions: list[str] = Field(
        description="Partitions seen before that no longer exist, as topic[partition]."
    )
    groups: dict[str, GroupSummary]
    verdict: VerdictBody
    dependent: DependentSummary | None
    errors: list[str] = Field(
        description="Why the last poll did not refresh this gate, e.g. its dependency groups' "
        "offsets could not be read (empty when it did): the snapshot is then the last good one."
    )


class GroupPositionBody(BaseModel):
    committed: int | None
    lag: int | None = Field(description="Records behind the end (null: unknown).")
    lag_s: float | None = Field(description="Age of the oldest record it has not processed.")
    lag_s_exact: bool
    status: DependencyStatusName
    moved_at: str | None = Field(description="When its committed offset last moved.")
    unmoved_s: float | None = Field(description="Seconds since then.")


class PartitionBody(BaseModel):
    topic: str
    partition: int
    end_offset: int | None
    watermark: int | None = Field(description="Records below it are released (null: none).")
    waiting: int | None = Field(description="Records held back (null: end unknown).")
    waiting_s: float | None = Field(description="Age of the oldest record held back.")
    watermark_moved_at: str | None
    holding: list[str] = Field(
        description="The groups at the watermark while records wait (ties together)."
    )
    dependent: int | None = Field(description="The dependent's committed offset.")
    groups: dict[str, GroupPositionBody]


class GateStatus(GateSummary):
    partitions: list[PartitionBody]


class GroupHistory(BaseModel):
    lag: int = Field(description="Records behind the end, over all partitions.")
    lag_s: float | None = Field(description="Age of the oldest record it has not processed.")


class HistoryPoint(BaseModel):
    t: float = Field(description="Start of the step, seconds since the epoch.")
    released: int = Field(description="Sum of the watermarks (its rise: records released).")
    waiting: int = Field(description="Records held back.")
    unprocessed: int = Field(description="Records released to the dependent, not processed.")
    groups: dict[str, GroupHistory] = Field(description="Each dependency group.")


class GateHistoryBody(BaseModel):
    gate: str
    step_s: float
    span_s: float
    now: float = Field(description="The server's clock when this answer was built.")
    points: list[HistoryPoint]


def _age(at: float | None, now: float) -> float | None:
    return None if at is None else round(max(0.0, now - at), 3)


def verdict_json(
    state: GateState,
    now: float,
    stale_after: float | None = None,
    errors: Sequence[str] = (),
) -> dict[str, Any]:
    """The verdict as ``/status`` gives it; ``unknown`` once the snapshot is older than
    ``stale_after`` (no poll has succeeded since: what the last one said is no news), saying
    why when the poll's ``errors`` concerning the gate are known."""
    verdict = state.verdict
    if verdict.state == "missing":
        text = _missing(verdict.missing)
        if verdict.records_waiting:
            text += f"; elsewhere {_records(verdict.records_waiting)} waiting"
    elif verdict.state == "released":
        text = "every record is released"
    elif verdict.state == "flowing":
        within = verdict.released_within
        text = f"flowing: {_records(verdict.records_waiting)} in transit" + (
            f", released within {_duration(within)}" if within is not None else ""
        )
        if verdict.holding:
            text += f", held back by {', '.join(verdict.holding)}"
    else:
        since = now if verdict.stuck_since is None else verdict.stuck_since
        clock = datetime.fromtimestamp(since, UTC).strftime("%H:%M:%S UTC")
        text = (
            f"stuck since {clock} ({_duration(now - since)}) on "
            f"{', '.join(verdict.stuck_on) or 'unknown groups'}: "
            f"{_records(verdict.records_waiting)} waiting"
        )
    if verdict.bottleneck == "dependent" and state.dependent:
        text += (
            f"; {state.dependent} itself has {_records(verdict.released_unprocessed, 'released ')}"
            " to process"
        )
    shown = verdict.state
    age = state.snapshot.age(now)
    if stale_after is not None and age > stale_after:
        shown = "unknown"
        polled = datetime.fromtimestamp(state.snapshot.polled_at, UTC).strftime("%H:%M:%S UTC")
        text = (
            f"unknown: no poll has succeeded for {_duration(age)} "
            f"(the last one, at {polled}, said: {text})"
        )
        if errors:
            text += f"; the last poll failed: {'; '.join(errors)}"
    return {
        "state": shown,
        "text": text,
        "records_waiting": verdict.records_waiting,
        "released_within_s": None
        if verdict.released_within is None
        else round(verdict.released_within, 3),
        "stuck_since": None if verdict.stuck_since is None else format_time(verdict.stuck_since),
        "stuck_for_s": _age(verdict.stuck_since, now),
        "stuck_on": list(verdict.stuck_on),
        "released_unprocessed": verdict.released_unprocessed,
        "bottleneck": verdict.bottleneck,
        "holding": list(verdict.holding),
        "missing": list(verdict.missing),
    }


def _missing(names: Sequence[str]) -> str:
    topics = [n for n in names if not n.endswith("]")]
    partitions = [n for n in names if n.endswith("]")]
    parts = []
    if topics:
        noun = "topic" if len(topics) == 1 else "topics"
        parts.append(f"{noun} {', '.join(topics)}")
    if partitions:
        noun = "partition" if len(partitions) == 1 else "partitions"
        parts.append(f"{noun} {', '.join(partitions)}")
    verb = "does" if len(names) == 1 else "do"
    return (
        f"missing: {' and '.join(parts)} {verb} not exist on the cluster; nothing there is released"
    )


def _records(count: int, kind: str = "") -> str:
    return f"{count:,} {kind}record{'' if count == 1 else 's'}"


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class _Rollup:
    """One dependency group over all partitions of a state, for the summary (see
    :func:`_rollups`)."""

    __slots__ = ("exact", "exact_unknown", "holding", "lag", "oldest", "unmoved_since")

    def __init__(self) -> None:
        self.holding = 0
        self.lag = 0
        self.oldest: float | None = None  # the age of its oldest unprocessed record
        self.exact = True  # that age is exact on every partition where it is the oldest
        self.exact_unknown = True  # exact on every partition where that age is unknown
        self.unmoved_since: float | None = None  # earliest move where it has lag


_STATUS = tuple(status.value for status in SEVERITY)

_cached: dict[str, tuple[GateState, dict[str, _Rollup]]] = {}
"""Per gate: the last state summed up, and its groups' rollups."""


def _tuples(groups: Mapping[str, GroupPosition]) -> Mapping[str, Position]:
    """A partition's positions as the evaluation keeps them (see :data:`Position`)."""
    if isinstance(groups, GroupPositions):
        return groups.tuples()
    return {
        group: (p.committed, p.lag, _RANK[p.status], p.moved_at, p.lag_seconds, p.lag_exact)
        for group, p in groups.items()
    }


def _rollups(state: GateState) -> dict[str, _Rollup]:
    """Each group of ``state`` summed over its partitions, once per state: a state does not
    change, and a fleet's summary otherwise reads every group on every partition (64,000
    positions at 1,000 groups x 64 partitions) at every ask. Nothing in it depends on the
    time of the ask."""
    cached = _cached.get(state.gate)
    if cached is not None and cached[0] is state:
        return cached[1]
    rollups = {group: _Rollup() for group in state.groups}
    for part in state.partitions.values():
        for group in part.holding:  # each group once (see PartitionState.holding)
            if group in rollups:
                rollups[group].holding += 1
        for group, (_, lag, _, moved_at, seconds, exact) in _tuples(part.groups).items():
            rollup = rollups.get(group)
            if rollup is None:  # not a dependency of the gate now: not in the summary
                continue
            if lag:
                rollup.lag += lag
                if moved_at is not None and (
                    rollup.unmoved_since is None or moved_at < rollup.unmoved_since
                ):
                    rollup.unmoved_since = moved_at
            if seconds is None:
                rollup.exact_unknown = rollup.exact_unknown and exact
            elif rollup.oldest is None or seconds > rollup.oldest:
                rollup.oldest, rollup.exact = seconds, exact
            elif seconds == rollup.oldest:
                rollup.exact = rollup.exact and exact
    _cached[state.gate] = (state, rollups)
    return rollups


def gate_summary(
    state: GateState,
    now: float,
    stale_after: float | None = None,
    errors: Sequence[str] = (),
) -> dict[str, Any]:
    """The summary of ``state``; ``errors``: why the last poll did not refresh the gate."""
    parts = list(state.partitions.values())
    rollups = _rollups(state)
    groups: dict[str, dict[str, Any]] = {}
    for group, status in state.groups.items():
        rollup = rollups[group]
        oldest, since = rollup.oldest, rollup.unmoved_since
        groups[group] = {
            "status": status.value,
            "holding": rollup.holding,
            "lag": rollup.lag,
            "lag_s": None if oldest is None else round(oldest, 3),
            "lag_s_exact": rollup.exact if oldest is not None else rollup.exact_unknown,
            "unmoved_s": None if since is None else round(now - since, 3),
            "offsets_age_s": _age(state.carried.get(group), now),
        }
    dependent = None
    if state.dependent:
        dependent = {
            "group": state.dependent,
            "committed": any(p.dependent is not None for p in parts),
            "released_unprocessed": sum(p.released_unprocessed for p in parts),
        }
    return {
        "gate": state.gate,
        "version": state.version,
        "polled_at": format_time(state.snapshot.polled_at),
        "age_s": round(state.snapshot.age(now), 3),
        "stale_after_s": stale_after,
        "partition_count": len(parts),
        "held_partitions": sum(1 for p in parts if (p.waiting or 0) > 0),
        "unreleased_partitions": [
            f"{p.topic}[{p.partition}]" for p in parts if p.watermark is None
        ],
        "records_waiting": sum(p.waiting or 0 for p in parts),
        "missing_topics": list(state.missing_topics),
        "missing_partitions": [f"{t}[{p}]" for t, p in state.missing_partitions],
        "groups": groups,
        "verdict": verdict_json(state, now, stale_after, errors),
        "dependent": dependent,
        "errors": list(errors),
    }


def gate_status(
    state: GateState,
    now: float,
    stale_after: float | None = None,
    errors: Sequence[str] = (),
) -> dict[str, Any]:
    body = gate_summary(state, now, stale_after, errors)
    times: dict[float, str] = {}  # most groups moved at one of a few polls
    body["partitions"] = [_partition(part, now, times) for part in state.partitions.values()]
    return body


def _time(at: float | None, times: dict[float, str]) -> str | None:
    if at is None:
        return None
    text = times.get(at)
    if text is None:
        text = times[at] = format_time(at)
    return text


def _partition(part: PartitionState, now: float, times: dict[float, str]) -> dict[str, Any]:
    positions = _tuples(part.groups)
    return {
        "topic": part.topic,
        "partition": part.partition,
        "end_offset": part.end_offset,
        "watermark": part.watermark,
        "waiting": part.waiting,
        "waiting_s": None if part.waiting_seconds is None else round(part.waiting_seconds, 3),
        "watermark_moved_at": _time(part.watermark_moved_at, times),
        "holding": list(part.holding),
        "dependent": part.dependent,
        "groups": {
            group: {
                "committed": committed,
                "lag": lag,
                "lag_s": None if seconds is None else round(seconds, 3),
                "lag_s_exact": exact,
                "status": _STATUS[rank],
                "moved_at": _time(moved_at, times),
                "unmoved_s": _age(moved_at, now),
            }
            for group, (committed, lag, rank, moved_at, seconds, exact) in positions.items()
        },
    }
