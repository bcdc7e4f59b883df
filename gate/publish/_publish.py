"""Publishing gate states: in process (for the HTTP API) and to Redis (for fan-out).

The :class:`SnapshotStore` keeps the latest state of every gate and wakes waiters (long-polls,
server-sent-event streams, the Redis publisher) whenever a state is *published*: when its
watermarks changed, or when ``heartbeat`` seconds passed since the last publication, so that
clients can always tell how old their snapshot is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gate.evaluate._history import GateHistory
from gate.evaluate._state import GateState
from gate.publish._redis import (
    PUBLISH_SCRIPT,
    read_key,
    read_span,
    snapshot_fields,
    snapshot_message,
    updates_channel,
    watermarks_key,
)

log = logging.getLogger("gate.publish")


class SnapshotStore:
    """Latest and last published state per gate. Written on the event loop thread only;
    :meth:`latest` may be read from any thread (a scrape is built in a worker thread): each
    state is immutable and replaced whole."""

    def __init__(
        self, gates: Iterable[str], *, heartbeat: float = 5.0, history_step: float = 5.0
    ) -> None:
        self.gates = list(gates)
        self._heartbeat = heartbeat
        self.history = {gate: GateHistory(step=history_step) for gate in self.gates}
        self._latest: dict[str, GateState] = {}
        self._published: dict[str, GateState] = {}
        self._published_at: dict[str, float] = {}
        self._events: dict[str, asyncio.Event] = {}
        self._updates: dict[str, asyncio.Event] = {}
        self._any = asyncio.Event()

    def latest(self, gate: str) -> GateState | None:
        return self._latest.get(gate)

    def published(self, gate: str) -> GateState | None:
        return self._published.get(gate)

    def update(self, state: GateState, *, now: float | None = None) -> bool:
        """Record a new state; returns whether it was published (and waiters woken)."""
        now = time.monotonic() if now is None else now
        gate = state.gate
        current = self._latest.get(gate)
        if current is not None and current.version >= state.version:
            return False
        self._latest[gate] = state
        self.history[gate].record(state)
        updated = self._updates.pop(gate, None)
        if updated is not None:
            updated.set()
        last = self._published.get(gate)
        due = (
            last is None
            or last.snapshot.watermarks != state.snapshot.watermarks
            or now - self._published_at[gate] >= self._heartbeat
        )
        if due:
            self._published[gate] = state
            self._published_at[gate] = now
            self._event(gate).set()
            self._events[gate] = asyncio.Event()
            self._any.set()
            self._any = asyncio.Event()
        return due

    def _event(self, gate: str) -> asyncio.Event:
        event = self._events.get(gate)
        if event is None:
            event = self._events[gate] = asyncio.Event()
        return event

    async def wait_published(
        self, gate: str, after_version: int, timeout: float
    ) -> GateState | None:
        """Wait until a state newer than ``after_version`` is published (None on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            state = self._published.get(gate)
            if state is not None and state.version > after_version:
                return state
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._event(gate).wait(), remaining)
            except TimeoutError:
                return None

    async def wait_latest(self, gate: str, after_version: int, timeout: float) -> GateState | None:
        """Wait until any state newer than ``after_version`` is recorded, published or not
        (None on timeout): the status page follows every poll, not only watermark changes."""
        state = self._latest.get(gate)
        if state is not None and state.version > after_version:
            return state
        event = self._updates.get(gate)
        if event is None:
            event = self._updates[gate] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        state = self._latest.get(gate)
        return state if state is not None and state.version > after_version else None

    async def wait_any(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._any.wait(), timeout)


class RedisPublisher:
    """Writes every published state to Redis; survives Redis outages and catches up after.

    Only the newest state of a gate matters, so when Redis is slow or down intermediate
    states are skipped and the newest one is written once Redis answers again.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "gate",
        password: str | None = None,
        client: aioredis.Redis | None = None,
    ) -> None:
        self.prefix = prefix
        self._client = client or aioredis.Redis.from_url(
            url,
            password=password,  # a password in the URL wins
            socket_timeout=2.0,
            socket_connect_timeout=2.0,
            retry_on_timeout=False,
        )
        self._script = self._client.register_script(PUBLISH_SCRIPT)
        self._written: dict[str, int] = {}
        self.healthy = False
        self.last_error: str | None = None
        self.writes = 0
        self.failures = 0
        self.stale_rejections = 0
        self.overlapping_rejections = 0
        """States refused because another replica's read, at the same time, saw more."""

    async def stored_versions(self, gates: Iterable[str]) -> dict[str, int]:
        """Versions already in Redis (so a restarted gate continues above them)."""
        versions: dict[str, int] = {}
        try:
            for gate in gates:
                raw = await self._client.hget(watermarks_key(self.prefix, gate), "version")
                if raw is not None and raw.isdigit():
                    versions[gate] = int(raw)
        except (RedisError, OSError) as exc:
            self.healthy, self.last_error = False, str(exc)
            raise
        self.healthy, self.last_error = True, None
        return versions

    async def write(self, state: GateState) -> bool:
        """Write one state; True if Redis now holds it, False if Redis had a newer one."""
        snapshot = state.snapshot
        stored = await self._script(
            keys=[
                watermarks_key(self.prefix, snapshot.gate),
                read_key(self.prefix, snapshot.gate),
            ],
            args=[
                snapshot.version,
                updates_channel(self.prefix, snapshot.gate),
                snapshot_message(snapshot),
                read_span(state.read),
                *snapshot_fields(snapshot),
            ],
        )
        self._written[snapshot.gate] = snapshot.version
        if stored == 2:
            self.overlapping_rejections += 1
        elif not stored:
            self.stale_rejections += 1
        return stored == 1

    async def run(self, store: SnapshotStore) -> None:
        """Keep Redis in step with the store until cancelled."""
        backoff = 0.2
        while True:
            pending = [
                state
                for gate in store.gates
                if (state := store.published(gate)) is not None
                and state.version > self._written.get(gate, -1)
            ]
            if not pending:
                await store.wait_any(timeout=1.0)
                continue
            try:
                for state in pending:
                    await self.write(state)
                    self.writes += 1
            except (RedisError, OSError) as exc:
                self.failures += 1
                if self.healthy or self.last_error is None:
                    log.warning("redis publish failed, will retry: %s", exc)
                self.healthy = False
                self.last_error = str(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if not self.healthy:
                log.info("redis publishing is healthy")
            self.healthy = True
            self.last_error = None
            backoff = 0.2

    async def close(self) -> None:
        await self._client.aclose()
