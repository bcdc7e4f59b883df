"""The engine as real OS processes: kill -9 and restart, SIGTERM, and a rebalance."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from sdk import Options, Ordering, Record
from tests.sdk.engine_support import start_engine
from tests.support import Kafka, interruptible, unique, wait_until

ROOT = Path(__file__).resolve().parents[2]


def spawn(
    kafka: Kafka, topic: str, group: str, out: Path, sleep: float = 0.002, redis_url: str = ""
) -> subprocess.Popen[bytes]:
    args = [kafka.bootstrap, topic, group, str(out), str(sleep)] + (
        [redis_url] if redis_url else []
    )
    return subprocess.Popen(
        [sys.executable, "-m", "tests.sdk.engine_worker", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def events(out: Path) -> list[tuple[str, int, int]]:
    found: list[tuple[str, int, int]] = []
    if not out.exists():
        return found
    for line in out.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            found.append((parts[0], int(parts[1]), int(parts[2])))
    return found


def processed(out: Path) -> Counter[tuple[int, int]]:
    return Counter((p, o) for kind, p, o in events(out) if kind == "processed")


@pytest.mark.parametrize("offset_map", ["none", "redis"])
def test_kill_and_restart_processes_every_record_at_least_once(
    kafka: Kafka, tmp_path: Path, offset_map: str, request: pytest.FixtureRequest
) -> None:
    """kill -9 twice mid-work, then restart: every record at least once, and nothing that
    was committed before a kill is processed again. Duplicates are printed: with an offset
    map they are what was in flight or finished since the last commit; without one (this
    broker drops commit metadata), also what finished out of order above the commit point."""
    kafka.broker.require_eviction()
    redis_url = request.getfixturevalue("local_redis").url if offset_map == "redis" else ""
    topic = kafka.create_topic(3)
    per_partition = 400
    kafka.produce(
        topic, {p: per_partition for p in range(3)}, key=lambda p, i: f"k{i % 13}".encode()
    )
    group, out = unique("killed"), tmp_path / "events.log"
    kills = 0
    for _ in range(2):  # kill -9 twice, in the middle of the work
        process = spawn(kafka, topic, group, out, sleep=0.004, redis_url=redis_url)
        wait_until(
            lambda k=kills: len(processed(out)) >= 250 * (k + 1),
            timeout=60,
            what="progress before the kill",
        )
        acknowledged = {}
        for kind, partition, offset in events(out):
            if kind == "committed":
                acknowledged[partition] = max(offset, acknowledged.get(partition, 0))
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
        kills += 1
        before_restart = processed(out)
        process = spawn(kafka, topic, group, out, sleep=0.004, redis_url=redis_url)
        try:
            wait_until(
                lambda b=before_restart: len(processed(out)) > len(b) + 20,
                timeout=60,
                what="restart",
            )
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
        counts = processed(out)
        replayed = [
            key
            for key, n in counts.items()
            if n > before_restart.get(key, 0) and before_restart.get(key, 0) > 0
        ]
        for partition, offset in replayed:
            assert offset >= acknowledged.get(partition, 0), (
                f"{partition}@{offset} was committed, then processed again"
            )
    process = spawn(kafka, topic, group, out, sleep=0.0, redis_url=redis_url)
    try:
        wait_until(
            lambda: len(processed(out)) == 3 * per_partition, timeout=90, what="every record"
        )
        wait_until(
            lambda: kafka.committed(group, topic, 3) == {p: per_partition for p in range(3)},
            timeout=30,
            what="final commit",
        )
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) in (0, -signal.SIGTERM)
    counts = processed(out)
    assert set(counts) == {(p, o) for p in range(3) for o in range(per_partition)}
    duplicates = sum(n - 1 for n in counts.values())
    print(
        f"\noffset map {offset_map}: {kills} kills, {duplicates} duplicates in {sum(counts.values())} handler runs"
    )
    assert "stopped" in out.read_text()


def test_sigterm_drains_in_flight_records_and_commits(kafka: Kafka, tmp_path: Path) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 200}, key=lambda p, i: f"k{i}".encode())
    group, out = unique("term"), tmp_path / "events.log"
    process = spawn(kafka, topic, group, out, sleep=0.05)
    wait_until(lambda: len(processed(out)) >= 20, timeout=60, what="progress")
    process.send_signal(signal.SIGTERM)
    code = process.wait(30)
    stderr = process.stderr.read().decode() if process.stderr else ""
    assert code == 0, stderr
    assert "Traceback" not in stderr
    text = out.read_text()
    assert text.rstrip().endswith("stopped")
    done = {o for _, o in processed(out)}
    committed = kafka.committed(group, topic, 1)[0]
    assert committed == min(set(range(200)) - done, default=200), (
        "the final commit is not what completed"
    )


def test_rebalance_between_two_engines_mid_stream(kafka: Kafka) -> None:
    topic = kafka.create_topic(4)
    group = unique("shared")
    seen: list[tuple[str, int, int]] = []
    lock = threading.Lock()

    def handler(name: str):
        def handle(record: Record) -> None:
            time.sleep(0.002)
            with lock:
                seen.append((name, record.partition, record.offset))

        return handle

    produced = Counter[int]()
    stop_producing = threading.Event()

    def produce() -> None:
        producer = kafka.producer()
        i = 0
        while not stop_producing.is_set():
            producer.produce(topic, key=f"k{i % 17}".encode(), value=b"v", partition=i % 4)
            producer.poll(0)
            produced[i % 4] += 1
            i += 1
            time.sleep(0.005)
        producer.flush(10)

    thread = threading.Thread(target=produce)
    options = Options(ordering=Ordering.KEY, max_concurrency=8, commit_interval=0.3)
    first = start_engine(kafka.bootstrap, topic, handler("first"), options, group=group)
    thread.start()
    try:
        wait_until(lambda: len(seen) >= 200, timeout=60, what="first engine working")
        second = start_engine(kafka.bootstrap, topic, handler("second"), options, group=group)
        try:
            wait_until(
                lambda: sum(n == "second" for n, _, _ in seen) >= 50,
                timeout=60,
                what="second engine working",
            )
            stop_producing.set()
            thread.join(30)
            expected = {(p, o) for p, n in produced.items() for o in range(n)}
            wait_until(
                lambda: {(p, o) for _, p, o in seen} >= expected, timeout=60, what="every record"
            )
            wait_until(
                lambda: kafka.committed(group, topic, 4) == dict(produced),
                timeout=30,
                what="commits",
            )
        finally:
            second.stop()
    finally:
        stop_producing.set()
        first.stop()
    owners: dict[int, set[str]] = {}
    for name, partition, _ in seen:
        owners.setdefault(partition, set()).add(name)
    assert any(len(names) == 2 for names in owners.values()), (
        "no partition moved between the engines"
    )
    counts = Counter((p, o) for _, p, o in seen)
    assert set(counts) == expected
    duplicates = sum(n - 1 for n in counts.values())
    assert duplicates <= 4 * 8 * 2, (
        f"{duplicates} duplicates: more than was in flight around the rebalance"
    )


def test_ctrl_c_in_run_drains_gracefully_without_a_traceback(kafka: Kafka, tmp_path: Path) -> None:
    """``consumer.run()`` in a plain script: the first Ctrl-C (SIGINT) lets records in flight
    finish, commits them and returns; the script ends with exit code 0."""
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 50}, key=lambda p, i: f"k{i}".encode())
    group, out = unique("ctrl-c"), tmp_path / "events.log"
    script = tmp_path / "service.py"
    script.write_text(
        f"""
