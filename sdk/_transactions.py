"""Exactly-once commits: bulk transactions of outputs and the offsets of their inputs.

With ``CommitMode.TRANSACTIONAL`` one transactional producer writes every handler output and
dead-letter copy. Every ``commit_interval`` the consumer's thread closes the open transaction:
it asks workers to wait before starting another item, waits (without blocking its loop) until
no item holds the transaction lock, applies the results those items reported, then sends the
offsets (and offset maps) of the inputs that are done with the consumer's group metadata and
commits; then it opens the next transaction and lets the workers go on. So every output in a
transaction belongs to an input whose offset is in the same transaction, and outputs produced
while a commit is in progress wait for the next transaction.

When a transaction cannot commit (a failed delivery, an abortable error, a rebalance that
cannot wait for the records in flight), it is aborted: its outputs never become visible to
``read_committed`` readers, and every assigned partition goes back to its last committed
offset to be processed again. A fatal error (the producer fenced by a newer process with the
same ``transactional.id``) stops the consumer.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from sdk._commits import Committer
from sdk._core import TP, WorkCore
from sdk._loop import EngineError
from sdk._maps import OffsetMaps
from sdk._output import Outputs

log = logging.getLogger("sdk")

TIMEOUT = 30.0
"""Seconds a transaction call (init, send offsets, commit, abort) may take."""
_UNNAMED = itertools.count(1)
_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


class TransactionError(EngineError):
    """The transactional producer failed for good (fenced, or unusable)."""


def transactional_id(group: str, config: Mapping[str, Any]) -> str:
    """The ``transactional.id`` used when none is given: stable for the same group and the
    same ``group.instance.id`` (or else ``client.id``), so a restarted process fences its
    predecessor and aborts its open transaction at once. Without either, the host name, the
    process id and a count of such consumers are used (a restart then waits for
    ``transaction.timeout.ms``)."""
    member = config.get("group.instance.id") or config.get("client.id")
    if not member:  # (one more per consumer: two members in one process must not fence)
        member = f"{socket.gethostname()}-{os.getpid()}-{next(_UNNAMED)}"
        log.warning(
            "exactly-once without group.instance.id or client.id: transactional.id %s.%s is not "
            "stable across restarts, so a crashed process's open transaction holds "
            "read_committed readers until transaction.timeout.ms; set group.instance.id",
            group,
            member,
        )
    return f"{group}.{member}"


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
        self.open = False
        self.renew = False  # the producer was replaced: initialise before the next begin
        self.pending = False  # a close was asked for and waits for items in flight
        self.committed = 0
        self.aborted = 0
        self.seconds = 0.0  # spent closing transactions (sending offsets and committing)
        self.last_seconds = 0.0
        self.last_outputs = 0
        self.outputs_committed = 0
        self.last_abort: str | None = None

    @property
    def holding_back(self) -> bool:
        return not self.open  # an item started now would wait for the next transaction

    def release(self) -> None:
        """Inside a revocation, which waits for the records in flight: a close waiting for
        items lets the workers it holds back go on (records of revoked partitions do not
        start), and closes with the revocation's own commit."""
        if self.pending and self.open:
            self.pending = False
            assert self.lock is not None
            self.lock.reopen()

    def lost(self, consumer: Consumer) -> None:
        """Outputs in the open transaction may belong to inputs of the lost partitions,
        whose offsets can no longer be committed: abort it (the partitions still assigned
        go back to their committed offsets)."""
        if self.open and (self.outputs.in_transaction or self.outputs.broken):
            self.abort(consumer, "partitions were lost with outputs in the open transaction")

    def begin(self) -> None:
        """Initialise the producer (fencing and aborting a predecessor's open transaction)
        and open the first transaction."""
        producer = self.outputs.producer
        try:
            producer.init_transactions(TIMEOUT)
        except KafkaException as exc:
            raise TransactionError(f"could not initialise transactions: {_text(exc)}") from None
        self._open_next()

    def _open_next(self) -> None:
        if self.renew:  # a new producer: initialise it first
            self.renew = False
            try:
                self.outputs.producer.init_transactions(TIMEOUT)
            except KafkaException as exc:
                raise TransactionError(f"could not initialise transactions: {_text(exc)}") from None
        try:
            self.outputs.producer.begin_transaction()
        except KafkaException as exc:
            raise TransactionError(f"could not begin a transaction: {_text(exc)}") from None
        self.open = True
        self.outputs.in_transaction = 0
        self.outputs.broken = None
        assert self.lock is not None
        self.lock.reopen()

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
        is ignored: a transaction commits every partition's offsets."""
        lock = self.lock
        assert lock is not None
        if not lock.close():
            if not sync:
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
        self.settle(0.0)  # the results of the items that left the lock
        if not self.open:  # aborted while items were in flight: they are gone now
            self._open_next()
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
        try:
            if offsets:
                producer.send_offsets_to_transaction(
                    offsets, consumer.consumer_group_metadata(), TIMEOUT
                )
            producer.commit_transaction(TIMEOUT)
        except KafkaException as exc:
            self._failed(exc)
            # Whether the broker applied what timed out is unknown, and requests still in
            # flight may land after an abort: a new producer's initialisation fences them
            # (a new epoch) and aborts the transaction before the committed offsets are read.
            self.abort(consumer, f"the commit failed: {_text(exc)}", renew=True)
            return True
        seconds = self.monotonic() - started
        self.committed += 1
        self.seconds += seconds
        self.last_seconds = seconds
        self.last_outputs = produced
        self.outputs_committed += produced
        core.commits_sent(commits)
        maps.store(commits)
        self.open = False
        self._open_next()
        self._acknowledged(offsets)
        return True

    def abort(self, consumer: Consumer, why: str, renew: bool = False) -> None:
        """Abort the open transaction and process everything after the last committed
        offsets again (its outputs are never visible to ``read_committed`` readers). With
        ``renew`` (or when aborting fails) the producer is replaced instead, and the new one
        initialised at once: that aborts the transaction and fences the old producer."""
        self.aborted += 1
        self.last_abort = why
        log.warning(
            "transaction aborted (%s): the assigned partitions go back to their committed "
            "offsets and their records are processed again",
            why,
        )
        if self.open and not renew and not self.renew:
            try:
                self.outputs.producer.abort_transaction(TIMEOUT)
            except KafkaException as exc:
                self._failed(exc)
                log.warning("aborting the transaction: %s (replacing the producer)", _text(exc))
                renew = True
        self.open = False
        if renew and not self.renew:
            self.renew = True
            self.outputs.renew()
        if self.renew:
            self.renew = False
            try:
                self.outputs.producer.init_transactions(TIMEOUT)
            except KafkaException as exc:
                self._failed(exc)
                raise TransactionError(f"could not initialise transactions: {_text(exc)}") from None
        self.rewind(consumer)
        assert self.lock is not None
        if self.lock.close():
            self._open_next()
        else:  # items in flight would produce into the next one: it opens once they are gone
            self.pending = True

    def _failed(self, exc: KafkaException) -> None:
        """A fatal error: fenced by another process (it stops the consumer), or the producer
        is unusable otherwise (a sequence out of step after the broker stalled): a new one
        takes its place, and its initialisation aborts the old one's open transaction."""
        error = exc.args[0] if exc.args else None
        if not isinstance(error, KafkaError) or not error.fatal():
            return
        if error.code() in _FENCED:
            raise TransactionError(
                f"the transactional producer was fenced: {error.str()} (another process with "
                "the same transactional.id, or group.instance.id, has taken over)"
            ) from None
        log.warning("the transactional producer failed (%s): replacing it", error.str())
        self.open = False
        self.renew = True
        self.outputs.renew()

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """(Offsets are committed in transactions: the consumer commits nothing itself.)"""

    def close(self) -> None:
        """Abort a transaction left open with outputs in it (after the last commit), so
        ``read_committed`` readers are not held until it times out."""
        if self.open and self.outputs.in_transaction:
            try:
                self.outputs.producer.abort_transaction(5.0)
            except KafkaException as exc:
                log.warning("aborting the last transaction: %s", _text(exc))
        self.open = False


def _text(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)
