"""The gated Kafka source on a local SparkSession and the real broker: the tests that read
through Spark run on ``local[2]`` (one JVM) and on ``local-cluster[2,1,1024]`` (two executor
JVMs with Python workers of their own, as on a cluster)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pyspark = pytest.importorskip("pyspark")

from demo._local import free_port  # noqa: E402
from gate import GateService, Snapshot  # noqa: E402
from gate.serve._serve import ServedGate  # noqa: E402
from sdk.spark import ProgressCommitter, kafka_ending_offsets, local_session  # noqa: E402
from sdk.spark._plan import cap  # noqa: E402
from tests.support import (  # noqa: E402
    KEEP_FOREVER,
    Kafka,
    aborted_records_visible,
    gate_config,
    transactions,
    unique,
    wait_until,
)

LOCAL = "local[2]"
CLUSTER = "local-cluster[2,1,1024]"
# A local cluster starts in ~25 s on an idle 2-core machine; loaded by other work, it took up
# to 4 minutes: its start gets a deadline, and a test on it a longer timeout than the others.
CLUSTER_START_SECONDS = 240
on_cluster = pytest.param(CLUSTER, marks=pytest.mark.timeout(CLUSTER_START_SECONDS + 360))

# Tests whose Spark part is planning on the driver (option checks, errors, waiting for the gate)
# gain nothing from executors in other processes: they run on local[2] only.
local_only = pytest.mark.parametrize("spark", [LOCAL], indirect=True)


_running: list[tuple[str, Any]] = []
"""The session this process runs (one SparkContext per process), with its master."""


def spark_session(master: str) -> Any:
    """The session on ``master``: the one running if it is on ``master`` (the test modules
    share it: starting one takes 15-60 s), else a new one, the other stopped first. The Spark
    tests run in one process, ordered by broker then master (tests/conftest.py), which stops
    the session once the last of them has run (``stop_spark``)."""
    if _running and _running[0][0] == master:
        return _running[0][1]
    stop_spark()
    session = _start(master)
    _running.append((master, session))
    return session


def stop_spark() -> None:
    """Stop the session this process runs, if any."""
    while _running:
        _running.pop()[1].stop()


def _start(master: str) -> Any:
    """A session on ``master`` with the source registered; on a local cluster, once both
    executors have registered (skips the test when Spark cannot start them in time)."""
    if not master.startswith("local-cluster"):
        session = local_session("gated-kafka-tests", master=master)
        session.sparkContext.setLogLevel("ERROR")
        return session
    deadline = time.monotonic() + CLUSTER_START_SECONDS
    try:
        session = local_session("gated-kafka-tests", master=master)
    except Exception as exc:
        pytest.skip(f"Spark cannot start {master}: {exc}")
    session.sparkContext.setLogLevel("ERROR")
    # the driver and two executors
    while session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < 3:
        if time.monotonic() > deadline:
            session.stop()
            pytest.skip(
                f"Spark did not start the executors of {master} in {CLUSTER_START_SECONDS} s"
            )
        time.sleep(0.5)
    return session


@pytest.fixture(scope="module", params=[LOCAL, on_cluster])
def spark(request: pytest.FixtureRequest) -> object:
    """The session on each master (see ``spark_session``)."""
    return spark_session(request.param)


def reader(spark, kafka: Kafka, topic: str, **options: str):  # type: ignore[no-untyped-def]
    stream = (
        spark.readStream.format("gated-kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
    )
    for key, value in options.items():
        stream = stream.option(key.replace("_", "."), value)
    return stream.load()


def gated_query(spark, kafka: Kafka, topic: str, dependency: str, each):  # type: ignore[no-untyped-def]
    """A query gated on ``dependency`` (polled every 50 ms) handing each batch to ``each``."""
    stream = reader(
        spark,
        kafka,
        topic,
        **{"gate.name": "job", "gate.dependsOn": dependency, "gate.pollIntervalMs": "50"},
    )
    return (
        stream.writeStream.foreachBatch(each)
        .option("checkpointLocation", tempfile.mkdtemp())
        .trigger(processingTime="300 milliseconds")
        .start()
    )


def test_batches_never_pass_the_dependencies_and_the_job_commits(spark, kafka: Kafka) -> None:
    topic = kafka.create_topic(2)
    dependency, job = unique("dep"), unique("spark-job")
    kafka.produce(topic, {0: 120, 1: 120})
    committed = {"value": {0: 10, 1: 25}}
    kafka.commit(dependency, topic, committed["value"])
    batches: list[tuple[dict[int, int], list[tuple[int, int]]]] = []

    def each(frame, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        at_start = dict(committed["value"])  # what the dependency had committed by now
        rows = [(r.partition, r.offset) for r in frame.select("partition", "offset").collect()]
        batches.append((at_start, rows))

    committer = ProgressCommitter({"bootstrap.servers": kafka.bootstrap}, job)
    spark.streams.addListener(committer)
    query = gated_query(spark, kafka, topic, dependency, each)

    def read_so_far() -> int:
        return sum(len(rows) for _, rows in batches)

    try:
        for step in ({0: 40, 1: 25}, {0: 80, 1: 90}, {0: 120, 1: 120}):
            # Let the stream catch up with what the dependency committed, then advance it.
            reached = sum(committed["value"].values())
            wait_until(lambda r=reached: read_so_far() >= r, timeout=120, what=f"{reached} records")
            time.sleep(1.0)  # more (empty) batches meanwhile: they must not pass the watermark
            assert read_so_far() == reached, "read records the dependency had not committed past"
            kafka.commit(dependency, topic, step)
            committed["value"] = step
        wait_until(
            lambda: sum(len(rows) for _, rows in batches) >= 240, timeout=120, what="every record"
        )
        wait_until(
            lambda: kafka.committed(job, topic, 2) == {0: 120, 1: 120},
            timeout=30,
            what="the job's commit",
        )
    finally:
        query.stop()
        spark.streams.removeListener(committer)
        committer.close()
    nonempty = [(limit, rows) for limit, rows in batches if rows]
    assert len(nonempty) >= 4, "expected several micro-batches"
    for limit, rows in nonempty:
        beyond = [(p, o) for p, o in rows if o >= limit[p]]
        assert beyond == [], (
            f"batch has records the dependency had not committed past: {beyond[:5]}"
        )
    every = [record for _, rows in batches for record in rows]
    assert sorted(every) == [(p, o) for p in range(2) for o in range(120)]
    # the job's own group, seen through the admin API like any consumer group
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    result = kafka.admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(job, [TopicPartition(topic, 0), TopicPartition(topic, 1)])]
    )[job].result(10)
    assert {tp.partition: tp.offset for tp in result.topic_partitions} == {0: 120, 1: 120}


def test_restart_from_the_checkpoint_writes_each_record_exactly_once(
    spark, kafka: Kafka, tmp_path: Path
) -> None:
    topic = kafka.create_topic(2)
    dependency = unique("dep")
    kafka.produce(topic, {0: 60, 1: 60})
    kafka.commit(dependency, topic, {0: 20, 1: 35})
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    options = {
        "gate.name": "job",
        "gate.dependsOn": dependency,
        "gate.pollIntervalMs": "50",
        "maxOffsetsPerTrigger": "16",
    }

    def run() -> None:
        query = (
            reader(spark, kafka, topic, **options)
            .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
            .writeStream.format("json")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)

    run()
    first = read_json(out)
    assert sorted(first) == [(0, o) for o in range(20)] + [(1, o) for o in range(35)]
    kafka.commit(dependency, topic, {0: 60, 1: 60})
    run()  # a new query from the same checkpoint: continues exactly where the first stopped
    run()  # nothing new: writes nothing
    records = read_json(out)
    assert sorted(records) == [(p, o) for p in range(2) for o in range(60)]


def test_a_partition_added_while_the_query_runs_is_read_from_its_start(spark, kafka: Kafka) -> None:
    from confluent_kafka.admin import NewPartitions

    if not kafka.broker.adds_partitions:
        pytest.skip(f"{kafka.broker.name} cannot add partitions to a topic")
    topic = kafka.create_topic(1)
    dependency = unique("dep")
    kafka.produce(topic, {0: 10})
    kafka.commit(dependency, topic, {0: 10})
    seen: list[tuple[int, int]] = []

    def each(frame, _: int) -> None:  # type: ignore[no-untyped-def]
        seen.extend((r.partition, r.offset) for r in frame.select("partition", "offset").collect())

    query = gated_query(spark, kafka, topic, dependency, each)
    try:
        wait_until(lambda: len(seen) >= 10, timeout=120, what="the first partition")
        for future in kafka.admin.create_partitions([NewPartitions(topic, 2)]).values():
            future.result(10)
        kafka.produce(topic, {1: 20})
        kafka.commit(dependency, topic, {0: 10, 1: 15})
        wait_until(lambda: len(seen) >= 25, timeout=120, what="the added partition")
        time.sleep(1.5)  # more batches meanwhile: none may pass the watermark of the new partition
    finally:
        query.stop()
    assert sorted(seen) == [(0, o) for o in range(10)] + [(1, o) for o in range(15)]


def test_rows_follow_the_kafka_source_schema(spark, kafka: Kafka) -> None:
    topic = kafka.create_topic(1, config=KEEP_FOREVER)
    producer = kafka.producer()
    producer.produce(topic, key=b"k1", value=b"v1", headers=[("trace", b"\x00\xff"), ("n", None)])
    producer.produce(topic, key=None, value=None, timestamp=1_700_000_000_123)  # tombstone
    producer.produce(topic, key=b"\xff\xfe", value=b"x" * 200_000)
    producer.flush(10)
    name = unique("rows").replace("-", "_")
    query = (
        reader(spark, kafka, topic, includeHeaders="true", **{"gate.enabled": "false"})
        .writeStream.format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    rows = spark.sql(f"SELECT * FROM {name} ORDER BY offset").collect()
    assert [r.offset for r in rows] == [0, 1, 2]
    assert [(r.key, r.value and len(r.value)) for r in rows] == [
        (b"k1", 2),
        (None, None),
        (b"\xff\xfe", 200_000),
    ]
    assert {r.topic for r in rows} == {topic} and {r.partition for r in rows} == {0}
    assert [(h.key, h.value) for h in rows[0].headers] == [("trace", b"\x00\xff"), ("n", None)]
    assert rows[1].headers == []
    assert rows[1].timestamp.timestamp() == 1_700_000_000.123
    assert {r.timestampType for r in rows} == {0}  # CreateTime
    assert list(rows[0].asDict()) == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"
    ]  # fmt: skip


def read_json(path: Path) -> list[tuple[int, int]]:
    records = []
    for file in path.glob("*.json"):
        for line in file.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                records.append((row["partition"], row["offset"]))
    return records


@local_only
def test_an_unreachable_watermark_source_gives_empty_batches_then_resumes(
    spark, kafka: Kafka
) -> None:
    topic = kafka.create_topic(1)
    dependency = unique("dep")
    kafka.produce(topic, {0: 30})
    kafka.commit(dependency, topic, {0: 30})
    port = free_port()
    seen: list[int] = []
    stream = reader(
        spark, kafka, topic, **{"gate.name": "job", "gate.http.url": f"http://127.0.0.1:{port}"}
    )
    query = (
        stream.writeStream.foreachBatch(
            lambda frame, _: seen.extend(r.offset for r in frame.select("offset").collect())
        )
        .option("checkpointLocation", tempfile.mkdtemp())
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        time.sleep(15)  # the gate service is not there: nothing may be read
        assert seen == []
        config = gate_config(
            kafka.bootstrap, {"job": {"topics": [topic], "depends_on": [dependency]}}
        )
        with ServedGate(GateService(config), port=port):
            wait_until(lambda: len(seen) == 30, timeout=60, what="reading once the gate is back")
    finally:
        query.stop()
    assert sorted(seen) == list(range(30))


@local_only
@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"gate.name": "job", "gate.dependsOn": "dep", "subscribe": ""}, "option 'subscribe'"),
        ({"gate.dependsOn": "dep"}, "option 'gate.name'"),
        ({"gate.name": "job"}, "option 'gate.redis.url'"),
        (
            {"gate.name": "job", "gate.dependsOn": "dep", "maxOffsetsPerTrigger": "0"},
            "option 'maxOffsetsPerTrigger'",
        ),
        (
            {"gate.name": "job", "gate.dependsOn": "dep", "startingOffsets": "yesterday"},
            "option 'startingOffsets'",
        ),
        ({"gate.enabled": "maybe"}, "option 'gate.enabled'"),
        (
            {"gate.enabled": "false", "kafka.isolation.level": "serializable"},
            "option 'kafka.isolation.level'",
        ),
        (
            {"gate.enabled": "false", "kafka.auto.offset.reset": "latest"},
            "option 'kafka.auto.offset.reset' is not supported",
        ),
        (
            {"gate.enabled": "false", "kafka.queued.min.messages": "none"},
            r"invalid kafka\.\* options.*queued\.min\.messages",
        ),
    ],
)
def test_invalid_options_fail_when_the_query_starts(
    spark, kafka: Kafka, options: dict, fragment: str
) -> None:
    stream = reader(
        spark, kafka, "some-topic", **{k.replace(".", "_"): v for k, v in options.items()}
    )
    with pytest.raises(Exception, match=fragment):
        query = (
            stream.writeStream.format("console")
            .option("checkpointLocation", tempfile.mkdtemp())
            .start()
        )
        try:
            query.awaitTermination(60)
        finally:
            query.stop()


@local_only
def test_a_deleted_topic_stops_the_query_with_a_clear_error(spark, kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 5})
    stream = reader(spark, kafka, topic, **{"gate.enabled": "false"})
    query = (
        stream.writeStream.format("noop")
        .option("checkpointLocation", tempfile.mkdtemp())
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        time.sleep(5)
        for future in kafka.admin.delete_topics([topic]).values():
            future.result(10)
        with pytest.raises(Exception, match=f"topic '{topic}' does not exist"):
            query.awaitTermination(60)
    finally:
        query.stop()


def test_ending_offsets_for_the_jvm_kafka_source() -> None:
    snapshot = Snapshot("job", 3, time.time(), {("t", 0): 23, ("t", 1): None, ("u", 0): 5})
    assert json.loads(kafka_ending_offsets(snapshot, ["t"], {"t": {"1": 7}})) == {
        "t": {"0": 23, "1": 7}
    }
    with pytest.raises(ValueError, match=r"t\[1\] has no watermark"):
        kafka_ending_offsets(snapshot, ["t"])
    with pytest.raises(ValueError, match="no partitions of v"):
        kafka_ending_offsets(snapshot, ["v"])


offsets = st.dictionaries(
    st.sampled_from(["0", "1", "2", "3"]),
    st.tuples(st.integers(0, 1000), st.integers(0, 1000)),
    min_size=1,
)


@given(offsets, st.integers(1, 3000))
def test_max_offsets_per_trigger_spreads_at_most_the_maximum(ranges: dict, maximum: int) -> None:
    start = {"t": {p: a for p, (a, _) in ranges.items()}}
    end = {"t": {p: a + b for p, (a, b) in ranges.items()}}
    capped = cap(start, end, maximum)
    taken = {p: capped["t"][p] - start["t"][p] for p in ranges}
    assert all(0 <= taken[p] <= end["t"][p] - start["t"][p] for p in ranges)
    total = sum(end["t"][p] - start["t"][p] for p in ranges)
    assert sum(taken.values()) == min(total, maximum)


def planner(kafka: Kafka, topic: str, **options: str):  # type: ignore[no-untyped-def]
    """The source's reader on the driver, without a query (for planning and reading)."""
    from sdk.spark import GatedKafkaStreamReader

    given = {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic, **options}
    return GatedKafkaStreamReader(given, headers=False)


