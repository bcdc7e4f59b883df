"""One dependency group across a gate's partitions: its memory of each partition across polls
(:class:`Track`: where it stood, when it last moved or rewound, its lag right after each of
its commits, which LAGGING is judged on) and its evaluation at one poll
(:func:`evaluate_group`: positions, statuses, the offsets that count for the watermark).
Nothing here performs I/O."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

from gate._lag import EndHistory
from gate._state import (
    _MISSING_RANK,
    _OK_RANK,
    _RANK,
    BEHIND,
    LAGGING,
    MISSING,
    OK,
    REWOUND,
    SEVERITY,
    STALLED,
    DependencyStatus,
    GroupLag,
    GroupPosition,
    LostOffset,
    Rewind,
)
from gate._watermark import Partition

RewindPolicy = Literal["follow", "keep_highest"]


@dataclass(frozen=True, slots=True)
class StatusPolicy:
    stall_after: float = 60.0
    """Seconds a group may have lag without committing before it is STALLED."""
    lag_window: float = 30.0
    """Seconds over which the lag trend is judged: LAGGING only when the lag after each commit
    did not fall once across the whole window and grew over it."""
    lag_threshold: float = 10.0
    """Seconds of lag below which a group is never LAGGING, however its lag moves."""
    behind_after: float = 60.0
    """Seconds of lag (the age of its oldest unprocessed record) beyond which a group is
    BEHIND when it is not LAGGING: never OK, growing or not."""
    rewind_window: float = 300.0
    """Seconds a group stays REWOUND after its committed offset went backwards."""
    rewind_policy: RewindPolicy = "follow"
    """``follow``: the watermark follows a rewound group down, so new records wait until it
    passes them again. ``keep_highest``: a group counts with the highest offset it ever
    committed on the partition's current log (records it processed once stay released); a
    log that moves backwards (a topic deleted and recreated) starts that history afresh, and
    a highest offset beyond the log's end never counts."""


class Point(NamedTuple):
    """A group's lag right after one of its commits: between ``low`` and ``high`` records
    (the commit happened between two polls, and records kept arriving), and the age of its
    oldest unprocessed record then (None: unknown)."""

    at: float
    low: int
    high: int
    seconds: float | None


class Track:
    """Memory of one group on one partition across polls.

    Its lag trend is judged on its lag right after each of its commits, not at every poll:
    between two commits a group's lag only grows (records arrive, its committed offset stands
    still) and it falls at the next commit, so a group that commits less often than the gate
    polls shows a saw-tooth whose every fall looks like catching up, and whose every rise
    looks like falling behind. A commit is seen at the first poll after it, so the lag right
    after it is known within the records appended between two polls (``Point.low`` to
    ``high``); the lag counts as grown, or fallen, only beyond that.

    The group is *lagging* when, over the ``window`` that ends at its latest commit, its lag
    after commits did not fall once and the latest one is above the one at the window's start,
    and its oldest unprocessed record was older than the threshold right after that commit.
    The judgement spans commits however rare they are, and holds between them. A group that
    stops committing is judged on its lag now once it has been silent for longer than the
    window and than twice its previous interval between commits (records keep arriving and it
    shows no progress); until then only STALLED can catch it.
    """

    __slots__ = (
        "committed",
        "end",
        "gap",
        "highest",
        "moved_at",
        "rewound_at",
        "seen_moving",
        "trend",
    )

    def __init__(
        self, committed: int, now: float, lag: int | None, seconds: float | None, end: int | None
    ) -> None:
        self.committed = committed
        self.highest = committed
        self.moved_at = now
        self.rewound_at: float | None = None
        self.end = end  # the end offset at the latest poll that knew it
        self.gap: float | None = None  # between its last two commits seen
        self.seen_moving = False  # its committed offset moved since it was first seen
        # Its lag after each commit since that last fell, about one per eighth of the window:
        # the first one is the latest at or before the window's start. First seen, its lag
        # after its last commit was at most its lag now.
        self.trend: deque[Point] = deque()
        if lag is not None:
            self.trend.append(Point(now, 0, lag, seconds))

    def moved(
        self, committed: int, lag: int | None, seconds: float | None, now: float, window: float
    ) -> None:
        """Its committed offset moved: ``lag`` and ``seconds`` are its lag seen now."""
        if committed < self.committed:
            self.rewound_at = now
            self.trend.clear()  # a rewind is a step, not a trend: judged afresh from here
        elif committed > self.highest:
            self.highest = committed
        if self.seen_moving:
            self.gap = now - self.moved_at
        self.seen_moving = True
        self.committed = committed
        self.moved_at = now
        if lag is None:
            return
        trend = self.trend
        if trend and lag < trend[-1].low:
            trend.clear()  # it fell for certain: the trend starts again
        low = lag if self.end is None else max(0, min(lag, self.end - committed))
        point = Point(now, low, lag, seconds)
        if len(trend) >= 2 and now - trend[-2].at < window / 8:
            trend[-1] = point
        else:
            trend.append(point)
        while len(trend) > 1 and trend[1].at <= now - window:
            trend.popleft()

    def lagging(
        self, lag: int | None, seconds: float | None, now: float, window: float, threshold: float
    ) -> bool:
        trend = self.trend
        if not trend:
            return False
        silent = now - self.moved_at
        if lag is not None and self.gap is not None and silent > max(window, 2 * self.gap):
            latest = Point(now, lag, lag, seconds)  # no commit for long, and its lag grew
        else:
            latest = trend[-1]
        if latest.seconds is None or latest.seconds <= threshold:
            return False
        start: Point | None = None
        for point in trend:
            if point.at > latest.at - window:
                break
            start = point
        return start is not None and latest.low > start.high


