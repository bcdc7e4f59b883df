"""Client SDK: an ordered parallel consumer on confluent-kafka.

Many records in flight with ordering per partition or per key, commits that never pass an
unprocessed record, retries, dead-letter topics, back-pressure, and rebalance and shutdown
safety::

    from sdk import Options, Ordering, ParallelConsumer, stop_on_signals

    def handle(record):
        print(record.topic, record.partition, record.offset, record.value)

    consumer = ParallelConsumer(
        {"bootstrap.servers": "localhost:9092", "group.id": "service-a"},
        ["payments"],
        handle,
        Options(ordering=Ordering.KEY, max_concurrency=64),
    )
    stop_on_signals(consumer)
    consumer.run()
"""

from sdk._engine import EngineError, ParallelConsumer, stop_on_signals
from sdk._offsets import OffsetMapError, decode_offset_map, encode_offset_map
from sdk._options import ExponentialBackoff, Hooks, Options, OptionsError, Ordering
from sdk._record import DecodeError, Record, RetriableError, TerminalError

__all__ = [
    "DecodeError",
    "EngineError",
    "ExponentialBackoff",
    "Hooks",
    "OffsetMapError",
    "Options",
    "OptionsError",
    "Ordering",
    "ParallelConsumer",
    "Record",
    "RetriableError",
    "TerminalError",
    "decode_offset_map",
    "encode_offset_map",
    "stop_on_signals",
]
