"""The newest snapshot of one gate on the client, and the sources that feed it.

All sources of a gate feed one :class:`WatermarkView`, which keeps the snapshot with the
highest version and never applies an older one over it, so when a source fails the others
carry on. When every source is down the last snapshot stays in force: commits only move
forward, so it releases less than the truth, never more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gate._watermark import Snapshot

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
