"""Where a gate's watermarks come from: the gate service's Redis hash and channel
(:class:`RedisSource`), its HTTP API (:class:`HttpSource`, server-sent events with polling
while the stream is down), or the Kafka admin API directly (:class:`EmbeddedSource`, no gate
service needed). Each runs in a thread of its own and never dies: it reports, keeps the last
snapshot in force, and retries.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaException

from gate import Snapshot, SnapshotError, snapshot_from_hash, updates_channel, watermarks_key
from sdk.engine._options import CONSUMER_ONLY
from sdk.gating._view import GateError, SourceState, WatermarkView

log = logging.getLogger("sdk.gate")

REPEAT_AFTER = 60.0
"""Seconds before a source that stays down says so again, for a different reason."""


class _ThreadSource:
    """A source whose work runs in one daemon thread until stopped."""

    name = "source"

    def __init__(self) -> None:
        self.state = SourceState(self.name)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.view: WatermarkView | None = None
        self._said_down_at: float | None = None  # when the last line saying it is down was
        self._said_error: str | None = None

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
        self.close()

    def close(self) -> None:
        """Release what the source holds once its thread is done."""

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
            gate = self.view.gate if self.view else "?"
            if self._said_down_at is not None:
                log.warning("%s: %s again; following gate %s", self.name, self.reachable, gate)
            else:
                log.info("%s: following gate %s", self.name, gate)
        self._said_down_at = None
        self.state.up = True
        self.state.error = None

    def _down(self, error: str) -> None:
        """Said once when the source goes down; a different reason while it stays down at
        most every ``REPEAT_AFTER`` seconds (a retry every second must not be a line each)."""
        now = time.monotonic()
        said = self._said_down_at
        if said is None or (error != self._said_error and now - said >= REPEAT_AFTER):
            held = self.view is not None and self.view.snapshot is not None
            kept = "keeping the last snapshot" if held else "no snapshot yet"
            log.warning("%s: %s (%s; retrying)", self.name, error, kept)
            self._said_down_at, self._said_error = now, error
        self.state.up = False
        self.state.error = error

    @property
    def reachable(self) -> str:
        """What the line saying the source is back names."""
        return "reachable"

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
                    self._down(str(exc))
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
        import httpx

        try:
            url = httpx.URL(base_url)
        except (httpx.InvalidURL, TypeError) as exc:
            raise GateError(f"http source: {base_url!r} is not a URL ({exc})") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise GateError(f"http source: {base_url!r} must be an http:// or https:// URL")
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
                    self._down(self._failure(exc))
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
        except httpx.HTTPError as exc:
            self._down(self._failure(exc))
        except GateError as exc:
            self._down(str(exc))

    def _failure(self, exc: Exception) -> str:
        """One wording per failure, whether the stream or a poll met it."""
        import httpx

        if isinstance(exc, httpx.TransportError):
            return f"gate service at {self.base_url} is unreachable ({type(exc).__name__}: {exc})"
        return f"gate service at {self.base_url}: {type(exc).__name__}: {exc}"

    @property
    def reachable(self) -> str:
        return f"gate service at {self.base_url} is reachable"

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
        from gate import make_poller

        try:
            self._poller = make_poller(
                self.kafka,
                {group: self.topics for group in self.depends_on},
                request_timeout=self.request_timeout,
                metadata_interval=max(1.0, self.poll_interval * 10),
            )
        except (KafkaException, TypeError, ValueError) as exc:
            raise GateError(f"embedded source: invalid Kafka configuration: {exc}") from None
        super().start(view)

    def run(self) -> None:
        from gate import GateEvaluator

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

    def close(self) -> None:
        poller, self._poller = self._poller, None
        if poller is not None and hasattr(poller, "close"):
            poller.close()

    def explain(self, topic: str, partition: int, offset: int) -> list[dict[str, Any]] | None:
        state = self._state
        if state is None:
            return None
        part = state.partitions.get((topic, partition))
        return None if part is None else part.behind(offset)
