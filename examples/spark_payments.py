"""A Spark Structured Streaming job gated on the demo's dependency services.

It reads the demo's ``payments`` topic with the gated Kafka source, so no micro-batch holds a
payment that ``service-b`` and ``service-c`` have not both committed past; it sums each
batch's amounts per partition, appends them to a JSON-lines file and commits its own progress
to the consumer group ``payments-report``, which other services can depend on in turn.

Each micro-batch is one Spark job: the batch is read from Kafka once, aggregated, and the few
total rows are collected and appended to the file by the driver. Writing them with Spark
instead (``totals.write.parquet``) reads the batch from Kafka a second time and adds a second
job with a file commit for every batch: small batches then took 3 to 4 s in ``local[2]``,
behind the 1 s trigger. Spark's progress shows where a batch's time goes
(``query.lastProgress.durationMs``; ``addBatch`` is this function).

Start the demo in one terminal (``make demo``), note the broker address it prints, then::

    .venv/bin/python examples/spark_payments.py --bootstrap 127.0.0.1:PORT

Add ``--gate-url http://127.0.0.1:8080`` to follow the demo gate's HTTP API instead of polling
the admin API from the job. Stop it with Ctrl-C (or SIGTERM): it stops its query and Spark, and
exits 0; run it again and it resumes from its checkpoint. It needs the 'spark' extra
(``pip install '.[spark]'``); without it, it says so in one line.

The demo's broker starts empty each time (``payments`` begins again at offset 0): run against a
new demo, the checkpoint in ``--work-dir`` is beyond the new log's end. The records it counted
are gone and the new ones below it were never read, which is data loss, so by default the job
fails at once (exit 1) with a line naming the partition, the checkpoint's offset and the log
end. Start over with a new ``--work-dir`` (or delete its ``checkpoint`` folder), or pass
``--fail-on-data-loss false``: each such partition is then read again from its earliest offset,
after one warning naming the same (the source's ``failOnDataLoss`` option).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

try:  # sdk.spark first: without the 'spark' extra it says in one line what to install
    from sdk.spark import ProgressCommitter, local_session
except ImportError as missing:
    sys.exit(str(missing))

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

GROUP = "payments-report"
PAYMENT = "payment long, amount long"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True, help="the demo's broker (host:port)")
    parser.add_argument("--topic", default="payments")
    parser.add_argument("--group", default=GROUP, help="the job's own consumer group")
    parser.add_argument(
        "--depends-on", default="service-b,service-c", help="dependency groups (comma-separated)"
    )
    parser.add_argument("--gate-url", help="follow this gate service (gate service-a) instead")
    default_work = Path(tempfile.gettempdir()) / "payments-report"
    parser.add_argument("--work-dir", type=Path, default=default_work, help="checkpoint, output")
    parser.add_argument("--duration", type=float, default=0, help="seconds to run (0: Ctrl-C)")
    parser.add_argument("--trigger", default="1 second", help="micro-batch interval")
    parser.add_argument(
        "--fail-on-data-loss",
        choices=["true", "false"],
        default="true",
        help="false: a checkpoint beyond the log end (a new demo) rereads the new log from its "
        "start, after a warning, instead of failing",
    )
    args = parser.parse_args()

    # Ctrl-C and SIGTERM ask to stop; the loop below stops the query and Spark itself, so no
    # signal lands inside a call to Spark's JVM (Spark's JVM does not get them: see
    # local_session).
    stopping = threading.Event()

    def stop_on_signals() -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda _signum, _frame: stopping.set())

    stop_on_signals()
    spark = local_session(args.group)
    stop_on_signals()  # again: the SparkContext replaced the SIGINT handler with its own
    if stopping.is_set():
        spark.stop()
        return 0
    committer = ProgressCommitter({"bootstrap.servers": args.bootstrap}, args.group)
    spark.streams.addListener(committer)

    stream = (
        spark.readStream.format("gated-kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("maxOffsetsPerTrigger", "5000")
        .option("failOnDataLoss", args.fail_on_data_loss)
    )
    if args.gate_url:
        stream = stream.option("gate.name", "service-a").option("gate.http.url", args.gate_url)
    else:
        stream = stream.option("gate.name", args.group).option("gate.dependsOn", args.depends_on)
    payments = stream.load().select(
        "partition", "offset", F.from_json(F.col("value").cast("string"), PAYMENT).alias("p")
    )

    output = args.work_dir / "totals.jsonl"
    output.parent.mkdir(parents=True, exist_ok=True)

    def report(batch: DataFrame, batch_id: int) -> None:
        totals = batch.groupBy("partition").agg(
            F.count("*").alias("payments"),
            F.sum("p.amount").alias("amount"),
            F.min("offset").alias("first_offset"),
            F.max("offset").alias("last_offset"),
        )
        rows = totals.orderBy("partition").collect()  # the batch's only Spark job
        if not rows:
            return
        with output.open("a") as totals_file:
            for row in rows:
                totals_file.write(json.dumps({"batch": batch_id, **row.asDict()}) + "\n")
        spread = "  ".join(
            f"p{r.partition} {r.payments} (offsets {r.first_offset}..{r.last_offset})" for r in rows
        )
        print(f"batch {batch_id}: {sum(r.payments for r in rows)} payments  {spread}", flush=True)

    query = (
        payments.writeStream.foreachBatch(report)
        .option("checkpointLocation", str(args.work_dir / "checkpoint"))
        .trigger(processingTime=args.trigger)
        .start()
    )
    print(
        f"reading {args.topic}; totals in {output}; progress committed to {args.group}", flush=True
    )
    started = time.monotonic()
    failure: BaseException | None = None
    try:
        while not stopping.is_set() and query.isActive:
            if args.duration and time.monotonic() - started >= args.duration:
                break
            stopping.wait(0.5)
        if not query.isActive:
            failure = query.exception()  # the query ended by itself: it failed
    except StreamingQueryException as exc:
        failure = exc
    finally:
        # Stopping interrupts the query's thread wherever it is (writing its checkpoint,
        # cancelling a job): Spark logs that as warnings with stack traces. They say nothing
        # about this stop, which was asked for.
        spark.sparkContext.setLogLevel("ERROR")
        query.stop()
        committer.close()
        spark.stop()
    if failure is not None:
        print(f"the query failed: {reason(failure)}", file=sys.stderr)
        return 1
    print("stopped", flush=True)
    return 0


def reason(failure: BaseException) -> str:
    """The error behind Spark's wrapping (the last "...Error: ..." line of its text)."""
    lines = [line.strip() for line in str(failure).splitlines()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return errors[-1] if errors else (lines[0] if lines else type(failure).__name__)


if __name__ == "__main__":
    sys.exit(main())
