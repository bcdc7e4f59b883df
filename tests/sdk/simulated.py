"""Simulated clients for driving the real consumer shell step by step.

``SimConsumer`` behaves as librdkafka's consumer does where the engine depends on it:

* rebalance callbacks run inside ``poll()``/``consume()``; eager rebalances revoke everything
  then assign, cooperative ones revoke and assign subsets, lost partitions get ``on_lost``;
  after a callback the assignment changes as confluent-kafka applies it;
* an assigned partition is fetched from its committed offset (or the start of its log);
* an application's **pause survives a re-assignment** (the flag lives on the partition, not
  on the assignment), and a paused partition returns nothing until resumed, which then
  fetches from the position consumption reached;
* commits may fail (raised for synchronous ones, reported to ``on_commit`` in a later poll
  for asynchronous ones); ``committed()`` returns offsets with their metadata;
* a log may hold control records (transaction markers): never returned, but fetching moves
  past them; ``position()`` is the offset after what was returned (and the markers after
  it), and none after a ``seek()`` until the partition is fetched again.

The clock, the inbox (a wait on it moves the clock instead of sleeping), the dead-letter
producer and the runner (work items wait until the test reports their results) are
simulated too, so every interleaving is reproducible.

Handler outputs go through the engine's own code: a ``SimWorker`` runs an item record by
record as ``Work.run`` does, producing what a handler returns with ``Work.emit`` (the engine's
``Outputs``) and applying delivery reports with ``Work.acknowledged``. ``SimOutputProducer``
stands for librdkafka's producer of outputs: delivery reports arrive only when the test
delivers them (a flush of less than a second waits for none; only failed ones call back, as
``delivery.report.only.error`` has confluent-kafka do), and transactions follow
librdkafka's rules: ``commit_transaction`` flushes first and fails (abortable) when a delivery
of the transaction failed, ``abort_transaction`` purges what is in flight, a producer fenced by
a newer one with its ``transactional.id`` fails for good. ``Transactions`` is the broker's
side: what was written, and which transactional records a ``read_committed`` reader sees
(only those of committed transactions).
"""

from __future__ import annotations

import logging
import queue
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from gate.evaluate._watermark import Snapshot
from sdk import Gate, Options, ParallelConsumer
from sdk.consumer._batches import Batches
from sdk.consumer._maps import OffsetMaps
from sdk.consumer._runners import Work
from sdk.consumer._transactions import TransactionalCommitter
from sdk.engine._core import NOT_STARTED
from sdk.engine._failures import FailurePolicy
from sdk.engine._record import Record
from sdk.engine._shards import Entry, Item
from sdk.gating._view import SourceState
from sdk.produce._deliveries import Awaiting
from sdk.produce._producer import Outputs

TP = tuple[str, int]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class SimInbox(queue.SimpleQueue):  # type: ignore[type-arg]
    """The engine's inbox; waiting on it moves the simulated clock instead of sleeping."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        try:
            return super().get_nowait()
        except queue.Empty:
            if block and timeout:
                self.clock.advance(timeout)
            raise


@dataclass
class SimMessage:
    tp: TP
    offset_: int
    key_: bytes | None
    stamp_ms: int
    headers_: list[tuple[str, bytes]] = field(default_factory=list)
    control: bool = False  # a transaction marker: in the log, never returned

    def topic(self) -> str:
        return self.tp[0]

    def partition(self) -> int:
        return self.tp[1]

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes:
        return f"{self.tp[1]}:{self.offset_}".encode()

    def headers(self) -> list[tuple[str, bytes]]:
        return list(self.headers_)

    def timestamp(self) -> tuple[int, int]:
        return (1, self.stamp_ms)

    def error(self) -> None:
        return None


class SimFailure:
    """An error event ``consume()`` hands over in place of a record (librdkafka's fatal
    errors reach the consumer so)."""

    def __init__(self, error: KafkaError) -> None:
        self.error_ = error

    def error(self) -> KafkaError:
        return self.error_

    def topic(self) -> None:
        return None

    def partition(self) -> int:
        return -1

    def offset(self) -> int:
        return -1001


class Cluster:
    """What the broker holds: each partition's log and the group's commits."""

    def __init__(self, topic: str, partitions: int, clock: Clock, keeps_metadata: bool) -> None:
        self.topic = topic
        self.clock = clock
        self.keeps_metadata = keeps_metadata
        self.logs: dict[TP, list[SimMessage]] = {(topic, p): [] for p in range(partitions)}
        self.next_offset: dict[TP, int] = dict.fromkeys(self.logs, 0)
        self.commits: dict[TP, tuple[int, str]] = {}
        self.commit_history: list[tuple[TP, int, str]] = []
        self.commit_visible: list[int] = []  # per commit: outputs visible when it was made
        self.dead_letters: list[SimMessage] = []
        self.fetch_run = 1  # records of one partition handed over in a row by a fetch
        self.generation = 0  # the group's generation: every rebalance moves it on
        self.transactions = Transactions(self)

    def produce(
        self, partition: int, keys: Iterable[bytes | None], gap: int = 0, marker: bool = False
    ) -> None:
        """Append records (after ``gap`` offsets no record has), then a transaction marker
        with ``marker``."""
        tp = (self.topic, partition)
        offset = self.next_offset[tp] + gap  # offsets need not be contiguous
        stamp = int(self.clock.now * 1000)
        for key in keys:
            self.logs[tp].append(SimMessage(tp, offset, key, stamp))
            offset += 1
        if marker:
            self.logs[tp].append(SimMessage(tp, offset, None, stamp, control=True))
            offset += 1
        self.next_offset[tp] = offset

    def record_commit(self, tp: TP, offset: int, metadata: str) -> None:
        """The group committed ``offset``: kept with how many records a ``read_committed``
        reader of the outputs could see by then."""
        self.commits[tp] = (offset, metadata)
        self.commit_history.append((tp, offset, metadata))
        self.commit_visible.append(len(self.transactions.visible))

    def records(self, tp: TP) -> list[SimMessage]:
        """The records of a partition (its control records left out)."""
        return [m for m in self.logs[tp] if not m.control]

    def end(self, tp: TP) -> int:
        return self.next_offset[tp]


def _error(code: int, text: str, **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, text, **flags))


@dataclass
class Written:
    """A record a producer wrote: a handler's output, or a dead-letter copy."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    txn: int | None = None  # the transaction it was written in (None: outside any)


