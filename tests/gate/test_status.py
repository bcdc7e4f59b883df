"""The gate evaluator: versions, dependency statuses, rewinds and lost offsets (pure)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from gate import DependencyStatus, GateEvaluator, PollResult, StatusPolicy
from gate.report._report import gate_summary

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


def test_lagging_only_when_the_lag_grows_across_the_whole_window() -> None:
    """The end grows 10 records a second. b falls further behind at every poll for longer
    than the window, and its oldest unprocessed record is older than the threshold: LAGGING.
    c's lag wobbles (falls now and then): never LAGGING."""
    ev = evaluator(lag_window=10.0, lag_threshold=5.0, stall_after=1000.0)
    states = []
    for second in range(0, 31):
        end = 10 * second + 10
        b = 5 * second + 10  # its lag grows by 5 records a second
        c = end - (3 if second % 2 else 0)  # keeps up, lag 0 or 3
        states.append(ev.observe(poll(float(second), {"b": {0: b}, "c": {0: c}}, {0: end}, 1)))
    assert all(s.groups["c"] == OK for s in states)
    assert states[5].groups["b"] == OK  # not a whole window yet
    assert states[25].groups["b"] == LAGGING
    lagging = states[25].partitions[("t", 0)].groups["b"]
    assert lagging.lag == 125 and lagging.lag_seconds is not None and lagging.lag_seconds > 5
    # It catches up a little: its lag fell, so the trend starts again.
    caught = ev.observe(poll(31.0, {"b": {0: 300}, "c": {0: 320}}, {0: 320}, 1))
    assert caught.groups["b"] == OK


def test_a_growing_lag_of_a_few_seconds_is_not_lagging() -> None:
    ev = evaluator(lag_window=5.0, lag_threshold=30.0, stall_after=1000.0)
    for second in range(20):
        state = ev.observe(
            poll(float(second), {"b": {0: second}, "c": {0: 2 * second}}, {0: 2 * second}, 1)
        )
    assert state.groups["b"] == OK  # 20 s behind at most, below the 30 s threshold


def test_lag_in_seconds_is_the_age_of_the_oldest_unprocessed_record() -> None:
    ev = evaluator(stall_after=1000.0)
    ev.observe(poll(100.0, {"b": {0: 0}, "c": {0: 0}}, {0: 0}, 1))
    ev.observe(poll(110.0, {"b": {0: 0}, "c": {0: 0}}, {0: 10}, 1))  # 10 records appended
    ev.observe(poll(120.0, {"b": {0: 0}, "c": {0: 10}}, {0: 20}, 1))
    state = ev.observe(poll(130.0, {"b": {0: 5}, "c": {0: 20}}, {0: 20}, 1))
    b = state.partitions[("t", 0)].groups["b"]
    # Offset 5 was appended between 100 s and 110 s (end 0 -> 10): about 106 s.
    assert b.lag == 15 and b.lag_exact and 23.0 <= b.lag_seconds <= 25.0  # type: ignore[operator]
    assert state.partitions[("t", 0)].groups["c"].lag_seconds == 0.0
    # The oldest waiting record is offset 5 (the watermark): the same age.
    assert state.partitions[("t", 0)].waiting_seconds == b.lag_seconds


def test_the_verdict_tells_a_flow_from_a_stall() -> None:
    ev = evaluator(stall_after=10.0)
    flowing = None
    for second in range(8):
        flowing = ev.observe(
            poll(float(second), {"b": {0: second}, "c": {0: second + 1}}, {0: second + 3}, 1)
        )
    assert flowing is not None and flowing.verdict is not None
    assert flowing.verdict.state == "flowing"
    assert flowing.verdict.records_waiting == 3
    assert flowing.verdict.released_within is not None
    # b stops committing while records keep coming: stuck on b once stall_after passed.
    for second in range(8, 20):
        state = ev.observe(poll(float(second), {"b": {0: 7}, "c": {0: second}}, {0: second + 3}, 1))
    assert state.verdict is not None and state.verdict.state == "stuck"
    assert state.verdict.stuck_on == ("b",) and state.verdict.stuck_since == 7.0
    released = ev.observe(poll(21.0, {"b": {0: 30}, "c": {0: 30}}, {0: 30}, 1))
    assert released.verdict is not None and released.verdict.state == "released"


