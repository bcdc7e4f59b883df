"""Evaluation of one gate from successive polls: watermarks, versions and dependency status.

:class:`GateEvaluator` is a pure state machine: it receives a :class:`PollResult` (what the
admin API reported at one moment) and returns a :class:`GateState`. It remembers just enough
history to tell, in the spirit of LinkedIn Burrow, whether each dependency group is OK,
LAGGING (lag growing over the evaluation window), STALLED (lag exists but the committed offset
has not moved for ``stall_after`` seconds: a stuck or dead dependency holding everyone back),
REWOUND (its committed offset went backwards recently) or MISSING (no committed offset: the
group never committed there, was deleted, or its offsets expired).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, NamedTuple

from gate._watermark import Partition, Snapshot, compute_watermarks


class DependencyStatus(StrEnum):
    OK = "OK"
    LAGGING = "LAGGING"
    REWOUND = "REWOUND"
    STALLED = "STALLED"
    MISSING = "MISSING"


# Most severe first: the overall status of a group is its worst partition.
SEVERITY: tuple[DependencyStatus, ...] = (
    DependencyStatus.MISSING,
    DependencyStatus.STALLED,
    DependencyStatus.REWOUND,
    DependencyStatus.LAGGING,
    DependencyStatus.OK,
)
_RANK = {status: rank for rank, status in enumerate(SEVERITY)}
OK, LAGGING, REWOUND, STALLED, MISSING = (
    DependencyStatus.OK,
    DependencyStatus.LAGGING,
    DependencyStatus.REWOUND,
    DependencyStatus.STALLED,
    DependencyStatus.MISSING,
)
_OK_RANK = _RANK[OK]
_MISSING_RANK = _RANK[MISSING]

RewindPolicy = Literal["follow", "keep_highest"]


@dataclass(frozen=True, slots=True)
class StatusPolicy:
    stall_after: float = 60.0
    """Seconds a group may have lag without committing before it is STALLED."""
    lag_window: float = 30.0
    """Seconds over which the lag trend is judged: LAGGING when the smallest lag seen in a
    window is larger than the smallest lag seen in the window before (the floor rises)."""
    rewind_window: float = 300.0
    """Seconds a group stays REWOUND after its committed offset went backwards."""
    rewind_policy: RewindPolicy = "follow"
    """``follow``: the watermark follows a rewound group down, so new records wait until it
    passes them again. ``keep_highest``: a group counts with the highest offset it ever
    committed on the partition's current log (records it processed once stay released); a
    log that moves backwards (a topic deleted and recreated) starts that history afresh, and
    a highest offset beyond the log's end never counts."""


@dataclass(frozen=True, slots=True)
class PollResult:
    """What one poll of the admin API saw, for all gates at once."""

    started_at: float
    finished_at: float
    partition_counts: Mapping[str, int]
    """Partitions per topic; a topic that does not exist is absent."""
    end_offsets: Mapping[Partition, int]
    committed: Mapping[str, Mapping[Partition, int]]
    """Committed offsets per group; a partition without a commit is absent."""
    failed_groups: frozenset[str] = frozenset()
    """Groups whose offsets could not be read in this poll."""
    failed_topics: frozenset[str] = frozenset()
    """Topics whose metadata could not be read in this poll."""
    errors: tuple[str, ...] = ()

    @property
    def duration(self) -> float:
        return self.finished_at - self.started_at


class GroupPosition(NamedTuple):
    """One dependency group on one partition (a tuple: built for every pair on every poll)."""

    committed: int | None
    lag: int | None
    status: DependencyStatus
    moved_at: float | None
    """When the committed offset last changed (None when there is none)."""


