"""The operator's API: the status of the service and of each gate (now, its last minutes, and
as a stream of server-sent events for the status page), the probes, the metrics, and the
status page itself."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Collection
from pathlib import Path as FilePath
from typing import Annotated

from fastapi import Depends, FastAPI, Path, Query, params
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from gate._bodies import ApiError, Liveness, Probe, ServiceStatus
from gate._release_api import known_gate
from gate._report import gate_status, gate_summary
from gate._service import GateService, present
from gate._state import GateState
from gate._status_bodies import GateHistoryBody, GateStatus, GroupsShown
from gate._waits import Stopping, unless_stopping
from gate._watermark import format_time

STATIC = FilePath(__file__).resolve().parent / "static"
STATUS_PAGE = STATIC / "index.html"

GroupsQuery = Annotated[
    GroupsShown,
    Query(
        description="Which groups each partition (or history point) lists: every dependency "
        "group (all), the ones holding it back (holding), or none; plus those named by "
        "`group`. At hundreds of groups, `holding` keeps the answer small."
    ),
]
GroupQuery = Annotated[
    list[str] | None,
    Query(
        max_length=100,
        description="A dependency group to list as well, whatever `groups` says (repeatable, "
        "at most 100).",
    ),
]

STOPPING_EVENT = ServerSentEvent(
    event="stopping", raw_data=json.dumps({"message": "the gate is stopping"})
)
"""The last event of a status stream when the gate stops."""


def _some(names: list[str], shown: int = 20) -> str:
    """The first names of a list, and how many more (a fleet has thousands)."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def add_status_routes(app: FastAPI, service: GateService, protected: list[params.Depends]) -> None:
    """``/status`` and ``/status/{gate}`` (with its history and stream), ``/healthz``,
    ``/readyz``, ``/metrics`` and the status page, behind ``protected`` where they carry
    the gates' data."""
    scraping = threading.Lock()
    # A gate's detail is built in a worker thread, one at a time: at 1,000 groups x 64
    # partitions it takes a quarter of a second, which on the event loop would hold up every
    # other answer (``/ready`` first of all) for as long.
    building = threading.Lock()

    def _gate_body(
        state: GateState,
        errors: tuple[str, ...],
        groups: GroupsShown,
        named: tuple[str, ...],
    ) -> Response:
        with building:
            body = gate_status(state, present(state), service.stale_after, errors, groups, named)
            return JSONResponse(body)

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
                    "cycle_ms": None
                    if service.schedule.last is None
                    else round(service.schedule.last.total * 1000, 1),
                    "errors": list(poll.errors),
                },
                "redis": None
                if service.redis is None
                else {"healthy": service.redis.healthy, "error": service.redis.last_error},
                "gates": gates,
                "failing": {name: list(errors) for name, errors in service.failing.items()},
            }
        )

    def _named(
        gate: Annotated[str, Path(max_length=200)], group: GroupQuery = None
    ) -> tuple[str, ...]:
        """The groups a request names; 404 for no such gate, 400 for a group it does not
        depend on (a dependency of the stream too: it answers before the stream starts)."""
        known_gate(service, gate)
        named = tuple(dict.fromkeys(group or ()))
        depends_on = service.config.gates[gate].depends_on
        unknown = [name for name in named if name not in depends_on]
        if unknown:
            raise ApiError(
                400,
                "invalid_request",
                f"gate {gate!r} does not depend on {', '.join(map(repr, unknown))} "
                f"(it depends on {_some(depends_on)})",
            )
        return named

    @app.get(
        "/status/{gate}",
        response_model=GateStatus,
        dependencies=protected,
        summary="Why is this gate holding back?",
    )
    async def status_gate(
        gate: Annotated[str, Path(max_length=200)],
        groups: GroupsQuery = "all",
        group: GroupQuery = None,
    ) -> Response:
        """The gate's verdict, its dependency groups (status, lag in records and seconds,
        partitions they hold back), and per partition: end offset, watermark, records
        waiting and for how long, the groups holding it, the dependent's own offset, and per
        dependency group (those ``groups`` and ``group`` choose) its committed offset, lag
        and status."""
        named = _named(gate, group)
        state = _latest(gate)
        errors = tuple(service.failing.get(gate, ()))
        return await run_in_threadpool(_gate_body, state, errors, groups, named)

    @app.get(
        "/status/{gate}/history",
        response_model=GateHistoryBody,
        dependencies=protected,
        summary="The last minutes of a gate, for charts",
    )
    async def status_history(
        gate: Annotated[str, Path(max_length=200)],
        groups: GroupsQuery = "all",
        group: GroupQuery = None,
    ) -> Response:
        """One point per ``status.history_step_ms`` over the last 15 minutes: per group
        (those ``groups`` and ``group`` choose; ``holding``: the groups holding records back
        now, as the verdict names them) its lag in records and seconds, and the sum of the
        watermarks (its rise is the release rate), records held back and released records
        the dependent has not processed."""
        named = _named(gate, group)
        chosen: Collection[str] | None = None
        if groups != "all":
            state = service.store.latest(gate)
            holding = state.verdict.holding if groups == "holding" and state else ()
            chosen = dict.fromkeys([*holding, *named])
        history = service.store.history[gate].to_json(chosen)
        return JSONResponse({"gate": gate, "now": time.time(), **history})

    def _latest(gate: str) -> GateState:
        state, _ = known_gate(service, gate)
        if state is None:
            failing = service.failing.get(gate)
            why = "; ".join(failing) if failing else "first poll pending"
            raise ApiError(404, "not_found", f"gate {gate!r} has no snapshot yet ({why})")
        return state

    @app.get(
        "/status/{gate}/stream",
        response_class=EventSourceResponse,
        dependencies=[*protected, Depends(_named)],
        summary="Server-sent events: the gate's status after every poll (the status page's feed)",
    )
    async def status_stream(
        gate: Annotated[str, Path(max_length=200)],
        interval: Annotated[float, Query(ge=0.1, le=60)] = 1.0,
        groups: GroupsQuery = "all",
        group: GroupQuery = None,
    ) -> AsyncIterator[ServerSentEvent]:
        """Event ``status`` (id = version, data = what ``GET /status/{gate}`` returns with
        the same ``groups`` and ``group``) now and after every poll, at most once per
        ``interval`` seconds; while no poll succeeds, again every half ``stale_after_s`` (at
        most 15 s), so the verdict turns unknown. When the gate stops, a last event
        ``stopping`` ends the stream."""
        named = _named(gate, group)
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
                        state,
                        present(state),
                        service.stale_after,
                        service.failing.get(gate, ()),
                        groups,
                        named,
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
    def metrics() -> Response:
        """Built in a worker thread, not on the event loop: a large fleet's scrape takes
        long enough to delay every other answer if it held the loop. One at a time: scrapes
        that arrive together (several Prometheus servers) wait rather than share the CPU."""
        with scraping:
            body = generate_latest(service.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        """The status page: static, its data comes from the API (with the token if set)."""
        return HTMLResponse(STATUS_PAGE.read_text(encoding="utf-8"))

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
