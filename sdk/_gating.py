"""Dependency gating on the client: watermark sources, one view, and waiting for release.

A :class:`Gate` follows one gate's watermarks from one or more sources: the gate service's
Redis hash and channel (:class:`RedisSource`), its HTTP API (:class:`HttpSource`, server-sent
events with polling while the stream is down), or the Kafka admin API directly
(:class:`EmbeddedSource`, no gate service needed). All sources feed one
:class:`WatermarkView`, which keeps the snapshot with the highest version and never applies an
older one over it, so when a source fails the others carry on. When every source is down the
last snapshot stays in force: commits only move forward, so it releases less than the truth,
never more.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import KafkaException

from gate._redis import snapshot_from_hash, updates_channel, watermarks_key
from gate._watermark import Snapshot, SnapshotError
from sdk._options import CONSUMER_ONLY

log = logging.getLogger("sdk.gate")


class GateError(RuntimeError):
    """A gate cannot be followed (for example: it does not exist on the gate service)."""


@dataclass
class SourceState:
    """Health of one source, for logs, metrics and explanations."""

    name: str
    up: bool = False
    error: str | None = None
    snapshots: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class WatermarkView:
    """The newest snapshot of one gate, shared by its sources and its readers (thread-safe)."""

    def __init__(self, gate: str) -> None:
        self.gate = gate
        self._snapshot: Snapshot | None = None
        self._received_at: float | None = None
        self._condition = threading.Condition()
        self._listeners: list[Callable[[Snapshot], None]] = []
        self._async_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def offer(self, snapshot: Snapshot, source: SourceState) -> bool:
        """Apply ``snapshot`` if it is newer; returns whether it was applied."""
        if snapshot.gate != self.gate:
            source.reject("wrong gate")
            log.warning(
                "%s sent a snapshot of gate %r, not %r: ignored",
                source.name,
                snapshot.gate,
                self.gate,
            )
            return False
        with self._condition:
            current = self._snapshot
            if current is not None and snapshot.version < current.version:
                source.reject("older version")
                return False
            self._received_at = time.monotonic()
            source.snapshots += 1
            if current is not None and snapshot.version == current.version:
                return False  # the same snapshot from another source: only liveness
            self._snapshot = snapshot
            self._condition.notify_all()
            waiters = list(self._async_waiters)
            listeners = list(self._listeners)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # a closed loop
                loop.call_soon_threadsafe(event.set)
        for listener in listeners:
            try:
                listener(snapshot)
            except Exception:
                log.exception("watermark listener raised")
        return True

    def add_listener(self, listener: Callable[[Snapshot], None]) -> None:
        with self._condition:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[Snapshot], None]) -> None:
        with self._condition, contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def released(self, topic: str, partition: int, offset: int) -> bool:
        snapshot = self._snapshot
        return snapshot is not None and snapshot.released(topic, partition, offset)

    def age(self) -> float | None:
        """Seconds since the poll of the current snapshot (None before the first)."""
        snapshot = self._snapshot
        return None if snapshot is None else snapshot.age(time.time())

    def silence(self) -> float | None:
        """Seconds since any source last confirmed the current snapshot or sent a newer one."""
        received = self._received_at
        return None if received is None else time.monotonic() - received

    def wait_released(self, topic: str, partition: int, offset: int, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            while not self.released(topic, partition, offset):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._condition.wait(remaining)
        return True

    async def wait_released_async(
        self, topic: str, partition: int, offset: int, timeout: float | None
    ) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self.released(topic, partition, offset):
            event = asyncio.Event()
            waiter = (loop, event)
            with self._condition:
                self._async_waiters.add(waiter)
            try:
                if self.released(topic, partition, offset):
                    return True
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except TimeoutError:
                    return self.released(topic, partition, offset)
            finally:
                with self._condition:
                    self._async_waiters.discard(waiter)
        return True


class WatermarkSource(Protocol):
    """Something that feeds a :class:`WatermarkView` from a thread of its own."""

    state: SourceState

    def start(self, view: WatermarkView) -> None: ...

    def stop(self) -> None: ...

    def explain(self, topic: str, partition: int, offset: int) -> list[dict[str, Any]] | None:
        """The dependency groups that have not committed past the record, if known."""
        ...


class _ThreadSource:
    """A source whose work runs in one daemon thread until stopped."""

    name = "source"

    def __init__(self) -> None:
        self.state = SourceState(self.name)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.view: WatermarkView | None = None

    def start(self, view: WatermarkView) -> None:
        self.view = view
        self._thread = threading.Thread(
            target=self._run_guarded, name=f"gate-{self.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run_guarded(self) -> None:
        while not self._stop.is_set():
            try:
                self.run()
            except Exception as exc:  # never let a source thread die: report and retry
                self._down(f"{type(exc).__name__}: {exc}")
                self._stop.wait(1.0)

    def run(self) -> None:
        raise NotImplementedError

    def explain(self, topic: str, partition: int, offset: int) -> list[dict[str, Any]] | None:
        return None

    def _up(self) -> None:
        if not self.state.up:
            log.info("%s: following gate %s", self.name, self.view.gate if self.view else "?")
        self.state.up = True
        self.state.error = None

    def _down(self, error: str) -> None:
        if self.state.up or self.state.error != error:
            log.warning("%s: %s (keeping the last snapshot; retrying)", self.name, error)
        self.state.up = False
        self.state.error = error

    def _offer(self, snapshot: Snapshot) -> None:
        assert self.view is not None
        self.view.offer(snapshot, self.state)

    def _offer_json(self, text: str | bytes) -> None:
        try:
            snapshot = Snapshot.from_json(json.loads(text))
        except (SnapshotError, ValueError) as exc:
            self.state.reject("malformed")
            log.warning("%s: rejected a malformed snapshot: %s", self.name, exc)
            return
        self._offer(snapshot)


class RedisSource(_ThreadSource):
    """The gate service's Redis hash and its pub/sub channel. The hash is loaded every time
    the subscription starts: at first, and whenever the client re-subscribes after a lost
    connection (by itself or after an error), so nothing published meanwhile is missed."""

    name = "redis"

    def __init__(self, url: str, *, prefix: str = "gate", timeout: float = 2.0) -> None:
        super().__init__()
        try:
            import redis

            redis.connection.parse_url(url)
        except ValueError as exc:
            raise GateError(f"redis source: {exc}") from None
        self.url = url
        self.prefix = prefix
        self.timeout = timeout

    def run(self) -> None:
        import redis

        assert self.view is not None
        gate = self.view.gate
        client = redis.Redis.from_url(
            self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout
        )
        # Subscription confirmations are delivered: each one starts a subscription (the first,
        # or redis-py's re-subscription after a reconnect), and the hash is loaded after it.
        pubsub = client.pubsub()
        backoff = 0.2
        try:
            while not self._stop.is_set():
                try:
                    if not pubsub.subscribed:
                        pubsub.subscribe(updates_channel(self.prefix, gate))
                    while not self._stop.is_set():
                        message = pubsub.get_message(timeout=1.0)
                        if message is None:
                            continue
                        if message.get("type") == "subscribe":
                            self._load(client, gate)
                            self._up()
                            backoff = 0.2
                        elif message.get("type") == "message":
                            self._offer_json(message["data"])
                except redis.RedisError as exc:
                    self._down(f"redis: {exc}")
                    with contextlib.suppress(Exception):
                        pubsub.reset()
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 5.0)
        finally:
            with contextlib.suppress(Exception):
                pubsub.close()
            client.close()

    def _load(self, client: Any, gate: str) -> None:
        fields = client.hgetall(watermarks_key(self.prefix, gate))
        if not fields:
            if self.state.snapshots == 0:
                log.warning(
                    "%s: no snapshot of gate %r in Redis yet (is the gate running, same prefix?)",
                    self.name,
                    gate,
                )
            return
        try:
            snapshot = snapshot_from_hash(fields)
        except SnapshotError as exc:
            self.state.reject("malformed")
            log.warning("%s: rejected a malformed hash: %s", self.name, exc)
            return
        if snapshot is not None:
            self._offer(snapshot)


class HttpSource(_ThreadSource):
    """The gate service's HTTP API: its server-sent-event stream, and plain polling of
    ``/watermarks/{gate}`` while the stream is down."""

    name = "http"

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        poll_interval: float = 1.0,
        timeout: float = 5.0,
    ) -> None:
        super().__init__()
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.poll_interval = poll_interval
        self.timeout = timeout
        self._last_event_id: str | None = None

    def run(self) -> None:
        import httpx

        assert self.view is not None
        gate = self.view.gate
        with httpx.Client(
            base_url=self.base_url, headers=self.headers, timeout=self.timeout
        ) as client:
            while not self._stop.is_set():
                try:
                    self._stream(client, gate)
                except httpx.HTTPError as exc:
                    self._down(f"http: {type(exc).__name__}: {exc}")
                if self._stop.is_set():
                    return
                self._poll_once(client, gate)
                self._stop.wait(self.poll_interval)

    def _check(self, response: Any, gate: str) -> None:
        if response.status_code == 404:
            message = (
                response.json().get("message", "not found") if response.content else "not found"
            )
            raise GateError(f"gate service at {self.base_url}: {message}")
        if response.status_code == 401:
            raise GateError(f"gate service at {self.base_url}: missing or wrong API token")
        response.raise_for_status()

    def _stream(self, client: Any, gate: str) -> None:
        import httpx

        headers = {"Accept": "text/event-stream"}
        if self._last_event_id:
            headers["Last-Event-ID"] = self._last_event_id
        read_timeout = httpx.Timeout(self.timeout, read=max(30.0, self.timeout))
        with client.stream(
            "GET", f"/watermarks/{gate}/stream", headers=headers, timeout=read_timeout
        ) as response:
            if response.status_code != 200:
                response.read()
                self._check(response, gate)
            self._up()
            data: list[str] = []
            for line in response.iter_lines():
                if self._stop.is_set():
                    return
                if line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif line.startswith("id:"):
                    self._last_event_id = line[3:].strip()
                elif not line and data:
                    self._offer_json("\n".join(data))
                    data = []

    def _poll_once(self, client: Any, gate: str) -> None:
        import httpx

        try:
            response = client.get(f"/watermarks/{gate}")
            if response.status_code == 404 and "no snapshot yet" in response.text:
                return
            self._check(response, gate)
            self._offer_json(response.content)
        except (httpx.HTTPError, GateError) as exc:
            self._down(str(exc))

    def explain(self, topic: str, partition: int, offset: int) -> list[dict[str, Any]] | None:
        import httpx

        assert self.view is not None
        params = {"gate": self.view.gate, "topic": topic, "partition": partition, "offset": offset}
        try:
            response = httpx.get(
                f"{self.base_url}/ready", params=params, headers=self.headers, timeout=self.timeout
            )
            body = response.json()
        except (httpx.HTTPError, ValueError):
            return None
        return body.get("behind") if response.status_code in (200, 425) else None


class EmbeddedSource(_ThreadSource):
    """Polls the Kafka admin API itself: no gate service needed (the default for a single
    service). Uses the gate service's own poller and evaluator."""

    name = "embedded"

    def __init__(
        self,
        kafka: Mapping[str, Any],
        topics: Sequence[str],
        depends_on: Sequence[str],
        *,
        poll_interval: float = 0.2,
        request_timeout: float = 5.0,
    ) -> None:
        super().__init__()
        if not depends_on:
            raise GateError("depends_on: list at least one consumer group")
        if not topics:
            raise GateError("topics: list at least one topic")
        # Values are passed as they are: callables such as ``error_cb`` or ``oauth_cb`` too.
        self.kafka = {k: v for k, v in kafka.items() if k not in CONSUMER_ONLY}
        self.topics = list(topics)
        self.depends_on = list(depends_on)
        self.poll_interval = poll_interval
        self.request_timeout = request_timeout
        self._state: Any = None
        self._poller: Any = None

    def start(self, view: WatermarkView) -> None:
        """Builds the admin client first, so a bad configuration fails here, clearly."""
        from gate._poller import OffsetPoller

        try:
            self._poller = OffsetPoller(
                self.kafka,
                {group: self.topics for group in self.depends_on},
                request_timeout=self.request_timeout,
                metadata_interval=max(1.0, self.poll_interval * 10),
            )
        except (KafkaException, TypeError, ValueError) as exc:
            raise GateError(f"embedded source: invalid Kafka configuration: {exc}") from None
        super().start(view)

    def run(self) -> None:
        from gate._status import GateEvaluator

        assert self.view is not None and self._poller is not None
        poller = self._poller
        evaluator = GateEvaluator(self.view.gate, self.topics, self.depends_on)
        next_at = time.monotonic()
        while not self._stop.is_set():
            poll = poller.poll()
            if poll.failed_groups or poll.failed_topics:
                self._down("; ".join(poll.errors) or "poll failed")
            else:
                self._state = evaluator.observe(poll)
                self._up()
                self._offer(self._state.snapshot)
            next_at += self.poll_interval
            delay = next_at - time.monotonic()
            if delay < 0:
                next_at, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    def explain(self, topic: str, partition: int, offset: int) -> list[dict[str, Any]] | None:
        state = self._state
        if state is None:
            return None
        part = state.partitions.get((topic, partition))
        return None if part is None else part.behind(offset)