def test_an_end_offset_a_poll_could_not_read_is_the_last_one_read() -> None:
    """A poll that read the groups but not a partition's end (the broker hung): what waits
    there is at least what waited at the last end read (a log's end only grows), never
    nothing: the gate is not said to have released every record."""
    ev = evaluator()
    for second in range(5):
        flowing = ev.observe(poll(float(second), {"b": {0: 5}, "c": {0: 6}}, {0: 20}, 1))
    assert flowing.verdict is not None and flowing.verdict.state == "flowing"
    unread = ev.observe(poll(5.0, {"b": {0: 5}, "c": {0: 6}}, {}, 1))
    assert unread.verdict is not None and unread.verdict.state == "flowing"
    assert unread.verdict.records_waiting == 15
    assert unread.partitions[("t", 0)].end_offset == 20
    moved = ev.observe(poll(6.0, {"b": {0: 20}, "c": {0: 20}}, {}, 1))
    assert moved.verdict is not None and moved.verdict.state == "released"
    grown = ev.observe(poll(7.0, {"b": {0: 20}, "c": {0: 20}}, {0: 30}, 1))
    assert grown.verdict is not None and grown.verdict.records_waiting == 10


def test_a_verdict_older_than_the_readiness_limit_is_unknown() -> None:
    """No poll has succeeded for longer than the service's readiness limit: the status no
    longer says "flowing" (the last snapshot's news is old); it says it does not know, and
    what the last poll said."""
    ev = evaluator()
    state = ev.observe(poll(100.0, {"b": {0: 5}, "c": {0: 6}}, {0: 9}, 1))
    assert state.verdict is not None and state.verdict.state == "flowing"
    fresh = gate_summary(state, 105.0, stale_after=10.0)
    assert fresh["verdict"]["state"] == "flowing" and fresh["stale_after_s"] == 10.0
    stale = gate_summary(state, 130.0, stale_after=10.0)["verdict"]
    assert stale["state"] == "unknown"
    assert stale["text"].startswith("unknown: no poll has succeeded for 30 s")
    assert "said: flowing: 4 records in transit" in stale["text"]
    assert stale["records_waiting"] == 4  # the last snapshot's figures stay
    assert gate_summary(state, 130.0)["verdict"]["state"] == "flowing"  # no limit given


def test_the_dependent_s_own_progress_names_the_bottleneck() -> None:
    ev = GateEvaluator("a", ["t"], ["b"], StatusPolicy(), dependent="a")
    state = ev.observe(poll(1.0, {"b": {0: 90}, "a": {0: 10}}, {0: 100}, 1))
    part = state.partitions[("t", 0)]
    assert part.dependent == 10 and part.released_unprocessed == 80
    assert state.verdict is not None and state.verdict.bottleneck == "dependent"
    state = ev.observe(poll(2.0, {"b": {0: 90}, "a": {0: 90}}, {0: 100}, 1))
    assert state.verdict is not None and state.verdict.bottleneck == "dependencies"


lags = st.lists(st.integers(0, 50), min_size=2, max_size=40)


@settings(max_examples=200)
@given(lags, st.integers(1, 5))
def test_a_group_whose_lag_never_grows_is_never_lagging(falling: list[int], step: int) -> None:
    """However long, a group whose lag is bounded and non-increasing is never LAGGING, and
    while its committed offset keeps moving it is never STALLED."""
    ev = evaluator(lag_window=3.0, lag_threshold=0.0, stall_after=2.5 * step)
    lag_values = sorted(falling, reverse=True)
    end = 1000
    for i, lag in enumerate(lag_values):
        end += 7
        committed = end - lag
        state = ev.observe(poll(float(i * step), {"b": {0: committed}, "c": {0: end}}, {0: end}, 1))
        assert state.groups["b"] not in (LAGGING, STALLED), (i, lag_values)


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), min_size=1, max_size=12))
def test_only_groups_at_the_watermark_hold_a_partition(history: list[tuple[int, int]]) -> None:
    ev = evaluator()
    for i, (b, c) in enumerate(history):
        state = ev.observe(poll(float(i), {"b": {0: b}, "c": {0: c}}, {0: 60}, 1))
        part = state.partitions[("t", 0)]
        low = min(b, c)
        expected = () if low >= 60 else tuple(g for g, o in (("b", b), ("c", c)) if o == low)
        assert part.holding == expected


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


def test_of_two_replicas_the_one_that_read_later_has_the_higher_version() -> None:
    """Replica A starts its poll first but refreshes metadata before asking for the offsets;
    B starts later and asks at once, so A read the newer offsets: A's snapshot must win in
    Redis (the higher version), though its poll started first."""
    a, b = GateEvaluator("a", ["t"], ["g"]), GateEvaluator("a", ["t"], ["g"])
    first = dataclasses.replace(poll(10.0, {"g": {0: 37}}, partitions=1), asked_at=10.3)
    second = dataclasses.replace(poll(10.1, {"g": {0: 36}}, partitions=1), asked_at=10.15)
    newer, older = a.observe(first), b.observe(second)
    assert newer.version == 10_300 and older.version == 10_150
    assert newer.snapshot.polled_at == 10.0  # the poll's start stays its time


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


