"""The processes of the fault-injection scenarios, each a real OS process.

``python -m tests.faults.actors dependency BOOTSTRAP TOPIC PARTITIONS GROUP LOG MIN_S MAX_S``
    A plain consumer (assign, no group membership) that resumes from its group's committed
    offsets, processes each record for a random time and commits synchronously every 50 ms;
    it logs ``commit <sent wall time> <partition> <offset>`` (the time just before the commit
    was sent: no commit can be visible earlier).

``python -m tests.faults.actors dependent BOOTSTRAP TOPIC GROUP LOG REDIS_URL GATE_URL``
    Service A on the engine (KEY ordering, batch handler, gated through Redis then the gate's
    HTTP API); logs ``start <wall time> <partition> <offset> <pid> <record timestamp>`` when a
    batch begins, for every record in it, and ``commit <wall time> <partition> <offset> <pid>`` after each
    commit. SIGTERM stops it gracefully. Its own log lines (stderr) carry the time and its pid;
    SIGUSR1 writes the stacks of its threads to ``LOG.stack-<pid>`` (a stall report reads them).

Every line is flushed at once, so a kill -9 loses nothing already logged.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import random
import signal
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition


class Log:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:
            self._file.write(line + "\n")


def dependency(argv: list[str]) -> None:
    bootstrap, topic, partitions, group, log_path, low, high = argv
    log = Log(log_path)
    rng = random.Random(os.getpid())
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    tps = [TopicPartition(topic, p) for p in range(int(partitions))]
    committed = consumer.committed(tps, timeout=30)
    consumer.assign(
        [
            TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else 0)
            for tp in committed
        ]
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    pending: dict[int, int] = {}
    last_commit = time.monotonic()
    while not stop.is_set():
        message = consumer.poll(0.02)
        if message is not None and message.error() is None:
            time.sleep(rng.uniform(float(low), float(high)))
            pending[message.partition()] = message.offset() + 1
        if pending and time.monotonic() - last_commit >= 0.05:
            sent = time.time()
            try:
                consumer.commit(
                    offsets=[TopicPartition(topic, p, o) for p, o in pending.items()],
                    asynchronous=False,
                )
            except KafkaException:
                continue  # the broker is away: commit what we have once it is back
            for p, o in pending.items():
                log.write(f"commit {sent:.6f} {p} {o}")
            pending.clear()
            last_commit = time.monotonic()
    consumer.close()


def dependent(argv: list[str]) -> None:
    from sdk import (
        Gate,
        Hooks,
        HttpSource,
        Options,
        Ordering,
        ParallelConsumer,
        RedisSource,
        stop_on_signals,
    )

    bootstrap, topic, group, log_path, redis_url, gate_url = argv
    log = Log(log_path)
    pid = os.getpid()
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {pid} %(levelname)s %(name)s: %(message)s"
    )
    stacks = open(f"{log_path}.stack-{pid}", "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    rng = random.Random(pid)

    def handle(records: list) -> None:  # type: ignore[type-arg]
        now = time.time()
        for record in records:
            produced = record.timestamp or 0.0
            log.write(f"start {now:.6f} {record.partition} {record.offset} {pid} {produced:.3f}")
        time.sleep(rng.uniform(0.002, 0.01))

    def committed(offsets: dict[tuple[str, int], int]) -> None:
        now = time.time()
        for (_, partition), offset in offsets.items():
            log.write(f"commit {now:.6f} {partition} {offset} {pid}")

    gate = Gate(
        "service-a",
        [RedisSource(redis_url, timeout=1.0), HttpSource(gate_url, timeout=1.0)],
        stale_after=5.0,
    )
    consumer = ParallelConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "auto.offset.reset": "earliest",
        },
        [topic],
        handle,
        Options(
            ordering=Ordering.KEY,
            max_concurrency=8,
            batch_size=10,
            commit_interval=0.2,
            offset_map_store="none",
            hooks=Hooks(on_commit=committed),
        ),
        gate=gate,
        registry=None,
    )
    stop_on_signals(consumer, timeout=10)
    consumer.run()


if __name__ == "__main__":
    {"dependency": dependency, "dependent": dependent}[sys.argv[1]](sys.argv[2:])
