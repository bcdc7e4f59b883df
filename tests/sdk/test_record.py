"""What a handler receives: the record's fields, deserialization (once, failures reported, the
bytes kept) and a batch's records built in order (compiled or pure, the same)."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Message

from sdk import Record
from sdk.engine._partition import Counts
from sdk.engine._record import batch_records
from sdk.engine._shards import Entry, Shard, ShardedPartition

TP = ("orders", 3)


def message(offset: int, key: bytes | None = b"k", value: bytes | None = b"{}") -> Message:
    return Message(
        topic=TP[0],
        partition=TP[1],
        offset=offset,
        key=key,
        value=value,
        timestamp=(1, 1_700_000_000_123),
        headers=[("h", b"v")],
    )


def test_a_record_reads_its_fields_from_the_message() -> None:
    record = Record(message(7), attempt=2)
    assert (record.topic, record.partition, record.offset) == ("orders", 3, 7)
    assert (record.key, record.value, record.raw_key, record.raw_value) == (
        b"k",
        b"{}",
        b"k",
        b"{}",
    )
    assert record.headers == [("h", b"v")]
    assert record.timestamp == 1_700_000_000.123
    assert record.attempt == 2
    assert record.decode_error is None
    assert repr(record) == "Record(orders[3]@7, attempt=2)"


def test_deserializers_run_once_and_a_failure_leaves_the_bytes_and_says_why() -> None:
    calls: list[bytes] = []

    def decode(raw: bytes) -> Any:
        calls.append(raw)
        return json.loads(raw)

    good = Record(message(1, value=b'{"a": 1}'), 1, bytes.decode, decode)
    assert good.key == "k" and good.value == {"a": 1}
    assert good.value == {"a": 1}
    assert calls == [b'{"a": 1}']
    assert good.decode_error is None

    bad = Record(message(2, value=b"not json"), 1, None, decode)
    assert bad.value == b"not json"  # the bytes, not an exception
    assert bad.decode_error is not None and bad.decode_error.startswith("value: JSONDecodeError")
    assert Record(message(3, value=None), 1, None, decode).value is None  # a tombstone


def test_a_handler_may_subclass_record() -> None:
    class Order(Record):
        @property
        def order_id(self) -> bytes:
            return self.raw_key or b""

    order = Order(message(4, key=b"o-1"))
    assert isinstance(order, Record) and order.order_id == b"o-1" and order.offset == 4


def test_a_batch_has_one_record_per_entry_in_order_with_its_attempt() -> None:
    part = ShardedPartition(TP, None, [], Counts(), 0.0)
    shard = Shard(None, part)
    entries = [Entry(offset, part, shard, message(offset), 0.0) for offset in (5, 9, 12)]
    entries[1].attempts = 2  # failed twice before
    records = batch_records(entries, None, json.loads)
    assert [(r.offset, r.attempt) for r in records] == [(5, 1), (9, 3), (12, 1)]
    assert records[0].value == {}
