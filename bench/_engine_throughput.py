"""The engine benchmark's second part: no-op throughput against plain confluent-kafka loops
(see ``bench.engine_bench``)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from bench._engine_runs import BatchCounter, Counter, FirstTimed, run_engine
from bench._pyrallel import Peer
from bench._report import table
from bench._rounds import best_and_median, interleaved
from bench._topics import CONSUMER, create_topic, fill, unique
from sdk import Options, Ordering
from sdk.consumer._config import FETCH_DEFAULTS


def plain_loop(bootstrap: str, topic: str, expected: int, at_least_once: bool) -> float:
    """A plain confluent-kafka loop calling a no-op handler; librdkafka commits in the
    background. By default librdkafka stores each offset as the record is handed out (a crash
    loses records handed out but not processed); ``at_least_once`` stores it after the handler
    returned, which is the engine's guarantee."""
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": f"plain-{random.random()}",
        **FETCH_DEFAULTS,  # (what the engine sets for its consumer)
        "enable.auto.offset.store": not at_least_once,
        **CONSUMER,
    }
    consumer = Consumer(config)
    consumer.subscribe([topic])
    handler = Counter()
    started = None
    store = consumer.store_offsets
    while handler.count < expected:
        for message in consumer.consume(1000, 1.0):
            if message.error() is None:
                if started is None:
                    started = time.perf_counter()
                handler(message)
                if at_least_once:
                    store(message)
    elapsed = time.perf_counter() - (started or time.perf_counter())
    consumer.close()
    return expected / elapsed


def engine_rate(
    bootstrap: str,
    topic: str,
    expected: int,
    ordering: Ordering,
    batch: int | None,
    max_buffered: int | None = None,
) -> tuple[float, int]:
    """Records per second and pauses, with default options but for ``max_concurrency=16``,
    the ordering, the batch size and (when given) ``max_buffered``. Timed as the plain loop
    is: from the first record handled to the last (not the engine's start or stop)."""
    handler = FirstTimed(BatchCounter() if batch else Counter(), expected)
    options = Options(
        ordering=ordering, max_concurrency=16, batch_size=batch, max_buffered=max_buffered
    )
    stats = run_engine(bootstrap, topic, handler, options, expected)
    return expected / (handler.last - handler.first), stats.get("pauses", 0)


PEER_WORKLOADS = {
    "pyrallel-consumer, KEY (key_hash), single record": ("key", "KEY, single record"),
    "pyrallel-consumer, UNORDERED, single record": ("unordered", "UNORDERED, single record"),
}
"""The peer's runs in the throughput table, and the engine's row each is compared with."""
PLAINS = {
    "plain loop (offsets stored when handed out)": False,
    "plain loop (offsets stored after processing)": True,
}
ENGINES: dict[str, tuple[Ordering, int | None, int | None]] = {
    "KEY, single record": (Ordering.KEY, None, None),
    "KEY, batch of 500": (Ordering.KEY, 500, None),
    "UNORDERED, single record": (Ordering.UNORDERED, None, None),
    "UNORDERED, batch of 500": (Ordering.UNORDERED, 500, None),
    "KEY, single record, max_buffered=20,000": (Ordering.KEY, None, 20_000),
}


def throughput(
    bootstrap: str, admin: AdminClient, records: int, rounds: int, peer: Peer
) -> dict[str, Any]:
    topic = unique("throughput")
    create_topic(admin, topic, 12)
    keys = [f"key-{i}".encode() for i in range(100_000)]
    rng = random.Random(1)
    fill(bootstrap, topic, records, lambda i: keys[rng.randrange(len(keys))], partitions=12)
    pauses: dict[str, int] = {}

    def engine(name: str) -> float:
        rate, paused = engine_rate(bootstrap, topic, records, *ENGINES[name])
        pauses[name] = max(pauses.get(name, 0), paused)
        return rate

    def pyrallel(ordering: str) -> float | None:
        # Its default max_in_flight (1,000): with 16, its unordered run had not finished
        # 300,000 records after two minutes (a no-op handler needs no concurrency).
        ran = peer.run(bootstrap, topic, records, ordering, 0, "noop")
        return None if ran is None else records / ran["seconds"]

    variants: dict[str, Callable[[], float | None]] = {
        name: lambda at_least_once=at_least_once: plain_loop(
            bootstrap, topic, records, at_least_once
        )
        for name, at_least_once in PLAINS.items()
    }
    variants.update({name: lambda name=name: engine(name) for name in ENGINES})
    if peer.python is not None:
        variants.update(
            {name: lambda o=ordering: pyrallel(o) for name, (ordering, _) in PEER_WORKLOADS.items()}
        )
    results = interleaved(variants, rounds, progress="throughput rounds")
    results = {
        name: rates for name, rates in results.items() if rates or name not in PEER_WORKLOADS
    }
    best, median = best_and_median(results)
    fast_loop, same_loop = PLAINS  # stored when handed out; stored after processing
    fast, same, same_median = best[fast_loop], best[same_loop], median[same_loop]
    table(
        f"No-op throughput: {records:,} records, 12 partitions, 100k keys, best of {rounds}; "
        "engine: default options, max_concurrency=16; pyrallel-consumer: its defaults "
        "(asyncio, max_in_flight=1,000)",
        ["consumer", "records/s", "x plain (stored when handed out)", "x plain (stored after)",
         "medians: x plain (stored after)", "pauses"],
        [
            [name, round(rate), round(rate / fast, 3), round(rate / same, 3),
             round(median[name] / same_median, 3), pauses.get(name, "-")]
            for name, rate in best.items()
        ],
    )  # fmt: skip
    ratios = {
        name: {
            "vs_plain_stored_when_handed_out": round(rate / fast, 3),
            "vs_plain_stored_after_processing": round(rate / same, 3),
            "medians_vs_plain_stored_after_processing": round(median[name] / same_median, 3),
        }
        for name, rate in best.items()
    }
    return {"records_per_second": best, "ratios": ratios, "pauses": pauses, "runs": results}
