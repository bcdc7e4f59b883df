"""What an operator tailing the gate's log reads: one line when a gate turns stuck and one when
it flows again, one when a group enters or leaves STALLED / MISSING / REWOUND, never one per
poll; and an overrun warning whose figures add up to the cycle and name what made it late."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gate.service._events import FIT_AGAIN_CYCLES, Overruns, cycle_timing
from gate.service._metrics import GateMetrics
from tests.gate.scripted import Clocks
from tests.gate.test_service import Served

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """Gate ``a`` on payments depends on CG-B and on CG-Z, which has not committed yet."""
    gate = Served(
        Clocks(monkeypatch),
        {"a": {"topics": ["payments"], "depends_on": ["CG-B", "CG-Z"]}},
    )
    with gate.client:
        yield gate


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == "gate"]
    caplog.clear()
    return lines


def test_a_dependency_that_never_committed_is_said_once_and_its_first_commit_too(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", "gate"):
        served.cycle()
        first = said(caplog)
        served.cycle(20)
        repeated = said(caplog)
        served.admin.committed["CG-Z"] = {("payments", 0): 10, ("payments", 1): 10}
        served.cycle()
        recovered = said(caplog)
        served.cycle(5)
        after = said(caplog)
    stuck = [line for line in first if "gate a: stuck" in line]
    assert len(stuck) == 1 and "CG-Z has never committed" in stuck[0], first
    assert [line for line in first if "group CG-Z is MISSING" in line], first
    assert "None" not in " ".join(first), first
    assert repeated == [], repeated
    assert any("gate a: no longer stuck: flowing" in line for line in recovered), recovered
    assert any("group CG-Z is no longer MISSING" in line for line in recovered), recovered
    assert after == [], after


def test_a_stalled_group_is_said_when_it_stalls_and_when_it_moves_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gate = Served(
        Clocks(monkeypatch),
        {"a": {"topics": ["payments"], "depends_on": ["CG-B"]}},
    )
    evaluator = gate.service.evaluators["a"]
    evaluator.policy = dataclasses.replace(evaluator.policy, stall_after=1.0)  # ten cycles
    with gate.client, caplog.at_level("INFO", "gate"):
        gate.cycle(30)
        stalled = said(caplog)
        gate.admin.committed["CG-B"] = {("payments", 0): 7, ("payments", 1): 8}
        gate.cycle()
        moved = said(caplog)
    assert len([line for line in stalled if "group CG-B is STALLED" in line]) == 1, stalled
    assert len([line for line in stalled if "gate a: stuck since" in line]) == 1, stalled
    assert any("group CG-B is no longer STALLED" in line for line in moved), moved
    assert any("gate a: no longer stuck" in line for line in moved), moved


def test_a_rewind_is_said_once_with_its_offsets_and_its_end_too(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    served.admin.committed["CG-Z"] = {("payments", 0): 10, ("payments", 1): 10}
    served.cycle()
    with caplog.at_level("INFO", "gate"):
        served.admin.committed["CG-B"] = {("payments", 0): 2, ("payments", 1): 6}
        served.cycle(3)
        rewound = said(caplog)
    assert len([line for line in rewound if "CG-B rewound payments[0] from 4 to 2" in line]) == 1
    assert not [line for line in rewound if "CG-B is REWOUND" in line], rewound


@given(
    interval=st.floats(0.01, 5),
    late=st.floats(0, 5),
    poll=st.floats(0, 5),
    evaluation=st.floats(0, 5),
    rest=st.floats(0, 5),
)
def test_a_cycles_parts_add_up_to_its_time(
    interval: float, late: float, poll: float, evaluation: float, rest: float
) -> None:
    due = 100.0
    started = due + late
    ended = started + poll + evaluation + rest
    timing = cycle_timing(interval, due, started, ended, poll, evaluation)
    assert timing.total == pytest.approx(ended - due, abs=1e-9)
    assert min(timing.started_late, timing.poll, timing.evaluation, timing.rest) >= 0
    assert timing.late == (timing.total > interval)


def test_the_overrun_warning_names_what_made_the_cycle_late_and_its_figures_add_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cluster answered in 26 ms and evaluation took 1 ms, yet the cycle was late: the
    event loop started it 600 ms late, and the warning says so."""
    overruns = Overruns(GateMetrics(CollectorRegistry()))
    with caplog.at_level("INFO", "gate"):
        overruns.note(cycle_timing(0.5, 10.0, 10.6, 10.628, 0.026, 0.001))
    (line,) = said(caplog)
    assert "took 628 ms" in line and "mostly the event loop being busy" in line, line
    assert "began 600 ms late" in line and "reading the cluster 26 ms" in line, line
    assert "evaluating 1 ms" in line and "publishing 1 ms" in line, line
    assert overruns.overrunning and overruns.count == 1


def test_alternating_cycles_give_one_warning_and_fit_again_after_cycles_in_a_row(
    caplog: pytest.LogCaptureFixture,
) -> None:
    overruns = Overruns(GateMetrics(CollectorRegistry()))
    slow = cycle_timing(0.5, 0.0, 0.0, 0.9, 0.85, 0.01)
    quick = cycle_timing(0.5, 0.0, 0.0, 0.03, 0.02, 0.001)
    with caplog.at_level("INFO", "gate"):
        for _ in range(10):
            overruns.note(slow)
            overruns.note(quick)
        alternating = said(caplog)
        for _ in range(FIT_AGAIN_CYCLES):
            overruns.note(quick)
        fitting = said(caplog)
    assert len(alternating) == 1 and "mostly reading the cluster" in alternating[0]
    assert overruns.count == 10
    assert len(fitting) == 1 and "fit the poll interval again" in fitting[0], fitting
    assert not overruns.overrunning
