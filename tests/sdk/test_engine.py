"""The parallel consumer on a real broker: ordering, failures, back-pressure, shutdown."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from demo._local import LocalRedis
from sdk import (
    Hooks,
    Options,
    OptionsError,
    Ordering,
    ParallelConsumer,
    Record,
    RetriableError,
    TerminalError,
)
from tests.sdk.engine_support import (
    CONSUMER,
    FedSource,
    Recorder,
    read_all,
    start_engine,
    wait_committed,
)
from tests.support import Kafka, unique, wait_until


def keyed(partition: int, i: int) -> bytes:
    return f"k{i % 5}".encode()


# ---- options ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"ordering": "sideways"}, "ordering"),
        ({"batch_size": 0}, "batch_size"),
        ({"process_delay": -1}, "process_delay"),
        ({"commit_interval": 0}, "commit_interval"),
        ({"commit_when_idle": "yes"}, "commit_when_idle: must be True or False"),
        ({"max_attempts": 3}, "dead_letter_topic"),
        ({"on_decode_error": "dead_letter"}, "dead_letter_topic"),
        ({"offset_map_store": "redis"}, "offset_map_redis_url"),
        ({"null_keys": "maybe"}, "null_keys"),
        ({"retry_delay": 5}, "retry_delay"),
    ],
)
def test_invalid_options_name_the_option(options: dict, fragment: str) -> None:
    with pytest.raises(OptionsError, match=fragment):
        Options(**options)


def test_invalid_consumer_arguments() -> None:
    with pytest.raises(OptionsError, match=r"group\.id"):
        ParallelConsumer({"bootstrap.servers": "x"}, ["t"], print)
    with pytest.raises(OptionsError, match=r"enable\.auto\.commit"):
        ParallelConsumer({"group.id": "g", "enable.auto.commit": True}, ["t"], print)
    with pytest.raises(OptionsError, match="topics"):
        ParallelConsumer({"group.id": "g"}, "t", print)  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="handler"):
        ParallelConsumer({"group.id": "g"}, ["t"], None)  # type: ignore[arg-type]


def test_the_engine_s_fetch_settings_apply_unless_given_and_stay_off_the_producer() -> None:
    """librdkafka's prefetch is cut to 10,000 records a partition (from 100,000) and its
    backoff at a full queue to 20 ms (from 1 s) unless the config says otherwise; neither is
    a producer setting."""
    engine = ParallelConsumer({"group.id": "g"}, ["t"], print, registry=None)
    assert engine.config["queued.min.messages"] == 10_000
    assert engine.config["fetch.queue.backoff.ms"] == 20
    assert not {"queued.min.messages", "fetch.queue.backoff.ms"} & set(engine.producer_config)
    given = {"group.id": "g", "queued.min.messages": 500, "fetch.queue.backoff.ms": 100}
    engine = ParallelConsumer(given, ["t"], print, registry=None)
    assert engine.config["queued.min.messages"] == 500
    assert engine.config["fetch.queue.backoff.ms"] == 100


@pytest.mark.parametrize(("topics", "sole"), [(["t"], "t"), (["t", "u"], None), (["^t.*"], None)])
def test_records_topics_are_read_unless_one_topic_is_subscribed_by_name(
    topics: list[str], sole: str | None
) -> None:
    """Subscribed to one topic by name, every record fetched is of it: the core does not read
    each record's topic. Several topics, or a pattern, and it does."""
    consumer = ParallelConsumer({"group.id": "g"}, topics, print, registry=None)
    assert consumer.core.sole_topic == sole


# ---- ordering ---------------------------------------------------------------------------


