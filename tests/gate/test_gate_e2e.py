"""The gate on a real broker and a real Redis: the article's worked example and outages."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, cast

import httpx
import pytest
import redis
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions

from demo._local import LocalBroker, LocalRedis, LocalServiceError
from gate import (
    GateService,
    Snapshot,
    parse_config,
    snapshot_from_hash,
    updates_channel,
    watermarks_key,
)
from gate.serve._serve import ServedGate
from tests.support import Broker, Kafka, gate_config, serve_gate, unique, wait_until

ARTICLE_B = {0: 30, 1: 30, 2: 10}
ARTICLE_C = {0: 23, 1: 52, 2: 15}


def watermarks(url: str, gate: str) -> dict | None:
    response = httpx.get(f"{url}/watermarks/{gate}", timeout=5)
    return response.json() if response.status_code == 200 else None


def released_map(url: str, gate: str, topic: str) -> dict[str, int | None] | None:
    body = watermarks(url, gate)
    return body["topics"].get(topic) if body else None


def test_article_example_end_to_end(kafka: Kafka, redis_url: str) -> None:
    topic = kafka.create_topic(3)
    cg_b, cg_c = unique("CG-B"), unique("CG-C")
    kafka.produce(topic, {0: 60, 1: 60, 2: 60})
    kafka.commit(cg_b, topic, ARTICLE_B)
    kafka.commit(cg_c, topic, ARTICLE_C)
    config = gate_config(
        kafka.bootstrap,
        {"service-a": {"topics": [topic], "depends_on": [cg_b, cg_c]}},
        redis_url=redis_url,
        poll_interval_ms=100,
    )
    assert config.redis is not None
    prefix = config.redis.prefix
    client = redis.Redis.from_url(redis_url)
    with serve_gate(config) as gate:
        url = gate.url
        wait_until(lambda: released_map(url, "service-a", topic), what="first snapshot")
        assert released_map(url, "service-a", topic) == {"0": 23, "1": 30, "2": 10}

        params = {"gate": "service-a", "topic": topic, "partition": 0}
        yes = httpx.get(f"{url}/ready", params={**params, "offset": 22})
        assert yes.status_code == 200 and yes.json()["ready"] is True
        no = httpx.get(f"{url}/ready", params={**params, "offset": 23})
        assert no.status_code == 425 and no.json()["ready"] is False
        assert [(b["group"], b["committed"], b["behind_by"]) for b in no.json()["behind"]] == [
            (cg_c, 23, 1)
        ]

        stored = wait_until(
            lambda: snapshot_from_hash(client.hgetall(watermarks_key(prefix, "service-a"))),
            what="redis hash",
        )
        assert {p: w for (t, p), w in stored.watermarks.items()} == {0: 23, 1: 30, 2: 10}

        # Watchers of every kind, started before CG-C moves on.
        sse_events: list[dict] = []
        long_poll: dict = {}
        pubsub = client.pubsub()
        pubsub.subscribe(updates_channel(prefix, "service-a"))

        def follow_stream() -> None:
            with httpx.stream("GET", f"{url}/watermarks/service-a/stream", timeout=30) as response:
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        sse_events.append(json.loads(line[5:]))
                        if sse_events[-1]["topics"][topic]["0"] == 30:
                            return

        def wait_released() -> None:
            response = httpx.get(
                f"{url}/ready", params={**params, "offset": 25, "wait": 20}, timeout=30
            )
            long_poll.update(status=response.status_code, body=response.json(), at=time.time())

        threads = [threading.Thread(target=follow_stream), threading.Thread(target=wait_released)]
        for thread in threads:
            thread.start()
        wait_until(lambda: sse_events, what="first SSE event")
        kafka.commit(cg_c, topic, {0: 40})
        committed_at = time.time()
        for thread in threads:
            thread.join(30)

        assert sse_events[-1]["topics"][topic] == {"0": 30, "1": 30, "2": 10}
        assert long_poll["status"] == 200 and long_poll["body"]["watermark"] == 30
        # Every poll that started after the commit completed reports it.
        after = [e for e in sse_events if _epoch(e["polled_at"]) > committed_at]
        assert all(e["topics"][topic]["0"] == 30 for e in after)

        message = wait_until(
            lambda: _next_update(pubsub, topic, 30), timeout=10, what="pub/sub update"
        )
        assert message["topics"][topic]["0"] == 30
        stored = snapshot_from_hash(client.hgetall(watermarks_key(prefix, "service-a")))
        assert stored is not None and stored.watermarks[(topic, 0)] == 30
        pubsub.close()


def _epoch(iso: str) -> float:
    from gate.evaluate._watermark import parse_time

    return parse_time(iso)


def _next_update(pubsub, topic: str, wanted: int) -> dict | None:
    message = pubsub.get_message(timeout=0.5)
    if message and message["type"] == "message":
        body = json.loads(message["data"])
        if body["topics"][topic]["0"] == wanted:
            return body
    return None


def test_rewind_deleted_group_and_late_topic(kafka: Kafka) -> None:
    topic = kafka.create_topic(2)
    late_topic = unique("late")
    cg_b, cg_c = unique("CG-B"), unique("CG-C")
    kafka.produce(topic, {0: 50, 1: 50})
    kafka.commit(cg_b, topic, {0: 40, 1: 40})
    kafka.commit(cg_c, topic, {0: 45, 1: 45})
    config = gate_config(
        kafka.bootstrap,
        {"a": {"topics": [topic, late_topic], "depends_on": [cg_b, cg_c]}},
        metadata_interval_ms=100,
    )
    with serve_gate(config) as gate:
        url = gate.url
        wait_until(lambda: released_map(url, "a", topic) == {"0": 40, "1": 40}, what="initial")
        early = httpx.get(
            f"{url}/ready", params={"gate": "a", "topic": late_topic, "partition": 0, "offset": 0}
        )
        assert early.status_code == 425 and "does not exist" in early.json()["reason"]

        kafka.commit(cg_b, topic, {0: 10})  # rewind: the watermark follows it down
        wait_until(lambda: released_map(url, "a", topic) == {"0": 10, "1": 40}, what="rewind")
        metrics = httpx.get(f"{url}/metrics").text
        assert f'gate_rewinds_total{{gate="a",group="{cg_b}"}} 1.0' in metrics
        status = httpx.get(f"{url}/status/a").json()
        assert {p["partition"]: p["groups"][cg_b]["status"] for p in status["partitions"]}[
            0
        ] == "REWOUND"

        deleted = kafka.admin.delete_consumer_groups([cg_c])
        for future in deleted.values():
            future.result(10)
        wait_until(
            lambda: released_map(url, "a", topic) == {"0": None, "1": None}, what="group deleted"
        )
        metrics = httpx.get(f"{url}/metrics").text
        assert f'gate_dependency_missing_partitions{{gate="a",group="{cg_c}"}} 2.0' in metrics
        assert f'gate_dependency_offsets_lost_total{{gate="a",group="{cg_c}"}} 2.0' in metrics

        kafka.create_topic(1, name=late_topic)
        kafka.commit(cg_b, late_topic, {0: 3})
        kafka.commit(cg_c, late_topic, {0: 5})
        wait_until(
            lambda: released_map(url, "a", late_topic) == {"0": 3}, what="late topic picked up"
        )


def test_added_partitions_are_picked_up(kafka: Kafka) -> None:
    if not kafka.broker.adds_partitions:
        pytest.skip(f"{kafka.broker.name} cannot add partitions (no CreatePartitions)")
    topic = kafka.create_topic(1)
    cg = unique("CG")
    kafka.commit(cg, topic, {0: 5})
    config = gate_config(
        kafka.bootstrap, {"a": {"topics": [topic], "depends_on": [cg]}}, metadata_interval_ms=100
    )
    with serve_gate(config) as gate:
        wait_until(lambda: released_map(gate.url, "a", topic) == {"0": 5}, what="first partition")
        for future in kafka.admin.create_partitions([NewPartitions(topic, 2)]).values():
            future.result(10)
        wait_until(
            lambda: released_map(gate.url, "a", topic) == {"0": 5, "1": None}, what="new partition"
        )
        kafka.commit(cg, topic, {0: 5, 1: 2})
        wait_until(
            lambda: released_map(gate.url, "a", topic) == {"0": 5, "1": 2},
            what="the new partition released once the dependency commits there",
        )


def test_kafka_outage_keeps_the_last_snapshot_and_recovers(local_broker: LocalBroker) -> None:
    kafka = Kafka(local_broker.bootstrap)
    topic = kafka.create_topic(1)
    kafka.commit("b", topic, {0: 7})
    config = gate_config(
        local_broker.bootstrap,
        {"a": {"topics": [topic], "depends_on": ["b"]}},
        request_timeout_ms=300,
        readiness_max_age_ms=1000,
    )
    with serve_gate(config) as gate:
        url = gate.url
        wait_until(lambda: released_map(url, "a", topic) == {"0": 7}, what="first snapshot")
        events: list[str] = []  # a status page following the gate through the outage
        stop = threading.Event()
        follower = threading.Thread(
            target=follow_status, args=(f"{url}/status/a/stream", events, stop), daemon=True
        )
        follower.start()
        wait_until(lambda: events, what="the stream's first status")
        local_broker.suspend()
        try:
            wait_until(
                lambda: httpx.get(f"{url}/readyz").status_code == 503, timeout=15, what="not ready"
            )
            body = watermarks(url, "a")
            assert body is not None and body["topics"][topic] == {"0": 7}
            assert body["age_s"] >= 1.0
            assert (
                httpx.get(
                    f"{url}/ready",
                    params={"gate": "a", "topic": topic, "partition": 0, "offset": 6},
                ).status_code
                == 200
            )
            errors = httpx.get(f"{url}/status").json()["last_poll"]["errors"]
            assert errors
            # /readyz says why the cluster has not answered: what the last poll met.
            detail = httpx.get(f"{url}/readyz").json()["detail"]
            assert detail.startswith("the cluster has not answered for"), detail
            assert "(the last poll: " in detail, detail
            # The verdict no longer passes the last snapshot's off as news, on the stream too.
            verdict = httpx.get(f"{url}/status/a").json()["verdict"]
            assert verdict["state"] == "unknown", verdict
            assert verdict["text"].startswith("unknown: no poll has succeeded for"), verdict
            wait_until(
                lambda: any('"state":"unknown"' in data for data in events),
                timeout=10,
                what="the stream following the gate to say unknown",
            )
        finally:
            local_broker.resume()
        wait_until(
            lambda: httpx.get(f"{url}/readyz").status_code == 200, timeout=20, what="recovered"
        )
        assert httpx.get(f"{url}/status/a").json()["verdict"]["state"] != "unknown"
        stop.set()
        follower.join(10)
        kafka.commit("b", topic, {0: 9})
        wait_until(lambda: released_map(url, "a", topic) == {"0": 9}, timeout=20, what="fresh data")
        assert "gate_poll_errors_total" in httpx.get(f"{url}/metrics").text


class RefusingAdmin:
    """The cluster's admin client, except that the cluster refuses to read the offsets of
    some groups (as it does for groups an ACL does not cover)."""

    def __init__(self, bootstrap: str, refused: set[str]) -> None:
        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        self.refused = refused

    def list_consumer_group_offsets(
        self, requests: list[ConsumerGroupTopicPartitions], **options: Any
    ) -> dict[str, Future[Any]]:
        group = requests[0].group_id
        if group not in self.refused:
            return self._admin.list_consumer_group_offsets(requests, **options)
        refused: Future[Any] = Future()
        refused.set_exception(KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)))
        return {group: refused}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._admin, name)


def test_one_gate_failing_to_read_leaves_the_others_served_and_the_service_ready(
    kafka: Kafka,
) -> None:
    """Gate x's dependency group cannot be read and gate m's topic does not exist: gate a is
    still served fresh snapshots, and the service stays ready long past the readiness limit;
    x and m say what is wrong in their own answers, status and metrics."""
    topic, other = kafka.create_topic(1), kafka.create_topic(1)
    cg_b, cg_x = unique("CG-B"), unique("CG-X")
    kafka.produce(topic, {0: 10})
    kafka.commit(cg_b, topic, {0: 5})
    kafka.commit(cg_x, other, {0: 5})
    config = gate_config(
        kafka.bootstrap,
        {
            "a": {"topics": [topic], "depends_on": [cg_b]},
            "x": {"topics": [other], "depends_on": [cg_x]},
            "m": {"topics": [unique("missing")], "depends_on": [cg_b]},
        },
        readiness_max_age_ms=500,
    )
    admin = RefusingAdmin(kafka.bootstrap, {cg_x})
    with ServedGate(GateService(config, admin=cast(AdminClient, admin))) as gate:
        url = gate.url
        first = wait_until(lambda: watermarks(url, "a"), what="gate a's first snapshot")
        wait_until(
            lambda: watermarks(url, "a")["version"] > first["version"] + 1500,  # type: ignore[index]
            timeout=20,
            what="gate a polled for three readiness limits",
        )
        probe = httpx.get(f"{url}/readyz")
        assert probe.status_code == 200, probe.json()
        status = httpx.get(f"{url}/status").json()
        assert status["ready"] is True and status["gates"]["x"] is None
        assert status["failing"]["x"][0].startswith(f"group {cg_x}: ")
        assert set(status["failing"]) == {"x"}
        assert status["gates"]["m"]["missing_topics"] and status["gates"]["a"]["errors"] == []
        x = httpx.get(
            f"{url}/ready", params={"gate": "x", "topic": other, "partition": 0, "offset": 0}
        )
        assert x.status_code == 425 and cg_x in x.json()["reason"]
        metrics = httpx.get(f"{url}/metrics").text
        assert 'gate_read_failing{gate="x"} 1.0' in metrics
        assert 'gate_read_failing{gate="a"} 0.0' in metrics
        kafka.commit(cg_b, topic, {0: 8})
        wait_until(lambda: released_map(url, "a", topic) == {"0": 8}, what="gate a moving on")
        admin.refused.clear()
        wait_until(lambda: released_map(url, "x", other) == {"0": 5}, what="gate x recovered")
        assert httpx.get(f"{url}/status").json()["failing"] == {}


def follow_status(url: str, events: list[str], stop: threading.Event) -> None:
    """Collect the data of a server-sent event stream's ``status`` events until ``stop``."""
    with contextlib.suppress(httpx.HTTPError), httpx.stream("GET", url, timeout=30) as response:
        event = None
        for line in response.iter_lines():
            if stop.is_set():
                return
            if line.startswith("event:"):
                event = line.partition(":")[2].strip()
            elif line.startswith("data:") and event == "status":
                events.append(line.partition(":")[2])


