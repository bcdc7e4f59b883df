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

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from bench._report import console, percentile, table, write
from bench.engine_bench import create_topic, group_far_ahead, produce
from gate._local import LocalNoida

PARTITIONS = 4
VALUE = b"x" * 100
ROOT = Path(__file__).resolve().parent.parent
TRIGGER_MS = 1000  # the live query's trigger
# Spark's progress durations of a batch: the source's planning, the batch's job, Spark's logs.
PLANNING = ("latestOffset", "getBatch")
SPARK_LOGS = ("walCommit", "commitOffsets")


# ---- the ceiling: a Python source yielding prebuilt Arrow batches -------------------------


class PrebuiltStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``records`` rows in ``PARTITIONS`` tasks a batch, each yielding one prebuilt batch
    repeatedly; at most ``most`` rows a batch when given (maxOffsetsPerTrigger)."""

    def __init__(self, records: int, most: int | None = None) -> None:
        self.records = records
        self.most = most

    def initialOffset(self) -> dict[str, int]:
        return {"rows": 0}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        if isinstance(limit, ReadMaxRows):
            return {"rows": min(self.records, start["rows"] + limit.max_rows)}
        return {"rows": self.records}

    def getDefaultReadLimit(self) -> Any:
        return ReadAllAvailable() if self.most is None else ReadMaxRows(self.most)

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        count = end["rows"] - start["rows"]
        return [
            InputPartition(count // PARTITIONS + (1 if i < count % PARTITIONS else 0))
            for i in range(PARTITIONS)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from sdk.spark._read import _ARROW

        size = 10_000
        batch = pa.RecordBatch.from_arrays(
            [
                pa.nulls(size, pa.binary()),
                pa.array([VALUE] * size, pa.binary()),
                pa.repeat(pa.scalar("t"), size),
                pa.repeat(pa.scalar(0, pa.int32()), size),
                pa.array(range(size), pa.int64()),
                pa.array([time.time_ns() // 1000] * size, pa.int64()).cast(_ARROW.field(5).type),
                pa.repeat(pa.scalar(0, pa.int32()), size),
            ],
            schema=_ARROW,
        )
        left = partition.value
        while left > 0:
            yield batch if left >= size else batch.slice(0, left)
            left -= size

    def commit(self, end: dict[str, int]) -> None:
        pass


class PrebuiltSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "prebuilt-arrow"

    def schema(self) -> str:
        from sdk.spark._source import SCHEMA

        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        most = self.options.get("maxOffsetsPerTrigger")
        return PrebuiltStreamReader(
            int(self.options["records"]), None if most is None else int(most)
        )


# ---- the readers -------------------------------------------------------------------------


def plain_loop(bootstrap: str, topic: str, records: int) -> dict[str, float]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "plain-loop",
            "enable.auto.commit": False,
            # as the source's readers: noida-db answers a fetch with all it holds from the
            # offset asked, beyond fetch.max.bytes (see tests/sdk/test_spark_read.py)
            "receive.message.max.bytes": 2_147_483_647,
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
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        if b"python" in Path(command[0].decode()).name.encode() and any(
            b"pyspark" in part for part in command[1:]
        ):
            stats[int(entry.name)] = fields
    total = 0.0
    for pid, fields in stats.items():
        ancestor = pid
        while ancestor > 1 and ancestor != os.getpid():
            ancestor = parents.get(ancestor, 0)
        if ancestor == os.getpid():
            total += sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
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
    topic = f"spark-live-{random.randrange(10**9)}"
    create_topic(AdminClient({"bootstrap.servers": bootstrap}), topic, PARTITIONS)
    stop = threading.Event()

    def write() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        while not stop.wait(1 / rate):
            producer.produce(topic, VALUE)
            producer.poll(0)
        producer.flush(10)

    writer = threading.Thread(target=write, name="live-writer")
    writer.start()
    try:
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
    finally:
        stop.set()
        writer.join(30)
    batches = [p for p in query.recentProgress if p.numInputRows > 0][2:]
    if not batches:
        raise SystemExit("the live query read no batch")
    return per_batch(batches)


def session(master: str) -> Any:
    """A SparkSession on ``master`` with both sources registered; executors run this
    interpreter with this checkout importable."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    from sdk.spark import GatedKafkaSource

    path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = path
    conf = (
        SparkConf()
        .setMaster(master)
        .setAppName("gated-kafka-read-bench")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.pyspark.python", sys.executable)
        .set("spark.executorEnv.PYTHONPATH", path)
        .set("spark.driver.extraJavaOptions", "-Xss32m")
        # On a loaded machine a new Python worker may take longer than the default 15 s.
        .set("spark.python.authenticate.socketTimeout", "120s")
    )
    for name in ("KAFKA_GATE_PURE_CORE",):
        if name in os.environ:
            conf = conf.set(f"spark.executorEnv.{name}", os.environ[name])
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(GatedKafkaSource)
    spark.dataSource.register(PrebuiltSource)
    return spark


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
    times: dict[str, list[float]] = {"row by row (before)": [], "column-wise (now)": []}
    for _ in range(repeats):
        for name, build in (
            ("row by row (before)", lambda: row_by_row(messages, topic, 0)),
            ("column-wise (now)", lambda: record_batch(messages, task, False)),
        ):
            started = time.perf_counter()
            build()
            times[name].append((time.perf_counter() - started) / len(messages) * 1e6)
    return {
        name: {"best_us": min(us), "median_us": statistics.median(us)} for name, us in times.items()
    }