def test_available_now_never_plans_an_end_below_its_start(kafka: Kafka) -> None:
    """A dependency rewound below the checkpoint before the run: the AvailableNow target is
    below the query's start, and the plan must not end below its start (no re-reading)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10})
    dependency = unique("dep")
    kafka.commit(dependency, topic, {0: 2})  # rewound from 8
    source = planner(kafka, topic, **{"gate.name": "job", "gate.dependsOn": dependency})
    try:
        source.prepareForTriggerAvailableNow()
        end = source.latestOffset({topic: {"0": 8}}, ReadAllAvailable())
        assert end == {topic: {"0": 8}}
    finally:
        source.stop()


def delete_first(kafka: Kafka, topic: str, before: int) -> None:
    from confluent_kafka import TopicPartition

    try:
        for future in kafka.admin.delete_records([TopicPartition(topic, 0, before)]).values():
            future.result(10)
    except Exception as exc:
        pytest.skip(f"this broker cannot delete records: {exc}")


def test_records_gone_from_kafka_fail_the_query_by_default(kafka: Kafka) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from sdk.spark import OffsetRange

    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10})
    delete_first(kafka, topic, 6)
    source = planner(kafka, topic, **{"gate.enabled": "false"})
    with pytest.raises(RuntimeError, match=rf"{topic}\[0\]: offsets 2 to 5 are no longer"):
        source.latestOffset({topic: {"0": 2}}, ReadAllAvailable())
    with pytest.raises(RuntimeError, match="failOnDataLoss"):
        list(source.read(OffsetRange(topic, 0, 2, 10)))


def test_records_gone_from_kafka_are_skipped_when_asked(kafka: Kafka) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from sdk.spark import OffsetRange

    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10})
    delete_first(kafka, topic, 6)
    source = planner(kafka, topic, **{"gate.enabled": "false", "failOnDataLoss": "false"})
    assert source.latestOffset({topic: {"0": 2}}, ReadAllAvailable()) == {topic: {"0": 10}}
    assert source.lost_records == 4
    batches = list(source.read(OffsetRange(topic, 0, 2, 10)))
    offsets = [o for batch in batches for o in batch.column("offset").to_pylist()]
    assert offsets == [6, 7, 8, 9], "read from the log start, nothing jumped to the end"


def test_the_progress_committer_passes_callables_through_and_fails_fast(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 5})
    group = unique("job")
    errors: list[object] = []
    committer = ProgressCommitter(
        {"bootstrap.servers": kafka.bootstrap, "error_cb": errors.append}, group
    )
    try:
        committer.commit({topic: {"0": 3}})
    finally:
        committer.close()
    assert kafka.committed(group, topic, 1) == {0: 3}
    with pytest.raises(ValueError, match=r"invalid Kafka configuration.*no\.such"):
        ProgressCommitter({"bootstrap.servers": kafka.bootstrap, "no.such": "x"}, group)


# ---- transactions and the isolation level ------------------------------------------------


def stable_offset(kafka: Kafka, topic: str) -> int:
    """Partition 0's last stable offset as the broker reports it (ListOffsets, read_committed)."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    tp = TopicPartition(topic, 0)
    futures = kafka.admin.list_offsets(
        {tp: OffsetSpec.latest()}, isolation_level=IsolationLevel.READ_COMMITTED
    )
    return futures[tp].result(10).offset


