"""The documented shape of what ``/status`` says about a gate (the API's schema).

One shape everywhere: ``GET /status`` gives each gate's :class:`GateSummary`,
``GET /status/{gate}`` (and its stream) a :class:`GateStatus`: the summary plus
``partitions``, always a list.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class UncommittedBody(BaseModel):
    group: str
    partitions: list[str] = Field(description="As topic[partition].")
    records: int = Field(description="Records waiting there: all of them.")
    ever_committed: bool = Field(
        description="Whether the gate saw it commit there before (its offsets were lost)."
    )
    did_you_mean: str | None = Field(
        description="A consumer group on the cluster with a close name (a misspelling?)."
    )


class VerdictBody(BaseModel):
    state: Literal["released", "flowing", "stuck", "missing", "unknown"] = Field(
        description="released: nothing waits; flowing: records wait but the watermarks move "
        "(healthy); stuck: records have waited for stall_after at a watermark that has not "
        "moved for as long (an alarm); missing: a topic or partition of the gate does not "
        "exist, so nothing on it is released (an alarm); unknown: no poll has succeeded for "
        "stale_after_s (the other fields are the last snapshot's)."
    )
    text: str = Field(description="The verdict in one line, as the status page shows it.")
    records_waiting: int = Field(description="Records held back, over all partitions.")
    released_within_s: float | None = Field(
        description="Flowing: the age of the oldest record held back."
    )
    released_within_exact: bool = Field(
        default=True,
        description="False when released_within_s is a lower bound (the records are older "
        "than what the gate has seen: it started after them).",
    )
    stuck_since: str | None = Field(
        description="Stuck: since when records have waited with the watermark still (the "
        "later of its last move and the oldest waiting record's arrival)."
    )
    stuck_for_s: float | None = Field(
        description="Stuck: seconds since then, at the snapshot's poll (polled_at)."
    )
    stuck_for_exact: bool = Field(
        default=True,
        description="False when stuck_for_s is a lower bound (the stall began before the "
        "gate's first poll).",
    )
    stuck_on: list[str] = Field(description="Stuck: the groups holding those partitions.")
    released_unprocessed: int = Field(
        description="Records released to the dependent that it has not committed yet."
    )
    bottleneck: Literal["dependencies", "dependent"] | None = Field(
        description="Who records wait for: the dependencies (held back) or the dependent."
    )
    holding: list[str] = Field(
        description="The groups holding records back, the one holding most partitions first."
    )
    missing: list[str] = Field(
        description="Missing: the topics, and partitions as topic[partition], that do not exist."
    )
    uncommitted: list[UncommittedBody] = Field(
        default_factory=list,
        description="Stuck: dependency groups without a committed offset where records wait "
        "(nothing there is released until they commit).",
    )


DependencyStatusName = Literal["OK", "LAGGING", "BEHIND", "REWOUND", "STALLED", "MISSING"]


class GroupSummary(BaseModel):
    status: DependencyStatusName = Field(description="Its worst partition's status.")
    holding: int = Field(description="Partitions it holds back (it is at the watermark).")
    lag: int | None = Field(
        description="Records behind the end, over all partitions (null: unknown, as it has "
        "no committed offset on a partition with records; never 0 then)."
    )
    lag_s: float | None = Field(
        description="Age of the oldest record it has not processed (null: unknown)."
    )
    lag_s_exact: bool = Field(
        description="False when lag_s is coarse: a lower bound (the record is older than the "
        "gate's history) or from samples far apart for its age."
    )
    unmoved_s: float | None = Field(
        description="Seconds since its committed offset last moved on a partition where it "
        "has lag, at the snapshot's poll (null: it has lag nowhere)."
    )
    unmoved_s_exact: bool = Field(
        default=True,
        description="False when unmoved_s is a lower bound (unmoved since the gate's first poll).",
    )
    offsets_age_s: float | None = Field(
        default=None,
        description="Seconds from when its offsets shown were read to the snapshot's poll, "
        "when that poll carried them from an earlier read (idle and caught up: "
        "idle_poll_interval_ms); null: the last poll read them.",
    )


class DependentSummary(BaseModel):
    group: str = Field(description="The dependent's own consumer group.")
    committed: bool = Field(description="Whether it has committed offsets on these topics.")
    released_unprocessed: int = Field(
        description="Records released to it that it has not committed yet."
    )


class GateSummary(BaseModel):
    gate: str
    version: int = Field(description="The snapshot's version (milliseconds, increasing).")
    polled_at: str = Field(
        description="When the poll behind this snapshot started: every age in the answer but "
        "age_s is as of then (an answer is kept per snapshot)."
    )
    age_s: float = Field(description="Age of the snapshot at this ask.")
    stale_after_s: float | None = Field(
        description="Beyond this age the verdict is unknown (the service's readiness limit)."
    )
    partition_count: int
    held_partitions: int = Field(description="Partitions where records wait.")
    unreleased_partitions: list[str] = Field(
        description="Partitions with no watermark (nothing released), as topic[partition]."
    )
    records_waiting: int
    missing_topics: list[str]
    missing_partitions: list[str] = Field(
        description="Partitions seen before that no longer exist, as topic[partition]."
    )
    groups: dict[str, GroupSummary]
    verdict: VerdictBody
    dependent: DependentSummary | None
    errors: list[str] = Field(
        description="Why the last poll did not refresh this gate, e.g. its dependency groups' "
        "offsets could not be read (empty when it did): the snapshot is then the last good one."
    )


class GroupPositionBody(BaseModel):
    committed: int | None
    lag: int | None = Field(description="Records behind the end (null: unknown).")
    lag_s: float | None = Field(description="Age of the oldest record it has not processed.")
    lag_s_exact: bool
    status: DependencyStatusName
    moved_at: str | None = Field(description="When its committed offset last moved.")
    unmoved_s: float | None = Field(description="Seconds since then, at the snapshot's poll.")


class PartitionBody(BaseModel):
    topic: str
    partition: int
    end_offset: int | None
    watermark: int | None = Field(description="Records below it are released (null: none).")
    waiting: int | None = Field(description="Records held back (null: end unknown).")
    waiting_s: float | None = Field(description="Age of the oldest record held back.")
    waiting_s_exact: bool = Field(
        default=True,
        description="False when waiting_s is a lower bound (the records are older than the "
        "gate's history).",
    )
    watermark_moved_at: str | None
    holding: list[str] = Field(
        description="The groups at the watermark while records wait (ties together)."
    )
    dependent: int | None = Field(description="The dependent's committed offset.")
    groups: dict[str, GroupPositionBody] = Field(
        description="Each dependency group's position, or those the request's `groups` and "
        "`group` chose (`holding`: the groups at the watermark while records wait, ties and "
        "groups without a commit included)."
    )


class GateStatus(GateSummary):
    partitions: list[PartitionBody]


class GroupHistory(BaseModel):
    lag: int | None = Field(description="Records behind the end, over all partitions.")
    lag_s: float | None = Field(description="Age of the oldest record it has not processed.")


class HistoryPoint(BaseModel):
    t: float = Field(description="Start of the step, seconds since the epoch.")
    released: int = Field(description="Sum of the watermarks (its rise: records released).")
    waiting: int = Field(description="Records held back.")
    unprocessed: int = Field(description="Records released to the dependent, not processed.")
    groups: dict[str, GroupHistory] = Field(
        description="Each dependency group, or those the request's `groups` and `group` chose."
    )


class GateHistoryBody(BaseModel):
    gate: str
    step_s: float
    span_s: float
    now: float = Field(description="The server's clock at this ask.")
    points: list[HistoryPoint]


GroupsShown = Literal["all", "holding", "none"]
"""Which dependency groups each partition of ``/status/{gate}`` lists: every one, the ones
holding it back, or none (plus, in each case, the groups asked for by name)."""
