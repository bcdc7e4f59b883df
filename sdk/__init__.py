"""Client SDK: an ordered parallel consumer on confluent-kafka, with dependency gating.

Many records in flight with ordering per partition or per key, commits that never pass an
unprocessed record, retries, dead-letter topics, back-pressure, and rebalance and shutdown
safety; with a :class:`Gate`, every record is also held until the consumer groups it depends
on have committed past it::

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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import sdk._compiled  # noqa: F401 - chooses the compiled or the pure core first

# The public names, imported on first use: importing ``sdk.spark`` on a Spark executor does not
# load the engine.
_WHERE = {
    "EngineError": "sdk._engine",
    "ParallelConsumer": "sdk._engine",
    "stop_on_signals": "sdk._engine",
    "DecodeError": "sdk._failures",
    "RetriableError": "sdk._failures",
    "TerminalError": "sdk._failures",
    "Gate": "sdk._gating",
    "GateTimeout": "sdk._gating",
    "gated": "sdk._gating",
    "OffsetMapError": "sdk._offsets",
    "decode_offset_map": "sdk._offsets",
    "encode_offset_map": "sdk._offsets",
    "CommitMode": "sdk._options",
    "ExponentialBackoff": "sdk._options",
    "Hooks": "sdk._options",
    "Options": "sdk._options",
    "OptionsError": "sdk._options",
    "Ordering": "sdk._options",
    "Output": "sdk._output",
    "ProduceError": "sdk._output",
    "Record": "sdk._record",
    "EmbeddedSource": "sdk._sources",
    "HttpSource": "sdk._sources",
    "RedisSource": "sdk._sources",
    "GateError": "sdk._view",
    "WatermarkSource": "sdk._view",
}

if TYPE_CHECKING:
    from sdk._engine import EngineError, ParallelConsumer, stop_on_signals
    from sdk._failures import DecodeError, RetriableError, TerminalError
    from sdk._gating import Gate, GateTimeout, gated
    from sdk._offsets import OffsetMapError, decode_offset_map, encode_offset_map
    from sdk._options import (
        CommitMode,
        ExponentialBackoff,
        Hooks,
        Options,
        OptionsError,
        Ordering,
    )
    from sdk._output import Output, ProduceError
    from sdk._record import Record
    from sdk._sources import EmbeddedSource, HttpSource, RedisSource
    from sdk._view import GateError, WatermarkSource


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


__all__ = [
    "CommitMode",
    "DecodeError",
    "EmbeddedSource",
    "EngineError",
    "ExponentialBackoff",
    "Gate",
    "GateError",
    "GateTimeout",
    "Hooks",
    "HttpSource",
    "OffsetMapError",
    "Options",
    "OptionsError",
    "Ordering",
    "Output",
    "ParallelConsumer",
    "ProduceError",
    "Record",
    "RedisSource",
    "RetriableError",
    "TerminalError",
    "WatermarkSource",
    "decode_offset_map",
    "encode_offset_map",
    "gated",
    "stop_on_signals",
]