def require_stable_offset(kafka: Kafka, topic: str, expected: int) -> None:
    """Skip on a broker that does not report the last stable offset of a partition with an open
    transaction (Tansu 0.6 answers 0): no client can plan a read_committed batch there."""
    reported = stable_offset(kafka, topic)
    if reported != expected:
        pytest.skip(
            f"{kafka.broker.name} reports last stable offset {reported}, not {expected}, "
            "while a transaction is open"
        )


def require_aborted_records_hidden(kafka: Kafka, topic: str) -> None:
    """Skip on a broker that hands aborted records to read_committed consumers (Tansu 0.6 does:
    its fetch responses list no aborted transactions)."""
    if aborted_records_visible(kafka, topic):
        pytest.skip(f"{kafka.broker.name} hands aborted records to read_committed consumers")


def drain(spark, kafka: Kafka, topic: str, checkpoint: str, **options: str) -> list[str]:  # type: ignore[no-untyped-def]
    """One Trigger.AvailableNow run of an ungated query: the values it read."""
    values: list[str] = []

    def each(frame, _: int) -> None:  # type: ignore[no-untyped-def]
        values.extend(row.value.decode() for row in frame.select("value").collect())

    query = (
        reader(spark, kafka, topic, **{"gate.enabled": "false", **options})
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(300), "the query did not finish"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    return values


def named(step: int, kind: str, count: int) -> list[str]:
    return [f"{kind}{step}-{i}" for i in range(count)]


def test_an_open_transaction_ends_the_batch_where_it_begins(spark, kafka: Kafka) -> None:
    """read_committed (the default): a batch ends at the last stable offset, before the open
    transaction, and the next one reads the transaction once it has committed."""
    topic = kafka.create_topic(1)
    producer = transactions(kafka, topic, ("commit", 10), ("open", 5))
    committed = False
    try:
        require_stable_offset(kafka, topic, 11)  # 10 records and the commit marker
        checkpoint = tempfile.mkdtemp()
        assert drain(spark, kafka, topic, checkpoint) == named(0, "commit", 10)
        producer.commit_transaction(30)
        committed = True
        assert drain(spark, kafka, topic, checkpoint) == named(1, "open", 5)
    finally:
        if not committed:
            producer.abort_transaction(30)


def test_aborted_transactions_are_skipped_and_the_batch_finishes(spark, kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    producer = transactions(
        kafka, topic, ("commit", 4), ("abort", 3), ("commit", 3), ("abort", 2), ("open", 2)
    )
    try:
        # 0-3, marker, 5-7 aborted, marker, 9-11, marker, 13-14 aborted, marker, 16-17 open
        require_stable_offset(kafka, topic, 16)
        require_aborted_records_hidden(kafka, topic)
        values = drain(spark, kafka, topic, tempfile.mkdtemp())
    finally:
        producer.abort_transaction(30)
    assert values == named(0, "commit", 4) + named(2, "commit", 3)


def test_read_uncommitted_plans_to_the_end_and_reads_open_and_aborted_records(
    spark, kafka: Kafka
) -> None:
    topic = kafka.create_topic(1)
    producer = transactions(kafka, topic, ("commit", 4), ("abort", 3), ("open", 5))
    try:
        values = drain(
            spark, kafka, topic, tempfile.mkdtemp(), **{"kafka.isolation.level": "read_uncommitted"}
        )
    finally:
        producer.abort_transaction(30)
    assert values == named(0, "commit", 4) + named(1, "abort", 3) + named(2, "open", 5)


def test_batches_are_planned_at_the_isolation_level_they_are_read_at(kafka: Kafka) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    topic = kafka.create_topic(1)
    producer = transactions(kafka, topic, ("commit", 10), ("open", 5))
    try:
        # 0-9 committed, 10 the commit marker, 11-15 open
        uncommitted = planner(
            kafka, topic, **{"gate.enabled": "false", "kafka.isolation.level": "read_uncommitted"}
        )
        assert uncommitted.latestOffset({topic: {"0": 0}}, ReadAllAvailable()) == {topic: {"0": 16}}
        require_stable_offset(kafka, topic, 11)
        for options in ({}, {"kafka.isolation.level": "read_committed"}):
            committed = planner(kafka, topic, **{"gate.enabled": "false", **options})
            start = committed.initialOffset()
            assert committed.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 11}}
    finally:
        producer.abort_transaction(30)


