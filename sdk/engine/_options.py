"""Options of the parallel consumer, validated when it is built."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from sdk.engine._record import Record

# librdkafka properties only a consumer understands: left out when the same configuration
# serves a producer (dead letters) or an admin client (gating).
CONSUMER_ONLY = {
    "group.id",
    "group.instance.id",
    "group.protocol",
    "group.remote.assignor",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.commit.interval.ms",
    "auto.offset.reset",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "partition.assignment.strategy",
    "isolation.level",
    "enable.partition.eof",
    "check.crcs",
    "fetch.min.bytes",
    "fetch.max.bytes",
    "fetch.wait.max.ms",
    "fetch.error.backoff.ms",
    "max.partition.fetch.bytes",
    "fetch.message.max.bytes",
    "queued.min.messages",
    "queued.max.messages.kbytes",
    "on_commit",
}


class Ordering(StrEnum):
    PARTITION = "partition"
    """At most one record in flight per partition, in offset order."""
    KEY = "key"
    """At most one record in flight per (topic, partition, key), in offset order."""
    UNORDERED = "unordered"
    """Any record may run at any time; commits still never pass an unprocessed record."""


class CommitMode(StrEnum):
    CONSUMER = "consumer"
    """At least once: the consumer commits the offsets of inputs that are done (their
    outputs acknowledged by the broker)."""
    TRANSACTIONAL = "transactional"
    """Exactly once within Kafka: every ``commit_interval`` one transaction holds every output
    produced since the last one and the offsets of the inputs that are done."""


class OptionsError(ValueError):
    """An option is invalid; the message names it."""


RetryDelay = Callable[[int, BaseException], float]
"""Seconds to wait before attempt ``n + 1`` after attempt ``n`` failed with the error."""


@dataclass(frozen=True)
class ExponentialBackoff:
    """``initial * multiplier ** (attempt - 1)``, capped at ``maximum``, with full jitter."""

    initial: float = 0.1
    multiplier: float = 2.0
    maximum: float = 30.0
    jitter: bool = True
    _random: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __call__(self, attempt: int, error: BaseException) -> float:
        delay = min(self.maximum, self.initial * self.multiplier ** max(0, attempt - 1))
        return self._random.uniform(0, delay) if self.jitter else delay


@dataclass(frozen=True)
class Hooks:
    """Lifecycle callbacks. ``before_handle``, ``after_handle`` and ``on_failure`` run on the
    worker around the handler; ``on_commit`` on the consumer's thread after each commit."""

    before_handle: Callable[[Record], None] | None = None
    after_handle: Callable[[Record], None] | None = None
    on_failure: Callable[[Record, BaseException], None] | None = None
    on_commit: Callable[[dict[tuple[str, int], int]], None] | None = None


