"""The plain loops of the produce benchmark: what a hand-written consume-produce loop on
confluent-kafka does, at least once and exactly once (see ``bench.produce_bench``)."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench._produce_runs import (
    CONSUMER,
    FETCH,
    PLAIN_BATCH,
    PLAIN_COMMIT_EVERY,
    PRODUCER,
    Run,
    Watched,
    Workload,
)


class PlainLoop:
    """A single-threaded confluent-kafka consume-produce loop, run in a thread of its own
    until stopped.

    At least once: consume up to ``PLAIN_BATCH`` records, call the handler and produce an
    output for each, flush (every output acknowledged), then commit the batch's offsets
    (asynchronously: the next batch need not wait). Exactly once: one transactional producer;
    each record is handled and its output produced into the open transaction, and once
    ``PLAIN_COMMIT_EVERY`` has passed since the last commit (looked at after each record, and
    when ``consume`` comes back empty) the consumed offsets are sent to the transaction, which
    commits, and the next one begins; the time of each send + commit is kept."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topic: str,
        output: str,
        workload: Workload,
    ) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.output = output
        self.workload = workload
        self.first = 0.0
        self.commits: list[float] = []
        self.failures: list[str] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="plain-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        if self.error is not None:
            raise self.error
        if self.failures:
            raise SystemExit(f"plain loop: outputs failed: {self.failures[:3]}")

    def _delivered(self, error: KafkaError | None, _: Message) -> None:
        if error is not None:
            self.failures.append(error.str())

    def _main(self) -> None:
        try:
            consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": self.group,
                    "enable.auto.commit": False,
                    **FETCH,
                    **CONSUMER,
                }
            )
            config: dict[str, Any] = {"bootstrap.servers": self.bootstrap, **PRODUCER}
            if self.workload.transactional:
                config["transactional.id"] = f"{self.group}.plain"
            producer = Producer(config)
            try:
                consumer.subscribe([self.topic])
                if self.workload.transactional:
                    self._transactional(consumer, producer)
                else:
                    self._at_least_once(consumer, producer)
            finally:
                consumer.close()
                producer.flush(10)
        except BaseException as exc:
            self.error = exc

    def _at_least_once(self, consumer: Consumer, producer: Producer) -> None:
        work, output, topic = self.workload.work, self.output, self.topic
        produce, delivered = producer.produce, self._delivered
        while not self._stop.is_set():
            batch = consumer.consume(PLAIN_BATCH, 0.1)
            offsets: dict[int, int] = {}
            for message in batch:
                if message.error() is not None:
                    continue
                if not self.first:
                    self.first = time.perf_counter()
                if work is not None:
                    work()
                while True:
                    try:
                        produce(output, message.value(), message.key(), on_delivery=delivered)
                        break
                    except BufferError:
                        producer.poll(0.01)
                offsets[message.partition()] = message.offset() + 1
            if offsets:
                if producer.flush(60):
                    raise SystemExit("plain loop: outputs not acknowledged within 60 s")
                if self.failures:
                    raise SystemExit(f"plain loop: outputs failed: {self.failures[:3]}")
                consumer.commit(
                    offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                    asynchronous=True,
                )

    def _transactional(self, consumer: Consumer, producer: Producer) -> None:
        work, output, topic = self.workload.work, self.output, self.topic
        produce, delivered = producer.produce, self._delivered
        clock = time.monotonic
        producer.init_transactions(30)
        producer.begin_transaction()
        offsets: dict[int, int] = {}
        last = clock()

        def commit() -> None:
            started = time.perf_counter()
            producer.send_offsets_to_transaction(
                [TopicPartition(topic, p, o) for p, o in offsets.items()],
                consumer.consumer_group_metadata(),
                30,
            )
            producer.commit_transaction(30)
            self.commits.append(time.perf_counter() - started)
            if self.failures:
                raise SystemExit(f"plain loop: outputs failed: {self.failures[:3]}")
            offsets.clear()
            producer.begin_transaction()

        while not self._stop.is_set():
            for message in consumer.consume(PLAIN_BATCH, PLAIN_COMMIT_EVERY):
                if message.error() is not None:
                    continue
                if not self.first:
                    self.first = time.perf_counter()
                if work is not None:
                    work()
                while True:
                    try:
                        produce(output, message.value(), message.key(), on_delivery=delivered)
                        break
                    except BufferError:
                        producer.poll(0.01)
                offsets[message.partition()] = message.offset() + 1
                now = clock()
                if now - last >= PLAIN_COMMIT_EVERY:
                    commit()
                    last = now
            now = clock()
            if offsets and now - last >= PLAIN_COMMIT_EVERY:
                commit()
                last = now
        producer.abort_transaction(10)  # (the one begun after the last commit, empty)


def run_plain(bootstrap: str, admin: AdminClient, topic: str, ends: list[int],
              workload: Workload) -> Run:  # fmt: skip
    watched = Watched(bootstrap, admin, topic, ends, workload, "plain")
    loop = PlainLoop(bootstrap, watched.group, topic, watched.output, workload)
    watched.start()
    loop.start()
    try:
        watched.wait()
    finally:
        loop.stop()
    return watched.run(loop.first, commits=loop.commits)
