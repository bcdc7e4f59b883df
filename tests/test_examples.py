"""The examples run as documented, against the real broker."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support import Broker, Kafka, interruptible, unique, wait_until

pytest.importorskip("pyspark")

ROOT = Path(__file__).resolve().parent.parent
BATCH = re.compile(r"^batch \d+: (\d+) payments")
RANGE = re.compile(r"p(\d+) \d+ \(offsets (\d+)\.\.(\d+)\)")


def test_the_spark_example_reads_only_what_the_dependencies_committed(
    kafka: Kafka, tmp_path: Path
) -> None:
    topic = kafka.create_topic(3)
    producer = kafka.producer()
    for i in range(300):
        value = json.dumps({"payment": i, "amount": i % 100}).encode()
        producer.produce(topic, key=f"account-{i % 7}".encode(), value=value, partition=i % 3)
    producer.flush(30)
    b, c, job = unique("service-b"), unique("service-c"), unique("payments-report")
    kafka.commit(b, topic, {0: 100, 1: 60, 2: 100})
    kafka.commit(c, topic, {0: 40, 1: 100, 2: 100})
    watermarks = {0: 40, 1: 60, 2: 100}

    command = [
        sys.executable,
        str(ROOT / "examples" / "spark_payments.py"),
        "--bootstrap", kafka.bootstrap, "--topic", topic, "--depends-on", f"{b},{c}",
        "--group", job, "--work-dir", str(tmp_path), "--trigger", "500 milliseconds",
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=interruptible,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout or []), daemon=True)
    reader.start()
    try:
        read = lambda: sum(int(m[1]) for line in lines if (m := BATCH.match(line)))  # noqa: E731
        wait_until(lambda: read() >= sum(watermarks.values()), timeout=240, what="the batches")
        wait_until(lambda: kafka.committed(job, topic, 3) == watermarks, timeout=60, what="commit")
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(120)
        reader.join(10)
    assert code == 0, "".join(lines)
    assert read() == sum(watermarks.values())
    highest: dict[int, int] = {}
    for line in lines:
        for partition, _, last in RANGE.findall(line):
            highest[int(partition)] = max(highest.get(int(partition), -1), int(last))
    assert highest == {p: w - 1 for p, w in watermarks.items()}


# How the example stops does not depend on the broker, and each run starts a Spark session
# (a minute or more on a loaded machine): each signal runs on one local broker.
SIGNAL_ON = {signal.SIGINT: "tansu", signal.SIGTERM: "noida"}


@pytest.mark.timeout(600)  # a Spark session and its first batches on a loaded 2-core machine
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_the_spark_example_stops_cleanly_on_a_signal_to_its_process_group(
    kafka: Kafka, broker: Broker, tmp_path: Path, signum: signal.Signals
) -> None:
    """As Ctrl-C in a terminal (or a service manager's SIGTERM) does, the signal goes to the
    whole process group: the example stops its query and Spark itself, says at most a line or
    two, and exits 0."""
    if broker.name in SIGNAL_ON.values() and SIGNAL_ON[signum] != broker.name:
        pytest.skip(f"{signum.name} runs on {SIGNAL_ON[signum]}: the stop is the same on each")
    topic = kafka.create_topic(2)
    producer = kafka.producer()
    for i in range(100):
        producer.produce(topic, value=json.dumps({"payment": i, "amount": 1}).encode())
    producer.flush(30)
    b = unique("service-b")
    kafka.commit(b, topic, {0: 10**6, 1: 10**6})
    command = [
        sys.executable,
        str(ROOT / "examples" / "spark_payments.py"),
        "--bootstrap", kafka.bootstrap, "--topic", topic, "--depends-on", b,
        "--group", unique("payments-report"), "--work-dir", str(tmp_path),
        "--trigger", "200 milliseconds",
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=lambda: out.extend(process.stdout or []), daemon=True),
        threading.Thread(target=lambda: err.extend(process.stderr or []), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        try:
            wait_until(
                lambda: process.poll() is not None or any(BATCH.match(line) for line in out),
                timeout=400,
                what="a batch",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it said:\n{''.join(err)[-3000:]}") from None
        assert process.poll() is None, f"it exited {process.returncode}:\n{''.join(err)[-3000:]}"
        before = len(err)
        os.killpg(process.pid, signum)
        code = process.wait(120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    for reader in readers:
        reader.join(10)
    after = [line.rstrip() for line in err[before:] if line.strip()]
    assert code == 0, "".join(err)
    assert len(after) <= 2, "\n".join(after)
    assert not [line for line in after if "Traceback" in line or "Exception" in line]
    assert out[-1].strip() == "stopped", "".join(out)
