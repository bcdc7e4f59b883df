"""The engine benchmark's first part: the Parallel Consumer README's comparison (see
``bench.engine_bench``)."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from confluent_kafka.admin import AdminClient
from rich.progress import track

from bench._engine_runs import run_engine
from bench._pyrallel import Peer
from bench._report import console, table
from bench._topics import create_topic, fill, unique
from sdk import Options, Ordering

# The Java library's README, same workload (10,000 records, 0-5 ms, concurrency 100).
JAVA_FIGURES = {
    ("partition", None): 22.221,
    ("key", 1): 26.743,
    ("key", 2): 13.576,
    ("key", 5): 5.916,
    ("key", 10): 3.310,
    ("key", 20): 2.242,
    ("key", 50): 2.204,
    ("key", 100): 2.178,
    ("key", 1000): 2.056,
    ("key", 10000): 2.128,
    ("unordered", None): 2.829,
}


class SleepHandler:
    """Sleeps a fixed pseudo-random 0-5 ms per offset; records what it really slept."""

    def __init__(self, keys: int | None) -> None:
        self.keys = keys
        self.count = 0
        self.first: float | None = None
        self.last = 0.0
        self.slept: dict[int, float] = {}
        self.lock = threading.Lock()

    def __call__(self, record: Any) -> None:
        offset = record.offset
        started = time.perf_counter()
        if self.first is None:
            self.first = started
        time.sleep(random.Random(offset).uniform(0, 0.005))
        ended = time.perf_counter()
        with self.lock:
            self.slept[offset] = ended - started
            self.count += 1
            self.last = max(self.last, ended)


def ideal_bound(
    slept: dict[int, float], keys: int | None, ordering: str, concurrency: int
) -> float:
    total = sum(slept.values())
    if ordering == "partition":
        longest = total
    elif ordering == "key":
        per_key: dict[int, float] = {}
        for offset, seconds in slept.items():
            per_key[offset % keys] = per_key.get(offset % keys, 0.0) + seconds  # type: ignore[operator]
        longest = max(per_key.values())
    else:
        longest = max(slept.values())
    return max(longest, total / concurrency)


def pc_table(bootstrap: str, admin: AdminClient, records: int, peer: Peer) -> list[dict[str, Any]]:
    cases: list[tuple[str, int | None]] = [("partition", None)]
    cases += [("key", k) for k in (1, 2, 5, 10, 20, 50, 100, 1000, 10000)]
    cases.append(("unordered", None))
    rows, topics = [], []
    for ordering, keys in track(cases, description="comparison table", console=console):
        topic = unique(f"pc-{ordering}-{keys}")
        topics.append(topic)
        create_topic(admin, topic, 1)
        key_count = keys or 20
        fill(bootstrap, topic, records, lambda i, k=key_count: f"k{i % k}".encode())
        handler = SleepHandler(keys)
        options = Options(ordering=Ordering(ordering), max_concurrency=100)  # defaults
        stats = run_engine(bootstrap, topic, handler, options, records)
        duration = handler.last - (handler.first or handler.last)
        bound = ideal_bound(handler.slept, keys, ordering, 100)
        row = {
            "ordering": ordering,
            "keys": keys,
            "seconds": round(duration, 3),
            "ideal_seconds": round(bound, 3),
            "ratio_to_ideal": round(duration / bound, 3),
            "pauses": stats.get("pauses"),
            "java_seconds": JAVA_FIGURES[(ordering, keys)],
        }
        rows.append(row)
    # The peer reads the same topics once every engine row is done, so its runs never share
    # the broker with the engine's.
    for row, topic in zip(rows, topics, strict=True):
        ordering, keys = row["ordering"], row["keys"]
        ran = peer.run(bootstrap, topic, records, ordering, 100, "sleep")
        if ran is not None:
            slept = {int(offset): seconds for offset, seconds in ran["slept"].items()}
            row["pyrallel_seconds"] = round(ran["seconds"], 3)
            row["pyrallel_ratio_to_ideal"] = round(
                ran["seconds"] / ideal_bound(slept, keys, ordering, 100), 3
            )
    table(
        f"Parallel Consumer comparison: {records:,} records, 0-5 ms each, concurrency 100, "
        "default options (pyrallel-consumer: its defaults, max_in_flight=100, awaited sleeps)",
        ["ordering", "keys", "seconds", "ideal s", "x ideal", "pauses", "pyrallel s",
         "pyrallel x ideal", "Java s"],
        [
            [
                r["ordering"],
                r["keys"] or "-",
                r["seconds"],
                r["ideal_seconds"],
                r["ratio_to_ideal"],
                r["pauses"],
                r.get("pyrallel_seconds", "-"),
                r.get("pyrallel_ratio_to_ideal", "-"),
                r["java_seconds"],
            ]
            for r in rows
        ],
    )  # fmt: skip
    return rows
