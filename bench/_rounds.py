"""Rounds: the variants of a benchmark (the candidate and its baseline measured in the same
run) run in turn, round after round, so that the machine's drift hits every variant alike;
their best and median figures; waiting for a run to get somewhere."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Literal, TypeVar

from rich.progress import track

from bench._report import console

T = TypeVar("T")
Order = Literal["same", "alternate", "rotate"]


def interleaved(
    variants: Mapping[str, Callable[[], T | None]],
    rounds: int,
    order: Order = "same",
    progress: str | None = None,
    announce: Callable[[str, int], None] | None = None,
) -> dict[str, list[T]]:
    """Each variant's results over ``rounds`` rounds, every variant run once a round: in the
    same order every round, reversed every other round (``alternate``), or starting one
    further each round (``rotate``). A variant that gives None left no result that round.
    ``progress`` names a progress bar over the rounds; ``announce(name, round)`` is called
    before each run."""
    names = list(variants)
    found: dict[str, list[T]] = {name: [] for name in names}
    turns: Iterable[int] = range(rounds)
    if progress is not None:
        turns = track(turns, description=progress, console=console)
    for round_ in turns:
        if order == "alternate":
            ordered = names if round_ % 2 == 0 else names[::-1]
        elif order == "rotate":
            turn = round_ % len(names)
            ordered = names[turn:] + names[:turn]
        else:
            ordered = names
        for name in ordered:
            if announce is not None:
                announce(name, round_)
            result = variants[name]()
            if result is not None:
                found[name].append(result)
    return found


def best_and_median(
    runs: Mapping[str, list[float]],
) -> tuple[dict[str, float], dict[str, float]]:
    """The best (largest) and the median figure of each variant that has any. Rounds of one
    variant can differ by 2x on a shared machine: the best is what its code can do there,
    the median how typical that is."""
    best = {name: max(values) for name, values in runs.items() if values}
    median = {name: statistics.median(values) for name, values in runs.items() if values}
    return best, median


def wait_until(condition: Callable[[], bool], timeout: float, step: float = 0.002) -> bool:
    """Whether ``condition`` came true within ``timeout`` seconds (asked every ``step``)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def timed(call: Callable[[], T]) -> tuple[T, float]:
    """``call()``'s result, and the seconds it took."""
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started
