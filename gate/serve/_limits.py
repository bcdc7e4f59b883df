"""Request limits for the gate's HTTP API: body size (413) and a per-client rate (429).

A plain ASGI middleware (no per-request task or body copy for GETs), so the limits cost
little on the hot ``/ready`` path. Probes (``/healthz``, ``/readyz``) are never limited.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

EXEMPT = frozenset({"/healthz", "/readyz"})


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up. Pure: time is passed in."""

    __slots__ = ("burst", "rate", "tokens", "updated")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.updated = burst, now

    def take(self, now: float) -> float:
        """Take one token: 0.0 when granted, else the seconds until one is available."""
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class RequestLimits:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        rate: float | None,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.rate = rate
        self.burst = burst if burst is not None else (2 * rate if rate else 0.0)
        self.clock = clock
        self.buckets: dict[str, TokenBucket] = {}
        self._pruned = clock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT:
            await self.app(scope, receive, send)
            return
        if self.rate:
            wait = self._take(scope)
            if wait > 0:
                await _reject(
                    send,
                    429,
                    "rate_limited",
                    f"more than {self.rate:g} requests per second from this client",
                    {"retry-after": str(max(1, math.ceil(wait)))},
                )
                return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            declared = _content_length(scope)
            if declared is not None and declared > self.max_body_bytes:
                await _too_large(send, self.max_body_bytes)
                return
            body = await _read_body(receive, self.max_body_bytes)
            if body is None:
                await _too_large(send, self.max_body_bytes)
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    def _take(self, scope: Scope) -> float:
        now = self.clock()
        client = (scope.get("client") or ("unknown", 0))[0]
        bucket = self.buckets.get(client)
        if bucket is None:
            bucket = self.buckets[client] = TokenBucket(self.rate or 0.0, self.burst, now)
        if now - self._pruned > 60.0:  # forget clients idle long enough to be full again
            self._pruned = now
            idle = self.burst / (self.rate or 1.0)
            for key in [k for k, b in self.buckets.items() if now - b.updated > idle]:
                del self.buckets[key]
        return bucket.take(now)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None once it exceeds ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _too_large(send: Send, limit: int) -> None:
    await _reject(send, 413, "too_large", f"the request body is larger than {limit:,} bytes")


async def _reject(
    send: Send, status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> None:
    body = json.dumps({"error": code, "message": message}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