def test_ranges_ending_in_gaps_are_read_to_their_end(kafka: Kafka) -> None:
    """Offsets are not contiguous (transaction markers, aborted records, compaction): a range
    ends when the reader's position reaches its end, whatever record it saw last."""
    from sdk.spark import OffsetRange

    topic = kafka.create_topic(1)
    transactions(kafka, topic, ("commit", 4), ("abort", 3), ("commit", 3))
    # 0-3, 4 marker, 5-7 aborted, 8 marker, 9-11, 12 marker (the end)
    uncommitted = planner(
        kafka, topic, **{"gate.enabled": "false", "kafka.isolation.level": "read_uncommitted"}
    )

    def read(source, start: int, end: int) -> list[int]:  # type: ignore[no-untyped-def]
        batches = source.read(OffsetRange(topic, 0, start, end))
        return [o for batch in batches for o in batch.column("offset").to_pylist()]

    assert read(uncommitted, 0, 5) == [0, 1, 2, 3]  # ends at a marker
    assert read(uncommitted, 9, 13) == [9, 10, 11]  # ends after the last marker
    assert read(uncommitted, 12, 13) == []  # only a marker
    assert read(uncommitted, 3, 8) == [3, 5, 6, 7]
    require_aborted_records_hidden(kafka, topic)
    committed = planner(kafka, topic, **{"gate.enabled": "false"})
    assert read(committed, 0, 8) == [0, 1, 2, 3]  # ends among aborted records
    assert read(committed, 4, 9) == []  # a marker, aborted records and a marker
    assert read(committed, 2, 13) == [2, 3, 9, 10, 11]


