"""The consumer's thread: the loop that drives the core, and how it waits.

Each turn of the loop fetches, applies results and commands from the inbox, hands work to the
runner, serves dead-letter reports, commits on its interval (or at once when it has caught up:
see :meth:`ConsumerLoop._commit_due`), tells librdkafka which partitions to pause or resume,
publishes stats, and returns how long it may then block waiting for news; it never blocks
itself, so tests can drive it turn by turn. The loop waits in the consumer's ``poll()`` when
nothing is held (a new record wakes it at once) and on the inbox otherwise (results and
commands wake it). The revoke callback, which runs inside ``consume()``, waits for the revoked
partitions' results alone and leaves every other command in the inbox for the next turn.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from sdk.consumer import _stats
from sdk.consumer._errors import EngineError
from sdk.engine._core import TP, Entry, WorkCore
from sdk.produce._deliveries import Awaiting

if TYPE_CHECKING:
    from sdk.consumer._commits import Committer
    from sdk.consumer._holds import Holds
    from sdk.consumer._rebalance import Rebalancer
    from sdk.consumer._runners import Runner
    from sdk.engine._options import Options
    from sdk.engine._sizing import ItemSizer
    from sdk.produce._dead_letters import DeadLetters
    from sdk.produce._producer import Outputs

log = logging.getLogger("sdk")

_FETCH_MAX = 5000
"""Most records taken from librdkafka in one go."""
_FETCH_EVERY = 0.002
"""Seconds between fetches while records are held or running."""
_SERVE_EVERY = 0.05
"""Seconds between the polls that only serve callbacks while the buffer is used up."""
_GIVE_BACK_EVERY = 0.1
"""Seconds between looks for stalled partitions that could give records back."""
_MIN_WAIT = 0.001
"""The loop never blocks for less: a timer that is due but cannot be served must not spin."""
_IDLE_COMMIT_GAP = 0.1
"""Seconds at least between the commits of a consumer that keeps catching up (a trickle of
records, each done before the next arrives, commits about this often, not per record)."""


class ConsumerLoop:
    """The loop of :class:`~sdk.ParallelConsumer`, on the consumer's thread (its state is set
    up by ``ParallelConsumer.__init__``)."""

    options: Options
    core: WorkCore
    paused_by_user: bool
    _time: Callable[[], float]
    _wall: Callable[[], float]
    _mono: Callable[[], float]
    _inbox: queue.SimpleQueue[tuple[Any, ...]]
    _outputs: Outputs
    _acknowledging: dict[int, Awaiting]
    _deferred: deque[tuple[Any, ...]]
    _consumer: Consumer | None
    _runner: Runner | None
    _dead_letters: DeadLetters | None
    _committer: Committer
    _rebalancer: Rebalancer
    _sizer: ItemSizer
    _holds: Holds | None
    _stats: dict[str, Any]
    _stop: tuple[bool, float, bool] | None
    _watermarks_pending: threading.Event
    _fetched_at: float
    _commit_at: float
    _progressed: bool  # records completed since the last commit
    _stats_at: float
    _give_back_at: float

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
        self._serve_outputs(now)
        self._dispatch(now)
        if self._dead_letters is not None:
            self._dead_letters.poll()
        mono = self._mono()
        if self._commit_due(mono):
            if self._stop is None:  # (while stopping, fetched records are not registered)
                self._note_positions()
            if self._committer.commit(self._consumer, sync=False):
                self._commit_at = mono
                self._progressed = False
        self._apply_pauses()  # after the commit: collecting progress frees room
        if mono - self._give_back_at >= _GIVE_BACK_EVERY:
            self._give_back_at = mono
            self._give_back(now)  # after the pauses: a seek before a pause could be lost
        if mono - self._stats_at >= 0.5:
            self._stats_at = mono
            self._stats = _stats.snapshot(self, now, self._wall())
            if self._holds is not None:
                self._holds.log_long(now, self._stats["partitions"])
        return self._wait_time(now)

    def _idle(self) -> bool:
        return not self.core.outstanding and not self.core.held() and self._stop is None

    def _commit_due(self, mono: float) -> bool:
        """Commit on the interval; and, with ``Options.commit_when_idle``, at once (at most
        every ``_IDLE_COMMIT_GAP``) when the consumer has caught up: nothing it fetched is
        running, waiting for its outputs' acknowledgements or held, and records completed
        since the last commit. A consumer that finished its backlog then commits its progress
        (closes its transaction, exactly once) without waiting for the interval's end, so
        that the services gated on its group, and ``read_committed`` readers of its outputs,
        go on at once."""
        since = mono - self._commit_at
        if since >= self.options.commit_interval or self._committer.pending:
            return True
        return (
            self._progressed
            and since >= _IDLE_COMMIT_GAP
            and self.options.commit_when_idle
            and self._idle()
        )

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
            if self._progressed and self.options.commit_when_idle:  # (see _commit_due)
                wait = min(wait, self._commit_at + _IDLE_COMMIT_GAP - self._mono())
        due = core.next_due()
        if due is not None and self._free_slots() > 0 and not core.paused_all:
            wait = min(wait, due - now)  # a parked record we could start becomes due
        return max(_MIN_WAIT, wait)

    def _fetch(self, timeout: float) -> None:
        consumer = self._consumer
        assert consumer is not None
        core = self.core
        now = self._time()
        room = core.room(now)
        if room <= 0 and core.outstanding:
            # Records that items still running have finished free their room once applied
            # (otherwise only at the next commit or the item's end: a slow key's long item
            # would keep the buffer full for its whole run).
            core.collect_progress(now)
            room = core.room(now)
        if room <= 0:
            # The buffer is used up to its reserve: serve librdkafka's callbacks now and then,
            # taking at most one record (into the reserve). Partitions are not paused for it:
            # a pause throws away what librdkafka prefetched; at the full buffer they are.
            if timeout <= 0 and self._mono() - self._fetched_at < _SERVE_EVERY:
                return
            messages = consumer.consume(1, 0)
            self._fetched_at = self._mono()
            if messages and self._stop is None:
                if not self.core.full:
                    self._register(messages, self._time())
                else:  # full (so paused), but a partition assigned meanwhile handed one over
                    self._put_back(consumer, messages[0])
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

    def _give_back(self, now: float) -> None:
        """Stalled partitions beyond their share forget their newest unstarted records while
        the buffer is used up; a seek back has them fetched again once they move."""
        consumer = self._consumer
        if consumer is None or self._stop is not None:
            return
        plan = self.core.plan_give_back(now)
        for tp, offset in plan:
            try:
                consumer.seek(TopicPartition(tp[0], tp[1], offset))
            except KafkaException as exc:
                log.debug(
                    "could not seek %s[%d] back to %d: keeping its records (%s)",
                    *tp,
                    offset,
                    str(exc),
                )
                continue
            forgotten = self.core.give_back(tp, offset)
            log.info(
                "%s[%d] is stalled: gave back its %d newest records (from offset %d) to fetch "
                "them again once it moves, so the partitions that flow have room",
                tp[0],
                tp[1],
                forgotten,
                offset,
            )
        if plan:
            self._apply_pauses()  # the room freed may resume partitions paused while crowded

    def _note_positions(self) -> None:
        """Tell the core the consumer's position in the partitions that hold nothing: between
        fetches, every record the consumer returned was registered (or put back with a seek,
        which leaves no position until it is fetched again), so their commits may pass
        offsets no record was returned for (transaction markers, aborted records)."""
        consumer = self._consumer
        tps = self.core.idle_partitions()
        if consumer is None or not tps:
            return
        try:
            found = consumer.position([TopicPartition(t, p) for t, p in tps])
        except KafkaException as exc:
            log.debug("could not read the consumer's positions: %s", str(exc))
            return
        self.core.positions(
            {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0 and not tp.error}
        )

    def _put_back(self, consumer: Consumer, message: Message) -> None:
        """Seek back to a record the engine has no room for (it is fetched again later)."""
        if message.error() is not None:
            self._message_error(message.error())
            return
        try:
            consumer.seek(TopicPartition(message.topic(), message.partition(), message.offset()))
        except KafkaException as exc:
            log.debug("could not put back %s: keeping it (%s)", message.offset(), str(exc))
            self._register([message], self._time())

    def _register(self, messages: list[Message], now: float) -> None:
        if self._watermarks_pending.is_set():
            # A record may join a running item as it is registered: under the newest limits,
            # not those of before a snapshot that lowered them.
            self._apply_watermarks(now)
        wall_offset = self._wall() - now if self.options.process_delay else None
        errors = self.core.add_messages(messages, now, wall_offset)
        for message in errors:
            self._message_error(message.error())

    def _rejoin_fenced(self, error: KafkaError) -> bool:
        """Whether a fatal error was met by a new consumer taking the failed one's place
        (see :class:`~sdk.consumer._parallel.ParallelConsumer`)."""
        return False

    def _message_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if error.fatal() or error.code() == KafkaError._FATAL:
            # (librdkafka hands a fatal error, such as a static member fenced by another with
            # the same group.instance.id, to the consumer as an error event whose code is
            # _FATAL: the consumer can never fetch again.)
            if self._rejoin_fenced(error):
                return
            raise EngineError(f"the consumer failed for good: {error.str()}")
        log.warning("consumer error: %s", error.str())

    # ---- handing out work ---------------------------------------------------------------

    def _free_slots(self) -> int:
        runner = self._runner
        if runner is None or self.paused_by_user:
            return 0
        running = len(self.core.outstanding) - len(self._acknowledging)
        return self.options.max_concurrency + runner.queued_items - running

    def _dispatch(self, now: float) -> None:
        slots = self._free_slots()
        if slots <= 0 or not self.core.has_ready(now) or self._committer.holding_back:
            return
        assert self._runner is not None
        core = self.core
        shape = self._sizer.shape(core.held() - core.in_flight(), core.ready_shards())
        for item in core.take(now, slots, shape):
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
            self._apply_watermarks(now)
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
        if type(results) is Awaiting:
            deliveries = results.deliveries
            if not deliveries.settled:
                self._acknowledging[item_id] = results  # its outputs are on their way
                deliveries.item = item_id  # the report that completes it settles it
                if not deliveries.settled or self._acknowledging.pop(item_id, None) is None:
                    return  # (its last report may have been served meanwhile, elsewhere)
            results = results.settle()
        self._apply(item_id, results, now)

    def _serve_outputs(self, now: float) -> None:
        """Serve the producer's delivery reports (when due); items whose outputs are all
        acknowledged (or failed) are done (their failures applied)."""
        try:
            settled = self._outputs.poll(bool(self.core.outstanding))
        except KafkaException as exc:  # a fatal error of the producer, raised by its poll
            self._output_producer_failed(exc)
            return
        if settled:
            acknowledging = self._acknowledging
            for deliveries in settled:
                item_id = deliveries.item
                results = acknowledging.pop(item_id, None)  # type: ignore[arg-type]
                if results is not None:  # (else applied already)
                    self._apply(item_id, results.settle(), now)  # type: ignore[arg-type]

    def _output_producer_failed(self, exc: KafkaException) -> None:
        """The producer of outputs failed for good. Transactional: the committer decides
        (fenced: the consumer stops; otherwise a new producer). At least once: the consumer
        stops (what was acknowledged is committed; the rest runs again after a restart)."""
        failed = getattr(self._committer, "failed", None)
        if failed is not None:
            failed(exc)
            return
        raise EngineError(f"the producer of outputs failed: {_text(exc)}") from None

    def _apply(self, item_id: int, results: list[Any], now: float) -> None:
        outcome = self.core.complete(item_id, results, now)
        self._progressed = True
        for entry in outcome.dead_letters:
            assert self._dead_letters is not None  # a dead-letter decision needs the topic
            self._dead_letters.send(entry)
        for entry in outcome.stuck:
            _report_stuck(entry)

    def _settle(self, block: float) -> None:
        """Apply the results waiting in the inbox (waiting up to ``block`` seconds for the
        first); commands wait for the next turn. (A transaction closes after this.)"""
        try:
            message = self._inbox.get(timeout=block) if block > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if message[0] in ("done", "done_many"):
                self._handle(message, self._time())
            else:
                self._deferred.append(message)
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return

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
            self._serve_outputs(self._time())
            try:
                message = self._inbox.get(timeout=0.01)
            except queue.Empty:
                continue
            if message[0] in ("done", "done_many"):
                self._handle(message, self._time())
            else:
                self._deferred.append(message)

    # ---- gating -------------------------------------------------------------------------

    def _apply_watermarks(self, now: float) -> None:
        """The gate's newest snapshot becomes the release limits."""
        self._watermarks_pending.clear()
        if self._holds is not None:
            self._holds.apply(now)

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


def _text(exc: BaseException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)


def _report_stuck(entry: Entry) -> None:
    log.error(
        "%s failed for good (%s) and there is no dead-letter topic: it is held, its "
        "shard waits and the commit stays at or below offset %d. Set dead_letter_topic, or "
        "on_exhausted='skip' to drop such records.",
        repr(entry),
        entry.last_error,
        entry.offset,
    )