@pytest.mark.parametrize("ordering", list(Ordering))
def test_ordering_modes(kafka: Kafka, ordering: Ordering) -> None:
    topic = kafka.create_topic(3)
    kafka.produce(topic, {0: 60, 1: 60, 2: 60}, key=keyed)
    shard_of = {
        Ordering.PARTITION: lambda r: r.partition,
        Ordering.KEY: lambda r: (r.partition, r.raw_key),
        Ordering.UNORDERED: None,
    }[ordering]
    recorder = Recorder(sleep=lambda r: 0.002 * (r.offset % 3), shard_of=shard_of)
    engine = start_engine(
        kafka.bootstrap, topic, recorder, Options(ordering=ordering, max_concurrency=8)
    )
    try:
        wait_until(lambda: len(recorder.done()) == 180, timeout=60, what="all records")
    finally:
        engine.stop()
    assert recorder.overlaps == []
    if ordering is not Ordering.UNORDERED:
        for partition in range(3):
            calls = [c for c in recorder.calls if c.partition == partition]
            by_shard: dict[object, list[int]] = {}
            for call in calls:
                shard = partition if ordering is Ordering.PARTITION else call.key
                by_shard.setdefault(shard, []).append(call.offset)
            for offsets in by_shard.values():
                assert offsets == sorted(offsets), "a shard started out of offset order"
    if ordering is Ordering.UNORDERED:
        peak = max_overlap(recorder)
        assert peak > 1, "unordered records never ran at the same time"
    assert kafka.committed(engine.group, topic, 3) == {0: 60, 1: 60, 2: 60}


def max_overlap(recorder: Recorder) -> int:
    events = sorted([(c.start, 1) for c in recorder.calls] + [(c.end, -1) for c in recorder.calls])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


def test_null_keys_ordered_together_or_not(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 40}, key=lambda p, i: None)
    for policy, expect_overlap in (("ordered", False), ("unordered", True)):
        recorder = Recorder(sleep=lambda r: 0.005)
        options = Options(ordering=Ordering.KEY, max_concurrency=8, null_keys=policy)
        engine = start_engine(kafka.bootstrap, topic, recorder, options)
        try:
            wait_until(lambda r=recorder: len(r.done()) == 40, timeout=60, what=policy)
        finally:
            engine.stop()
        assert (max_overlap(recorder) > 1) is expect_overlap, policy


# ---- failures ---------------------------------------------------------------------------


def test_poison_record_reaches_the_dead_letter_topic_while_other_keys_flow(kafka: Kafka) -> None:
    topic, dlt = kafka.create_topic(1), kafka.create_topic(1)
    kafka.produce(topic, {0: 30}, key=lambda p, i: b"poison" if i == 3 else f"k{i}".encode())
    recorder = Recorder(
        fail=lambda r: ValueError("cannot process") if r.raw_key == b"poison" else None
    )
    options = Options(
        ordering=Ordering.KEY,
        max_concurrency=4,
        max_attempts=3,
        dead_letter_topic=dlt,
        retry_delay=lambda attempt, error: 0.3,
    )
    engine = start_engine(kafka.bootstrap, topic, recorder, options)
    try:
        wait_until(lambda: len(recorder.done()) == 29, timeout=60, what="other keys")
        poison = [c for c in recorder.calls if c.key == b"poison"]
        others_done_at = max(c.end for c in recorder.calls if c.key != b"poison")
        assert len(poison) < 3 or poison[-1].start > min(
            c.start for c in recorder.calls if c.key != b"poison"
        )
        assert others_done_at < poison[-1].end + 0.5 or len(poison) == 3
        wait_until(
            lambda: kafka.committed(engine.group, topic, 1) == {0: 30}, timeout=30, what="commit"
        )
    finally:
        engine.stop()
    assert [c.attempt for c in recorder.calls if c.key == b"poison"] == [1, 2, 3]
    letters = read_all(kafka.bootstrap, dlt, 1, 1)
    assert len(letters) == 1
    headers = dict(letters[0].headers())
    assert headers["dlt.original.topic"] == topic.encode()
    assert headers["dlt.original.partition"] == b"0"
    assert headers["dlt.original.offset"] == b"3"
    assert headers["dlt.attempts"] == b"3"
    assert b"ValueError: cannot process" in headers["dlt.error"]
    assert letters[0].key() == b"poison"
    assert engine.core.counts[(topic, 0)].dead_lettered == 1


def test_retries_then_success_and_terminal_errors_skip(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10}, key=lambda p, i: f"k{i}".encode())
    failures = {2: 2}  # offset 2 fails twice, then succeeds

    def fail(record: Record) -> BaseException | None:
        if record.offset == 5:
            return TerminalError("never")
        if failures.get(record.offset, 0) >= record.attempt:
            return RetriableError("not yet")
        return None

    recorder = Recorder(fail=fail)
    options = Options(
        max_concurrency=4, on_exhausted="skip", max_attempts=5, retry_delay=lambda a, e: 0.05
    )
    engine = start_engine(kafka.bootstrap, topic, recorder, options)
    try:
        wait_until(lambda: len(recorder.done()) == 9, timeout=30, what="records")
        wait_until(
            lambda: kafka.committed(engine.group, topic, 1) == {0: 10}, timeout=30, what="commit"
        )
    finally:
        engine.stop()
    assert [c.attempt for c in recorder.calls if c.offset == 2] == [1, 2, 3]
    assert [c.attempt for c in recorder.calls if c.offset == 5] == [1]
    assert engine.core.counts[(topic, 0)].skipped == 1


