"""What one evaluation of a gate says: its partitions, dependency groups and verdict.

The data :class:`~gate.evaluate._status.GateEvaluator` produces from each
:class:`PollResult`; nothing here computes anything.
"""

from __future__ import annotations

import marshal
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, NamedTuple

from gate.evaluate._watermark import Partition, Snapshot


class DependencyStatus(StrEnum):
    OK = "OK"
    LAGGING = "LAGGING"
    BEHIND = "BEHIND"
    REWOUND = "REWOUND"
    STALLED = "STALLED"
    MISSING = "MISSING"


# Most severe first: the overall status of a group is its worst partition.
SEVERITY: tuple[DependencyStatus, ...] = (
    DependencyStatus.MISSING,
    DependencyStatus.STALLED,
    DependencyStatus.REWOUND,
    DependencyStatus.LAGGING,
    DependencyStatus.BEHIND,
    DependencyStatus.OK,
)
_RANK = {status: rank for rank, status in enumerate(SEVERITY)}
OK, LAGGING, BEHIND, REWOUND, STALLED, MISSING = (
    DependencyStatus.OK,
    DependencyStatus.LAGGING,
    DependencyStatus.BEHIND,
    DependencyStatus.REWOUND,
    DependencyStatus.STALLED,
    DependencyStatus.MISSING,
)
_OK_RANK = _RANK[OK]
_MISSING_RANK = _RANK[MISSING]


@dataclass(frozen=True, slots=True)
class PollResult:
    """What one poll of the admin API saw, for all gates at once."""

    started_at: float
    """When the poll started, on the wall clock (seconds since the epoch)."""
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
    answered: bool = True
    """Whether the cluster answered any of this poll's reads (metadata, end offsets or a
    group's offsets); a poll that asked nothing carries the previous poll's answer."""
    monotonic: float | None = None
    """When the poll started, on the monotonic clock: what durations are measured on (None:
    ``started_at`` stands for it)."""
    carried: Mapping[str, float] = field(default_factory=dict)
    """Groups whose offsets in ``committed`` this poll did not read but carried from their
    last read (idle and caught up: see ``idle_poll_interval_ms``), and when that read's poll
    started (wall clock)."""
    known_groups: frozenset[str] | None = None
    """The consumer groups the cluster lists, when this poll asked (a dependency had no
    committed offset anywhere): for suggesting a close name. None: not asked this time."""
    asked_at: float | None = None
    """When this poll asked the cluster for the groups' and the logs' offsets (wall clock),
    after anything it did first (a metadata refresh): what its snapshots' versions come from,
    so that of two replicas' polls the one that read later wins. None: ``started_at``."""
    answered_at: float | None = None
    """When the last answer to those requests came in (wall clock): with ``asked_at``, the
    time the read may have taken the offsets at. None: unknown."""

    @property
    def duration(self) -> float:
        return max(0.0, self.finished_at - self.started_at)  # a clock stepped back mid-poll

    def refreshes(self, topics: Iterable[str], groups: Iterable[str]) -> bool:
        """Whether this poll read the metadata of every one of ``topics`` and the offsets of
        every one of ``groups``: a gate on them can be evaluated from it."""
        return self.failed_topics.isdisjoint(topics) and self.failed_groups.isdisjoint(groups)


RecordAt = tuple[str, int, int]
"""A record: ``(topic, partition, offset)``."""


class GroupPosition(NamedTuple):
    """One dependency group on one partition (a tuple: built for every pair on every poll)."""

    committed: int | None
    lag: int | None
    status: DependencyStatus
    moved_at: float | None
    """When the committed offset last changed (None when there is none)."""
    lag_seconds: float | None = None
    """Age of the oldest record the group has not processed (None: no commit or no end)."""
    lag_exact: bool = True
    """False when coarse: the record is older than the gate's history (a lower bound), or
    the samples around it are far apart for its age."""


Position = tuple[int | None, int | None, int, float | None, float | None, bool]
"""A :class:`GroupPosition` as the evaluation keeps it: a plain tuple with the status's rank
in :data:`SEVERITY`. The collector stops tracking plain tuples of numbers (not named tuples,
nor tuples holding an enum member), and a gate keeps one per group and partition: at 1,000
groups on 64 partitions, full collections over them cost more than the evaluation itself."""