# ---- the run -----------------------------------------------------------------------------


def summary(results: list[dict[str, Any]]) -> dict[str, float]:
    rates = [r["rows_per_second"] for r in results]
    walls = [r["wall_seconds"] for r in results]
    cpu = [r["python_cpu_us_per_row"] for r in results if "python_cpu_us_per_row" in r]
    found = {
        "best": max(rates),
        "median": statistics.median(rates),
        "wall_median": statistics.median(walls),
        "cpu_us_per_row": statistics.median(cpu) if cpu else float("nan"),
    }
    for name in ("add_batch_ms", "planning_ms", "spark_logs_ms", "trigger_ms"):
        if name in results[0]:
            found[name] = statistics.median(ms for r in results for ms in r[name])
    if "batches" in results[0]:
        found["batches"] = statistics.median(r["batches"] for r in results)
    return found


def report(master: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    sums = {name: summary(results) for name, results in runs.items()}
    loop, ceiling = sums["plain loop"]["median"], sums["ceiling (prebuilt Arrow)"]["median"]
    table(
        f"{master}: rows/s (Spark's over addBatch) over {len(runs['plain loop'])} interleaved "
        "rounds",
        ["reader", "best", "median", "vs loop", "vs ceiling", "median wall s", "py µs/row"],
        [
            [
                name,
                s["best"],
                s["median"],
                s["median"] / loop,
                s["median"] / ceiling,
                s["wall_median"],
                s["cpu_us_per_row"],
            ]
            for name, s in sums.items()
        ],
    )
    table(
        f"{master}: time per batch (ms, median over the rounds' batches)",
        ["reader", "batches", "addBatch", "source planning", "Spark's logs", "whole batch"],
        [
            [
                name,
                round(s["batches"]),
                s["add_batch_ms"],
                s["planning_ms"],
                s["spark_logs_ms"],
                s["trigger_ms"],
            ]
            for name, s in sums.items()
            if "batches" in s
        ],
    )
    # Spark's own Python processes (planner, workers, their imports) cost the ceiling's CPU
    # too: what a Kafka reader spends above it is the reading, to set beside the plain loop.
    spark_python = sums["ceiling (prebuilt Arrow)"]["cpu_us_per_row"]
    for name in (ONE_BATCH, GATED):
        sums[name]["cpu_above_ceiling_us_per_row"] = sums[name]["cpu_us_per_row"] - spark_python
    console.print(
        f"{master}: Python CPU per row above the ceiling's: gating off "
        f"{sums[ONE_BATCH]['cpu_above_ceiling_us_per_row']:.2f} µs, gated "
        f"{sums[GATED]['cpu_above_ceiling_us_per_row']:.2f} µs; the plain loop "
        f"{sums['plain loop']['cpu_us_per_row']:.2f} µs"
    )
    gated, off = sums[GATED], sums[ONE_BATCH]
    ratios = {
        "one_batch_vs_loop": off["median"] / loop,
        "micro_batches_vs_loop": sums[MICRO_BATCHES]["median"] / loop,
        "micro_batches_vs_ceiling": sums[MICRO_BATCHES]["median"]
        / sums[CEILING_MICRO_BATCHES]["median"],
        "gated_vs_off_rows": gated["median"] / off["median"],
        "gated_vs_off_wall": off["wall_median"] / gated["wall_median"],
    }
    console.print(
        f"{master}: against the plain loop: one batch {ratios['one_batch_vs_loop']:.2f} "
        f"(target >= 1.0), 4 micro-batches {ratios['micro_batches_vs_loop']:.2f} (target "
        f">= 0.9; {ratios['micro_batches_vs_ceiling']:.2f} of the ceiling's 4 micro-batches); "
        f"gated / gating off {ratios['gated_vs_off_rows']:.3f} on rows/s, "
        f"{ratios['gated_vs_off_wall']:.3f} on wall time (targets >= 0.9)"
    )
    return {"summary": sums, **ratios, "runs": runs}


def report_live(master: str, rate: float, live: dict[str, Any]) -> dict[str, Any]:
    rows = [
        [name, statistics.median(live[key]), percentile(live[key], 90), max(live[key])]
        for name, key in (
            ("records", "batch_rows"),
            ("addBatch (the batch's job)", "add_batch_ms"),
            ("source planning (latestOffset + getBatch)", "planning_ms"),
            ("Spark's logs (walCommit + commitOffsets)", "spark_logs_ms"),
            ("whole batch (triggerExecution)", "trigger_ms"),
        )
    ]
    table(
        f"{master}: live query, {live['batches']} batches ({rate:g} records/s, 1 s trigger, "
        "noop sink): per batch (ms)",
        ["", "median", "p90", "max"],
        rows,
    )
    behind = sum(1 for ms in live["trigger_ms"] if ms > TRIGGER_MS)
    console.print(
        f"{master}: live batches' addBatch {statistics.median(live['add_batch_ms']):.0f} ms at "
        f"the median (target <= 200); longer than the trigger: {behind} of {live['batches']}"
    )
    return {**live, "behind_trigger": behind}


ONE_BATCH = "gating off, one batch"
MICRO_BATCHES = "gating off, 4 micro-batches"
CEILING_MICRO_BATCHES = "ceiling, 4 micro-batches"
GATED = "gated, one batch"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="200,000 records, 2 rounds")
    parser.add_argument("--records", type=int, help="records to read (default 1,000,000)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 4)")
    parser.add_argument("--cluster", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--live-seconds", type=float, help="the live query (default 40 s)")
    parser.add_argument("--live-rate", type=float, default=50.0, help="records a second")
    args = parser.parse_args()
    records = args.records or (200_000 if args.quick else 1_000_000)
    records -= records % PARTITIONS
    rounds = args.rounds or (2 if args.quick else 4)
    live_seconds = args.live_seconds or (25.0 if args.quick else 40.0)
    masters = ["local[2]"] + (["local-cluster[2,1,1024]"] if args.cluster else [])
    results: dict[str, Any] = {"records": records, "partitions": PARTITIONS, "rounds": rounds}
    with LocalNoida() as broker:
        bootstrap = broker.bootstrap
        topic = f"spark-{random.randrange(10**9)}"
        create_topic(AdminClient({"bootstrap.servers": bootstrap}), topic, PARTITIONS)
        produce(bootstrap, topic, records, lambda i: None, PARTITIONS)
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
                for source, options in spark_readers.values():  # warm up the Python workers
                    spark_run(spark, source, options, records)
                runs: dict[str, list[dict[str, Any]]] = {"plain loop": []}
                runs.update({name: [] for name in spark_readers})
                for _ in range(rounds):
                    runs["plain loop"].append(plain_loop(bootstrap, topic, records))
                    for name, (source, options) in spark_readers.items():
                        runs[name].append(spark_run(spark, source, options, records))
                live = live_query(spark, bootstrap, args.live_rate, live_seconds)
            finally:
                spark.stop()
            results[master] = report(master, runs)
            results[master]["live"] = report_live(master, args.live_rate, live)
    write("spark_bench", results)


if __name__ == "__main__":
    main()