class Delivered:
    """What a delivery report hands its callback: the record written, as confluent-kafka's
    ``Message`` tells it."""

    def __init__(self, written: Written) -> None:
        self.written = written

    def topic(self) -> str:
        return self.written.topic

    def partition(self) -> int:
        return self.written.partition

    def key(self) -> bytes | None:
        return self.written.key

    def value(self) -> bytes | None:
        return self.written.value

    def headers(self) -> list[tuple[str, bytes]]:
        return list(self.written.headers)


class Transactions:
    """The broker's side of what producers write: the transaction coordinator (an epoch per
    ``transactional.id``, and its open transaction) and the records a ``read_committed``
    reader sees (``visible``: records written outside transactions, and the records of
    committed transactions, in the order they became visible). A transaction's offsets are
    committed with it; its dead-letter copies join ``Cluster.dead_letters`` then."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.visible: list[Written] = []
        self.states: dict[int, str] = {}  # open, committed or aborted
        self.written: dict[int, list[Written]] = {}  # the records of open transactions
        # What open transactions held when a newer producer with their transactional.id
        # aborted them: their own producer, fenced, goes on believing them open until it
        # learns of it.
        self.fenced_away: dict[int, list[Written]] = {}
        self.epochs: dict[str, int] = {}
        self.open: dict[str, int] = {}
        self.dead_letter_topic: str | None = None
        self.down: set[str] = set()  # topics whose records fail when a flush delivers them
        self.on_commit: Callable[[], None] | None = None  # (a check after each commit)
        # Failures waiting for the next transactional call of a kind, by whichever producer
        # makes it (a broker outage does not care which): call -> (kind, times).
        self.failures: dict[str, tuple[str, int]] = {}

    def write(self, record: Written) -> None:
        """The broker acknowledged a record (of an aborted transaction: never seen)."""
        if record.txn is None:
            self.visible.append(record)
        elif self.states[record.txn] == "open":
            self.written[record.txn].append(record)

    def init(self, transactional_id: str) -> int:
        """A producer initialises ``transactional_id``: it gets a newer epoch (fencing every
        older producer with the id) and the id's open transaction is aborted."""
        epoch = self.epochs.get(transactional_id, 0) + 1
        self.epochs[transactional_id] = epoch
        txn = self.open.get(transactional_id)
        if txn is not None:
            self.fenced_away[txn] = list(self.written[txn])
            self.end(transactional_id, txn, commit=False)
        return epoch

    def fence(self, transactional_id: str) -> None:
        """Another process with the same ``transactional.id`` initialises it."""
        self.init(transactional_id)

    def begin(self, transactional_id: str) -> int:
        txn = len(self.states) + 1
        self.states[txn] = "open"
        self.written[txn] = []
        self.open[transactional_id] = txn
        return txn

    def end(
        self,
        transactional_id: str,
        txn: int,
        commit: bool,
        offsets: list[TopicPartition] | None = None,
    ) -> None:
        assert self.states[txn] == "open", f"transaction {txn} is {self.states[txn]}"
        self.states[txn] = "committed" if commit else "aborted"
        del self.open[transactional_id]
        written = self.written.pop(txn)
        if not commit:
            return
        cluster = self.cluster
        self.visible.extend(written)
        for record in written:
            if record.topic == self.dead_letter_topic:
                copy = SimMessage(
                    (record.topic, record.partition),
                    len(cluster.dead_letters),
                    record.key,
                    0,
                    record.headers,
                )
                cluster.dead_letters.append(copy)
        for tp in offsets or []:
            key = (tp.topic, tp.partition)
            metadata = (tp.metadata or "") if cluster.keeps_metadata else ""
            cluster.record_commit(key, tp.offset, metadata)
        if self.on_commit is not None:
            self.on_commit()

    def committed_count(self) -> int:
        return sum(1 for state in self.states.values() if state == "committed")

    def aborted_count(self) -> int:
        return sum(1 for state in self.states.values() if state == "aborted")