def test_a_range_beyond_what_the_reader_can_read_fails_naming_where_it_stopped(
    kafka: Kafka, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A range planned at read_uncommitted, read at read_committed while its transaction is
    open (a checkpoint written at the other level): the task fails with a clear message."""
    import sdk.spark._read as source_module
    from sdk.spark import OffsetRange

    topic = kafka.create_topic(1)
    producer = transactions(kafka, topic, ("commit", 10), ("open", 5))
    monkeypatch.setattr(source_module, "STALL_SECONDS", 1.0)
    try:
        source = planner(kafka, topic, **{"gate.enabled": "false"})
        with pytest.raises(RuntimeError, match=rf"{topic}\[0\]: the reader stayed at offset 11"):
            list(source.read(OffsetRange(topic, 0, 0, 16)))
    finally:
        producer.abort_transaction(30)


def test_every_kafka_property_reaches_the_readers_consumer(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Consumer-only librdkafka properties included: the planner's admin client leaves them
    out, the executors' consumers get them all."""
    import sdk.spark._read as source_module
    from sdk.spark import GatedKafkaStreamReader, OffsetRange

    configs: list[dict[str, object]] = []

    class Opened(Exception):
        pass

    class RecordingConsumer:
        def __init__(self, config: dict[str, object]) -> None:
            configs.append(config)

        def get_watermark_offsets(self, *args: object, **kwargs: object) -> tuple[int, int]:
            raise Opened

        def close(self) -> None:
            pass

    options = {
        "kafka.bootstrap.servers": "127.0.0.1:9",
        "subscribe": "t",
        "gate.enabled": "false",
        "kafka.isolation.level": "read_uncommitted",
        "kafka.queued.min.messages": "5000",
        "kafka.fetch.max.bytes": "1048576",
        "kafka.fetch.wait.max.ms": "50",
        "kafka.client.id": "payments-report",
    }
    source = GatedKafkaStreamReader(options, headers=False)
    monkeypatch.setattr(source_module, "Consumer", RecordingConsumer)
    with pytest.raises(Opened):
        list(source.read(OffsetRange("t", 0, 0, 10)))
    (config,) = configs
    for key, value in options.items():
        if key.startswith("kafka."):
            assert config[key[len("kafka.") :]] == value, key
