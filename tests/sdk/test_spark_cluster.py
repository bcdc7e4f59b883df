"""The gated source on a real multi-process cluster (local-cluster[2,1,1024]) when a Python worker
of an executor dies in the middle of a batch: Spark retries the task, and the output holds every
released record exactly once."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

pyspark = pytest.importorskip("pyspark")

from tests.sdk.test_spark import CLUSTER, CLUSTER_START_SECONDS, reader, spark_session  # noqa: E402
from tests.support import Kafka, unique  # noqa: E402

# the cluster's start included; the batch alone took 400 s on a 2-core machine loaded by other
# work (~25 s idle)
pytestmark = pytest.mark.timeout(CLUSTER_START_SECONDS + 600)

PER_PARTITION = 5_000
RELEASED = {0: 4_000, 1: 3_500}  # what the dependency has committed: the gate's watermarks
RECORDS_PER_TASK = "100"  # 75 tasks: the batch runs long enough to kill a worker during it


@pytest.fixture(scope="module")
def spark() -> object:
    session = spark_session(CLUSTER)
    # local-cluster retries a failed task (local[N] does not): say so rather than rely on it
    assert session.sparkContext.getConf().get("spark.task.maxFailures", "4") != "1"
    return session


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        # pid (comm) state ppid ...: comm may hold spaces, so split after its closing ')'
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def command(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def descendants(pid: int) -> Iterator[int]:
    for child in children(pid):
        yield child
        yield from descendants(child)


def python_workers() -> list[int]:
    """The Python workers of this test run's executors: the processes the ``pyspark.daemon``
    of each executor JVM forked (the daemons themselves left alone)."""
    workers = []
    for jvm in descendants(os.getpid()):
        if "CoarseGrainedExecutorBackend" in command(jvm):
            for daemon in children(jvm):
                if "pyspark.daemon" in command(daemon):
                    workers.extend(children(daemon))
    return workers


def cpu_ticks(pid: int) -> int:
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime + stime


def busiest_worker() -> int | None:
    """The executors' Python worker that used the most CPU over the last 0.1 s: one reading a
    task (an idle worker, kept for reuse, uses none). The window is short: a task of the
    batch takes a few tenths of a second, and a worker that finished its task meanwhile is
    idle when it is killed (no task fails)."""
    before = {pid: cpu_ticks(pid) for pid in python_workers()}
    time.sleep(0.1)
    used = {pid: cpu_ticks(pid) - ticks for pid, ticks in before.items()}
    busiest = max(used, key=used.__getitem__, default=None)
    return busiest if busiest is not None and used[busiest] > 0 else None


def running_stage(spark):  # type: ignore[no-untyped-def]
    """The stage of the batch, once it has finished a few tasks and is running more."""
    tracker = spark.sparkContext.statusTracker()
    for stage in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage)
        if info is not None and info.numActiveTasks > 0 and info.numCompletedTasks >= 5:
            return info
    return None


def kill_workers_until_a_task_fails(spark, stop: threading.Event, killed: list[int]) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL the busy Python worker of an executor while the batch's tasks are reading, again
    if that missed (the worker finished its task meanwhile), until one of the tasks fails."""
    while not stop.is_set() and len(killed) < 10:
        stage = running_stage(spark)
        if stage is None or stage.numFailedTasks > 0:
            if stage is not None:
                return
            time.sleep(0.05)
            continue
        worker = busiest_worker()
        if worker is None:
            continue
        try:
            os.kill(worker, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.append(worker)
        time.sleep(2.0)  # the executor notices the lost worker and reports the task failed


def failed_tasks(spark, query) -> int:  # type: ignore[no-untyped-def]
    """Failed task attempts in the query's jobs (a streaming query's job group is its run id)."""
    tracker = spark.sparkContext.statusTracker()
    failed = 0
    for job in tracker.getJobIdsForGroup(str(query.runId)):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info is not None else []:
            stage_info = tracker.getStageInfo(stage)
            failed += stage_info.numFailedTasks if stage_info is not None else 0
    return failed


def test_a_python_worker_killed_mid_batch_is_retried_and_the_output_is_exact(
    spark, kafka: Kafka, tmp_path: Path
) -> None:
    topic = kafka.create_topic(2)
    dependency = unique("dep")
    kafka.produce(topic, {0: PER_PARTITION, 1: PER_PARTITION})
    kafka.commit(dependency, topic, RELEASED)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    stop, killed = threading.Event(), []
    killer = threading.Thread(
        target=kill_workers_until_a_task_fails, args=(spark, stop, killed), daemon=True
    )
    killer.start()
    query = (
        reader(
            spark,
            kafka,
            topic,
            **{
                "gate.name": "job",
                "gate.dependsOn": dependency,
                "maxRecordsPerPartition": RECORDS_PER_TASK,
            },
        )
        .selectExpr("partition", "offset")
        .writeStream.format("json")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(600), "the query did not finish"
    finally:
        stop.set()
        query.stop()
        killer.join(10)
    assert query.exception() is None, query.exception()
    assert killed, "no Python worker was running while the batch was read"
    assert failed_tasks(spark, query) > 0, "no task failed: the kill missed the batch"
    written = sorted(committed_output(out))
    assert written == [(p, o) for p, end in RELEASED.items() for o in range(end)]


def committed_output(out: Path) -> list[tuple[int, int]]:
    """The (partition, offset) rows of the files the file sink committed (listed in its
    ``_spark_metadata`` log, as Spark's own readers of the output see it): a failed task's
    attempt is not among them."""
    records = []
    for log in (out / "_spark_metadata").iterdir():
        if log.name.startswith("."):
            continue  # checksum files
        for line in log.read_text().splitlines()[1:]:  # after the version line
            entry = json.loads(line)
            if entry.get("action", "add") != "add":
                continue
            for row in Path(urlparse(entry["path"]).path).read_text().splitlines():
                if row.strip():
                    record = json.loads(row)
                    records.append((record["partition"], record["offset"]))
    return records