@settings(max_examples=200)
@given(st.lists(st.integers(0, 40), min_size=2, max_size=60))
def test_a_small_wobbling_lag_is_never_lagging(wobble: list[int]) -> None:
    """Records arrive at 10 a second and the group is never more than 40 records (4 s)
    behind, in any pattern: below the 10 s threshold it is never LAGGING."""
    ev = evaluator(lag_window=5.0, lag_threshold=10.0, stall_after=1000.0)
    end = committed = 0
    for second, lag in enumerate(wobble):
        end += 10
        committed = max(committed, end - lag)  # commits never go backwards
        state = ev.observe(poll(float(second), {"b": {0: committed}, "c": {0: end}}, {0: end}, 1))
        assert state.groups["b"] == OK, (second, wobble)


def test_a_record_after_a_quiet_spell_is_neither_stalled_nor_stuck() -> None:
    """One record every two minutes, processed within a second: the groups last committed
    long ago, but nothing has waited long, so nothing is STALLED and the gate not stuck."""
    ev = evaluator(stall_after=60.0)
    end = 0
    for second in range(0, 600):
        if second % 120 == 0:
            end += 1  # a new record, processed by both a second later
        done = end if second % 120 else end - 1
        state = ev.observe(poll(float(second), {"b": {0: done}, "c": {0: done}}, {0: end}, 1))
        assert state.groups == {"b": OK, "c": OK}, second
        assert state.verdict.state != "stuck", second


def test_a_lag_that_holds_steady_after_a_hiccup_is_not_lagging() -> None:
    """b falls 300 records behind during a 30 s hiccup, then keeps pace exactly: LAGGING
    while it fell behind, OK once a whole window passed without growth."""
    ev = evaluator(lag_window=20.0, lag_threshold=5.0, stall_after=1000.0)
    states = {}
    committed = 0
    for second in range(0, 200):
        end = 10 * second + 10
        committed = committed + (0 if 10 <= second < 40 else 10)
        states[second] = ev.observe(
            poll(float(second), {"b": {0: committed}, "c": {0: end}}, {0: end}, 1)
        )
    assert states[35].groups["b"] == LAGGING
    assert all(states[s].groups["b"] == OK for s in range(70, 200))
    assert states[199].partitions[("t", 0)].groups["b"].lag == 300


def test_an_empty_partition_is_held_by_no_one() -> None:
    state = evaluator().observe(poll(1.0, {}, {0: 0, 1: 0, 2: 0}))
    assert all(part.holding == () for part in state.partitions.values())
    assert state.verdict.state == "released"


def test_a_failed_read_of_the_dependent_keeps_its_last_offsets() -> None:
    ev = GateEvaluator("a", ["t"], ["b"], StatusPolicy(), dependent="a")
    ev.observe(poll(1.0, {"b": {0: 90}, "a": {0: 10}}, {0: 100}, 1))
    failed = PollResult(
        started_at=2.0,
        finished_at=2.1,
        partition_counts={"t": 1},
        end_offsets={("t", 0): 100},
        committed={"b": {("t", 0): 95}},
        failed_groups=frozenset({"a"}),
        errors=("group a: not authorized",),
    )
    part = ev.observe(failed).partitions[("t", 0)]
    assert part.dependent == 10 and part.released_unprocessed == 85


TICK = 0.05
"""Seconds per tick of the simulated clock below."""


@dataclass(frozen=True)
class Cadence:
    """``per_tick`` records are appended every tick; the group commits every
    ``commits_every`` ticks from tick ``first_commit`` on, and the gate polls every
    ``polls_every`` ticks."""

    polls_every: int
    commits_every: int
    first_commit: int
    per_tick: int

    def statuses(
        self,
        processed: Callable[[int], int],
        policy: StatusPolicy,
        *,
        ticks: int,
        start: int = 0,
    ) -> list[DependencyStatus]:
        """Group b's status at every poll of a gate that starts polling at tick ``start``,
        b committing the offset it has ``processed`` by each of its commits. Time is
        simulated: tick k is ``k * TICK`` seconds."""
        gate = GateEvaluator("a", ["t"], ["b"], policy)
        committed = 0
        seen = []
        for tick in range(ticks + 1):
            end = self.per_tick * tick
            if tick >= self.first_commit and (tick - self.first_commit) % self.commits_every == 0:
                committed = processed(tick)
            if tick >= start and tick % self.polls_every == 0:
                state = gate.observe(poll(tick * TICK, {"b": {0: committed}}, {0: end}, 1))
                seen.append(state.groups["b"])
        return seen


