"""The detail's partitions written as JSON directly are, byte for byte, what the API's JSON
encoding makes of :func:`gate.report._report.gate_partitions`, whatever the positions: over random
histories of commits and ends (groups without a commit, ends unknown, names that need
escaping), every choice of groups, and ages read at and after the poll."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gate import GateEvaluator, PollResult
from gate.report._detail_json import partitions_json
from gate.report._report import gate_partitions

GROUPS = ["CG-B", 'a "quoted" group', "grüppe\\é", "CG-C"]
"""Group names, some of which JSON must escape (or, with ``ensure_ascii=False``, not)."""


def encoded(value: object) -> bytes:
    """As the API encodes its answers (Starlette's ``JSONResponse``)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


offsets = st.none() | st.integers(min_value=0, max_value=120)
polls = st.lists(
    st.tuples(
        st.lists(st.none() | st.integers(min_value=0, max_value=120), min_size=3, max_size=3),
        st.lists(st.lists(offsets, min_size=3, max_size=3), min_size=4, max_size=4),
        st.floats(min_value=0.001, max_value=30.0),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(
    polls=polls,
    later=st.floats(min_value=0.0, max_value=100.0),
    named=st.lists(st.sampled_from(GROUPS), max_size=3),
)
def test_the_detail_s_json_is_what_json_makes_of_it(
    polls: list[tuple[list[int | None], list[list[int | None]], float]],
    later: float,
    named: list[str],
) -> None:
    evaluator = GateEvaluator("g", ["t"], GROUPS)
    at = 1_000_000.0
    state = None
    for ends, commits, step in polls:
        at += step
        state = evaluator.observe(
            PollResult(
                started_at=at,
                finished_at=at,
                partition_counts={"t": 3},
                end_offsets={("t", p): end for p, end in enumerate(ends) if end is not None},
                committed={
                    group: {("t", p): o for p, o in enumerate(offsets) if o is not None}
                    for group, offsets in zip(GROUPS, commits, strict=True)
                },
                monotonic=at,
            )
        )
    assert state is not None
    for now in (state.snapshot.polled_at, state.snapshot.polled_at + later):
        for groups in ("all", "holding", "none"):
            expected = encoded(gate_partitions(state, now, groups, named))
            assert partitions_json(state, now, groups, named) == expected, groups