def test_a_failing_record_blocks_only_its_partition_in_partition_mode_and_commit_stays_below(
    kafka: Kafka,
) -> None:
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 10, 1: 10})
    recorder = Recorder(
        fail=lambda r: RuntimeError("stuck") if (r.partition, r.offset) == (0, 4) else None
    )
    options = Options(
        ordering=Ordering.PARTITION, retry_delay=lambda a, e: 0.1, commit_interval=0.2
    )
    engine = start_engine(kafka.bootstrap, topic, recorder, options)
    try:
        wait_until(
            lambda: kafka.committed(engine.group, topic, 2) == {1: 10, 0: 4},
            timeout=30,
            what="commits",
        )
        assert {o for p, o in recorder.done() if p == 0} == {0, 1, 2, 3}
        time.sleep(0.5)
        assert kafka.committed(engine.group, topic, 2)[0] == 4  # never passes the failing record
    finally:
        engine.stop(drain=False)


# ---- batches, coroutines, decoding, delay ------------------------------------------------


def test_batch_handler_and_batch_retry(kafka: Kafka) -> None:
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 50, 1: 50}, key=lambda p, i: f"k{i}".encode())
    batches: list[list[tuple[int, int]]] = []
    failed_once = threading.Event()

    def handle(records: list[Record]) -> None:
        batches.append([(r.partition, r.offset) for r in records])
        if not failed_once.is_set() and any(r.offset == 7 for r in records):
            failed_once.set()
            raise RuntimeError("whole batch fails once")

    options = Options(
        ordering=Ordering.KEY, batch_size=10, max_concurrency=2, retry_delay=lambda a, e: 0.05
    )
    engine = start_engine(kafka.bootstrap, topic, handle, options)
    try:
        wait_until(
            lambda: kafka.committed(engine.group, topic, 2) == {0: 50, 1: 50},
            timeout=60,
            what="commits",
        )
    finally:
        engine.stop()
    assert all(1 <= len(b) <= 10 for b in batches)
    assert any(len(b) > 1 for b in batches)
    processed = [rec for b in batches for rec in b]
    assert set(processed) == {(p, o) for p in range(2) for o in range(50)}
    assert len(processed) > 100  # the failed batch's records ran again


def test_coroutine_handlers(kafka: Kafka) -> None:
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 100, 1: 100}, key=lambda p, i: f"k{i % 50}".encode())
    seen: list[tuple[int, int]] = []
    concurrent = {"now": 0, "peak": 0}

    async def handle(record: Record) -> None:
        concurrent["now"] += 1
        concurrent["peak"] = max(concurrent["peak"], concurrent["now"])
        await asyncio.sleep(0.01)
        concurrent["now"] -= 1
        seen.append((record.partition, record.offset))

    engine = start_engine(
        kafka.bootstrap, topic, handle, Options(ordering=Ordering.KEY, max_concurrency=100)
    )
    try:
        wait_until(lambda: len(seen) == 200, timeout=60, what="records")
    finally:
        engine.stop()
    assert concurrent["peak"] > 10
    assert len(set(seen)) == 200


def test_undecodable_records_reach_the_handler_raw_or_the_dead_letter_topic(kafka: Kafka) -> None:
    topic, dlt = kafka.create_topic(1), kafka.create_topic(1)
    producer = kafka.producer()
    for value in (b'{"a": 1}', b"\xff\xfe not json", b'{"a": 3}'):
        producer.produce(topic, value=value, partition=0)
    producer.flush(10)

    got: list[tuple[object, str | None]] = []
    engine = start_engine(
        kafka.bootstrap,
        topic,
        lambda r: got.append((r.value, r.decode_error)),
        Options(value_deserializer=json.loads, max_concurrency=1),
    )
    try:
        wait_until(lambda: len(got) == 3, timeout=30, what="records")
    finally:
        engine.stop()
    assert got[0] == ({"a": 1}, None)
    assert got[1][0] == b"\xff\xfe not json" and "value: UnicodeDecodeError" in (got[1][1] or "")

    got.clear()
    engine = start_engine(
        kafka.bootstrap,
        topic,
        lambda r: got.append((r.value, r.decode_error)),
        Options(
            value_deserializer=json.loads, on_decode_error="dead_letter", dead_letter_topic=dlt
        ),
    )
    try:
        wait_until(
            lambda: kafka.committed(engine.group, topic, 1) == {0: 3}, timeout=30, what="commit"
        )
    finally:
        engine.stop()
    assert [value for value, _ in got] == [{"a": 1}, {"a": 3}]
    letters = read_all(kafka.bootstrap, dlt, 1, 1)
    assert letters[0].value() == b"\xff\xfe not json"
    assert b"DecodeError" in dict(letters[0].headers())["dlt.error"]


