"""Gated Spark source benchmark.

Reads one topic with the ``gated-kafka`` source into Spark's ``noop`` sink, in micro-batches
of ``maxOffsetsPerTrigger`` records (``Trigger.AvailableNow``), gated on a dependency group
that has committed past everything (embedded admin polling) and with gating off, alternating
in the same run on the same SparkSession (local[2]). Reports rows per second over the
batches' execution time (target: gated/ungated >= 0.9) and the per-batch overhead: the time
Spark spends in ``latestOffset`` (planning, where the watermarks are read) and per batch.

Run: ``python -m bench.spark_bench [--quick]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from typing import Any

from confluent_kafka.admin import AdminClient
from rich.progress import track

from bench._report import console, table, write
from bench.engine_bench import create_topic, group_far_ahead, produce
from gate._local import LocalBroker

PARTITIONS = 4


def session() -> Any:
    from sdk.spark import local_session

    spark = local_session("gated-kafka-bench")
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(spark: Any, bootstrap: str, topic: str, gating: dict[str, str], per_batch: int) -> dict:
    stream = (
        spark.readStream.format("gated-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("maxOffsetsPerTrigger", str(per_batch))
    )
    for key, value in gating.items():
        stream = stream.option(key, value)
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
    batches = [p for p in query.recentProgress if p.numInputRows > 0]
    rows = sum(p.numInputRows for p in batches)
    execution = sum(p.durationMs.get("triggerExecution", 0) for p in batches) / 1000
    planning = [p.durationMs.get("latestOffset", 0) for p in batches]
    return {
        "rows": rows,
        "batches": len(batches),
        "rows_per_second": rows / execution if execution else 0.0,
        "wall_seconds": round(wall, 3),
        "latest_offset_ms": statistics.median(planning) if planning else 0.0,
        "batch_ms": statistics.median(
            [p.durationMs.get("triggerExecution", 0) for p in batches] or [0]
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    records = 100_000 if args.quick else 400_000
    rounds = 2 if args.quick else 4
    per_batch = records // 10
    with LocalBroker() as broker:
        bootstrap = broker.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topic = f"spark-{random.randrange(10**9)}"
        create_topic(admin, topic, PARTITIONS)
        produce(bootstrap, topic, records, lambda i: f"key-{i}".encode(), PARTITIONS)
        dependency, ends = group_far_ahead(bootstrap, topic, PARTITIONS)
        modes = {
            "gating off": {"gate.enabled": "false"},
            "gated (embedded)": {"gate.name": "bench", "gate.dependsOn": dependency},
        }
        spark = session()
        try:
            run(spark, bootstrap, topic, modes["gating off"], per_batch)  # warm up the JVM
            runs: dict[str, list[dict]] = {name: [] for name in modes}
            for _ in track(range(rounds), description="gated vs gating off", console=console):
                for name, gating in modes.items():
                    runs[name].append(run(spark, bootstrap, topic, gating, per_batch))
        finally:
            spark.stop()
    for name, results in runs.items():
        if any(r["rows"] != sum(ends) for r in results):
            raise SystemExit(f"{name}: read {[r['rows'] for r in results]} rows of {sum(ends)}")
    best = {
        name: max(results, key=lambda r: r["rows_per_second"]) for name, results in runs.items()
    }
    ratio = best["gated (embedded)"]["rows_per_second"] / best["gating off"]["rows_per_second"]
    table(
        f"Gated Spark source, {records:,} records in {PARTITIONS} partitions, "
        f"{per_batch:,} per batch, best of {rounds} (local[2])",
        ["source", "rows/s", "median batch ms", "median latestOffset ms", "wall s"],
        [
            [
                name,
                r["rows_per_second"],
                r["batch_ms"],
                r["latest_offset_ms"],
                r["wall_seconds"],
            ]
            for name, r in best.items()
        ],
    )
    overhead = best["gated (embedded)"]["batch_ms"] - best["gating off"]["batch_ms"]
    console.print(
        f"gated / gating off: [bold]{ratio:.3f}[/] (target >= 0.9); "
        f"per-batch overhead {overhead:+.0f} ms"
    )
    write(
        "spark_bench",
        {
            "records": records,
            "partitions": PARTITIONS,
            "per_batch": per_batch,
            "runs": runs,
            "best": best,
            "ratio": round(ratio, 3),
            "per_batch_overhead_ms": overhead,
        },
    )


if __name__ == "__main__":
    main()
