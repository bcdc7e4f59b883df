"""The delivery reports of a work item's outputs: one callback for all of them (called for
failures only), a failed report traced back to the record whose output it was, and outputs
acknowledged together once the producer holds none on its way (pure parts: the engine's use
of them is tested through the simulated shell and on real brokers)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdk import Output
from sdk.produce._deliveries import Awaiting, Deliveries
from sdk.produce._producer import Outputs


class _Error:
    def __init__(self, text: str) -> None:
        self.text = text

    def str(self) -> str:
        return self.text


class _Message:
    """A delivery report's message, as confluent-kafka hands it to the callback."""

    def __init__(self, output: Output) -> None:
        self.output = output

    def topic(self) -> str:
        return self.output.topic

    def key(self) -> bytes | None:
        key = self.output.key
        return key.encode() if isinstance(key, str) else key

    def value(self) -> bytes | None:
        value = self.output.value
        return value.encode() if isinstance(value, str) else value


class _Record:
    def __init__(self, offset: int) -> None:
        self.topic, self.partition, self.offset = "in", 0, offset


def _outputs(transactional: bool = False) -> Outputs:
    return Outputs(lambda: None, transactional)  # type: ignore[arg-type,return-value]


def _sent(deliveries: Deliveries, index: int, *outputs: Output) -> None:
    """What ``Outputs.send`` records of one record's outputs."""
    deliveries.sent.append((index, _Record(index), outputs))


@given(st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=20), st.data())
def test_failed_reports_in_any_order_fail_exactly_the_records_whose_outputs_failed(
    records: list[tuple[int, bool]], data: st.DataObject
) -> None:
    """Every output shares the item's callback, which confluent-kafka calls for failed
    deliveries only: whatever their order, the records noted failed are those with a failed
    output, and their settled results say so."""
    deliveries = Deliveries(_outputs())
    failed: list[Output] = []
    for index, (count, ok) in enumerate(records):
        produced = [Output("out", f"{index}.{n}".encode()) for n in range(count)]
        _sent(deliveries, index, *produced)
        failed += [] if ok else data.draw(st.lists(st.sampled_from(produced), min_size=1))
    for output in data.draw(st.permutations(failed)):
        deliveries.delivered(_Error("gone"), _Message(output))  # type: ignore[arg-type]
    expected = {i for i, (_, ok) in enumerate(records) if not ok}
    assert set(deliveries.errors) == expected

    def settle(results: list[Any], errors: dict[int, str]) -> None:
        for index in errors:
            results[index] = "failed"

    waiting = Awaiting([None] * len(records), deliveries, settle)
    assert {i for i, result in enumerate(waiting.settle()) if result == "failed"} == expected


class _Producer:
    """Stands for confluent-kafka's producer where ``Outputs.acknowledged`` depends on it: its
    ``len()`` counts the outputs whose report (failed or not) was not served yet."""

    def __init__(self, on_way: int, failures: list[Any]) -> None:
        self.on_way = on_way  # outputs not acknowledged yet
        self.reports = failures  # (callback, output) of failed deliveries to serve
        self.calls: list[str] = []

    def poll(self, timeout: float) -> int:
        self.calls.append("poll")
        return self._serve()

    def flush(self, timeout: float) -> int:
        self.calls.append("flush")
        self.on_way = 0  # (what the broker acknowledged meanwhile)
        self._serve()
        return len(self)

    def _serve(self) -> int:
        served = len(self.reports)
        for callback, output in self.reports:
            callback(_Error("gone"), _Message(output))
        self.reports = []
        return served

    def __len__(self) -> int:
        return self.on_way + len(self.reports)


def _with_producer(producer: _Producer) -> Outputs:
    outputs = Outputs(lambda: producer, False)  # type: ignore[arg-type,return-value]
    assert outputs.producer is producer  # type: ignore[comparison-overlap]
    return outputs


@pytest.mark.parametrize("drain", [False, True])
def test_outputs_count_as_acknowledged_only_once_none_is_on_its_way(drain: bool) -> None:
    """``acknowledged`` serves the failure reports first (their callbacks run before it says
    yes), says no while an output is on its way, and flushes only when told to drain."""
    deliveries = Deliveries(_outputs())
    output = Output("out", b"1")
    _sent(deliveries, 0, output)
    producer = _Producer(on_way=1, failures=[(deliveries.delivered, output)])
    outputs = _with_producer(producer)
    assert outputs.acknowledged(drain) is drain  # (a flush waits for the one on its way)
    assert deliveries.errors == {0: "gone"}
    assert producer.calls == ["flush" if drain else "poll"]
    producer.on_way = 0
    assert outputs.acknowledged(False)


