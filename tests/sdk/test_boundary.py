"""What applications hand the SDK is taken the same way by the compiled core and the pure one.

A watermark source of the application's own may offer any integer type (``numpy.int64``
from a data frame, an ``IntEnum``): the view makes every value a plain ``int`` and rejects,
logs and counts a snapshot holding anything else, so the consumer never sees it. A
``Record`` over any message-like object returns what that object's methods return.

The behaviour that depends on the core runs in a fresh interpreter per core (``in_core``),
whichever core this test run has loaded itself; the view's own rules run here.
"""

from __future__ import annotations

import enum
import importlib.machinery
import json
import logging
import operator
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy  # installed with the dev extra (pandas needs it); no dependency of the product
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME

import sdk.engine._compiled
from gate.evaluate._watermark import Snapshot, SnapshotError
from sdk import Gate, Options, Ordering, ParallelConsumer, Record
from sdk.engine._compiled import CORE, DIGESTS, PURE_ENV, source_digests, why_pure
from sdk.gating._view import SourceState, WatermarkView, plain_snapshot
from tests.sdk.engine_support import FedSource
from tests.support import Kafka, unique, wait_until

ROOT = Path(__file__).resolve().parents[2]
GATE = "boundary"


# ---- running a check on each core ----------------------------------------------------------


def compiled_core_missing() -> str | None:
    """Why the compiled core cannot run from this checkout (None: it can), whatever core this
    process runs."""
    package = ROOT / "sdk" / "engine"
    built = [
        name
        for name in CORE
        if any(
            (package / f"{name}{suffix}").exists()
            for suffix in importlib.machinery.EXTENSION_SUFFIXES
        )
    ]
    try:
        recorded = json.loads((package / DIGESTS).read_text())
    except (OSError, ValueError):
        recorded = {}
    return why_pure(False, built, recorded, source_digests(package) if built else {})


@pytest.fixture(params=["compiled", "pure"])
def core(request: pytest.FixtureRequest) -> str:
    if request.param == "compiled":
        missing = compiled_core_missing()
        if missing is not None:
            if os.environ.get("REQUIRE_COMPILED_CORE"):
                pytest.fail(f"the compiled core cannot run: {missing}")
            pytest.skip(f"the compiled core cannot run here: {missing}")
    return str(request.param)


def in_core(core: str, check: str, *args: Any) -> dict[str, Any]:
    """``check(*args)`` of this module run in a fresh interpreter on ``core``: its result."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop(PURE_ENV, None)
    if core == "pure":
        env[PURE_ENV] = "1"
    script = (
        "import json, sys\n"
        "from tests.sdk import test_boundary as module\n"
        "result = getattr(module, sys.argv[1])(*json.loads(sys.argv[2]))\n"
        "print(json.dumps(result))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, check, json.dumps(args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, f"{check} failed on the {core} core:\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert result.pop("core") == core
    return result


def running_core() -> str:
    return "compiled" if sdk.engine._compiled.COMPILED else "pure"


# ---- records over message-like objects ------------------------------------------------------


class Double:
    """A message-like test double: each method returns the value it was given, as it is."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields

    def topic(self) -> Any:
        return self.fields["topic"]

    def partition(self) -> Any:
        return self.fields["partition"]

    def offset(self) -> Any:
        return self.fields["offset"]

    def key(self) -> Any:
        return self.fields["key"]

    def value(self) -> Any:
        return self.fields["value"]

    def headers(self) -> Any:
        return self.fields["headers"]

    def timestamp(self) -> Any:
        return self.fields["timestamp"]


def outcome(read: Any) -> str:
    """What reading a field gave: ``same`` (the double's own object) or the error raised."""
    try:
        return "same" if read() else "different"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def records_over_a_double() -> dict[str, Any]:
    """Checked on each core: a record returns exactly what its message's methods return."""
    fields = {
        "topic": numpy.str_("orders"),
        "partition": numpy.int64(3),
        "offset": numpy.uint32(7),
        "key": "a text key",
        "value": {"already": "decoded"},
        "headers": (("h", b"v"),),
        "timestamp": (TIMESTAMP_CREATE_TIME, Decimal(1_700_000_000_123)),
    }
    double = Double(**fields)
    attempt = numpy.int64(2)
    record = Record(double, attempt)
    decoded = Record(double, 1, str.upper, lambda value: sorted(value))
    return {
        "core": running_core(),
        "fields": {
            "topic": outcome(lambda: record.topic is fields["topic"]),
            "partition": outcome(lambda: record.partition is fields["partition"]),
            "offset": outcome(lambda: record.offset is fields["offset"]),
            "raw_key": outcome(lambda: record.raw_key is fields["key"]),
            "raw_value": outcome(lambda: record.raw_value is fields["value"]),
            "key": outcome(lambda: record.key is fields["key"]),
            "value": outcome(lambda: record.value is fields["value"]),
            "headers": outcome(lambda: record.headers is fields["headers"]),
            "timestamp": outcome(lambda: record.timestamp == Decimal("1700000000.123")),
            "attempt": outcome(lambda: record.attempt is attempt),
            "message": outcome(lambda: record.message is double),
        },
        "repr": outcome(lambda: repr(record) == "Record(orders[3]@7, attempt=2)"),
        "deserialized": outcome(
            lambda: (decoded.key, decoded.value) == ("A TEXT KEY", ["already"])
        ),
        "decode_error": outcome(lambda: decoded.decode_error is None),
    }


