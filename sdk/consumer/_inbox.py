"""What reaches the consumer's thread besides records: results, commands and watermarks.

Workers put each item's results in the inbox (at least once, an item whose outputs are still
on their way waits here until they are acknowledged); callers put commands (stop, pause,
resume) and the gate's sources a wake-up for a new snapshot. The loop (:class:`~sdk.consumer._loop.
ConsumerLoop`) drains it on every turn; while a transaction closes or a revocation waits for
its partitions' records, only results are applied and commands wait for the next turn.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from sdk.consumer._errors import EngineError
from sdk.engine._core import TP, Entry, WorkCore
from sdk.produce._deliveries import Awaiting

if TYPE_CHECKING:
    from sdk.consumer._commits import Committer
    from sdk.consumer._holds import Holds
    from sdk.consumer._rebalance import Rebalancer
    from sdk.engine._sizing import ItemSizer
    from sdk.produce._dead_letters import DeadLetters
    from sdk.produce._producer import Outputs

log = logging.getLogger("sdk")

_ACKNOWLEDGE_WITHIN = 0.05
"""At least once: seconds items with outputs wait, while workers keep producing, before the
workers pause so that the outputs on their way are acknowledged together."""
_PAUSE_AT_MOST = 0.25
"""At least once: seconds such a pause lasts at most (see ``Inbox._acknowledge``)."""


class Inbox:
    """The inbox side of :class:`~sdk.consumer._loop.ConsumerLoop` (on the consumer's
    thread; its state is set up by ``ParallelConsumer.__init__``)."""

    core: WorkCore
    paused_by_user: bool
    _time: Callable[[], float]
    _mono: Callable[[], float]
    _inbox: queue.SimpleQueue[tuple[Any, ...]]
    _outputs: Outputs
    _acknowledging: dict[int, Awaiting]
    _acknowledging_since: float  # (monotonic) when the oldest item waiting came
    _paused_at: float  # (monotonic) when workers last paused for acknowledgements
    _deferred: deque[tuple[Any, ...]]
    _consumer: Consumer | None
    _dead_letters: DeadLetters | None
    _committer: Committer
    _rebalancer: Rebalancer
    _sizer: ItemSizer
    _holds: Holds | None
    _stop: tuple[bool, float, bool] | None
    _watermarks_pending: threading.Event
    _progressed: bool  # records completed since the last commit

    # ---- results and commands -------------------------------------------------------------

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
        if type(results) is Awaiting:  # its outputs are on their way (see _acknowledge)
            if not self._acknowledging:
                self._acknowledging_since = self._mono()
            self._acknowledging[item_id] = results
            return
        self._apply(item_id, results, now)

    def _serve_outputs(self, now: float, hurry: bool = False) -> None:
        """Serve the producer's delivery reports (when due); at least once, the items whose
        outputs wait are done once they are all acknowledged (their failures applied)."""
        try:
            if self._acknowledging:
                self._acknowledge(now, hurry)  # (it serves the reports)
            else:
                self._outputs.poll(bool(self.core.outstanding))
        except KafkaException as exc:  # a fatal error of the producer, raised by its poll
            self._output_producer_failed(exc)

    def _acknowledge(self, now: float, hurry: bool) -> None:
        """At least once: every item waiting settles once the producer holds no output that
        is neither acknowledged nor reported failed. Workers that keep producing keep some
        there, so after ``_ACKNOWLEDGE_WITHIN`` (at once with ``hurry``: a revocation waits)
        they pause (wait before their next record) until it is empty, for ``_PAUSE_AT_MOST`` at
        most (a broker slow to acknowledge must not stop records without outputs for long);
        then they go on for another ``_ACKNOWLEDGE_WITHIN`` before the next pause."""
        outputs, core = self._outputs, self.core
        pause = outputs.pause
        assert pause is not None  # (at least once)
        mono = self._mono()
        if not pause.closing and (hurry or mono - self._acknowledging_since >= _ACKNOWLEDGE_WITHIN):
            pause.close()
            self._paused_at = mono
        drain = pause.closing or not (self._items_running() or core.has_ready(now))
        if outputs.acknowledged(drain):
            pause.open()
            acknowledging, self._acknowledging = self._acknowledging, {}
            for item_id, results in acknowledging.items():
                self._apply(item_id, results.settle(), now)
        elif pause.closing and not hurry and mono - self._paused_at >= _PAUSE_AT_MOST:
            pause.open()
            self._acknowledging_since = mono

    def _items_running(self) -> int:
        """Items handed out whose results have not come (at least once, not those waiting
        for their outputs' acknowledgement)."""
        return len(self.core.outstanding) - len(self._acknowledging)

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
            self._serve_outputs(self._time(), hurry=True)
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

    # ---- stopping and pausing -------------------------------------------------------------

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

    def _apply_pauses(self) -> None:
        """Tell librdkafka which partitions to pause or resume (the core decides)."""
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