def test_outputs_are_not_taken_for_acknowledged_while_another_thread_serves_reports() -> None:
    """A report being served elsewhere may not have run its callback yet: no answer then."""
    producer = _Producer(on_way=0, failures=[])
    outputs = _with_producer(producer)
    with outputs._serving:
        assert not outputs.acknowledged(True)
    assert producer.calls == []
    assert outputs.acknowledged(True)


def test_a_failed_report_fails_the_record_whose_output_it_was() -> None:
    deliveries = Deliveries(_outputs())
    first, second, third = Output("out", b"1", "k"), Output("out", "2", "k"), Output("x", b"3")
    _sent(deliveries, 0, first)
    _sent(deliveries, 1, second, third)
    deliveries.delivered(_Error("too large"), _Message(second))  # type: ignore[arg-type]
    assert deliveries.errors == {1: "too large"}
    seen: list[dict[int, str]] = []

    def settle(results: list[Any], errors: dict[int, str]) -> None:
        seen.append(dict(errors))
        for index in errors:
            results[index] = "failed"

    waiting = Awaiting([None, None], deliveries, settle)
    assert waiting.settle() == [None, "failed"]
    assert seen == [{1: "too large"}]


def test_a_lone_output_noted_as_itself_is_traced_back_like_a_sequence() -> None:
    """``Outputs.send_one`` notes a handler's lone ``Output`` as itself, not in a sequence:
    a failed report still finds its record, and only it (its fields are not taken for
    outputs)."""
    deliveries = Deliveries(_outputs())
    lone, other = Output("out", b"1", "k"), Output("out", b"2", "k")
    deliveries.sent.append((0, _Record(0), lone))
    deliveries.sent.append((1, _Record(1), other))
    deliveries.delivered(_Error("gone"), _Message(other))  # type: ignore[arg-type]
    assert deliveries.errors == {1: "gone"}
    assert [index for index, _ in deliveries.culprits(_Message(lone))] == [0]


def test_a_failed_report_that_matches_several_records_fails_each_of_them() -> None:
    """The same output (topic, key and value) from two records: either could be the one
    that failed, so both run again (at least once: a copy may be written twice, none lost);
    a report that matches no output fails every record with outputs."""
    deliveries = Deliveries(_outputs())
    same = Output("out", b"done")
    _sent(deliveries, 0, same)
    _sent(deliveries, 1, Output("out", b"other"))
    _sent(deliveries, 2, Output("out", b"done"))
    deliveries.delivered(_Error("timed out"), _Message(same))  # type: ignore[arg-type]
    assert deliveries.errors == {0: "timed out", 2: "timed out"}
    deliveries.delivered(_Error("odd"), _Message(Output("elsewhere", b"?")))  # type: ignore[arg-type]
    assert deliveries.errors == {0: "timed out", 1: "odd", 2: "timed out"}


def test_an_item_without_failures_settles_to_its_results_as_they_are() -> None:
    deliveries = Deliveries(_outputs())
    _sent(deliveries, 0, Output("out", b"v"))
    called: list[int] = []
    waiting = Awaiting([None, None], deliveries, lambda results, errors: called.append(1))
    deliveries.delivered(None, _Message(Output("out", b"v")))
    assert waiting.settle() == [None, None]
    assert called == []


def test_transactional_a_failed_report_breaks_the_transaction_and_blames_its_input() -> None:
    outputs = _outputs(transactional=True)
    deliveries = Deliveries(outputs)
    one, two = Output("out", b"1"), Output("out", b"2")
    _sent(deliveries, 0, one)
    deliveries.sent.append((1, [_Record(5), _Record(6)], (two,)))  # a batch handler's call
    assert not deliveries.awaited  # nothing waits: the transaction commits them
    deliveries.delivered(_Error("gone"), _Message(two))  # type: ignore[arg-type]
    assert outputs.broken == "an output's delivery failed: gone"
    assert outputs.broke(("in", 0, 5)) == (1, "an output's delivery failed: gone")
    assert outputs.broke(("in", 0, 6))[0] == 1
    assert outputs.broke(("in", 0, 0))[0] == 0
    assert deliveries.errors == {}