def test_a_record_returns_what_its_message_returns_on_both_cores(core: str) -> None:
    result = in_core(core, "records_over_a_double")
    assert result == {
        "fields": dict.fromkeys(
            (
                "topic",
                "partition",
                "offset",
                "raw_key",
                "raw_value",
                "key",
                "value",
                "headers",
                "timestamp",
                "attempt",
                "message",
            ),
            "same",
        ),
        "repr": "same",
        "deserialized": "same",
        "decode_error": "same",
    }


# ---- snapshots from an application's own source ----------------------------------------------


class Level(enum.IntEnum):
    TEN = 10


class ListSource(FedSource):
    """An application's own watermark source, fed by the test."""

    def __init__(self) -> None:
        super().__init__()
        self.state = SourceState("own")

    def send(self, version: Any, watermarks: dict[Any, Any], gate: Any = GATE) -> bool:
        return super().send(version, watermarks, gate)


def test_integers_of_any_type_become_plain_ints() -> None:
    source = ListSource()
    gate = Gate(GATE, source).start()
    try:
        marks = {
            (numpy.str_("t"), numpy.int64(0)): numpy.int64(5),
            ("t", numpy.int32(1)): numpy.uint64(2**63 + 1),
            ("t", 2): Level.TEN,
            ("t", 3): None,
        }
        assert source.send(numpy.int64(4), marks)
        snapshot = gate.snapshot
        assert snapshot is not None
        assert type(snapshot.version) is int and snapshot.version == 4
        assert snapshot.watermarks == {
            ("t", 0): 5,
            ("t", 1): 2**63 + 1,
            ("t", 2): 10,
            ("t", 3): None,
        }
        assert all(type(topic) is str and type(p) is int for topic, p in snapshot.watermarks)
        assert all(type(w) is int for w in snapshot.watermarks.values() if w is not None)
        limits = [gate.limit("t", p) for p in range(4)]
        assert limits == [5, 2**63 + 1, 10, 0] and all(type(limit) is int for limit in limits)
        assert source.state.rejected == {}
    finally:
        gate.stop()


@pytest.mark.parametrize(
    ("version", "watermarks", "named"),
    [
        (2, {("t", 0): 5.0}, "watermark of t[0] 5.0 (float) is not an integer"),
        (
            2,
            {("t", 0): numpy.float64(5)},
            "watermark of t[0] np.float64(5.0) (float64) is not an integer",
        ),
        (2, {("t", 0): True}, "watermark of t[0] True is a bool, not an integer"),
        (2, {("t", 0): numpy.bool_(True)}, "watermark of t[0] np.True_ (bool) is not an integer"),
        (2, {("t", 0): "5"}, "watermark of t[0] '5' (str) is not an integer"),
        (2, {("t", 0): -1}, "watermark of t[0] -1 is negative"),
        (2, {("t", 1.0): 5}, "partition of 't' 1.0 (float) is not an integer"),
        (2, {("t", False): 5}, "partition of 't' False is a bool, not an integer"),
        (2, {(7, 0): 5}, "topic 7 is not a string"),
        (2, {"t": 5}, "watermarks key 't' is not a (topic, partition) pair"),
        (2.0, {("t", 0): 5}, "version 2.0 (float) is not an integer"),
        (True, {("t", 0): 5}, "version True is a bool, not an integer"),
    ],
)
def test_a_snapshot_with_a_value_that_is_not_an_integer_is_rejected_and_named(
    version: Any, watermarks: dict[Any, Any], named: str, caplog: pytest.LogCaptureFixture
) -> None:
    source = ListSource()
    gate = Gate(GATE, source).start()
    try:
        assert source.send(1, {("t", 0): 3})
        with caplog.at_level(logging.WARNING, logger="sdk.gate"):
            assert not source.send(version, watermarks)
        assert f"own: rejected a malformed snapshot: {named}" in caplog.text
        assert source.state.rejected == {"malformed": 1}
        snapshot = gate.snapshot
        assert snapshot is not None and snapshot.version == 1  # the last good one stays
        assert gate.limit("t", 0) == 3
    finally:
        gate.stop()


def test_a_snapshot_that_is_not_one_is_rejected_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        gate, version, polled_at = GATE, 1, 0.0

        @property
        def watermarks(self) -> Any:
            raise RuntimeError("the source's own bug")

    view = WatermarkView(GATE)
    state = SourceState("own")
    with caplog.at_level(logging.WARNING, logger="sdk.gate"):
        assert not view.offer(object(), state)  # type: ignore[arg-type]
        assert not view.offer(Broken(), state)  # type: ignore[arg-type]
        assert not view.offer(Snapshot(GATE, 1, float("nan"), {}), state)
    assert state.rejected == {"malformed": 3}
    assert "AttributeError" in caplog.text and "RuntimeError: the source's own bug" in caplog.text
    assert view.snapshot is None