def test_process_delay(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    recorder = Recorder()
    engine = start_engine(kafka.bootstrap, topic, recorder, Options(process_delay=1.0))
    try:
        time.sleep(4)  # joined
        produced_at = time.time()
        kafka.produce(topic, {0: 3})
        wait_until(lambda: len(recorder.done()) == 3, timeout=30, what="records")
    finally:
        engine.stop()
    first_start = min(c.start for c in recorder.calls)
    # monotonic vs wall clock: compare durations measured from the same moment instead
    assert all(c.start >= first_start for c in recorder.calls)
    assert time.time() - produced_at >= 1.0
    started_wall = [c.start for c in recorder.calls]
    assert max(started_wall) - min(started_wall) < 1.0


# ---- back-pressure, pause, slow handlers --------------------------------------------------


def test_back_pressure_bounds_held_records_and_pauses(kafka: Kafka) -> None:
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 2000, 1: 2000})
    release = threading.Event()
    count = {"n": 0}

    def handle(record: Record) -> None:
        release.wait(30)
        count["n"] += 1

    options = Options(ordering=Ordering.UNORDERED, max_concurrency=4, max_buffered=100)
    engine = start_engine(kafka.bootstrap, topic, handle, options)
    try:
        wait_until(lambda: engine.stats().get("paused_partitions"), timeout=30, what="pause")
        wait_until(lambda: engine.stats()["held"] >= 100, timeout=10, what="a full buffer")
        held = []
        for _ in range(15):  # through the partitions' stall (and any give-back) after 1 s
            held.append(engine.stats()["held"])
            time.sleep(0.1)
        assert max(held) <= 100 + 1000, held  # the buffer, plus at most one fetch
        release.set()
        wait_until(lambda: count["n"] == 4000, timeout=60, what="all records after release")
    finally:
        release.set()
        engine.stop()


def test_records_behind_a_stalled_head_are_given_back_and_fetched_again(kafka: Kafka) -> None:
    """Partition 0 fills the buffer with one key whose first record waits 6 s for a retry:
    once stalled, it gives back its newest records (a seek back on the paused partition),
    the other partitions flow meanwhile, and after the retry every record of partition 0
    runs once, in order, and is committed."""
    topic = kafka.create_topic(3)
    kafka.produce(topic, {0: 200}, key=lambda p, i: b"a")
    recorder = Recorder(
        fail=lambda r: (
            RetriableError("not yet") if (r.partition, r.offset, r.attempt) == (0, 0, 1) else None
        )
    )
    options = Options(
        ordering=Ordering.KEY,
        max_concurrency=4,
        max_buffered=64,
        retry_delay=lambda attempt, error: 6.0,
        commit_interval=0.2,
    )
    engine = start_engine(kafka.bootstrap, topic, recorder, options)
    tp0 = (topic, 0)
    try:
        wait_until(
            lambda: engine.stats().get("counts", {}).get(tp0, {}).get("given_back", 0) > 0,
            timeout=30,
            what="records given back",
        )
        time.sleep(0.6)  # a fresh snapshot
        assert engine.stats()["partitions"][tp0]["held"] <= 64 // 3
        assert recorder.offsets(0) == [0], "a record behind the waiting head ran"
        kafka.produce(topic, {1: 50, 2: 50})
        wait_until(
            lambda: {(p, o) for p in (1, 2) for o in range(50)} <= recorder.done(),
            timeout=30,
            what="the other partitions",
        )
        wait_until(lambda: len(recorder.offsets(0)) == 201, timeout=60, what="partition 0")
        assert recorder.offsets(0) == [0, *range(200)]
        wait_committed(kafka, engine.group, topic, {0: 200, 1: 50, 2: 50})
    finally:
        engine.stop()


