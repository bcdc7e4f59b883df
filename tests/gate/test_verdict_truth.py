"""Verdicts that tell the truth: a gate over a topic or partition that does not exist is an
alarm, a group far behind is never OK, and a flowing gate names who holds records back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gate import DependencyStatus, GateEvaluator, PollResult, StatusPolicy
from gate.report._report import gate_summary

OK, LAGGING, BEHIND, STALLED = (
    DependencyStatus.OK,
    DependencyStatus.LAGGING,
    DependencyStatus.BEHIND,
    DependencyStatus.STALLED,
)


def poll(
    at: float,
    committed: dict[str, dict[int, int]],
    end: dict[int, int],
    counts: dict[str, int] | None = None,
    topic: str = "t",
) -> PollResult:
    return PollResult(
        started_at=at,
        finished_at=at + 0.01,
        partition_counts={topic: len(end)} if counts is None else counts,
        end_offsets={(topic, p): o for p, o in end.items()},
        committed={g: {(topic, p): o for p, o in offs.items()} for g, offs in committed.items()},
    )


def test_a_gate_over_a_topic_that_does_not_exist_is_an_alarm_naming_it() -> None:
    ev = GateEvaluator("a", ["payments"], ["b", "c"])
    state = ev.observe(poll(1.0, {}, {}, counts={}))
    assert state.verdict.state == "missing"
    assert state.verdict.missing == ("payments",)
    verdict = gate_summary(state, 1.0)["verdict"]
    assert verdict["state"] == "missing" and verdict["missing"] == ["payments"]
    assert verdict["text"] == (
        "missing: topic payments does not exist on the cluster; nothing there is released"
    )
    assert "every record is released" not in verdict["text"]


def test_a_missing_topic_beside_a_flowing_one_is_still_an_alarm() -> None:
    ev = GateEvaluator("a", ["t", "gone", "lost"], ["b"])
    state = ev.observe(poll(1.0, {"b": {0: 5}}, {0: 9}, counts={"t": 1}))
    assert state.verdict.state == "missing" and state.verdict.missing == ("gone", "lost")
    text = gate_summary(state, 1.0)["verdict"]["text"]
    assert text.startswith("missing: topics gone, lost do not exist on the cluster")
    assert text.endswith("; elsewhere 4 records waiting")


def test_a_partition_that_no_longer_exists_is_an_alarm_until_it_is_back() -> None:
    ev = GateEvaluator("a", ["t"], ["b"])
    ev.observe(poll(1.0, {"b": {0: 9, 1: 9}}, {0: 9, 1: 9}))
    state = ev.observe(poll(2.0, {"b": {0: 9}}, {0: 9}))  # the topic has one partition now
    assert state.missing_partitions == (("t", 1),)
    assert state.verdict.state == "missing" and state.verdict.missing == ("t[1]",)
    summary = gate_summary(state, 2.0)
    assert summary["missing_partitions"] == ["t[1]"]
    assert summary["verdict"]["text"].startswith("missing: partition t[1] does not exist")
    back = ev.observe(poll(3.0, {"b": {0: 9, 1: 9}}, {0: 9, 1: 9}))
    assert back.verdict.state == "released" and back.missing_partitions == ()


def test_a_topic_with_no_partitions_is_missing() -> None:
    state = GateEvaluator("a", ["t"], ["b"]).observe(poll(1.0, {}, {}, counts={"t": 0}))
    assert state.verdict.state == "missing" and state.missing_topics == ("t",)


def steady_but_far_behind(ev: GateEvaluator, seconds: int) -> list[DependencyStatus]:
    """10 records a second; c keeps up, b stays 20 s (200 records) behind at every poll:
    its lag does not grow."""
    statuses = []
    for second in range(seconds):
        end = 10 * second + 10
        b = max(0, end - 200)
        state = ev.observe(poll(float(second), {"b": {0: b}, "c": {0: end}}, {0: end}))
        statuses.append(state.groups["b"])
    return statuses


def test_a_group_far_behind_whose_lag_does_not_grow_is_behind_not_ok() -> None:
    policy = StatusPolicy(lag_window=10.0, lag_threshold=5.0, stall_after=1000.0, behind_after=15.0)
    ev = GateEvaluator("a", ["t"], ["b", "c"], policy)
    statuses = steady_but_far_behind(ev, 60)
    assert statuses[-1] == BEHIND
    assert LAGGING in statuses[:30]  # its lag grew at first: LAGGING then, by the window rule
    assert all(s == BEHIND for s in statuses[40:])
    summary = gate_summary(ev.last, 59.0)  # type: ignore[arg-type]
    assert summary["groups"]["b"]["status"] == "BEHIND"
    assert summary["groups"]["c"]["status"] == "OK"


def test_a_group_behind_less_than_the_threshold_is_ok() -> None:
    policy = StatusPolicy(lag_window=10.0, lag_threshold=5.0, stall_after=1000.0, behind_after=30.0)
    statuses = steady_but_far_behind(GateEvaluator("a", ["t"], ["b", "c"], policy), 60)
    assert all(s == OK for s in statuses[40:])


@settings(max_examples=60, deadline=None)
@given(
    behind=st.integers(min_value=1, max_value=120),
    threshold=st.integers(min_value=1, max_value=100),
)
def test_a_group_is_never_ok_beyond_the_threshold(behind: int, threshold: int) -> None:
    """Whatever the trend: a group whose oldest unprocessed record is older than
    behind_after is not OK; one within it is never BEHIND."""
    policy = StatusPolicy(stall_after=1e9, behind_after=float(threshold))
    ev = GateEvaluator("a", ["t"], ["b"], policy)
    for second in range(130):
        end = second + 1
        state = ev.observe(poll(float(second), {"b": {0: max(0, end - behind)}}, {0: end}))
        position = state.partitions[("t", 0)].groups["b"]
        assert position.lag_seconds is not None
        if position.lag_seconds > threshold:
            assert position.status != OK
        else:
            assert position.status != BEHIND


def test_the_flowing_verdict_names_the_groups_holding_records_back() -> None:
    ev = GateEvaluator("a", ["t"], ["service-b", "service-c"])
    state = ev.observe(
        poll(
            1.0,
            {"service-b": {0: 9, 1: 9, 2: 5}, "service-c": {0: 4, 1: 3, 2: 9}},
            {0: 9, 1: 9, 2: 9},
        )
    )
    assert state.verdict.state == "flowing"
    assert state.verdict.holding == ("service-c", "service-b")  # most partitions first
    text = gate_summary(state, 1.0)["verdict"]["text"]
    assert text.startswith("flowing: 15 records in transit")
    assert text.endswith(", held back by service-c, service-b")
