"""The gate's HTTP API (FastAPI).

``GET /ready`` answers 200 when a record is released and 425 Too Early when it is not yet (the
body names the dependency groups that are behind and by how much); ``wait=<seconds>`` turns it
into a long-poll. Errors are always JSON: ``{"error": <code>, "message": <one line>}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path as FilePath
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from gate._bodies import (
    ERROR_RESPONSES,
    NOT_READY,
    READY_PARAMETERS,
    ApiError,
    BatchReadyAnswer,
    BatchReadyRequest,
    ErrorBody,
    Liveness,
    Probe,
    ReadyAnswer,
    ServiceStatus,
    SnapshotBody,
    parse_ready_query,
)
from gate._limits import RequestLimits
from gate._report import GateHistoryBody, GateStatus, gate_status, gate_summary
from gate._service import GateService, present
from gate._state import GateState
from gate._watermark import format_time

log = logging.getLogger("gate.api")

STATIC = FilePath(__file__).resolve().parent / "static"
STATUS_PAGE = STATIC / "index.html"


T = TypeVar("T")

STOPPING_EVENT = ServerSentEvent(
    event="stopping", raw_data=json.dumps({"message": "the gate is stopping"})
)
"""The last event of a status stream when the gate stops."""


class Stopping(Exception):
    """The service began stopping while a response waited."""


async def unless_stopping(service: GateService, waiting: Awaitable[T]) -> T:
    """What ``waiting`` gives, unless the service begins stopping first (:class:`Stopping`)."""
    work = asyncio.ensure_future(waiting)
    if service.stopping.is_set():
        work.cancel()
        raise Stopping
    stop = asyncio.ensure_future(service.stopping.wait())
    try:
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, stop):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    if work.done() and not work.cancelled():
        return work.result()
    raise Stopping


def create_app(service: GateService, *, manage_service: bool = True) -> FastAPI:
    """Build the API around a service; with ``manage_service`` the app starts and stops it."""
    settings = service.config.http

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_service:
            await service.start()
        try:
            yield
        finally:
            if manage_service:
                await service.stop()

    token = settings.api_token.get_secret_value().encode() if settings.api_token else None

    async def authorize(authorization: Annotated[str | None, Header()] = None) -> None:
        if token is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token):
            raise ApiError(
                401, "unauthorized", "missing or wrong API token (Authorization: Bearer ...)"
            )

    protected = [Depends(authorize)] if token else []
    # The API's docs pages (/docs, /redoc) are served from the package: no CDN needed.
    app = FastAPIOffline(
        title="Kafka dependency gate",
        version="0.1.0",
        description=(
            "Per-partition watermarks of consumer-group dependencies. A record (topic, "
            "partition, offset) is released when every dependency group has committed past "
            "it, i.e. offset < watermark."
        ),
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"]
        )
    _install_error_handlers(app)
    app.add_middleware(
        RequestLimits,
        max_body_bytes=settings.max_body_bytes,
        rate=settings.rate_limit_per_s,
        burst=settings.rate_limit_burst,
    )

    def gate_state(gate: str) -> tuple[GateState | None, list[str]]:
        spec = service.config.gates.get(gate)
        if spec is None:
            known = ", ".join(sorted(service.config.gates))
            raise ApiError(404, "not_found", f"unknown gate {gate!r} (known: {known})")
        return service.store.latest(gate), spec.topics

    def answer(
        gate: str, topic: str, partition: int, offset: int
    ) -> tuple[int, dict[str, Any], GateState | None]:
        state, topics = gate_state(gate)
        if topic not in topics:
            raise ApiError(404, "not_found", f"gate {gate!r} does not gate topic {topic!r}")
        body: dict[str, Any] = {
            "ready": False,
            "gate": gate,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "watermark": None,
            "version": None,
            "polled_at": None,
        }
        failing = service.failing.get(gate)
        if state is None:
            body["reason"] = (
                f"the gate has no snapshot yet: {'; '.join(failing)}"
                if failing
                else "the gate has not completed its first poll yet"
            )
            return NOT_READY, body, None
        body["version"] = state.version
        body["polled_at"] = format_time(state.snapshot.polled_at)
        if topic in state.missing_topics:
            body["reason"] = f"topic {topic!r} does not exist on the cluster"
            return NOT_READY, body, state
        part = state.partitions.get((topic, partition))
        if part is None:
            count = sum(1 for t, _ in state.partitions if t == topic)
            raise ApiError(
                404,
                "not_found",
                f"topic {topic!r} has no partition {partition} ({count} partitions)",
            )
        body["watermark"] = part.watermark
        if part.watermark is not None and offset < part.watermark:
            body["ready"] = True
            return 200, body, state
        if part.end_offset is not None and offset >= part.end_offset:
            body["reason"] = (
                f"offset {offset} is beyond the end of {topic}[{partition}] ({part.end_offset}): "
                "the record does not exist yet"
            )
        else:
            body["reason"] = "waiting for dependency groups to commit past this offset"
        if failing:
            body["reason"] += (
                f" (the snapshot of {body['polled_at']} is the last good one: {'; '.join(failing)})"
            )
        body["behind"] = part.behind(offset)
        return NOT_READY, body, state

    @app.get(
        "/ready",
        response_model=ReadyAnswer,
        responses={NOT_READY: {"model": ReadyAnswer, "description": "Not released yet."}},
        dependencies=protected,
        summary="Is this record released?",
        openapi_extra={"parameters": READY_PARAMETERS},
    )
    async def ready(request: Request) -> Response:
        """200 when every dependency group has committed past the record, else 425 Too Early
        with the groups that are behind. With ``wait`` the call returns as soon as the
        record is released, or with 425 when the wait ends."""
        # Parsed by hand: this is the hot path, and FastAPI's per-parameter validation
        # costs more than the answer itself. Errors keep the API's 422 format.
        gate, topic, partition, offset, wait = parse_ready_query(request.query_params)
        status, body, state = answer(gate, topic, partition, offset)
        if status == NOT_READY and wait > 0:
            deadline = time.monotonic() + min(wait, settings.max_wait_s)
            version = state.version if state else 0
            while status == NOT_READY:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    newer = await unless_stopping(
                        service, service.store.wait_published(gate, version, remaining)
                    )
                except Stopping:
                    break  # the gate stops: the answer now, not at the end of the wait
                if newer is None:
                    break
                version = newer.version
                status, body, _ = answer(gate, topic, partition, offset)
        return JSONResponse(body, status_code=status)

    @app.post(
        "/ready",
        response_model=BatchReadyAnswer,
        dependencies=protected,
        summary="Which of these records are released?",
        responses={
            400: {"model": ErrorBody, "description": "The body is not valid JSON."},
            413: {"model": ErrorBody, "description": "The body is too large."},
            **ERROR_RESPONSES,
        },
    )
    async def ready_batch(request: BatchReadyRequest) -> Response:
        """Readiness of many records of one gate at once; always 200, one result each."""
        if len(request.records) > settings.max_batch:
            raise ApiError(
                422, "invalid_request", f"records: at most {settings.max_batch} per request"
            )
        state, topics = gate_state(request.gate)
        results = []
        all_ready = True
        for record in request.records:
            item: dict[str, Any] = {
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "ready": False,
                "watermark": None,
            }
            if record.topic not in topics:
                item["error"] = f"gate {request.gate!r} does not gate topic {record.topic!r}"
            elif state is not None:
                part = state.partitions.get((record.topic, record.partition))
                if part is None:
                    item["error"] = "unknown topic or partition on the cluster"
                else:
                    item["watermark"] = part.watermark
                    item["ready"] = part.watermark is not None and record.offset < part.watermark
            all_ready = all_ready and item["ready"]
            results.append(item)
        return JSONResponse(
            {
                "gate": request.gate,
                "version": state.version if state else None,
                "polled_at": format_time(state.snapshot.polled_at) if state else None,
                "all_ready": all_ready,
                "results": results,
            }
        )

    @app.get(
        "/watermarks/{gate}",
        response_model=SnapshotBody,
        dependencies=protected,
        summary="Latest watermarks of a gate",
    )
    async def watermarks(gate: Annotated[str, Path(max_length=200)]) -> Response:
        """The latest snapshot: a watermark per topic and partition (null: nothing released)."""
        state, _ = gate_state(gate)
        if state is None:
            raise ApiError(
                404, "not_found", f"gate {gate!r} has no snapshot yet (first poll pending)"
            )
        body = state.snapshot.to_json()
        body["age_s"] = round(state.snapshot.age(present(state)), 3)
        return JSONResponse(body)

    @app.get(
        "/watermarks/{gate}/stream",
        response_class=EventSourceResponse,
        dependencies=protected,
        summary="Server-sent events: every new snapshot of a gate",
    )
    async def stream(
        gate: Annotated[str, Path(max_length=200)],
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> AsyncIterator[ServerSentEvent]:
        """Event ``snapshot`` (id = version, data = the snapshot JSON) now and whenever the
        watermarks change, and at least every heartbeat interval."""
        gate_state(gate)
        version = int(last_event_id) if last_event_id and last_event_id.isdigit() else -1
        heartbeat = max(service.config.heartbeat_ms / 1000, 0.1)
        while True:
            try:
                state = await unless_stopping(
                    service, service.store.wait_published(gate, version, heartbeat * 2)
                )
            except Stopping:
                return
            if state is None:
                continue
            version = state.version
            yield ServerSentEvent(
                event="snapshot",
                id=str(version),
                raw_data=json.dumps(state.snapshot.to_json(), separators=(",", ":")),
            )

    @app.get(
        "/status",
        response_model=ServiceStatus,
        dependencies=protected,
        summary="Service status and every gate's summary",
    )
    async def status_all() -> Response:
        gates = {}
        for name in service.config.gates:
            state = service.store.latest(name)
            errors = service.failing.get(name, ())
            gates[name] = (
                gate_summary(state, present(state), service.stale_after, errors) if state else None
            )
        poll = service.last_poll
        ok, detail = service.readiness()
        return JSONResponse(
            {
                "ready": ok,
                "detail": detail,
                "poll_interval_ms": service.config.poll_interval_ms,
                "overrunning": service.overrunning,
                "overruns": service.overruns,
                "last_poll": None
                if poll is None
                else {
                    "started_at": format_time(poll.started_at),
                    "duration_ms": round(poll.duration * 1000, 1),
                    "evaluation_ms": round(service.last_evaluation * 1000, 1),
                    "errors": list(poll.errors),
                },
                "redis": None
                if service.redis is None
                else {"healthy": service.redis.healthy, "error": service.redis.last_error},
                "gates": gates,
                "failing": {name: list(errors) for name, errors in service.failing.items()},
            }
        )

    @app.get(
        "/status/{gate}",
        response_model=GateStatus,
        dependencies=protected,
        summary="Why is this gate holding back?",
    )
    async def status_gate(gate: Annotated[str, Path(max_length=200)]) -> Response:
        """The gate's verdict, its dependency groups (status, lag in records and seconds,
        partitions they hold back), and per partition: end offset, watermark, records
        waiting and for how long, the groups holding it, the dependent's own offset, and per
        dependency group its committed offset, lag and status."""
        state = _latest(gate)
        errors = service.failing.get(gate, ())
        return JSONResponse(gate_status(state, present(state), service.stale_after, errors))

    @app.get(
        "/status/{gate}/history",
        response_model=GateHistoryBody,
        dependencies=protected,
        summary="The last minutes of a gate, for charts",
    )
    async def status_history(gate: Annotated[str, Path(max_length=200)]) -> Response:
        """One point per ``status.history_step_ms`` over the last 15 minutes: per group its
        lag in records and seconds, and the sum of the watermarks (its rise is the release
        rate), records held back and released records the dependent has not processed."""
        gate_state(gate)
        body = {"gate": gate, "now": time.time(), **service.store.history[gate].to_json()}
        return JSONResponse(body)

    def _latest(gate: str) -> GateState:
        state, _ = gate_state(gate)
        if state is None:
            failing = service.failing.get(gate)
            why = "; ".join(failing) if failing else "first poll pending"
            raise ApiError(404, "not_found", f"gate {gate!r} has no snapshot yet ({why})")
        return state

    @app.get(
        "/status/{gate}/stream",
        response_class=EventSourceResponse,
        dependencies=protected,
        summary="Server-sent events: the gate's status after every poll (the status page's feed)",
    )
    async def status_stream(
        gate: Annotated[str, Path(max_length=200)],
        interval: Annotated[float, Query(ge=0.1, le=60)] = 1.0,
    ) -> AsyncIterator[ServerSentEvent]:
        """Event ``status`` (id = version, data = what ``GET /status/{gate}`` returns) now
        and after every poll, at most once per ``interval`` seconds; while no poll succeeds,
        again every half ``stale_after_s`` (at most 15 s), so the verdict turns unknown.
        When the gate stops, a last event ``stopping`` ends the stream."""
        gate_state(gate)
        version = -1
        quiet = min(15.0, max(1.0, service.stale_after / 2))
        while True:
            try:
                state = await unless_stopping(
                    service, service.store.wait_latest(gate, version, quiet)
                )
            except Stopping:
                yield STOPPING_EVENT
                return
            if state is None:
                state = service.store.latest(gate)
                if state is None:
                    yield ServerSentEvent(comment="keep-alive")
                    continue
            version = state.version
            yield ServerSentEvent(
                event="status",
                id=str(version),
                raw_data=json.dumps(
                    gate_status(
                        state, present(state), service.stale_after, service.failing.get(gate, ())
                    ),
                    separators=(",", ":"),
                ),
            )
            try:
                await unless_stopping(service, asyncio.sleep(interval))
            except Stopping:
                yield STOPPING_EVENT
                return

    @app.get("/healthz", response_model=Liveness, summary="Liveness: the process answers")
    async def healthz() -> Liveness:
        """200 while the process answers HTTP: restarting it would not help otherwise."""
        return Liveness(ok=True, detail="alive")

    @app.get(
        "/readyz",
        response_model=Probe,
        responses={
            503: {
                "model": Probe,
                "description": "No poll cycle the cluster answered yet, or none recently.",
            }
        },
        summary="Readiness: the service can serve (the cluster answered a poll recently)",
    )
    async def readyz() -> Response:
        """200 once a poll cycle completed with the cluster answering, as long as it answered
        within ``readiness_max_age_ms``. One gate whose reads fail (its groups' offsets, its
        topic) leaves the service ready: that gate's answers, status and metrics say so."""
        ok, detail = service.readiness()
        redis = None if service.redis is None else service.redis.healthy
        return JSONResponse(
            {"ok": ok, "detail": detail, "redis": redis}, status_code=200 if ok else 503
        )

    @app.get(
        "/metrics",
        dependencies=protected,
        summary="Prometheus metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}}},
    )
    async def metrics() -> Response:
        return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        """The status page: static, its data comes from the API (with the token if set)."""
        return HTMLResponse(STATUS_PAGE.read_text(encoding="utf-8"))

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.code, "message": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for error in exc.errors():
            loc = [
                str(part)
                for part in error.get("loc", ())
                if part not in ("query", "body", "path", "header")
            ]
            problems.append(f"{'.'.join(loc) or 'request'}: {error.get('msg', 'invalid')}")
        return JSONResponse(
            {"error": "invalid_request", "message": "; ".join(problems) or "invalid request"},
            status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}
        return JSONResponse(
            {"error": codes.get(exc.status_code, "http_error"), "message": str(exc.detail)},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error answering %s %s", request.method, request.url.path)
        return JSONResponse(
            {"error": "internal", "message": "internal error; the gate's log has the details"},
            status_code=500,
        )
