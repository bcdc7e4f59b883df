"""The gate evaluator: versions, dependency statuses, rewinds and lost offsets (pure)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from gate import DependencyStatus, GateEvaluator, PollResult, StatusPolicy

OK, LAGGING, STALLED, REWOUND, MISSING = (
    DependencyStatus.OK,
    DependencyStatus.LAGGING,
    DependencyStatus.STALLED,
    DependencyStatus.REWOUND,
    DependencyStatus.MISSING,
)


def poll(
    at: float,
    committed: dict[str, dict[int, int]],
    end: dict[int, int] | None = None,
    partitions: int = 3,
) -> PollResult:
    return PollResult(
        started_at=at,
        finished_at=at + 0.01,
        partition_counts={"t": partitions},
        end_offsets={("t", p): o for p, o in (end or {}).items()},
        committed={g: {("t", p): o for p, o in offs.items()} for g, offs in committed.items()},
    )


def evaluator(**policy: object) -> GateEvaluator:
    return GateEvaluator("a", ["t"], ["b", "c"], StatusPolicy(**policy))  # type: ignore[arg-type]


def test_article_example_with_holding_groups() -> None:
    state = evaluator().observe(
        poll(
            1000.0, {"b": {0: 30, 1: 30, 2: 10}, "c": {0: 23, 1: 52, 2: 15}}, {0: 60, 1: 60, 2: 60}
        )
    )
    assert state.snapshot.watermarks == {("t", 0): 23, ("t", 1): 30, ("t", 2): 10}
    assert state.partitions[("t", 0)].holding == ("c",)
    assert state.partitions[("t", 1)].holding == ("b",)
    assert state.partitions[("t", 0)].groups["b"].lag == 30
    behind = state.partitions[("t", 0)].behind(23)
    assert behind == [{"group": "c", "committed": 23, "behind_by": 1, "status": "OK"}]


def test_a_partition_released_to_its_end_is_held_by_no_one() -> None:
    state = evaluator().observe(
        poll(1.0, {"b": {0: 60, 1: 30}, "c": {0: 60, 1: 60}}, {0: 60, 1: 60})
    )
    assert state.partitions[("t", 0)].holding == ()  # both at the end: nothing waits
    assert state.partitions[("t", 1)].holding == ("b",)
    unknown_end = evaluator().observe(poll(1.0, {"b": {0: 60}, "c": {0: 60}}, partitions=1))
    assert unknown_end.partitions[("t", 0)].holding == ("b", "c")


def test_missing_group_holds_the_partition_and_is_reported() -> None:
    state = evaluator().observe(poll(1.0, {"b": {0: 5, 1: 5, 2: 5}, "c": {0: 5}}))
    assert state.snapshot.watermarks[("t", 1)] is None
    assert state.partitions[("t", 1)].holding == ("c",)
    assert state.groups == {"b": OK, "c": MISSING}


def test_a_missing_topic_is_listed_and_has_no_partitions() -> None:
    ev = GateEvaluator("a", ["t", "gone"], ["b"])
    state = ev.observe(poll(1.0, {"b": {0: 1}}, partitions=1))
    assert state.missing_topics == ("gone",)
    assert set(state.partitions) == {("t", 0)}


def test_stalled_when_lag_persists_without_commits() -> None:
    ev = evaluator(stall_after=10.0)
    committed = {"b": {0: 5, 1: 5, 2: 5}, "c": {0: 9, 1: 9, 2: 9}}
    ev.observe(poll(0.0, committed, {0: 9, 1: 9, 2: 9}))
    assert ev.observe(poll(9.0, committed, {0: 9, 1: 9, 2: 9})).groups["b"] == OK
    state = ev.observe(poll(10.0, committed, {0: 9, 1: 9, 2: 9}))
    assert state.groups == {"b": STALLED, "c": OK}  # c has no lag: idle, not stalled
    moved = {"b": {0: 6, 1: 5, 2: 5}, "c": committed["c"]}
    state = ev.observe(poll(11.0, moved, {0: 9, 1: 9, 2: 9}))
    assert state.partitions[("t", 0)].groups["b"].status == OK
    assert state.partitions[("t", 1)].groups["b"].status == STALLED


def test_lagging_when_the_lag_floor_rises_from_window_to_window() -> None:
    ev = evaluator(lag_window=10.0, stall_after=1000.0)

    def step(at: float, b: int, c: int, end: int):
        return ev.observe(poll(at, {"b": {0: b}, "c": {0: c}}, {0: end}, partitions=1))

    # Window 1: b's lag dips to 2 at some point; c keeps up.
    step(0.0, 10, 12, 12)
    step(5.0, 20, 22, 22)
    assert step(10.0, 25, 30, 30).groups == {"b": OK, "c": OK}
    # Window 2: b's smallest lag is 8 > 2: it falls behind. c's dips to 0 again.
    step(15.0, 30, 40, 40)
    assert step(20.0, 40, 48, 48).groups == {"b": LAGGING, "c": OK}
    # Window 3: b catches up (floor 0): OK again.
    step(25.0, 60, 60, 60)
    assert step(30.0, 70, 70, 70).groups["b"] == OK


def test_rewind_follows_down_by_default_and_is_reported() -> None:
    ev = evaluator(rewind_window=60.0)
    ev.observe(poll(0.0, {"b": {0: 50}, "c": {0: 40}}, partitions=1))
    state = ev.observe(poll(1.0, {"b": {0: 10}, "c": {0: 40}}, partitions=1))
    assert state.snapshot.watermarks[("t", 0)] == 10
    assert [(r.group, r.before, r.after) for r in state.rewinds] == [("b", 50, 10)]
    assert state.groups["b"] == REWOUND
    assert ev.observe(poll(61.0, {"b": {0: 10}, "c": {0: 40}}, partitions=1)).groups["b"] == OK


def test_rewind_with_keep_highest_keeps_what_was_released() -> None:
    ev = evaluator(rewind_policy="keep_highest")
    ev.observe(poll(0.0, {"b": {0: 50}, "c": {0: 60}}, partitions=1))
    state = ev.observe(poll(1.0, {"b": {0: 10}, "c": {0: 60}}, partitions=1))
    assert state.snapshot.watermarks[("t", 0)] == 50
    assert len(state.rewinds) == 1


def test_lost_offsets_are_reported_once_and_release_nothing() -> None:
    ev = evaluator()
    ev.observe(poll(0.0, {"b": {0: 50}, "c": {0: 60}}, partitions=1))
    state = ev.observe(poll(1.0, {"b": {}, "c": {0: 60}}, partitions=1))
    assert [(lost.group, lost.last) for lost in state.lost] == [("b", 50)]
    assert state.snapshot.watermarks[("t", 0)] is None
    assert ev.observe(poll(2.0, {"b": {}, "c": {0: 60}}, partitions=1)).lost == ()


def test_changed_flag_tracks_watermark_changes_only() -> None:
    ev = evaluator()
    committed = {"b": {0: 1, 1: 1, 2: 1}, "c": {0: 1, 1: 1, 2: 1}}
    assert ev.observe(poll(0.0, committed)).changed
    assert not ev.observe(poll(1.0, committed, {0: 100})).changed
    committed["c"] = {0: 2, 1: 1, 2: 1}
    assert not ev.observe(poll(2.0, committed)).changed  # b still at 1
    committed["b"] = {0: 3, 1: 1, 2: 1}
    assert ev.observe(poll(3.0, committed)).changed


@given(st.lists(st.floats(0, 4e9, allow_nan=False), min_size=1, max_size=30), st.integers(0, 2**45))
def test_versions_strictly_increase_whatever_the_clock_does(times: list[float], floor: int) -> None:
    ev = GateEvaluator("a", ["t"], ["b"], version_floor=floor)
    versions = [ev.observe(poll(at, {"b": {0: 1}}, partitions=1)).version for at in times]
    assert versions[0] > floor
    assert all(b > a for a, b in itertools.pairwise(versions))


@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.integers(0, 2), st.integers(0, 100)),
            st.dictionaries(st.integers(0, 2), st.integers(0, 100)),
        ),
        min_size=1,
        max_size=15,
    )
)
def test_evaluator_watermarks_equal_the_pure_minimum_under_follow(history) -> None:
    ev = evaluator()
    for step, (b, c) in enumerate(history):
        state = ev.observe(poll(float(step), {"b": b, "c": c}))
        for p in range(3):
            expected = min(b[p], c[p]) if p in b and p in c else None
            assert state.snapshot.watermarks[("t", p)] == expected
            holding = state.partitions[("t", p)].holding
            assert holding and all(
                (g == "b" and (b.get(p) is None or b[p] == expected))
                or (g == "c" and (c.get(p) is None or c[p] == expected))
                for g in holding
            )


def test_keep_highest_starts_afresh_when_the_topic_is_recreated() -> None:
    """A recreated topic's records are released only once the dependencies pass them,
    whatever they committed on the old log."""
    gate = evaluator(rewind_policy="keep_highest")
    old = gate.observe(poll(1.0, {"b": {0: 100}, "c": {0: 100}}, {0: 100}, partitions=1))
    assert old.snapshot.watermarks[("t", 0)] == 100
    # Deleted and recreated: the log ends at 10, the groups restarted from the beginning.
    new = gate.observe(poll(2.0, {"b": {0: 5}, "c": {0: 7}}, {0: 10}, partitions=1))
    assert new.snapshot.watermarks[("t", 0)] == 5
    assert [(r.topic, r.partition, r.before, r.after) for r in new.resets] == [("t", 0, 100, 10)]
    assert new.rewinds == ()  # a new log is not a rewind
    # The new history is kept as usual: a later rewind on the new log keeps the highest.
    later = gate.observe(poll(3.0, {"b": {0: 8}, "c": {0: 9}}, {0: 12}, partitions=1))
    assert later.snapshot.watermarks[("t", 0)] == 8
    rewound = gate.observe(poll(4.0, {"b": {0: 2}, "c": {0: 9}}, {0: 12}, partitions=1))
    assert rewound.snapshot.watermarks[("t", 0)] == 8
    assert len(rewound.rewinds) == 1


def test_keep_highest_never_counts_an_offset_beyond_the_log() -> None:
    """Recreated and refilled between two polls (the end did not move backwards): a highest
    offset beyond the log's end cannot be one the group processed on this log."""
    gate = evaluator(rewind_policy="keep_highest")
    gate.observe(poll(1.0, {"b": {0: 100}, "c": {0: 100}}, {0: 100}, partitions=1))
    state = gate.observe(poll(2.0, {"b": {0: 100}, "c": {0: 100}}, {0: 100}, partitions=1))
    assert state.snapshot.watermarks[("t", 0)] == 100
    refilled = gate.observe(poll(3.0, {"b": {0: 3}, "c": {0: 90}}, {0: 150}, partitions=1))
    assert refilled.snapshot.watermarks[("t", 0)] == 100  # a rewind on the same log: kept
    shorter = GateEvaluator("a", ["t"], ["b"], StatusPolicy(rewind_policy="keep_highest"))
    shorter.observe(poll(1.0, {"b": {0: 100}}, {0: 100}, partitions=1))
    state = shorter.observe(poll(2.0, {"b": {0: 4}}, {0: 120}, partitions=1))
    assert state.snapshot.watermarks[("t", 0)] == 100
    state = shorter.observe(poll(3.0, {"b": {0: 4}}, {0: 50}, partitions=1))  # moved back
    assert state.snapshot.watermarks[("t", 0)] == 4


def test_a_vanished_topic_forgets_its_history() -> None:
    gate = evaluator(rewind_policy="keep_highest")
    gate.observe(poll(1.0, {"b": {0: 100}, "c": {0: 100}}, {0: 100}, partitions=1))
    gone = gate.observe(
        PollResult(
            started_at=2.0,
            finished_at=2.01,
            partition_counts={},
            end_offsets={},
            committed={"b": {}, "c": {}},
        )
    )
    assert gone.missing_topics == ("t",)
    assert [(r.partition, r.after) for r in gone.resets] == [(0, None)]
    back = gate.observe(poll(3.0, {"b": {0: 0}, "c": {0: 0}}, {0: 200}, partitions=1))
    assert back.snapshot.watermarks[("t", 0)] == 0