@dataclass(frozen=True, slots=True)
class PartitionState:
    topic: str
    partition: int
    end_offset: int | None
    watermark: int | None
    holding: tuple[str, ...]
    """Groups that hold this partition back: no commit, or committed exactly the watermark."""
    groups: Mapping[str, GroupPosition]

    def behind(self, offset: int) -> list[dict[str, object]]:
        """Groups that have not committed past ``offset``, and how many records they lack."""
        result: list[dict[str, object]] = []
        for group, position in self.groups.items():
            if position.committed is None:
                result.append(
                    {
                        "group": group,
                        "committed": None,
                        "behind_by": None,
                        "status": position.status.value,
                    }
                )
            elif position.committed <= offset:
                result.append(
                    {
                        "group": group,
                        "committed": position.committed,
                        "behind_by": offset + 1 - position.committed,
                        "status": position.status.value,
                    }
                )
        return result


@dataclass(frozen=True, slots=True)
class Rewind:
    group: str
    topic: str
    partition: int
    before: int
    after: int


@dataclass(frozen=True, slots=True)
class LogReset:
    """A partition's log moved backwards (the topic was deleted and recreated, or it
    vanished): the groups' history on it (highest offsets, rewinds) starts afresh."""

    topic: str
    partition: int
    before: int | None
    after: int | None


@dataclass(frozen=True, slots=True)
class LostOffset:
    """A committed offset that disappeared: group deleted or its offsets expired."""

    group: str
    topic: str
    partition: int
    last: int


@dataclass(frozen=True, slots=True)
class GateState:
    snapshot: Snapshot
    partitions: Mapping[Partition, PartitionState]
    groups: Mapping[str, DependencyStatus]
    missing_topics: tuple[str, ...] = ()
    changed: bool = True
    """Whether the watermarks differ from the previous state's."""
    rewinds: tuple[Rewind, ...] = ()
    lost: tuple[LostOffset, ...] = ()
    resets: tuple[LogReset, ...] = ()
    poll_duration: float = 0.0

    @property
    def gate(self) -> str:
        return self.snapshot.gate

    @property
    def version(self) -> int:
        return self.snapshot.version


class _Track:
    """Memory of one group on one partition across polls."""

    __slots__ = (
        "committed",
        "floor",
        "growing",
        "highest",
        "moved_at",
        "previous_floor",
        "rewound_at",
        "window_at",
    )

    def __init__(self, committed: int, now: float) -> None:
        self.committed = committed
        self.highest = committed
        self.moved_at = now
        self.rewound_at: float | None = None
        self.window_at = now
        self.floor: int | None = None
        self.previous_floor: int | None = None
        self.growing = False

    def observe_lag(self, lag: int | None, now: float, window: float) -> None:
        if lag is not None and (self.floor is None or lag < self.floor):
            self.floor = lag
        if now - self.window_at >= window:
            self.growing = bool(
                self.floor and self.previous_floor is not None and self.floor > self.previous_floor
            )
            self.previous_floor = self.floor
            self.floor = None
            self.window_at = now


