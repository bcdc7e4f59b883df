"""The garbage collector's threshold while engines run: raised, shared, put back, and a
collector the application turned off left off."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from sdk import Options, OptionsError, ParallelConsumer
from sdk.consumer import _collector
from tests.support import Kafka, unique, wait_until


@pytest.fixture(autouse=True)
def default_threshold() -> Iterator[None]:
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(700, 10, 10)
    gc.enable()
    yield
    while _collector._users:  # a failed test's engines: none left for the next test
        _collector.restore()
    gc.set_threshold(*before)
    if not enabled:
        gc.disable()


def test_raised_while_engines_run_and_put_back_by_the_last() -> None:
    assert _collector.raise_threshold(10_000)
    assert gc.get_threshold() == (10_000, 10, 10)
    assert _collector.raise_threshold(10_000)  # a second engine
    _collector.restore()
    assert gc.get_threshold()[0] == 10_000, "put back while an engine still runs"
    _collector.restore()
    assert gc.get_threshold() == (700, 10, 10)


def test_never_lowered_and_left_alone_when_asked() -> None:
    gc.set_threshold(50_000, 10, 10)
    assert _collector.raise_threshold(10_000)
    assert gc.get_threshold()[0] == 50_000
    _collector.restore()
    assert gc.get_threshold()[0] == 50_000
    assert not _collector.raise_threshold(None)
    assert gc.get_threshold()[0] == 50_000


def test_a_threshold_changed_meanwhile_is_kept() -> None:
    assert _collector.raise_threshold(10_000)
    gc.set_threshold(2_000, 10, 10)  # the application's own choice
    _collector.restore()
    assert gc.get_threshold()[0] == 2_000


def test_a_threshold_of_0_stays_0_while_engines_run() -> None:
    gc.set_threshold(0, 10, 10)  # the application disabled automatic collection
    assert _collector.raise_threshold(10_000)
    assert gc.get_threshold() == (0, 10, 10)
    assert _collector.raise_threshold(10_000)  # a second engine
    _collector.restore()
    _collector.restore()
    assert gc.get_threshold() == (0, 10, 10)


def test_a_disabled_collector_is_left_as_it_is() -> None:
    gc.disable()
    assert _collector.raise_threshold(10_000)
    assert gc.get_threshold() == (700, 10, 10) and not gc.isenabled()
    _collector.restore()
    assert gc.get_threshold() == (700, 10, 10) and not gc.isenabled()


def test_a_threshold_of_0_set_meanwhile_is_kept() -> None:
    assert _collector.raise_threshold(10_000)
    gc.set_threshold(0, 10, 10)  # the application's own choice, while the engine runs
    _collector.restore()
    assert gc.get_threshold() == (0, 10, 10)


def test_a_collector_disabled_meanwhile_stays_disabled() -> None:
    assert _collector.raise_threshold(10_000)
    gc.disable()  # the application's own choice, while the engine runs
    _collector.restore()
    assert gc.get_threshold() == (700, 10, 10) and not gc.isenabled()


def test_the_next_engine_raises_it_again_once_collection_is_back() -> None:
    gc.set_threshold(0, 10, 10)
    assert _collector.raise_threshold(10_000)
    _collector.restore()
    gc.set_threshold(700, 10, 10)  # the application turned automatic collection back on
    assert _collector.raise_threshold(10_000)
    assert gc.get_threshold() == (10_000, 10, 10)
    _collector.restore()
    assert gc.get_threshold() == (700, 10, 10)


def test_the_option_is_validated() -> None:
    with pytest.raises(OptionsError, match="gc_threshold"):
        Options(gc_threshold=0)


@pytest.mark.parametrize("application", [(0, 10, 10), (700, 10, 10)], ids=["disabled", "700"])
def test_a_consumer_runs_with_the_applications_collector(
    kafka: Kafka, application: tuple[int, int, int]
) -> None:
    """A threshold of 0 stays 0 while a consumer runs; 700 is raised and put back."""
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 5})
    gc.set_threshold(*application)
    seen: list[int] = []
    consumer = ParallelConsumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": unique("collector"),
            "session.timeout.ms": 6000,
            "auto.offset.reset": "earliest",
        },
        [topic],
        lambda record: seen.append(gc.get_threshold()[0]),
        Options(gc_threshold=50_000),
        registry=None,
    ).start()
    try:
        wait_until(lambda: len(seen) == 5, timeout=60, what="every record handled")
    finally:
        consumer.stop()
    assert seen == [0 if application[0] == 0 else 50_000] * 5
    assert gc.get_threshold() == application
