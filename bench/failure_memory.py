"""Memory while failures go on: what Python holds once records that failed were retried.

One partition, KEY ordering, ``--values`` KB values; a handler (plain function, coroutine or
batch) raises ``RetriableError`` on the first attempt of every record, or of 1 % of them.
Once every record is processed and committed, the Python heap the run added (tracemalloc,
after a collection) is compared with the documented bound: ``max_buffered`` plus one share of
records (one partition: twice the buffer) times the value size.

Run: ``python -m bench.failure_memory [--records 6000] [--values 20] [--buffer 300]
[--broker noida|tansu]``.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from bench._options import add_broker, local_broker, parser
from bench._report import console, table, write
from bench._topics import CONSUMER, create_topic, fill
from sdk import Options, Ordering, ParallelConsumer, Record, RetriableError

HANDLERS = ("thread", "coroutine", "batch")


def failing(share: float) -> Callable[[Record], None]:
    """Fails the first attempt of every record (``share`` 1) or of one in 1/``share``."""
    seen: set[int] = set()
    lock = threading.Lock()
    every = max(1, round(1 / share))

    def handle(record: Record) -> None:
        offset = record.offset
        if offset % every:
            return
        with lock:
            if offset in seen:
                return
            seen.add(offset)
        value = record.value  # as a handler would: a local its frame holds
        raise RetriableError(f"once ({len(value)} bytes)")

    return handle


def handler_of(kind: str, handle: Callable[[Record], None]) -> Any:
    if kind == "coroutine":

        async def coroutine(record: Record) -> None:
            await asyncio.sleep(0)
            handle(record)

        return coroutine
    if kind == "batch":
        return lambda records: [handle(record) for record in records]
    return handle


def committed(bootstrap: str, group: str, topic: str) -> int:
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (found,) = reader.committed([TopicPartition(topic, 0)], timeout=10)
    finally:
        reader.close()
    return int(found.offset)


def run(bootstrap: str, kind: str, share: float, records: int, value: int, buffer: int) -> float:
    """MB the run added to Python's heap once every record was processed."""
    topic = f"memory-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    fill(
        bootstrap,
        topic,
        records,
        key=lambda i: b"k%d" % (i % 7),
        value=lambda i: bytes([i % 256]) * value,
        config={"bootstrap.servers": bootstrap, "linger.ms": 5},
    )
    group = f"memory-{uuid.uuid4().hex[:8]}"
    options = Options(
        ordering=Ordering.KEY,
        max_buffered=buffer,
        retry_delay=lambda attempt, error: 0.0,
        batch_size=10 if kind == "batch" else None,
    )
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        **CONSUMER,
        # noida-db answers a fetch with the whole partition, beyond librdkafka's default limit
        "receive.message.max.bytes": 1_000_000_000,
    }
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    engine = ParallelConsumer(
        config, [topic], handler_of(kind, failing(share)), options, registry=None
    ).start()
    try:
        deadline = time.monotonic() + 300
        while committed(bootstrap, group, topic) < records:
            if time.monotonic() > deadline:
                raise SystemExit(f"{kind}: not every record was processed within 300 s")
            time.sleep(0.5)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        engine.stop()
        tracemalloc.stop()
    return kept / 1e6


def main() -> None:
    options = parser(__doc__)
    options.add_argument("--records", type=int, default=6000)
    options.add_argument("--values", type=int, default=20, help="value size in KB")
    options.add_argument("--buffer", type=int, default=300, help="max_buffered")
    add_broker(options, "noida")
    args = options.parse_args()
    value = args.values * 1000
    bound = 2 * args.buffer * value / 1e6
    rows = []
    with local_broker(args.broker) as broker:
        for kind in HANDLERS:
            for share in (1.0, 0.01):
                kept = run(broker.bootstrap, kind, share, args.records, value, args.buffer)
                rows.append([kind, f"{share:.0%}", f"{kept:.1f}", f"{bound:.1f}"])
                console.print(f"{kind}, {share:.0%} failing once: {kept:.1f} MB kept")
    table(
        f"Python heap kept after {args.records} records of {args.values} KB "
        f"(max_buffered={args.buffer}, {args.broker})",
        ["handler", "records failing once", "kept MB", "bound MB"],
        rows,
    )
    write(
        "failure_memory",
        {"args": vars(args), "bound_mb": bound, "rows": rows},
    )


if __name__ == "__main__":
    main()