@dataclass
class GateEvaluator:
    """Turns successive polls into versioned gate states. Pure: time comes from the poll."""

    gate: str
    topics: Sequence[str]
    groups: Sequence[str]
    policy: StatusPolicy = field(default_factory=StatusPolicy)
    version_floor: int = 0
    """Versions start above this (e.g. the version found in Redis at start)."""
    _tracks: dict[tuple[str, Partition], _Track] = field(default_factory=dict, repr=False)
    _ends: dict[Partition, int] = field(default_factory=dict, repr=False)
    _last: GateState | None = field(default=None, repr=False)

    @property
    def last(self) -> GateState | None:
        return self._last

    def next_version(self, started_at: float) -> int:
        previous = self._last.version if self._last else 0
        return max(previous + 1, int(started_at * 1000), self.version_floor + 1)

    def _reset_moved_logs(
        self, partitions: list[Partition], end_offsets: Mapping[Partition, int]
    ) -> list[LogReset]:
        """Forget the history of partitions whose log moved backwards or vanished."""
        current = set(partitions)
        resets = []
        for tp, before in list(self._ends.items()):
            after = end_offsets.get(tp) if tp in current else None
            if tp in current and (after is None or after >= before):
                continue
            if tp in current and after is not None:
                resets.append(LogReset(tp[0], tp[1], before, after))
            elif tp not in current:
                resets.append(LogReset(tp[0], tp[1], before, None))
            del self._ends[tp]
            for group in self.groups:
                self._tracks.pop((group, tp), None)
        for tp in partitions:
            end = end_offsets.get(tp)
            if end is not None:
                self._ends[tp] = end
        return resets

    def observe(self, poll: PollResult) -> GateState:
        now = poll.started_at
        policy = self.policy
        partitions: list[Partition] = []
        missing_topics: list[str] = []
        for topic in self.topics:
            count = poll.partition_counts.get(topic)
            if count is None:
                missing_topics.append(topic)
                continue
            partitions.extend((topic, p) for p in range(count))

        resets = self._reset_moved_logs(partitions, poll.end_offsets)
        rewinds: list[Rewind] = []
        lost: list[LostOffset] = []
        overall: dict[str, DependencyStatus] = {}
        positions: dict[Partition, dict[str, GroupPosition]] = {tp: {} for tp in partitions}
        effective: dict[str, dict[Partition, int]] = {group: {} for group in self.groups}
        keep_highest = policy.rewind_policy == "keep_highest"
        tracks = self._tracks

        stall_after = policy.stall_after
        rewind_window = policy.rewind_window
        lag_window = policy.lag_window
        end_offsets = poll.end_offsets
        for group in self.groups:
            group_committed = poll.committed.get(group, {})
            group_effective = effective[group]
            worst_rank = _OK_RANK
            for tp in partitions:
                committed = group_committed.get(tp)
                key = (group, tp)
                track = tracks.get(key)
                if committed is None:
                    if track is not None:
                        lost.append(LostOffset(group, tp[0], tp[1], track.committed))
                        del tracks[key]
                    positions[tp][group] = GroupPosition(None, None, MISSING, None)
                    worst_rank = _MISSING_RANK
                    continue
                end = end_offsets.get(tp)
                lag = (end - committed if end > committed else 0) if end is not None else None
                if track is None:
                    track = tracks[key] = _Track(committed, now)
                elif committed != track.committed:
                    if committed < track.committed:
                        rewinds.append(Rewind(group, tp[0], tp[1], track.committed, committed))
                        track.rewound_at = now
                    elif committed > track.highest:
                        track.highest = committed
                    track.committed = committed
                    track.moved_at = now
                track.observe_lag(lag, now, lag_window)
                # Status, most severe first (see SEVERITY).
                if lag and now - track.moved_at >= stall_after:
                    status = STALLED
                elif track.rewound_at is not None and now - track.rewound_at < rewind_window:
                    status = REWOUND
                elif track.growing:
                    status = LAGGING
                else:
                    status = OK
                positions[tp][group] = GroupPosition(committed, lag, status, track.moved_at)
                if keep_highest and (end is None or track.highest <= end):
                    group_effective[tp] = track.highest
                else:
                    group_effective[tp] = committed
                rank = _RANK[status]
                if rank < worst_rank:
                    worst_rank = rank
            overall[group] = SEVERITY[worst_rank]

        watermarks = compute_watermarks(partitions, effective)
        states: dict[Partition, PartitionState] = {}
        for tp in partitions:
            watermark = watermarks[tp]
            end = poll.end_offsets.get(tp)
            # Groups at the watermark hold the partition back only while records wait there.
            caught_up = watermark is not None and end is not None and watermark >= end
            holding = tuple(
                group
                for group in self.groups
                if not caught_up
                and (effective[group].get(tp) is None or effective[group][tp] == watermark)
            )
            states[tp] = PartitionState(tp[0], tp[1], end, watermark, holding, positions[tp])

        previous = self._last
        snapshot = Snapshot(
            gate=self.gate,
            version=self.next_version(now),
            polled_at=now,
            watermarks=watermarks,
        )
        state = GateState(
            snapshot=snapshot,
            partitions=states,
            groups=overall,
            missing_topics=tuple(missing_topics),
            changed=previous is None or previous.snapshot.watermarks != watermarks,
            rewinds=tuple(rewinds),
            lost=tuple(lost),
            resets=tuple(resets),
            poll_duration=poll.duration,
        )
        self._last = state
        return state