@dataclass(frozen=True)
class SimGroupMetadata:
    """What ``consumer_group_metadata()`` returns: the generation the consumer is in."""

    generation: int


def _abortable(code: int, text: str) -> KafkaException:
    return _error(code, text, txn_requires_abort=True)


class SimConsumer:
    def __init__(self, cluster: Cluster, config: dict[str, Any]) -> None:
        self.cluster = cluster
        self.on_commit: Callable[..., None] | None = config.get("on_commit")
        self.callbacks: dict[str, Callable[..., None]] = {}
        self.assignment: set[TP] = set()
        self.fetch_position: dict[TP, int] = {}  # where fetching goes on
        self.app_position: dict[TP, int] = {}  # what position() reports (none after a seek)
        self.paused: set[TP] = set()  # the application's pause: survives re-assignment
        self.events: deque[tuple[str, list[TP]]] = deque()  # rebalances to serve
        self.commit_reports: deque[tuple[KafkaError | None, list[TopicPartition]]] = deque()
        self.fail_commits = 0  # the next N commit requests fail
        self.closed = False
        self.served_rebalances = 0
        self.failures: list[SimFailure] = []  # handed over by the next consume()

    # ---- group membership ---------------------------------------------------------------

    def subscribe(self, topics: list[str], **callbacks: Callable[..., None]) -> None:
        self.callbacks = callbacks

    def rebalance(self, kind: str, tps: Iterable[TP]) -> None:
        """Queue a rebalance event: ``assign``, ``revoke`` or ``lost``."""
        self.events.append((kind, sorted(tps)))

    def _serve(self) -> None:
        while self.events:
            kind, tps = self.events.popleft()
            if kind == "assign":
                tps = [tp for tp in tps if tp not in self.assignment]
            else:
                tps = [tp for tp in tps if tp in self.assignment]
            if not tps:
                continue
            self.served_rebalances += 1
            partitions = [TopicPartition(t, p) for t, p in tps]
            if kind != "revoke":  # (a revocation is served in the generation it ends)
                self.cluster.generation += 1
            self.callbacks[f"on_{kind}"](self, partitions)
            if kind == "revoke":
                self.cluster.generation += 1
            if kind == "assign":
                for tp in tps:
                    self.assignment.add(tp)
                    committed = self.cluster.commits.get(tp)
                    self.fetch_position[tp] = committed[0] if committed else 0
                    self.app_position.pop(tp, None)
            else:
                self.assignment.difference_update(tps)
        while self.commit_reports:
            error, partitions = self.commit_reports.popleft()
            if self.on_commit is not None:
                self.on_commit(error, partitions)

    # ---- fetching -----------------------------------------------------------------------

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        assert not self.closed
        self._serve()
        messages: list[Any] = self.failures
        self.failures = []
        progress = True
        while len(messages) < num_messages and progress:
            progress = False
            for tp in sorted(self.assignment - self.paused):
                log = self.cluster.logs[tp]
                position = self.fetch_position[tp]
                following = [m for m in log if m.offset_ >= position]
                room = min(num_messages - len(messages), self.cluster.fetch_run)
                taken = 0
                for message in following:
                    if taken >= room:
                        break
                    if not message.control:
                        messages.append(message)
                        taken += 1
                    self.fetch_position[tp] = self.app_position[tp] = message.offset_ + 1
                progress = progress or taken > 0
        return messages

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(
                tp.topic, tp.partition, self.app_position.get((tp.topic, tp.partition), -1001)
            )
            for tp in partitions
        ]

    def poll(self, timeout: float = -1) -> Any:
        found = self.consume(1, timeout)
        return found[0] if found else None

    def seek(self, partition: TopicPartition) -> None:
        tp = (partition.topic, partition.partition)
        if tp not in self.assignment:
            raise _error(KafkaError._STATE, "seek on an unassigned partition")
        self.fetch_position[tp] = partition.offset
        self.app_position.pop(tp, None)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused.update((tp.topic, tp.partition) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused.difference_update((tp.topic, tp.partition) for tp in partitions)

    # ---- commits ------------------------------------------------------------------------

    def commit(
        self, offsets: list[TopicPartition] | None = None, asynchronous: bool = True
    ) -> None:
        assert offsets
        if self.fail_commits:
            self.fail_commits -= 1
            if not asynchronous:
                raise _error(KafkaError.REQUEST_TIMED_OUT, "commit timed out")
            self.commit_reports.append(
                (KafkaError(KafkaError.REQUEST_TIMED_OUT, "commit timed out"), offsets)
            )
            return
        for tp in offsets:
            key = (tp.topic, tp.partition)
            metadata = (tp.metadata or "") if self.cluster.keeps_metadata else ""
            self.cluster.record_commit(key, tp.offset, metadata)
        if asynchronous:
            reported = [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in offsets]
            self.commit_reports.append((None, reported))

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[Any]:
        found = []
        for tp in partitions:
            offset, metadata = self.cluster.commits.get((tp.topic, tp.partition), (-1001, ""))
            if metadata:
                found.append(TopicPartition(tp.topic, tp.partition, offset, metadata=metadata))
            else:
                found.append(TopicPartition(tp.topic, tp.partition, offset))
        return found

    def consumer_group_metadata(self) -> SimGroupMetadata:
        return SimGroupMetadata(self.cluster.generation)

    def close(self) -> None:
        if self.assignment:
            self.callbacks["on_revoke"](self, [TopicPartition(t, p) for t, p in self.assignment])
            self.assignment.clear()
        self.closed = True


class SimProducer:
    """The dead-letter producer: copies are acknowledged (or refused) when polled."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.pending: list[tuple[SimMessage, Callable[..., None]]] = []
        self.broken = False

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
        on_delivery: Callable[..., None] | None = None,
    ) -> None:
        assert on_delivery is not None
        message = SimMessage((topic, 0), len(self.cluster.dead_letters), key, 0, headers or [])
        self.pending.append((message, on_delivery))

    def poll(self, timeout: float = 0) -> int:
        pending, self.pending = self.pending, []
        for message, delivered in pending:
            if self.broken:
                delivered(KafkaError(KafkaError._MSG_TIMED_OUT, "broker down"), message)
            else:
                self.cluster.dead_letters.append(message)
                delivered(None, message)
        return len(pending)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0


OUTPUT_PARTITIONS = 2
"""Partitions of every output topic (producing to another one fails at once)."""


FAILURES = {
    "init": ["retriable", "retriable_applied", "fatal"],
    "begin": ["fatal"],
    "send_offsets": ["abortable", "retriable", "fatal"],
    "commit": ["abortable", "retriable", "applied", "fatal", "fenced_in_flight"],
    "abort": ["retriable", "retriable_applied", "fatal"],
}
"""The failures a test may inject at each transactional call, by librdkafka's error classes
(see :class:`SimOutputProducer`)."""


class SimOutputProducer:
    """The engine's producer of outputs (and, in transactional mode, of dead-letter copies),
    as librdkafka's behaves where the engine depends on it.

    ``produce()`` refuses a record at once for an unknown partition, outside a transaction
    (transactional: before ``init_transactions`` too), and once it knows it is fenced or
    failed fatally; otherwise the record waits for its delivery report, which arrives only
    when the test calls :meth:`deliver` (or a flush, a commit or an abort serves it). A
    transactional producer: ``commit_transaction`` flushes first and fails with an abortable
    error when a delivery of the transaction failed; ``abort_transaction`` purges what waits
    (reported as failed). Once a newer producer initialised the same ``transactional.id``,
    the producer learns it at its next exchange with the broker (a delivery fails, or a
    transactional call): from then on every call fails with a fatal error.

    A delivery of a transaction that times out leaves its request's fate unknown: it may
    still reach the broker after the transaction ended. As noida-db 0.2 was seen to, the
    record then lands in the next transaction this producer begins, and is committed with it
    (Kafka fences it by the epoch an abort bumps); a new producer, initialised with the same
    ``transactional.id``, never carries it. ``len()`` counts the records waiting for their
    reports, as confluent-kafka's does.

    :meth:`fail` injects a failure into the next call of a kind (by this producer, or a
    producer made after it), ``times`` times in a row
    (:data:`FAILURES`): ``abortable`` (``INVALID_PRODUCER_ID_MAPPING``, as when the broker
    forgot the producer id); ``retriable`` (a timeout: the call may be made again, and resumes
    where it stopped; a retriable ``commit`` leaves the transaction committing, librdkafka's
    ``BeginCommit`` state, where only ``commit_transaction`` is allowed); ``..._applied`` (the
    broker did it but its answer was lost: the call times out); ``applied`` (the broker
    committed, its answer lost: abortable ``_TIMED_OUT``); ``fatal`` (the producer is unusable
    for good, every later call fails with the same error); ``fenced_in_flight`` (another
    producer took the ``transactional.id`` over while the commit had messages in flight: the
    commit fails fenced, and librdkafka answers the next transactional call with a non-fatal
    ``_CONFLICT``)."""

    def __init__(self, cluster: Cluster, config: dict[str, Any]) -> None:
        self.cluster = cluster
        self.transactions = cluster.transactions
        self.transactional_id: str | None = config.get("transactional.id")
        self.epoch = 0
        # uninit, ready, in_transaction, begin_commit, abortable
        self.state = "uninit" if self.transactional_id is not None else "ready"
        self.txn: int | None = None
        self.pending: list[tuple[Written, Callable[..., None]]] = []
        self.failed_deliveries = 0  # of the open transaction
        # Records of the open transaction whose delivery failed: the engine counts them as
        # written until the transaction ends (the failure aborts it).
        self.failed_in_transaction: list[Written] = []
        self.offsets: list[TopicPartition] = []
        self.fatal: KafkaError | None = None
        self.conflict_next = False
        self.knows_fenced = False
        self.calls: list[str] = []
        self.connected = False
        self.late: list[Written] = []  # timed out in a transaction: may land in the next one
        # confluent-kafka calls back for failed deliveries only (it serves the others quietly)
        self.only_error = bool(config.get("delivery.report.only.error"))

    def __len__(self) -> int:
        return len(self.pending)

    def fail(self, call: str, kind: str, times: int = 1) -> None:
        """The next ``times`` calls of ``call`` (by this producer or one after it) fail."""
        assert kind in FAILURES[call], (call, kind)
        self.transactions.failures[call] = (kind, times)

    def _failure(self, call: str) -> str | None:
        failures = self.transactions.failures
        kind, times = failures.get(call, (None, 0))
        if kind is None:
            return None
        if times <= 1:
            del failures[call]
        else:
            failures[call] = (kind, times - 1)
        return kind

    @property
    def fenced(self) -> bool:
        tid = self.transactional_id
        return tid is not None and self.transactions.epochs.get(tid, 0) != self.epoch

    def _check(self, call: str, *states: str) -> None:
        self.calls.append(call)
        if self.conflict_next:
            raise _error(KafkaError._CONFLICT, f"{call}: a conflicting call is in progress")
        if self.fatal is not None:
            raise KafkaException(self.fatal)
        if self.fenced:
            self.knows_fenced = True
            raise _error(
                KafkaError._FENCED,
                "the producer was fenced by a newer one with its transactional.id",
                fatal=True,
            )
        if self.state == "abortable" and "abortable" not in states:
            raise _abortable(KafkaError._STATE, f"{call}: the transaction must be aborted")
        if states and self.state not in states:
            raise _error(KafkaError._STATE, f"{call}: not allowed in state {self.state}")

    def _fatal(self, call: str) -> KafkaException:
        self.fatal = KafkaError(
            KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, f"{call}: the producer failed", fatal=True
        )
        return KafkaException(self.fatal)

    # ---- producing ----------------------------------------------------------------------

    def produce(  # (confluent-kafka's order of arguments)
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int = -1,
        on_delivery: Callable[..., None] | None = None,
        timestamp: int = 0,
        headers: list[tuple[str, Any]] | None = None,
    ) -> None:
        assert on_delivery is not None
        if self.transactional_id is not None:
            if self.knows_fenced or self.fatal is not None:
                raise _error(KafkaError._FATAL, "fatal error: the producer failed", fatal=True)
            if self.state in ("ready", "uninit"):
                raise _error(KafkaError._STATE, "no transaction in progress")
        if isinstance(key, str):
            key = key.encode()
        if isinstance(value, str):
            value = value.encode()
        if partition < 0:
            partition = zlib.crc32(key or b"") % OUTPUT_PARTITIONS
        elif partition >= OUTPUT_PARTITIONS:
            raise _error(KafkaError._UNKNOWN_PARTITION, f"{topic} [{partition}]: unknown partition")
        pairs = [(name, v.encode() if isinstance(v, str) else v) for name, v in headers or []]
        self.pending.append((Written(topic, partition, key, value, pairs, self.txn), on_delivery))

    def deliver(self, outcomes: Iterable[bool], error: KafkaError | None = None) -> None:
        """The broker answers the oldest records waiting: acknowledged (True) or failed
        (with ``error``, by default a timeout)."""
        for ok in outcomes:
            written, delivered = self.pending.pop(0)
            self._report(written, delivered, ok, error)

    def _report(
        self,
        written: Written,
        delivered: Callable[..., None],
        ok: bool,
        error: KafkaError | None = None,
    ) -> None:
        if ok and not self.fenced and self.fatal is None:
            self.transactions.write(written)
            if not self.only_error:
                delivered(None, Delivered(written))
            return
        if self.fenced and error is None:
            self.knows_fenced = True
            error = KafkaError(KafkaError.PRODUCER_FENCED, "fenced", fatal=True)
        if written.txn is not None and written.txn == self.txn:
            self.failed_deliveries += 1
            self.failed_in_transaction.append(written)
        error = error or KafkaError(KafkaError._MSG_TIMED_OUT, "delivery timed out")
        if written.txn is not None and error.code() == KafkaError._MSG_TIMED_OUT:
            self.late.append(written)
        delivered(error, Delivered(written))

    def poll(self, timeout: float = 0) -> int:
        return 0  # (reports are served as the test delivers them)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> None:
        self.connected = True  # (the engine connects it when it opens: a metadata request)

    def flush(self, timeout: float = 0) -> int:
        if timeout < 1:  # (a short wait: the broker answers when the test delivers)
            return len(self.pending)
        down = self.transactions.down
        self.deliver([written.topic not in down for written, _ in self.pending])
        return 0

    # ---- transactions -------------------------------------------------------------------

    def init_transactions(self, timeout: float = -1) -> None:
        assert self.transactional_id is not None
        self.calls.append("init")  # (it takes the transactional.id over: never fenced)
        if self.conflict_next:
            raise _error(KafkaError._CONFLICT, "init: a conflicting call is in progress")
        if self.fatal is not None:
            raise KafkaException(self.fatal)
        failure = self._failure("init")
        if failure == "fatal":
            raise self._fatal("init")
        if failure is not None:
            if failure == "retriable_applied":
                self.transactions.init(self.transactional_id)  # (its answer lost)
            raise _error(
                KafkaError._TIMED_OUT, "init timed out: retry call to resume", retriable=True
            )
        self.epoch = self.transactions.init(self.transactional_id)
        self.state = "ready"

    def begin_transaction(self) -> None:
        self._check("begin", "ready")
        if self._failure("begin") == "fatal":
            raise self._fatal("begin")
        assert self.transactional_id is not None
        self.txn = self.transactions.begin(self.transactional_id)
        self.state = "in_transaction"
        for written in self.late:  # requests that timed out land now, in this transaction
            self.transactions.write(replace(written, txn=self.txn))
        self.late = []
        self.failed_deliveries = 0
        self.failed_in_transaction = []
        self.offsets = []

    def send_offsets_to_transaction(
        self, offsets: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None:
        self._check("send_offsets", "in_transaction")
        failure = self._failure("send_offsets")
        if failure == "abortable":
            self.state = "abortable"
            raise _abortable(
                KafkaError.INVALID_PRODUCER_ID_MAPPING,
                "the producer id is not assigned to its transactional id",
            )
        if failure == "retriable":
            raise _error(KafkaError._TIMED_OUT, "send offsets timed out", retriable=True)
        if failure == "fatal":
            raise self._fatal("send_offsets")
        if group_metadata.generation != self.cluster.generation:
            self.state = "abortable"
            raise _abortable(
                KafkaError.ILLEGAL_GENERATION, "the group moved on to a newer generation"
            )
        self.offsets += [
            TopicPartition(tp.topic, tp.partition, tp.offset, metadata=tp.metadata)
            if tp.metadata
            else TopicPartition(tp.topic, tp.partition, tp.offset)
            for tp in offsets
        ]

    def commit_transaction(self, timeout: float = -1) -> None:
        self._check("commit", "in_transaction", "begin_commit")
        failure = self._failure("commit")
        if failure == "retriable":
            self.state = "begin_commit"
            raise _error(
                KafkaError._TIMED_OUT,
                "Failed to flush all outstanding messages within the transaction timeout",
                retriable=True,
            )
        if failure == "fatal":
            raise self._fatal("commit")
        if failure == "fenced_in_flight":
            assert self.transactional_id is not None
            self.transactions.fence(self.transactional_id)  # another producer took it over
            self.knows_fenced = self.conflict_next = True
            raise _error(KafkaError._FENCED, "the producer was fenced", fatal=True)
        self.flush()
        if self.fenced:
            self._check("commit")
        if self.failed_deliveries:
            self.state = "abortable"
            raise _abortable(
                KafkaError._INCONSISTENT,
                f"{self.failed_deliveries} message(s) failed delivery",
            )
        if failure == "abortable":
            self.state = "abortable"
            raise _abortable(
                KafkaError.INVALID_PRODUCER_ID_MAPPING,
                "the producer id is not assigned to its transactional id",
            )
        assert self.transactional_id is not None and self.txn is not None
        self.transactions.end(self.transactional_id, self.txn, commit=True, offsets=self.offsets)
        if failure == "applied":  # the broker committed; its answer was lost
            self.state = "abortable"
            raise _abortable(KafkaError._TIMED_OUT, "EndTxn commit timed out")
        self.state, self.txn, self.offsets = "ready", None, []

    def abort_transaction(self, timeout: float = -1) -> None:
        self._check("abort", "in_transaction", "abortable")
        if self.txn is not None and self.transactions.states[self.txn] == "committed":
            raise _error(KafkaError.INVALID_TXN_STATE, "the transaction was committed", fatal=True)
        failure = self._failure("abort")
        if failure == "fatal":
            raise self._fatal("abort")
        pending, self.pending = self.pending, []
        for written, delivered in pending:
            self._report(written, delivered, False, KafkaError(KafkaError._PURGE_QUEUE, "purged"))
        assert self.transactional_id is not None and self.txn is not None
        if failure == "retriable":
            raise _error(KafkaError._TIMED_OUT, "abort timed out", retriable=True)
        self.transactions.end(self.transactional_id, self.txn, commit=False)
        if failure == "retriable_applied":
            raise _error(KafkaError._TIMED_OUT, "abort timed out", retriable=True)
        self.state, self.txn, self.offsets = "ready", None, []


class SimOutputs(Outputs):
    """The engine's ``Outputs`` without its polling thread: the test serves the reports."""

    @property
    def producer(self) -> Any:
        if self._producer is None:
            self._producer = self._new_producer()
        return self._producer


class SimWorker:
    """A worker running one item step by step, as ``Work.run`` and ``Batches.run`` do,
    with the engine's own ``Work``: outputs are produced by ``Work.emit`` (through the
    engine's ``Outputs``), failed deliveries applied by ``Work.acknowledged``. Handlers are
    given by the test, per record (or batch): ``handler(entries, record_or_records)``
    returns what the handler returns, or raises."""

    def __init__(self, work: Work, item: Item, locked: bool) -> None:
        self.work = work
        self.item = item
        self.locked = locked  # it holds the transaction lock
        self.results: list[Any] = []
        self.stopped: set[object] = set()
        self.failed = False
        self.deliveries = work.deliveries()
        self.ended = False  # it reached the end of its item (it may wait for reports)
        self.batch: tuple[list[Record], list[int]] | None = None

    @property
    def awaited(self) -> bool:
        """At least once: records of the item have outputs waiting for acknowledgement."""
        return self.deliveries is not None and self.deliveries.awaited

    @property
    def looked_at(self) -> int:
        return len(self.results)

    def next_entry(self) -> Entry | None:
        entries = self.item.entries
        return entries[len(self.results)] if len(self.results) < len(entries) else None

    def step(self, handler: Callable[[list[Entry], Any], Any]) -> Entry | None:
        """Look at the next record: run it, or report it not started (returns None)."""
        work, item, results = self.work, self.item, self.results
        entry = item.entries[len(results)]
        lock = work.transaction_lock
        # (At least once a worker waits at the producer's pause before a record: here it
        # runs the record when the test says, which may be after the pause ended or not.)
        if (
            (self.stopped and work.stopped(entry, self.stopped))
            or not work.may_start(entry)
            or (lock is not None and lock.closing and results)
        ):
            results.append(NOT_STARTED)
            self.failed = True
            return None
        record = work.record(entry)
        error: BaseException | None = None
        try:
            returned = handler([entry], record)
        except BaseException as exc:
            error = exc
        else:
            if returned is not None:
                error = work.emit(returned, self.deliveries, len(results), record)
            if error is None:
                results.append(None)
                if not self.failed and not self.awaited:
                    item.finished = len(results)
                return entry
        results.append(error)
        self.failed = True
        work.failed(record, error)
        if work.ordered:
            self.stopped.add(work.stop_mark(entry))
        return entry

    def run_batch(self, handler: Callable[[list[Entry], Any], Any]) -> None:
        """Run the whole item as one batch (then each record alone, when the batch's failure
        is final for its records), as ``Batches.run`` does."""
        work, entries = self.work, self.item.entries
        batches = Batches(work)
        results, records, runnable = batches.prepare(entries)
        self.results, self.batch = results, (records, runnable)
        if not records:
            return
        by_record = {id(record): entries[i] for i, record in zip(runnable, records, strict=True)}
        work.handler = lambda given: handler([by_record[id(r)] for r in given], given)
        try:
            error = batches.call(records, self.deliveries)
            if error is not None and batches.isolates(error, records):
                for i, record in zip(runnable, records, strict=True):
                    alone = batches.call([record], self.deliveries)
                    if alone is not None:
                        results[i] = alone
                        work.failed(record, alone)
            elif error is not None:
                batches.failed(results, records, runnable, error)
        finally:
            work.handler = _no_handler

    @property
    def settled(self) -> bool:
        """Whether it may end (always: a worker does not wait for delivery reports, the
        consumer's thread keeps its item aside until they arrived)."""
        return True

    def end(self) -> list[Any]:
        """Its results: with outputs waiting for reports, the engine's ``Awaiting``."""
        if self.deliveries is not None and self.deliveries.awaited:
            work = self.work
            if self.batch is not None:
                records, runnable = self.batch
                settle = Batches(work).settle(records, runnable, self.deliveries)
            else:
                settle = work.settle_records(self.item.entries, self.deliveries)
            return Awaiting(self.results, self.deliveries, settle)
        return self.results


def _no_handler(argument: Any) -> None:
    raise AssertionError("the handler runs only through SimWorker")


class SimRunner:
    """Work items wait here until the test reports their results into the engine's inbox,
    directly (:meth:`report`) or through a :class:`SimWorker` (:meth:`start`)."""

    def __init__(
        self,
        inbox: queue.SimpleQueue,  # type: ignore[type-arg]
        concurrency: int,
        work: Work | None = None,
    ) -> None:
        self.inbox = inbox
        self.work = work
        self.queued_items = max(1, concurrency // 4)
        self.latencies: list[Any] = []
        self.running: dict[int, Item] = {}
        self.workers: dict[int, SimWorker] = {}  # items a worker has started
        self.on_submit: Callable[[Item], None] | None = None

    def submit(self, item: Item) -> None:
        if self.on_submit is not None:
            self.on_submit(item)
        self.running[item.id] = item

    def start(self, item: Item) -> SimWorker | None:
        """A worker takes the item (its worker, if one took it already). In transactional
        mode it enters the transaction lock first: None while a commit closes it (the
        worker waits)."""
        worker = self.workers.get(item.id)
        if worker is not None:
            return worker
        assert self.work is not None
        lock = self.work.transaction_lock
        if lock is not None and not lock.try_enter():
            return None
        worker = self.workers[item.id] = SimWorker(self.work, item, lock is not None)
        return worker

    def report(self, item: Item, results: list[Any]) -> None:
        del self.running[item.id]
        worker = self.workers.pop(item.id, None)
        self.inbox.put(("done", item.id, results, 0.001 * len(results), len(results)))
        if worker is not None and worker.locked:  # (left once its results are in the inbox)
            assert self.work is not None and self.work.transaction_lock is not None
            self.work.transaction_lock.leave()

    def close(self, wait: float = 0.0) -> None:
        self.running.clear()
        self.workers.clear()


class SimSource:
    """A watermark source the test feeds (the gate service, as far as the consumer knows)."""

    def __init__(self) -> None:
        self.state = SourceState("sim")

    def start(self, view: Any) -> None:
        self.state.up = True

    def stop(self) -> None:
        self.state.up = False

    def explain(self, topic: str, partition: int, offset: int) -> None:
        return None


def sim_gate(name: str = "g") -> Gate:
    return Gate(name, SimSource(), stale_after=3600)


def offer(gate: Gate, version: int, watermarks: dict[TP, int | None], at: float = 0.0) -> None:
    """Publish a snapshot to ``gate`` as its source would."""
    gate.view.offer(Snapshot(gate.name, version, at, watermarks), gate.sources[0].state)


class SpyPolicy(FailurePolicy):
    """The engine's own failure policy, recording which records it chose to skip."""

    skipped: set[tuple[TP, int]]

    def decide(self, entry: Entry, error: BaseException, now: float) -> Any:
        decision = super().decide(entry, error, now)
        if decision == "skip":
            self.skipped.add((entry.tp, entry.offset))
        return decision


class SimEngine(ParallelConsumer):
    """The real shell with simulated clients, opened (subscribed) and ready for turns."""

    sim: SimConsumer
    runner: SimRunner

    def __init__(
        self,
        cluster: Cluster,
        clock: Clock,
        producer: SimProducer,
        options: Options,
        gate: Gate | None = None,
        *,
        skipped: set[tuple[TP, int]] | None = None,
        maps: str | None = None,
    ) -> None:
        super().__init__(
            {
                "group.id": "sim",
                "bootstrap.servers": "sim:9092",
                "client.id": "sim",
                "group.instance.id": "sim",  # (a restarted consumer fences its predecessor)
            },
            [cluster.topic],
            lambda record: None,
            options,
            gate=gate,
            registry=None,
        )
        self.cluster = cluster
        self.producer = producer
        self.output_producer: SimOutputProducer | None = None
        self.maps_kind = maps or ("kafka" if cluster.keeps_metadata else "none")
        self._time = self._mono = self._wall = clock.time
        self._inbox = SimInbox(clock)
        policy = SpyPolicy(**vars(self.core.failures))
        policy.skipped = skipped if skipped is not None else set()
        self.core.failures = policy
        self._outputs = SimOutputs(self._new_output_producer, self.transactional)
        if isinstance(self._committer, TransactionalCommitter):
            self._committer.outputs = self._outputs
            self._committer.lock = self._outputs.lock
        cluster.transactions.dead_letter_topic = options.dead_letter_topic
        self._open()

    def _new_consumer(self, config: dict[str, Any]) -> Any:
        self.sim = SimConsumer(self.cluster, config)
        return self.sim

    def _new_producer(self) -> Any:
        return self.producer

    def _new_output_producer(self) -> Any:
        self.output_producer = SimOutputProducer(self.cluster, self.producer_config)
        return self.output_producer

    def _new_runner(self, work: Any) -> Any:
        work.handler = _no_handler
        self.runner = SimRunner(self._inbox, self.options.max_concurrency, work)
        return self.runner

    def _choose_maps(self) -> OffsetMaps:
        return OffsetMaps(self.maps_kind, self.group)


def records_logged(record: logging.LogRecord) -> list[object]:
    """The records (entries, handler records, messages) a log record was given as
    arguments: a handler that keeps log records (a test's capture, an error tracker's recent
    history) keeps them alive, with the engine's state around them."""
    args = record.args if isinstance(record.args, tuple) else (record.args,)
    return [arg for arg in args if isinstance(arg, Entry | Record | SimMessage)]