def test_pause_and_resume(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    recorder = Recorder()
    engine = start_engine(kafka.bootstrap, topic, recorder, Options())
    try:
        time.sleep(4)
        engine.pause()
        kafka.produce(topic, {0: 5})
        time.sleep(1.5)
        assert recorder.calls == []
        engine.resume()
        wait_until(lambda: len(recorder.done()) == 5, timeout=20, what="records after resume")
    finally:
        engine.stop()


def test_a_handler_slower_than_max_poll_interval_causes_no_rebalance(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 3})
    assignments: list[float] = []
    recorder = Recorder(sleep=lambda r: 8.0 if r.offset == 1 else 0.0)
    engine = ParallelConsumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": unique("slow"),
            **CONSUMER,
            "max.poll.interval.ms": 6000,
        },
        [topic],
        recorder,
        Options(ordering=Ordering.PARTITION),
        registry=None,
    )
    original = engine._rebalancer.on_assign

    def on_assign(consumer, partitions):  # type: ignore[no-untyped-def]
        assignments.append(time.monotonic())
        original(consumer, partitions)

    engine._rebalancer.on_assign = on_assign  # type: ignore[method-assign]
    engine.start()
    try:
        wait_until(lambda: len(recorder.done()) == 3, timeout=60, what="records")
    finally:
        engine.stop()
    assert len(assignments) == 1, "a rebalance happened"
    assert [c.attempt for c in recorder.calls] == [1, 1, 1]


# ---- shutdown ----------------------------------------------------------------------------


def test_graceful_stop_drains_in_flight_and_commits(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 20}, key=lambda p, i: f"k{i}".encode())
    recorder = Recorder(sleep=lambda r: 0.5)
    engine = start_engine(kafka.bootstrap, topic, recorder, Options(max_concurrency=4))
    wait_until(lambda: len(recorder.calls) >= 4, timeout=30, what="records in flight")
    engine.stop(drain=True, timeout=10)
    finished = recorder.done()
    started = {(c.partition, c.offset) for c in recorder.calls}
    assert started == finished, "a started record did not finish during the graceful stop"
    committed = kafka.committed(engine.group, topic, 1).get(0, 0)
    assert committed == min({o for o in range(20)} - {o for _, o in finished}, default=20)


def test_immediate_stop_commits_only_what_completed(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 20})
    recorder = Recorder(sleep=lambda r: 2.0 if r.offset == 3 else 0.0)
    engine = start_engine(kafka.bootstrap, topic, recorder, Options(ordering=Ordering.PARTITION))
    wait_until(
        lambda: any(c.offset == 3 for c in recorder.calls), timeout=30, what="the slow record"
    )
    engine.stop(drain=False)
    assert kafka.committed(engine.group, topic, 1).get(0) == 3


# ---- offset map, metrics, hooks -----------------------------------------------------------


def test_offset_map_in_redis_skips_completed_records_after_restart(
    kafka: Kafka, local_redis: LocalRedis
) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 30}, key=lambda p, i: f"k{i}".encode())
    group = unique("group")
    block = threading.Event()
    recorder = Recorder(
        fail=lambda r: None, sleep=lambda r: 30.0 if r.offset == 2 and not block.is_set() else 0.0
    )
    options = Options(
        ordering=Ordering.KEY,
        max_concurrency=4,
        offset_map_store="redis",
        offset_map_redis_url=local_redis.url,
        commit_interval=0.2,
    )
    engine = start_engine(kafka.bootstrap, topic, recorder, options, group=group)
    try:
        wait_until(lambda: len(recorder.done()) == 29, timeout=30, what="all but the slow record")
        time.sleep(1.0)  # a commit with the offset map
        assert engine.stats()["offset_map_store"] == "redis"
    finally:
        block.set()
        engine.stop(drain=False)
    assert kafka.committed(group, topic, 1) == {0: 2}
    second = Recorder()
    engine = start_engine(kafka.bootstrap, topic, second, options, group=group)
    try:
        wait_until(
            lambda: kafka.committed(group, topic, 1) == {0: 30},
            timeout=30,
            what="commit after restart",
        )
    finally:
        engine.stop()
    assert [c.offset for c in second.calls] == [2], "completed records were processed again"


