"""What the SDK logs when something is wrong: once, naming what, never a line per attempt."""

from __future__ import annotations

import logging
import re
import time

import pytest

from demo._local import free_port
from gate import GateService
from gate.serve._serve import ServedGate
from sdk import EmbeddedSource, Gate, HttpSource, Options, Ordering, ParallelConsumer, Record
from sdk.consumer._work import Work
from sdk.engine._core import WorkCore
from sdk.engine._failures import RetriableError
from sdk.engine._shards import Entry, Shard
from sdk.produce._dead_letters import DeadLetters
from sdk.produce._producer import Outputs
from tests.sdk.engine_support import CONSUMER
from tests.sdk.simulated import SimMessage, records_logged
from tests.support import Kafka, gate_config, unique, wait_until


def _lines(caplog: pytest.LogCaptureFixture, logger: str, level: int) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name.startswith(logger) and r.levelno >= level
    ]


def _consumer_config(kafka: Kafka) -> dict[str, object]:
    return {
        "bootstrap.servers": kafka.bootstrap,
        "group.id": unique("a"),
        "group.instance.id": unique("a"),
        **CONSUMER,
    }


def test_an_unreachable_gate_url_is_one_line_naming_it(
    kafka: Kafka, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sdk")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    source = HttpSource(url, poll_interval=0.05, timeout=0.5)
    gate = Gate("a", [source]).start()
    try:
        time.sleep(3.0)  # some sixty failed attempts
        down = _lines(caplog, "sdk", logging.WARNING)
        assert len(down) == 1, down
        assert url in down[0] and "unreachable" in down[0], down

        topic = kafka.create_topic(1)
        group = unique("dep")
        kafka.commit(group, topic, {0: 3})
        config = gate_config(kafka.bootstrap, {"a": {"topics": [topic], "depends_on": [group]}})
        with ServedGate(GateService(config), port=port):
            wait_until(lambda: source.state.up, timeout=20, what="the gate reachable again")
            wait_until(
                lambda: len(_lines(caplog, "sdk", logging.WARNING)) == 2,
                timeout=5,
                what="a line saying so",
            )
            back = _lines(caplog, "sdk", logging.WARNING)[1]
            assert url in back and "reachable again" in back, back
    finally:
        gate.stop()


def test_a_long_hold_is_told(kafka: Kafka, caplog: pytest.LogCaptureFixture) -> None:
    """A dependency that stays behind: the consumer says which records wait, for whom."""
    caplog.set_level(logging.INFO, logger="sdk")
    topic = kafka.create_topic(1)
    dependency = unique("dep")
    kafka.produce(topic, {0: 40})
    kafka.commit(dependency, topic, {0: 10})
    gate = Gate(
        "a",
        [EmbeddedSource({"bootstrap.servers": kafka.bootstrap}, [topic], [dependency])],
        hold_log_after=2.0,
    )
    seen: list[int] = []
    consumer = ParallelConsumer(
        _consumer_config(kafka),
        [topic],
        lambda record: seen.append(record.offset),
        Options(),
        gate=gate,
        registry=None,
    )
    consumer.start()
    try:
        wait_until(lambda: len(seen) == 10, timeout=30, what="the released records")
        # The dependency moves on every half second, but stays far behind: each move
        # releases a record, and the records after it still wait. That is a long hold.
        told_while_moving = False
        for offset in range(11, 35):
            time.sleep(0.5)
            kafka.commit(dependency, topic, {0: offset})
            lines = _lines(caplog, "sdk", logging.WARNING)
            if any("held for" in line for line in lines):
                told_while_moving = True
                break
        assert told_while_moving, _lines(caplog, "sdk", logging.WARNING)
    finally:
        consumer.stop(timeout=10)
    held = [line for line in _lines(caplog, "sdk", logging.WARNING) if "held for" in line]
    assert f"{topic}[0]" in held[0] and dependency in held[0], held


def _held_lines(
    kafka: Kafka, caplog: pytest.LogCaptureFixture, topic: str, gate: Gate, until: str
) -> list[str]:
    """The hold lines a consumer of ``topic`` behind ``gate`` (a no-op handler) logs until one
    contains ``until``."""
    consumer = ParallelConsumer(
        _consumer_config(kafka), [topic], lambda record: None, Options(), gate=gate, registry=None
    )
    consumer.start()
    try:
        wait_until(
            lambda: any(until in line for line in _lines(caplog, "sdk", logging.WARNING)),
            timeout=30,
            what=f"a hold line saying {until!r}",
        )
    finally:
        consumer.stop(timeout=10)
    return [line for line in _lines(caplog, "sdk", logging.WARNING) if "held for" in line]


def test_a_hold_on_a_group_that_never_committed_says_so(
    kafka: Kafka, caplog: pytest.LogCaptureFixture
) -> None:
    """No watermark yet: the line says which group has no committed offset, never 'None';
    before the gate's first snapshot (a slow first poll), that there is none yet."""
    caplog.set_level(logging.INFO, logger="sdk")
    topic = kafka.create_topic(1)
    dependency = unique("dep")
    kafka.produce(topic, {0: 3})
    gate = Gate(
        "a",
        [EmbeddedSource({"bootstrap.servers": kafka.bootstrap}, [topic], [dependency])],
        hold_log_after=1.0,
    )
    named = f"{dependency} (no committed offset there)"
    held = _held_lines(kafka, caplog, topic, gate, until=named)
    first = [line for line in held if "waiting for a first snapshot (none yet" in line]
    assert held[: len(first)] == first, held  # any such line came before the snapshot
    assert held[len(first) :] and all(named in line for line in held[len(first) :]), held
    assert "None" not in " ".join(_lines(caplog, "sdk", logging.INFO)), held


def test_a_hold_before_any_snapshot_says_none_came_and_why(
    kafka: Kafka, caplog: pytest.LogCaptureFixture
) -> None:
    """A gate whose only source never answers: the hold's line says no snapshot came yet and
    what its source met, not that a dependency has not committed."""
    caplog.set_level(logging.INFO, logger="sdk")
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 3})
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    gate = Gate("a", [HttpSource(url, timeout=0.5)], hold_log_after=1.0)
    held = _held_lines(kafka, caplog, topic, gate, until="held for")
    assert "waiting for a first snapshot (none yet from its sources; " in held[0], held
    assert url in held[0] and "committed" not in held[0], held


