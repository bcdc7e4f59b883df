"""Incremental evaluation: a gate evaluator that re-evaluates only the groups that can have
changed gives, after every poll, exactly the state of one that evaluates every group on every
partition (pure, a state machine over everything a cluster can do between two polls)."""

from __future__ import annotations

import dataclasses

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gate import DependencyStatus, GateEvaluator, GateState, PollResult, StatusPolicy
from gate.evaluate._state import GroupLag

GROUPS = ["b", "c", "d"]
TOPIC = "t"


def lags_from_positions(state: GateState) -> dict[str, GroupLag]:
    """Each group's lag summed over its positions (what the status page's history shows)."""
    records: dict[str, int | None] = dict.fromkeys(state.groups, 0)
    seconds: dict[str, float | None] = dict.fromkeys(state.groups)
    for part in state.partitions.values():
        for group, position in part.groups.items():
            if position.committed is None and part.end_offset != 0:
                records[group] = None  # no commit where records are: unknown, never 0
            elif records[group] is not None:
                records[group] = (records[group] or 0) + (position.lag or 0)
            if position.lag_seconds is not None:
                seconds[group] = max(seconds[group] or 0.0, round(position.lag_seconds, 3))
    return {group: GroupLag(records[group], seconds[group]) for group in state.groups}


