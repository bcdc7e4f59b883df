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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from sdk.consumer import _stats
from sdk.consumer._errors import EngineError
from sdk.consumer._inbox import Inbox

if TYPE_CHECKING:
    from sdk.consumer._runners import Runner
    from sdk.engine._options import Options

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


class ConsumerLoop(Inbox):
    """The loop of :class:`~sdk.ParallelConsumer`, on the consumer's thread (its state is set
    up by ``ParallelConsumer.__init__``)."""

    options: Options
    _wall: Callable[[], float]
    _runner: Runner | None
    _stats: dict[str, Any]
    _fetched_at: float
    _commit_at: float
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
        (see :class:`~sdk.consumer._clients.Clients`)."""
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
        return self.options.max_concurrency + runner.queued_items - self._items_running()

    def _dispatch(self, now: float) -> None:
        slots = self._free_slots()
        if slots <= 0 or not self.core.has_ready(now) or self._committer.holding_back:
            return
        pause = self._outputs.pause
        if pause is not None and pause.closing:
            return  # (at least once: workers pause until the outputs waiting are acknowledged)
        assert self._runner is not None
        core = self.core
        shape = self._sizer.shape(core.held() - core.in_flight(), core.ready_shards())
        for item in core.take(now, slots, shape):
            self._runner.submit(item)

    # ---- stopping -----------------------------------------------------------------------

    def _stop_done(self, mono: float) -> bool:
        assert self._stop is not None
        drain, deadline, drain_buffered = self._stop
        if not drain or mono >= deadline:
            return True
        if self.core.outstanding or self.core.dead_letter_pending:
            return False
        return not (drain_buffered and self.core.held())
