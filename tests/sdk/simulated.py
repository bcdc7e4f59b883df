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
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from gate._watermark import Snapshot
from sdk import Gate, Options, ParallelConsumer
from sdk._failures import FailurePolicy
from sdk._maps import OffsetMaps
from sdk._shards import Entry, Item
from sdk._view import SourceState

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
        self.dead_letters: list[SimMessage] = []
        self.fetch_run = 1  # records of one partition handed over in a row by a fetch

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

    def records(self, tp: TP) -> list[SimMessage]:
        """The records of a partition (its control records left out)."""
        return [m for m in self.logs[tp] if not m.control]

    def end(self, tp: TP) -> int:
        return self.next_offset[tp]


def _error(code: int, text: str) -> KafkaException:
    return KafkaException(KafkaError(code, text))


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
            self.callbacks[f"on_{kind}"](self, partitions)
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

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[SimMessage]:
        assert not self.closed
        self._serve()
        messages: list[SimMessage] = []
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

    def poll(self, timeout: float = -1) -> SimMessage | None:
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
            self.cluster.commits[key] = (tp.offset, metadata)
            self.cluster.commit_history.append((key, tp.offset, metadata))
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


class SimRunner:
    """Work items wait here until the test reports their results into the engine's inbox."""

    def __init__(self, inbox: queue.SimpleQueue, concurrency: int) -> None:  # type: ignore[type-arg]
        self.inbox = inbox
        self.queued_items = max(1, concurrency // 4)
        self.latencies: list[Any] = []
        self.running: dict[int, Item] = {}
        self.on_submit: Callable[[Item], None] | None = None

    def submit(self, item: Item) -> None:
        if self.on_submit is not None:
            self.on_submit(item)
        self.running[item.id] = item

    def report(self, item: Item, results: list[Any]) -> None:
        del self.running[item.id]
        self.inbox.put(("done", item.id, results, 0.001 * len(results), len(results)))

    def close(self, wait: float = 0.0) -> None:
        self.running.clear()


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
            {"group.id": "sim", "bootstrap.servers": "sim:9092"},
            [cluster.topic],
            lambda record: None,
            options,
            gate=gate,
            registry=None,
        )
        self.cluster = cluster
        self.producer = producer
        self.maps_kind = maps or ("kafka" if cluster.keeps_metadata else "none")
        self._time = self._mono = self._wall = clock.time
        self._inbox = SimInbox(clock)
        policy = SpyPolicy(**vars(self.core.failures))
        policy.skipped = skipped if skipped is not None else set()
        self.core.failures = policy
        self._open()

    def _new_consumer(self, config: dict[str, Any]) -> Any:
        self.sim = SimConsumer(self.cluster, config)
        return self.sim

    def _new_producer(self) -> Any:
        return self.producer

    def _new_runner(self, work: Any) -> Any:
        self.runner = SimRunner(self._inbox, self.options.max_concurrency)
        return self.runner

    def _choose_maps(self) -> OffsetMaps:
        return OffsetMaps(self.maps_kind, self.group)
