"""The delivery reports of a work item's outputs: one callback for all of them, a count for
the successes, and a failed report traced back to the record whose output it was (pure
parts: the engine's use of them is tested through the simulated shell and on real brokers)."""

from __future__ import annotations

from typing import Any

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
    deliveries.expected += len(outputs)


@given(st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=20), st.data())
def test_an_item_is_settled_once_when_its_last_report_arrives(
    records: list[tuple[int, bool]], data: st.DataObject
) -> None:
    """Every output shares the item's callback; the item is put on the settled list by the
    report that completes its count, and only once the consumer's thread waits for it."""
    outputs = _outputs()
    deliveries = Deliveries(outputs)
    reports: list[tuple[int, Output, bool]] = []
    for index, (count, ok) in enumerate(records):
        produced = [Output("out", f"{index}.{n}".encode()) for n in range(count)]
        _sent(deliveries, index, *produced)
        reports += [(index, output, ok or n > 0) for n, output in enumerate(produced)]
    reports = data.draw(st.permutations(reports))
    early = data.draw(st.integers(0, len(reports)))  # reports served before the item is waited for
    for _, output, ok in reports[:early]:
        deliveries.delivered(None if ok else _Error("gone"), _Message(output))  # type: ignore[arg-type]
    assert not outputs.settled
    if deliveries.settled:
        assert early == len(reports)
    else:
        deliveries.item = 7
        for _, output, ok in reports[early:]:
            assert not outputs.settled
            deliveries.delivered(None if ok else _Error("gone"), _Message(output))  # type: ignore[arg-type]
        assert outputs.poll(True) == [deliveries]
        assert not outputs.settled
    assert deliveries.settled
    assert set(deliveries.errors) == {i for i, (_, ok) in enumerate(records) if not ok}


def test_a_failed_report_fails_the_record_whose_output_it_was() -> None:
    deliveries = Deliveries(_outputs())
    first, second, third = Output("out", b"1", "k"), Output("out", "2", "k"), Output("x", b"3")
    _sent(deliveries, 0, first)
    _sent(deliveries, 1, second, third)
    deliveries.delivered(None, _Message(first))
    deliveries.delivered(_Error("too large"), _Message(second))  # type: ignore[arg-type]
    deliveries.delivered(None, _Message(third))
    assert deliveries.settled
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
    deliveries.expected += 2
    deliveries.delivered(None, _Message(lone))
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
