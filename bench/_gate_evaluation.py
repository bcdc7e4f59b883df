"""The gate benchmark's evaluation alone, on polls built in memory, and what the serving
process spends on its states (see ``bench.gate_bench``)."""

from __future__ import annotations

import json
import pickle
import statistics
import time
import types
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from bench._gate_poll import group_names
from bench._report import table
from bench._rounds import timed
from gate import GateEvaluator, GateState, PollResult
from gate.evaluate._history import GateHistory, point_of
from gate.report._report import gate_status, gate_summary
from gate.service._config import StatusSettings
from gate.service._metrics import GateMetrics


def synthetic_poll(
    at: float, names: list[str], partitions: int, end: int, behind: int
) -> PollResult:
    """Every group at the end of every partition but every ``behind``-th, 50 records short."""
    return PollResult(
        started_at=at,
        finished_at=at,
        partition_counts={"t": partitions},
        end_offsets={("t", p): end for p in range(partitions)},
        committed={
            g: {
                ("t", p): end - (50 if behind and i % behind == 0 else 0) for p in range(partitions)
            }
            for i, g in enumerate(names)
        },
        monotonic=at,
    )


EVALUATION_SCENARIOS = {
    # name: (records arriving per cycle, every how many groups one is behind; 0: none)
    "caught up, nothing moves": (0, 0),
    "a tenth of the groups behind": (0, 10),
    "records arrive on every partition": (10, 0),
}


DEFAULT_SERIES_LIMIT = StatusSettings().metrics_group_partitions_max


def scrape_seconds(state: GateState, limit: int) -> tuple[float, int]:
    """What a Prometheus scrape of one gate in ``state`` costs (seconds, bytes), with its
    series per group and partition limited to ``limit`` group-partitions."""
    status = types.SimpleNamespace(metrics_group_partitions_max=limit)
    topics = sorted({topic for topic, _ in state.partitions})
    service = types.SimpleNamespace(
        store=types.SimpleNamespace(gates=[state.gate], latest=lambda _: state),
        config=types.SimpleNamespace(
            status=status, gates={state.gate: types.SimpleNamespace(topics=topics)}
        ),
        failing={},
        answered_at=time.monotonic(),
        redis=None,
    )
    registry = CollectorRegistry()
    GateMetrics(registry).watch(service)  # type: ignore[arg-type]
    size, seconds = timed(lambda: len(generate_latest(registry)))
    return seconds, size


def evaluation_times(
    groups: int, partitions: int, cycles: int, arriving: int, behind: int
) -> tuple[list[float], deque[GateState]]:
    """The seconds each evaluation of ``cycles`` polls took (after three that evaluate
    everything), and the last states."""
    names = group_names(groups)
    evaluator = GateEvaluator("a", ["t"], names)
    polls = [
        synthetic_poll(1000.0 + step, names, partitions, 100 + step * arriving, behind)
        for step in range(cycles + 3)
    ]
    times: list[float] = []
    states: deque[GateState] = deque(maxlen=5)
    for i, poll in enumerate(polls):
        state, seconds = timed(lambda poll=poll: evaluator.observe(poll))
        states.append(state)
        if i >= 3:  # the first polls evaluate everything
            times.append(seconds)
    return times, states


def serving_costs(states: deque[GateState], groups: int, partitions: int) -> dict[str, Any]:
    """What the serving process spends on such states: receiving one from the child process,
    and answering /status, /status/{gate}, its history and a scrape on the last (seconds,
    and bytes where the answer's size matters)."""
    crossing, sizes_sent = [], []
    for state in states:
        sent = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        crossing.append(timed(lambda sent=sent: pickle.loads(sent))[1])
        sizes_sent.append(len(sent))
    shown = pickle.loads(pickle.dumps(states[-1], protocol=pickle.HIGHEST_PROTOCOL))
    now = shown.snapshot.polled_at + 1.0
    found: dict[str, Any] = {
        "received": statistics.median(crossing),
        "state_bytes": statistics.median(sizes_sent),
        "summary_first": timed(lambda: gate_summary(shown, now))[1],  # (in this order)
        "summary_again": timed(lambda: gate_summary(shown, now + 1.0))[1],
    }
    detail, found["detail"] = timed(lambda: json.dumps(gate_status(shown, now + 2.0)))
    # ?groups=holding: as the status page of a fleet asks for it
    holding, found["holding"] = timed(
        lambda: json.dumps(gate_status(shown, now + 3.0, groups="holding"))
    )
    # /status/{gate}/history: 15 minutes of 5 s points, every group's or 12 of them.
    history = GateHistory(5.0, 900.0)
    history.points.extend(point_of(shown, step * 5.0) for step in range(180))
    found["history_bytes"], found["history"] = timed(lambda: len(json.dumps(history.to_json())))
    found["charted"] = timed(lambda: json.dumps(history.to_json(list(shown.groups)[:12])))[1]
    found["scrape"] = scrape_seconds(shown, DEFAULT_SERIES_LIMIT)
    found["scrape_all"] = scrape_seconds(shown, groups * partitions)
    return {**found, "detail_bytes": len(detail), "holding_bytes": len(holding)}


