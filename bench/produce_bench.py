"""Produce flow benchmarks: inputs consumed, one output produced per input, offsets committed.

Every workload reads small records (100 bytes) from 8 partitions with 10,000 random keys and
writes one output per input (same key and value) to a topic of its own; the engine runs
with default ``Options`` except ``commit_mode``, next to a plain single-threaded
confluent-kafka loop doing the same in the same run:

1. At least once, no-op handler: ``ParallelConsumer`` (``CommitMode.CONSUMER``) against a
   loop that consumes a batch, produces its outputs, flushes and then commits the batch's
   offsets. Target: ratio >= 0.5.
2. Exactly once, no-op handler: ``ParallelConsumer`` (``CommitMode.TRANSACTIONAL``) against a
   transactional loop that every 100 ms sends its offsets to the transaction, commits it and
   begins the next. Target: ratio >= 1.0.
3. Exactly once, a 5 ms handler (``time.sleep(0.005)``), the engine at its default
   concurrency against the same transactional loop sleeping 5 ms per record. Target: >= 5x.
4. What a transaction costs: the engine's time in ``send_offsets_to_transaction`` +
   ``commit_transaction`` per transaction (``stats()["outputs"]["transactions"]``) next to the
   plain loop's own measured commits.

Each run is timed end to end: from the consumer's start until the group's committed offsets
reach the end of every input partition and, for the transactional runs, the outputs are
visible to ``read_committed`` readers (the output partitions' last stable offset has reached
their end). Then every output is read back (``read_committed``) and counted: each input must
have an output, and the duplicates are reported. Rounds are interleaved (plain, engine); the
best round of each is the figure judged, the medians are shown too. A tuned row says what it
changed.

Run: ``python -m bench.produce_bench [--broker noida|tansu] [--records N] [--slow-records N]
[--rounds R] [--only consumer|transactional|slow]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich.progress import Progress

from bench._report import console, summary_ms, table, write
from gate._local import BROKERS
from sdk import CommitMode, Options, Output, ParallelConsumer, Record
from sdk._compiled import COMPILED, PURE_REASON

PARTITIONS = 8
KEYS = 10_000
VALUE_BYTES = 100
SLOW_SECONDS = 0.005
PLAIN_COMMIT_EVERY = 0.1
"""The plain transactional loop commits every 100 ms."""
PLAIN_BATCH = 1000
"""Records the plain loops take from ``consume`` at a time."""
CONSUMER = {"session.timeout.ms": 6000, "auto.offset.reset": "earliest"}
FETCH = {"fetch.queue.backoff.ms": 20}
"""What the engine sets for its consumer too (librdkafka's default of 1 s starves a consumer
that drains its queue in bursts); the plain loops get the same."""
PRODUCER = {"enable.idempotence": True}
"""The engine's producer default; the plain loops get the same."""
TIMEOUT = 900.0


@dataclass(frozen=True)
class Workload:
    name: str
    transactional: bool
    work: Callable[[], None] | None
    target: float


def noop() -> None:
    return None


def sleep_5ms() -> None:
    time.sleep(SLOW_SECONDS)


WORKLOADS = {
    "consumer": Workload("at least once, no-op handler", False, None, 0.5),
    "transactional": Workload("exactly once, no-op handler", True, None, 1.0),
    "slow": Workload("exactly once, 5 ms handler", True, sleep_5ms, 5.0),
}


# ---- topics ---------------------------------------------------------------------------------


def create_topic(admin: AdminClient, name: str) -> None:
    for future in admin.create_topics([NewTopic(name, PARTITIONS, 1)]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while name not in admin.list_topics(timeout=10).topics:
        if time.monotonic() > deadline:
            raise SystemExit(f"topic {name} did not appear")
        time.sleep(0.05)


def value_of(i: int) -> bytes:
    """An input's value: its number, padded to ``VALUE_BYTES`` (the output carries it)."""
    return b"%010d" % i + b"." * (VALUE_BYTES - 10)


def produce_inputs(bootstrap: str, admin: AdminClient, records: int) -> tuple[str, list[int]]:
    """A new input topic of ``records`` records spread round-robin over the partitions, with
    random keys; returns it and each partition's end offset (known from what was written: the
    brokers differ in how they report ends)."""
    topic = f"produce-in-{uuid.uuid4().hex[:8]}"
    create_topic(admin, topic)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 2_000_000,
        }
    )
    rng = random.Random(1)
    keys = [f"key-{k}".encode() for k in range(KEYS)]
    failed: list[str] = []

    def delivered(error: KafkaError | None, _: Message) -> None:
        if error is not None:
            failed.append(error.str())

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"producing {records:,} records to {topic}", total=records)
        for i in range(records):
            producer.produce(
                topic,
                key=keys[rng.randrange(KEYS)],
                value=value_of(i),
                partition=i % PARTITIONS,
                on_delivery=delivered,
            )
            if i % 20_000 == 0:
                producer.poll(0)
                progress.update(task, completed=i)
        progress.update(task, completed=records, description="flushing")
        if producer.flush(120) or failed:
            raise SystemExit(f"producing the inputs failed: {failed[:3]}")
    ends = [len(range(p, records, PARTITIONS)) for p in range(PARTITIONS)]
    return topic, ends


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
    commits: list[float] = field(default_factory=list)  # plain transactional loop: seconds each
    stats: dict[str, Any] = field(default_factory=dict)  # the engine's outputs stats

    @property
    def rate(self) -> float:
        return self.records / self.seconds


