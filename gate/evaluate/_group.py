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

from gate.evaluate._lag import EndHistory
from gate.evaluate._state import (
    _MISSING_RANK,
    _OK_RANK,
    _RANK,
    BEHIND,
    LAGGING,
    REWOUND,
    SEVERITY,
    STALLED,
    DependencyStatus,
    GroupLag,
    LostOffset,
    Position,
    Rewind,
)
from gate.evaluate._watermark import Partition

RewindPolicy = Literal["follow", "keep_highest"]

_STALLED_RANK, _REWOUND_RANK, _LAGGING_RANK, _BEHIND_RANK = (
    _RANK[STALLED],
    _RANK[REWOUND],
    _RANK[LAGGING],
    _RANK[BEHIND],
)
_MISSING_POSITION: Position = (None, None, _MISSING_RANK, None, None, True)
_NEVER_CHANGES, _ALWAYS_CHANGES = float("inf"), float("-inf")
STEADY_SHARE = 0.1
"""LAGGING also needs its lag to have grown, across the window, by more than this share of
the records produced meanwhile (it processed less than the rest): a lag that holds steady,
its commits jittering, is never LAGGING."""


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


Point = tuple[float, int, int, "float | None", int]
"""A group's lag right after one of its commits: ``(at, low, high, seconds)``: between
``low`` and ``high`` records (the commit happened between two polls, and records kept
arriving), and the age of its oldest unprocessed record then (None: unknown). A plain tuple:
the collector stops tracking those (not named tuples), and a gate keeps about eight per group
and partition."""
_AT, _LOW, _HIGH, _SECONDS, _END = range(5)


class Track:
    """Memory of one group on one partition across polls.

    Its lag trend is judged on its lag right after each of its commits, not at every poll:
    between two commits a group's lag only grows (records arrive, its committed offset stands
    still) and it falls at the next commit, so a group that commits less often than the gate
    polls shows a saw-tooth whose every fall looks like catching up, and whose every rise
    looks like falling behind. A commit is seen at the first poll after it, so the lag right
    after it is known within the records appended between two polls (``low`` to
    ``high`` of a :data:`Point`); the lag counts as grown, or fallen, only beyond that.

    The group is *lagging* when, over the ``window`` that ends at its latest commit, its lag
    after commits did not fall once and the latest one is above the one at the window's start,
    and its oldest unprocessed record was older than the threshold right after that commit.
    The judgement spans commits however rare they are, and holds between them. A group that
    stops committing is judged on its lag now once it has been silent for longer than the
    window and than twice its previous interval between commits (records keep arriving and it
    shows no progress); until then only STALLED can catch it.

    Once lagging, it stays so while its trend holds (its lag after commits has not fallen)
    and its oldest unprocessed record is older than half the threshold: that age, read at the
    first poll after each commit, wavers by up to a poll interval, and a group falling behind
    crosses the threshold once, not back and forth.
    """

    __slots__ = (
        "committed",
        "end",
        "gap",
        "highest",
        "judged_lagging",
        "moved_at",
        "rewound_at",
        "seen_moving",
        "trend",
    )

    def __init__(
        self,
        committed: int,
        now: float,
        lag: int | None,
        seconds: float | None,
        end: int | None,
    ) -> None:
        self.committed = committed
        self.highest = committed
        self.moved_at = now
        self.rewound_at: float | None = None
        self.end = end  # the end offset at the latest poll that knew it
        self.gap: float | None = None  # between its last two commits seen
        self.seen_moving = False  # its committed offset moved since it was first seen
        self.judged_lagging = False  # lagging at the last judgement, its trend unbroken since
        # Its lag after each commit since that last fell, about one per eighth of the window:
        # the first one is the latest at or before the window's start. First seen, its lag
        # after its last commit was at most its lag now.
        self.trend: deque[Point] = deque()
        if lag is not None:
            self.trend.append((now, 0, lag, seconds, committed + lag))

    def moved(
        self,
        committed: int,
        lag: int | None,
        seconds: float | None,
        now: float,
        window: float,
    ) -> None:
        """Its committed offset moved: ``lag`` and ``seconds`` are its lag seen now."""
        if committed < self.committed:
            self.rewound_at = now
            self.trend.clear()  # a rewind is a step, not a trend: judged afresh from here
            self.judged_lagging = False
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
        if trend and lag < trend[-1][_LOW]:
            trend.clear()  # it fell for certain: the trend starts again
            self.judged_lagging = False
        low = lag
        if self.end is not None:
            low = self.end - committed
            low = 0 if low < 0 else lag if low > lag else low
        point = (now, low, lag, seconds, committed + lag)
        if len(trend) >= 2 and now - trend[-2][_AT] < window / 8:
            trend[-1] = point
        else:
            trend.append(point)
        while len(trend) > 1 and trend[1][_AT] <= now - window:
            trend.popleft()

    def lagging(
        self, lag: int | None, seconds: float | None, now: float, window: float, threshold: float
    ) -> bool:
        judged = self._lagging(lag, seconds, now, window, threshold)
        self.judged_lagging = judged
        return judged

    def _lagging(
        self, lag: int | None, seconds: float | None, now: float, window: float, threshold: float
    ) -> bool:
        trend = self.trend
        if not trend:
            return False
        if self.judged_lagging:
            threshold /= 2  # (see the class's docstring)
        silent = now - self.moved_at
        gap = self.gap
        if lag is not None and gap is not None and silent > window and silent > 2 * gap:
            latest = (now, lag, lag, seconds, self.committed + lag)  # no commit for long
        else:
            latest = trend[-1]
        seconds = latest[_SECONDS]
        if seconds is None or seconds <= threshold:
            return False
        start: Point | None = None
        for point in trend:
            if point[_AT] > latest[_AT] - window:
                break
            start = point
        if start is None or latest[_LOW] <= start[_HIGH]:
            return False
        # A steady lag whose commits jitter rises above an earlier low now and then: the lag
        # must have grown by more than a share of the records produced across the window
        # (the group processed less than the rest of them).
        produced = latest[_END] - start[_END]
        return latest[_LOW] - start[_HIGH] > STEADY_SHARE * produced


