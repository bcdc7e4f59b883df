"""Rebalances and fetching: what librdkafka assigns the consumer, and what it is told.

The rebalance callbacks run on the consumer's thread inside ``consume()``. On assign, the core
starts tracking each partition from its committed offset with the offset map restored; the
partitions' fetch state at librdkafka is then unknown (an application's pause survives a
re-assignment), so the next reconciliation tells librdkafka to fetch or pause each one. On
revoke, the revoked partitions start nothing more, their in-flight records (and dead-letter
copies) get ``revoke_timeout`` to finish, what completed is committed synchronously, and the
core forgets them. Lost partitions are forgotten at once (no commit is possible).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from sdk.consumer._commits import Committer
from sdk.consumer._maps import OffsetMaps
from sdk.engine._core import TP, WorkCore
from sdk.gating._gating import Gate

log = logging.getLogger("sdk")


class Rebalancer:
    def __init__(
        self,
        core: WorkCore,
        committer: Committer,
        maps: OffsetMaps,
        gate: Gate | None,
        await_results: Callable[[set[TP], float], None],
        clock: Callable[[], float],
        monotonic: Callable[[], float],
        revoke_timeout: float,
    ) -> None:
        self.core = core
        self.committer = committer
        self.maps = maps
        self.gate = gate
        self.await_results = await_results
        self.clock = clock
        self.monotonic = monotonic
        self.revoke_timeout = revoke_timeout
        self.lost_at: float | None = None  # (monotonic) when partitions were last lost

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        found = self._track(consumer, partitions)
        log.info("assigned %s", names(found))

    def _track(self, consumer: Consumer, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Start tracking partitions from their committed offsets and offset maps."""
        try:
            found = consumer.committed(partitions, timeout=10)
        except KafkaException as exc:
            log.warning(
                "could not read committed offsets (%s): starting without offset maps", str(exc)
            )
            found = [TopicPartition(p.topic, p.partition) for p in partitions]
        restored = self.maps.restore(found)
        now = self.clock()
        for tp in found:
            key = (tp.topic, tp.partition)
            self.core.assign(key, tp.offset if tp.offset >= 0 else None, restored.get(key, ()), now)
            if self.gate is not None:
                self.core.set_limit(key, self.gate.limit(*key), now)
        return found

    def rewind(self, consumer: Consumer) -> None:
        """Send every assigned partition (not being revoked) back to its committed offset:
        what the core held is forgotten (results still to come are ignored) and fetched
        again. A partition without a committed offset goes back to its beginning."""
        tps = [tp for tp, part in self.core.partitions.items() if not part.revoked]
        if not tps:
            return
        self.core.revoke(tps)
        self.core.drop(tps)
        found = self._track(consumer, [TopicPartition(t, p) for t, p in tps])
        for tp in found:
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            try:
                consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            except KafkaException as exc:
                log.warning(
                    "could not send %s[%d] back to %d: %s", tp.topic, tp.partition, offset, exc
                )
        log.info("sent %s back to their committed offsets", names(found))

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = {(p.topic, p.partition) for p in partitions}
        if not tps:
            return
        self.core.revoke(tps)
        deadline = self.monotonic() + self.revoke_timeout
        self.committer.release()
        self.await_results(tps, deadline)
        left = tps & self.core.in_flight_partitions()
        if left:
            log.warning(
                "revoking %s with records still in flight: they will be processed again",
                names(left),
            )
        wait = max(0.0, deadline - self.monotonic())
        self.committer.commit(consumer, sync=True, tps=tps, wait=wait)
        self.core.drop(tps)
        log.info("revoked %s", names(tps))

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.lost_at = self.monotonic()
        tps = [(p.topic, p.partition) for p in partitions]
        running = bool(set(tps) & self.core.in_flight_partitions())
        self.core.drop(tps)
        self.committer.lost(consumer, running)
        log.warning(
            "lost %s (no commit possible; their records will be processed again)", names(tps)
        )

    def reconcile(self, consumer: Consumer) -> None:
        """Tell librdkafka to pause or resume what the core decided (the core remembers what
        librdkafka was told, and forgets it when telling failed)."""
        now = self.clock()
        pause, resume = self.core.decide_pauses(now)
        if pause and self._tell(consumer.pause, pause):
            self.core.fetch_changed(pause, (), now)
        if resume and self._tell(consumer.resume, resume):
            self.core.fetch_changed((), resume, now)

    def _tell(self, call: Callable[[list[TopicPartition]], None], tps: list[TP]) -> bool:
        try:
            call([TopicPartition(t, p) for t, p in tps])
        except KafkaException as exc:
            log.warning(
                "%s of %s failed: %s", getattr(call, "__name__", "call"), names(tps), str(exc)
            )
            self.core.fetch_unknown(tps)
            return False
        return True


def names(tps: Iterable[Any]) -> str:
    found = []
    for tp in tps:
        topic, partition = (tp.topic, tp.partition) if isinstance(tp, TopicPartition) else tp
        found.append(f"{topic}[{partition}]")
    return ", ".join(sorted(found)) or "nothing"
