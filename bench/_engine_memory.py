"""The engine benchmark's fourth part: peak memory with a backlog and a handler that blocks
(see ``bench.engine_bench``)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

from confluent_kafka.admin import AdminClient
from rich.progress import track

from bench._engine_runs import new_engine
from bench._proc import rss_bytes
from bench._report import console, table
from bench._topics import create_topic, fill, unique
from sdk import Options, Ordering


def memory_probe(bootstrap: str, topic: str, max_buffered: int, seconds: float) -> dict[str, Any]:
    """Runs in a child process: RSS before, and at most while a blocked handler holds work."""
    release = threading.Event()

    def handler(record: Any) -> None:
        release.wait()

    before = rss_bytes() or 0
    options = Options(ordering=Ordering.KEY, max_concurrency=16, max_buffered=max_buffered)
    consumer = new_engine(bootstrap, topic, handler, options, "mem")
    consumer.start()
    peak, held = before, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, rss_bytes() or 0)
        held = max(held, consumer.stats().get("held", 0))
        time.sleep(0.05)
    release.set()
    consumer.stop(drain=False, timeout=5)
    return {
        "max_buffered": max_buffered,
        "rss_before_mb": round(before / 2**20, 1),
        "rss_peak_mb": round(peak / 2**20, 1),
        "growth_mb": round((peak - before) / 2**20, 1),
        "max_held_records": held,
    }


def memory(
    bootstrap: str, admin: AdminClient, records: int, seconds: float
) -> list[dict[str, Any]]:
    topic = unique("backlog")
    create_topic(admin, topic, 12)
    fill(bootstrap, topic, records, lambda i: f"k{i % 100_000}".encode(), partitions=12)
    rows = []
    for max_buffered in track((1_000, 10_000, 100_000), description="memory", console=console):
        code = f"import json; from bench._engine_memory import memory_probe; print(json.dumps(memory_probe({bootstrap!r}, {topic!r}, {max_buffered}, {seconds})))"
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            timeout=seconds + 120,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    table(
        f"Memory with a backlog of {records:,} records and a blocked handler ({seconds:.0f}s)",
        ["max_buffered", "RSS before MB", "RSS peak MB", "growth MB", "records held (max)"],
        [[r[key] for key in r] for r in rows],  # (in the columns' order)
    )
    return rows