class GroupPositions(Mapping[str, GroupPosition]):
    """A partition's groups and their positions, built from the evaluation's
    :data:`Position` tuples when asked for (most polls, nobody asks).

    Pickled, it is one ``marshal`` blob, made once per object: the evaluation keeps the same
    object while the partition's positions stay the same, and the gate service's process
    decodes it only when something reads it (states cross from the admin client's process
    every poll)."""

    __slots__ = ("_blob", "_kept")

    def __init__(self, kept: Mapping[str, Position]) -> None:
        self._kept: Mapping[str, Position] | None = kept
        self._blob: bytes | None = None

    @classmethod
    def _decoded(cls, blob: bytes) -> GroupPositions:
        """Unpickled: the blob, decoded at the first read."""
        positions = cls.__new__(cls)
        positions._kept, positions._blob = None, blob
        return positions

    def __reduce__(self) -> tuple[object, tuple[bytes]]:
        blob = self._blob
        if blob is None:
            blob = self._blob = marshal.dumps(dict(self._positions()))
        return GroupPositions._decoded, (blob,)

    def built_from(self, kept: Mapping[str, Position]) -> bool:
        """Whether these are the positions of ``kept`` (the very mapping)."""
        return self._kept is kept

    def tuples(self) -> Mapping[str, Position]:
        """The positions as the evaluation keeps them: for readers that go over every group
        (building a :class:`GroupPosition` for each costs more than reading it)."""
        return self._positions()

    def _positions(self) -> Mapping[str, Position]:
        kept = self._kept
        if kept is None:
            assert self._blob is not None
            kept = self._kept = marshal.loads(self._blob)
        return kept

    def __getitem__(self, group: str) -> GroupPosition:
        committed, lag, rank, moved_at, seconds, exact = self._positions()[group]
        return GroupPosition(committed, lag, SEVERITY[rank], moved_at, seconds, exact)

    def __iter__(self) -> Iterator[str]:
        return iter(self._positions())

    def __len__(self) -> int:
        return len(self._positions())

    def __contains__(self, group: object) -> bool:
        return group in self._positions()

    def __repr__(self) -> str:
        return f"GroupPositions({dict(self)!r})"


def position_tuples(groups: Mapping[str, GroupPosition]) -> Mapping[str, Position]:
    """A partition's positions as the evaluation keeps them (see :data:`Position`): for
    readers that go over every group of a fleet."""
    if isinstance(groups, GroupPositions):
        return groups.tuples()
    return {
        group: (p.committed, p.lag, _RANK[p.status], p.moved_at, p.lag_seconds, p.lag_exact)
        for group, p in groups.items()
    }


class GroupLag(NamedTuple):
    """A group over all partitions of a gate."""

    records: int | None
    """Records behind the end, summed over the partitions; None when it has no committed
    offset on a partition that has records (its lag there is unknown, never 0)."""
    seconds: float | None
    """Age of the oldest record it has not processed (None: unknown everywhere)."""


@dataclass(frozen=True, slots=True)
class PartitionState:
    topic: str
    partition: int
    end_offset: int | None
    watermark: int | None
    holding: tuple[str, ...]
    """Groups that hold this partition back while records wait: those whose offset is the
    watermark (ties together), or that have no commit."""
    groups: Mapping[str, GroupPosition]
    watermark_moved_at: float | None = None
    """When the watermark last changed (first seen: the first poll that saw it)."""
    waiting_seconds: float | None = None
    """Age of the oldest record held back (0 when none waits; None when unknown)."""
    dependent: int | None = None
    """The dependent's own committed offset, when its group is known and has one."""
    waiting_exact: bool = True
    """False when ``waiting_seconds`` is a lower bound (the records are older than the gate's
    history: it started after them) or coarse."""

    @property
    def waiting(self) -> int | None:
        """Records held back (None when the end is unknown)."""
        if self.end_offset is None:
            return None
        return max(0, self.end_offset - (self.watermark or 0))

    @property
    def released_unprocessed(self) -> int:
        """Records released to the dependent that it has not committed yet."""
        if self.dependent is None or self.watermark is None:
            return 0
        return max(0, self.watermark - self.dependent)

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


