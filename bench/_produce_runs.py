"""The runs of the produce benchmark: input topics, the plain loops, the engine, how a run is
timed, what it cost in CPU, and the read-back of its outputs (see ``bench.produce_bench``)."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from bench._proc import thread_cpu, thread_name
from bench._topics import CONSUMER, create_topic, fill
from sdk import Options, Output, ParallelConsumer, Record
from sdk.consumer._config import FETCH_DEFAULTS

PARTITIONS = 12
KEYS = 10_000
VALUE_BYTES = 100
SLOW_SECONDS = 0.005
PLAIN_COMMIT_EVERY = 0.1
"""The plain transactional loop commits every 100 ms."""
PLAIN_BATCH = 1000
"""Records the plain loops take from ``consume`` at a time."""
FETCH = FETCH_DEFAULTS
"""The consumer settings the engine sets unless told otherwise (``sdk.consumer._config``);
the plain loops get the same."""
PRODUCER = {"enable.idempotence": True}
"""The engine's producer default; the plain loops get the same."""
TIMEOUT = 900.0


@dataclass(frozen=True)
class Workload:
    name: str
    transactional: bool
    work: Callable[[], None] | None
    target: float  # the engine's rate over the plain loop's (and, slow, over Quix Streams')
    cpu_target: float | None = None  # the engine's CPU per record over the plain loop's, at most


def sleep_5ms() -> None:
    time.sleep(SLOW_SECONDS)


# ---- topics ---------------------------------------------------------------------------------


def new_topic(admin: AdminClient, prefix: str) -> str:
    """A new topic of ``PARTITIONS`` partitions, once the broker lists it."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(admin, name, PARTITIONS, appear=True)
    return name


def value_of(i: int) -> bytes:
    """An input's value: its number, padded to ``VALUE_BYTES`` (the output carries it)."""
    return b"%010d" % i + b"." * (VALUE_BYTES - 10)


def produce_inputs(bootstrap: str, admin: AdminClient, records: int) -> tuple[str, list[int]]:
    """A new input topic of ``records`` records spread round-robin over the partitions, with
    random keys; returns it and each partition's end offset (known from what was written: the
    brokers differ in how they report ends)."""
    topic = new_topic(admin, "produce-in")
    rng = random.Random(1)
    keys = [f"key-{k}".encode() for k in range(KEYS)]
    fill(bootstrap, topic, records, lambda i: keys[rng.randrange(KEYS)], PARTITIONS, value_of)
    ends = [len(range(p, records, PARTITIONS)) for p in range(PARTITIONS)]
    return topic, ends


# ---- CPU ------------------------------------------------------------------------------------


class Cpu:
    """The CPU time of the threads a consumer under test starts in this process: those that
    were not there when it was created (the benchmark's own threads, and the clients watching
    the run, were); ``client_seconds``: librdkafka's threads among them (its fetching,
    producing and protocol work, whatever the consumer on top)."""

    def __init__(self) -> None:
        self.before = set(thread_cpu())
        self.seconds = 0.0
        self.client_seconds = 0.0

    def stop(self) -> float:
        found = {tid: cpu for tid, cpu in thread_cpu().items() if tid not in self.before}
        self.seconds = sum(found.values())
        self.client_seconds = sum(
            cpu for tid, cpu in found.items() if thread_name(tid).startswith("rdk:")
        )
        return self.seconds


# ---- end to end -----------------------------------------------------------------------------


class Finish:
    """Watches a run from another thread: when the group's committed offsets reach the end of
    every input partition and, for a transactional run, every output partition's last stable
    offset (a ``read_committed`` consumer's end) has reached its end (no transaction of the
    run is open there any longer). Committed offsets are asked for every 20 ms (one request);
    the output partitions only once the offsets are there."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topic: str,
        ends: list[int],
        output: str,
        transactional: bool,
    ) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self.ends = ends
        self.output = output
        self.transactional = transactional
        self.committed_at = 0.0
        self.visible_at = 0.0

    def wait(self, started: float, timeout: float = TIMEOUT) -> float:
        """Blocks until the run is over; returns when (``time.perf_counter``)."""
        reader = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group, **CONSUMER})
        try:
            deadline = started + timeout
            while True:
                found = reader.committed(self.tps, timeout=10)
                if all(tp.offset >= end for tp, end in zip(found, self.ends, strict=True)):
                    self.committed_at = time.perf_counter()
                    break
                if time.perf_counter() > deadline:
                    offsets = [tp.offset for tp in found]
                    raise SystemExit(f"{self.group}: committed {offsets} of {self.ends}")
                time.sleep(0.02)
        finally:
            reader.close()
        self.visible_at = self.committed_at
        if self.transactional:
            while not self.outputs_settled():
                if time.perf_counter() > deadline:
                    raise SystemExit(f"{self.output}: a transaction stays open")
                time.sleep(0.005)
            self.visible_at = time.perf_counter()
        return self.visible_at

    def outputs_settled(self) -> bool:
        """Every output partition's last stable offset is its end (``read_committed`` and
        ``read_uncommitted`` consumers see the same end)."""
        ends = {}
        for isolation in ("read_committed", "read_uncommitted"):
            probe = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": f"probe-{self.group}",
                    "isolation.level": isolation,
                }
            )
            try:
                ends[isolation] = [
                    probe.get_watermark_offsets(
                        TopicPartition(self.output, p), timeout=10, cached=False
                    )[1]
                    for p in range(PARTITIONS)
                ]
            finally:
                probe.close()
        return ends["read_committed"] == ends["read_uncommitted"]


def read_outputs(bootstrap: str, topic: str, expected: int) -> dict[str, int]:
    """Reads the output topic to its end as a ``read_committed`` consumer: how many outputs,
    how many distinct inputs they stand for, how many inputs have none."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "receive.message.max.bytes": 1_000_000_000,  # noida answers with a whole partition
            **CONSUMER,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen: set[bytes] = set()
    total = 0
    at_end: set[int] = set()
    deadline = time.monotonic() + 120
    try:
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 1.0):
                error = message.error()
                if error is None:
                    total += 1
                    seen.add(message.value()[:10])
                    at_end.discard(message.partition())
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
    finally:
        consumer.close()
    return {
        "outputs": total,
        "inputs_with_output": len(seen),
        "missing": expected - len(seen),
        "duplicates": total - len(seen),
    }