class GroupResult(NamedTuple):
    """One group evaluated on every partition, from its committed offsets ``committed``."""

    committed: Mapping[Partition, int]
    positions: dict[Partition, GroupPosition]
    effective: dict[Partition, int]
    """The offsets that count for the watermark (see ``StatusPolicy.rewind_policy``)."""
    status: DependencyStatus
    lag: GroupLag
    quiet_until: float
    """Until when (monotonic) all of it holds while the inputs stay as they are: -inf when it
    has lag somewhere (its status may change with time alone)."""


def evaluate_group(
    tracks: dict[tuple[str, Partition], Track],
    histories: Mapping[Partition, EndHistory],
    policy: StatusPolicy,
    group: str,
    group_committed: Mapping[Partition, int],
    partitions: list[Partition],
    ends: Mapping[Partition, int | None],
    now: float,
    shift: float,
    rewinds: list[Rewind],
    lost: list[LostOffset],
) -> GroupResult:
    """One group on every partition of the gate: its positions, the offsets that count
    for the watermark, its worst status, its lag, and until when all of it holds while
    its offsets and the end offsets stay as they are."""
    keep_highest = policy.rewind_policy == "keep_highest"
    stall_after = policy.stall_after
    rewind_window = policy.rewind_window
    lag_window, lag_threshold = policy.lag_window, policy.lag_threshold
    behind_after = policy.behind_after
    positions: dict[Partition, GroupPosition] = {}
    effective: dict[Partition, int] = {}
    worst_rank = _OK_RANK
    lag_total = 0
    lag_seconds: float | None = None
    # It can be skipped while nothing moves only when it has no lag anywhere (then no
    # status of it depends on time but REWOUND, which expires at a known time).
    quiet_until = float("inf")
    for tp in partitions:
        committed = group_committed.get(tp)
        key = (group, tp)
        track = tracks.get(key)
        if committed is None:
            if track is not None:
                lost.append(LostOffset(group, tp[0], tp[1], track.committed))
                del tracks[key]
            positions[tp] = GroupPosition(None, None, MISSING, None)
            worst_rank = _MISSING_RANK
            continue
        end = ends[tp]
        lag = (end - committed if end > committed else 0) if end is not None else None
        history = histories.get(tp)
        seconds, exact = (None, True)
        if lag is not None and history is not None:
            seconds, exact = history.lag(committed, now) if lag else (0.0, True)
        if track is None:
            track = tracks[key] = Track(committed, now, lag, seconds, end)
        elif committed != track.committed:
            if committed < track.committed:
                rewinds.append(Rewind(group, tp[0], tp[1], track.committed, committed))
            track.moved(committed, lag, seconds, now, lag_window)
        if end is not None:
            track.end = end
        # Status, most severe first (see SEVERITY). Stalled: it has had lag, and not
        # committed, for stall_after (lag that just appeared on an idle partition is not
        # a stall, however long ago the group last committed).
        stalled_for = now - track.moved_at
        if seconds is not None:
            stalled_for = min(stalled_for, seconds)
        rewound = track.rewound_at is not None and now - track.rewound_at < rewind_window
        if lag and stalled_for >= stall_after:
            status = STALLED
        elif rewound:
            status = REWOUND
        elif track.lagging(lag, seconds, now, lag_window, lag_threshold):
            status = LAGGING
        elif seconds is not None and seconds > behind_after:
            status = BEHIND
        else:
            status = OK
        if lag != 0 or (track.trend and track.trend[-1].high != 0):
            quiet_until = float("-inf")  # its status may change with time alone
        elif rewound:
            assert track.rewound_at is not None
            quiet_until = min(quiet_until, track.rewound_at + rewind_window)
        positions[tp] = GroupPosition(
            committed, lag, status, track.moved_at + shift, seconds, exact
        )
        if lag is not None:
            lag_total += lag
        if seconds is not None:
            lag_seconds = max(lag_seconds or 0.0, round(seconds, 3))
        if keep_highest and (end is None or track.highest <= end):
            effective[tp] = track.highest
        else:
            effective[tp] = committed
        rank = _RANK[status]
        if rank < worst_rank:
            worst_rank = rank
    return GroupResult(
        group_committed,
        positions,
        effective,
        SEVERITY[worst_rank],
        GroupLag(lag_total, lag_seconds),
        quiet_until,
    )
