"""Evaluation of one gate from successive polls: watermarks, versions and dependency status.

:class:`GateEvaluator` is a pure state machine: it receives a :class:`PollResult` (what the
admin API reported at one moment) and returns a :class:`GateState`. It remembers just enough
history to tell, in the spirit of LinkedIn Burrow, whether each dependency group is

* OK: its lag is small, or falling, or not growing steadily, and at most ``behind_after``
  seconds;
* LAGGING: its lag (in records) right after each of its commits has not fallen once across
  the whole ``lag_window``, has grown over it, and is more than ``lag_threshold`` seconds
  (see :class:`gate.evaluate._group.Track`: a group that commits less often than the gate
  polls is judged across its commits);
* BEHIND: its oldest unprocessed record is older than ``behind_after`` seconds, whether its
  lag grows or not (a lag that is large but steady is not OK either);
* STALLED: it has lag and its committed offset has not moved for ``stall_after`` seconds (a
  stuck or dead dependency holding everyone back);
* REWOUND: its committed offset went backwards within ``rewind_window``;
* MISSING: no committed offset (never committed there, deleted, or its offsets expired).

Lag is given in records and in seconds (``gate.evaluate._lag``: the age of the oldest record
the group has not processed). A partition is *held* by the group (or groups, when tied) whose
offset is the watermark, and only while records wait there. The gate's :class:`Verdict` tells
a healthy flow ("flowing: N records in transit, released within T, held back by G") from an
alarm ("stuck since T on G", or a topic or partition that does not exist), and, when the gate
knows the dependent's own group, whether the dependent itself is the bottleneck (records
released to it that it has not processed yet).

Records older than the gate's first poll have only lower bounds for their age, until their own
timestamps place them: :meth:`GateEvaluator.wanted_times` names the records whose timestamps
would make an age of the last state exact, the poller reads them, and
:meth:`GateEvaluator.seed` takes them in for the next state
(:func:`gate.poll._record_times.seed_record_times` does the three for a set of gates).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gate.evaluate._asked import WANTED_AT_MOST, TimesAsked
from gate.evaluate._group import GroupResult, StatusPolicy, Track, evaluate_group
from gate.evaluate._lag import EndHistory
from gate.evaluate._state import (
    GateState,
    GroupPositions,
    LogReset,
    LostOffset,
    PartitionState,
    PollResult,
    Position,
    RecordAt,
    Rewind,
)
from gate.evaluate._verdict import judge
from gate.evaluate._watermark import Partition, Snapshot, compute_watermarks

SHIFT_TOLERANCE = 0.01
"""Seconds the offset between the wall and monotonic clocks may drift from the one used so
far before it is taken anew (and everything evaluated afresh): times handed out are on the
poll's wall clock to within this."""


class _Seen(NamedTuple):
    """What the previous poll saw of the gate's partitions."""

    partitions: list[Partition]
    ends: dict[Partition, int | None]
    shift: float