@dataclass(frozen=True)
class Options:
    """How the parallel consumer schedules, retries, commits and holds records."""

    ordering: Ordering = Ordering.KEY
    max_concurrency: int = 16
    """Handler invocations running at once (threads for plain functions, tasks for
    coroutines)."""
    batch_size: int | None = None
    """When set, the handler receives a list of up to this many records."""
    null_keys: Literal["ordered", "unordered"] = "ordered"
    """KEY ordering: records without a key are ordered together per partition, or not at all."""
    max_buffered: int | None = None
    """The buffer: records held in memory (fetched, in flight, waiting for retry, and
    completed beyond a partition's lowest incomplete one). Fetching stops when it is used;
    stalled partitions are paused at their share and count as their share (see docs/sdk.md,
    *Back-pressure and memory*). Default: max(10,000, 4 x concurrency x batch size)."""
    commit_interval: float = 1.0
    commit_when_idle: bool = True
    """Also commit (exactly once: close the transaction) as soon as the consumer has caught
    up, at most every 0.1 s: nothing it fetched is running, waiting for its outputs'
    acknowledgements or held, and records completed since the last commit. The services
    gated on this group, and ``read_committed`` readers of its outputs, then go on without
    waiting for the interval's end. False: only every ``commit_interval``."""
    commit_mode: CommitMode = CommitMode.CONSUMER
    """How handler outputs and offsets are committed (see docs/produce.md)."""
    revoke_timeout: float = 10.0
    """Seconds to wait for in-flight records of revoked partitions before letting them go."""
    max_attempts: int | None = None
    """Attempts per record before it is dead-lettered or skipped; None retries until it
    succeeds (a poison record then holds only its shard)."""
    retry_delay: RetryDelay = field(default_factory=ExponentialBackoff)
    max_retrying: int = 10_000
    """Records parked for retry at most; beyond it fetching pauses until retries drain."""
    dead_letter_topic: str | None = None
    on_exhausted: Literal["dead_letter", "skip"] = "dead_letter"
    process_delay: float = 0.0
    """Do not start a record before its timestamp + this many seconds."""
    key_deserializer: Callable[[bytes], Any] | None = None
    value_deserializer: Callable[[bytes], Any] | None = None
    on_decode_error: Literal["raw", "dead_letter"] = "raw"
    """``raw``: the handler gets the bytes and ``record.decode_error``; ``dead_letter``: the
    record goes to the dead-letter topic without reaching the handler."""
    offset_map_store: Literal["auto", "kafka", "redis", "none"] = "auto"
    """Where completed offsets beyond the committed offset are kept: commit metadata, Redis,
    or nowhere (plain replay). ``auto``: Kafka metadata if the broker keeps it, else Redis if
    ``offset_map_redis_url`` is set, else none."""
    offset_map_redis_url: str | None = None
    hooks: Hooks = field(default_factory=Hooks)
    max_item_records: int = 256
    """Most records one work item holds (fewer when handlers are slow; records of a running
    key that arrive while it runs may join it up to this many)."""
    gc_threshold: int | None = 50_000
    """While the consumer runs, Python's generation-0 garbage-collection threshold is raised
    to this (from the interpreter's 700) and put back afterwards: the engine allocates a few
    objects per record, and each collection walks every record still held, so the default
    makes the collector cost about a third of the consumer thread's time. Process-wide; None
    leaves the collector alone, as does an application's own threshold of 0 or
    ``gc.disable()`` (automatic collection stays off)."""

    def __post_init__(self) -> None:
        def bad(name: str, message: str) -> OptionsError:
            return OptionsError(f"{name}: {message} (got {getattr(self, name)!r})")

        try:
            object.__setattr__(self, "ordering", Ordering(self.ordering))
        except ValueError:
            raise bad("ordering", "must be one of partition, key, unordered") from None
        try:
            object.__setattr__(self, "commit_mode", CommitMode(self.commit_mode))
        except ValueError:
            raise bad("commit_mode", "must be one of consumer, transactional") from None
        for name in ("max_concurrency", "max_retrying", "max_item_records"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(name, "must be an integer of at least 1")
        for name in ("batch_size", "max_buffered", "max_attempts", "gc_threshold"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise bad(name, "must be None or an integer of at least 1")
        for name in ("commit_interval", "revoke_timeout", "process_delay"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
                raise bad(name, "must be a number of seconds, 0 or more")
        if self.commit_interval <= 0:
            raise bad("commit_interval", "must be more than 0 seconds")
        if not isinstance(self.commit_when_idle, bool):
            raise bad("commit_when_idle", "must be True or False")
        choices = {
            "null_keys": ("ordered", "unordered"),
            "on_exhausted": ("dead_letter", "skip"),
            "on_decode_error": ("raw", "dead_letter"),
            "offset_map_store": ("auto", "kafka", "redis", "none"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise bad(name, f"must be one of {', '.join(allowed)}")
        needs_topic = (self.max_attempts is not None and self.on_exhausted == "dead_letter") or (
            self.on_decode_error == "dead_letter"
        )
        if needs_topic and not self.dead_letter_topic:
            raise OptionsError(
                "dead_letter_topic: required when records can be dead-lettered "
                "(max_attempts with on_exhausted='dead_letter', or on_decode_error='dead_letter')"
            )
        if self.offset_map_store == "redis" and not self.offset_map_redis_url:
            raise OptionsError("offset_map_redis_url: required when offset_map_store='redis'")
        if not callable(self.retry_delay):
            raise bad("retry_delay", "must be callable (attempt, error) -> seconds")

    @property
    def buffer_limit(self) -> int:
        if self.max_buffered is not None:
            return self.max_buffered
        return max(10_000, 4 * self.max_concurrency * (self.batch_size or 1))
