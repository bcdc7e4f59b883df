"""A consumer process that turns every input into one output, for exactly-once tests.

``python -m tests.faults.eos_worker BOOTSTRAP IN OUT GROUP INSTANCE_ID MODE [SLEEP [SETTING=VALUE ...]]``
runs a :class:`sdk.ParallelConsumer` on topic IN (KEY ordering, 8 at a time, a commit every
0.2 s, static membership as INSTANCE_ID (``-``: a dynamic member), ``commit_mode`` MODE: ``consumer`` or
``transactional``) whose handler sleeps a random 0..SLEEP seconds (default 0.003) and returns
``Output(OUT, value=b"<partition>:<offset>", key=record.key)`` with a header ``run`` naming
this process (its pid), so a reader can tell which run wrote a copy. Settings
``producer.NAME=VALUE`` go to the output producer (``producer_config``), any other
``NAME=VALUE`` to the consumer. SIGTERM stops it gracefully; it then prints its output
statistics (``consumer.stats()["outputs"]``) as one JSON line on stdout. The engine's log
(assignments, aborted transactions) goes to stderr; so do the stacks of its threads on
SIGUSR1, and librdkafka's debug lines with a setting ``debug=CONTEXTS`` (``debug=cgrp``: the
consumer group's protocol, for a group that never settles).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import random
import signal
import sys
import time
from typing import Any

from sdk import CommitMode, Options, Ordering, Output, ParallelConsumer, Record, stop_on_signals


def settings(arguments: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The consumer's and the producer's extra settings, from ``NAME=VALUE`` arguments."""
    consumer: dict[str, Any] = {}
    producer: dict[str, Any] = {}
    for argument in arguments:
        name, _, value = argument.partition("=")
        if name.startswith("producer."):
            producer[name.removeprefix("producer.")] = value
        else:
            consumer[name] = value
    return consumer, producer


def main() -> None:
    bootstrap, source, target, group, instance, mode = sys.argv[1:7]
    most = float(sys.argv[7]) if len(sys.argv) > 7 else 0.003
    consumer_extra, producer_extra = settings(sys.argv[8:])
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    if "debug" in consumer_extra:  # librdkafka's debug lines, through the engine's logger
        logging.getLogger("sdk.kafka").setLevel(logging.DEBUG)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    run = str(os.getpid()).encode()
    chance = random.Random()

    def handle(record: Record) -> Output:
        time.sleep(chance.uniform(0.0, most))
        return Output(
            target,
            value=f"{record.partition}:{record.offset}".encode(),
            key=record.key,
            headers=[("run", run)],
        )

    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "session.timeout.ms": 6000,
        "auto.offset.reset": "earliest",
    }
    if instance != "-":
        config["group.instance.id"] = instance
    consumer = ParallelConsumer(
        {**config, **consumer_extra},
        [source],
        handle,
        Options(
            ordering=Ordering.KEY,
            max_concurrency=8,
            commit_interval=0.2,
            commit_mode=CommitMode(mode),
        ),
        producer_config=producer_extra,
        registry=None,
    )
    stop_on_signals(consumer, timeout=10)
    consumer.run()
    print(json.dumps(consumer.stats().get("outputs", {})), flush=True)


if __name__ == "__main__":
    main()