VerdictState = Literal["released", "flowing", "stuck", "missing"]


@dataclass(frozen=True, slots=True)
class Uncommitted:
    """A dependency group without a committed offset on partitions where records wait: they
    cannot be released until it commits there (an alarm from the first poll)."""

    group: str
    partitions: tuple[str, ...]
    """As ``topic[partition]``."""
    records: int
    """Records waiting on those partitions: all of them, for a group that never committed."""
    ever: bool
    """Whether the gate saw it commit on any of the gate's partitions (its offsets were lost
    since) or not (never committed, or a misspelt name)."""
    hint: str | None = None
    """A close name among the cluster's groups (a misspelt dependency), when there is one."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The gate in one line: everything released, flowing, or an alarm: stuck, or missing
    (a topic or partition of the gate does not exist, so nothing on it is released)."""

    state: VerdictState
    records_waiting: int
    released_within: float | None
    """Flowing: the age of the oldest record held back (how long records wait)."""
    stuck_since: float | None
    """Stuck: since when records have waited on the longest-stuck partition with its
    watermark still (the later of its last move and the oldest waiting record's arrival)."""
    stuck_on: tuple[str, ...]
    """Stuck: the groups holding the stuck partitions."""
    released_unprocessed: int
    """Records released to the dependent that it has not committed yet."""
    bottleneck: Literal["dependencies", "dependent"] | None
    """Who the records wait for: the dependencies (held back) or the dependent itself."""
    holding: tuple[str, ...] = ()
    """The groups holding records back, the one holding the most partitions first."""
    missing: tuple[str, ...] = ()
    """Missing: the topics, and partitions as ``topic[partition]``, that do not exist."""
    uncommitted: tuple[Uncommitted, ...] = ()
    """Stuck: groups without a committed offset where records wait."""
    at_least: bool = False
    """``released_within``, or the time since ``stuck_since``, is a lower bound: the records
    or the stall are older than what the gate has seen (it started after them)."""


RELEASED = Verdict("released", 0, None, None, (), 0, None)


@dataclass(frozen=True, slots=True)
class GateState:
    snapshot: Snapshot
    partitions: Mapping[Partition, PartitionState]
    groups: Mapping[str, DependencyStatus]
    missing_topics: tuple[str, ...] = ()
    missing_partitions: tuple[Partition, ...] = ()
    """Partitions the gate saw before that no longer exist (the topic has fewer now)."""
    changed: bool = True
    """Whether the watermarks differ from the previous state's."""
    rewinds: tuple[Rewind, ...] = ()
    lost: tuple[LostOffset, ...] = ()
    resets: tuple[LogReset, ...] = ()
    poll_duration: float = 0.0
    verdict: Verdict = RELEASED
    dependent: str | None = None
    """The dependent's own consumer group, when the gate follows it."""
    monotonic: float | None = None
    """When its poll started on the monotonic clock (None: unknown)."""
    group_lags: Mapping[str, GroupLag] = field(default_factory=dict)
    """Each dependency group's lag over all partitions."""
    evaluated: int = 0
    """Groups the poll evaluated again (the others kept their positions: nothing moved)."""
    carried: Mapping[str, float] = field(default_factory=dict)
    """Dependency groups whose offsets the poll carried from an earlier read, and when that
    read was (wall clock; see :attr:`PollResult.carried`)."""
    began: float | None = None
    """The wall time of the evaluator's first poll: a time at or before it (a commit or a
    watermark first seen then) stands for "at least since then"."""
    read: tuple[float, float] | None = None
    """When its poll asked for the offsets and when the last answer came (wall clock): the
    time the broker read them is in between. Two replicas' reads overlap when each began
    before the other ended; then neither is known to be the newer (None: unknown)."""

    @property
    def gate(self) -> str:
        return self.snapshot.gate

    @property
    def version(self) -> int:
        return self.snapshot.version

    def now(self, monotonic: float, wall: float) -> float:
        """The present on the wall clock of this state's poll: its time plus the monotonic
        time passed since (``wall`` when that is unknown). Ages computed from it are the time
        that passed, even when the wall clock has been stepped since the poll."""
        if self.monotonic is None:
            return wall
        return self.snapshot.polled_at + max(0.0, monotonic - self.monotonic)
