"""The gate's verdict in one line, from its partitions' states: everything released, flowing,
or an alarm (stuck, or missing). Nothing here performs I/O."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal

from gate._state import PartitionState, Verdict, VerdictState


def judge(
    partitions: Iterable[PartitionState],
    now: float,
    stall_after: float,
    missing: Sequence[str] = (),
) -> Verdict:
    """Released, flowing, stuck, or missing: a partition is stuck when records have waited
    there for ``stall_after`` seconds and its watermark has not moved for as long (records that
    just arrived on an idle partition are not stuck, however long ago the watermark last
    moved). ``missing`` (topics, and partitions as ``topic[partition]``, that do not exist)
    makes the gate an alarm whatever its other partitions do: nothing there is released."""
    waiting = 0
    within: float | None = None
    stuck_since: float | None = None
    stuck_on: dict[str, None] = {}
    held: Counter[str] = Counter()
    unprocessed = 0
    for part in partitions:
        unprocessed += part.released_unprocessed
        count = part.waiting
        if not count:
            continue
        waiting += count
        held.update(part.holding)
        since = part.watermark_moved_at
        age = part.waiting_seconds
        if age is not None:
            within = age if within is None else max(within, age)
            since = now - age if since is None else max(since, now - age)
        if since is not None and now - since >= stall_after:
            stuck_since = since if stuck_since is None else min(stuck_since, since)
            stuck_on.update(dict.fromkeys(part.holding))
    state: VerdictState
    if missing:
        state = "missing"
    elif stuck_since is not None:
        state = "stuck"
    else:
        state = "flowing" if waiting else "released"
    bottleneck: Literal["dependencies", "dependent"] | None = None
    if waiting or unprocessed:
        bottleneck = "dependent" if unprocessed > waiting else "dependencies"
    return Verdict(
        state,
        waiting,
        within if state == "flowing" else None,
        stuck_since,
        tuple(stuck_on),
        unprocessed,
        bottleneck,
        tuple(group for group, _ in held.most_common()),
        tuple(missing),
    )
