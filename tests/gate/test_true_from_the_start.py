"""Every answer of the gate is true from its first second: a dependency that never committed
is an alarm at once (never "flowing", its lag never 0), a stalled holder makes the gate an
alarm at once, ages the gate cannot know exactly are lower bounds (≥), a steady lag never
flaps into LAGGING, and the messages say nothing false (no "last snapshot" when there is
none, no Python None)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gate import DependencyStatus, GateEvaluator, PollResult, StatusPolicy
from gate._statusview import render
from gate.report._report import gate_status, gate_summary

LAGGING = DependencyStatus.LAGGING


def poll(
    at: float,
    committed: dict[str, dict[int, int]],
    end: dict[int, int],
    groups: frozenset[str] | None = None,
) -> PollResult:
    extra: dict[str, Any] = {} if groups is None else {"known_groups": groups}
    return PollResult(
        started_at=at,
        finished_at=at + 0.01,
        partition_counts={"t": len(end)},
        end_offsets={("t", p): o for p, o in end.items()},
        committed={g: {("t", p): o for p, o in offs.items()} for g, offs in committed.items()},
        **extra,
    )


def rendered(summary: dict[str, Any], detail: dict[str, Any]) -> str:
    from rich.console import Console

    service = {
        "ready": True,
        "detail": "",
        "poll_interval_ms": 1000,
        "last_poll": None,
        "gates": {detail["gate"]: summary},
    }
    console = Console(width=200, record=True)
    console.print(render(service, [detail], 20))
    return console.export_text()


def test_a_group_that_never_committed_is_an_alarm_at_once_with_a_suggestion() -> None:
    """A misspelt dependency: no watermark anywhere. The first poll already says it is an
    alarm, names the group, suggests the close name, and gives its lag as unknown, not 0."""
    ev = GateEvaluator("a", ["t"], ["service-b", "service-cc"])
    cluster = frozenset({"service-b", "service-c", "service-a"})
    state = ev.observe(poll(1000.0, {"service-b": {0: 50, 1: 50}}, {0: 50, 1: 50}, cluster))
    assert state.verdict.state == "stuck"
    assert state.verdict.stuck_on == ("service-cc",)
    summary = gate_summary(state, 1000.5)
    text = summary["verdict"]["text"]
    assert "service-cc has never committed on t[0], t[1]" in text, text
    assert "did you mean 'service-c'?" in text, text
    assert "all 100 records" in text, text
    assert "flowing" not in text and summary["verdict"]["released_within_s"] is None
    group = summary["groups"]["service-cc"]
    assert group["status"] == "MISSING" and group["lag"] is None  # unknown, never 0
    detail = gate_status(state, 1000.5)
    assert detail["partitions"][0]["groups"]["service-cc"]["lag"] is None
    shown = rendered(summary, detail)
    assert "service-cc" in shown and "flowing" not in shown
    assert "None" not in shown and "None" not in text, shown
    row = next(line for line in shown.splitlines() if line.strip().startswith("│ service-cc"))
    assert " 0 " not in row, row


def test_a_fleet_with_groups_that_have_not_committed_yet_is_an_alarm() -> None:
    groups = [f"fleet-{i:02d}" for i in range(24)]
    ev = GateEvaluator("a", ["t"], groups)
    committed = {g: {0: 10, 1: 10} for g in groups[:22]}
    state = ev.observe(poll(1000.0, committed, {0: 10, 1: 10}))
    assert state.verdict.state == "stuck"
    assert set(state.verdict.stuck_on) == {"fleet-22", "fleet-23"}
    assert state.group_lags["fleet-22"].records is None


def test_a_stalled_holder_makes_the_gate_an_alarm_at_once() -> None:
    """b stops committing at 50; c, lower, catches up to b later, so the watermark moved
    recently: the gate is still an alarm as soon as b is STALLED."""
    policy = StatusPolicy(stall_after=10.0)
    ev = GateEvaluator("a", ["t"], ["b", "c"], policy)
    for second in range(12):
        c = min(50, 40 + second)
        state = ev.observe(poll(1000.0 + second, {"b": {0: 50}, "c": {0: c}}, {0: 100}))
        if state.groups["b"] == DependencyStatus.STALLED:
            break
    assert state.groups["b"] == DependencyStatus.STALLED
    assert state.verdict.state == "stuck", state.verdict
    assert state.verdict.stuck_on == ("b",)
    assert gate_summary(state, state.snapshot.polled_at)["verdict"]["state"] == "stuck"


def test_ages_the_gate_cannot_know_are_lower_bounds() -> None:
    """Records older than the gate's first poll: how long they wait is a lower bound
    everywhere it is shown."""
    ev = GateEvaluator("a", ["t"], ["b"])
    ev.observe(poll(1000.0, {"b": {0: 10}}, {0: 50}))
    state = ev.observe(poll(1015.0, {"b": {0: 10}}, {0: 50}))
    summary = gate_status(state, 1015.0)
    verdict = summary["verdict"]
    assert verdict["state"] == "flowing"
    assert verdict["released_within_exact"] is False
    assert "released within ≥ 15 s" in verdict["text"], verdict["text"]
    part = summary["partitions"][0]
    assert part["waiting_s"] == 15.0 and part["waiting_s_exact"] is False
    shown = rendered(summary, summary)
    assert "≥ 15.0 s" in shown.split("partitions (")[1], shown


def test_exact_ages_stay_exact() -> None:
    ev = GateEvaluator("a", ["t"], ["b"])
    ev.observe(poll(1000.0, {"b": {0: 10}}, {0: 10}))
    ev.observe(poll(1001.0, {"b": {0: 10}}, {0: 20}))
    state = ev.observe(poll(1002.0, {"b": {0: 10}}, {0: 20}))
    verdict = gate_summary(state, 1002.0)["verdict"]
    assert verdict["released_within_exact"] is True and "≥" not in verdict["text"]


@settings(max_examples=12, deadline=None)
@given(
    jitter=st.lists(st.integers(min_value=-40, max_value=40), min_size=120, max_size=120),
    delays=st.lists(st.floats(min_value=0.0, max_value=0.4), min_size=120, max_size=120),
)
def test_a_steady_lag_with_jittered_commits_is_never_lagging(
    jitter: list[int], delays: list[float]
) -> None:
    """50 records a second; b commits about once a second, about 4,540 records (90 s)
    behind, give or take 40 records and 0.4 s: its lag holds steady, so it is never
    LAGGING (BEHIND, as it is far behind)."""
    policy = StatusPolicy(stall_after=1e9)
    ev = GateEvaluator("a", ["t"], ["b"], policy)
    rate, behind = 50, 4540
    statuses = []
    committed = 0
    for second in range(120):
        at = 10_000.0 + second + delays[second]
        end = rate * (second + 100)
        committed = max(committed, end - behind + jitter[second])
        state = ev.observe(poll(at, {"b": {0: committed}}, {0: end}))
        statuses.append(state.groups["b"])
    assert LAGGING not in statuses[60:], statuses
