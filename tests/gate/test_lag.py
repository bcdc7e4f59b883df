"""Lag in seconds from the gate's history of end offsets (pure)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gate.evaluate._lag import MAX_SAMPLES, EndHistory


def replay(appended: list[int], poll: float = 1.0) -> tuple[EndHistory, list[tuple[float, float]]]:
    """Poll every ``poll`` seconds; ``appended[k]`` records arrive between polls k-1 and k.
    Returns the history and, per offset, the window its record truly arrived in."""
    history = EndHistory()
    windows: list[tuple[float, float]] = []
    end = 0
    history.observe(0.0, 0)
    for k, count in enumerate(appended, start=1):
        windows += [((k - 1) * poll, k * poll)] * count
        end += count
        history.observe(k * poll, end)
    return history, windows


# Spells of steady traffic: none, a trickle, or a flood, each for up to 300 polls.
traffic = st.lists(
    st.tuples(st.sampled_from([0, 1, 3, 50, 200]), st.integers(1, 300)), min_size=1, max_size=8
).map(lambda spells: [count for count, polls in spells for _ in range(polls)])


@settings(max_examples=150, deadline=None)
@given(traffic, st.sampled_from([0.2, 1.0, 5.0]))
def test_the_history_is_bounded_and_places_every_record_where_it_says(
    appended: list[int], poll: float
) -> None:
    history, windows = replay(appended, poll)
    assert len(history.times) <= MAX_SAMPLES
    assert history.times == sorted(history.times) and history.ends == sorted(history.ends)
    now = len(appended) * poll
    for offset in range(0, len(windows), max(1, len(windows) // 300)):
        earliest, latest = windows[offset]
        lag = history.lag(offset, now)
        true_oldest, true_newest = now - earliest, now - latest
        if lag.exact:
            # Within its arrival window, give or take what thinning allows for its age.
            slack = max(2.0, 0.2 * lag.seconds)
            assert true_newest - slack <= lag.seconds <= true_oldest + slack, (offset, lag)
        else:
            assert lag.seconds <= true_oldest + 1e-9  # a lower bound, never too high


def test_a_burst_after_a_quiet_spell_is_not_spread_over_the_spell() -> None:
    """Ten minutes without records, then five records in the last second: they are a second
    old, not minutes."""
    history, _ = replay([10] + [0] * 600 + [5])
    lag = history.lag(10, 602.0)
    assert lag.exact and lag.seconds <= 2.0


def test_old_records_are_placed_within_a_tenth_of_their_age() -> None:
    """An hour at 100 records a second, then an hour at one a second: records appended 3,000 s
    and 5,400 s ago are reported about that far behind, not a fraction of it."""
    history, windows = replay([100] * 3600 + [1] * 3600)
    for appended_at, offset in ((4200, 360_000 + 600), (1800, 180_000)):
        assert windows[offset] == (appended_at, appended_at + 1)
        lag = history.lag(offset, 7200.0)
        truth = 7200.0 - appended_at
        assert abs(lag.seconds - truth) <= 0.1 * truth + 1.0, (appended_at, lag)
