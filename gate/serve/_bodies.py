"""The bodies of the gate's HTTP API (its OpenAPI models) and the parsing of ``/ready``'s
query: pure definitions, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gate.report._status_bodies import GateSummary

MAX_OFFSET = 2**53 - 1
"""Largest offset the API accepts: JSON's safe integer (285 years at a million records per
second), exact in every JSON implementation, so no client's rounding can cross the bound."""
NOT_READY = 425
"""Status of ``/ready`` for a record that is not released yet (425 Too Early)."""


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


# ---- response models (for the OpenAPI document) -------------------------------------------


class ErrorBody(BaseModel):
    error: str = Field(description="Machine-readable code, e.g. not_found, invalid_request.")
    message: str = Field(description="One readable line.")


class BehindGroup(BaseModel):
    group: str
    committed: int | None = Field(description="The group's committed offset (null: none).")
    behind_by: int | None = Field(
        description="How many more records the group must commit to release this one."
    )
    status: str


class ReadyAnswer(BaseModel):
    ready: bool
    gate: str
    topic: str
    partition: int
    offset: int
    watermark: int | None = Field(description="Records below this offset are released.")
    version: int | None
    polled_at: str | None
    reason: str | None = None
    behind: list[BehindGroup] = Field(default_factory=list)


class RecordRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topic: str = Field(min_length=1, max_length=249)
    partition: int = Field(ge=0, le=2**31 - 1)
    offset: int = Field(ge=0, le=MAX_OFFSET)


class BatchReadyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gate: str = Field(min_length=1, max_length=200)
    records: list[RecordRef]


class BatchReadyItem(BaseModel):
    topic: str
    partition: int
    offset: int
    ready: bool
    watermark: int | None
    error: str | None = None


class BatchReadyAnswer(BaseModel):
    gate: str
    version: int | None
    polled_at: str | None
    all_ready: bool
    results: list[BatchReadyItem]


class SnapshotBody(BaseModel):
    gate: str
    version: int
    polled_at: str
    age_s: float
    topics: dict[str, dict[str, int | None]] = Field(
        description="Watermark per topic and partition; null: nothing released there."
    )


class Liveness(BaseModel):
    ok: bool
    detail: str


class Probe(Liveness):
    redis: bool | None = Field(
        default=None,
        description="Whether Redis publishing works (null: no Redis configured). An "
        "unreachable Redis leaves the gate ready: HTTP keeps serving the watermarks.",
    )


class LastPoll(BaseModel):
    started_at: str
    duration_ms: float
    evaluation_ms: float = Field(description="Time spent evaluating the gates from it.")
    cycle_ms: float | None = Field(
        default=None,
        description="The whole cycle, from when it was due to when it ended (null before the "
        "first ends): the poll, the evaluation, a late start and publishing.",
    )
    errors: list[str]


class RedisHealth(BaseModel):
    healthy: bool
    error: str | None


class ServiceStatus(BaseModel):
    ready: bool
    detail: str
    poll_interval_ms: int
    overrunning: bool = Field(
        description="True while poll cycles take longer than poll_interval_ms: each starts "
        "when the previous ends (none is queued), so snapshots are older than the interval."
    )
    overruns: int = Field(description="Poll cycles that took longer than the interval.")
    last_poll: LastPoll | None
    redis: RedisHealth | None
    gates: dict[str, GateSummary | None] = Field(
        description="Each gate's summary (null until its first successful poll)."
    )
    failing: dict[str, list[str]] = Field(
        description="The gates the last poll did not refresh, each with why (e.g. its "
        "dependency groups' offsets could not be read). They serve their last snapshot, "
        "if any; the service stays ready."
    )


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or wrong API token."},
    404: {"model": ErrorBody, "description": "Unknown gate, topic or partition."},
    422: {"model": ErrorBody, "description": "Invalid parameters."},
    429: {"model": ErrorBody, "description": "Too many requests from this client."},
}


MAX_PARTITION = 2**31 - 1


def _query_parameter(
    name: str, schema: dict[str, Any], description: str, required: bool = True
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "schema": schema,
        "description": description,
    }


READY_PARAMETERS = [
    _query_parameter("gate", {"type": "string", "minLength": 1, "maxLength": 200}, "Gate name."),
    _query_parameter("topic", {"type": "string", "minLength": 1, "maxLength": 249}, "Topic."),
    _query_parameter(
        "partition", {"type": "integer", "minimum": 0, "maximum": MAX_PARTITION}, "Partition."
    ),
    _query_parameter(
        "offset", {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET}, "Record offset."
    ),
    _query_parameter(
        "wait",
        {"type": "number", "minimum": 0, "default": 0},
        "Seconds to wait for release (long-poll); 0 answers at once.",
        required=False,
    ),
]


def parse_ready_query(query: Mapping[str, str]) -> tuple[str, str, int, int, float]:
    """The parameters of ``GET /ready``, or an ``invalid_request`` error naming each problem."""
    problems = []
    gate = query.get("gate", "")
    topic = query.get("topic", "")
    if not 1 <= len(gate) <= 200:
        problems.append("gate: required, 1 to 200 characters")
    if not 1 <= len(topic) <= 249:
        problems.append("topic: required, 1 to 249 characters")
    partition, problem = _bounded_int("partition", query.get("partition"), MAX_PARTITION)
    if problem:
        problems.append(problem)
    offset, problem = _bounded_int("offset", query.get("offset"), MAX_OFFSET)
    if problem:
        problems.append(problem)
    wait = 0.0
    if "wait" in query:
        try:
            wait = float(query["wait"])
        except ValueError:
            wait = -1.0
        if not 0 <= wait < float("inf"):
            problems.append(f"wait: must be a number of seconds >= 0, got {query['wait'][:40]!r}")
    if problems:
        raise ApiError(422, "invalid_request", "; ".join(problems))
    return gate, topic, partition, offset, wait  # type: ignore[return-value]


def _bounded_int(name: str, text: str | None, maximum: int) -> tuple[int | None, str | None]:
    """The integer a query parameter holds, or the problem with it in one line."""
    expected = f"an integer from 0 to {maximum}"
    if text is None or text == "":
        return None, f"{name}: required, {expected}"
    body = text[1:] if text[:1] in "+-" else text
    if not body.isascii() or not body.isdigit():
        return None, f"{name}: {text[:40]!r} is not an integer ({expected})"
    if text.startswith("-") and body.strip("0"):
        return None, f"{name}: must be >= 0, got {text[:40]}"
    if len(body.lstrip("0")) > len(str(maximum)):
        return None, f"{name}: must be <= {maximum}"
    value = int(body)
    if value > maximum:
        return None, f"{name}: must be <= {maximum}, got {value}"
    return value, None
