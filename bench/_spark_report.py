"""The Spark source benchmark's tables: each reader's rows/s and time per batch over the
rounds, and the live query's batches (see ``bench.spark_bench``)."""

from __future__ import annotations

import statistics
from typing import Any

from bench._report import console, percentile, table

TRIGGER_MS = 1000  # the live query's trigger
ONE_BATCH = "gating off, one batch"
MICRO_BATCHES = "gating off, 4 micro-batches"
CEILING_MICRO_BATCHES = "ceiling, 4 micro-batches"
GATED = "gated, one batch"


def summary(results: list[dict[str, Any]]) -> dict[str, float]:
    rates = [r["rows_per_second"] for r in results]
    walls = [r["wall_seconds"] for r in results]
    cpu = [r["python_cpu_us_per_row"] for r in results if "python_cpu_us_per_row" in r]
    found = {
        "best": max(rates),
        "median": statistics.median(rates),
        "wall_median": statistics.median(walls),
        "cpu_us_per_row": statistics.median(cpu) if cpu else float("nan"),
    }
    for name in ("add_batch_ms", "planning_ms", "spark_logs_ms", "trigger_ms"):
        if name in results[0]:
            found[name] = statistics.median(ms for r in results for ms in r[name])
    if "batches" in results[0]:
        found["batches"] = statistics.median(r["batches"] for r in results)
    return found


def report(master: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    sums = {name: summary(results) for name, results in runs.items()}
    loop, ceiling = sums["plain loop"]["median"], sums["ceiling (prebuilt Arrow)"]["median"]
    table(
        f"{master}: rows/s (Spark's over addBatch) over {len(runs['plain loop'])} interleaved "
        "rounds",
        ["reader", "best", "median", "vs loop", "vs ceiling", "median wall s", "py µs/row"],
        [
            [
                name,
                s["best"],
                s["median"],
                s["median"] / loop,
                s["median"] / ceiling,
                s["wall_median"],
                s["cpu_us_per_row"],
            ]
            for name, s in sums.items()
        ],
    )
    table(
        f"{master}: time per batch (ms, median over the rounds' batches)",
        ["reader", "batches", "addBatch", "source planning", "Spark's logs", "whole batch"],
        [
            [
                name,
                round(s["batches"]),
                s["add_batch_ms"],
                s["planning_ms"],
                s["spark_logs_ms"],
                s["trigger_ms"],
            ]
            for name, s in sums.items()
            if "batches" in s
        ],
    )
    # Spark's own Python processes (planner, workers, their imports) cost the ceiling's CPU
    # too: what a Kafka reader spends above it is the reading, to set beside the plain loop.
    spark_python = sums["ceiling (prebuilt Arrow)"]["cpu_us_per_row"]
    for name in (ONE_BATCH, GATED):
        sums[name]["cpu_above_ceiling_us_per_row"] = sums[name]["cpu_us_per_row"] - spark_python
    console.print(
        f"{master}: Python CPU per row above the ceiling's: gating off "
        f"{sums[ONE_BATCH]['cpu_above_ceiling_us_per_row']:.2f} µs, gated "
        f"{sums[GATED]['cpu_above_ceiling_us_per_row']:.2f} µs; the plain loop "
        f"{sums['plain loop']['cpu_us_per_row']:.2f} µs"
    )
    gated, off = sums[GATED], sums[ONE_BATCH]
    ratios = {
        "one_batch_vs_loop": off["median"] / loop,
        "micro_batches_vs_loop": sums[MICRO_BATCHES]["median"] / loop,
        "micro_batches_vs_ceiling": sums[MICRO_BATCHES]["median"]
        / sums[CEILING_MICRO_BATCHES]["median"],
        "gated_vs_off_rows": gated["median"] / off["median"],
        "gated_vs_off_wall": off["wall_median"] / gated["wall_median"],
    }
    console.print(
        f"{master}: against the plain loop: one batch {ratios['one_batch_vs_loop']:.2f} "
        f"(target >= 1.0), 4 micro-batches {ratios['micro_batches_vs_loop']:.2f} (target "
        f">= 0.9; {ratios['micro_batches_vs_ceiling']:.2f} of the ceiling's 4 micro-batches); "
        f"gated / gating off {ratios['gated_vs_off_rows']:.3f} on rows/s, "
        f"{ratios['gated_vs_off_wall']:.3f} on wall time (targets >= 0.9)"
    )
    return {"summary": sums, **ratios, "runs": runs}


def report_live(master: str, rate: float, live: dict[str, Any]) -> dict[str, Any]:
    rows = [
        [name, statistics.median(live[key]), percentile(live[key], 90), max(live[key])]
        for name, key in (
            ("records", "batch_rows"),
            ("addBatch (the batch's job)", "add_batch_ms"),
            ("source planning (latestOffset + getBatch)", "planning_ms"),
            ("Spark's logs (walCommit + commitOffsets)", "spark_logs_ms"),
            ("whole batch (triggerExecution)", "trigger_ms"),
        )
    ]
    table(
        f"{master}: live query, {live['batches']} batches ({rate:g} records/s, 1 s trigger, "
        "noop sink): per batch (ms)",
        ["", "median", "p90", "max"],
        rows,
    )
    behind = sum(1 for ms in live["trigger_ms"] if ms > TRIGGER_MS)
    console.print(
        f"{master}: live batches' addBatch {statistics.median(live['add_batch_ms']):.0f} ms at "
        f"the median (target <= 200); longer than the trigger: {behind} of {live['batches']}"
    )
    return {**live, "behind_trigger": behind}
