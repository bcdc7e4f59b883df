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

from tests.support import Kafka, interruptible, unique, wait_until

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
