"""One run of Quix Streams (the peer of the produce benchmark), for bench/produce_bench.py.

Runs in an interpreter of its own (Quix Streams pins a confluent-kafka older than this
project's), so it imports nothing of this project. It reads ``input`` with a new consumer
group and writes one output per input (its key and value) to ``output``, with the
library's default settings but for the processing guarantee (and a 6 s session timeout, as
every consumer of the benchmark has); ``sleep`` makes each record wait 5 ms first. It prints
``started`` once the application is built, then runs until it receives SIGTERM (the
benchmark sends it once the run's commits and outputs are in), and exits. Its state
directory is a temporary one, removed at the end (the library's default is ``state`` in the
working directory).

Usage: ``python bench/quix_peer.py BOOTSTRAP INPUT OUTPUT GROUP at-least-once|exactly-once
noop|sleep``.
"""

from __future__ import annotations

import logging
import signal
import sys
import tempfile
import time
from typing import Any


def main(bootstrap: str, source: str, sink: str, group: str, guarantee: str, work: str) -> None:
    from quixstreams import Application

    with tempfile.TemporaryDirectory(prefix="quix-state-") as state:
        run(Application, bootstrap, source, sink, group, guarantee, work, state)


def run(
    application: Any,
    bootstrap: str,
    source: str,
    sink: str,
    group: str,
    guarantee: str,
    work: str,
    state: str,
) -> None:
    app = application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee=guarantee,  # type: ignore[arg-type]
        consumer_extra_config={"session.timeout.ms": 6000},
        loglevel=logging.WARNING,
        auto_create_topics=False,
        state_dir=state,
    )
    inputs = app.topic(source, key_deserializer="bytes", value_deserializer="bytes")
    outputs = app.topic(sink, key_serializer="bytes", value_serializer="bytes")
    frame = app.dataframe(inputs)
    if work == "sleep":

        def wait(value: Any) -> None:
            time.sleep(0.005)

        frame = frame.update(wait)
    frame.to_topic(outputs)
    signal.signal(signal.SIGTERM, lambda *_: app.stop())
    print("started", flush=True)
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:7])
