"""Exactly-once commits: bulk transactions of outputs and the offsets of their inputs.

With ``CommitMode.TRANSACTIONAL`` one transactional producer writes every handler output and
dead-letter copy. Every ``commit_interval`` (and once it has caught up: see
``ConsumerLoop._commit_due``) the consumer's thread closes the open transaction: it asks
workers to wait before starting another item, waits (without blocking its loop) until no item
holds the transaction lock, applies the results those items reported, then sends the offsets
(and offset maps) of the inputs that are done with the consumer's group metadata and commits;
then it opens the next transaction and lets the workers go on. So every output in a
transaction belongs to an input whose offset is in the same transaction, and outputs produced
while a commit is in progress wait for the next transaction.

The producer's life cycle (:attr:`TransactionalCommitter.state`)::

    renewing --init ok--> between --begin ok--> open --close asked--> closing
       ^  |                  ^                   |                      |
       |  +--retriable: again on a later turn    |  lost with records    | no item holds
       |     (nothing handed out meanwhile)       |  of its partitions    | the lock
       |                                          |  running: abort       v
       |                  +---------abort ok------+------------------ committing --ok--> between
       |                                                                  |
       +---- commit failed (its outcome unknown), abort failed, fatal ----+
             but not fenced: a new producer (its init fences the old one)

    any call failing "fenced" (or a fatal error naming it) --> dead

- **open**: workers run items and produce into the transaction; **closing**: a close was
  asked for and waits for the items holding the lock (they start no further record).
- **committing**: the producer's queue flushed (every output's delivery reported: a failed
  one aborts the transaction instead), then ``send_offsets_to_transaction`` and
  ``commit_transaction``. An abortable error, a retriable one or a timeout leaves the
  outcome of the commit unknown: the producer is never asked to ``begin_transaction`` again
  (librdkafka has no defence yet against a delayed ``EndTxn`` applying to a later
  transaction). A new producer takes its place.
- **between**: no transaction is open; the next one begins as soon as no item holds the lock
  (an abort while items ran: what they produce fails, since no transaction is open).
- **renewing**: a new producer must finish ``init_transactions``, which fences the old one
  and resolves its last transaction, before the committed offsets are read again and the
  assigned partitions are sent back to them. A retriable failure (the broker unreachable:
  librdkafka's "retry call to resume") is retried on a later turn, with nothing handed out
  meanwhile, for as long as it takes; the consumer keeps polling, so it stays in its group.
- **dead**: the producer was fenced by another with the same ``transactional.id`` (or failed
  for good in a way a new producer cannot mend). No transactional call is made any more:
  neither a commit on closing nor a new producer, which would fence the process that took
  over. The consumer stops with :class:`TransactionError`.

When a transaction cannot commit (a failed delivery, an abortable error, a rebalance that
cannot wait for the records in flight, partitions lost while their records run), it is
aborted: its outputs never become visible to ``read_committed`` readers, and every assigned
partition goes back to its last committed offset to be processed again. When some of its
outputs failed delivery or are not acknowledged yet, a new producer aborts it (renewing):
a produce request that timed out may reach the broker after the abort, where a broker that
does not fence the aborting producer's epoch would commit it with that producer's next
transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Literal, NoReturn

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from sdk.consumer._commits import Committer
from sdk.consumer._fencing import FENCED_HINT, TransactionError, error_text, kind_of
from sdk.consumer._maps import OffsetMaps
from sdk.engine._core import TP, WorkCore
from sdk.produce._producer import Outputs, kafka_errors

log = logging.getLogger("sdk")

TIMEOUT = 30.0
"""Seconds a transaction call (init, send offsets, commit, abort) may take."""
RESUME_TIMEOUT = 1.0
"""Seconds a retried ``init_transactions`` may take on a turn of the loop (the call resumes
where the one before it timed out)."""
State = Literal["renewing", "between", "open", "closing", "committing", "dead"]


class TransactionalCommitter(Committer):
    def __init__(
        self,
        core: WorkCore,
        maps: OffsetMaps,
        hook: Callable[[dict[TP, int]], None] | None,
        clock: Callable[[], float],
        outputs: Outputs,
        settle: Callable[[float], None],
        rewind: Callable[[Consumer], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(core, maps, hook, clock)
        self.outputs = outputs
        self.lock = outputs.lock
        assert self.lock is not None
        self.settle = settle
        self.rewind = rewind
        self.monotonic = monotonic
        self.state: State = "renewing"
        self.rewind_due = False  # the partitions go back once the new producer is ready
        self.init_calls = 0  # calls of init_transactions on the current producer
        self.retrying_since: float | None = None  # retriable init failures (for the log)
        self.committed = 0
        self.aborted = 0
        self.seconds = 0.0  # spent closing transactions (sending offsets and committing)
        self.last_seconds = 0.0
        self.last_outputs = 0
        self.outputs_committed = 0
        self.last_abort: str | None = None

    @property
    def open(self) -> bool:
        return self.state in ("open", "closing")

    @property
    def dead(self) -> bool:
        return self.state == "dead"

    @property
    def holding_back(self) -> bool:
        return not self.open  # no transaction for an item handed out now (closing: it waits)

    def release(self) -> None:
        """Inside a revocation, which waits for the records in flight: a close waiting for
        items lets the workers it holds back go on (records of revoked partitions do not
        start), and closes with the revocation's own commit."""
        if self.pending and self.state == "closing":
            self.pending = False
            self.state = "open"
            assert self.lock is not None
            self.lock.reopen()

    def lost(self, consumer: Consumer, running: bool = True) -> None:
        """Partitions were lost: their offsets can no longer be committed. The open
        transaction is aborted when it may hold (or a record still running may put into it)
        outputs of their inputs: ``running`` says whether records of the lost partitions
        were in flight. (The partitions still assigned go back to their committed offsets.)"""
        if not self.open:
            return
        if running or self.outputs.in_transaction or self.outputs.broken:
            why = (
                "partitions were lost while their records ran"
                if running and not self.outputs.in_transaction
                else "partitions were lost with outputs in the open transaction"
            )
            self.abort(consumer, why)

    def begin(self) -> None:
        """Initialise the producer (fencing and aborting a predecessor's open transaction)
        and open the first transaction. A retriable failure (the broker not reachable yet)
        is retried on the loop's turns."""
        self.state = "renewing"
        self._advance(None, TIMEOUT)

    def _advance(self, consumer: Consumer | None, timeout: float) -> None:
        """Move towards an open transaction: finish initialising a new producer (then send
        the partitions back to their committed offsets, when due), and begin a transaction
        once no item holds the lock."""
        if self.state == "renewing":
            producer = self.outputs.producer
            self.init_calls += 1
            try:
                with kafka_errors():
                    producer.init_transactions(timeout if self.init_calls == 1 else RESUME_TIMEOUT)
            except KafkaException as exc:
                kind = kind_of(exc)
                if kind in ("retriable", "abortable"):
                    self._still_renewing(exc)
                    return
                self.state = "dead"
                raise TransactionError(
                    f"could not initialise transactions: {error_text(exc)}"
                    + (FENCED_HINT if kind == "fenced" else "")
                ) from None
            if self.retrying_since is not None:
                log.warning(
                    "the transactional producer is initialised again after %.0f s",
                    self.monotonic() - self.retrying_since,
                )
                self.retrying_since = None
            self.state = "between"
        if self.rewind_due and consumer is not None:
            self.rewind_due = False
            self.rewind(consumer)
        if self.state != "between":
            return
        assert self.lock is not None
        if not self.lock.close():
            self.pending = True  # items in flight: it opens once they are gone
            return
        try:
            with kafka_errors():
                self.outputs.producer.begin_transaction()
        except KafkaException as exc:
            if kind_of(exc) == "fenced":
                self._dies(exc)
            self._renew(f"could not begin a transaction: {error_text(exc)}")
            return
        self.state = "open"
        self.pending = False
        self.outputs.in_transaction = 0
        self.outputs.broken = None
        self.lock.reopen()

    def _still_renewing(self, exc: KafkaException) -> None:
        now = self.monotonic()
        if self.retrying_since is None:
            self.retrying_since = now
            log.warning(
                "initialising the transactional producer failed (%s): retrying with nothing "
                "handed out meanwhile",
                error_text(exc),
            )
        else:
            log.debug("initialising the transactional producer: %s", error_text(exc))

    def commit(
        self,
        consumer: Consumer,
        *,
        sync: bool,
        tps: Iterable[TP] | None = None,
        wait: float = 0.0,
    ) -> bool:
        """Close the open transaction and open the next. Not ``sync``: returns False while
        items in flight hold it (call again). ``sync``: waits up to ``wait`` seconds for them
        (applying their results), and aborts the transaction if they do not finish. ``tps``
        is ignored: a transaction commits every partition's offsets. Without an open
        transaction it moves towards one (and, dead, does nothing)."""
        if self.state == "dead":
            self.pending = False
            return True
        if not self.open:
            self._advance(consumer, TIMEOUT)
            return True
        lock = self.lock
        assert lock is not None
        if not lock.close():
            if not sync:
                self.state = "closing"
                self.pending = True
                return False
            deadline = self.monotonic() + wait
            while not lock.close():
                if self.monotonic() >= deadline:
                    self.pending = False
                    self.abort(consumer, "records in flight did not finish in time")
                    return True
                self.settle(0.005)
        self.pending = False
        self.state = "closing"
        self.settle(0.0)  # the results of the items that left the lock
        if not self.open:  # aborted while the results were applied
            self._advance(consumer, TIMEOUT)
            return True
        if self.outputs.broken is not None:
            self.abort(consumer, self.outputs.broken)
            return True
        core, maps = self.core, self.maps
        core.collect_progress(self.clock())
        if maps.enabled:
            core.refresh_offset_maps()
        commits = core.commit_points(None, with_maps=maps.enabled)
        produced = self.outputs.in_transaction
        if not commits and not produced:
            self.state = "open"
            lock.reopen()  # nothing to commit: the open transaction stays open
            return True
        offsets = [
            TopicPartition(t, p, offset, metadata=metadata)
            if maps.in_metadata and metadata
            else TopicPartition(t, p, offset)
            for (t, p), offset, metadata in commits
        ]
        producer = self.outputs.producer
        started = self.monotonic()
        self.state = "committing"
        try:
            # Every output's delivery reported first, while the workers wait (the reports are
            # served here, where nothing competes for the interpreter): a failed delivery
            # aborts the transaction before its offsets are sent.
            with kafka_errors():
                producer.flush(TIMEOUT)
                if self.outputs.broken is None:
                    if offsets:
                        producer.send_offsets_to_transaction(
                            offsets, consumer.consumer_group_metadata(), TIMEOUT
                        )
                    producer.commit_transaction(TIMEOUT)
        except SystemError as exc:  # (no Kafka error behind it: see kafka_errors)
            self._failed_unexplained(exc)
        except KafkaException as exc:
            if kind_of(exc) == "fenced":
                self._dies(exc)
            # Whether the broker applied what failed is unknown, and requests still in
            # flight may land after an abort: this producer begins no other transaction. A
            # new producer's initialisation fences them (a new epoch) and resolves the
            # transaction before the committed offsets are read again.
            self._abort_by_renewal(consumer, f"the commit failed: {error_text(exc)}")
            return True
        if self.outputs.broken is not None:
            self.abort(consumer, self.outputs.broken)
            return True
        seconds = self.monotonic() - started
        self.committed += 1
        self.seconds += seconds
        self.last_seconds = seconds
        self.last_outputs = produced
        self.outputs_committed += produced
        core.commits_sent(commits)
        maps.store(commits)
        self.outputs.tracing = False  # (no delivery failed in it)
        self.state = "between"
        self._advance(consumer, TIMEOUT)
        self._acknowledged(offsets)
        return True

    def abort(self, consumer: Consumer, why: str) -> None:
        """Abort the open transaction and process everything after the last committed
        offsets again (its outputs are never visible to ``read_committed`` readers). When
        aborting fails, the producer is replaced instead: the new one's initialisation
        aborts the transaction and fences the old producer."""
        if self.state == "dead":
            return
        self._aborting(why)
        if (self.open or self.state == "committing") and self._fate_unknown():
            # A produce request that timed out (or is still unanswered) may land after an
            # abort: Kafka fences it by the epoch the abort bumps, but a broker that does not
            # (noida-db 0.2) commits it with the producer's next transaction there. A new
            # producer's initialisation aborts the transaction instead, and this producer
            # writes nothing more.
            self._renew(f"{why}: outputs of the aborted transaction may still be in flight")
            self.rewind_due = True
            self._advance(consumer, TIMEOUT)
            return
        if self.open or self.state == "committing":
            try:
                with kafka_errors():
                    self.outputs.producer.abort_transaction(TIMEOUT)
            except KafkaException as exc:
                if kind_of(exc) == "fenced":
                    self._dies(exc)
                why = error_text(exc)
                log.warning("aborting the transaction: %s (replacing the producer)", why)
                self._renew(f"the abort failed: {why}")
                self.rewind_due = True
                self._advance(consumer, TIMEOUT)
                return
        if self.state == "renewing":  # the old producer's last transaction is unresolved
            self.rewind_due = True
        else:
            self.state = "between"
            self.rewind(consumer)
        self._advance(consumer, TIMEOUT)

    def _fate_unknown(self) -> bool:
        """Whether outputs of the open transaction may have reached the broker unacknowledged:
        a delivery failed (a timeout leaves its request's fate unknown), or some are not
        reported yet."""
        outputs = self.outputs
        if outputs.broken is not None and outputs.in_transaction:
            return True
        return outputs.opened and len(outputs.producer) > 0

    def _abort_by_renewal(self, consumer: Consumer, why: str) -> None:
        self._aborting(why)
        self._renew(why)
        self.rewind_due = True
        self._advance(consumer, TIMEOUT)

    def _aborting(self, why: str) -> None:
        self.aborted += 1
        self.last_abort = why
        log.warning(
            "transaction aborted (%s): the assigned partitions go back to their committed "
            "offsets and their records are processed again",
            why,
        )

    def _renew(self, why: str) -> None:
        """Let the producer go; a new one is initialised before the next transaction."""
        log.info("replacing the transactional producer (%s)", why)
        self.state = "renewing"
        self.init_calls = 0
        self.outputs.renew()

    def _failed_unexplained(self, exc: SystemError) -> NoReturn:
        """Closing the transaction failed and confluent-kafka lost why (it can, when a fatal
        error meets callbacks still due). A producer failed for good answers any
        transactional call with its fatal error at once: an abort tells whether it was
        fenced, and aborts the transaction otherwise. Either way the consumer stops with
        ``TransactionError``, never renewing the producer on a failure it cannot explain
        (that would fence whoever took the ``transactional.id`` over)."""
        try:
            with kafka_errors():
                self.outputs.producer.abort_transaction(TIMEOUT)
            outcome = "the transaction was aborted"
        except KafkaException as probe:
            if kind_of(probe) == "fenced":
                self._dies(probe)
            outcome = f"aborting it failed too: {error_text(probe)}"
        except SystemError as probe:
            outcome = f"aborting it failed too: {probe}"
        self.state = "dead"
        self.pending = False
        raise TransactionError(
            f"closing the transaction failed without an error from the client ({exc}); {outcome}"
        ) from exc

    def _dies(self, exc: KafkaException) -> None:
        """Fenced: no further transactional call, ever (see the module's docstring)."""
        self.state = "dead"
        self.pending = False
        raise TransactionError(
            f"the transactional producer was fenced: {error_text(exc)}{FENCED_HINT}"
        ) from None

    def failed(self, exc: KafkaException) -> None:
        """A fatal error reported outside a transactional call (the producer's poll):
        fenced, the consumer stops; otherwise a new producer takes the place of the
        unusable one, and its initialisation aborts the old one's open transaction."""
        kind = kind_of(exc)
        if kind == "fenced":
            self._dies(exc)
        if kind != "fatal" or self.state == "dead":
            log.warning("the transactional producer reported: %s", error_text(exc))
            return
        log.warning("the transactional producer failed (%s): replacing it", error_text(exc))
        if self.open or self.state == "committing":
            self._aborting(f"the producer failed: {error_text(exc)}")
            self.rewind_due = True
        self._renew(error_text(exc))

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """(Offsets are committed in transactions: the consumer commits nothing itself.)"""

    def close(self) -> None:
        """Abort a transaction left open with outputs in it (after the last commit), so
        ``read_committed`` readers are not held until it times out. (Dead: nothing.)"""
        if self.open and self.outputs.in_transaction:
            try:
                with kafka_errors():
                    self.outputs.producer.abort_transaction(5.0)
            except KafkaException as exc:
                log.warning("aborting the last transaction: %s", error_text(exc))
        if self.state != "dead":
            self.state = "between"