def falling_behind(per_tick: int, fraction: float) -> Callable[[int], int]:
    """A group that processes ``fraction`` of what is produced: producers outrun it."""
    return lambda tick: int(fraction * per_tick * tick)


def keeping_up(per_tick: int, delay: int) -> Callable[[int], int]:
    """A group that processes every record ``delay`` ticks after it was appended."""
    return lambda tick: per_tick * max(0, tick - delay)


def lagging_for_good(statuses: list[DependencyStatus]) -> bool:
    """LAGGING at the end, and at every poll since it first was (no flapping)."""
    return LAGGING in statuses and set(statuses[statuses.index(LAGGING) :]) == {LAGGING}


def test_a_group_committing_every_5_s_while_producers_outrun_it_is_lagging() -> None:
    """100 records a second; the gate polls every 200 ms; b processes 80 a second and
    commits every 5 s, so most polls see its commit unchanged and its lag falls at every
    commit: its lag after each commit grows, and it is LAGGING for good once its oldest
    record is older than the threshold. A group keeping up on the same cadence stays OK."""
    policy = StatusPolicy()  # a 30 s window, a 10 s threshold
    cadence = Cadence(polls_every=4, commits_every=100, first_commit=40, per_tick=5)
    behind = cadence.statuses(falling_behind(5, 0.8), policy, ticks=3600)
    assert lagging_for_good(behind)
    keeping = cadence.statuses(keeping_up(5, 10), policy, ticks=3600)
    assert set(keeping) == {OK}


def test_a_group_committing_less_often_than_the_window_is_judged_across_its_commits() -> None:
    """b commits every 40 s, longer than the 30 s window: between its commits its lag only
    grows, which is no news. Falling behind, it is LAGGING for good from some commit on;
    keeping up, it is OK at every poll."""
    policy = StatusPolicy(lag_window=30.0, lag_threshold=10.0, stall_after=120.0)
    cadence = Cadence(polls_every=20, commits_every=800, first_commit=100, per_tick=2)
    behind = cadence.statuses(falling_behind(2, 0.5), policy, ticks=8000)
    assert lagging_for_good(behind)
    keeping = cadence.statuses(keeping_up(2, 20), policy, ticks=8000, start=1000)
    assert set(keeping) == {OK}


cadences = st.builds(
    Cadence,
    polls_every=st.integers(1, 20),  # 50 ms to 1 s
    commits_every=st.integers(20, 200),  # 1 s to 10 s
    first_commit=st.integers(0, 199),
    per_tick=st.integers(1, 25),  # 20 to 500 records a second
)


def test_a_group_falling_behind_crosses_the_threshold_once() -> None:
    """The age of its oldest unprocessed record, read at the first poll after each commit,
    wavers by up to a poll interval around the threshold as it crosses it: the group turns
    LAGGING once and stays so (before: LAGGING, OK, then LAGGING again, at 48 s)."""
    cadence = Cadence(polls_every=11, commits_every=20, first_commit=7, per_tick=1)
    seen = cadence.statuses(falling_behind(1, 0.796875), StatusPolicy(), ticks=4800)
    assert lagging_for_good(seen)


@settings(max_examples=60, deadline=None)
@given(cadences, st.floats(0.2, 0.8), st.integers(0, 4000))
def test_a_group_that_producers_outrun_ends_up_lagging(
    cadence: Cadence, fraction: float, start: int
) -> None:
    """Whatever the poll and commit cadences, and whenever the gate starts watching: a group
    processing at most 80 % of what is produced is LAGGING within four minutes, for good."""
    processed = falling_behind(cadence.per_tick, fraction)
    seen = cadence.statuses(processed, StatusPolicy(), ticks=start + 4800, start=start)
    assert lagging_for_good(seen)


@settings(max_examples=60, deadline=None)
@given(cadences, st.integers(0, 20), st.sampled_from([0.0, 2.0, 10.0]), st.integers(0, 4000))
def test_a_group_that_keeps_up_is_never_lagging(
    cadence: Cadence, delay: int, threshold: float, start: int
) -> None:
    """Whatever the poll and commit cadences, a group that processes every record within a
    second and commits every few seconds is never LAGGING (nor STALLED), even with a
    threshold its lag between commits exceeds, whenever the gate starts watching it."""
    processed = keeping_up(cadence.per_tick, delay)
    start += cadence.first_commit + delay + 1  # it is keeping up by then
    seen = cadence.statuses(
        processed, StatusPolicy(lag_threshold=threshold), ticks=start + 4800, start=start
    )
    assert set(seen) == {OK}