def test_redis_outage_and_restart_republishes(kafka: Kafka, local_redis: LocalRedis) -> None:
    topic = kafka.create_topic(1)
    group = unique("CG")
    kafka.commit(group, topic, {0: 3})
    config = gate_config(
        kafka.bootstrap,
        {"a": {"topics": [topic], "depends_on": [group]}},
        redis_url=local_redis.url,
    )
    assert config.redis is not None
    key = watermarks_key(config.redis.prefix, "a")

    def stored() -> dict | None:
        try:
            snapshot = snapshot_from_hash(redis.Redis.from_url(local_redis.url).hgetall(key))
        except redis.RedisError:
            return None
        return None if snapshot is None else {p: w for (_, p), w in snapshot.watermarks.items()}

    with serve_gate(config) as gate:
        wait_until(lambda: stored() == {0: 3}, what="first write")
        local_redis.kill()
        kafka.commit(group, topic, {0: 8})
        wait_until(
            lambda: released_map(gate.url, "a", topic) == {"0": 8}, what="HTTP keeps working"
        )
        wait_until(
            lambda: "gate_redis_healthy 0.0" in httpx.get(f"{gate.url}/metrics").text,
            what="unhealthy",
        )
        local_redis.start()  # same port, empty memory
        wait_until(lambda: stored() == {0: 8}, timeout=20, what="republished after restart")
        assert "gate_redis_healthy 1.0" in httpx.get(f"{gate.url}/metrics").text


