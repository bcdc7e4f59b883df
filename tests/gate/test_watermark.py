"""Property tests of the watermark computation and the snapshot wire format."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gate import Snapshot, SnapshotError, compute_watermarks, is_released

topics = st.sampled_from(["payments", "orders", "a.b-c_d"])
partitions = st.lists(st.tuples(topics, st.integers(0, 7)), unique=True, max_size=12)
offsets = st.integers(0, 10**12)


@st.composite
def scenarios(
    draw: st.DrawFn,
) -> tuple[list[tuple[str, int]], dict[str, dict[tuple[str, int], int]]]:
    tps = draw(partitions)
    groups = draw(st.lists(st.text("bcdefg", min_size=1, max_size=3), unique=True, max_size=5))
    committed = {
        g: {tp: draw(offsets) for tp in tps if draw(st.booleans()) or draw(st.booleans())}
        for g in groups
    }
    return tps, committed


def test_article_example() -> None:
    tps = [("t1", 0), ("t1", 1), ("t1", 2)]
    committed = {
        "CG-B": {("t1", 0): 30, ("t1", 1): 30, ("t1", 2): 10},
        "CG-C": {("t1", 0): 23, ("t1", 1): 52, ("t1", 2): 15},
    }
    assert compute_watermarks(tps, committed) == {("t1", 0): 23, ("t1", 1): 30, ("t1", 2): 10}
    assert is_released(22, 23)
    assert not is_released(23, 23)


@given(scenarios())
def test_watermark_is_min_over_groups_or_none(scenario) -> None:
    tps, committed = scenario
    result = compute_watermarks(tps, committed)
    assert set(result) == set(tps)
    for tp, watermark in result.items():
        values = [offsets.get(tp) for offsets in committed.values()]
        if not committed or any(v is None for v in values):
            assert watermark is None
        else:
            assert watermark == min(values)


@given(scenarios(), offsets)
def test_released_exactly_when_every_group_committed_past(scenario, offset: int) -> None:
    tps, committed = scenario
    result = compute_watermarks(tps, committed)
    for tp in tps:
        everyone_past = bool(committed) and all(
            (c := offsets.get(tp)) is not None and c > offset for offsets in committed.values()
        )
        assert is_released(offset, result[tp]) == everyone_past


@given(scenarios(), st.data())
def test_a_group_committing_further_never_lowers_a_watermark(scenario, data) -> None:
    tps, committed = scenario
    if not committed or not tps:
        return
    before = compute_watermarks(tps, committed)
    group = data.draw(st.sampled_from(sorted(committed)))
    tp = data.draw(st.sampled_from(tps))
    advanced = {g: dict(o) for g, o in committed.items()}
    advanced[group][tp] = advanced[group].get(tp, 0) + data.draw(st.integers(0, 1000))
    after = compute_watermarks(tps, advanced)
    for p in tps:
        if before[p] is not None:
            assert after[p] is not None and after[p] >= before[p]


@given(st.integers(0, 100), st.one_of(st.none(), st.integers(0, 100)))
def test_released_is_a_prefix_of_the_partition(offset: int, watermark: int | None) -> None:
    # Gaps in offsets (compaction, transaction markers) do not matter: only o < W counts.
    if is_released(offset, watermark):
        assert all(is_released(o, watermark) for o in range(offset + 1))
    else:
        assert not any(is_released(o, watermark) for o in range(offset, 120))


snapshots = st.builds(
    Snapshot,
    gate=st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True),
    version=st.integers(0, 2**53),
    polled_at=st.integers(0, 4_000_000_000_000).map(lambda ms: ms / 1000),
    watermarks=st.dictionaries(
        st.tuples(topics, st.integers(0, 1000)), st.one_of(st.none(), offsets), max_size=20
    ),
)


@given(snapshots)
def test_snapshot_json_round_trips(snapshot: Snapshot) -> None:
    wire = json.loads(json.dumps(snapshot.to_json()))
    assert Snapshot.from_json(wire) == snapshot


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(json_values)
def test_malformed_snapshots_are_rejected_with_a_snapshot_error(value) -> None:
    with contextlib.suppress(SnapshotError):
        Snapshot.from_json(value)


@pytest.mark.parametrize(
    "bad, message",
    [
        ([], "JSON object"),
        ({"gate": "", "version": 1, "polled_at": "2026-01-01T00:00:00Z", "topics": {}}, "gate"),
        (
            {"gate": "g", "version": -1, "polled_at": "2026-01-01T00:00:00Z", "topics": {}},
            "version",
        ),
        (
            {"gate": "g", "version": True, "polled_at": "2026-01-01T00:00:00Z", "topics": {}},
            "version",
        ),
        ({"gate": "g", "version": 1, "polled_at": "yesterday", "topics": {}}, "polled_at"),
        ({"gate": "g", "version": 1, "polled_at": "2026-01-01T00:00:00Z", "topics": []}, "topics"),
        (
            {
                "gate": "g",
                "version": 1,
                "polled_at": "2026-01-01T00:00:00Z",
                "topics": {"t": {"x": 1}},
            },
            "partition",
        ),
        (
            {
                "gate": "g",
                "version": 1,
                "polled_at": "2026-01-01T00:00:00Z",
                "topics": {"t": {"0": -4}},
            },
            "watermark",
        ),
    ],
)
def test_malformed_snapshot_messages_name_the_problem(bad, message: str) -> None:
    with pytest.raises(SnapshotError, match=message):
        Snapshot.from_json(bad)