# ---- the plain loops -------------------------------------------------------------------------


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
    output = f"produce-out-{uuid.uuid4().hex[:8]}"
    create_topic(admin, output)
    group = f"plain-{uuid.uuid4().hex[:8]}"
    loop = PlainLoop(bootstrap, group, topic, output, workload)
    finish = Finish(bootstrap, group, topic, ends, output, workload.transactional)
    started = time.perf_counter()
    loop.start()
    try:
        ended = finish.wait(started)
    finally:
        loop.stop()
    records = sum(ends)
    return Run(
        seconds=ended - started,
        first_record=loop.first - started,
        records=records,
        outputs=read_outputs(bootstrap, output, records),
        commits=loop.commits,
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
    output = f"produce-out-{uuid.uuid4().hex[:8]}"
    create_topic(admin, output)
    group = f"engine-{uuid.uuid4().hex[:8]}"
    handler = Handler(output, workload.work)
    # client.id only names the producer's transactional.id (the group's name and it).
    config = {"bootstrap.servers": bootstrap, "group.id": group, "client.id": "bench", **CONSUMER}
    finish = Finish(bootstrap, group, topic, ends, output, workload.transactional)
    started = time.perf_counter()
    consumer = ParallelConsumer(config, [topic], handler, options, registry=None)
    consumer.start()
    try:
        ended = finish.wait(started)
        over = time.time()
        deadline = time.monotonic() + 5
        while consumer.stats().get("at", 0) <= over and time.monotonic() < deadline:
            time.sleep(0.01)  # a snapshot taken after the end (one about every half second)
        stats = consumer.stats()
    finally:
        consumer.stop(timeout=10)
    records = sum(ends)
    return Run(
        seconds=ended - started,
        first_record=handler.first - started,
        records=records,
        outputs=read_outputs(bootstrap, output, records),
        stats=stats.get("outputs", {}),
    )


# ---- a workload -------------------------------------------------------------------------------


def measure(
    bootstrap: str, admin: AdminClient, key: str, records: int, rounds: int
) -> dict[str, Any]:
    workload = WORKLOADS[key]
    topic, ends = produce_inputs(bootstrap, admin, records)
    mode = CommitMode.TRANSACTIONAL if workload.transactional else CommitMode.CONSUMER
    options = Options(commit_mode=mode)
    variants: dict[str, Callable[[], Run]] = {
        "plain loop": lambda: run_plain(bootstrap, admin, topic, ends, workload),
        "engine": lambda: run_engine(bootstrap, admin, topic, ends, workload, options),
    }
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    for round_ in range(rounds):
        order = list(variants) if round_ % 2 == 0 else list(variants)[::-1]
        for name in order:
            console.print(f"[dim]{workload.name}: {name}, round {round_ + 1} of {rounds}")
            run = variants[name]()
            runs[name].append(run)
            console.print(
                f"[dim]  {run.seconds:.2f} s ({run.rate:,.0f} records/s), first record at "
                f"{run.first_record:.2f} s, outputs {run.outputs}"
            )
    best = {name: max(found, key=lambda r: r.rate) for name, found in runs.items()}
    median = {name: statistics.median(r.rate for r in found) for name, found in runs.items()}
    ratio = best["engine"].rate / best["plain loop"].rate
    median_ratio = median["engine"] / median["plain loop"]
    rows = []
    for name, run in best.items():
        rows.append(
            [
                name,
                run.records,
                round(run.seconds, 3),
                round(run.first_record, 3),
                round(run.rate),
                round(run.rate / best["plain loop"].rate, 3),
                round(median[name] / median["plain loop"], 3),
                run.outputs["outputs"],
                run.outputs["missing"],
                run.outputs["duplicates"],
            ]
        )
    table(
        f"{workload.name}: {records:,} records, {PARTITIONS} partitions, {KEYS:,} keys, "
        f"best of {rounds}; engine ({'compiled' if COMPILED else 'pure'} core): default "
        f"options but commit_mode={mode.value}",
        ["consumer", "inputs", "seconds", "first record s", "records/s", "x plain",
         "medians: x plain", "outputs", "missing", "duplicates"],
        rows,
    )  # fmt: skip
    result: dict[str, Any] = {
        "workload": workload.name,
        "records": records,
        "rounds": rounds,
        "target": workload.target,
        "ratio": round(ratio, 3),
        "median_ratio": round(median_ratio, 3),
        "runs": {
            name: [
                {
                    "seconds": round(r.seconds, 3),
                    "first_record_seconds": round(r.first_record, 3),
                    "records_per_second": round(r.rate),
                    "outputs": r.outputs,
                    "engine_outputs_stats": r.stats or None,
                    "plain_commits": summary_ms(r.commits) if r.commits else None,
                }
                for r in found
            ]
            for name, found in runs.items()
        },
    }
    if workload.transactional:
        result["transactions"] = transaction_costs(best)
    return result


def transaction_costs(best: dict[str, Run]) -> dict[str, Any]:
    """The time a transaction's close took (send offsets + commit), engine and plain loop."""
    engine, plain = best["engine"], best["plain loop"]
    txn = engine.stats.get("transactions", {})
    committed = txn.get("committed", 0)
    plain_ms = summary_ms(plain.commits) if plain.commits else {}
    return {
        "engine": {
            "transactions": committed,
            "aborted": txn.get("aborted", 0),
            "ms_per_transaction": round(txn.get("seconds", 0.0) / committed * 1000, 3)
            if committed
            else None,
            "outputs_per_transaction": round(txn.get("outputs_committed", 0) / committed)
            if committed
            else None,
            "share_of_run": round(txn.get("seconds", 0.0) / engine.seconds, 3),
        },
        "plain loop": {
            "transactions": len(plain.commits),
            "ms_per_transaction": plain_ms.get("mean_ms"),
            "p50_ms": plain_ms.get("p50_ms"),
            "p99_ms": plain_ms.get("p99_ms"),
            "outputs_per_transaction": round(plain.records / len(plain.commits))
            if plain.commits
            else None,
            "share_of_run": round(sum(plain.commits) / plain.seconds, 3),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", choices=sorted(BROKERS), default="noida")
    parser.add_argument(
        "--records", type=int, default=200_000, help="inputs of the no-op workloads"
    )
    parser.add_argument(
        "--slow-records", type=int, default=5_000, help="inputs of the 5 ms workload"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=sorted(WORKLOADS))
    args = parser.parse_args()
    results: dict[str, Any] = {
        "broker": args.broker,
        "args": vars(args),
        "core": "compiled" if COMPILED else f"pure ({PURE_REASON})",
    }
    if not COMPILED:
        console.print(f"[yellow]the engine's core is not compiled ({PURE_REASON}): pure figures")
    verdict: list[tuple[str, bool]] = []
    with BROKERS[args.broker]() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for key, workload in WORKLOADS.items():
            if args.only not in (None, key):
                continue
            records = args.slow_records if key == "slow" else args.records
            found = results[key] = measure(broker.bootstrap, admin, key, records, args.rounds)
            verdict.append(
                (
                    f"{workload.name}: engine >= {workload.target:g} x plain "
                    f"(best rounds {found['ratio']}, medians {found['median_ratio']})",
                    found["ratio"] >= workload.target,
                )
            )
            complete = all(
                run["outputs"]["missing"] == 0 for runs in found["runs"].values() for run in runs
            )
            verdict.append((f"{workload.name}: every input has an output", complete))
        del admin  # a client left alive would keep trying to reach the stopped broker
    costs = {
        key: results[key]["transactions"]
        for key in WORKLOADS
        if "transactions" in results.get(key, {})
    }
    if costs:
        table(
            "What closing a transaction costs (send offsets + commit), best rounds",
            ["workload", "consumer", "transactions", "ms each", "outputs each", "share of run"],
            [
                [WORKLOADS[key].name, name, c["transactions"], c["ms_per_transaction"],
                 c["outputs_per_transaction"], c["share_of_run"]]
                for key, both in costs.items()
                for name, c in both.items()
            ],
        )  # fmt: skip
    name = "produce" if not args.only else f"produce-{args.only}"
    write(f"{name}-{args.broker}", results)
    table("Targets", ["target", "met"], [[name, "yes" if ok else "NO"] for name, ok in verdict])


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