def test_a_redis_password_from_the_environment_authenticates(kafka: Kafka) -> None:
    server = LocalRedis(password="s3cret-pass")
    try:
        server.start()
    except LocalServiceError as exc:
        pytest.skip(f"needs a local redis-server process: {exc}")
    try:
        topic = kafka.create_topic(1)
        group = unique("CG")
        kafka.commit(group, topic, {0: 5})
        bare_url = server.url.replace(":s3cret-pass@", "")
        assert bare_url != server.url
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(bare_url).ping()
        config = parse_config(
            {
                "kafka": {"bootstrap.servers": kafka.bootstrap},
                "poll_interval_ms": 50,
                "gates": {"a": {"topics": [topic], "depends_on": [group]}},
                "http": {"port": 0},
                "redis": {"url": bare_url},
            },
            env={"GATE_REDIS_PASSWORD": "s3cret-pass"},
        )
        assert config.redis is not None
        key = watermarks_key(config.redis.prefix, "a")
        client = redis.Redis.from_url(server.url)
        with serve_gate(config) as gate:
            wait_until(lambda: client.hget(key, f"{topic}:0") == b"5", what="authenticated write")
            metrics = httpx.get(f"{gate.url}/metrics").text
        assert "gate_redis_healthy 1.0" in metrics
        assert "s3cret-pass" not in metrics
    finally:
        server.close()