def test_a_plain_snapshot_is_kept_as_it_is() -> None:
    snapshot = Snapshot(GATE, 3, 1.5, {("t", 0): 4, ("t", 1): None})
    assert plain_snapshot(snapshot) is snapshot
    with pytest.raises(SnapshotError, match="polled_at 'now' is not a number"):
        plain_snapshot(Snapshot(GATE, 3, "now", {}))  # type: ignore[arg-type]


# ---- a consumer behind an application's own source, on a real broker ---------------------------

PARTITIONS = 3
PER_PARTITION = 6
HELD_BACK = {0: 0, 1: 3, 2: 6}
"""The first snapshot's watermarks: nothing of partition 0, half of 1, all of 2."""


class NumpySource(ListSource):
    """Offers its watermarks as numpy integers, as a source reading a data frame would."""

    def send_numpy(self, version: int, topic: str, watermarks: dict[int, Any]) -> bool:
        return self.send(
            numpy.int64(version),
            {(numpy.str_(topic), numpy.int64(p)): w for p, w in watermarks.items()},
            gate=numpy.str_(GATE),
        )


def consume_behind_numpy_watermarks(bootstrap: str, topic: str) -> dict[str, Any]:
    """Checked on each core: a consumer gated by numpy watermarks processes what they
    release and nothing beyond, rejected snapshots change nothing, and a newer snapshot
    releases the rest."""
    source = NumpySource()
    gate = Gate(GATE, source, stale_after=3600).start()
    handled: list[tuple[int, int]] = []
    consumer = ParallelConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("boundary"),
            "session.timeout.ms": 6000,
            "auto.offset.reset": "earliest",
        },
        [topic],
        lambda record: handled.append((record.partition, record.offset)),
        Options(ordering=Ordering.KEY, commit_interval=0.2),
        gate=gate,
        registry=None,
    )
    offers = {
        "float": source.send_numpy(1, topic, {p: numpy.float64(w) for p, w in HELD_BACK.items()}),
        "bool": source.send_numpy(2, topic, {p: numpy.bool_(True) for p in HELD_BACK}),
        "int64": source.send_numpy(3, topic, {p: numpy.int64(w) for p, w in HELD_BACK.items()}),
    }

    def alive() -> bool:
        if not consumer.running:
            consumer.stop()  # raises what stopped it
            raise AssertionError("the consumer stopped")
        return True

    def settled() -> dict[Any, Any] | None:
        """The partitions' state once every record is either handled or held by the gate
        and the handled ones are committed."""
        alive()
        partitions = consumer.stats().get("partitions", {})
        if len(partitions) < PARTITIONS:
            return None
        for (_, p), view in partitions.items():
            if view["in_flight"] or view["gate_held"] != PER_PARTITION - HELD_BACK[p]:
                return None
            if view["committed"] not in ((HELD_BACK[p],) if HELD_BACK[p] else (None, 0)):
                return None
        return partitions

    consumer.start()
    try:
        partitions = wait_until(settled, timeout=120, what="records handled or held")
        held_phase = sorted(handled)
        # The limits in force, and their types (JSON would refuse a numpy integer).
        limits = {
            p: [operator.index(view["limit"]), type(view["limit"]).__name__]
            for (_, p), view in partitions.items()
        }
        offers["float beyond"] = source.send_numpy(4, topic, dict.fromkeys(HELD_BACK, 6.0))
        offers["int64 beyond"] = source.send_numpy(
            5, topic, dict.fromkeys(HELD_BACK, numpy.int64(6))
        )
        wait_until(
            lambda: alive() and len(handled) == PARTITIONS * PER_PARTITION,
            timeout=120,
            what="every record handled",
        )
    finally:
        consumer.stop(timeout=10)
        gate.stop()
    return {
        "core": running_core(),
        "offers": offers,
        "rejected": source.state.rejected,
        "held_phase": held_phase,
        "limits": limits,
        "handled": sorted(handled),
    }


def test_a_consumer_gated_by_numpy_watermarks_on_both_cores(kafka: Kafka, core: str) -> None:
    topic = kafka.create_topic(PARTITIONS)
    kafka.produce(topic, dict.fromkeys(range(PARTITIONS), PER_PARTITION), key=lambda p, i: b"k")
    result = in_core(core, "consume_behind_numpy_watermarks", kafka.bootstrap, topic)
    assert result["offers"] == {
        "float": False,
        "bool": False,
        "int64": True,
        "float beyond": False,
        "int64 beyond": True,
    }
    assert result["rejected"] == {"malformed": 3}
    assert result["held_phase"] == [[p, o] for p in range(PARTITIONS) for o in range(HELD_BACK[p])]
    assert result["limits"] == {str(p): [w, "int"] for p, w in HELD_BACK.items()}
    everything = [[p, o] for p in range(PARTITIONS) for o in range(PER_PARTITION)]
    assert result["handled"] == everything
