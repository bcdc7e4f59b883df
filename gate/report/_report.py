"""What ``/status`` says about a gate, built from its state (the shape it has is documented
in :mod:`gate.report._status_bodies`).

Ages are computed here, by the server, when the answer is built (clients never need their
own clock); times are ISO 8601 in UTC.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from gate.evaluate._state import (
    SEVERITY,
    GateState,
    PartitionState,
    Verdict,
    position_tuples,
)
from gate.evaluate._verdict import EARLY
from gate.evaluate._watermark import format_time
from gate.report._status_bodies import GroupsShown


def _age(at: float | None, now: float) -> float | None:
    return None if at is None else round(max(0.0, now - at), 3)


def verdict_json(
    state: GateState,
    now: float,
    stale_after: float | None = None,
    errors: Sequence[str] = (),
    age: float | None = None,
) -> dict[str, Any]:
    """The verdict as ``/status`` gives it, its ages as of ``now``; ``unknown`` once the
    snapshot is older than ``stale_after`` (no poll has succeeded since: what the last one
    said is no news), saying why when the poll's ``errors`` concerning the gate are known.
    ``age``: the snapshot's age that decides it, when not its age at ``now`` (a kept answer's
    ages are as of its poll, the snapshot's age is the one at the ask)."""
    verdict = state.verdict
    if verdict.state == "missing":
        text = _missing(verdict.missing)
        if verdict.records_waiting:
            text += f"; elsewhere {_records(verdict.records_waiting)} waiting"
    elif verdict.state == "released":
        text = "every record is released"
    elif verdict.state == "flowing":
        within = verdict.released_within
        bound = "≥ " if verdict.at_least else ""
        text = f"flowing: {_records(verdict.records_waiting)} in transit" + (
            f", released within {bound}{_duration(within)}" if within is not None else ""
        )
        if verdict.holding:
            text += f", held back by {', '.join(verdict.holding)}"
    else:
        text = _stuck(verdict, now)
    if verdict.bottleneck == "dependent" and state.dependent:
        text += (
            f"; {state.dependent} itself has {_records(verdict.released_unprocessed, 'released ')}"
            " to process"
        )
    shown = verdict.state
    age = state.snapshot.age(now) if age is None else age
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
        "released_within_exact": verdict.released_within is None or not verdict.at_least,
        "stuck_since": None if verdict.stuck_since is None else format_time(verdict.stuck_since),
        "stuck_for_s": _age(verdict.stuck_since, now),
        "stuck_for_exact": verdict.stuck_since is None or not verdict.at_least,
        "stuck_on": list(verdict.stuck_on),
        "released_unprocessed": verdict.released_unprocessed,
        "bottleneck": verdict.bottleneck,
        "holding": list(verdict.holding),
        "missing": list(verdict.missing),
        "uncommitted": [
            {
                "group": entry.group,
                "partitions": list(entry.partitions),
                "records": entry.records,
                "ever_committed": entry.ever,
                "did_you_mean": entry.hint,
            }
            for entry in verdict.uncommitted
        ],
    }


SHOWN_PARTITIONS = 4
"""Partitions a verdict names per group before it says how many more."""


def _stuck(verdict: Verdict, now: float) -> str:
    """The alarm of a stuck gate: the groups without a commit where records wait (all of
    them wait), then since when the others have waited with their watermark still."""
    lacking = {entry.group for entry in verdict.uncommitted}
    said: list[str] = []
    for entry in verdict.uncommitted:
        names = list(entry.partitions[:SHOWN_PARTITIONS])
        more = len(entry.partitions) - len(names)
        where = ", ".join(names) + (f" and {more:,} more" if more > 0 else "")
        verb = "has no committed offset any more" if entry.ever else "has never committed"
        line = f"{entry.group} {verb} on {where}"
        if entry.hint:
            line += f" (did you mean {entry.hint!r}?)"
        line += f": all {_records(entry.records)} there wait"
        said.append(line)
    stalled = [group for group in verdict.stuck_on if group not in lacking]
    waiting = _records(verdict.records_waiting)
    if verdict.stuck_since is None or not stalled:
        return f"stuck: {'; '.join(said)}; {waiting} waiting in all"
    since = verdict.stuck_since
    clock = datetime.fromtimestamp(since, UTC).strftime("%H:%M:%S UTC")
    bound = "≥ " if verdict.at_least else ""
    text = (
        f"stuck since {'at least ' if verdict.at_least else ''}{clock} "
        f"({bound}{_duration(now - since)}) on {', '.join(stalled)}: {waiting} waiting"
    )
    return "; ".join([text, *said])