@dataclass
class Run:
    """One timed run of one consumer."""

    seconds: float
    first_record: float  # seconds from the start until the first record was handled
    records: int
    outputs: dict[str, int]
    cpu: float = 0.0  # CPU seconds of the consumer under test during the run
    client_cpu: float | None = None  # of which librdkafka's threads (None: not measured)
    commits: list[float] = field(default_factory=list)  # plain transactional loop: seconds each
    stats: dict[str, Any] = field(default_factory=dict)  # the engine's outputs stats

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def cpu_us(self) -> float:
        """CPU microseconds per record."""
        return self.cpu / self.records * 1e6

    @property
    def client_cpu_us(self) -> float | None:
        """CPU microseconds per record in librdkafka's threads."""
        return None if self.client_cpu is None else self.client_cpu / self.records * 1e6


class Watched:
    """One run of a consumer under test: its output topic and group (new), started with
    :meth:`start`, over once :meth:`wait` returns, told as a :class:`Run` by :meth:`run`
    (its outputs read back)."""

    def __init__(
        self, bootstrap: str, admin: AdminClient, topic: str, ends: list[int], workload: Workload,
        name: str,
    ) -> None:  # fmt: skip
        self.bootstrap, self.ends = bootstrap, ends
        self.output = new_topic(admin, "produce-out")
        self.group = f"{name}-{uuid.uuid4().hex[:8]}"
        self.finish = Finish(
            bootstrap, self.group, topic, ends, self.output, workload.transactional
        )
        self.started = self.ended = 0.0
        self.cpu: Cpu | None = None

    def start(self, cpu: bool = True) -> None:
        """The run starts; with ``cpu``, the CPU of the threads this process starts from now
        on counts as the consumer's."""
        self.cpu = Cpu() if cpu else None
        self.started = time.perf_counter()

    def wait(self) -> None:
        """Blocks until the run is over."""
        self.ended = self.finish.wait(self.started)
        if self.cpu is not None:
            self.cpu.stop()

    def run(self, first: float, **figures: Any) -> Run:
        """The run, its first record handled at ``first`` (``time.perf_counter``)."""
        records = sum(self.ends)
        return Run(
            seconds=self.ended - self.started,
            first_record=first - self.started,
            records=records,
            outputs=read_outputs(self.bootstrap, self.output, records),
            **(
                {"cpu": self.cpu.seconds, "client_cpu": self.cpu.client_seconds}
                if self.cpu is not None
                else {}
            ),
            **figures,
        )


# ---- the engine ------------------------------------------------------------------------------


class Handler:
    """One output per input, after the workload's work; notes when the first record came."""

    def __init__(self, output: str, work: Callable[[], None] | None) -> None:
        self.output = output
        self.work = work
        self.first = 0.0

    def __call__(self, record: Record) -> Output:
        if not self.first:
            self.first = time.perf_counter()
        if self.work is not None:
            self.work()
        return Output(self.output, record.value, record.key)


def run_engine(
    bootstrap: str,
    admin: AdminClient,
    topic: str,
    ends: list[int],
    workload: Workload,
    options: Options,
) -> Run:
    watched = Watched(bootstrap, admin, topic, ends, workload, "engine")
    handler = Handler(watched.output, workload.work)
    # client.id only names the producer's transactional.id (the group's name and it).
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": watched.group,
        "client.id": "bench",
        **CONSUMER,
    }
    watched.start()
    consumer = ParallelConsumer(config, [topic], handler, options, registry=None)
    consumer.start()
    try:
        watched.wait()
        over = time.time()
        deadline = time.monotonic() + 5
        while consumer.stats().get("at", 0) <= over and time.monotonic() < deadline:
            time.sleep(0.01)  # a snapshot taken after the end (one about every half second)
        stats = consumer.stats()
    finally:
        consumer.stop(timeout=10)
    return watched.run(handler.first, stats=stats.get("outputs", {}))
