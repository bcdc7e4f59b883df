"""A consumer process for tests: processes records with the engine and writes what it did.

``python -m tests.sdk.engine_worker BOOTSTRAP TOPIC GROUP OUT [SLEEP [REDIS_URL]]`` appends ``processed P O`` after
each record's work and ``committed P O`` after each commit to OUT (flushed line by line), and
stops gracefully on SIGTERM.
"""

from __future__ import annotations

import sys
import threading
import time

from sdk import Hooks, Options, Ordering, ParallelConsumer, Record, stop_on_signals


def main() -> None:
    bootstrap, topic, group, out_path = sys.argv[1:5]
    sleep = float(sys.argv[5]) if len(sys.argv) > 5 else 0.002
    redis_url = sys.argv[6] if len(sys.argv) > 6 else None
    out = open(out_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    lock = threading.Lock()

    def write(line: str) -> None:
        with lock:
            out.write(line + "\n")

    def handle(record: Record) -> None:
        time.sleep(sleep)
        write(f"processed {record.partition} {record.offset}")

    def committed(offsets: dict[tuple[str, int], int]) -> None:
        for (_, partition), offset in offsets.items():
            write(f"committed {partition} {offset}")

    consumer = ParallelConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "session.timeout.ms": 6000,
            "auto.offset.reset": "earliest",
        },
        [topic],
        handle,
        Options(
            ordering=Ordering.KEY,
            max_concurrency=8,
            commit_interval=0.3,
            hooks=Hooks(on_commit=committed),
            offset_map_store="redis" if redis_url else "auto",
            offset_map_redis_url=redis_url,
        ),
        registry=None,
    )
    stop_on_signals(consumer, timeout=10)
    write("started")
    consumer.run()
    write("stopped")


if __name__ == "__main__":
    main()
