"""The parallel consumer: one Kafka consumer on one thread, handlers on many.

The consumer's thread is the only one that touches the confluent-kafka ``Consumer`` and the
core: it fetches, registers records, pauses and resumes partitions, hands work to the runner,
applies results that come back through its inbox, commits, and serves rebalance callbacks.
Nothing else takes a lock around the Kafka client.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from prometheus_client import REGISTRY, CollectorRegistry

from sdk._core import TP, Entry, WorkCore
from sdk._gating import Gate
from sdk._offsets import OffsetMapError, decode_offset_map
from sdk._options import CONSUMER_ONLY, Options, OptionsError
from sdk._runners import AsyncRunner, Latency, ThreadRunner, Work, is_coroutine_handler

log = logging.getLogger("sdk")


_FETCH_MAX = 5000
"""Most records taken from librdkafka in one go."""

_ITEM_SECONDS = 0.01
"""About how long one work item may run when handlers are slow and there is a backlog."""

DLT_HEADERS = (
    "dlt.original.topic",
    "dlt.original.partition",
    "dlt.original.offset",
    "dlt.error",
    "dlt.attempts",
)


class EngineError(RuntimeError):
    """The consumer stopped because of an error it cannot recover from."""


class ParallelConsumer:
    """Process records with many handlers at once, in order per partition or key.

    ``handler`` is a function or a coroutine function taking a :class:`~sdk.Record` (or a list
    of them when ``options.batch_size`` is set). It succeeds by returning; raising retries the
    record (see :class:`~sdk.Options` for attempts, delays and dead-lettering).

    ``config`` is the confluent-kafka consumer configuration; ``group.id`` is required and
    automatic commits are always off: the consumer commits only what was processed.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topics: Sequence[str],
        handler: Callable[..., Any],
        options: Options | None = None,
        *,
        gate: Gate | None = None,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self.options = options or Options()
        if not config.get("group.id"):
            raise OptionsError("config: 'group.id' is required")
        if str(config.get("enable.auto.commit", "false")).lower() == "true":
            raise OptionsError("config: enable.auto.commit must be false (the engine commits)")
        if (
            isinstance(topics, str)
            or not topics
            or not all(isinstance(t, str) and t for t in topics)
        ):
            raise OptionsError("topics: must be a non-empty list of topic names")
        if not callable(handler):
            raise OptionsError("handler: must be callable")
        self.config = {
            # librdkafka postpones fetching for 1 s once its local queue is over threshold; the
            # engine drains that queue in bursts into its own buffer, and with the default it
            # would starve for most of each second.
            "fetch.queue.backoff.ms": 20,
            **config,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
        self.group = str(config["group.id"])
        self.topics = list(topics)
        self.handler = handler
        self.gate = gate
        self.registry = registry
        options = self.options
        self.core = WorkCore(
            options.ordering,
            null_keys=options.null_keys,
            max_attempts=options.max_attempts,
            retry_delay=options.retry_delay,
            on_exhausted=options.on_exhausted,
            max_retrying=options.max_retrying,
            process_delay=options.process_delay,
            buffer_limit=options.buffer_limit,
        )
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._runner: ThreadRunner | AsyncRunner | None = None
        self._thread: threading.Thread | None = None
        self._map_store: str = "none"
        self._redis: Any = None
        self._paused: set[TP] = set()
        self._assigned: set[TP] = set()
        self._stop: tuple[bool, float, bool] | None = None  # (drain, deadline, drain_buffered)
        self._finished = threading.Event()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._dlt_retry: list[tuple[float, Entry]] = []
        self._committed: dict[TP, int] = {}
        self._stats: dict[str, Any] = {}
        self._collector: Any = None
        self._revoke_timeout_override: float | None = None
        self._item_samples: deque[float] = deque(maxlen=64)  # seconds per record, by item
        self._samples_new = 0
        self._record_seconds: float | None = None
        self._owns_gate = False
        self._watermarks_pending = threading.Event()
        self._holds = Latency()  # how long gated partitions waited for release
        self._hold_logged: dict[TP, float] = {}
        self.paused_by_user = False

    # ---- public API ---------------------------------------------------------------------

    def run(self) -> None:
        """Consume until :meth:`stop` is called (from another thread or a signal handler)."""
        if self._started.is_set():
            raise RuntimeError("this consumer has already run")
        self._started.set()
        try:
            self._open()
            self._loop()
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._close()
            self._finished.set()

    def start(self) -> ParallelConsumer:
        """Run in a background thread; returns at once."""
        self._thread = threading.Thread(
            target=self._run_quietly, name=f"consumer-{self.group}", daemon=True
        )
        self._thread.start()
        return self

    def _run_quietly(self) -> None:
        try:
            self.run()
        except BaseException:
            log.exception("parallel consumer stopped with an error")

    def stop(
        self,
        *,
        drain: bool = True,
        timeout: float = 30.0,
        drain_buffered: bool = False,
        wait: bool = True,
    ) -> None:
        """Stop consuming.

        With ``drain`` (graceful), fetching stops, records in flight finish (and buffered ones
        too with ``drain_buffered``) until ``timeout`` seconds, what completed is committed and
        the consumer leaves its group. Without it, what completed is committed and the
        consumer closes at once. With ``wait``, returns when it has stopped.
        """
        self._inbox.put(("stop", drain, time.monotonic() + timeout, drain_buffered))
        if wait and self._started.is_set():
            self._finished.wait(timeout + self.options.revoke_timeout + 30)
        if self._error is not None and not isinstance(self._error, KeyboardInterrupt):
            raise EngineError(f"the consumer failed: {self._error}") from self._error

    def pause(self) -> None:
        """Stop starting records (a circuit breaker); in-flight records finish."""
        self._inbox.put(("pause",))

    def resume(self) -> None:
        self._inbox.put(("resume",))

    @property
    def running(self) -> bool:
        return self._started.is_set() and not self._finished.is_set()

    def stats(self) -> dict[str, Any]:
        """A recent snapshot of the consumer's state (refreshed about every half second)."""
        return dict(self._stats)

    def __enter__(self) -> ParallelConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.running:
            self.stop()

    # ---- opening and closing ------------------------------------------------------------

    def _open(self) -> None:
        config = dict(self.config)
        config["on_commit"] = self._on_commit
        config.setdefault("logger", logging.getLogger("sdk.kafka"))
        try:
            self._consumer = Consumer(config)
        except KafkaException as exc:
            raise OptionsError(f"config: {exc.args[0].str() if exc.args else exc}") from None
        self._map_store = self._choose_map_store()
        if self.gate is not None:
            self._owns_gate = not self.gate._started
            self.gate.start()
            self.gate.view.add_listener(self._on_watermarks)
        work = Work(self.handler, self.options)
        if is_coroutine_handler(self.handler):
            self._runner = AsyncRunner(work, self.options.max_concurrency, self._inbox)
        else:
            self._runner = ThreadRunner(work, self.options.max_concurrency, self._inbox)
        if self.registry is not None:
            from sdk._metrics import EngineCollector

            self._collector = EngineCollector(self)
            self.registry.register(self._collector)
        self._consumer.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        log.info(
            "consuming %s as group %s (%s ordering, concurrency %d, offset map: %s)",
            ", ".join(self.topics),
            self.group,
            self.options.ordering.value,
            self.options.max_concurrency,
            self._map_store,
        )

    def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            immediate = self._stop is not None and not self._stop[0]
            self._revoke_timeout_override = 0.0 if immediate or self._error else None
            with contextlib.suppress(Exception):
                self._commit(sync=True, consumer=consumer)
            try:
                consumer.close()  # leaves the group: on_revoke commits and drops what is left
            except Exception as exc:
                log.warning("closing the consumer: %s", exc)
        if self._producer is not None:
            remaining = self._producer.flush(5)
            if remaining:
                log.warning(
                    "%d dead-letter records were not acknowledged before closing", remaining
                )
        if self._runner is not None:
            self._runner.close(wait=1.0 if self._stop and self._stop[0] else 0.0)
        if self._collector is not None and self.registry is not None:
            with contextlib.suppress(KeyError):
                self.registry.unregister(self._collector)
        if self._redis is not None:
            with contextlib.suppress(Exception):
                self._redis.close()
        if self.gate is not None:
            self.gate.view.remove_listener(self._on_watermarks)
            if self._owns_gate:
                self.gate.stop()

    # ---- the loop -----------------------------------------------------------------------

    def _loop(self) -> None:
        core = self.core
        fetched_at = commit_at = stats_at = pauses_at = 0.0
        while True:
            mono = time.monotonic()
            if self._stop is not None and self._stop_done(mono):
                return
            busy = bool(core.outstanding) or core.held() > 0 or self._stop is not None
            if not busy:
                # Nothing held: block in the fetch (new records wake it at once).
                self._fetch(self._idle_wait(time.time()))
                fetched_at = time.monotonic()
            elif mono - fetched_at >= 0.002:
                self._fetch(0.0)
                fetched_at = mono
            self._drain_inbox(block=0.0)
            now = time.time()
            self._dispatch(now)
            if self._producer is not None:
                self._producer.poll(0)
                self._retry_dead_letters()
            mono = time.monotonic()
            if mono - pauses_at >= 0.01:
                self._apply_pauses()
                pauses_at = mono
            if mono - commit_at >= self.options.commit_interval:
                self._commit(sync=False)
                commit_at = mono
            if mono - stats_at >= 0.5:
                self._publish_stats(now)
                stats_at = mono
            if core.outstanding or core.held() or self._stop is not None:
                # Something is held or running: wait for results and commands (the inbox),
                # fetching again every few milliseconds.
                self._drain_inbox(block=self._inbox_wait(now))

    def _fetch(self, timeout: float) -> None:
        assert self._consumer is not None
        room = max(1, min(_FETCH_MAX, self.core.buffer_limit - self.core.held()))
        if timeout > 0:
            # consume(n, timeout) waits until n records arrived or the timeout passed, so
            # wait in poll() (which returns with the first record) and take the rest after.
            first = self._consumer.poll(timeout)
            if first is None:
                return
            messages = [first, *self._consumer.consume(room - 1, 0)] if room > 1 else [first]
        else:
            messages = self._consumer.consume(room, 0)
        if messages and self._stop is None:  # while stopping, fetched records are left alone
            self._register(messages, time.time())

    def _idle_wait(self, now: float) -> float:
        wait = min(0.1, self.options.commit_interval)
        wakeup = self.core.next_wakeup()
        if wakeup is not None:
            wait = min(wait, max(0.0, wakeup - now))
        return wait

    def _inbox_wait(self, now: float) -> float:
        wakeup = self.core.next_wakeup()
        # Records running: results come soon. Only held records (a closed gate, a retry
        # delay): watermark changes and timers wake us anyway, so look at Kafka less often.
        wait = 0.005 if self.core.outstanding else 0.02
        if wakeup is not None:
            wait = min(wait, max(0.0, wakeup - now))
        return wait

    def _register(self, messages: list[Message], now: float) -> None:
        bad = [m for m in messages if m.error() is not None]
        if bad:
            for message in bad:
                self._message_error(message.error())
            messages = [m for m in messages if m.error() is None]
        self.core.add_messages(messages, now, with_timestamps=bool(self.options.process_delay))

    def _message_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if error.fatal():
            raise EngineError(f"fatal Kafka error: {error.str()}")
        log.warning("consumer error: %s", error.str())

    def _dispatch(self, now: float) -> None:
        runner = self._runner
        if runner is None or self.paused_by_user:
            return
        options = self.options
        slots = options.max_concurrency + runner.queued_items - len(self.core.outstanding)
        if slots <= 0 or not self.core.has_ready(now):
            return
        ordered = options.ordering != "unordered"
        if options.batch_size is not None:
            # A batch holds one record per shard in the ordered modes (the handler may treat
            # a batch's records in any order).
            items = self.core.take(
                now, slots, options.batch_size, 1 if ordered else options.batch_size
            )
        elif ordered:
            # A shard's records run one after another anyway, so a worker may take a long run
            # of them (no hand-off between them); other shards join only within ``size``.
            size = self._item_size()
            items = self.core.take(now, slots, size, options.max_item_records, max_runs=size)
        else:
            size = self._item_size()
            items = self.core.take(now, slots, size, size)
        for item in items:
            runner.submit(item)

    def _item_size(self) -> int:
        """Records per work item.

        Fast handlers (a full item runs in under 10 ms) get full items: one hand-off carries
        many records, and spreading them over threads would only trade the GIL back and
        forth. Slower handlers get guided self-scheduling: a quarter of the waiting records
        spread over the workers, and no more than about 10 ms of work per item, so the last
        records are spread evenly too. Handler speed is the median per-record time of recent
        items: robust to the odd item that waited for the GIL.
        """
        per_record = self._record_seconds
        largest = self.options.max_item_records
        if per_record is None:
            return 1
        if per_record * largest <= _ITEM_SECONDS:
            return largest
        waiting = self.core.held() - self.core.in_flight()
        guided = waiting // (4 * self.options.max_concurrency)
        return max(1, min(largest, guided, int(_ITEM_SECONDS / per_record)))

    def _timed(self, seconds: float, records: int) -> None:
        samples = self._item_samples
        samples.append(seconds / records)
        self._samples_new += 1
        # Trust the median only once a few items were timed (one lucky fast record must not
        # make a slow handler look fast), then refresh it every 16 items.
        if len(samples) >= 8 and (self._record_seconds is None or self._samples_new >= 16):
            self._record_seconds = statistics.median(samples)
            self._samples_new = 0

    # ---- inbox --------------------------------------------------------------------------

    def _drain_inbox(self, block: float) -> None:
        inbox = self._inbox
        try:
            message = inbox.get(timeout=block) if block > 0 else inbox.get_nowait()
        except queue.Empty:
            return
        now = time.time()
        while True:
            self._handle(message, now)
            try:
                message = inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, message: tuple[Any, ...], now: float) -> None:
        kind = message[0]
        if kind == "done":
            _, item_id, results, seconds, count = message
            self._timed(seconds, count)
            for entry in self.core.complete(item_id, results, now):
                self._dead_letter(entry)
        elif kind == "watermarks":
            self._watermarks_pending.clear()
            self._apply_watermarks(now)
        elif kind == "done_many":
            for done in message[1]:
                self._handle(done, now)
        elif kind == "stop":
            _, drain, deadline, drain_buffered = message
            if self._stop is None:
                self._begin_stop(drain, deadline, drain_buffered)
        elif kind == "pause":
            self.paused_by_user = True
            self.core.pause_all()
        elif kind == "resume":
            self.paused_by_user = False
            self.core.resume_all()
        else:
            self._handle_other(message, now)

    def _handle_other(self, message: tuple[Any, ...], now: float) -> None:
        log.debug("ignored inbox message %r", message[0])

    # ---- gating -------------------------------------------------------------------------

    def _on_watermarks(self, snapshot: Any) -> None:
        """From a source's thread: wake the consumer's thread (once per burst)."""
        if not self._watermarks_pending.is_set():
            self._watermarks_pending.set()
            self._inbox.put(("watermarks",))

    def _apply_watermarks(self, now: float) -> None:
        gate = self.gate
        if gate is None:
            return
        for tp in list(self.core.partitions):
            held_for = self.core.set_limit(tp, gate.limit(*tp), now)
            if held_for is not None:
                self._holds.observe(held_for)
                self._hold_logged.pop(tp, None)

    def _log_long_holds(self, now: float, partitions: Mapping[TP, Mapping[str, Any]]) -> None:
        """A rate-limited line per partition held longer than the gate's ``hold_log_after``,
        with the reason (explained in the background: a source may ask the network)."""
        gate = self.gate
        if gate is None:
            return
        for tp, view in partitions.items():
            held_for = view.get("held_for", 0.0)
            if (
                held_for < gate.hold_log_after
                or now - self._hold_logged.get(tp, 0.0) < gate.hold_log_after
            ):
                continue
            self._hold_logged[tp] = now
            offset = view["limit"] if view["limit"] is not None else 0
            threading.Thread(
                target=_log_hold,
                args=(gate, tp, offset, held_for),
                name="gate-explain",
                daemon=True,
            ).start()

    # ---- stopping -----------------------------------------------------------------------

    def _begin_stop(self, drain: bool, deadline: float, drain_buffered: bool) -> None:
        self._stop = (drain, deadline, drain_buffered)
        log.info(
            "stopping (%s)",
            "draining in-flight" + (" and buffered" if drain_buffered else "")
            if drain
            else "at once",
        )
        if self._consumer is not None and self._assigned:
            with contextlib.suppress(KafkaException):
                self._consumer.pause([TopicPartition(t, p) for t, p in self._assigned])
        if not (drain and drain_buffered):
            self.core.pause_all()

    def _stop_done(self, mono: float) -> bool:
        assert self._stop is not None
        drain, deadline, drain_buffered = self._stop
        if not drain or mono >= deadline:
            return True
        if self.core.outstanding or self.core.dead_letter_pending:
            return False
        return not (drain_buffered and self.core.held())

    # ---- commits ------------------------------------------------------------------------

    def _commit(
        self, *, sync: bool, tps: Iterable[TP] | None = None, consumer: Consumer | None = None
    ) -> None:
        consumer = consumer or self._consumer
        if consumer is None:
            return
        with_maps = self._map_store != "none"
        self.core.collect_progress(time.time())
        commits = self.core.commits(tps, with_maps=with_maps)
        if not commits:
            return
        in_metadata = self._map_store == "kafka"
        offsets = [
            TopicPartition(t, p, offset, metadata=metadata if in_metadata else None)
            if in_metadata and metadata
            else TopicPartition(t, p, offset)
            for (t, p), offset, metadata in commits
        ]
        try:
            if sync:
                consumer.commit(offsets=offsets, asynchronous=False)
                self._committed_ok(offsets)
            else:
                consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            log.warning("commit failed, will retry: %s", exc)
            for tp in offsets:
                self.core.commit_failed((tp.topic, tp.partition))
            return
        if self._map_store == "redis":
            self._store_maps_in_redis(commits)

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if error is not None and error.code() != KafkaError._NO_OFFSET:
            log.warning("commit failed, will retry: %s", error.str())
            for tp in partitions:
                self.core.commit_failed((tp.topic, tp.partition))
            return
        failed = [tp for tp in partitions if tp.error is not None]
        for tp in failed:
            log.warning("commit of %s[%d] failed: %s", tp.topic, tp.partition, tp.error.str())
            self.core.commit_failed((tp.topic, tp.partition))
        self._committed_ok([tp for tp in partitions if tp.error is None])

    def _committed_ok(self, partitions: list[TopicPartition]) -> None:
        done = {(tp.topic, tp.partition): tp.offset for tp in partitions if tp.offset >= 0}
        if not done:
            return
        self._committed.update(done)
        hook = self.options.hooks.on_commit
        if hook is not None:
            try:
                hook(done)
            except Exception:
                log.exception("on_commit hook raised")

    # ---- offset maps --------------------------------------------------------------------

    def _choose_map_store(self) -> str:
        wanted = self.options.offset_map_store
        if wanted == "none":
            return "none"
        if wanted in ("auto", "kafka") and self._broker_keeps_metadata():
            return "kafka"
        if wanted == "kafka":
            log.warning("the broker drops commit metadata: offset maps are off (plain replay)")
            return "none"
        if self.options.offset_map_redis_url:
            import redis

            self._redis = redis.Redis.from_url(
                self.options.offset_map_redis_url, socket_timeout=2.0, socket_connect_timeout=2.0
            )
            log.info("the broker drops commit metadata: offset maps are kept in Redis")
            return "redis"
        log.info("the broker drops commit metadata and no Redis is configured: plain replay")
        return "none"

    def _broker_keeps_metadata(self) -> bool:
        """Commit a marker with metadata under a throw-away group and read it back."""
        probe_group = f"{self.group}.offset-map-probe"
        config = {k: v for k, v in self.config.items() if k not in ("on_commit", "logger")}
        config.update({"group.id": probe_group, "logger": logging.getLogger("sdk.kafka.probe")})
        probe = Consumer(config)
        try:
            tp = TopicPartition(self.topics[0], 0, 0, metadata="offset-map-probe")
            probe.commit(offsets=[tp], asynchronous=False)
            found = probe.committed([TopicPartition(self.topics[0], 0)], timeout=10)
            kept = bool(found) and found[0].metadata == "offset-map-probe"
        except KafkaException as exc:
            log.warning("could not probe commit metadata support (%s): assuming it is dropped", exc)
            kept = False
        finally:
            probe.close()
        with contextlib.suppress(Exception):
            from confluent_kafka.admin import AdminClient

            admin = AdminClient({k: v for k, v in config.items() if k not in CONSUMER_ONLY})
            for future in admin.delete_consumer_groups([probe_group], request_timeout=5).values():
                future.result(5)
        return kept

    def _redis_key(self, tp: TP) -> str:
        return f"sdk:offset-map:{self.group}:{tp[0]}:{tp[1]}"

    def _store_maps_in_redis(self, commits: Sequence[Any]) -> None:
        try:
            pipe = self._redis.pipeline(transaction=False)
            for tp, offset, metadata in commits:
                pipe.set(self._redis_key(tp), f"{offset}|{metadata}")
            pipe.execute()
        except Exception as exc:
            log.warning("could not store offset maps in Redis: %s", exc)

    def _restore_map(self, tp: TP, committed: int | None, metadata: str | None) -> frozenset[int]:
        if committed is None:
            return frozenset()
        text = metadata or ""
        if self._map_store == "redis":
            try:
                stored = self._redis.get(self._redis_key(tp))
            except Exception as exc:
                log.warning("could not read the offset map of %s[%d] from Redis: %s", *tp, exc)
                return frozenset()
            if not stored:
                return frozenset()
            offset_text, _, text = stored.decode().partition("|")
            if offset_text != str(committed):
                return frozenset()  # written for another commit: replay rather than guess
        elif self._map_store != "kafka":
            return frozenset()
        if not text:
            return frozenset()
        try:
            base, completed = decode_offset_map(text)
        except OffsetMapError as exc:
            log.warning("ignoring the offset map of %s[%d]: %s", *tp, exc)
            return frozenset()
        return completed if base == committed else frozenset()

    # ---- rebalances ---------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        try:
            found = consumer.committed(partitions, timeout=10)
        except KafkaException as exc:
            log.warning("could not read committed offsets (%s): starting without offset maps", exc)
            found = [TopicPartition(p.topic, p.partition) for p in partitions]
        now = time.time()
        for tp in found:
            key = (tp.topic, tp.partition)
            committed = tp.offset if tp.offset >= 0 else None
            completed = self._restore_map(key, committed, tp.metadata)
            self.core.assign(key, committed, completed, now)
            self._assigned.add(key)
            if self.gate is not None:
                self.core.set_limit(key, self.gate.limit(*key), now)
            if completed:
                log.info(
                    "%s[%d]: %d records beyond offset %s completed before, will be skipped",
                    *key,
                    len(completed),
                    committed,
                )
        log.info("assigned %s", _names(found))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        if not tps:
            return
        self.core.revoke(tps)
        timeout = self._revoke_timeout_override
        deadline = time.monotonic() + (self.options.revoke_timeout if timeout is None else timeout)
        revoking = set(tps)
        while revoking & self.core.in_flight_partitions() and time.monotonic() < deadline:
            self._drain_inbox(block=0.01)
            if self._producer is not None:
                self._producer.poll(0)
        left = revoking & self.core.in_flight_partitions()
        if left:
            log.warning(
                "revoking %s with records still in flight: they will be processed again",
                _names(left),
            )
        self._commit(sync=True, tps=tps, consumer=consumer)
        self.core.drop(tps)
        self._assigned -= revoking
        self._paused -= revoking
        log.info("revoked %s", _names(tps))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in partitions]
        self.core.drop(tps)
        self._assigned -= set(tps)
        self._paused -= set(tps)
        log.warning(
            "lost %s (no commit possible; their records will be processed again)", _names(tps)
        )

    # ---- back-pressure ------------------------------------------------------------------

    def _apply_pauses(self) -> None:
        consumer = self._consumer
        if consumer is None or self._stop is not None:
            return
        pause, resume = self.core.pause_changes()
        try:
            if pause:
                consumer.pause([TopicPartition(t, p) for t, p in pause])
                self._paused.update(pause)
            if resume:
                consumer.resume([TopicPartition(t, p) for t, p in resume])
                self._paused.difference_update(resume)
        except KafkaException as exc:
            log.warning("pause/resume failed: %s", exc)

    # ---- dead letters -------------------------------------------------------------------

    def _dead_letter(self, entry: Entry) -> None:
        topic = self.options.dead_letter_topic
        if topic is None:  # validated: only possible with on_exhausted="skip" paths
            self.core.dead_lettered(entry, time.time())
            return
        if self._producer is None:
            config = {k: v for k, v in self.config.items() if k not in CONSUMER_ONLY}
            config.setdefault("logger", logging.getLogger("sdk.kafka.dlt"))
            self._producer = Producer(config)
        message: Message = entry.payload
        error = entry.last_error
        headers = list(message.headers() or [])
        headers += [
            ("dlt.original.topic", entry.tp[0].encode()),
            ("dlt.original.partition", str(entry.tp[1]).encode()),
            ("dlt.original.offset", str(entry.offset).encode()),
            ("dlt.error", f"{type(error).__name__}: {error}".encode(errors="replace")[:4000]),
            ("dlt.attempts", str(entry.attempts).encode()),
        ]

        def delivered(err: KafkaError | None, _: Message) -> None:
            if err is None:
                self.core.dead_lettered(entry, time.time())
            else:
                log.warning("dead-letter write of %r failed, will retry: %s", entry, err.str())
                self._dlt_retry.append((time.monotonic() + 1.0, entry))

        try:
            self._producer.produce(
                topic,
                value=message.value(),
                key=message.key(),
                headers=headers,
                on_delivery=delivered,
            )
        except (BufferError, KafkaException) as exc:
            log.warning("dead-letter write of %r failed, will retry: %s", entry, exc)
            self._dlt_retry.append((time.monotonic() + 1.0, entry))

    def _retry_dead_letters(self) -> None:
        if not self._dlt_retry:
            return
        mono = time.monotonic()
        due = [entry for at, entry in self._dlt_retry if at <= mono]
        self._dlt_retry = [(at, entry) for at, entry in self._dlt_retry if at > mono]
        for entry in due:
            if entry in self.core.dead_letter_pending:
                self._dead_letter(entry)

    # ---- stats --------------------------------------------------------------------------

    def _publish_stats(self, now: float) -> None:
        core = self.core
        partitions = {}
        for tp in core.partitions:
            view = core.partition_view(tp, now)
            if view is not None:
                view["committed"] = self._committed.get(tp)
                partitions[tp] = view
        self._stats = {
            "at": now,
            "in_flight": core.in_flight(),
            "held": core.held(),
            "retrying": len(core.retrying),
            "paused_partitions": sorted(self._paused),
            "paused": self.paused_by_user,
            "offset_map_store": self._map_store,
            "partitions": partitions,
            "counts": {tp: vars(c).copy() for tp, c in core.counts.items()},
            "latency": self._latency_snapshot(),
            "holds": (list(self._holds.counts), self._holds.total),
            "gate": None if self.gate is None else _gate_stats(self.gate),
        }
        self._log_long_holds(now, partitions)

    def _latency_snapshot(self) -> tuple[list[int], float]:
        runner = self._runner
        if runner is None:
            return [], 0.0
        counts: list[int] = []
        total = 0.0
        for latency in list(runner.latencies):
            if not counts:
                counts = list(latency.counts)
            else:
                counts = [a + b for a, b in zip(counts, latency.counts, strict=True)]
            total += latency.total
        return counts, total