def test_several_replicas_publish_one_increasing_sequence(kafka: Kafka, redis_url: str) -> None:
    topic = kafka.create_topic(2)
    group = unique("CG")
    kafka.commit(group, topic, {0: 1, 1: 1})
    config = gate_config(
        kafka.bootstrap,
        {"a": {"topics": [topic], "depends_on": [group]}},
        redis_url=redis_url,
        poll_interval_ms=20,
        heartbeat_ms=100,
    )
    assert config.redis is not None
    client = redis.Redis.from_url(redis_url)
    pubsub = client.pubsub()
    pubsub.subscribe(updates_channel(config.redis.prefix, "a"))
    received: list[Snapshot] = []
    committed: list[int] = []
    with serve_gate(config) as first, serve_gate(config) as second:
        replicas = [first.service.redis, second.service.redis]

        def writes() -> list[int]:
            return [replica.writes for replica in replicas]  # type: ignore[union-attr]

        # Commits go on (at least 38 of them) until both replicas have published: on a loaded
        # machine one may start polling a while after the other.
        last, deadline = 1, time.monotonic() + 30
        while last < 39 or (not all(writes()) and time.monotonic() < deadline):
            last += 1
            kafka.commit(group, topic, {0: last, 1: last})
            committed.append(last)
            time.sleep(0.03)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.2)
            if message and message["type"] == "message":
                received.append(Snapshot.from_json(json.loads(message["data"])))
                if received[-1].watermark(topic, 0) == last:
                    break
        published = writes()
    assert received and received[-1].watermark(topic, 0) == last
    versions = [s.version for s in received]
    assert versions == sorted(set(versions)), "versions must strictly increase"
    released = [s.watermark(topic, 0) or 0 for s in received]
    assert released == sorted(released), "a replica published an older watermark over a newer"
    assert all(w <= last for w in released)
    assert all(count > 0 for count in published), f"both replicas publish: {published}"


