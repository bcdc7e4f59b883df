"""The garbage collector's threshold while engines run: raised, shared, put back."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from sdk import Options, OptionsError, _collector


@pytest.fixture(autouse=True)
def default_threshold() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


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


def test_the_option_is_validated() -> None:
    with pytest.raises(OptionsError, match="gc_threshold"):
        Options(gc_threshold=0)
