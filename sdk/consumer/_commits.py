"""Committing: the offsets the core allows, with their offset maps, and what came of it.

The core decides what may be committed (:meth:`~sdk.engine._core.WorkCore.commit_points`); the
committer sends it (asynchronously in the loop, synchronously on revoke and close), tells the
core what was handed out and what failed (to be sent again), keeps the offset maps in their
store, and reports successful commits to the ``on_commit`` hook.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from sdk.consumer._maps import OffsetMaps
from sdk.engine._core import TP, WorkCore

log = logging.getLogger("sdk")


class Committer:
    def __init__(
        self,
        core: WorkCore,
        maps: OffsetMaps,
        hook: Callable[[dict[TP, int]], None] | None,
        clock: Callable[[], float],
    ) -> None:
        self.core = core
        self.maps = maps
        self.hook = hook
        self.clock = clock
        self.pending = False  # (a transactional commit may wait for items in flight)

    @property
    def holding_back(self) -> bool:
        """Whether no work may be handed out now (a transaction waits to open)."""
        return False

    def release(self) -> None:
        """A rebalance waits for the records in flight: let waiting workers go on."""

    def lost(self, consumer: Consumer, running: bool = True) -> None:
        """Partitions were lost (their offsets can no longer be committed); ``running``:
        records of theirs were in flight."""

    def commit(
        self,
        consumer: Consumer,
        *,
        sync: bool,
        tps: Iterable[TP] | None = None,
        wait: float = 0.0,
    ) -> bool:
        """Commit what the core allows; returns whether the commit is over (always, here:
        ``wait`` is for transactional commits, which wait for items in flight)."""
        core, maps = self.core, self.maps
        core.collect_progress(self.clock())
        if maps.enabled:
            core.refresh_offset_maps()
        commits = core.commit_points(tps, with_maps=maps.enabled)
        if not commits:
            return True
        offsets = [
            TopicPartition(t, p, offset, metadata=metadata)
            if maps.in_metadata and metadata
            else TopicPartition(t, p, offset)
            for (t, p), offset, metadata in commits
        ]
        try:
            consumer.commit(offsets=offsets, asynchronous=not sync)
        except KafkaException as exc:
            log.warning("commit failed, will retry: %s", str(exc))
            core.commit_failed(commit.tp for commit in commits)
            return True
        core.commits_sent(commits)
        if sync:
            self._acknowledged(offsets)
        maps.store(commits)
        return True

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's report of an asynchronous commit (served on the consumer's thread)."""
        if error is not None and error.code() != KafkaError._NO_OFFSET:
            log.warning("commit failed, will retry: %s", error.str())
            self.core.commit_failed((tp.topic, tp.partition) for tp in partitions)
            return
        failed = [tp for tp in partitions if tp.error is not None]
        for tp in failed:
            log.warning("commit of %s[%d] failed: %s", tp.topic, tp.partition, tp.error.str())
        self.core.commit_failed((tp.topic, tp.partition) for tp in failed)
        self._acknowledged([tp for tp in partitions if tp.error is None])

    def _acknowledged(self, partitions: list[TopicPartition]) -> None:
        done = {(tp.topic, tp.partition): tp.offset for tp in partitions if tp.offset >= 0}
        if not done:
            return
        self.core.commits_acknowledged(done)
        if self.hook is not None:
            try:
                self.hook(done)
            except Exception:
                log.exception("on_commit hook raised")
