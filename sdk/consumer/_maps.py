"""Where offset maps are kept between runs, and how they are read back at assignment.

Three stores, chosen once at start (``Options.offset_map_store``): the commit's metadata
(``kafka``, when the broker keeps it), Redis (``redis``, for brokers that drop it), or
nowhere (``none``: plain replay from the committed offset).

Reading maps back happens inside the assign callback, so it is bounded and never raises: a
map is used only if it was written for exactly the committed offset found (checked before
anything is decoded), decoding is bounded (:func:`~sdk.engine._offsets.read_offset_map`), Redis is
asked once per assignment for all partitions with a short timeout, and after a Redis failure
it is not asked again for a while. Whatever goes wrong, the partition replays from its
committed offset: duplicates, never a loss.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from gate import KafkaLog
from sdk.engine._offsets import OffsetMapError, Ranges, parse_base, read_offset_map
from sdk.engine._options import CONSUMER_ONLY, Options
from sdk.engine._partition import TP

log = logging.getLogger("sdk")

REDIS_TIMEOUT = 0.5
"""Seconds a Redis read or write of offset maps may take (it runs on the consumer's thread)."""
REDIS_BACKOFF = 30.0
"""Seconds offset maps are not read from Redis after a failure (partitions replay instead)."""

Commits = Sequence[tuple[TP, int, str]]


class OffsetMaps:
    """One store of offset maps: ``kind`` is ``kafka``, ``redis`` or ``none``."""

    def __init__(self, kind: str, group: str, redis_client: Any = None) -> None:
        self.kind = kind
        self.group = group
        self._redis = redis_client
        self._redis_down_until = 0.0

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    @property
    def in_metadata(self) -> bool:
        return self.kind == "kafka"

    def redis_key(self, tp: TP) -> str:
        return f"sdk:offset-map:{self.group}:{tp[0]}:{tp[1]}"

    # ---- writing ------------------------------------------------------------------------

    def store(self, commits: Commits) -> None:
        """After a commit: keep the maps in Redis (the metadata store needs nothing)."""
        if self.kind != "redis" or not commits or self._redis_down():
            return
        try:
            pipe = self._redis.pipeline(transaction=False)
            for tp, offset, metadata in commits:
                pipe.set(self.redis_key(tp), f"{offset}|{metadata}")
            pipe.execute()
        except Exception as exc:
            self._redis_failed("store", exc)

    # ---- reading ------------------------------------------------------------------------

    def restore(self, found: Iterable[TopicPartition]) -> dict[TP, Ranges]:
        """Completed ranges beyond each partition's committed offset (empty: replay)."""
        committed = {(tp.topic, tp.partition): tp for tp in found if tp.offset >= 0}
        if not committed or self.kind == "none":
            return {}
        if self.kind == "kafka":
            texts = {key: tp.metadata or "" for key, tp in committed.items()}
        else:
            texts = self._read_redis(committed)
        restored = {}
        for key, text in texts.items():
            ranges = self._decode(key, committed[key].offset, text)
            if ranges:
                restored[key] = ranges
        return restored

    def _read_redis(self, committed: Mapping[TP, TopicPartition]) -> dict[TP, str]:
        if self._redis_down():
            return {}
        keys = list(committed)
        try:
            values = self._redis.mget([self.redis_key(key) for key in keys])
        except Exception as exc:
            self._redis_failed("read", exc)
            return {}
        texts = {}
        for key, value in zip(keys, values, strict=True):
            if not value:
                continue
            try:
                offset_text, _, text = value.decode("ascii").partition("|")
            except UnicodeDecodeError:
                log.warning("ignoring the offset map of %s[%d]: not ASCII", *key)
                continue
            if offset_text == str(committed[key].offset):  # else written for another commit
                texts[key] = text
        return texts

    @staticmethod
    def _decode(tp: TP, committed: int, text: str) -> Ranges:
        if not text:
            return []
        try:
            if parse_base(text) != committed:
                return []  # written for another commit: replay rather than guess
            base, ranges, truncated = read_offset_map(text)
        except OffsetMapError as exc:
            log.warning("ignoring the offset map of %s[%d]: %s", *tp, exc)
            return []
        if truncated:
            log.warning(
                "%s[%d]: the offset map is too large to read whole; records beyond its "
                "readable part will be processed again",
                *tp,
            )
        if ranges:
            log.info(
                "%s[%d]: %d records beyond offset %d completed before, will be skipped",
                *tp,
                sum(stop - start for start, stop in ranges),
                base,
            )
        return ranges

    def _redis_down(self) -> bool:
        return time.monotonic() < self._redis_down_until

    def _redis_failed(self, what: str, exc: BaseException) -> None:
        self._redis_down_until = time.monotonic() + REDIS_BACKOFF
        log.warning(
            "offset maps: Redis %s failed (%s); partitions replay from their committed offset "
            "and Redis is tried again in %.0fs",
            what,
            exc,
            REDIS_BACKOFF,
        )

    def close(self) -> None:
        if self._redis is not None:
            with contextlib.suppress(Exception):
                self._redis.close()


def choose_store(
    options: Options,
    config: Mapping[str, Any],
    group: str,
    topic: str,
    new_consumer: Callable[[dict[str, Any]], Consumer],
) -> OffsetMaps:
    """The store ``options.offset_map_store`` asks for, probing the broker for ``auto``."""
    wanted = options.offset_map_store
    if wanted == "none":
        return OffsetMaps("none", group)
    kept = None
    if wanted in ("auto", "kafka"):
        kept = broker_keeps_metadata(config, group, topic, new_consumer)
        if kept or (kept is None and wanted == "kafka"):
            return OffsetMaps("kafka", group)  # asked for, and not known to be dropped
    if wanted == "kafka":
        log.warning("the broker drops commit metadata: offset maps are off (plain replay)")
        return OffsetMaps("none", group)
    why = "Kafka did not answer the probe" if kept is None else "the broker drops commit metadata"
    if options.offset_map_redis_url:
        import redis

        client = redis.Redis.from_url(
            options.offset_map_redis_url,
            socket_timeout=REDIS_TIMEOUT,
            socket_connect_timeout=REDIS_TIMEOUT,
        )
        log.info("%s: offset maps are kept in Redis", why)
        return OffsetMaps("redis", group, client)
    log.log(
        logging.WARNING if kept is None else logging.INFO,
        "%s and no Redis is configured: offset maps are off for this run (after a restart, "
        "records completed out of order are processed again)",
        why,
    )
    return OffsetMaps("none", group)


def broker_keeps_metadata(
    config: Mapping[str, Any],
    group: str,
    topic: str,
    new_consumer: Callable[[dict[str, Any]], Consumer],
) -> bool | None:
    """Commit a marker with metadata under a throw-away group and read it back (None when
    Kafka did not answer in time, or the marker's commit was not found: unknown).

    The group is this probe's own: members of one group starting together probe at once,
    and one's clean-up (deleting the group) must not empty another's group before it reads
    its marker back (which would read as metadata dropped, and turn offset maps off)."""
    probe_group = f"{group}.offset-map-probe.{uuid.uuid4().hex[:12]}"
    probe_config = {k: v for k, v in config.items() if k not in ("on_commit", "logger")}
    probe_config.update({"group.id": probe_group, "logger": KafkaLog("sdk.kafka.probe")})
    probe = new_consumer(probe_config)
    try:
        try:
            probe.list_topics(topic, timeout=5)
        except KafkaException as exc:
            log.warning(
                "Kafka at %s did not answer within 5 s (%s)",
                config.get("bootstrap.servers"),
                exc.args[0].str() if exc.args else exc,
            )
            return None
        tp = TopicPartition(topic, 0, 0, metadata="offset-map-probe")
        probe.commit(offsets=[tp], asynchronous=False)
        found = probe.committed([TopicPartition(topic, 0)], timeout=10)
        if found and found[0].offset == 0 and not found[0].error:
            kept: bool | None = found[0].metadata == "offset-map-probe"
        else:
            log.warning(
                "probing commit metadata support: the probe's commit was not found (%s)",
                found[0] if found else "nothing read back",
            )
            kept = None
    except KafkaException as exc:
        log.warning("could not probe commit metadata support (%s): assuming it is dropped", exc)
        kept = False
    finally:
        probe.close()
    with contextlib.suppress(Exception):
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({k: v for k, v in probe_config.items() if k not in CONSUMER_ONLY})
        for future in admin.delete_consumer_groups([probe_group], request_timeout=5).values():
            future.result(5)
    return kept
