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

import sdk.engine._compiled  # noqa: F401 - chooses the compiled or the pure core first

# The public names, imported on first use: importing ``sdk.spark`` on a Spark executor does not
# load the engine.
_WHERE = {
    "EngineError": "sdk.consumer._parallel",
    "ParallelConsumer": "sdk.consumer._parallel",
    "stop_on_signals": "sdk.consumer._signals",
    "DecodeError": "sdk.engine._failures",
    "RetriableError": "sdk.engine._failures",
    "TerminalError": "sdk.engine._failures",
    "Gate": "sdk.gating._gating",
    "GateTimeout": "sdk.gating._gating",
    "gated": "sdk.gating._gating",
    "OffsetMapError": "sdk.engine._offsets",
    "decode_offset_map": "sdk.engine._offsets",
    "encode_offset_map": "sdk.engine._offsets",
    "CommitMode": "sdk.engine._options",
    "ExponentialBackoff": "sdk.engine._options",
    "Hooks": "sdk.engine._options",
    "Options": "sdk.engine._options",
    "OptionsError": "sdk.engine._options",
    "Ordering": "sdk.engine._options",
    "Output": "sdk.produce._output",
    "ProduceError": "sdk.produce._output",
    "Record": "sdk.engine._record",
    "EmbeddedSource": "sdk.gating._sources",
    "HttpSource": "sdk.gating._sources",
    "RedisSource": "sdk.gating._sources",
    "GateError": "sdk.gating._view",
    "WatermarkSource": "sdk.gating._view",
}

if TYPE_CHECKING:
    from sdk.consumer._parallel import EngineError, ParallelConsumer
    from sdk.consumer._signals import stop_on_signals
    from sdk.engine._failures import DecodeError, RetriableError, TerminalError
    from sdk.engine._offsets import OffsetMapError, decode_offset_map, encode_offset_map
    from sdk.engine._options import (
        CommitMode,
        ExponentialBackoff,
        Hooks,
        Options,
        OptionsError,
        Ordering,
    )
    from sdk.engine._record import Record
    from sdk.gating._gating import Gate, GateTimeout, gated
    from sdk.gating._sources import EmbeddedSource, HttpSource, RedisSource
    from sdk.gating._view import GateError, WatermarkSource
    from sdk.produce._output import Output, ProduceError


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
