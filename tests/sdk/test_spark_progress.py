"""The gated source's progress: latest offsets in Spark's progress, offsets behind latest, the
reader's metrics, and the admin round-trips of planning a small batch."""

from __future__ import annotations

import json
import tempfile
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark")

from sdk.spark import source_metrics  # noqa: E402
from tests.sdk.test_spark import LOCAL, planner, spark_session  # noqa: E402
from tests.support import Kafka, unique  # noqa: E402


@pytest.fixture(scope="module")
def spark() -> Any:
    return spark_session(LOCAL)


def all_available() -> Any:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    return ReadAllAvailable()


def gated_topic(kafka: Kafka) -> tuple[str, str]:
    """A topic of two partitions with 20 records each; a dependency at 5 and 8."""
    topic, dependency = kafka.create_topic(2), unique("dep")
    kafka.produce(topic, {0: 20, 1: 20})
    kafka.commit(dependency, topic, {0: 5, 1: 8})
    return topic, dependency


@pytest.mark.timeout(600)  # the module's Spark session and a first batch on a loaded machine
def test_the_progress_shows_the_log_ends_beside_a_gated_end(spark: Any, kafka: Kafka) -> None:
    topic, dependency = gated_topic(kafka)
    query = (
        spark.readStream.format("gated-kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("gate.name", "job")
        .option("gate.dependsOn", dependency)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", tempfile.mkdtemp())
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    progress = query.lastProgress
    assert progress is not None
    source = progress.sources[0]
    assert json.loads(source.endOffset) == {topic: {"0": 5, "1": 8}}
    assert json.loads(source.latestOffset) == {topic: {"0": 20, "1": 20}}
    assert source_metrics(progress) == {
        "minOffsetsBehindLatest": "12",
        "avgOffsetsBehindLatest": "13.5",
        "maxOffsetsBehindLatest": "15",
    }
    assert source_metrics(progress.json) == source_metrics(progress)


def test_offsets_behind_latest_are_min_avg_and_max_over_partitions() -> None:
    progress = {
        "sources": [
            {"endOffset": None, "latestOffset": None},
            {
                "endOffset": json.dumps({"a": {"0": 10, "1": 4}, "b": {"0": 7}}),
                "latestOffset": json.dumps({"a": {"0": 10, "1": 9}, "b": {"0": 8}}),
            },
        ]
    }
    assert source_metrics(progress, 1) == {
        "minOffsetsBehindLatest": "0",
        "avgOffsetsBehindLatest": "2.0",
        "maxOffsetsBehindLatest": "5",
    }
    assert source_metrics(progress, 0) == {}, "no latest offset reported: no figures"
    with pytest.raises(ValueError, match="2 source"):
        source_metrics(progress, 2)


def test_the_readers_metrics_name_the_held_back_records_and_the_snapshot_age(
    kafka: Kafka,
) -> None:
    topic, dependency = gated_topic(kafka)
    start = {topic: {"0": 0, "1": 0}}
    source = planner(kafka, topic, **{"gate.name": "job", "gate.dependsOn": dependency})
    capped = planner(
        kafka,
        topic,
        **{"gate.name": "job", "gate.dependsOn": dependency, "maxOffsetsPerTrigger": "6"},
    )
    ungated = planner(kafka, topic, **{"gate.enabled": "false", "maxOffsetsPerTrigger": "6"})
    try:
        assert source.metrics(start) == {}, "nothing planned yet"
        end = source.latestOffset(start, all_available())
        assert end == {topic: {"0": 5, "1": 8}}
        figures = source.metrics(end)
        age = figures.pop("watermarkSnapshotAgeMs")
        assert int(age) >= 0
        assert figures == {
            "minOffsetsBehindLatest": "12",
            "avgOffsetsBehindLatest": "13.5",
            "maxOffsetsBehindLatest": "15",
            "recordsHeldBackByGate": "27",
        }
        assert source.metrics(json.dumps(end)) == {**figures, "watermarkSnapshotAgeMs": age}
        assert source.reportLatestOffset() == {topic: {"0": 20, "1": 20}}

        # maxOffsetsPerTrigger holds records back too; they are not the gate's.
        end = capped.latestOffset(start, capped.getDefaultReadLimit())
        assert sum(end[topic].values()) == 6
        figures = capped.metrics(end)
        assert figures["recordsHeldBackByGate"] == "27"
        assert figures["maxOffsetsBehindLatest"] == "17"

        end = ungated.latestOffset(start, ungated.getDefaultReadLimit())
        figures = ungated.metrics(end)
        assert figures["recordsHeldBackByGate"] == "0"
        assert "watermarkSnapshotAgeMs" not in figures
        assert figures["minOffsetsBehindLatest"] == "17"
    finally:
        for reader in (source, capped, ungated):
            reader.stop()


class CountingAdmin:
    """An admin client that records its requests and when their answers are awaited: the
    requests sent before the first answer is awaited share one round-trip."""

    def __init__(self, admin: Any) -> None:
        self.admin = admin
        self.events: list[str] = []

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        self.events.append("list_topics")
        self.events.append("answer")  # list_topics blocks until it has the answer
        return self.admin.list_topics(*args, **kwargs)

    def list_offsets(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        self.events.append("list_offsets")
        futures = self.admin.list_offsets(*args, **kwargs)
        return {tp: Awaited(future, self.events) for tp, future in futures.items()}

    def round_trips(self) -> int:
        """Groups of requests, each group ending where an answer is first awaited."""
        trips, sent = 0, False
        for event in self.events:
            if event == "answer":
                trips, sent = trips + sent, False
            else:
                sent = True
        return trips + sent


class Awaited:
    def __init__(self, future: Any, events: list[str]) -> None:
        self.future, self.events = future, events

    def result(self, *args: Any, **kwargs: Any) -> Any:
        self.events.append("answer")
        return self.future.result(*args, **kwargs)


def test_planning_a_small_batch_takes_one_admin_round_trip(kafka: Kafka) -> None:
    topic = kafka.create_topic(3)
    kafka.produce(topic, {0: 10, 1: 10, 2: 10})
    source = planner(kafka, topic, **{"gate.enabled": "false"})
    admin = CountingAdmin(source._admin_client())
    source._admin = admin
    try:
        start = source.initialOffset()
        end = source.latestOffset(start, all_available())  # lists the partitions once
        for _ in range(3):
            kafka.produce(topic, {0: 1})
            admin.events.clear()
            start, end = end, source.latestOffset(end, all_available())
            assert end[topic]["0"] == start[topic]["0"] + 1
            assert "list_topics" not in admin.events, "the partitions are listed again"
            assert admin.round_trips() == 1, admin.events
    finally:
        source.stop()
