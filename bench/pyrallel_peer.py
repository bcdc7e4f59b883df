"""One run of pyrallel-consumer (the Python peer), for bench/engine_bench.py.

Runs in its own interpreter (pyrallel-consumer needs Python >= 3.12), so it imports nothing
of this project. It consumes ``expected`` records of ``topic`` with a new consumer group and
the library's default configuration but for the ordering and ``max_in_flight`` (its
concurrency; 0 keeps the default, 1,000), with either a no-op coroutine or the comparison
table's sleep (the same pseudo-random 0-5 ms per offset as the engine's run, awaited), and
prints one JSON line:
``{"seconds": ..., "records": ..., "stalled": ..., "slept": {offset: seconds}}`` (``slept``
only for the sleep workload), timed from the first record to the last. A run that makes no
progress for 30 s gives up and says ``"stalled": true``.

Usage: ``python bench/pyrallel_peer.py BOOTSTRAP TOPIC EXPECTED ORDERING CONCURRENCY noop|sleep``
with ORDERING one of key_hash, partition, unordered; ``PEER_LOG=INFO`` shows the library's
log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import time
import uuid
from typing import Any

STALL_SECONDS = 30.0


async def main(
    bootstrap: str, topic: str, expected: int, ordering: str, concurrency: int, workload: str
) -> dict[str, Any]:
    from pyrallel_consumer.config import KafkaConfig
    from pyrallel_consumer.consumer import PyrallelConsumer
    from pyrallel_consumer.dto import OrderingMode

    # Given to the constructor: its validators split the bootstrap list (assigning later
    # would not).
    config = KafkaConfig(
        BOOTSTRAP_SERVERS=bootstrap, CONSUMER_GROUP=f"pyrallel-{uuid.uuid4().hex[:12]}"
    )
    config.dlq_enabled = False
    config.parallel_consumer.ordering_mode = OrderingMode(ordering)
    if concurrency > 0:  # 0: the library's default
        config.parallel_consumer.execution.max_in_flight = concurrency
    done = asyncio.Event()
    state: dict[str, Any] = {"count": 0, "first": None, "last": 0.0, "slept": {}}

    async def worker(item: Any) -> None:
        started = time.perf_counter()
        if state["first"] is None:
            state["first"] = started
        if workload == "sleep":
            await asyncio.sleep(random.Random(item.offset).uniform(0, 0.005))
            state["slept"][item.offset] = time.perf_counter() - started
        state["count"] += 1
        state["last"] = time.perf_counter()
        if state["count"] >= expected:
            done.set()

    consumer = PyrallelConsumer(config=config, worker=worker, topic=topic)
    await consumer.start()
    stalled = False
    try:
        seen, since = -1, time.monotonic()
        while not done.is_set():  # give up after STALL_SECONDS without progress
            await asyncio.sleep(0.5)
            if state["count"] != seen:
                seen, since = state["count"], time.monotonic()
            elif time.monotonic() - since > STALL_SECONDS:
                stalled = True
                break
    finally:
        await asyncio.wait_for(consumer.stop(), timeout=30)
    result: dict[str, Any] = {
        "seconds": state["last"] - (state["first"] or state["last"]),
        "records": state["count"],
        "stalled": stalled,
    }
    if workload == "sleep":
        result["slept"] = state["slept"]
    return result


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("PEER_LOG", "ERROR"))
    bootstrap, topic, expected, ordering, concurrency, workload = sys.argv[1:]
    outcome = asyncio.run(
        main(bootstrap, topic, int(expected), ordering, int(concurrency), workload)
    )
    print(json.dumps(outcome))
