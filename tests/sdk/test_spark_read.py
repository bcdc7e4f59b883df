"""Reading planned ranges on executors: the tasks of a batch, Arrow batches, cached consumers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from sdk.spark._plan import Offsets, ranges

partition_ranges = st.dictionaries(
    st.sampled_from(["a", "b"]),
    st.dictionaries(
        st.integers(0, 5).map(str),
        st.tuples(st.integers(0, 1_000), st.integers(0, 400)),
        max_size=4,
    ),
    max_size=2,
)


def offsets(planned: dict[str, dict[str, tuple[int, int]]]) -> tuple[Offsets, Offsets]:
    start = {t: {p: first for p, (first, _) in parts.items()} for t, parts in planned.items()}
    end = {t: {p: first + n for p, (first, n) in parts.items()} for t, parts in planned.items()}
    return start, end


@given(
    partition_ranges,
    st.one_of(st.none(), st.integers(1, 300)),
    st.one_of(st.none(), st.integers(1, 40)),
)
def test_tasks_cover_each_range_exactly_and_respect_the_limits(
    planned: dict[str, dict[str, tuple[int, int]]],
    maximum: int | None,
    minimum: int | None,
) -> None:
    start, end = offsets(planned)
    tasks = ranges(start, end, maximum, minimum)
    for topic, parts in planned.items():
        for partition, (first, count) in parts.items():
            mine = [
                (t.start, t.end) for t in tasks if (t.topic, t.partition) == (topic, int(partition))
            ]
            covered = [o for begin, stop in mine for o in range(begin, stop)]
            assert covered == list(range(first, first + count))
            assert all(begin < stop for begin, stop in mine)
    assert {(t.topic, str(t.partition)) for t in tasks} <= {
        (t, p) for t, parts in planned.items() for p in parts
    }
    if maximum is not None:
        assert all(t.end - t.start <= maximum for t in tasks)
    records = sum(n for parts in planned.values() for _, n in parts.values())
    if minimum is not None:
        assert len(tasks) >= min(minimum, records)
    # Deterministic: a replayed batch plans the identical tasks.
    again = ranges(start, end, maximum, minimum)
    assert [(t.topic, t.partition, t.start, t.end) for t in again] == [
        (t.topic, t.partition, t.start, t.end) for t in tasks
    ]


def test_one_task_per_partition_unless_a_range_is_large() -> None:
    start: Offsets = {"t": {"0": 0, "1": 10, "2": 5}}
    end: Offsets = {"t": {"0": 250_000, "1": 20, "2": 5}}
    assert [(t.partition, t.start, t.end) for t in ranges(start, end, None)] == [
        (0, 0, 250_000),
        (1, 10, 20),
    ]
    # Split evenly: three tasks of 83,334 / 83,333 / 83,333, never one small remainder.
    split = ranges(start, end, 100_000)
    assert [(t.partition, t.start, t.end) for t in split] == [
        (0, 0, 83_334),
        (0, 83_334, 166_667),
        (0, 166_667, 250_000),
        (1, 10, 20),
    ]


def test_min_partitions_splits_the_largest_ranges_first() -> None:
    start: Offsets = {"t": {"0": 0, "1": 0}}
    end: Offsets = {"t": {"0": 300, "1": 100}}
    tasks = ranges(start, end, None, 4)
    assert [(t.partition, t.start, t.end) for t in tasks] == [
        (0, 0, 100),
        (0, 100, 200),
        (0, 200, 300),
        (1, 0, 100),
    ]
    # Never more tasks than records.
    assert len(ranges({"t": {"0": 0}}, {"t": {"0": 3}}, None, 10)) == 3
