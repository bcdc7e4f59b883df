"""A query's position beyond the end of the log: the topic was deleted and recreated (or the
broker's data wiped) since the offset was checkpointed, so the records the query had read are
gone and the new log's records sit below its position. That is data loss, never "no new data
yet": with ``failOnDataLoss`` (the default) the query fails at once, naming the partition, the
offset and the log end; with ``failOnDataLoss=false`` it logs one warning and reads the
partition again from its earliest offset."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark.sql.streaming.datasource import ReadAllAvailable  # noqa: E402

from sdk.spark._batch import GatedKafkaBatchReader  # noqa: E402
from sdk.spark._stream import GatedKafkaStreamReader  # noqa: E402
from tests.sdk.test_spark import LOCAL, spark_session  # noqa: E402
from tests.support import Kafka, unique, wait_until  # noqa: E402

# Tansu 0.6: a librdkafka consumer assigned to a topic that is deleted segfaults (in
# rd_kafka_metadata_cache_find). The Spark tests below delete a topic that the executors'
# kept consumers are still assigned to, so they run on noida-db (or a real cluster) only.
TANSU_SEGFAULT = (
    "Tansu segfaults a librdkafka consumer assigned to a deleted topic "
    "(topic-recreation tests run on noida-db)"
)
BEYOND_END = r"checkpoint is at offset {offset}, beyond the log end {end}"


@pytest.fixture(scope="module")
def spark() -> object:
    return spark_session(LOCAL)


def no_recreation_on_tansu(kafka: Kafka) -> None:
    if kafka.broker.name == "tansu":
        pytest.skip(TANSU_SEGFAULT)


def recreate(kafka: Kafka, topic: str, records: int) -> None:
    """Deletes ``topic`` and creates it again (one partition) with ``records`` records."""
    for future in kafka.admin.delete_topics([topic]).values():
        future.result(10)
    wait_until(
        lambda: topic not in kafka.admin.list_topics(timeout=5).topics, what=f"{topic} deleted"
    )
    kafka.create_topic(1, name=topic)
    kafka.produce(topic, {0: records})


def stream_planner(kafka: Kafka, topic: str, **options: str) -> GatedKafkaStreamReader:
    given = {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic, **options}
    return GatedKafkaStreamReader(given, headers=False)


def batch_planner(kafka: Kafka, topic: str, **options: str) -> GatedKafkaBatchReader:
    given = {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic, **options}
    return GatedKafkaBatchReader(given, headers=False)


@contextlib.contextmanager
def driver_stderr(spark, path: Path) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """What the driver's JVM writes to its stderr meanwhile (the stderr of the Python process
    that plans a streaming source's batches included), appended to ``path``."""
    jvm = spark._jvm
    system = jvm.java.lang.System
    before = system.err
    stream = jvm.java.io.PrintStream(jvm.java.io.FileOutputStream(str(path), True), True)
    system.setErr(stream)
    try:
        yield path
    finally:
        system.setErr(before)
        stream.close()