def _gate_stats(gate: Gate) -> dict[str, Any]:
    snapshot = gate.snapshot
    return {
        "name": gate.name,
        "version": None if snapshot is None else snapshot.version,
        "age": gate.view.age(),
        "stale": gate.stale,
        "sources": {
            s.state.name: {"up": s.state.up, "rejected": dict(s.state.rejected)}
            for s in gate.sources
        },
    }


def _log_hold(gate: Gate, tp: TP, offset: int, held_for: float) -> None:
    why = gate.explain(tp[0], tp[1], offset)
    waiting = why.get("waiting_for")
    if waiting:
        detail = ", ".join(
            f"{w['group']} (committed {w['committed']}, behind by {w['behind_by']})"
            for w in waiting
        )
    else:
        detail = f"watermark {why['watermark']}"
    log.warning(
        "%s[%d]: records from offset %d held for %.0fs by gate %s: waiting for %s",
        tp[0],
        tp[1],
        offset,
        held_for,
        gate.name,
        detail,
    )


def _names(tps: Iterable[Any]) -> str:
    names = []
    for tp in tps:
        topic, partition = (tp.topic, tp.partition) if isinstance(tp, TopicPartition) else tp
        names.append(f"{topic}[{partition}]")
    return ", ".join(sorted(names)) or "nothing"


def stop_on_signals(
    consumer: ParallelConsumer,
    *,
    timeout: float = 30.0,
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> None:
    """First signal: graceful stop (drain in-flight records for up to ``timeout`` seconds).
    Second signal: stop at once. Call from the main thread."""
    received = 0

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal received
        received += 1
        log.info(
            "signal %s: %s stop",
            signal.Signals(signum).name,
            "graceful" if received == 1 else "immediate",
        )
        consumer.stop(drain=received == 1, timeout=timeout, wait=False)

    for sig in signals:
        signal.signal(sig, handle)