@dataclass
class GateEvaluator:
    """Turns successive polls into versioned gate states. Pure: time comes from the poll."""

    gate: str
    topics: Sequence[str]
    groups: Sequence[str]
    policy: StatusPolicy = field(default_factory=StatusPolicy)
    version_floor: int = 0
    """Versions start above this (e.g. the version found in Redis at start)."""
    dependent: str | None = None
    """The dependent's own consumer group (its progress is shown against the watermark)."""
    _tracks: dict[str, dict[Partition, Track]] = field(default_factory=dict, repr=False)
    _ends: dict[Partition, EndHistory] = field(default_factory=dict, repr=False)
    _marks: dict[Partition, tuple[int | None, float]] = field(default_factory=dict, repr=False)
    incremental: bool = True
    """False: every group is evaluated on every partition at every poll (the reference the
    incremental evaluation is tested against)."""
    _dependent: Mapping[Partition, int] = field(default_factory=dict, repr=False)
    _last: GateState | None = field(default=None, repr=False)
    _seen: _Seen | None = field(default=None, repr=False)
    _evaluated: dict[str, GroupResult] = field(default_factory=dict, repr=False)
    _positions: dict[Partition, dict[str, Position]] = field(default_factory=dict, repr=False)
    _views: dict[Partition, GroupPositions] = field(default_factory=dict, repr=False)
    """The positions handed out per partition, the same object while they stay the same."""
    _counts: dict[str, int] = field(default_factory=dict, repr=False)
    """The most partitions seen per topic: fewer now means partitions do not exist."""
    _began: float | None = field(default=None, repr=False)
    """The wall time of the first poll evaluated."""
    _ever: set[str] = field(default_factory=set, repr=False)
    """Groups seen committing on the gate's partitions."""
    _known_groups: frozenset[str] | None = field(default=None, repr=False)
    """The cluster's consumer groups, as last listed (for suggesting close names)."""
    _now: float = field(default=0.0, repr=False)
    """When the last poll evaluated started, on the clock of the histories."""
    _asked: TimesAsked = field(default_factory=TimesAsked, repr=False)
    """The records whose timestamps were asked for."""
    _reevaluated: dict[str, GroupResult] = field(default_factory=dict, repr=False)
    """The groups the last poll evaluated again (the others have no lag)."""

    @property
    def last(self) -> GateState | None:
        return self._last

    def next_version(self, asked_at: float) -> int:
        """The version of a snapshot read at ``asked_at`` (wall clock): its milliseconds, above
        the previous version and the floor."""
        previous = self._last.version if self._last else 0
        return max(previous + 1, int(asked_at * 1000), self.version_floor + 1)

    def _reset_moved_logs(
        self, partitions: list[Partition], end_offsets: Mapping[Partition, int], now: float
    ) -> list[LogReset]:
        """Forget the history of partitions whose log moved backwards or vanished; record
        the end offsets seen."""
        current = set(partitions)
        resets = []
        for tp, history in list(self._ends.items()):
            before = history.ends[-1] if history.ends else None
            after = end_offsets.get(tp) if tp in current else None
            if tp in current and (after is None or before is None or after >= before):
                continue
            resets.append(LogReset(tp[0], tp[1], before, after))
            del self._ends[tp]
            self._asked.tried.pop(tp, None)
            self._marks.pop(tp, None)
            for tracks in self._tracks.values():
                tracks.pop(tp, None)
        for tp in partitions:
            end = end_offsets.get(tp)
            if end is not None:
                self._ends.setdefault(tp, EndHistory()).observe(now, end)
        return resets

    def _end_of(self, tp: Partition, end_offsets: Mapping[Partition, int]) -> int | None:
        """``tp``'s end in a poll, else the last one read (ends only grow: a lower bound)."""
        end = end_offsets.get(tp)
        if end is None:
            history = self._ends.get(tp)
            if history is not None and history.ends:
                return history.ends[-1]
        return end

    def observe(self, poll: PollResult) -> GateState:
        """The gate's state after ``poll``.

        Incremental: a group whose committed offsets are those of the previous poll, on
        partitions whose end offsets are those of the previous poll too, and that had no lag
        anywhere (caught up, or idle) keeps its positions and status without being looked at
        again, until a REWOUND status it carries expires. Only the partitions where a
        re-evaluated group's offset that counts for the watermark changed get their
        watermark and holding groups computed again (their positions are copied where they
        changed). Everything is evaluated afresh when the partitions, any end
        offset or the offset between the wall and monotonic clocks changed, or a log moved
        backwards: the result is the same as evaluating every group on every partition."""
        # Durations (stall, rewind and lag windows, lag in seconds) are measured on the
        # monotonic clock: a wall clock stepped back or forward moves none of them. Times
        # handed out are on the poll's wall clock (``shift`` from one to the other).
        now = poll.started_at if poll.monotonic is None else poll.monotonic
        wall = poll.started_at
        shift = wall - now
        self._now = now
        seen = self._seen
        if seen is not None and abs(seen.shift - shift) <= SHIFT_TOLERANCE:
            shift = seen.shift  # the clocks' offset jitters by microseconds between polls
        partitions, missing_topics, missing_partitions = self._partitions_of(poll)
        resets = self._reset_moved_logs(partitions, poll.end_offsets, now)
        ends = {tp: self._end_of(tp, poll.end_offsets) for tp in partitions}
        fresh = (
            not self.incremental
            or seen is None
            or bool(resets)
            or seen.partitions != partitions
            or seen.ends != ends
            or seen.shift != shift
        )
        self._seen = _Seen(partitions, ends, shift)
        rewinds: list[Rewind] = []
        lost: list[LostOffset] = []
        if fresh:
            self._evaluated = {}
        evaluated = self._evaluated
        moved: dict[str, GroupResult] = {}
        for group in self.groups:
            committed = poll.committed.get(group, {})
            previous = evaluated.get(group)
            if (
                previous is not None
                and now < previous.quiet_until
                and committed == previous.committed
            ):
                continue
            moved[group] = evaluate_group(
                self._tracks.setdefault(group, {}),
                self._ends,
                self.policy,
                group,
                committed,
                partitions,
                ends,
                now,
                shift,
                rewinds,
                lost,
            )

        if fresh:
            positions = {tp: {} for tp in partitions}
            for group, result in moved.items():
                for tp, position in result.positions.items():
                    positions[tp][group] = position
            changed = partitions
        else:
            positions = self._positions
            changes: dict[Partition, dict[str, Position]] = {}
            offsets_moved: dict[Partition, None] = {}
            for group, result in moved.items():
                before = evaluated[group].effective
                after = result.effective
                for tp, position in result.positions.items():
                    if positions[tp].get(group) != position:
                        changes.setdefault(tp, {})[group] = position
                    if after.get(tp) != before.get(tp):
                        offsets_moved[tp] = None
            positions = dict(positions)
            for tp, changed_here in changes.items():
                positions[tp] = {**positions[tp], **changed_here}  # copied: states share them
            changed = list(offsets_moved)
        evaluated.update(moved)
        self._reevaluated = moved
        for group, result in moved.items():
            if result.effective:
                self._ever.add(group)
        if poll.known_groups is not None:
            self._known_groups = poll.known_groups
        if self._began is None:
            self._began = wall
        self._positions = positions
        # Watermarks and holding groups anew where an offset that counts changed; elsewhere
        # those of the previous state (not fresh: the partitions and their ends are the same).
        effective = {group: evaluated[group].effective for group in self.groups}
        watermarks = compute_watermarks(changed, effective)
        last = self._last
        if len(changed) < len(partitions):
            assert last is not None
            previous_marks = last.snapshot.watermarks
            watermarks = {tp: watermarks.get(tp, previous_marks.get(tp)) for tp in partitions}

        if self.dependent and self.dependent not in poll.failed_groups:
            self._dependent = poll.committed.get(self.dependent, {})
        dependent = self._dependent  # the last known when reading it failed this time
        histories = self._ends
        recomputed = set(changed)
        if fresh:
            self._views = {}
        views = self._views
        states: dict[Partition, PartitionState] = {}
        for tp in partitions:
            watermark = watermarks[tp]
            end = ends[tp]
            mark = self._marks.get(tp)
            if mark is None or mark[0] != watermark:
                mark = self._marks[tp] = (watermark, now)
            caught_up = end is not None and (watermark or 0) >= end
            # Groups at the watermark hold the partition back only while records wait there.
            if tp not in recomputed:
                assert last is not None
                holding = last.partitions[tp].holding
            elif caught_up:
                holding = ()
            else:
                holding = tuple(
                    group
                    for group, offsets in effective.items()
                    if (offset := offsets.get(tp)) is None or offset == watermark
                )
            history = histories.get(tp)
            waiting_exact = True
            if caught_up:
                waiting_seconds: float | None = 0.0
            elif history is None:
                waiting_seconds = None
            else:
                waiting_seconds, waiting_exact = history.lag(watermark or 0, now)
            view = views.get(tp)
            if view is None or not view.built_from(positions[tp]):
                view = views[tp] = GroupPositions(positions[tp])
            states[tp] = PartitionState(
                tp[0],
                tp[1],
                end,
                watermark,
                holding,
                view,
                mark[1] + shift,
                waiting_seconds,
                dependent.get(tp),
                waiting_exact,
            )

        previous_state = self._last
        snapshot = Snapshot(
            gate=self.gate,
            version=self.next_version(wall if poll.asked_at is None else poll.asked_at),
            polled_at=wall,
            watermarks=watermarks,
        )
        state = GateState(
            snapshot=snapshot,
            partitions=states,
            groups={group: evaluated[group].status for group in self.groups},
            missing_topics=tuple(missing_topics),
            missing_partitions=tuple(missing_partitions),
            changed=previous_state is None or previous_state.snapshot.watermarks != watermarks,
            rewinds=tuple(rewinds),
            lost=tuple(lost),
            resets=tuple(resets),
            poll_duration=poll.duration,
            verdict=judge(
                states.values(),
                wall,
                self.policy.stall_after,
                (*missing_topics, *(f"{t}[{p}]" for t, p in missing_partitions)),
                self._began,
                self._ever,
                self._hint,
            ),
            dependent=self.dependent,
            monotonic=poll.monotonic,
            group_lags={group: evaluated[group].lag for group in self.groups},
            evaluated=len(moved),
            carried={g: poll.carried[g] for g in self.groups if g in poll.carried},
            began=self._began,
            read=(
                None
                if poll.asked_at is None or poll.answered_at is None
                else (poll.asked_at, poll.answered_at)
            ),
        )
        self._last = state
        return state

    def wanted_times(self, limit: int = WANTED_AT_MOST) -> list[RecordAt]:
        """The records whose timestamps would make ages of the last state exact (see
        :meth:`gate.evaluate._asked.TimesAsked.wanted`), ``limit`` at most."""
        if self._last is None:
            return []
        return self._asked.wanted(self._last, self._ends, self._reevaluated, self._now, limit)

    def seed(self, times: Mapping[RecordAt, float | None]) -> int:
        """Take in the timestamps read for records (see
        :meth:`gate.evaluate._asked.TimesAsked.seed`); the next state's ages there are exact.
        Returns how many were taken."""
        if self._seen is None:
            return 0
        return self._asked.seed(times, self._ends, self._seen.shift)

    def _hint(self, group: str) -> str | None:
        """A group on the cluster whose name is close to ``group`` (a misspelt dependency),
        as ``gate check`` suggests it."""
        known = self._known_groups
        if not known or group in known:
            return None
        return closest(group, sorted(known))

    def _partitions_of(
        self, poll: PollResult
    ) -> tuple[list[Partition], list[str], list[Partition]]:
        """The gate's partitions now, its topics that do not exist, and the partitions seen
        before that no longer exist (a topic has fewer now)."""
        partitions: list[Partition] = []
        missing_topics: list[str] = []
        missing_partitions: list[Partition] = []
        for topic in self.topics:
            count = poll.partition_counts.get(topic)
            if not count:
                missing_topics.append(topic)
                continue
            seen = self._counts.setdefault(topic, count)
            if count > seen:
                self._counts[topic] = count
            missing_partitions.extend((topic, p) for p in range(count, seen))
            partitions.extend((topic, p) for p in range(count))
        return partitions, missing_topics, missing_partitions


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``name`` when one is close enough to be a misspelling."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None