def run(spark, kafka: Kafka, topic: str, checkpoint: Path, **options: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The values a query from ``checkpoint`` reads of what is in ``topic`` now (every
    record: gating off), in the order read."""
    values: list[str] = []

    def each(frame, _: int) -> None:  # type: ignore[no-untyped-def]
        rows = frame.selectExpr("offset", "CAST(value AS STRING) AS value").collect()
        values.extend(r.value for r in sorted(rows, key=lambda r: r.offset))

    stream = (
        spark.readStream.format("gated-kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("gate.enabled", "false")
    )
    for key, value in options.items():
        stream = stream.option(key, value)
    query = (
        stream.load()
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), "the query did not end"
    finally:
        query.stop()
    return values


# ---- through Spark: the topic recreated between two runs on one checkpoint ------------------


def test_a_checkpoint_beyond_the_log_end_fails_the_query_at_once(
    spark, kafka: Kafka, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    no_recreation_on_tansu(kafka)
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 30})
    checkpoint = tmp_path / "checkpoint"
    assert len(run(spark, kafka, topic, checkpoint)) == 30
    recreate(kafka, topic, 10)  # the checkpoint says 30, the new log ends at 10
    query = (
        spark.readStream.format("gated-kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("gate.enabled", "false")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="300 milliseconds")  # a running query, as the example's
        .start()
    )
    try:
        # A generous bound on "at once": before the fix the query waited for the new log to
        # pass offset 30, then read from there.
        with pytest.raises(Exception, match=BEYOND_END.format(offset=30, end=10)) as failed:
            ended = query.awaitTermination(120)
            assert ended, "the query waited instead of failing"
    finally:
        query.stop()
    message = str(failed.value)
    assert f"{topic}[0]" in message and "failOnDataLoss" in message


def test_a_checkpoint_beyond_the_log_end_rereads_the_new_log_when_asked(
    spark, kafka: Kafka, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    no_recreation_on_tansu(kafka)
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 30})
    checkpoint = tmp_path / "checkpoint"
    lenient = {"failOnDataLoss": "false"}
    assert len(run(spark, kafka, topic, checkpoint, **lenient)) == 30
    recreate(kafka, topic, 10)
    with driver_stderr(spark, tmp_path / "stderr.txt") as stderr:
        values = run(spark, kafka, topic, checkpoint, **lenient)
    assert values == [f"0:{i}" for i in range(10)], "every record of the new log, none skipped"
    warnings = [
        line
        for line in stderr.read_text().splitlines()
        if f"{topic}[0]" in line and "checkpoint is at offset 30," in line
    ]
    assert len(warnings) == 1, warnings
    assert "log end 10" in warnings[0] and "earliest" in warnings[0]
    kafka.produce(topic, {0: 5})  # and the query goes on from there
    assert run(spark, kafka, topic, checkpoint, **lenient) == [f"0:{i}" for i in range(5)]


# ---- planning on the driver: a position beyond the end, without deleting a topic -----------


def test_a_position_beyond_the_end_is_data_loss_for_the_planner(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10})
    source = stream_planner(kafka, topic, **{"gate.enabled": "false"})
    try:
        with pytest.raises(RuntimeError, match=BEYOND_END.format(offset=30, end=10)):
            source.latestOffset({topic: {"0": 30}}, ReadAllAvailable())
        # The end itself is no loss: nothing new yet.
        assert source.latestOffset({topic: {"0": 10}}, ReadAllAvailable()) == {topic: {"0": 10}}
    finally:
        source.stop()


def test_a_position_beyond_the_end_restarts_at_earliest_with_one_warning(
    kafka: Kafka, caplog: pytest.LogCaptureFixture
) -> None:
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 10, 1: 10})
    source = stream_planner(kafka, topic, **{"gate.enabled": "false", "failOnDataLoss": "false"})
    try:
        with caplog.at_level(logging.WARNING, logger="sdk.spark"):
            # One batch moves the partition back to its earliest offset (reading nothing of
            # it: a replay of that batch plans the same), the next reads the new log.
            back = source.latestOffset({topic: {"0": 30, "1": 4}}, ReadAllAvailable())
            assert back == {topic: {"0": 0, "1": 10}}
            assert source.partitions({topic: {"0": 30, "1": 4}}, back)[0].value == (
                topic,
                1,
                4,
                10,
            )
            assert len(source.partitions({topic: {"0": 30, "1": 4}}, back)) == 1
            assert source.latestOffset(back, ReadAllAvailable()) == {topic: {"0": 10, "1": 10}}
            # The same position again (a restart replaying the planning): no second warning.
            source.latestOffset({topic: {"0": 30, "1": 4}}, ReadAllAvailable())
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert f"{topic}[0]" in warnings[0] and "checkpoint is at offset 30," in warnings[0]
        assert "log end 10" in warnings[0]
    finally:
        source.stop()


def test_a_position_beyond_the_end_is_not_held_back_by_the_gate(kafka: Kafka) -> None:
    """Gated: the position beyond the end is never taken for "nothing released yet"."""
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10})
    dependency = unique("dep")
    kafka.commit(dependency, topic, {0: 6})
    gated = {"gate.name": "job", "gate.dependsOn": dependency, "gate.pollIntervalMs": "50"}
    strict = stream_planner(kafka, topic, **gated)
    try:
        with pytest.raises(RuntimeError, match=BEYOND_END.format(offset=30, end=10)):
            strict.latestOffset({topic: {"0": 30}}, ReadAllAvailable())
    finally:
        strict.stop()
    lenient = stream_planner(kafka, topic, **gated, failOnDataLoss="false")
    try:
        back = lenient.latestOffset({topic: {"0": 30}}, ReadAllAvailable())
        assert back == {topic: {"0": 0}}
        assert lenient.latestOffset(back, ReadAllAvailable()) == {topic: {"0": 6}}
        # Trigger.AvailableNow: its target does not hold the partition above its start.
        lenient.prepareForTriggerAvailableNow()
        assert lenient.latestOffset({topic: {"0": 30}}, ReadAllAvailable()) == {topic: {"0": 0}}
    finally:
        lenient.stop()


def test_max_offsets_per_trigger_keeps_the_move_back_to_earliest(kafka: Kafka) -> None:
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 10, 1: 10})
    source = stream_planner(
        kafka,
        topic,
        **{"gate.enabled": "false", "failOnDataLoss": "false", "maxOffsetsPerTrigger": "3"},
    )
    try:
        end = source.latestOffset({topic: {"0": 30, "1": 0}}, source.getDefaultReadLimit())
        assert end == {topic: {"0": 0, "1": 3}}
    finally:
        source.stop()


def test_a_batch_read_starting_beyond_the_end_fails_or_reads_from_earliest(
    kafka: Kafka, caplog: pytest.LogCaptureFixture
) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10})
    starting = {"gate.enabled": "false", "startingOffsets": f'{{"{topic}": {{"0": 30}}}}'}
    with pytest.raises(RuntimeError, match=r"startingOffsets.* offset 30.*log end 10"):
        batch_planner(kafka, topic, **starting).plan()
    with caplog.at_level(logging.WARNING, logger="sdk.spark"):
        start, end = batch_planner(kafka, topic, **starting, failOnDataLoss="false").plan()
    assert (start, end) == ({topic: {"0": 0}}, {topic: {"0": 10}})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"{topic}[0]" in warnings[0], warnings


def test_a_new_query_starting_beyond_the_end_fails_or_starts_at_earliest(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10})
    starting = {"gate.enabled": "false", "startingOffsets": f'{{"{topic}": {{"0": 30}}}}'}
    with pytest.raises(RuntimeError, match=r"startingOffsets.* offset 30.*log end 10"):
        stream_planner(kafka, topic, **starting).initialOffset()
    lenient = stream_planner(kafka, topic, **starting, failOnDataLoss="false")
    assert lenient.initialOffset() == {topic: {"0": 0}}


def test_a_kept_consumer_reads_its_topic_again_once_recreated(kafka: Kafka) -> None:
    """The consumer an executor keeps after a range stays assigned there: once the topic is
    recreated below its position, the "offset out of range" queued for that old position is
    not handed over as an error of the next range."""
    from sdk.spark import OffsetRange

    no_recreation_on_tansu(kafka)
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 30})
    source = stream_planner(kafka, topic, **{"gate.enabled": "false"})

    def read(start: int, end: int) -> list[int]:
        batches = source.read(OffsetRange(topic, 0, start, end))
        return [o for batch in batches for o in batch.column("offset").to_pylist()]

    assert read(0, 30) == list(range(30))  # the consumer is kept, standing at 30
    recreate(kafka, topic, 10)
    time.sleep(3)  # the kept consumer fetches at 30 from the new log meanwhile: out of range
    assert read(0, 10) == list(range(10))


class NoOffsets:
    """An admin client whose next ``answers`` ListOffsets answers give librdkafka's "no
    offset" (-1001) for partition 0, as seen while a broker hung."""

    def __init__(self, admin: object, answers: int) -> None:
        self.admin, self.answers = admin, answers

    def __getattr__(self, name: str) -> object:
        return getattr(self.admin, name)

    def list_offsets(self, request: dict, **kwargs: object) -> dict:  # type: ignore[type-arg]
        futures = self.admin.list_offsets(request, **kwargs)  # type: ignore[attr-defined]
        if self.answers <= 0:
            return futures
        self.answers -= 1
        return {
            tp: NoOffsetFor(future) if tp.partition == 0 else future
            for tp, future in futures.items()
        }


class NoOffsetFor:
    def __init__(self, future: object) -> None:
        self.future = future

    def result(self, timeout: float | None = None) -> object:
        answer = self.future.result(timeout)  # type: ignore[attr-defined]
        answer.offset = -1001
        return answer


def test_an_offset_missing_from_the_brokers_answer_never_moves_the_query_back(
    kafka: Kafka,
) -> None:
    """A ListOffsets answer without an offset is a failed read: never a log end below the
    query's position (which reads as data loss, or moves the partition back to its start
    and reads it again). Planning fails saying so, and the next plan goes on from where the
    query is."""
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10})
    source = stream_planner(kafka, topic, **{"gate.enabled": "false"})
    try:
        start = source.initialOffset()
        end = source.latestOffset(start, ReadAllAvailable())
        assert end == {topic: {"0": 10}}
        # (Two requests per planning, earliest and latest offsets; and the retry's two.)
        source._admin = NoOffsets(source._admin_client(), answers=4)
        with pytest.raises(Exception, match=rf"no offset for {topic}\[0\]"):
            source.latestOffset(end, ReadAllAvailable())
        kafka.produce(topic, {0: 2})
        assert source.latestOffset(end, ReadAllAvailable()) == {topic: {"0": 12}}
    finally:
        source.stop()
