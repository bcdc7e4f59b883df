"""Gating benchmarks.

1. Release latency: from a dependency's commit (acknowledged) to the dependent's handler
   starting the records it released, at about 1,000 records/s, for the Redis, HTTP-stream and
   embedded sources. The dependency trails production by 150 ms, so the dependent has
   fetched and holds each record when it is released (the situation gating is for).
   Each latency splits into the gate's part (the commit acknowledged to the snapshot
   received by the dependent: the gate's poll and publication) and the engine's part (the
   snapshot received to the handler started).
   Targets: Redis p99 <= 25 ms; embedded p99 <= its poll interval + 25 ms.
2. The cost of gating when the dependencies are far ahead: the same engine gated (every
   record already released) and ungated, five rounds, each variant first in every other
   one. Target: the best rounds' ratio >= 0.95 (the medians' ratio is shown too: one
   variant's rounds differ by up to 2x on a shared machine).

Run: ``python -m bench.gating_bench [--quick]``.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import sys
import threading
import time
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from rich.progress import track

from bench._engine_runs import Counter, FirstTimed, new_engine
from bench._options import parser
from bench._processes import config_file, serving
from bench._report import console, summary_ms, table, targets, write
from bench._rounds import best_and_median, interleaved, wait_until
from bench._topics import create_topic, fill, group_far_ahead, unique
from demo._local import LocalBroker, LocalRedis, free_port
from sdk import EmbeddedSource, Gate, HttpSource, Options, Ordering, RedisSource

GATE_POLL = 0.01
EMBEDDED_POLL = 0.2


class Dependency(threading.Thread):
    """Processes each record ``lag`` seconds after it was produced (so the dependent has
    fetched it and holds it, as when a dependent runs ahead), commits every few
    milliseconds, and notes when each commit was acknowledged."""

    lag = 0.15

    def __init__(self, bootstrap: str, topic: str, group: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.group, self.partitions = (
            bootstrap,
            topic,
            group,
            partitions,
        )
        self.acknowledged: list[tuple[float, int, int]] = []  # (time, partition, offset)
        self.stop_event = threading.Event()

    def run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
        pending: dict[int, int] = {}
        last = time.monotonic()
        while not self.stop_event.is_set():
            for message in consumer.consume(100, 0.002):
                if message.error() is None:
                    due = message.timestamp()[1] / 1000 + self.lag
                    time.sleep(max(0.0, due - time.time()))
                    pending[message.partition()] = message.offset() + 1
            if pending and time.monotonic() - last >= 0.005:
                consumer.commit(
                    offsets=[TopicPartition(self.topic, p, o) for p, o in pending.items()],
                    asynchronous=False,
                )
                now = time.monotonic()
                self.acknowledged += [(now, p, o) for p, o in pending.items()]
                pending.clear()
                last = now
        consumer.close()

    def released_at(self, partition: int, offset: int) -> float | None:
        for when, p, committed in self.acknowledged:
            if p == partition and committed > offset:
                return when
        return None


class Arrivals:
    """When the dependent's gate received each raised watermark (a listener on its view, added
    before the engine's own), so a release's latency splits into the gate's part (commit
    acknowledged to snapshot received) and the engine's (snapshot received to handler
    started)."""

    def __init__(self) -> None:
        self.raised: dict[int, list[tuple[int, float]]] = {}  # partition: (watermark, when)

    def __call__(self, snapshot: Any) -> None:
        now = time.monotonic()
        for (_, partition), watermark in snapshot.watermarks.items():
            seen = self.raised.setdefault(partition, [])
            if watermark is not None and (not seen or watermark > seen[-1][0]):
                seen.append((watermark, now))

    def received_at(self, partition: int, offset: int) -> float | None:
        seen = self.raised.get(partition, [])
        at = bisect.bisect_right(seen, (offset, math.inf))  # the first watermark above offset
        return seen[at][1] if at < len(seen) else None


def gate_service(
    stack: contextlib.ExitStack, bootstrap: str, topic: str, group: str, redis_url: str | None
) -> str:
    """The gate running as its own process, as deployed (not sharing this process's GIL),
    while ``stack`` is open, publishing to Redis when ``redis_url`` is given; its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = {
        "kafka": {"bootstrap.servers": bootstrap},
        "poll_interval_ms": int(GATE_POLL * 1000),
        "gates": {"a": {"topics": [topic], "depends_on": [group]}},
        "http": {"host": "127.0.0.1", "port": port},
        **({"redis": {"url": redis_url}} if redis_url is not None else {}),
    }
    path = stack.enter_context(config_file(config))
    command = [sys.executable, "-m", "gate.cli", "serve", "--config", str(path),
               "--log-level", "warning"]  # fmt: skip
    stack.enter_context(serving(command, f"{url}/healthz", 30))
    return url


def latency_run(
    bootstrap: str, admin: AdminClient, source_name: str, seconds: float, redis_url: str | None
) -> dict[str, Any]:
    topic = unique(f"latency-{source_name}")
    partitions = 4
    create_topic(admin, topic, partitions)
    dependency_group = unique("dep")
    with contextlib.ExitStack() as stack:
        if source_name == "embedded":
            source: Any = EmbeddedSource(
                {"bootstrap.servers": bootstrap},
                [topic],
                [dependency_group],
                poll_interval=EMBEDDED_POLL,
            )
        else:
            redis = redis_url if source_name == "redis" else None
            url = gate_service(stack, bootstrap, topic, dependency_group, redis)
            source = RedisSource(redis_url) if source_name == "redis" else HttpSource(url)
        starts, arrivals, dependency, produced = released_records(
            bootstrap, topic, partitions, dependency_group, source, seconds
        )
    latencies, gate_part, engine_part = [], [], []
    for (partition, offset), start in starts.items():
        released = dependency.released_at(partition, offset)
        if released is None:
            continue
        latencies.append(max(0.0, start - released))
        received = arrivals.received_at(partition, offset)
        if received is not None:
            gate_part.append(max(0.0, received - released))
            engine_part.append(max(0.0, start - received))
    stats = summary_ms(latencies)
    return {
        "source": source_name,
        "records": produced,
        "rate_per_s": round(produced / seconds),
        **stats,
        "gate_part": summary_ms(gate_part),
        "engine_part": summary_ms(engine_part),
    }


def released_records(
    bootstrap: str, topic: str, partitions: int, dependency_group: str, source: Any, seconds: float
) -> tuple[dict[tuple[int, int], float], Arrivals, Dependency, int]:
    """The dependent gated through ``source`` while records are produced for ``seconds`` and
    the dependency follows them: when its handler started each record, when its gate received
    each raised watermark, the dependency's commits, and the records produced."""
    starts: dict[tuple[int, int], float] = {}

    def handle(record: Any) -> None:
        starts.setdefault((record.partition, record.offset), time.monotonic())

    handle.count = 0  # type: ignore[attr-defined]
    gate = Gate("a", [source])
    arrivals = Arrivals()
    gate.view.add_listener(arrivals)
    # Tansu holds a fetch for the whole fetch.wait.max.ms (500 ms by default) even when
    # records arrive meanwhile; Apache Kafka answers at once. Without this the figure would
    # measure this broker's fetch, not gating.
    options = Options(ordering=Ordering.KEY, max_concurrency=16)
    consumer = new_engine(bootstrap, topic, handle, options, "a", gate, **{"fetch.wait.max.ms": 10})
    consumer.start()
    dependency = Dependency(bootstrap, topic, dependency_group, partitions)
    time.sleep(4)  # the dependent joined its group
    dependency.start()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    produced = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:  # about 1,000 records/s
        for _ in range(10):
            producer.produce(
                topic, key=f"k{produced % 97}".encode(), value=b"x", partition=produced % partitions
            )
            produced += 1
        producer.poll(0)
        time.sleep(max(0.0, started + produced / 1000 - time.monotonic()))
    producer.flush(10)
    wait_until(lambda: len(starts) >= produced, 60)
    consumer.stop()
    dependency.stop_event.set()
    dependency.join(10)
    return starts, arrivals, dependency, produced


def gated_rate(bootstrap: str, topic: str, records: int, dependency: str | None) -> float:
    """Records per second of the engine, gated on ``dependency`` (an embedded source) or not
    gated (None), from the first record handled to the last."""
    handler = FirstTimed(Counter())
    gate = None
    if dependency is not None:
        source = EmbeddedSource(
            {"bootstrap.servers": bootstrap},
            [topic],
            [dependency],
            poll_interval=EMBEDDED_POLL,
        )
        gate = Gate("a", [source]).start()
        gate.wait_for_snapshot(10)
    options = Options(ordering=Ordering.KEY, max_concurrency=16)  # defaults otherwise
    engine = new_engine(bootstrap, topic, handler, options, "cost", gate)
    engine.start()
    if not wait_until(lambda: handler.count >= records, 600):
        name = "ungated" if gate is None else "gated"
        raise SystemExit(f"{name} run stalled at {handler.count}")
    rate = records / (time.perf_counter() - handler.first)
    engine.stop(timeout=10)
    if gate is not None:
        gate.stop()  # started here, so not the engine's to stop
    return rate


def gating_cost(bootstrap: str, admin: AdminClient, records: int, rounds: int) -> dict[str, Any]:
    topic = unique("cost")
    create_topic(admin, topic, 12)
    fill(bootstrap, topic, records, lambda i: f"key-{i % 100_000}".encode(), partitions=12)
    dependency, _ = group_far_ahead(bootstrap, topic, 12)
    # Each round swaps which variant runs first (the machine's load drifts within a round).
    rates = interleaved(
        {
            "ungated": lambda: gated_rate(bootstrap, topic, records, None),
            "gated": lambda: gated_rate(bootstrap, topic, records, dependency),
        },
        rounds,
        order="alternate",
        progress="gated vs ungated",
    )
    best, median = best_and_median(rates)
    return {
        "records": records,
        "rounds": rounds,
        "records_per_second": best,
        "median_records_per_second": median,
        "runs": rates,
        "ratio": round(best["gated"] / best["ungated"], 3),
        "median_ratio": round(median["gated"] / median["ungated"], 3),
    }


def main() -> None:
    options = parser(__doc__)
    options.add_argument("--quick", action="store_true")
    args = options.parse_args()
    seconds = 5 if args.quick else 15
    results: dict[str, Any] = {}
    with LocalBroker() as broker, LocalRedis() as redis_server:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        rows = []
        for source in track(
            ("redis", "http", "embedded"), description="release latency", console=console
        ):
            rows.append(latency_run(broker.bootstrap, admin, source, seconds, redis_server.url))
        results["latency"] = rows
        table(
            f"Release latency at ~1,000 records/s (gate polls every {GATE_POLL * 1000:.0f} ms; embedded every {EMBEDDED_POLL * 1000:.0f} ms)",
            ["source", "records", "p50 ms", "p99 ms", "max ms", "gate's part p50 / p99 ms",
             "engine's part p50 / p99 ms"],
            [
                [r["source"], r["records"], r["p50_ms"], r["p99_ms"], r["max_ms"],
                 f"{r['gate_part']['p50_ms']} / {r['gate_part']['p99_ms']}",
                 f"{r['engine_part']['p50_ms']} / {r['engine_part']['p99_ms']}"]
                for r in rows
            ],
        )  # fmt: skip
        cost = results["cost"] = gating_cost(
            broker.bootstrap, admin, 100_000 if args.quick else 300_000, 1 if args.quick else 5
        )
        table(
            f"Gating cost with the dependencies far ahead: {cost['records']:,} records, "
            f"{cost['rounds']} interleaved round{'s' if cost['rounds'] != 1 else ''}",
            ["engine", "records/s (best)", "records/s (median)"],
            [
                [name, round(rate), round(cost["median_records_per_second"][name])]
                for name, rate in cost["records_per_second"].items()
            ]
            + [["gated / ungated", cost["ratio"], cost["median_ratio"]]],
        )
    write("gating", results)
    by_source = {r["source"]: r for r in results["latency"]}
    verdict = [
        (
            f"Redis p99 <= 25 ms ({by_source['redis']['p99_ms']} ms)",
            by_source["redis"]["p99_ms"] <= 25,
        ),
        (
            f"embedded p99 <= {EMBEDDED_POLL * 1000 + 25:.0f} ms ({by_source['embedded']['p99_ms']} ms)",
            by_source["embedded"]["p99_ms"] <= EMBEDDED_POLL * 1000 + 25,
        ),
        (f"gated / ungated >= 0.95 ({results['cost']['ratio']})", results["cost"]["ratio"] >= 0.95),
    ]
    targets(verdict)


if __name__ == "__main__":
    main()
