"""The operator's API: the status of the service and of each gate (now, its last minutes, and
as a stream of server-sent events for the status page), the probes, the metrics, and the
status page itself."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path as FilePath
from typing import Annotated

from fastapi import Depends, FastAPI, Path, Query, params
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from gate.evaluate._state import GateState
from gate.evaluate._watermark import format_time
from gate.report._status_bodies import GateHistoryBody, GateStatus, GroupsShown
from gate.serve._answers import Answers, Choice, Pieces, choice, dumps
from gate.serve._bodies import ApiError, Liveness, Probe, ServiceStatus
from gate.serve._release_api import known_gate
from gate.serve._waits import Stopping, unless_stopping
from gate.service._service import GateService

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
    answers = Answers(service.stale_after)

    @app.get(
        "/status",
        response_model=ServiceStatus,
        dependencies=protected,
        summary="Service status and every gate's summary",
    )
    async def status_all() -> Response:
        """The service (made at each ask) and each gate's summary (kept per state: see
        ``gate.serve._answers``)."""
        asked = [
            (name, service.store.latest(name), tuple(service.failing.get(name, ())))
            for name in service.config.gates
        ]
        summaries: list[list[bytes] | None] = [
            None if state is None else answers.summary_kept(state, errors)
            for _, state, errors in asked
        ]
        if any(
            state is not None and summary is None
            for (_, state, _), summary in zip(asked, summaries, strict=True)
        ):
            summaries = await run_in_threadpool(_summaries, asked)
        poll = service.last_poll
        ok, detail = service.readiness()
        head = {
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
            "failing": {name: list(errors) for name, errors in service.failing.items()},
        }
        pieces = [dumps(head)[:-1], b',"gates":{']
        for index, ((name, _, _), summary) in enumerate(zip(asked, summaries, strict=True)):
            pieces += [b"," if index else b"", dumps(name), b":", *(summary or [b"null"])]
        pieces.append(b"}}")
        return Pieces(pieces)

    def _summaries(
        asked: list[tuple[str, GateState | None, tuple[str, ...]]],
    ) -> list[list[bytes] | None]:
        return [
            None if state is None else answers.summary(state, errors) for _, state, errors in asked
        ]

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
        chosen = choice(groups, named)
        pieces = answers.detail_kept(state, errors, chosen)
        if pieces is None:  # built in a worker thread: a large gate's takes a while
            pieces = await run_in_threadpool(answers.detail, state, errors, chosen)
        return Pieces(pieces)

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
        state = service.store.latest(gate)
        history = service.store.history[gate]
        if state is None:  # (no point yet)
            return JSONResponse({"gate": gate, "now": time.time(), **history.to_json()})
        chosen = choice(groups, named)
        pieces = answers.history_kept(state, chosen)
        if pieces is None:  # its points taken here, where they are recorded
            points = list(history.points)
            pieces = await run_in_threadpool(answers.history, state, history, points, chosen)
        return Pieces(pieces)

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
        chosen = choice(groups, _named(gate, group))
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
            errors = tuple(service.failing.get(gate, ()))
            data = await run_in_threadpool(_event_data, state, errors, chosen)
            yield ServerSentEvent(event="status", id=str(version), raw_data=data)
            try:
                await unless_stopping(service, asyncio.sleep(interval))
            except Stopping:
                yield STOPPING_EVENT
                return

    def _event_data(state: GateState, errors: tuple[str, ...], chosen: Choice) -> str:
        """A status event's data: the detail (kept, or built), as one string (megabytes at
        1,000 groups: made in a worker thread too)."""
        return b"".join(answers.detail(state, errors, chosen)).decode()

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
        """Built in a worker thread, not on the event loop: a large fleet's series per
        state take long enough to delay every other answer if they held the loop. They are
        built once per poll cycle (one build at a time, with the other large answers) and
        kept; a scrape formats the rest, the service's own series, at each ask."""
        return Response(
            service.metrics.exposition(answers.building), media_type=CONTENT_TYPE_LATEST
        )

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        """The status page: static, its data comes from the API (with the token if set)."""
        return HTMLResponse(STATUS_PAGE.read_text(encoding="utf-8"))

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
