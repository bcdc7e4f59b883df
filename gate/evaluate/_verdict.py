"""The gate's verdict in one line, from its partitions' states: everything released, flowing,
or an alarm (stuck, or missing). Nothing here performs I/O."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Literal

from gate.evaluate._state import (
    _RANK,
    STALLED,
    PartitionState,
    Uncommitted,
    Verdict,
    VerdictState,
    position_tuples,
)

_STALLED_RANK = _RANK[STALLED]
EARLY = 1e-3
"""Seconds within which a time counts as the evaluator's first poll (a lower bound)."""


def judge(
    partitions: Iterable[PartitionState],
    now: float,
    stall_after: float,
    missing: Sequence[str] = (),
    began: float | None = None,
    ever: Collection[str] = (),
    hint: Callable[[str], str | None] = lambda group: None,
) -> Verdict:
    """Released, flowing, stuck, or missing.

    A partition is stuck when records have waited there for ``stall_after`` seconds and its
    watermark has not moved for as long (records that just arrived on an idle partition are
    not stuck, however long ago the watermark last moved), and at once when a group holding
    it back is STALLED, or has no committed offset there (nothing there can be released
    until it commits: a misspelt or dead dependency is an alarm from the first poll).
    ``missing`` (topics, and partitions as ``topic[partition]``, that do not exist) makes the
    gate an alarm whatever its other partitions do: nothing there is released.

    ``began`` (the wall time of the first poll) tells which times are lower bounds, ``ever``
    the groups seen committing on the gate's partitions, ``hint`` a close name of a group on
    the cluster."""
    waiting = 0
    within: float | None = None
    within_exact = True
    stuck_since: float | None = None
    stuck_at_least = False
    stuck_on: dict[str, None] = {}
    held: Counter[str] = Counter()
    unprocessed = 0
    uncommitted: dict[str, tuple[list[str], list[int]]] = {}
    for part in partitions:
        unprocessed += part.released_unprocessed
        count = part.waiting
        if not count:
            continue
        waiting += count
        held.update(part.holding)
        since = part.watermark_moved_at
        early = since is not None and began is not None and since <= began + EARLY
        age = part.waiting_seconds
        if age is not None:
            if within is None or age > within:
                within, within_exact = age, part.waiting_exact
            elif age == within:
                within_exact = within_exact and part.waiting_exact
            if since is None or now - age > since:
                since, early = now - age, not part.waiting_exact
        alarm_since: float | None = None
        alarm_early = False
        alarm_on: list[str] = []
        positions = position_tuples(part.groups)
        name = f"{part.topic}[{part.partition}]"
        for group in part.holding:
            position = positions.get(group)
            if position is None or position[0] is None:
                names, records = uncommitted.setdefault(group, ([], []))
                names.append(name)
                records.append(count)
                continue
            if position[2] != _STALLED_RANK:
                continue
            moved_at, seconds, exact = position[3], position[4], position[5]
            stalled = moved_at if moved_at is not None else now
            stalled_early = began is not None and stalled <= began + EARLY
            if seconds is not None and now - seconds > stalled:
                stalled, stalled_early = now - seconds, not exact
            alarm_on.append(group)
            if alarm_since is None or stalled < alarm_since:
                alarm_since, alarm_early = stalled, stalled_early
        if since is not None and now - since >= stall_after:
            alarm_on = list(part.holding)
            if alarm_since is None or since < alarm_since:
                alarm_since, alarm_early = since, early
        if alarm_since is not None:
            if stuck_since is None or alarm_since < stuck_since:
                stuck_since, stuck_at_least = alarm_since, alarm_early
            elif alarm_since == stuck_since:
                stuck_at_least = stuck_at_least or alarm_early
            stuck_on.update(dict.fromkeys(alarm_on))
    lacking = tuple(
        Uncommitted(group, tuple(names), sum(records), group in ever, hint(group))
        for group, (names, records) in sorted(
            uncommitted.items(), key=lambda item: -sum(item[1][1])
        )
    )
    for entry in lacking:
        stuck_on[entry.group] = None
    state: VerdictState
    if missing:
        state = "missing"
    elif stuck_on:
        state = "stuck"
    else:
        state = "flowing" if waiting else "released"
    bottleneck: Literal["dependencies", "dependent"] | None = None
    if waiting or unprocessed:
        bottleneck = "dependent" if unprocessed > waiting else "dependencies"
    flowing = state == "flowing"
    return Verdict(
        state,
        waiting,
        within if flowing else None,
        stuck_since if state != "flowing" else None,
        tuple(stuck_on),
        unprocessed,
        bottleneck,
        tuple(group for group, _ in held.most_common()),
        tuple(missing),
        lacking,
        (not within_exact) if flowing else stuck_at_least,
    )