class GroupResult(NamedTuple):
    """One group evaluated on every partition, from its committed offsets ``committed``."""

    committed: Mapping[Partition, int]
    positions: dict[Partition, Position]
    effective: dict[Partition, int]
    """The offsets that count for the watermark (see ``StatusPolicy.rewind_policy``)."""
    status: DependencyStatus
    lag: GroupLag
    quiet_until: float
    """Until when (monotonic) all of it holds while the inputs stay as they are: -inf when it
    has lag somewhere (its status may change with time alone)."""


def evaluate_group(
    tracks: dict[Partition, Track],
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
    """One group on every partition of the gate (``tracks``: its memory of each): its
    positions, the offsets that count for the watermark, its worst status, its lag, and until
    when all of it holds while its offsets and the end offsets stay as they are.

    It runs for every group on every partition whenever records arrive, so it is written for
    speed: positions are plain tuples (:data:`gate.evaluate._state.Position`), and nothing is
    looked up twice."""
    keep_highest = policy.rewind_policy == "keep_highest"
    stall_after = policy.stall_after
    rewind_window = policy.rewind_window
    lag_window, lag_threshold = policy.lag_window, policy.lag_threshold
    behind_after = policy.behind_after
    positions: dict[Partition, Position] = {}
    effective: dict[Partition, int] = {}
    worst_rank = _OK_RANK
    lag_total: int | None = 0
    lag_seconds: float | None = None
    # It can be skipped while nothing moves only when it has no lag anywhere (then no
    # status of it depends on time but REWOUND, which expires at a known time).
    quiet_until = _NEVER_CHANGES
    for tp in partitions:
        committed = group_committed.get(tp)
        track = tracks.get(tp)
        if committed is None:
            if track is not None:
                lost.append(LostOffset(group, tp[0], tp[1], track.committed))
                del tracks[tp]
            positions[tp] = _MISSING_POSITION
            worst_rank = _MISSING_RANK
            if ends[tp] != 0:
                lag_total = None  # every record there, or unknown: never 0
            continue
        end = ends[tp]
        seconds: float | None
        if end is None:
            lag = seconds = None
            exact = True
        elif end > committed:
            lag = end - committed
            history = histories.get(tp)
            if history is None:
                seconds, exact = None, True
            else:
                seconds, exact = history.lag(committed, now)
        else:
            lag, seconds, exact = 0, (None if histories.get(tp) is None else 0.0), True
        if track is None:
            track = tracks[tp] = Track(committed, now, lag, seconds, end)
        elif committed != track.committed:
            if committed < track.committed:
                rewinds.append(Rewind(group, tp[0], tp[1], track.committed, committed))
            track.moved(committed, lag, seconds, now, lag_window)
        if end is not None:
            track.end = end
        # Status, most severe first (see SEVERITY). Stalled: it has had lag, and not
        # committed, for stall_after (lag that just appeared on an idle partition is not
        # a stall, however long ago the group last committed).
        rewound_at = track.rewound_at
        rewound = rewound_at is not None and now - rewound_at < rewind_window
        trend = track.trend
        if lag:
            stalled_for = now - track.moved_at
            if seconds is not None and seconds < stalled_for:
                stalled_for = seconds
            stalled = stalled_for >= stall_after
        else:
            stalled = False
        if stalled:
            rank = _STALLED_RANK
        elif rewound:
            rank = _REWOUND_RANK
        elif trend and track.lagging(lag, seconds, now, lag_window, lag_threshold):
            rank = _LAGGING_RANK
        elif seconds is not None and seconds > behind_after:
            rank = _BEHIND_RANK
        else:
            rank = _OK_RANK
        if lag != 0 or (trend and trend[-1][_HIGH] != 0):
            quiet_until = _ALWAYS_CHANGES  # its status may change with time alone
        elif rewound:
            assert rewound_at is not None
            if rewound_at + rewind_window < quiet_until:
                quiet_until = rewound_at + rewind_window
        positions[tp] = (committed, lag, rank, track.moved_at + shift, seconds, exact)
        if lag is not None and lag_total is not None:
            lag_total += lag
        if seconds is not None:
            rounded = round(seconds, 3) if seconds else 0.0
            if lag_seconds is None or rounded > lag_seconds:
                lag_seconds = rounded
        if keep_highest and (end is None or track.highest <= end):
            effective[tp] = track.highest
        else:
            effective[tp] = committed
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
