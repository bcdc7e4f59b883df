"""The release API: is a record released (``GET /ready``, with ``wait`` a long-poll), which
of many are (``POST /ready``), and the watermarks themselves, now or as a stream of
server-sent events."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Path, Request, params
from fastapi.responses import JSONResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent

from gate.evaluate._state import GateState
from gate.evaluate._watermark import format_time
from gate.serve._bodies import (
    ERROR_RESPONSES,
    NOT_READY,
    READY_PARAMETERS,
    ApiError,
    BatchReadyAnswer,
    BatchReadyRequest,
    ErrorBody,
    ReadyAnswer,
    SnapshotBody,
    parse_ready_query,
)
from gate.serve._waits import Stopping, unless_stopping
from gate.service._service import GateService, present


def known_gate(service: GateService, gate: str) -> tuple[GateState | None, list[str]]:
    """The latest state of the gate a request names (None: no snapshot yet) and its topics;
    404 when there is no such gate."""
    spec = service.config.gates.get(gate)
    if spec is None:
        known = ", ".join(sorted(service.config.gates))
        raise ApiError(404, "not_found", f"unknown gate {gate!r} (known: {known})")
    return service.store.latest(gate), spec.topics


def known_gate_path(service: GateService) -> params.Depends:
    """A dependency answering 404 when the path's ``{gate}`` is no gate. A stream checks its
    gate this way: a dependency answers before the stream starts, while a check in the
    stream itself would come after its 200 had been sent."""

    def known(gate: Annotated[str, Path(max_length=200)]) -> None:
        known_gate(service, gate)

    return Depends(known)


def answer(
    service: GateService, gate: str, topic: str, partition: int, offset: int
) -> tuple[int, dict[str, Any], GateState | None]:
    """The answer to ``GET /ready``: its status code, body, and the state it read."""
    state, topics = known_gate(service, gate)
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


def add_release_routes(app: FastAPI, service: GateService, protected: list[params.Depends]) -> None:
    """``/ready`` (GET and POST) and ``/watermarks/{gate}`` (and its stream), behind
    ``protected`` (the API token's check, when one is set)."""
    settings = service.config.http

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
        status, body, state = answer(service, gate, topic, partition, offset)
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
                status, body, _ = answer(service, gate, topic, partition, offset)
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
        state, topics = known_gate(service, request.gate)
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
        state, _ = known_gate(service, gate)
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
        dependencies=[*protected, known_gate_path(service)],
        summary="Server-sent events: every new snapshot of a gate",
    )
    async def stream(
        gate: Annotated[str, Path(max_length=200)],
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> AsyncIterator[ServerSentEvent]:
        """Event ``snapshot`` (id = version, data = the snapshot JSON) now and whenever the
        watermarks change, and at least every heartbeat interval."""
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
