"""Small micro-batches of the gated Spark source, as ``examples/spark_payments.py`` runs them.

On noida-db: a ``payments`` topic of 3 partitions written at ``--rate`` records a second, two
dependency groups committing to the end twice a second (as the demo's services do), and the
example's query: ``gated-kafka`` gated on both groups, ``maxOffsetsPerTrigger`` 5000, a
``foreachBatch`` that sums each batch per partition in one Spark job, a 1 s trigger, in
``local[2]``, for ``--seconds``. Reports Spark's progress durations per batch (median, p90,
max), the batches that took longer than the trigger, and the source's own planning
(``latestOffset`` + ``getBatch``). Targets: no batch behind its trigger; the source's own
part <= 0.2 s.

Run: ``python -m bench.spark_small_batches [--seconds 60] [--rate 50]``.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from bench._options import parser
from bench._report import console, percentile, table, write
from bench._topics import Writing, create_topic
from demo._local import LocalNoida

PARTITIONS = 3
TRIGGER_MS = 1000
DURATIONS = ["latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets"]


def payment(i: int) -> list[tuple[bytes, int | None]]:
    """The i-th payment written (one a turn)."""
    return [(json.dumps({"payment": i, "amount": i % 100}).encode(), None)]


def follow(bootstrap: str, topic: str, groups: list[str], stop: threading.Event) -> None:
    """The dependency services: each commits every partition's end twice a second."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    consumers = [
        Consumer({"bootstrap.servers": bootstrap, "group.id": g, "enable.auto.commit": False})
        for g in groups
    ]
    specs = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)}
    while not stop.wait(0.5):
        ends = {tp: f.result(10).offset for tp, f in admin.list_offsets(specs).items()}
        offsets = [TopicPartition(topic, tp.partition, end) for tp, end in ends.items()]
        for consumer in consumers:
            consumer.commit(offsets=offsets, asynchronous=False)
    for consumer in consumers:
        consumer.close()


def run(bootstrap: str, topic: str, groups: list[str], seconds: float) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    from sdk.spark import local_session

    spark = local_session("spark-small-batches")
    try:
        payments = (
            spark.readStream.format("gated-kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("maxOffsetsPerTrigger", "5000")
            .option("gate.name", "small-batches")
            .option("gate.dependsOn", ",".join(groups))
            .load()
            .select(
                "partition",
                F.from_json(F.col("value").cast("string"), "payment long, amount long").alias("p"),
            )
        )

        def report(batch: Any, batch_id: int) -> None:
            batch.groupBy("partition").agg(F.sum("p.amount")).collect()

        query = (
            payments.writeStream.foreachBatch(report)
            .option("checkpointLocation", tempfile.mkdtemp(prefix="small-batches-"))
            .trigger(processingTime=f"{TRIGGER_MS} milliseconds")
            .start()
        )
        time.sleep(seconds)
        query.stop()
        return [json.loads(p.json) for p in query.recentProgress]
    finally:
        spark.stop()


def main() -> None:
    options = parser(__doc__)
    options.add_argument("--seconds", type=float, default=60.0)
    options.add_argument("--rate", type=float, default=50.0, help="records a second")
    args = options.parse_args()
    groups = ["service-b", "service-c"]
    stop = threading.Event()
    with LocalNoida() as broker:
        topic = "payments"
        create_topic(broker.bootstrap, topic, PARTITIONS)
        following = threading.Thread(target=follow, args=(broker.bootstrap, topic, groups, stop))
        following.start()
        try:
            with Writing(broker.bootstrap, topic, 1 / args.rate, payment):
                progress = run(broker.bootstrap, topic, groups, args.seconds)
        finally:
            stop.set()
            following.join(30)
    # The first batches start the session's Python workers: judged from the third on.
    batches = [p for p in progress if p["numInputRows"] > 0][2:]
    if not batches:
        raise SystemExit("no batch with records")
    durations = {name: [p["durationMs"].get(name, 0) for p in batches] for name in DURATIONS}
    durations["triggerExecution"] = [p["durationMs"]["triggerExecution"] for p in batches]
    source = [
        p["durationMs"].get("latestOffset", 0) + p["durationMs"].get("getBatch", 0) for p in batches
    ]
    durations["source planning (latestOffset + getBatch)"] = source
    rows = [
        [name, statistics.median(ms), percentile(ms, 90), max(ms)] for name, ms in durations.items()
    ]
    behind = sum(1 for ms in durations["triggerExecution"] if ms > TRIGGER_MS)
    records = statistics.median(p["numInputRows"] for p in batches)
    table(
        f"{len(batches)} micro-batches (median {records:.0f} records), 1 s trigger, local[2]",
        ["duration", "median ms", "p90 ms", "max ms"],
        rows,
    )
    console.print(f"batches longer than the trigger: {behind} of {len(batches)} (target 0)")
    write(
        "spark_small_batches",
        {
            "batches": len(batches),
            "median_records": records,
            "behind_trigger": behind,
            "durations_ms": {
                name: {"median": statistics.median(ms), "p90": percentile(ms, 90), "max": max(ms)}
                for name, ms in durations.items()
            },
        },
    )


if __name__ == "__main__":
    main()
