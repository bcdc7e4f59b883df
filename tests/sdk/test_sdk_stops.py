"""A consumer stopped with Ctrl-C or SIGTERM says at most a line or two and exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support import Kafka, unique, wait_until

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import os
import sys

from sdk import EmbeddedSource, Gate, ParallelConsumer, stop_on_signals

kafka = {"bootstrap.servers": os.environ["KAFKA_BOOTSTRAP"]}
topic, group, dependency = sys.argv[1:4]
gate = None
if sys.argv[4] == "gated":
    gate = Gate("a", [EmbeddedSource(kafka, [topic], [dependency])])
consumer = ParallelConsumer(
    {
        **kafka,
        "group.id": group,
        "group.instance.id": group + "-1",
        "session.timeout.ms": 6000,
        "auto.offset.reset": "earliest",
    },
    [topic],
    lambda record: print("processed", record.offset, flush=True),
    gate=gate,
)
if sys.argv[5] == "stop_on_signals":
    stop_on_signals(consumer)
consumer.run()
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("gated", ["gated", "plain"])
@pytest.mark.parametrize("handling", ["stop_on_signals", "run"])
def test_a_stopped_consumer_says_a_line_at_most_and_exits_0(
    kafka: Kafka, tmp_path: Path, signum: int, gated: str, handling: str
) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 20})
    dependency = unique("dep")
    kafka.commit(dependency, topic, {0: 10})
    script = tmp_path / "consumer.py"
    script.write_text(SCRIPT)
    process = subprocess.Popen(
        [sys.executable, "-u", str(script), topic, unique("a"), dependency, gated, handling],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KAFKA_BOOTSTRAP": kafka.bootstrap, "PYTHONPATH": str(ROOT)},
        start_new_session=True,  # a process group of its own, as in a terminal
    )
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(process.stdout or []), daemon=True)
    reader.start()
    try:
        wait_until(lambda: len(out) >= 10 or process.poll() is not None, timeout=60, what="records")
        if signum == signal.SIGINT:
            os.killpg(process.pid, signum)  # Ctrl-C reaches the whole process group
        else:
            process.send_signal(signum)
        code = process.wait(60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reader.join(10)
    stderr = process.stderr.read() if process.stderr else ""
    assert len(out) >= 10, stderr
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert len(stderr.splitlines()) <= 2, stderr
