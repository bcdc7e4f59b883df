"""The parallel consumer: one Kafka consumer on one thread, handlers on many.

The consumer's thread is the only one that touches the confluent-kafka ``Consumer`` and the
core. Each turn of its loop fetches, applies results and commands from its inbox, hands work
to the runner, tells librdkafka which partitions to pause or resume, commits, and returns how
long it may then block waiting for news. Rebalance callbacks run inside ``consume()``; the
revoke callback waits for the revoked partitions' results but leaves every other command in
the inbox for the next turn. Nothing else takes a lock around the Kafka client.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from prometheus_client import REGISTRY, CollectorRegistry

from sdk import _stats
from sdk._commits import Committer
from sdk._core import TP, Entry, WorkCore
from sdk._dead_letters import DeadLetters
from sdk._failures import FailurePolicy
from sdk._gating import Gate
from sdk._holds import Holds
from sdk._maps import OffsetMaps, choose_store
from sdk._options import CONSUMER_ONLY, Options, OptionsError
from sdk._rebalance import Rebalancer
from sdk._runners import AsyncRunner, Runner, ThreadRunner, Work, is_coroutine_handler
from sdk._sizing import ItemSizer

log = logging.getLogger("sdk")

_FETCH_MAX = 5000
"""Most records taken from librdkafka in one go."""
_FETCH_EVERY = 0.002
"""Seconds between fetches while records are held or running."""
_MIN_WAIT = 0.001
"""The loop never blocks for less: a timer that is due but cannot be served must not spin."""


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
        self.options = options = options or Options()
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
        failures = FailurePolicy(
            max_attempts=options.max_attempts,
            retry_delay=options.retry_delay,
            on_exhausted=options.on_exhausted,
            dead_letters=options.dead_letter_topic is not None,
            decode_errors_to_dead_letters=options.on_decode_error == "dead_letter",
        )
        self.core = WorkCore(
            options.ordering,
            null_keys=options.null_keys,
            failures=failures,
            max_retrying=options.max_retrying,
            process_delay=options.process_delay,
            buffer_limit=options.buffer_limit,
        )
        self.paused_by_user = False
        self._time: Callable[[], float] = time.time  # the clock (replaceable in tests)
        self._mono: Callable[[], float] = time.monotonic
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._deferred: deque[tuple[Any, ...]] = deque()  # commands that came during a revoke
        self._consumer: Consumer | None = None
        self._runner: Runner | None = None
        self._dead_letters: DeadLetters | None = None
        self._maps = OffsetMaps("none", self.group)
        self._thread: threading.Thread | None = None
        self._stop: tuple[bool, float, bool] | None = None  # (drain, deadline, drain_buffered)
        self._finished = threading.Event()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._stats: dict[str, Any] = {}
        self._collector: Any = None
        self._sizer = ItemSizer(options)
        self._committer = Committer(self.core, self._maps, options.hooks.on_commit, self._now)
        self._rebalancer = Rebalancer(
            self.core,
            self._committer,
            self._maps,
            gate,
            self._await_results,
            self._now,
            self._monotonic,
            options.revoke_timeout,
        )
        self._owns_gate = False
        self._watermarks_pending = threading.Event()
        self._holds = None if gate is None else Holds(gate, self.core)
        self._fetched_at = self._commit_at = self._stats_at = -1e18

    def _now(self) -> float:
        return self._time()

    def _monotonic(self) -> float:
        return self._mono()

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
        self._inbox.put(("stop", drain, self._mono() + timeout, drain_buffered))
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

    # ---- the clients (tests replace these to drive the shell with simulated ones) --------

    def _new_consumer(self, config: dict[str, Any]) -> Consumer:
        return Consumer(config)

    def _new_producer(self) -> Producer:
        config = {k: v for k, v in self.config.items() if k not in CONSUMER_ONLY}
        config.setdefault("logger", logging.getLogger("sdk.kafka.dlt"))
        return Producer(config)

    def _new_runner(self, work: Work) -> Runner:
        if is_coroutine_handler(self.handler):
            return AsyncRunner(work, self.options.max_concurrency, self._inbox)
        return ThreadRunner(work, self.options.max_concurrency, self._inbox)

    def _choose_maps(self) -> OffsetMaps:
        return choose_store(
            self.options, self.config, self.group, self.topics[0], self._new_consumer
        )

    # ---- opening and closing ------------------------------------------------------------

    def _open(self) -> None:
        config = dict(self.config)
        config["on_commit"] = self._committer.on_commit
        config.setdefault("logger", logging.getLogger("sdk.kafka"))
        try:
            self._consumer = self._new_consumer(config)
        except KafkaException as exc:
            raise OptionsError(f"config: {exc.args[0].str() if exc.args else exc}") from None
        self._maps = self._committer.maps = self._rebalancer.maps = self._choose_maps()
        if self.options.dead_letter_topic:
            self._dead_letters = DeadLetters(
                self.options.dead_letter_topic, self.core, self._new_producer, self._time
            )
        if self.gate is not None:
            self._owns_gate = not self.gate._started
            self.gate.start()
            self.gate.view.add_listener(self._on_watermarks)
        self._runner = self._new_runner(Work(self.handler, self.options))
        if self.registry is not None:
            from sdk._metrics import EngineCollector

            self._collector = EngineCollector(self)
            self.registry.register(self._collector)
        rebalancer = self._rebalancer
        self._consumer.subscribe(
            self.topics,
            on_assign=rebalancer.on_assign,
            on_revoke=rebalancer.on_revoke,
            on_lost=rebalancer.on_lost,
        )
        log.info(
            "consuming %s as group %s (%s ordering, concurrency %d, offset map: %s)",
            ", ".join(self.topics),
            self.group,
            self.options.ordering.value,
            self.options.max_concurrency,
            self._maps.kind,
        )

    def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            immediate = self._stop is not None and not self._stop[0]
            if immediate or self._error:
                self._rebalancer.revoke_timeout = 0.0
            with contextlib.suppress(Exception):
                self._committer.commit(consumer, sync=True)
            try:
                consumer.close()  # leaves the group: on_revoke commits and drops what is left
            except Exception as exc:
                log.warning("closing the consumer: %s", exc)
        if self._dead_letters is not None:
            self._dead_letters.close()
        if self._runner is not None:
            self._runner.close(wait=1.0 if self._stop and self._stop[0] else 0.0)
        if self._collector is not None and self.registry is not None:
            with contextlib.suppress(KeyError):
                self.registry.unregister(self._collector)
        self._maps.close()
        if self.gate is not None:
            self.gate.view.remove_listener(self._on_watermarks)
            if self._owns_gate:
                self.gate.stop()

    # ---- the loop -----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            wait = self._turn()
            if wait is None:
                return
            if self._idle():
                self._fetch(wait)  # nothing held: new records (or a command) wake it
            else:
                self._drain_inbox(block=wait)  # results and commands wake it

    def _turn(self) -> float | None:
        """One turn of the loop (it never blocks). Returns how long the loop may now wait for
        news, or None once stopped."""
        mono = self._mono()
        if self._stop is not None and self._stop_done(mono):
            return None
        if mono - self._fetched_at >= _FETCH_EVERY:
            self._fetch(0.0)
        self._drain_inbox(block=0.0)
        now = self._time()
        self._dispatch(now)
        if self._dead_letters is not None:
            self._dead_letters.poll()
        mono = self._mono()
        if mono - self._commit_at >= self.options.commit_interval:
            self._commit_at = mono
            self._committer.commit(self._consumer, sync=False)
        self._apply_pauses()  # after the commit: collecting progress frees room
        if mono - self._stats_at >= 0.5:
            self._stats_at = mono
            self._stats = _stats.snapshot(self, now)
            if self._holds is not None:
                self._holds.log_long(now, self._stats["partitions"])
        return self._wait_time(now)

    def _idle(self) -> bool:
        return not self.core.outstanding and not self.core.held() and self._stop is None

    def _wait_time(self, now: float) -> float:
        """How long nothing can happen without news: records running report soon; with only
        held records (a closed gate, a retry delay) watermark changes and timers wake us."""
        core = self.core
        if core.outstanding:
            wait = 0.005
        elif not self._idle():
            wait = 0.02
        else:
            wait = min(0.1, self.options.commit_interval)
        due = core.next_due()
        if due is not None and self._free_slots() > 0 and not core.paused_all:
            wait = min(wait, due - now)  # a parked record we could start becomes due
        return max(_MIN_WAIT, wait)

    def _fetch(self, timeout: float) -> None:
        consumer = self._consumer
        assert consumer is not None
        room = self.core.buffer_limit - self.core.held()
        if room <= 0:
            # Full, so every partition is paused and this only serves callbacks; but a
            # partition assigned during it may hand over a record: it is put back for later.
            for message in consumer.consume(1, 0):
                self._put_back(consumer, message)
            self._fetched_at = self._mono()
            self._apply_pauses()
            return
        if timeout > 0:
            # consume(n, timeout) waits until n records arrived or the timeout passed, so
            # wait in poll() (which returns with the first record) and take the rest after.
            first = consumer.poll(timeout)
            messages = [] if first is None else [first]
            if first is not None and room > 1:
                messages += consumer.consume(min(_FETCH_MAX, room - 1), 0)
        else:
            messages = consumer.consume(min(_FETCH_MAX, room), 0)
        self._fetched_at = self._mono()
        if messages and self._stop is None:  # while stopping, fetched records are left alone
            self._register(messages, self._time())
            self._apply_pauses()  # a large fetch may fill shares: pause before the next one

    def _put_back(self, consumer: Consumer, message: Message) -> None:
        """Seek back to a record the engine has no room for (it is fetched again later)."""
        if message.error() is not None:
            self._message_error(message.error())
            return
        try:
            consumer.seek(TopicPartition(message.topic(), message.partition(), message.offset()))
        except KafkaException as exc:
            log.debug("could not put back %s: keeping it (%s)", message.offset(), exc)
            self._register([message], self._time())

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

    # ---- handing out work ---------------------------------------------------------------

    def _free_slots(self) -> int:
        runner = self._runner
        if runner is None or self.paused_by_user:
            return 0
        return self.options.max_concurrency + runner.queued_items - len(self.core.outstanding)

    def _dispatch(self, now: float) -> None:
        slots = self._free_slots()
        if slots <= 0 or not self.core.has_ready(now):
            return
        assert self._runner is not None
        shape = self._sizer.shape(self.core.held() - self.core.in_flight())
        for item in self.core.take(now, slots, shape):
            self._runner.submit(item)

    # ---- inbox --------------------------------------------------------------------------

    def _drain_inbox(self, block: float) -> None:
        deferred = self._deferred
        while deferred:
            self._handle(deferred.popleft(), self._time())
        inbox = self._inbox
        try:
            message = inbox.get(timeout=block) if block > 0 else inbox.get_nowait()
        except queue.Empty:
            return
        now = self._time()
        while True:
            self._handle(message, now)
            try:
                message = inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, message: tuple[Any, ...], now: float) -> None:
        kind = message[0]
        if kind == "done":
            self._completed(message, now)
        elif kind == "done_many":
            for done in message[1]:
                self._completed(done, now)
        elif kind == "watermarks":
            self._watermarks_pending.clear()
            if self._holds is not None:
                self._holds.apply(now)
        elif kind == "stop":
            _, drain, deadline, drain_buffered = message
            if self._stop is None:
                self._begin_stop(drain, deadline, drain_buffered)
        elif kind == "pause":
            self.paused_by_user = True
            self.core.pause_all()
        elif kind == "resume":
            self.paused_by_user = False
            if self._stop is None or self._stop[2]:
                self.core.resume_all()
        else:
            log.debug("ignored inbox message %r", kind)

    def _completed(self, message: tuple[Any, ...], now: float) -> None:
        _, item_id, results, seconds, count = message
        self._sizer.observe(seconds, count)
        outcome = self.core.complete(item_id, results, now)
        for entry in outcome.dead_letters:
            assert self._dead_letters is not None  # a dead-letter decision needs the topic
            self._dead_letters.send(entry)
        for entry in outcome.stuck:
            _report_stuck(entry)

    def _await_results(self, tps: set[TP], deadline: float) -> None:
        """Inside the revoke callback: apply results until no record of ``tps`` is in flight
        or waits for its dead-letter copy. Other commands wait for the next turn."""
        core = self.core
        while self._mono() < deadline:
            busy = core.in_flight_partitions() | {e.tp for e in core.dead_letter_pending}
            if not tps & busy:
                return
            if self._dead_letters is not None:
                self._dead_letters.poll()
            try:
                message = self._inbox.get(timeout=0.01)
            except queue.Empty:
                continue
            if message[0] in ("done", "done_many"):
                self._handle(message, self._time())
            else:
                self._deferred.append(message)

    # ---- gating -------------------------------------------------------------------------

    def _on_watermarks(self, snapshot: Any) -> None:
        """From a source's thread: wake the consumer's thread (once per burst)."""
        if not self._watermarks_pending.is_set():
            self._watermarks_pending.set()
            self._inbox.put(("watermarks",))

    # ---- stopping -----------------------------------------------------------------------

    def _begin_stop(self, drain: bool, deadline: float, drain_buffered: bool) -> None:
        self._stop = (drain, deadline, drain_buffered)
        log.info(
            "stopping (%s)",
            "draining in-flight" + (" and buffered" if drain_buffered else "")
            if drain
            else "at once",
        )
        self.core.stop_fetching()
        self._apply_pauses()
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

    # ---- fetching -----------------------------------------------------------------------

    def _apply_pauses(self) -> None:
        if self._consumer is not None:
            self._rebalancer.reconcile(self._consumer)


def _report_stuck(entry: Entry) -> None:
    error = entry.last_error
    log.error(
        "%r failed for good (%s: %s) and there is no dead-letter topic: it is held, its "
        "shard waits and the commit stays at or below offset %d. Set dead_letter_topic, or "
        "on_exhausted='skip' to drop such records.",
        entry,
        type(error).__name__,
        error,
        entry.offset,
    )


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