def _early(at: float, began: float | None) -> bool:
    """Whether ``at`` is the gate's first poll: what happened then happened at or before it."""
    return began is not None and at <= began + EARLY


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
        self.lag: int | None = 0  # None: no commit on a partition with records
        self.oldest: float | None = None  # the age of its oldest unprocessed record
        self.exact = True  # that age is exact on every partition where it is the oldest
        self.exact_unknown = True  # exact on every partition where that age is unknown
        self.unmoved_since: float | None = None  # earliest move where it has lag


_STATUS = tuple(status.value for status in SEVERITY)

_cached: dict[str, tuple[GateState, dict[str, _Rollup]]] = {}
"""Per gate: the last state summed up, and its groups' rollups."""


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
        for group, position in position_tuples(part.groups).items():
            committed, lag, _, moved_at, seconds, exact = position
            rollup = rollups.get(group)
            if rollup is None:  # not a dependency of the gate now: not in the summary
                continue
            if committed is None and part.end_offset != 0:
                rollup.lag = None  # every record there, or unknown: never 0
            if lag:
                if rollup.lag is not None:
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
            "unmoved_s_exact": since is None or not _early(since, state.began),
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
    groups: GroupsShown = "all",
    named: Collection[str] = (),
) -> dict[str, Any]:
    """The summary, and per partition its offsets and the positions of the groups ``groups``
    and ``named`` choose: at 1,000 groups x 64 partitions every position makes a 10 MB
    answer, the ones holding each partition back 0.1–1.2 MB (most of it the summary). The
    API writes the same JSON from the summary and ``gate.report._detail_json`` (kept per state by
    ``gate.serve._answers``); this is its model, which the tests compare it with."""
    body = gate_summary(state, now, stale_after, errors)
    body["partitions"] = gate_partitions(state, now, groups, named)
    return body


def gate_partitions(
    state: GateState, now: float, groups: GroupsShown = "all", named: Collection[str] = ()
) -> list[dict[str, Any]]:
    """``/status/{gate}``'s partitions: each one's offsets and the positions of the groups
    ``groups`` and ``named`` choose, their ages as of ``now``."""
    times: dict[float, str] = {}  # most groups moved at one of a few polls
    return [_partition(part, now, times, groups, named) for part in state.partitions.values()]


def _time(at: float | None, times: dict[float, str]) -> str | None:
    if at is None:
        return None
    text = times.get(at)
    if text is None:
        text = times[at] = format_time(at)
    return text


def _partition(
    part: PartitionState,
    now: float,
    times: dict[float, str],
    groups: GroupsShown,
    named: Collection[str],
) -> dict[str, Any]:
    """One partition's detail, with the positions of the groups ``groups`` and ``named``
    choose."""
    positions = position_tuples(part.groups)
    if groups != "all":
        wanted = [*part.holding, *named] if groups == "holding" else named
        positions = {group: positions[group] for group in wanted if group in positions}
    return {
        "topic": part.topic,
        "partition": part.partition,
        "end_offset": part.end_offset,
        "watermark": part.watermark,
        "waiting": part.waiting,
        "waiting_s": None if part.waiting_seconds is None else round(part.waiting_seconds, 3),
        "waiting_s_exact": part.waiting_exact,
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
