"""The engine benchmark's core measurement: the consumer thread's time per record in the
engine's core, compiled and pure, without a broker (see ``bench.engine_bench``)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from typing import Any

from confluent_kafka import Message

from bench._report import table
from bench._rounds import interleaved
from sdk import Options, Ordering
from sdk.consumer import _collector
from sdk.engine._compiled import COMPILED, PURE_ENV, PURE_REASON
from sdk.engine._core import WorkCore
from sdk.engine._shards import ItemShape


class _Message:
    """Just what the core reads of a confluent-kafka message (for a confluent-kafka that
    cannot build its own messages)."""

    __slots__ = ("_key", "_offset", "_partition")

    def __init__(self, partition: int, offset: int, key: bytes) -> None:
        self._partition, self._offset, self._key = partition, offset, key

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)

    def error(self) -> None:
        return None


def message(partition: int, offset: int, key: bytes) -> Any:
    """A confluent-kafka message built in memory (its methods are the real ones)."""
    try:
        return Message(topic="t", partition=partition, offset=offset, key=key, value=b"")
    except TypeError:  # an older confluent-kafka builds none
        return _Message(partition, offset, key)


_FULL = Options().max_item_records
CORE_WORKLOADS = {
    "KEY, single record": (Ordering.KEY, ItemShape(_FULL, _FULL, _FULL), _FULL),
    "KEY, batch of 500": (Ordering.KEY, ItemShape(500, 1, 500), 0),
    "UNORDERED, single record": (Ordering.UNORDERED, ItemShape(_FULL, _FULL, _FULL), _FULL),
}


def core_round(records: int) -> dict[str, float]:
    """One round of the core measurement (see :func:`core_cost`) in this process: seconds
    per workload."""
    rng = random.Random(1)
    keys = [f"key-{i}".encode() for i in range(100_000)]
    messages = [message(i % 12, i // 12, keys[rng.randrange(len(keys))]) for i in range(records)]
    fetches = [
        sorted(messages[i : i + 5000], key=lambda m: m.partition()) for i in range(0, records, 5000)
    ]
    seconds = {}
    # The collector's threshold as a running engine sets it by default (at the interpreter's
    # 700 the collector would walk every held record every few hundred records).
    _collector.raise_threshold(Options().gc_threshold)
    for name, (ordering, shape, follow_on) in CORE_WORKLOADS.items():
        limit = Options(ordering=ordering, max_concurrency=16).buffer_limit  # default
        core = WorkCore(ordering, buffer_limit=limit, follow_on=follow_on)
        for partition in range(12):
            core.assign(("t", partition), 0)
        started = time.perf_counter()
        fetched, finished, now = 0, 0, 0.0
        running: list[Any] = []
        while finished < records:
            if fetched < len(fetches) and core.room(now) >= 5000:
                core.add_messages(fetches[fetched], now)
                fetched += 1
            running += core.take(now, 64 - len(running), shape)
            half = max(1, len(running) // 2)
            for item in running[:half]:
                core.complete(item.id, [None] * len(item.entries), now)
                finished += len(item.entries)
            del running[:half]
            now += 0.001
        seconds[name] = time.perf_counter() - started
    _collector.restore()
    return seconds


def core_in_child(core: str, records: int) -> dict[str, float]:
    """:func:`core_round` in a fresh process, on the compiled or the ``pure`` core."""
    code = f"import json; from bench._engine_core import core_round; print(json.dumps(core_round({records})))"
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    if core == "pure":
        env[PURE_ENV] = "1"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    found: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def core_cost(records: int = 300_000, rounds: int = 3) -> list[dict[str, Any]]:
    """The consumer thread's Python time per record in the engine's core, without a broker
    or workers, compiled and pure Python alternating in fresh processes: records registered
    in fetches of 5,000 (12 partitions, 100,000 random keys), taken into items 64 at a time,
    half of the items completed each turn, with the default buffer and items shaped as the
    engine shapes them for a fast handler (single records: items of up to
    ``max_item_records``, which records of a running key may join; batches: one record per
    shard). Best of ``rounds`` for each core."""
    cores = ["compiled", "pure"] if COMPILED else ["pure"]
    runs = interleaved(
        {core: lambda core=core: core_in_child(core, records) for core in cores},
        rounds,
        order="alternate",
    )
    best = {core: {name: min(run[name] for run in runs[core]) for name in CORE_WORKLOADS}
            for core in cores}  # fmt: skip
    rows = []
    for name in CORE_WORKLOADS:
        row: dict[str, Any] = {"workload": name}
        for core in cores:
            row[f"us_per_record_{core}"] = round(best[core][name] / records * 1e6, 2)
        if COMPILED:
            row["pure_over_compiled"] = round(best["pure"][name] / best["compiled"][name], 2)
        rows.append(row)
    note = "" if COMPILED else f" (the compiled core is not available: {PURE_REASON})"
    table(
        f"The core's consumer-thread time per record ({records:,} records, no broker, "
        f"best of {rounds}){note}",
        [
            "workload",
            *[f"{core} (us)" for core in cores],
            *(["pure / compiled"] if COMPILED else []),
        ],
        [[r["workload"], *list(r.values())[1:]] for r in rows],
    )
    return rows