def test_metrics_and_hooks(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10})
    events: list[str] = []
    commits: list[dict] = []
    hooks = Hooks(
        before_handle=lambda r: events.append(f"before {r.offset}"),
        after_handle=lambda r: events.append(f"after {r.offset}"),
        on_failure=lambda r, e: events.append(f"failure {r.offset}"),
        on_commit=commits.append,
    )
    registry = CollectorRegistry()
    engine = ParallelConsumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": unique("metrics"), **CONSUMER},
        [topic],
        Recorder(
            fail=lambda r: RetriableError("once") if r.offset == 4 and r.attempt == 1 else None
        ),
        Options(hooks=hooks, retry_delay=lambda a, e: 0.01, commit_interval=0.2),
        registry=registry,
    ).start()
    try:
        wait_until(
            lambda: any(c.get((topic, 0)) == 10 for c in commits), timeout=30, what="commit hook"
        )
        time.sleep(0.6)  # stats refresh
        text = generate_latest(registry).decode()
    finally:
        engine.stop()
    assert "before 0" in events and "after 9" in events and "failure 4" in events
    assert (
        f'sdk_processed_records_total{{group="{engine.group}",partition="0",topic="{topic}"}} 10.0'
        in text
    )
    assert (
        f'sdk_retried_records_total{{group="{engine.group}",partition="0",topic="{topic}"}} 1.0'
        in text
    )
    assert (
        f'sdk_committed_offset{{group="{engine.group}",partition="0",topic="{topic}"}} 10.0' in text
    )
    assert "sdk_handler_seconds_bucket" in text


def test_a_handler_raising_anything_never_kills_a_worker(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 6})

    def fail(record: Record) -> BaseException | None:
        if record.attempt > 1:
            return None
        return [SystemExit(3), KeyboardInterrupt(), MemoryError(), ValueError("x"), None, None][
            record.offset
        ]

    recorder = Recorder(fail=fail)
    engine = start_engine(
        kafka.bootstrap, topic, recorder, Options(max_concurrency=1, retry_delay=lambda a, e: 0.01)
    )
    try:
        wait_until(lambda: len(recorder.done()) == 6, timeout=30, what="every record after retries")
    finally:
        engine.stop()
    assert sorted(c.offset for c in recorder.calls if c.attempt == 2) == [0, 1, 2, 3]


# ---- combined conditions ------------------------------------------------------------------


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_partitions_paused_behind_a_closed_gate_flow_after_rebalances(
    kafka: Kafka, assignor: str
) -> None:
    """Paused for back-pressure (the gate is closed and the shares are full), revoked and
    assigned again by two rebalances: once the gate opens, everything flows."""
    from confluent_kafka import Consumer

    from sdk import Gate

    if assignor == "cooperative-sticky" and not kafka.broker.cooperative_rebalances:
        pytest.skip(f"{kafka.broker.name}: cooperative-sticky rebalances hang in most tries")
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 100, 1: 100}, key=keyed)
    source = FedSource()
    gate = Gate("g", source)
    source_gate = gate.start()
    source.send(1, {(topic, 0): 0, (topic, 1): 0})
    recorder = Recorder()
    group = unique("paused")
    config = {**CONSUMER, "partition.assignment.strategy": assignor}
    engine = ParallelConsumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": group, **config},
        [topic],
        recorder,
        Options(max_buffered=20),
        gate=source_gate,
        registry=None,
    )
    assignments: list[int] = []
    original = engine._rebalancer.on_assign
    engine._rebalancer.on_assign = lambda c, p: (assignments.append(len(p)), original(c, p))  # type: ignore[method-assign]
    engine.start()
    other = None
    try:
        wait_until(
            lambda: len(engine.stats().get("paused_partitions", [])) == 2,
            timeout=30,
            what="both partitions paused behind the closed gate",
        )
        other = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, **config})
        other.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(assignments) < 2 and time.monotonic() < deadline:
            other.poll(0.1)
        assert len(assignments) >= 2, "the second member caused no rebalance"
        other.close()
        other = None
        wait_until(lambda: len(assignments) >= 3, timeout=30, what="the partitions returning")
        wait_until(lambda: len(engine.core.partitions) == 2, timeout=30, what="both back")
        source.send(2, {(topic, 0): 100, (topic, 1): 100})
        wait_until(lambda: len(recorder.done()) == 200, timeout=60, what="every record")
    finally:
        if other is not None:
            other.close()
        engine.stop()
        gate.stop()
    assert kafka.committed(group, topic, 2) == {0: 100, 1: 100}