def test_failing_records_are_summarised_not_logged_per_attempt(
    kafka: Kafka, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sdk")
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 3})
    attempts: list[int] = []

    def handle(record: object) -> None:
        attempts.append(1)
        raise ValueError("no account 17")

    consumer = ParallelConsumer(
        _consumer_config(kafka),
        [topic],
        handle,
        Options(retry_delay=lambda attempt, error: 0.02),
        registry=None,
    )
    consumer.start()
    try:
        wait_until(lambda: len(attempts) >= 30, timeout=30, what="many failed attempts")
    finally:
        consumer.stop(timeout=5)
    lines = _lines(caplog, "sdk", logging.WARNING)
    # The first failure of each record is told; the attempts after it only in the summary.
    assert len(lines) <= 3 + 1, lines
    summary = lines[-1]
    assert summary.startswith("1 record failed") or "records failed" in summary, lines
    assert f"first: {topic}[0]@0 ValueError: no account 17" in summary, summary
    counted = re.search(r"failed (\d+) attempts since \d\d:\d\d:\d\d;", summary)
    assert counted and 30 <= int(counted.group(1)) <= len(attempts), summary


def test_records_are_logged_as_text_so_a_kept_log_line_keeps_no_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler that keeps log records (a test's capture, an error tracker's recent
    history) keeps their arguments: the engine gives a record as text, so a kept log line
    never keeps a record alive, nor its message and its partition's state. Here the two
    lines that name one: a dead-letter copy held after it broke three transactions, and a
    failure to retry (at debug level)."""
    caplog.set_level(logging.DEBUG, logger="sdk")
    core = WorkCore(Ordering.KEY)
    core.assign(("t", 0), None)
    part = core.partitions[("t", 0)]
    message = SimMessage(("t", 0), 5, b"k", 0)
    entry = Entry(5, part, Shard(b"k", part), message, 0.0)
    entry.last_error = "TerminalError: never"
    outputs = Outputs(lambda: None, transactional=True)  # type: ignore[arg-type,return-value]
    outputs.breakers[("t", 0, 5)] = (3, "an output's delivery failed: fenced")
    letters = DeadLetters("dlt", core, lambda: None, transaction=outputs)  # type: ignore[arg-type,return-value]
    letters.send(entry)
    Work(lambda record: None, Options()).failed(Record(message), RetriableError("again"))
    lines = _lines(caplog, "sdk", logging.DEBUG)
    assert any("is held" in line and "t[0]@5" in line for line in lines), lines
    assert any("will retry" in line for line in lines), lines
    assert not [found for record in caplog.records for found in records_logged(record)]
