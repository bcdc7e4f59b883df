"""What applications hand the SDK is taken the same way by the compiled core and the pure one.

A ``Record`` over any message-like object returns what that object's methods return.

The behaviour that depends on the core runs in a fresh interpreter per core (``in_core``),
whichever core this test run has loaded itself.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy  # installed with the dev extra (pandas needs it); no dependency of the product
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME

import sdk._compiled
from sdk import Record
from sdk._compiled import CORE, DIGESTS, PURE_ENV, source_digests, why_pure

ROOT = Path(__file__).resolve().parents[2]


# ---- running a check on each core ----------------------------------------------------------


def compiled_core_missing() -> str | None:
    """Why the compiled core cannot run from this checkout (None: it can), whatever core this
    process runs."""
    package = ROOT / "sdk"
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
    return "compiled" if sdk._compiled.COMPILED else "pure"


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