class GateTimeout(TimeoutError):
    """A record was not released within the wait."""


class Gate:
    """Follows one gate's watermarks; tells whether records are released and waits for them.

    ``topics`` limits gating to those topics (records of other topics are never held);
    by default every topic a consumer reads is gated, and a partition the gate does not
    know is held. ``stale_after``: seconds without news from any source before the gate is
    reported stale (a warning and the ``sdk_gate_stale`` metric); nothing beyond the last
    snapshot is ever released either way. ``hold_log_after``: a consumer logs (at most that
    often per partition) which groups it waits for when records are held that long.
    """

    def __init__(
        self,
        name: str,
        sources: WatermarkSource | Sequence[WatermarkSource],
        *,
        topics: Iterable[str] | None = None,
        stale_after: float = 30.0,
        hold_log_after: float = 60.0,
    ) -> None:
        if not name:
            raise GateError("name: required")
        self.name = name
        self.sources = [sources] if not isinstance(sources, Sequence) else list(sources)
        if not self.sources:
            raise GateError("sources: at least one watermark source")
        self.topics = None if topics is None else frozenset(topics)
        self.stale_after = stale_after
        self.hold_log_after = hold_log_after
        self.view = WatermarkView(name)
        self._started = False
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self.stale = False

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> Gate:
        if self._started:
            return self
        started: list[WatermarkSource] = []
        try:
            for source in self.sources:
                source.start(self.view)
                started.append(source)
        except BaseException:
            for source in started:
                source.stop()
            raise
        self._started = True
        self._watchdog = threading.Thread(
            target=self._watch, name=f"gate-{self.name}-watch", daemon=True
        )
        self._watchdog.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for source in self.sources:
            source.stop()
        if self._watchdog is not None:
            self._watchdog.join(5)

    def __enter__(self) -> Gate:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_for_snapshot(self, timeout: float) -> bool:
        """Wait until a first snapshot arrived (useful to fail fast at start)."""
        deadline = time.monotonic() + timeout
        while self.view.snapshot is None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _watch(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(1.0):
            silence = self.view.silence()
            if silence is None:
                silence = time.monotonic() - started  # no snapshot at all yet
            if silence > self.stale_after and not self.stale:
                log.warning(
                    "gate %s is stale: no news from %s for %.0fs; nothing beyond the last "
                    "snapshot is released",
                    self.name,
                    ", ".join(s.state.name for s in self.sources),
                    silence,
                )
                self.stale = True
            elif silence <= self.stale_after and self.stale:
                log.info("gate %s is fresh again", self.name)
                self.stale = False

    # ---- questions ---------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot | None:
        return self.view.snapshot

    def gates_topic(self, topic: str) -> bool:
        return self.topics is None or topic in self.topics

    def limit(self, topic: str, partition: int) -> int | None:
        """The release limit for a consumer: records at or beyond it wait (0 when nothing
        is released; None when the topic is not gated)."""
        if not self.gates_topic(topic):
            return None
        snapshot = self.view.snapshot
        watermark = None if snapshot is None else snapshot.watermark(topic, partition)
        return 0 if watermark is None else watermark

    def released(self, topic: str, partition: int, offset: int) -> bool:
        return not self.gates_topic(topic) or self.view.released(topic, partition, offset)

    def wait_ready(
        self, topic: str, partition: int, offset: int, timeout: float | None = None
    ) -> bool:
        """Block until the record is released (True) or ``timeout`` seconds pass (False)."""
        if not self.gates_topic(topic):
            return True
        return self.view.wait_released(topic, partition, offset, timeout)

    async def wait_ready_async(
        self, topic: str, partition: int, offset: int, timeout: float | None = None
    ) -> bool:
        if not self.gates_topic(topic):
            return True
        return await self.view.wait_released_async(topic, partition, offset, timeout)

    def explain(self, topic: str, partition: int, offset: int) -> dict[str, Any]:
        """Why a record is held: the watermark, the snapshot's age, and when a source can
        tell, the dependency groups that have not committed past it and by how much."""
        snapshot = self.view.snapshot
        watermark = None if snapshot is None else snapshot.watermark(topic, partition)
        behind = None
        for source in self.sources:
            behind = source.explain(topic, partition, offset)
            if behind is not None:
                break
        return {
            "gate": self.name,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "released": self.released(topic, partition, offset),
            "watermark": watermark,
            "behind_watermark_by": None if watermark is None else max(0, offset + 1 - watermark),
            "snapshot_version": None if snapshot is None else snapshot.version,
            "snapshot_age_s": None if snapshot is None else round(snapshot.age(time.time()), 3),
            "waiting_for": behind,
            "sources": {
                s.state.name: {"up": s.state.up, "error": s.state.error} for s in self.sources
            },
        }


def gated(
    gate: Gate, *, timeout: float | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a handler of confluent-kafka ``Message`` objects so it runs only once the
    record is released; raises :class:`GateTimeout` when ``timeout`` passes first.

    For services not on the :class:`~sdk.ParallelConsumer`: the wait blocks the caller, so
    keep ``timeout`` well below ``max.poll.interval.ms`` when calling from a poll loop.
    """

    def decorate(handler: Callable[..., Any]) -> Callable[..., Any]:
        import functools
        import inspect

        if inspect.iscoroutinefunction(handler):

            @functools.wraps(handler)
            async def wait_then_handle_async(message: Any, *args: Any, **kwargs: Any) -> Any:
                topic, partition, offset = message.topic(), message.partition(), message.offset()
                if not await gate.wait_ready_async(topic, partition, offset, timeout):
                    raise GateTimeout(
                        f"{topic}[{partition}]@{offset} not released within {timeout}s"
                    )
                return await handler(message, *args, **kwargs)

            return wait_then_handle_async

        @functools.wraps(handler)
        def wait_then_handle(message: Any, *args: Any, **kwargs: Any) -> Any:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if not gate.wait_ready(topic, partition, offset, timeout):
                raise GateTimeout(f"{topic}[{partition}]@{offset} not released within {timeout}s")
            return handler(message, *args, **kwargs)

        return wait_then_handle

    return decorate
