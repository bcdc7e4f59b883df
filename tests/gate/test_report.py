"""The status report of a fleet (``/status`` and ``/status/{gate}``) reads the positions as the
evaluation keeps them, and sums each group up once per state: after every poll of random
histories it equals the report read through each :class:`~gate.GroupPosition`, as it crossed
from the admin client's process or not, asked again later or not."""

from __future__ import annotations

import pickle
from typing import Any, Literal

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant

from gate import DependencyStatus, GateState
from gate.evaluate._state import SEVERITY, GroupPosition, GroupPositions, PartitionState, Position
from gate.evaluate._watermark import Snapshot, format_time
from gate.report._report import gate_status, gate_summary
from tests.gate.test_incremental import IncrementalAgainstFull


def _age(at: float | None, now: float) -> float | None:
    return None if at is None else round(max(0.0, now - at), 3)


def groups_read_one_by_one(state: GateState, now: float) -> dict[str, dict[str, Any]]:
    """The summary's groups, each read on every partition through its ``GroupPosition``."""
    parts = list(state.partitions.values())
    groups = {}
    for group, status in state.groups.items():
        held = [p for p in parts if group in p.groups]
        lags = [p.groups[group] for p in held]
        lag_seconds = [x.lag_seconds for x in lags if x.lag_seconds is not None]
        unmoved = [now - x.moved_at for x in lags if x.lag and x.moved_at is not None]
        oldest = max(lag_seconds, default=None)
        groups[group] = {
            "status": status.value,
            "holding": sum(1 for p in parts if group in p.holding),
            "lag": None  # no commit where records are: unknown, never 0
            if any(
                x.committed is None and p.end_offset != 0 for p, x in zip(held, lags, strict=True)
            )
            else sum(x.lag or 0 for x in lags),
            "lag_s": None if oldest is None else round(oldest, 3),
            "lag_s_exact": all(x.lag_exact for x in lags if x.lag_seconds == oldest),
            "unmoved_s": round(max(unmoved), 3) if unmoved else None,
            "unmoved_s_exact": not unmoved
            or state.began is None
            or min(x.moved_at for x in lags if x.lag and x.moved_at is not None)
            > state.began + 1e-3,
            "offsets_age_s": _age(state.carried.get(group), now),
        }
    return groups


def positions_read_one_by_one(state: GateState, now: float) -> list[dict[str, Any]]:
    """Each partition's groups in the detail, read through their ``GroupPosition``."""
    return [
        {
            group: {
                "committed": pos.committed,
                "lag": pos.lag,
                "lag_s": None if pos.lag_seconds is None else round(pos.lag_seconds, 3),
                "lag_s_exact": pos.lag_exact,
                "status": pos.status.value,
                "moved_at": None if pos.moved_at is None else format_time(pos.moved_at),
                "unmoved_s": _age(pos.moved_at, now),
            }
            for group, pos in part.groups.items()
        }
        for part in state.partitions.values()
    ]


class ReportAgainstPositions(IncrementalAgainstFull):
    """The evaluators' histories, the report checked after every step."""

    @invariant()
    def the_report_reads_as_each_position(self) -> None:
        state = self.incremental.last
        if state is None:
            return
        crossed = pickle.loads(pickle.dumps(state))  # as the serving process receives it
        for shown, later in ((state, 0.0), (crossed, 0.0), (crossed, 2.5)):
            now = shown.snapshot.polled_at + 1.0 + later
            status = gate_status(shown, now)
            assert status["groups"] == groups_read_one_by_one(shown, now)
            assert [p["groups"] for p in status["partitions"]] == positions_read_one_by_one(
                shown, now
            )
            assert gate_summary(shown, now)["groups"] == status["groups"]


ReportAgainstPositions.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
test_the_report_equals_the_positions_read_one_by_one = ReportAgainstPositions.TestCase


GROUP_NAMES = ["b", "c", "d", "e"]
positions = st.tuples(
    st.one_of(st.none(), st.integers(0, 9)),  # committed
    st.sampled_from([None, 0, 1, 5]),  # lag
    st.integers(0, len(SEVERITY) - 1),  # status rank
    st.sampled_from([None, 990.0, 995.5, 999.25]),  # moved at
    st.sampled_from([None, 0.0, 2.0, 2.0004, 7.5]),  # seconds (ties, and ties once rounded)
    st.booleans(),  # exact
)
partitions = st.lists(
    st.tuples(
        st.dictionaries(st.sampled_from(GROUP_NAMES), positions),
        st.lists(st.sampled_from(GROUP_NAMES), max_size=3),  # holding
    ),
    max_size=5,
)


def state_of(parts: list[tuple[dict[str, Position], list[str]]], crossed: bool) -> GateState:
    """A state with these positions and holding groups per partition, as the evaluation keeps
    it (and as it crossed from the child: pickled), or as ``GroupPosition`` objects."""
    state = GateState(
        snapshot=Snapshot("a", 1, 999.5),
        partitions={
            ("t", p): PartitionState(
                "t",
                p,
                10,
                5,
                tuple(dict.fromkeys(holding)),
                GroupPositions(kept)
                if crossed
                else {
                    g: GroupPosition(c, lag, SEVERITY[rank], moved, seconds, exact)
                    for g, (c, lag, rank, moved, seconds, exact) in kept.items()
                },
            )
            for p, (kept, holding) in enumerate(parts)
        },
        groups=dict.fromkeys(GROUP_NAMES[:3], DependencyStatus.OK),
    )
    return pickle.loads(pickle.dumps(state)) if crossed else state


@given(partitions, st.booleans(), st.sampled_from([1000.0, 1003.5]))
def test_a_state_s_report_reads_as_each_position(
    parts: list[tuple[dict[str, Position], list[str]]], crossed: bool, now: float
) -> None:
    """Any positions, ties in the ages of the oldest records with and without an exact age,
    groups with lag on partitions that moved at different times: as read one by one."""
    state = state_of(parts, crossed)
    status = gate_status(state, now)
    assert status["groups"] == groups_read_one_by_one(state, now)
    assert [p["groups"] for p in status["partitions"]] == positions_read_one_by_one(state, now)


@given(
    partitions,
    st.booleans(),
    st.sampled_from(["all", "holding", "none"]),
    st.lists(st.sampled_from(GROUP_NAMES), max_size=3),
)
def test_the_detail_lists_the_groups_asked_for_and_nothing_else_changes(
    parts: list[tuple[dict[str, Position], list[str]]],
    crossed: bool,
    groups: Literal["all", "holding", "none"],
    named: list[str],
) -> None:
    """Each partition lists the positions of the groups chosen (every group; those holding
    it, those named), exactly as the whole detail has them; the rest of the answer is the
    whole detail's."""
    state = state_of(parts, crossed)
    whole = gate_status(state, 1000.0)
    chosen = gate_status(state, 1000.0, groups=groups, named=named)
    for part, full, shown in zip(
        state.partitions.values(), whole["partitions"], chosen["partitions"], strict=True
    ):
        wanted = {
            "all": set(full["groups"]),
            "holding": set(part.holding) | set(named),
            "none": set(named),
        }[groups]
        assert shown["groups"] == {g: p for g, p in full["groups"].items() if g in wanted}
        assert {k: v for k, v in shown.items() if k != "groups"} == {
            k: v for k, v in full.items() if k != "groups"
        }
    assert {k: v for k, v in chosen.items() if k != "partitions"} == {
        k: v for k, v in whole.items() if k != "partitions"
    }
