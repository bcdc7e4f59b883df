"""Benchmark output: a table on the terminal and a JSON file under bench/results/."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).resolve().parent / "results"
console = Console(width=None if sys.stdout.isatty() else 160)  # files get whole tables


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "max_ms": round(max(ms), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    out = Table(title=title)
    for column in columns:
        out.add_column(column, justify="left" if column == columns[0] else "right")
    for row in rows:
        out.add_row(*[_cell(cell) for cell in row])
    console.print(out)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2) + "\n")
    console.print(f"[dim]wrote {path}[/]")
    return path


def targets(verdict: Sequence[tuple[str, bool]]) -> None:
    """The table of a benchmark's targets: each, and whether this run met it."""
    table("Targets", ["target", "met"], [[name, "yes" if ok else "NO"] for name, ok in verdict])