import time
from sdk import Options, ParallelConsumer

out = open({str(out)!r}, "a", buffering=1)

def handle(record):
    out.write(f"started {{record.offset}}\\n")
    time.sleep(0.3)
    out.write(f"finished {{record.offset}}\\n")

consumer = ParallelConsumer(
    {{"bootstrap.servers": {kafka.bootstrap!r}, "group.id": {group!r},
     "auto.offset.reset": "earliest", "session.timeout.ms": 6000}},
    [{topic!r}],
    handle,
    Options(max_concurrency=4),
)
consumer.run()
out.write("returned\\n")
"""
    )
    process = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=interruptible,
    )
    try:
        wait_until(
            lambda: out.exists() and out.read_text().count("started") >= 4,
            timeout=60,
            what="records in flight",
        )
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    text = out.read_text()
    assert process.returncode == 0, stderr.decode()
    assert b"Traceback" not in stderr
    assert text.rstrip().endswith("returned")
    started = {line.split()[1] for line in text.splitlines() if line.startswith("started")}
    finished = {line.split()[1] for line in text.splitlines() if line.startswith("finished")}
    assert started == finished, "a started record did not finish before run() returned"
    committed = kafka.committed(group, topic, 1).get(0)
    assert committed == len(finished), (committed, len(finished))