COLUMNS = [
    "scenario",
    "groups",
    "p50 ms",
    "µs per group-partition",
    "state received p50 ms",
    "/status first ask ms",
    "/status again ms",
    "/status/{gate} ms",
    "?groups=holding ms",
    "history ms",
    "history, 12 groups ms",
    "scrape ms",
    "scrape, every series ms",
]


def evaluation_bench(sizes: list[int], partitions: int, cycles: int) -> dict:
    """The evaluation alone, on polls built in memory: its cost per group-partition by fleet
    size when nothing moves (caught-up groups are not evaluated again), when a tenth of the
    groups is behind (those are, at every poll: their status can change with time alone), and
    when records arrive on every partition at every poll (every group is evaluated again)."""
    results: dict[str, dict[str, Any]] = {}
    rows = []
    for scenario, (arriving, behind) in EVALUATION_SCENARIOS.items():
        by_size: dict[str, Any] = {}
        for groups in sizes:
            times, states = evaluation_times(groups, partitions, cycles, arriving, behind)
            c = serving_costs(states, groups, partitions)
            del states
            p50 = statistics.median(times)
            per = p50 / (groups * partitions) * 1e6
            by_size[str(groups)] = {
                "p50_ms": round(p50 * 1000, 3),
                "us_per_group_partition": per,
                "received_p50_ms": round(c["received"] * 1000, 3),
                "state_bytes": c["state_bytes"],
                "status_summary_first_ms": round(c["summary_first"] * 1000, 3),
                "status_summary_again_ms": round(c["summary_again"] * 1000, 3),
                "status_detail_ms": round(c["detail"] * 1000, 3),
                "status_detail_bytes": c["detail_bytes"],
                "status_detail_holding_ms": round(c["holding"] * 1000, 3),
                "status_detail_holding_bytes": c["holding_bytes"],
                "history_ms": round(c["history"] * 1000, 3),
                "history_bytes": c["history_bytes"],
                "history_12_groups_ms": round(c["charted"] * 1000, 3),
                "scrape_default_ms": round(c["scrape"][0] * 1000, 3),
                "scrape_default_bytes": c["scrape"][1],
                "scrape_every_series_ms": round(c["scrape_all"][0] * 1000, 3),
                "scrape_every_series_bytes": c["scrape_all"][1],
            }
            ms = [c[k] * 1000 for k in ("received", "summary_first", "summary_again", "detail",
                                        "holding", "history", "charted")]  # fmt: skip
            rows.append(
                [scenario, groups, p50 * 1000, per, *ms, c["scrape"][0] * 1000,
                 c["scrape_all"][0] * 1000]
            )  # fmt: skip
        small, large = by_size[str(sizes[0])], by_size[str(sizes[-1])]
        by_size["linearity"] = round(
            large["us_per_group_partition"] / small["us_per_group_partition"], 3
        )
        results[scenario] = by_size
    table(
        f"Evaluation alone ({partitions} partitions, median of {cycles} polls built in memory)",
        COLUMNS,
        rows,
    )
    table(
        f"Linearity: cost per group-partition at {sizes[-1]} groups / at {sizes[0]} (target <= 1.2)",
        ["scenario", "ratio"],
        [[name, r["linearity"]] for name, r in results.items()],
    )
    return results