def test_an_aborted_admin_client_costs_one_poll(kafka: Kafka) -> None:
    """librdkafka's admin client may abort its process when a coordinator connection drops
    mid-request: the poller runs it in a child process, reports that poll as failed (the last
    snapshot stays) and polls again with a new one."""
    import os
    import signal

    from gate.poll._isolated import IsolatedPoller

    topic = kafka.create_topic(1)
    group = unique("CG")
    kafka.commit(group, topic, {0: 7})
    poller = IsolatedPoller({"bootstrap.servers": kafka.bootstrap}, {group: [topic]})
    try:
        first = poller.poll()
        assert first.committed[group] == {(topic, 0): 7} and not first.errors
        assert poller.pid is not None
        os.kill(poller.pid, signal.SIGABRT)  # what librdkafka's assertion does
        time.sleep(0.5)
        failed = poller.poll()
        assert failed.failed_groups == {group} and "process ended" in failed.errors[0]
        assert not failed.answered and first.answered
        again = poller.poll()
        assert again.committed[group] == {(topic, 0): 7} and poller.restarts == 1
    finally:
        poller.close()


def test_a_slow_admin_client_is_waited_for_and_a_hung_one_replaced(
    kafka: Kafka, caplog: pytest.LogCaptureFixture
) -> None:
    """A child that runs but does not answer in time (here stopped; on a machine short of
    CPU, a child at a lower priority) is slow, not gone: that poll fails ("not answered
    yet"), the next one waits for the same answer instead of asking a new child to start from
    nothing, and the answer, when it comes, is used. Only a child that lets ``patience`` waits
    pass in a row is replaced."""
    import os
    import signal

    from gate.poll._isolated import IsolatedPoller

    topic = kafka.create_topic(1)
    group = unique("CG")
    kafka.commit(group, topic, {0: 7})
    caplog.set_level(logging.INFO, "gate.poller")
    poller = IsolatedPoller(
        {"bootstrap.servers": kafka.bootstrap}, {group: [topic]}, answer_wait=1.5, patience=3
    )
    child = None
    try:
        assert poller.poll().committed[group] == {(topic, 0): 7}
        child = poller.pid
        assert child is not None
        os.kill(child, signal.SIGSTOP)
        kafka.commit(group, topic, {0: 9})
        late = poller.poll()
        assert not late.answered and late.failed_groups == {group}
        assert late.errors == ("admin client: its process has not answered yet; waiting",)
        assert poller.record_times([]) == {} and poller.pid == child
        os.kill(child, signal.SIGCONT)
        answered = poller.poll()  # the answer to the poll asked before
        assert answered.answered and answered.committed[group] == {(topic, 0): 9}
        assert answered.started_at == late.started_at  # its age counts from when it was asked
        assert poller.pid == child and poller.restarts == 0
        assert poller.poll().committed[group] == {(topic, 0): 9}  # asked afresh

        os.kill(child, signal.SIGSTOP)
        errors = [poller.poll().errors for _ in range(3)]
        assert errors[:2] == [("admin client: its process has not answered yet; waiting",)] * 2
        assert "gave no answer in" in errors[2][0] and "replaced" in errors[2][0]
        assert poller.restarts == 1 and poller.pid is None
        again = poller.poll()
        assert again.answered and again.committed[group] == {(topic, 0): 9}
        assert poller.pid not in (None, child)
    finally:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGCONT)
        poller.close()
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "gate.poller"]
    assert [level for level, m in said if "has not answered a poll" in m] == [
        "WARNING",  # once for each late answer
        "WARNING",
        "ERROR",  # replaced
    ]
    assert any(level == "INFO" and "answered the poll asked" in m for level, m in said)