class IncrementalAgainstFull(RuleBasedStateMachine):
    """A cluster of one topic and three dependency groups, polled by two evaluators."""

    @initialize(
        policy=st.sampled_from(["follow", "keep_highest"]),
        stall_after=st.sampled_from([2.0, 5.0]),
        rewind_window=st.sampled_from([1.0, 3.0]),
        behind_after=st.sampled_from([1.0, 6.0]),
    )
    def start(
        self, policy: str, stall_after: float, rewind_window: float, behind_after: float
    ) -> None:
        status = StatusPolicy(
            stall_after=stall_after,
            lag_window=4.0,
            lag_threshold=1.0,
            behind_after=behind_after,
            rewind_window=rewind_window,
            rewind_policy=policy,  # type: ignore[arg-type]
        )
        self.full = GateEvaluator("a", [TOPIC], GROUPS, status, dependent="z", incremental=False)
        self.incremental = GateEvaluator("a", [TOPIC], GROUPS, status, dependent="z")
        self.partitions = 2
        self.ends = {p: 0 for p in range(4)}
        self.committed: dict[str, dict[int, int]] = {g: {} for g in [*GROUPS, "z"]}
        self.now = 1000.0
        self.shift = 1_700_000_000.0
        self.polls = 0
        self.skipped = 0

    @rule(seconds=st.sampled_from([0.2, 0.5, 1.0, 2.5, 7.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(partition=st.integers(0, 3), records=st.integers(1, 30))
    def produce(self, partition: int, records: int) -> None:
        self.ends[partition] += records

    @rule(group=st.sampled_from([*GROUPS, "z"]), partition=st.integers(0, 3), data=st.data())
    def commit(self, group: str, partition: int, data: st.DataObject) -> None:
        """Anywhere up to the end: forward, to the end (caught up), or back (a rewind)."""
        end = self.ends[partition]
        offset = data.draw(st.one_of(st.just(end), st.integers(0, end)))
        self.committed[group][partition] = offset

    @rule(group=st.sampled_from(GROUPS), partition=st.integers(0, 3))
    def offsets_expire(self, group: str, partition: int) -> None:
        self.committed[group].pop(partition, None)

    @rule(partitions=st.integers(1, 4))
    def partitions_change(self, partitions: int) -> None:
        """Partitions added, or fewer seen (a topic recreated with fewer)."""
        self.partitions = partitions

    @rule(partition=st.integers(0, 3))
    def log_recreated(self, partition: int) -> None:
        """The topic deleted and recreated: the log starts again from 0."""
        self.ends[partition] = 0
        for offsets in self.committed.values():
            offsets.pop(partition, None)

    @rule(seconds=st.sampled_from([-3600.0, 0.0005, 30.0]))
    def wall_clock_steps(self, seconds: float) -> None:
        self.shift += seconds

    @rule(topic_missing=st.booleans(), ends_known=st.booleans())
    def poll(self, topic_missing: bool, ends_known: bool) -> None:
        count = 0 if topic_missing else self.partitions
        poll = PollResult(
            started_at=self.now + self.shift,
            finished_at=self.now + self.shift + 0.01,
            partition_counts={TOPIC: count} if count else {},
            end_offsets={(TOPIC, p): self.ends[p] for p in range(count)} if ends_known else {},
            committed={
                g: {(TOPIC, p): o for p, o in offsets.items() if p < count}
                for g, offsets in self.committed.items()
            },
            monotonic=self.now,
        )
        expected = self.full.observe(poll)
        got = self.incremental.observe(poll)
        self.polls += 1
        self.skipped += len(GROUPS) - got.evaluated
        assert expected.evaluated == len(GROUPS)
        assert dataclasses.replace(got, evaluated=expected.evaluated) == expected
        assert got.group_lags == expected.group_lags == lags_from_positions(expected)

    @invariant()
    def versions_agree(self) -> None:
        if self.full.last is not None:
            assert self.incremental.last is not None
            assert self.incremental.last.version == self.full.last.version


IncrementalAgainstFull.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)
test_incremental_evaluation_equals_the_full_one = IncrementalAgainstFull.TestCase


def test_a_quiet_fleet_is_not_evaluated_again() -> None:
    """Caught-up groups whose offsets did not move are skipped; one that commits, and only it,
    is evaluated again; an end offset that moves evaluates all of them."""
    groups = [f"g{i}" for i in range(50)]
    evaluator = GateEvaluator("a", [TOPIC], groups)

    def poll(at: float, committed: dict[str, int], end: int) -> PollResult:
        return PollResult(
            started_at=at,
            finished_at=at,
            partition_counts={TOPIC: 4},
            end_offsets={(TOPIC, p): end for p in range(4)},
            committed={g: {(TOPIC, p): committed.get(g, 10) for p in range(4)} for g in groups},
        )

    assert evaluator.observe(poll(1.0, {}, 10)).evaluated == 50
    assert evaluator.observe(poll(2.0, {}, 10)).evaluated == 0
    state = evaluator.observe(poll(3.0, {"g7": 9}, 10))  # g7 rewinds: it alone is looked at
    assert state.evaluated == 1
    assert state.snapshot.watermark(TOPIC, 0) == 9
    assert state.partitions[(TOPIC, 0)].holding == ("g7",)
    assert evaluator.observe(poll(4.0, {"g7": 9}, 12)).evaluated == 50  # records arrive


def test_a_skipped_group_s_rewound_status_expires_on_time() -> None:
    """A group that rewound, then caught up, is skipped while nothing moves, but its REWOUND
    status still ends when the rewind window does."""
    evaluator = GateEvaluator("a", [TOPIC], ["b"], StatusPolicy(rewind_window=3.0))

    def poll(at: float, committed: int) -> PollResult:
        return PollResult(
            started_at=at,
            finished_at=at,
            partition_counts={TOPIC: 1},
            end_offsets={(TOPIC, 0): 10},
            committed={"b": {(TOPIC, 0): committed}},
        )

    evaluator.observe(poll(1.0, 10))
    assert evaluator.observe(poll(2.0, 4)).groups["b"] == DependencyStatus.REWOUND
    assert evaluator.observe(poll(3.0, 10)).groups["b"] == DependencyStatus.REWOUND
    state = evaluator.observe(poll(4.0, 10))
    assert (state.evaluated, state.groups["b"]) == (0, DependencyStatus.REWOUND)
    state = evaluator.observe(poll(5.5, 10))  # the window (3 s from the rewind at 2 s) is over
    assert (state.evaluated, state.groups["b"]) == (1, DependencyStatus.OK)