def test_a_terminal_failure_with_the_default_options_is_held_not_lost(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 10}, key=lambda p, i: f"k{i}".encode())
    recorder = Recorder(fail=lambda r: TerminalError("no") if r.offset == 3 else None)
    registry = CollectorRegistry()
    engine = ParallelConsumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": unique("held"), **CONSUMER},
        [topic],
        recorder,
        Options(commit_interval=0.2),
        registry=registry,
    ).start()
    try:
        wait_until(lambda: len(recorder.done()) == 9, timeout=30, what="the other records")
        wait_until(lambda: engine.stats().get("stuck") == 1, timeout=10, what="reported")
        time.sleep(0.6)
        assert kafka.committed(engine.group, topic, 1) == {0: 3}
        text = generate_latest(registry).decode()
        assert f'sdk_stuck_records{{group="{engine.group}"}} 1.0' in text
    finally:
        engine.stop()
    assert kafka.committed(engine.group, topic, 1) == {0: 3}


def test_a_coroutine_raising_cancelled_error_is_retried(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 5})
    seen: list[tuple[int, int]] = []

    async def handle(record: Record) -> None:
        seen.append((record.offset, record.attempt))
        if record.offset == 2 and record.attempt == 1:
            raise asyncio.CancelledError()

    engine = start_engine(
        kafka.bootstrap,
        topic,
        handle,
        Options(ordering=Ordering.PARTITION, retry_delay=lambda a, e: 0.05),
    )
    try:
        wait_until(
            lambda: kafka.committed(engine.group, topic, 1) == {0: 5}, timeout=30, what="commit"
        )
    finally:
        engine.stop(timeout=5)
    assert (2, 2) in seen


def test_offset_maps_go_in_the_commit_metadata_where_the_broker_keeps_it(kafka: Kafka) -> None:
    """With the default store ("auto"): on a broker that keeps commit metadata the map rides
    with the commit and a restart skips what completed; elsewhere, plain replay."""
    from confluent_kafka import Consumer, TopicPartition

    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 30}, key=lambda p, i: f"k{i}".encode())
    group = unique("group")
    block = threading.Event()
    first = Recorder(sleep=lambda r: 30.0 if r.offset == 2 and not block.is_set() else 0.0)
    options = Options(ordering=Ordering.KEY, max_concurrency=4, commit_interval=0.2)
    engine = start_engine(kafka.bootstrap, topic, first, options, group=group)
    try:
        wait_until(lambda: len(first.done()) == 29, timeout=30, what="all but the slow record")
        time.sleep(1.0)  # a commit with the offset map
        store = engine.stats()["offset_map_store"]
    finally:
        block.set()
        engine.stop(drain=False)
    expected = "kafka" if kafka.broker.keeps_metadata else "none"
    assert store == expected
    reader = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    try:
        (found,) = reader.committed([TopicPartition(topic, 0)], timeout=10)
    finally:
        reader.close()
    assert found.offset == 2
    if kafka.broker.keeps_metadata:
        assert (found.metadata or "").startswith("om1:2:")
    second = Recorder()
    engine = start_engine(kafka.bootstrap, topic, second, options, group=group)
    try:
        wait_until(
            lambda: kafka.committed(group, topic, 1) == {0: 30}, timeout=30, what="the restart"
        )
    finally:
        engine.stop()
    replayed = sorted(c.offset for c in second.calls)
    assert replayed == ([2] if kafka.broker.keeps_metadata else list(range(2, 30)))


def test_an_unreachable_broker_is_a_line_not_a_flood(caplog: pytest.LogCaptureFixture) -> None:
    from demo._local import free_port

    caplog.set_level("INFO")
    engine = ParallelConsumer(
        {"bootstrap.servers": f"127.0.0.1:{free_port()}", "group.id": unique("nowhere")},
        ["t"],
        print,
        registry=None,
    ).start()
    try:
        time.sleep(8)
    finally:
        engine.stop(timeout=5)
    kafka_lines = [r.getMessage() for r in caplog.records if r.name.startswith("sdk.kafka")]
    assert 1 <= len(kafka_lines) <= 4, kafka_lines
    assert "unreachable: connection refused" in kafka_lines[0]
    assert len(caplog.records) <= 12, [r.getMessage() for r in caplog.records]