def test_polls_through_the_child_process_stay_incremental(kafka: Kafka) -> None:
    """The isolated poller times its polls on this process's clocks, read together: the
    offset between the wall and monotonic clocks stays steady from poll to poll, so the
    evaluation does not start afresh at every poll (it did when the child's wall clock, read
    a pipe's latency later, was taken). The child sends only the groups whose offsets
    changed."""
    from gate import GateEvaluator
    from gate.poll._isolated import IsolatedPoller

    topic = kafka.create_topic(2)
    groups = [unique("CG") for _ in range(3)]
    for group in groups:
        kafka.commit(group, topic, {0: 0, 1: 0})
    poller = IsolatedPoller({"bootstrap.servers": kafka.bootstrap}, {g: [topic] for g in groups})
    evaluator = GateEvaluator("a", [topic], groups)
    try:
        polls = [poller.poll() for _ in range(12)]
        kafka.produce(topic, {0: 5})
        kafka.commit(groups[0], topic, {0: 5, 1: 0})
        moved = poller.poll()
    finally:
        poller.close()
    shifts = [p.started_at - p.monotonic for p in polls if p.monotonic is not None]
    assert len(shifts) == 12 and max(shifts) - min(shifts) < 0.005
    assert all(p.finished_at >= p.started_at for p in polls)
    evaluated = [evaluator.observe(p).evaluated for p in polls]
    assert evaluated[0] == 3 and evaluated[1:] == [0] * 11  # caught up on an empty topic
    # Unchanged offsets are not sent again: the same mappings as the first poll's.
    assert all(p.committed[g] is polls[0].committed[g] for p in polls for g in groups)
    assert moved.committed[groups[0]] == {(topic, 0): 5, (topic, 1): 0}
    assert moved.committed[groups[1]] is polls[0].committed[groups[1]]
    assert moved.committed[groups[1]] == {(topic, 0): 0, (topic, 1): 0}


def test_an_admin_client_whose_group_reads_keep_failing_is_replaced(
    local_broker: LocalBroker, broker: Broker
) -> None:
    """After a broker restart librdkafka's admin client may time out on every group read for
    good while metadata still answers: once every group read has failed for three request
    timeouts the poller starts a new client (and says so), and the gate reads the groups
    again."""
    from gate.poll._isolated import IsolatedPoller

    kafka = Kafka(local_broker.bootstrap, broker)
    topic, group = kafka.create_topic(1), unique("CG")
    kafka.commit(group, topic, {0: 7})
    poller = IsolatedPoller(
        {"bootstrap.servers": local_broker.bootstrap}, {group: [topic]},
        request_timeout=0.5, metadata_interval=0.5,
    )  # fmt: skip
    try:
        assert poller.poll().committed[group] == {(topic, 0): 7}
        local_broker.stop()
        errors: list[str] = []
        deadline = time.monotonic() + 20
        while not any("started a new client" in e for e in errors):
            assert time.monotonic() < deadline, f"the admin client was never replaced: {errors}"
            result = poller.poll()
            assert group in result.failed_groups
            errors.extend(result.errors)
        local_broker.start()
        if not local_broker.keeps_data:
            kafka.create_topic(1, name=topic)
            kafka.commit(group, topic, {0: 7})
        deadline = time.monotonic() + 30
        while (result := poller.poll()).committed.get(group) != {(topic, 0): 7}:
            assert time.monotonic() < deadline, f"the groups were not read again: {result.errors}"
            time.sleep(0.2)
    finally:
        poller.close()
