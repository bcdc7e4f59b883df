"""Outputs a handler returns, and the lock that keeps a transaction's outputs with their
inputs' offsets (pure parts: the engine's use of them is tested on real brokers)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from sdk import Output
from sdk.produce._deliveries import TransactionLock
from sdk.produce._output import outputs_of


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        ({"topic": "", "value": b"v"}, "topic"),
        ({"topic": 3, "value": b"v"}, "topic"),
        ({"topic": "t", "value": {"a": 1}}, "value"),
        ({"topic": "t", "value": b"v", "key": 7}, "key"),
        ({"topic": "t", "value": b"v", "partition": -1}, "partition"),
        ({"topic": "t", "value": b"v", "partition": True}, "partition"),
        ({"topic": "t", "value": b"v", "headers": [("h", 1)]}, "headers"),
        ({"topic": "t", "value": b"v", "headers": {"h": object()}}, "headers"),
    ],
)
def test_an_output_of_the_wrong_shape_is_refused_where_it_is_built(
    arguments: dict, complaint: str
) -> None:
    with pytest.raises(TypeError, match=complaint):
        Output(**arguments)


def test_outputs_of_reads_what_a_handler_may_return() -> None:
    one = Output("t", b"v")
    two = Output("t", "w", key="k", headers={"h": "x"}, partition=0)
    assert outputs_of(one) == [one]
    assert outputs_of([one, two]) == [one, two]
    assert outputs_of((two,)) == [two]
    # Return values that hold no Output at all are ignored (handlers from before outputs).
    for ignored in (None, 3, "text", b"raw", [], [1, 2], {"a": 1}, iter([1]), {1, 2}):
        assert outputs_of(ignored) == []
    with pytest.raises(TypeError, match="mixed with int"):
        outputs_of([one, 3])


class Enriched(Output):
    """An application's own kind of output."""

    __slots__ = ()


def test_outputs_of_takes_any_iterable_and_any_output() -> None:
    """A generator, a set, a ``map`` object, a tuple, a list, an ``Output`` subclass: each is
    taken whole, in its order (these were ignored, and their inputs committed without
    outputs)."""
    one, two = Output("t", b"1"), Output("t", b"2")
    mine = Enriched("t", b"3")

    def generated() -> Iterator[Output]:
        yield one
        yield two

    assert outputs_of(generated()) == [one, two]
    assert outputs_of(x for x in (one, two)) == [one, two]
    assert sorted(outputs_of({one, two})) == sorted([one, two])
    assert outputs_of(map(lambda v: Output("t", v), [b"1", b"2"])) == [one, two]
    assert outputs_of(frozenset([one])) == [one]
    assert outputs_of(mine) == [mine]
    assert outputs_of([mine, one]) == [mine, one]
    assert outputs_of(iter([])) == []


@pytest.mark.parametrize(
    "returned",
    [
        pytest.param({"a": Output("t", b"v")}, id="mapping"),
        pytest.param([[Output("t", b"v")]], id="nested-list"),
        pytest.param(([Output("t", b"v")], [Output("t", b"w")]), id="tuple-of-lists"),
        pytest.param((x for x in [(Output("t", b"v"),)]), id="generator-of-tuples"),
        pytest.param([Output("t", b"v"), None], id="mixed-with-none"),
    ],
)
def test_outputs_in_a_form_the_engine_cannot_take_fail_the_input(returned: object) -> None:
    with pytest.raises(TypeError, match="handler returned outputs"):
        outputs_of(returned)


def test_an_async_generator_fails_the_input() -> None:
    async def produced() -> AsyncIterator[Output]:
        yield Output("t", b"v")

    generator = produced()
    try:
        with pytest.raises(TypeError, match="async iterable"):
            outputs_of(generator)
    finally:
        asyncio.run(generator.aclose())


def test_a_closing_transaction_waits_for_its_holders_and_holds_back_new_ones() -> None:
    lock = TransactionLock()
    lock.enter()
    assert not lock.close()  # a holder: the transaction cannot close yet
    assert lock.closing
    assert not lock.try_enter()  # no new item starts while it waits
    entered = threading.Event()

    def worker() -> None:
        lock.enter()
        entered.set()
        lock.leave()

    thread = threading.Thread(target=worker)
    thread.start()
    assert not entered.wait(0.1)
    lock.leave()
    assert lock.wait_closed(1.0)
    assert lock.close()
    assert not entered.is_set()  # still closed: the waiting worker goes on only after reopen
    lock.reopen()
    assert entered.wait(5)
    thread.join(5)
    assert lock.holders == 0
