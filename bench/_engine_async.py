"""The engine benchmark's third part: simulated I/O with coroutine handlers (see
``bench.engine_bench``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from confluent_kafka.admin import AdminClient
from rich.progress import track

from bench._engine_runs import run_engine
from bench._report import console, table
from bench._topics import create_topic, fill, unique
from sdk import Options, Ordering

# Other engines' published figures for the simulated I/O workload (their machines).
ASYNC_FIGURES = {
    0.001: {"java parallel consumer": 63_986, "kpipe": 52_949},
    0.010: {"java parallel consumer": 8_700, "kpipe": 34_465},
    0.100: {"java parallel consumer": 968, "kpipe": 5_228},
}


class SleepyCoroutine:
    """A coroutine handler simulating I/O; tracks the first start and last end."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.count = 0
        self.first = 0.0
        self.last = 0.0

    async def __call__(self, record: Any) -> None:
        if not self.first:
            self.first = time.perf_counter()
        await asyncio.sleep(self.delay)
        self.count += 1
        self.last = time.perf_counter()


def async_io(bootstrap: str, admin: AdminClient, records: int) -> list[dict[str, Any]]:
    rows = []
    cases = [
        (delay, concurrency) for delay in (0.001, 0.010, 0.100) for concurrency in (1000, 5000)
    ]
    for delay, concurrency in track(cases, description="simulated I/O", console=console):
        topic = unique("async")
        create_topic(admin, topic, 1)
        fill(bootstrap, topic, records, lambda i: f"k{i % 10_000}".encode())
        handler = SleepyCoroutine(delay)
        options = Options(ordering=Ordering.KEY, max_concurrency=concurrency)  # defaults
        run_engine(bootstrap, topic, handler, options, records)
        rate = records / (handler.last - handler.first)
        row: dict[str, Any] = {
            "sleep_ms": delay * 1000,
            "concurrency": concurrency,
            "records_per_second": round(rate),
        }
        row.update({f"{name} (published)": figure for name, figure in ASYNC_FIGURES[delay].items()})
        rows.append(row)
    table(
        f"Simulated I/O: {records:,} records, KEY over 10,000 keys, coroutine handlers, "
        "default options",
        ["sleep ms", "concurrency", "records/s", "Java PC (published)", "kpipe (published)"],
        [[r[key] for key in r] for r in rows],  # (in the columns' order)
    )
    return rows
