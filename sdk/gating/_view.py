"""The newest snapshot of one gate on the client, and the sources that feed it.

All sources of a gate feed one :class:`WatermarkView`, which keeps the snapshot with the
highest version and never applies an older one over it, so when a source fails the others
carry on. When every source is down the last snapshot stays in force: commits only move
forward, so it releases less than the truth, never more.

Snapshots come from sources, some of them the application's own, so the view is where their
values are checked and made plain: any integer type (``numpy.int64``, ``IntEnum``...) becomes
an ``int`` (``operator.index``), and a snapshot holding anything else where an integer belongs
(a bool, a float, a string, a negative offset) is rejected, logged and counted as malformed.
What the consumer's core reads is then the same in its compiled and pure builds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import numbers
import operator
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gate import Snapshot, SnapshotError

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
        """Apply ``snapshot`` if it is newer; returns whether it was applied. A snapshot that
        is not well formed (see :func:`plain_snapshot`) is rejected, never raised: a source's
        bad value must not stop the consumer."""
        try:
            gate, version = _plain_gate(snapshot.gate), _plain_int(snapshot.version, "version")
        except Exception as exc:  # anything an application's object may raise, too
            return _malformed(source, exc)
        if gate != self.gate:
            source.reject("wrong gate")
            log.warning(
                "%s sent a snapshot of gate %r, not %r: ignored",
                source.name,
                gate,
                self.gate,
            )
            return False
        current = self._snapshot
        if current is None or version > current.version:
            # Only a snapshot that may be applied is checked whole (the others are dropped
            # unread): a source that confirms the same version over and over costs nothing.
            try:
                snapshot = plain_snapshot(snapshot)
            except Exception as exc:
                return _malformed(source, exc)
        with self._condition:
            current = self._snapshot
            if current is not None and version < current.version:
                source.reject("older version")
                return False
            self._received_at = time.monotonic()
            source.snapshots += 1
            if current is not None and version == current.version:
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


def plain_snapshot(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with plain values: its gate a ``str``, its version, partitions and
    watermarks non-negative ``int`` (a watermark may be None), its ``polled_at`` a finite
    ``float``. Raises :class:`SnapshotError` naming the first value that is none of these.
    Returns ``snapshot`` itself when it is already plain."""
    gate = _plain_gate(snapshot.gate)
    version = _plain_int(snapshot.version, "version")
    polled_at = snapshot.polled_at
    if isinstance(polled_at, bool) or not isinstance(polled_at, numbers.Real):
        raise SnapshotError(f"polled_at {polled_at!r} is not a number of seconds")
    if not math.isfinite(polled_at):
        raise SnapshotError(f"polled_at {polled_at!r} is not a finite number of seconds")
    given = snapshot.watermarks
    if not isinstance(given, Mapping):
        raise SnapshotError(f"watermarks {given!r} is not a mapping")
    watermarks: dict[tuple[str, int], int | None] = {}
    changed = False
    for key, watermark in given.items():
        if type(key) is tuple and len(key) == 2:
            topic, partition = key
            if (
                type(topic) is str
                and type(partition) is int
                and partition >= 0
                and (watermark is None or (type(watermark) is int and watermark >= 0))
            ):
                watermarks[key] = watermark  # plain already (the usual case: no call)
                continue
        watermarks.update((_plain_entry(key, watermark),))
        changed = True
    if (
        not changed
        and type(snapshot) is Snapshot
        and type(given) is dict
        and gate is snapshot.gate
        and version is snapshot.version
        and type(polled_at) is float
    ):
        return snapshot
    return Snapshot(gate=gate, version=version, polled_at=float(polled_at), watermarks=watermarks)


def _plain_entry(key: Any, watermark: Any) -> tuple[tuple[str, int], int | None]:
    if not isinstance(key, tuple) or len(key) != 2:
        raise SnapshotError(f"watermarks key {key!r} is not a (topic, partition) pair")
    topic, partition = key
    if not isinstance(topic, str):
        raise SnapshotError(f"topic {topic!r} is not a string")
    topic = str(topic)
    partition = _plain_int(partition, f"partition of {topic!r}")
    if watermark is not None:
        watermark = _plain_int(watermark, f"watermark of {topic}[{partition}]")
    return (topic, partition), watermark


def _plain_gate(gate: Any) -> str:
    if not isinstance(gate, str) or not gate:
        raise SnapshotError(f"gate {gate!r} is not a non-empty string")
    return gate if type(gate) is str else str(gate)


def _plain_int(value: Any, what: str) -> int:
    """``value`` as a plain ``int``: any integer type, not a bool (a flag, not a number)."""
    if isinstance(value, bool):
        raise SnapshotError(f"{what} {value!r} is a bool, not an integer")
    try:
        number = operator.index(value)
    except TypeError:
        raise SnapshotError(
            f"{what} {value!r} ({type(value).__name__}) is not an integer"
        ) from None
    if number < 0:
        raise SnapshotError(f"{what} {value!r} is negative")
    return number if type(number) is int else int(number)  # index() may give a subclass


def _malformed(source: SourceState, error: Exception) -> bool:
    source.reject("malformed")
    reason = str(error) if isinstance(error, SnapshotError) else f"{type(error).__name__}: {error}"
    log.warning("%s: rejected a malformed snapshot: %s", source.name, reason)
    return False


class WatermarkSource(Protocol):
    """Something that feeds a :class:`WatermarkView` from a thread of its own."""

    state: SourceState

    def start(self, view: WatermarkView) -> None: ...

    def stop(self) -> None: ...

    def explain(self, topic: str, partition: int, offset: int) -> list[dict[str, Any]] | None:
        """The dependency groups that have not committed past the record, if known."""
        ...
