"""Dependency gating on the client: a :class:`Gate` follows one gate's watermarks from one
or more sources (``sdk.gating._sources``) through one view (``sdk.gating._view``), tells whether
records are released, and waits for them; :func:`gated` wraps a plain handler.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gate import Snapshot
from sdk.gating._view import GateError, WatermarkSource, WatermarkView

log = logging.getLogger("sdk.gate")


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
                    "gate %s is stale: no news from %s for %.0fs; %s",
                    self.name,
                    ", ".join(s.state.name for s in self.sources),
                    silence,
                    "nothing beyond the last snapshot is released"
                    if self.view.snapshot is not None
                    else "no snapshot yet: nothing is released",
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
