"""Malformed records through the engine, on the real broker: non-UTF-8 keys, null keys,
tombstones, large values, odd headers. Each is handled exactly once, in key order, with its
bytes and headers intact; an undecodable one reaches the handler raw (with the reason) or the
dead-letter topic, never a crash."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

from sdk import Options, Ordering
from tests.sdk.engine_support import read_all, start_engine
from tests.support import Kafka, wait_until

Record_ = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]


def corpus(seed: int = 7, size: int = 240) -> list[Record_]:
    rng = random.Random(seed)
    keys: list[bytes | None] = [
        None,
        b"",
        b"\xff\xfe\xfd",
        b"k\x00ey",
        "ключ".encode(),
        b"a" * 2000,
    ]
    values: list[bytes | None] = [
        None,  # a tombstone
        b"",
        b"\xc3\x28 invalid utf-8",
        b'{"ok": true}',
        b'{"unterminated": ',
        b"\x00" * 64,
        json.dumps({"big": "x" * 600_000}).encode(),
    ]
    headers: list[list[tuple[str, bytes | None]] | None] = [
        None,
        [],
        [("trace", b"\x00\xff"), ("trace", b"again")],  # a repeated key
        [("", b"empty name"), ("null", None)],
        [("ünï", "ĉödé".encode())],
        [(f"h{i}", bytes([i])) for i in range(40)],
    ]
    records: list[Record_] = []
    for _ in range(size):
        records.append((rng.choice(keys), rng.choice(values), rng.choice(headers)))
        if rng.random() < 0.3:  # plus random bytes
            records.append(
                (rng.randbytes(rng.randrange(0, 40)), rng.randbytes(rng.randrange(0, 300)), None)
            )
    return records


def test_malformed_records_are_each_handled_once_intact(kafka: Kafka) -> None:
    topic, dlt = kafka.create_topic(3), kafka.create_topic(1)
    records = corpus()
    producer = kafka.producer(**{"message.max.bytes": 2_000_000})
    for i, (key, value, hdrs) in enumerate(records):
        producer.produce(topic, key=key, value=value, headers=hdrs, partition=i % 3)
    producer.flush(60)
    by_position = {(i % 3, i // 3): r for i, r in enumerate(records)}

    seen: dict[tuple[int, int], list[Any]] = {}
    order: dict[tuple[int, bytes | None], list[int]] = {}
    lock = threading.Lock()

    def handle(record: Any) -> None:
        with lock:
            seen.setdefault((record.partition, record.offset), []).append(
                (
                    record.raw_key,
                    record.raw_value,
                    record.headers,
                    record.value,
                    record.decode_error,
                )
            )
            order.setdefault((record.partition, record.raw_key), []).append(record.offset)

    engine = start_engine(
        kafka.bootstrap,
        topic,
        handle,
        Options(
            ordering=Ordering.KEY,
            max_concurrency=16,
            key_deserializer=lambda raw: raw.decode("utf-8"),
            value_deserializer=json.loads,
        ),
        **{"fetch.max.bytes": 5_000_000, "max.partition.fetch.bytes": 2_000_000},
    )
    try:
        wait_until(lambda: len(seen) == len(records), timeout=120, what="every record")
    finally:
        engine.stop()

    assert all(len(calls) == 1 for calls in seen.values()), "a record was handled twice"
    for position, (key, value, hdrs) in by_position.items():
        raw_key, raw_value, got_headers, decoded, error = seen[position][0]
        assert raw_key == key and raw_value == value
        assert got_headers == (hdrs or [])
        if value is None:
            assert (decoded is None and error is None) or "key" in (error or "")
        else:
            try:
                expected = json.loads(value)
            except ValueError:
                assert decoded == value and "value: " in (error or ""), error
            else:
                assert decoded == expected
    for offsets in order.values():
        assert offsets == sorted(offsets), "records of one key started out of order"

    # The same records with dead-lettering: the undecodable ones land there, intact.
    undecodable = []
    for key, value, hdrs in by_position.values():
        try:
            if key is not None:
                key.decode("utf-8")
            if value is not None:
                json.loads(value)
        except ValueError:
            undecodable.append((key, value, hdrs or []))
    handled: list[int] = []
    engine = start_engine(
        kafka.bootstrap,
        topic,
        lambda record: handled.append(record.offset),
        Options(
            key_deserializer=lambda raw: raw.decode("utf-8"),
            value_deserializer=json.loads,
            on_decode_error="dead_letter",
            dead_letter_topic=dlt,
        ),
        **{"fetch.max.bytes": 5_000_000, "max.partition.fetch.bytes": 2_000_000},
    )
    try:
        wait_until(
            lambda: len(handled) == len(records) - len(undecodable), timeout=120, what="the rest"
        )
        letters = read_all(kafka.bootstrap, dlt, 1, len(undecodable), timeout=60)
    finally:
        engine.stop()
    assert len(letters) == len(undecodable)
    for letter in letters:
        added = {k: v for k, v in letter.headers() if k.startswith("dlt.")}
        original = by_position[
            (int(added["dlt.original.partition"]), int(added["dlt.original.offset"]))
        ]
        assert (letter.key(), letter.value()) == original[:2]
        kept = [(k, v) for k, v in letter.headers() if not k.startswith("dlt.")]
        assert kept == (original[2] or [])
        assert b"DecodeError" in added["dlt.error"]
