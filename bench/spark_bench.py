"""Spark source read-speed benchmark, on noida-db.

One topic of ``--records`` records of 100 bytes in 4 partitions, read in interleaved rounds by:

- **plain loop**: a single-process confluent-kafka consumer loop over the topic (the baseline);
- **ceiling**: a Python data source yielding prebuilt Arrow batches, no Kafka (what Spark can
  take from a Python source here), in one batch and in 4 micro-batches (Spark's own cost of a
  batch);
- **gating off, one batch**: the ``gated-kafka`` source with ``gate.enabled`` false;
- **gating off, 4 micro-batches**: the same with ``maxOffsetsPerTrigger`` a quarter of the
  topic, as a backlog (or a live query behind) is read;
- **gated, one batch**: the ``gated-kafka`` source gated on a dependency group committed past
  the end (embedded ``gate.dependsOn``);

the Spark ones into the ``noop`` sink with ``Trigger.AvailableNow``, in ``local[2]`` and
(``--cluster``, on by default) ``local-cluster[2,1,1024]``, one session per master started
once. Then, in each session, a **live query of small batches**: ``--live-seconds`` of a query
with a 1 s trigger on a second topic written at ``--live-rate`` records a second (gating off,
``noop`` sink), about 50 records a batch.

Reports rows/s over the batches' ``addBatch`` time as Spark reports it (the batch's job:
reading, and the sink), best and median over the rounds, ratios against the plain loop and
the ceiling, the time per batch (``addBatch``; the source's planning, ``latestOffset`` +
``getBatch``; Spark's offset and commit logs, ``walCommit`` + ``commitOffsets``), gated /
gating off, the CPU the Spark Python processes spent per row, and a microbenchmark of
building Arrow batches. Targets: one batch >= 1.0 of the plain loop, 4 micro-batches >= 0.9,
a live batch's ``addBatch`` <= 200 ms at the median, gated / gating off >= 0.9, Python CPU per
row <= 2 us.

Run: ``python -m bench.spark_bench [--quick] [--records N] [--no-cluster]``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from argparse import BooleanOptionalAction
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition

from bench._options import parser
from bench._proc import cpu_seconds, stat_fields
from bench._report import console, table, write
from bench._rounds import interleaved, timed
from bench._spark_report import (
    CEILING_MICRO_BATCHES,
    GATED,
    MICRO_BATCHES,
    ONE_BATCH,
    TRIGGER_MS,
    report,
    report_live,
)
from bench._spark_session import PARTITIONS, session
from bench._topics import VALUE, WHOLE_FETCH, Writing, create_topic, fill, group_far_ahead, unique
from demo._local import LocalNoida

# Spark's progress durations of a batch: the source's planning, the batch's job, Spark's logs.
PLANNING = ("latestOffset", "getBatch")
SPARK_LOGS = ("walCommit", "commitOffsets")


# ---- the readers -------------------------------------------------------------------------


def plain_loop(bootstrap: str, topic: str, records: int) -> dict[str, float]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "plain-loop",
            "enable.auto.commit": False,
            **WHOLE_FETCH,  # as the source's readers
        }
    )
    started, cpu = time.perf_counter(), time.process_time()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    rows = 0
    while rows < records:
        rows += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    consumer.close()
    return {
        "rows": rows,
        "rows_per_second": rows / wall,
        "wall_seconds": wall,
        "python_cpu_us_per_row": cpu / rows * 1e6,
    }


def python_cpu_seconds() -> float:
    """CPU time of the Spark Python processes this benchmark started (workers, daemons, the
    source's planner; their exited children included), read from /proc."""
    parents: dict[int, int] = {}
    spark_python: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int(stat_fields(entry.name)[1])
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parents[int(entry.name)] = parent
        if b"python" in Path(command[0].decode()).name.encode() and any(
            b"pyspark" in part for part in command[1:]
        ):
            spark_python.append(int(entry.name))
    total = 0.0
    for pid in spark_python:
        ancestor = pid
        while ancestor > 1 and ancestor != os.getpid():
            ancestor = parents.get(ancestor, 0)
        if ancestor == os.getpid():
            try:
                total += cpu_seconds(pid, children=True)
            except OSError:
                continue  # (it ended meanwhile)
    return total


def spark_run(spark: Any, source: str, options: dict[str, str], records: int) -> dict[str, Any]:
    """One query; started again (up to three times) when Spark could not start its Python
    planner in time, which happens on a loaded machine."""
    for attempt in range(3):
        try:
            return spark_query(spark, source, options, records)
        except Exception as exc:  # pyspark wraps the JVM error
            if "failed to connect back" not in str(exc) or attempt == 2:
                raise
            console.print(f"[yellow]{source}: Python worker did not start in time; again[/]")
    raise AssertionError("unreachable")


def spark_query(spark: Any, source: str, options: dict[str, str], records: int) -> dict[str, Any]:
    stream = spark.readStream.format(source)
    for key, value in options.items():
        stream = stream.option(key, value)
    cpu = python_cpu_seconds()
    started = time.perf_counter()
    query = (
        stream.load()
        .writeStream.format("noop")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="spark-bench-"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    wall = time.perf_counter() - started
    cpu = python_cpu_seconds() - cpu
    batches = [p for p in query.recentProgress if p.numInputRows > 0]
    rows = sum(p.numInputRows for p in batches)
    if rows != records:
        raise SystemExit(f"{source} {options}: read {rows} rows of {records}")
    return {
        "rows": rows,
        "rows_per_second": rows / (sum(batch_ms(batches, ("addBatch",))) / 1000),
        "wall_seconds": wall,
        "python_cpu_us_per_row": cpu / rows * 1e6,
        **per_batch(batches),
    }


def batch_ms(batches: list[Any], names: tuple[str, ...]) -> list[int]:
    """Per batch, the sum of Spark's progress durations ``names`` (ms)."""
    return [sum(p.durationMs.get(name, 0) for name in names) for p in batches]


def per_batch(batches: list[Any]) -> dict[str, Any]:
    """The batches' durations (ms): the batch's job, the source's planning, Spark's logs,
    the whole trigger."""
    return {
        "batches": len(batches),
        "batch_rows": [p.numInputRows for p in batches],
        "add_batch_ms": batch_ms(batches, ("addBatch",)),
        "planning_ms": batch_ms(batches, PLANNING),
        "spark_logs_ms": batch_ms(batches, SPARK_LOGS),
        "trigger_ms": batch_ms(batches, ("triggerExecution",)),
    }


def live_query(spark: Any, bootstrap: str, rate: float, seconds: float) -> dict[str, Any]:
    """A query with a 1 s trigger on a new topic written at ``rate`` records a second, for
    ``seconds``: its batches' durations, the first two (the query starting) left out."""
    topic = unique("spark-live")
    create_topic(bootstrap, topic, PARTITIONS)
    with Writing(bootstrap, topic, 1 / rate, lambda i: [(VALUE, None)]):
        query = (
            spark.readStream.format("gated-kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("gate.enabled", "false")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", tempfile.mkdtemp(prefix="spark-bench-live-"))
            .trigger(processingTime=f"{TRIGGER_MS} milliseconds")
            .start()
        )
        time.sleep(seconds)
        query.stop()
    batches = [p for p in query.recentProgress if p.numInputRows > 0][2:]
    if not batches:
        raise SystemExit("the live query read no batch")
    return per_batch(batches)


# ---- Arrow batches: column-wise against the former row-by-row building ---------------------


def row_by_row(messages: list[Any], topic: str, partition: int) -> pa.RecordBatch:
    from sdk.spark._read import _ARROW, _TIMESTAMP

    stamps = [message.timestamp() for message in messages]
    columns = [
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.array([topic] * len(messages), pa.string()),
        pa.array([partition] * len(messages), pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64()),
        pa.array([stamp * 1000 if kind else None for kind, stamp in stamps], _TIMESTAMP),
        pa.array([kind - 1 if kind else -1 for kind, _ in stamps], pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_ARROW)


def arrow_micro(bootstrap: str, topic: str, repeats: int) -> dict[str, dict[str, float]]:
    from sdk.spark._plan import OffsetRange
    from sdk.spark._read import record_batch

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "arrow-micro"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    messages: list[Any] = []
    while len(messages) < 10_000:
        messages += consumer.consume(10_000 - len(messages), 1.0)
    consumer.close()
    task = OffsetRange(topic, 0, 0, 10_000)
    if not record_batch(messages, task, False).equals(row_by_row(messages, topic, 0)):
        raise SystemExit("column-wise and row-by-row Arrow batches differ")
    times = interleaved(
        {
            "row by row (before)": lambda: timed(lambda: row_by_row(messages, topic, 0))[1],
            "column-wise (now)": lambda: timed(lambda: record_batch(messages, task, False))[1],
        },
        repeats,
    )
    times = {name: [s / len(messages) * 1e6 for s in seconds] for name, seconds in times.items()}
    return {
        name: {"best_us": min(us), "median_us": statistics.median(us)} for name, us in times.items()
    }


# ---- the run -----------------------------------------------------------------------------


def main() -> None:
    options = parser(__doc__)
    options.add_argument("--quick", action="store_true", help="200,000 records, 2 rounds")
    options.add_argument("--records", type=int, help="records to read (default 1,000,000)")
    options.add_argument("--rounds", type=int, help="interleaved rounds (default 4)")
    options.add_argument("--cluster", action=BooleanOptionalAction, default=True)
    options.add_argument("--live-seconds", type=float, help="the live query (default 40 s)")
    options.add_argument("--live-rate", type=float, default=50.0, help="records a second")
    args = options.parse_args()
    records = args.records or (200_000 if args.quick else 1_000_000)
    records -= records % PARTITIONS
    rounds = args.rounds or (2 if args.quick else 4)
    live_seconds = args.live_seconds or (25.0 if args.quick else 40.0)
    masters = ["local[2]"] + (["local-cluster[2,1,1024]"] if args.cluster else [])
    results: dict[str, Any] = {"records": records, "partitions": PARTITIONS, "rounds": rounds}
    with LocalNoida() as broker:
        bootstrap = broker.bootstrap
        topic = unique("spark")
        create_topic(bootstrap, topic, PARTITIONS)
        fill(bootstrap, topic, records, lambda i: None, PARTITIONS)
        dependency, _ = group_far_ahead(bootstrap, topic, PARTITIONS)
        results["arrow_batch_us_per_record"] = arrow_micro(bootstrap, topic, 20)
        table(
            "Building one Arrow batch of 10,000 records (µs per record)",
            ["code", "best", "median"],
            [
                [n, r["best_us"], r["median_us"]]
                for n, r in results["arrow_batch_us_per_record"].items()
            ],
        )
        kafka = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic}
        off = {**kafka, "gate.enabled": "false"}
        quarter = {"maxOffsetsPerTrigger": str(records // 4)}
        spark_readers = {
            "ceiling (prebuilt Arrow)": ("prebuilt-arrow", {"records": str(records)}),
            CEILING_MICRO_BATCHES: ("prebuilt-arrow", {"records": str(records), **quarter}),
            ONE_BATCH: ("gated-kafka", off),
            MICRO_BATCHES: ("gated-kafka", {**off, **quarter}),
            GATED: (
                "gated-kafka",
                {**kafka, "gate.name": "bench", "gate.dependsOn": dependency},
            ),
        }
        for master in masters:
            started = time.perf_counter()
            spark = session(master)
            console.print(f"{master}: session started in {time.perf_counter() - started:.1f}s")
            try:
                for source, read in spark_readers.values():  # warm up the Python workers
                    spark_run(spark, source, read, records)
                readers = {"plain loop": lambda: plain_loop(bootstrap, topic, records)}
                readers.update(
                    {name: lambda s=source, r=read, on=spark: spark_run(on, s, r, records)
                     for name, (source, read) in spark_readers.items()}
                )  # fmt: skip
                runs = interleaved(readers, rounds)
                live = live_query(spark, bootstrap, args.live_rate, live_seconds)
            finally:
                spark.stop()
            results[master] = report(master, runs)
            results[master]["live"] = report_live(master, args.live_rate, live)
    write("spark_bench", results)


if __name__ == "__main__":
    main()
