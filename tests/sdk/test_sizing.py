"""How many records and shards one work item takes, from the handler's measured speed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sdk import Options, Ordering
from sdk.engine._sizing import FULL_ITEM_SECONDS, ITEM_SECONDS, ItemSizer


def timed(options: Options, seconds_per_record: float) -> ItemSizer:
    sizer = ItemSizer(options)
    for _ in range(8):
        sizer.observe(seconds_per_record * 4, 4)
    return sizer


def test_an_untimed_handler_gets_single_records() -> None:
    sizer = ItemSizer(Options(ordering=Ordering.UNORDERED, max_concurrency=10))
    assert sizer.shape(10_000, 10_000).records == 1


@given(ordering=st.sampled_from(list(Ordering)), ready=st.integers(0, 1000))
def test_a_fast_handler_gets_full_items_of_any_keys(ordering: Ordering, ready: int) -> None:
    options = Options(ordering=ordering, max_concurrency=10)
    sizer = timed(options, FULL_ITEM_SECONDS / options.max_item_records / 2)
    shape = sizer.shape(5, ready)
    assert shape.records == shape.shards == options.max_item_records


@given(
    per_record=st.floats(0.0002, 0.5),
    waiting=st.integers(0, 1_000_000),
    concurrency=st.integers(1, 500),
)
def test_slow_handlers_get_items_of_bounded_work_that_shrink_with_the_backlog(
    per_record: float, waiting: int, concurrency: int
) -> None:
    options = Options(ordering=Ordering.UNORDERED, max_concurrency=concurrency)
    size = timed(options, per_record).shape(waiting, 1).records
    assert 1 <= size <= options.max_item_records
    if size > 1:
        assert size * per_record <= ITEM_SECONDS * 1.0001  # the last items stay short
        assert size <= waiting // (4 * concurrency)  # a quarter of the backlog, spread out


@given(
    per_record=st.floats(FULL_ITEM_SECONDS / 200, 0.5),
    waiting=st.integers(0, 1_000_000),
    ready=st.integers(0, 100_000),
    concurrency=st.integers(1, 500),
    ordering=st.sampled_from([Ordering.KEY, Ordering.PARTITION]),
)
def test_slow_keys_share_an_item_only_when_there_are_more_ready_shards_than_workers(
    per_record: float, waiting: int, ready: int, concurrency: int, ordering: Ordering
) -> None:
    options = Options(ordering=ordering, max_concurrency=concurrency)
    shape = timed(options, per_record).shape(waiting, ready)
    assert shape.run == options.max_item_records  # a shard's whole run goes to one worker
    if ready <= concurrency:
        assert shape.shards == 1
    else:
        assert 1 <= shape.shards <= max(1, ready // concurrency)


def test_a_batch_size_fixes_the_shape() -> None:
    options = Options(ordering=Ordering.KEY, max_concurrency=4, batch_size=50)
    shape = timed(options, 0.01).shape(100_000, 100_000)
    assert (shape.records, shape.run, shape.shards) == (50, 1, 50)
