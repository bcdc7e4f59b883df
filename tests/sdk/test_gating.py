"""The gate client: the view's rules, each source against real services, and the wrapper."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

import pytest
import redis as redis_client

from demo._local import LocalRedis, free_port
from gate import GateService, Snapshot, updates_channel, watermarks_key
from gate.publish._redis import snapshot_fields
from gate.serve._serve import ServedGate
from sdk import EmbeddedSource, Gate, GateError, GateTimeout, HttpSource, RedisSource, gated
from sdk.gating._view import SourceState, WatermarkView
from tests.support import Kafka, gate_config, unique, wait_until


def snap(
    version: int, watermarks: dict[int, int | None], gate: str = "a", topic: str = "t"
) -> Snapshot:
    return Snapshot(gate, version, time.time(), {(topic, p): w for p, w in watermarks.items()})


class ListSource:
    """A source fed by the test (for the view's rules, no I/O involved)."""

    def __init__(self) -> None:
        self.state = SourceState("list")
        self.view: WatermarkView | None = None

    def start(self, view: WatermarkView) -> None:
        self.view = view

    def stop(self) -> None:
        pass

    def explain(self, topic: str, partition: int, offset: int) -> None:
        return None

    def send(self, snapshot: Snapshot) -> bool:
        assert self.view is not None
        return self.view.offer(snapshot, self.state)


def test_the_view_keeps_the_newest_snapshot_of_its_own_gate() -> None:
    source = ListSource()
    gate = Gate("a", [source]).start()
    try:
        assert gate.limit("t", 0) == 0  # nothing known: nothing released
        assert source.send(snap(5, {0: 10}))
        assert not source.send(snap(4, {0: 99}))  # older: never applied
        assert not source.send(snap(6, {0: 99}, gate="b"))  # another gate's snapshot
        assert source.state.rejected == {"older version": 1, "wrong gate": 1}
        assert (
            gate.limit("t", 0) == 10 and gate.released("t", 0, 9) and not gate.released("t", 0, 10)
        )
        assert source.send(snap(7, {0: None}))  # group offsets expired: nothing released
        assert gate.limit("t", 0) == 0 and not gate.released("t", 0, 0)
        assert gate.limit("t", 1) == 0  # a partition the gate does not know is held
    finally:
        gate.stop()


def test_ungated_topics_are_never_held() -> None:
    gate = Gate("a", [ListSource()], topics=["t"]).start()
    try:
        assert gate.limit("other", 0) is None
        assert gate.released("other", 0, 10**9)
        assert gate.wait_ready("other", 0, 5, timeout=0)
    finally:
        gate.stop()


def test_wait_ready_and_the_gated_wrapper() -> None:
    source = ListSource()
    gate = Gate("a", [source]).start()
    calls = []

    class Message:
        def __init__(self, offset: int) -> None:
            self._offset = offset

        def topic(self) -> str:
            return "t"

        def partition(self) -> int:
            return 0

        def offset(self) -> int:
            return self._offset

    @gated(gate, timeout=5)
    def handle(message: Message) -> str:
        calls.append(message.offset())
        return "handled"

    @gated(gate, timeout=0.2)
    async def handle_async(message: Message) -> str:
        calls.append(("async", message.offset()))
        return "handled"

    try:
        source.send(snap(1, {0: 3}))
        assert handle(Message(2)) == "handled"
        threading.Timer(0.3, source.send, args=(snap(2, {0: 10}),)).start()
        started = time.monotonic()
        assert handle(Message(7)) == "handled"
        assert time.monotonic() - started >= 0.25
        assert asyncio.run(handle_async(Message(9))) == "handled"
        with pytest.raises(GateTimeout, match=r"t\[0\]@10"):
            asyncio.run(handle_async(Message(10)))
        assert not gate.wait_ready("t", 0, 50, timeout=0.1)
        assert calls == [2, 7, ("async", 9)]
    finally:
        gate.stop()


def test_async_waiters_wake_on_a_newer_snapshot() -> None:
    source = ListSource()
    gate = Gate("a", [source]).start()

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        loop.call_later(
            0.2, lambda: threading.Thread(target=source.send, args=(snap(3, {0: 100}),)).start()
        )
        started = loop.time()
        assert await gate.wait_ready_async("t", 0, 50, timeout=5)
        return loop.time() - started

    try:
        waited = asyncio.run(scenario())
        assert 0.15 < waited < 2
    finally:
        gate.stop()


def test_redis_source_loads_follows_and_rejects_garbage(local_redis: LocalRedis) -> None:
    client = redis_client.Redis.from_url(local_redis.url)
    prefix = unique("p")
    initial = snap(10, {0: 5, 1: None})
    client.hset(
        watermarks_key(prefix, "a"),
        mapping=dict(zip(*[iter(snapshot_fields(initial))] * 2, strict=True)),
    )
    source = RedisSource(local_redis.url, prefix=prefix)
    gate = Gate("a", [source]).start()
    try:
        wait_until(
            lambda: gate.snapshot is not None and gate.snapshot.version == 10,
            what="the hash loaded",
        )
        channel = updates_channel(prefix, "a")
        client.publish(channel, b"{not json")
        client.publish(
            channel, json.dumps({"gate": "a", "version": 11, "polled_at": "x", "topics": {}})
        )
        client.publish(channel, json.dumps(snap(12, {0: 8}).to_json()))
        wait_until(lambda: gate.snapshot.version == 12, what="a newer snapshot")  # type: ignore[union-attr]
        assert source.state.rejected == {"malformed": 2}
        assert gate.limit("t", 0) == 8
    finally:
        gate.stop()


def test_redis_down_at_start_releases_nothing_then_recovers() -> None:
    server = LocalRedis()
    source = RedisSource(server.url, timeout=0.5)
    gate = Gate("a", [source], stale_after=1.0).start()
    try:
        time.sleep(1.5)
        assert gate.snapshot is None and not source.state.up and source.state.error
        assert not gate.released("t", 0, 0)
        wait_until(lambda: gate.stale, timeout=5, what="stale alarm")
        server.start()
        client = redis_client.Redis.from_url(server.url)
        client.publish(updates_channel("gate", "a"), json.dumps(snap(1, {0: 4}).to_json()))
        wait_until(lambda: source.state.up, timeout=15, what="reconnected")
        client.publish(updates_channel("gate", "a"), json.dumps(snap(2, {0: 4}).to_json()))
        wait_until(lambda: gate.released("t", 0, 3), timeout=10, what="released after recovery")
        wait_until(lambda: not gate.stale, timeout=5, what="fresh again")
    finally:
        gate.stop()
        server.close()


def test_http_source_streams_and_names_an_unknown_gate(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    group = unique("dep")
    kafka.commit(group, topic, {0: 6})
    config = gate_config(kafka.bootstrap, {"svc-a": {"topics": [topic], "depends_on": [group]}})
    with ServedGate(GateService(config)) as served:
        good = Gate("svc-a", [HttpSource(served.url)]).start()
        bad_source = HttpSource(served.url, poll_interval=0.2)
        bad = Gate("nope", [bad_source]).start()
        try:
            wait_until(lambda: good.released(topic, 0, 5), timeout=20, what="stream")
            kafka.commit(group, topic, {0: 9})
            wait_until(
                lambda: good.released(topic, 0, 8), timeout=20, what="update over the stream"
            )
            explained = good.explain(topic, 0, 12)
            assert explained["waiting_for"] == [
                {"group": group, "committed": 9, "behind_by": 4, "status": "OK"}
            ]
            wait_until(
                lambda: bad_source.state.error and "unknown gate 'nope'" in bad_source.state.error,
                timeout=10,
                what="error",
            )
            assert bad.snapshot is None
        finally:
            good.stop()
            bad.stop()


def test_http_source_unreachable_keeps_nothing_released() -> None:
    source = HttpSource(f"http://127.0.0.1:{free_port()}", poll_interval=0.1, timeout=0.5)
    gate = Gate("a", [source]).start()
    try:
        time.sleep(1.0)
        assert not source.state.up and source.state.error
        assert gate.limit("t", 0) == 0
    finally:
        gate.stop()


def test_embedded_source_validates_its_arguments() -> None:
    with pytest.raises(GateError, match="depends_on"):
        EmbeddedSource({"bootstrap.servers": "x"}, ["t"], [])
    with pytest.raises(GateError, match="topics"):
        EmbeddedSource({"bootstrap.servers": "x"}, [], ["g"])
    with pytest.raises(GateError, match="sources"):
        Gate("a", [])


class HoldingProxy:
    """A TCP proxy to Redis that can cut its connections and hold new ones unanswered (what
    a client sent waits at the proxy) until released."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.holding = False
        self.held: list[socket.socket] = []
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.holding:
                self.held.append(client)
            else:
                self._join(client)

    def _join(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target))
        self.open += [client, upstream]
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.holding = True
        for connection in self.open:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self.open = []

    def release(self) -> None:
        self.holding = False
        held, self.held = self.held, []
        for client in held:
            self._join(client)

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_redis_source_reloads_the_hash_after_its_subscription_is_cut(
    local_redis: LocalRedis,
) -> None:
    """A snapshot published while the subscription was down is read from the hash as soon as
    it is back, not at the next heartbeat. With retries configured in the URL, redis-py
    reconnects and re-subscribes by itself: nothing but the subscription's confirmation
    tells the source it was ever gone."""
    client = redis_client.Redis.from_url(local_redis.url)
    prefix = unique("p")

    def write(snapshot: Snapshot) -> None:
        client.hset(
            watermarks_key(prefix, "a"),
            mapping=dict(zip(*[iter(snapshot_fields(snapshot))] * 2, strict=True)),
        )
        client.publish(updates_channel(prefix, "a"), json.dumps(snapshot.to_json()))

    write(snap(10, {0: 5}))
    proxy = HoldingProxy(local_redis.port)
    gate = Gate(
        "a", [RedisSource(f"redis://127.0.0.1:{proxy.port}/0?retry_on_timeout=true", prefix=prefix)]
    ).start()
    try:
        wait_until(lambda: gate.snapshot is not None and gate.snapshot.version == 10)
        proxy.cut()
        wait_until(lambda: proxy.held, timeout=10, what="the client reconnecting")
        write(snap(11, {0: 9}))  # published while nobody is subscribed: missed
        proxy.release()
        wait_until(
            lambda: gate.snapshot.version == 11,  # type: ignore[union-attr]
            timeout=5,
            what="the snapshot published while the subscription was down",
        )
        assert gate.limit("t", 0) == 9
    finally:
        gate.stop()
        proxy.close()


def test_embedded_source_passes_callables_through_and_fails_fast_on_bad_config(
    kafka: Kafka,
) -> None:
    topic = kafka.create_topic(1)
    group = unique("dep")
    kafka.commit(group, topic, {0: 4})
    errors: list[object] = []
    source = EmbeddedSource(
        {"bootstrap.servers": kafka.bootstrap, "error_cb": errors.append}, [topic], [group]
    )
    gate = Gate("a", [source]).start()
    try:
        wait_until(lambda: gate.released(topic, 0, 3), timeout=20, what="a snapshot")
        assert source.state.up
    finally:
        gate.stop()
    broken = EmbeddedSource(
        {"bootstrap.servers": kafka.bootstrap, "no.such": "x"}, [topic], [group]
    )
    with pytest.raises(GateError, match=r"invalid Kafka configuration.*no\.such"):
        Gate("a", [broken]).start()


def test_malformed_sources_fail_when_built() -> None:
    with pytest.raises(GateError, match="redis"):
        RedisSource("http://localhost:6379")
    with pytest.raises(GateError, match="http:// or https://"):
        HttpSource("localhost:8080")
    with pytest.raises(GateError, match="http source"):
        HttpSource("http://[::1")


def test_an_unreachable_source_says_last_snapshot_only_when_it_holds_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis refusing connections: before any snapshot the source says it has none yet
    (never "keeping the last snapshot"), and names Redis once."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    source = RedisSource(url, timeout=0.2)
    view = WatermarkView("a")
    with caplog.at_level("WARNING", logger="sdk"):
        source.start(view)
        try:
            wait_until(lambda: not source.state.up and source.state.error, timeout=10)
            wait_until(lambda: any("retrying" in r.getMessage() for r in caplog.records))
        finally:
            source.stop()
    said = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert said and all("no snapshot yet" in line for line in said), said
    assert not any("last snapshot" in line for line in said), said
    assert not any("redis: redis" in line for line in said), said
