"""Reads committed offsets, partition counts and end offsets through the Kafka admin API.

``AdminClient.list_consumer_group_offsets`` accepts one group per call, so one poll issues a
call per dependency group at once and waits for all of them together. Everything a poll saw
comes back as one :class:`~gate.evaluate._status.PollResult`; failures are reported in it, never
raised, so the caller can keep serving the last good snapshot.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, wait
from typing import Any, NamedTuple

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from gate.evaluate._state import PollResult, RecordAt
from gate.evaluate._watermark import Partition
from gate.poll._kafkalog import KafkaLog, describe_kafka_error, timed_out
from gate.poll._record_times import RecordReader

log = logging.getLogger("gate.poller")

# librdkafka's "no committed offset" sentinel.
OFFSET_INVALID = -1001


class OffsetPoller:
    """Polls the offsets a set of gates needs. Not thread-safe: one caller at a time."""

    def __init__(
        self,
        properties: Mapping[str, Any],
        topics_by_group: Mapping[str, Sequence[str]],
        *,
        request_timeout: float = 5.0,
        metadata_interval: float = 10.0,
        admin: AdminClient | None = None,
        rebuild_after: float | None = None,
        idle_interval: float = 0.0,
    ) -> None:
        self._properties = dict(properties)
        self._admin = admin or self._new_admin()
        self._topics_by_group = {g: list(ts) for g, ts in topics_by_group.items()}
        self._topics = list(dict.fromkeys(t for ts in topics_by_group.values() for t in ts))
        self._timeout = request_timeout
        self._metadata_interval = metadata_interval
        self._partition_counts: dict[str, int] = {}
        self._metadata_at = float("-inf")
        # Requests are rebuilt only when partition counts change.
        self._requests: dict[str, list[ConsumerGroupTopicPartitions]] = {}
        self._end_request: dict[TopicPartition, OffsetSpec] = {}
        self._requests_for: dict[str, int] | None = None
        self._rebuild_after = 3 * request_timeout if rebuild_after is None else rebuild_after
        self._groups_failing_since: float | None = None
        self._timing_out: dict[str, float] = {}  # groups whose reads time out, since when
        self._answered = False  # whether the last read the cluster was asked was answered
        self.rebuilds = 0
        self._idle_interval = idle_interval
        self._reads: dict[str, _Read] = {}  # each group's last successful read
        self._ends: dict[Partition, int] = {}  # the end offsets of the last poll
        self._last_ends: dict[Partition, int] = {}  # each partition's end as last read
        self._keys: dict[str, list[Partition]] = {}  # the partitions each group is read on
        self._asked: dict[str, list[TopicPartition]] = {}  # the same, as asked
        self._groups_listed_at = float("-inf")  # when the cluster's groups were last listed
        self._groups_listing: Future[Any] | None = None  # that listing, until it answers
        self._records = RecordReader(self._properties)

    def _new_admin(self) -> AdminClient:
        return AdminClient(dict(self._properties), logger=KafkaLog("gate.kafka"))

    def _note_group_reads(self, asked: int, failed: set[str], now: float) -> str | None:
        """After a broker restart librdkafka's admin client can keep timing out on group
        requests for good (end offsets and metadata still answer), on every group or on some
        while the others answer: when every group read asked has failed for
        ``rebuild_after`` seconds, or one group's reads have timed out for as long, start
        again with a new client (returns what it did, for the poll's errors)."""
        why = None
        if not asked or len(failed) < asked:
            self._groups_failing_since = None
        elif self._groups_failing_since is None:
            self._groups_failing_since = now
        elif (failing := now - self._groups_failing_since) >= self._rebuild_after:
            why = f"every group read failed for {failing:.0f}s"
        if why is None and self._timing_out:
            group, since = min(self._timing_out.items(), key=lambda item: item[1])
            if now - since >= self._rebuild_after:
                why = f"the reads of group {group} timed out for {now - since:.0f}s"
        if why is None:
            return None
        self._admin = self._new_admin()
        self._groups_failing_since = None
        self._timing_out.clear()
        self.rebuilds += 1
        return f"admin client: {why}; started a new client"

    @property
    def topics(self) -> list[str]:
        return list(self._topics)

    def record_times(self, records: Collection[RecordAt]) -> dict[RecordAt, float | None]:
        """The timestamps of ``records`` (see :meth:`RecordReader.read`)."""
        return self._records.read(records)

    def close(self) -> None:
        """Close the consumer reading record timestamps, if one was created."""
        self._records.close()

    def refresh_metadata(self) -> list[str]:
        """Re-read partition counts; returns errors (empty on success)."""
        try:
            metadata = self._admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            return [f"metadata: {describe_kafka_error(exc)}"]
        counts: dict[str, int] = {}
        for topic in self._topics:
            found = metadata.topics.get(topic)
            if found is not None and found.error is None and found.partitions:
                counts[topic] = len(found.partitions)
        self._partition_counts = counts
        self._metadata_at = time.monotonic()
        return []

    def _build_requests(self, counts: Mapping[str, int]) -> None:
        self._requests = {}
        self._asked = {}
        self._keys = {}
        for group, topics in self._topics_by_group.items():
            wanted = [TopicPartition(t, p) for t in sorted(topics) for p in range(counts.get(t, 0))]
            if wanted:
                self._requests[group] = [ConsumerGroupTopicPartitions(group, wanted)]
                self._asked[group] = wanted
                self._keys[group] = [(tp.topic, tp.partition) for tp in wanted]
        self._end_request = {
            TopicPartition(t, p): OffsetSpec.latest() for t, n in counts.items() for p in range(n)
        }
        self._requests_for = dict(counts)
        self._reads.clear()  # the partitions asked changed: every group is read afresh

    def _at_end(self, group: str, ends: Mapping[Partition, int]) -> bool:
        """Whether the group's last read had it at the end of every partition it is read on,
        by ``ends``; remembered with the read while the end offsets stay the same mapping.

        At the end means at it exactly: an offset beyond the end (committed on the log a
        deleted and recreated topic had before) is no read of this log, and is read again."""
        read = self._reads.get(group)
        if read is None:
            return False
        if read.ends is ends:
            return True
        offsets = read.offsets
        for key in self._keys[group]:
            offset, end = offsets.get(key), ends.get(key)
            if offset is None or offset != end:
                return False
        self._reads[group] = read._replace(ends=ends)
        return True

    def _forget_moved_back(self, ends: Mapping[Partition, int]) -> None:
        """Forget the last read of every group read on a topic where an end offset in ``ends``
        is below the one last read there (the topic was deleted and recreated, or truncated):
        no read of the log before counts on the log now, so those groups are read afresh."""
        last_ends = self._last_ends
        moved_back = {
            topic
            for (topic, partition), end in ends.items()
            if end < last_ends.get((topic, partition), end)
        }
        last_ends.update(ends)
        if not moved_back:
            return
        for group in list(self._reads):
            if not moved_back.isdisjoint(self._topics_by_group[group]):
                del self._reads[group]

    def _idle(self, now: float) -> set[str]:
        """Groups that need not be read in the poll starting at ``now``: not yet due, and
        caught up at the end offsets the last poll saw. Whether they are still caught up at
        this poll's is checked once its end offsets are in."""
        if self._idle_interval <= 0:
            return set()
        ends = self._ends
        return {
            group
            for group, read in self._reads.items()
            if now < read.due and self._at_end(group, ends)
        }

    def _ask(
        self, groups: Sequence[str], errors: list[str], failed_groups: set[str]
    ) -> dict[str, Future]:
        """Issue the offset requests of ``groups`` at once (a request refused on the spot
        fails its group)."""
        futures: dict[str, Future] = {}
        for group in groups:
            try:
                answer = self._admin.list_consumer_group_offsets(
                    self._requests[group], request_timeout=self._timeout
                )
            except KafkaException as exc:
                failed_groups.add(group)
                errors.append(f"group {group}: {describe_kafka_error(exc)}")
                continue
            futures[group] = answer[group]
        return futures

    def poll(self) -> PollResult:
        started_at, started = time.time(), time.monotonic()
        errors: list[str] = []
        failed_topics: set[str] = set()
        asked = answered = False
        if time.monotonic() - self._metadata_at >= self._metadata_interval:
            asked = True
            metadata_errors = self.refresh_metadata()
            if metadata_errors:
                errors.extend(metadata_errors)
                if not self._partition_counts:
                    failed_topics.update(self._topics)
            else:
                answered = True
        counts = self._partition_counts
        if counts != self._requests_for:
            self._build_requests(counts)

        failed_groups: set[str] = set()
        asked_at = time.time()
        idle = self._idle(started)
        asked_groups = [group for group in self._requests if group not in idle]
        group_futures = self._ask(asked_groups, errors, failed_groups)
        asked = asked or bool(asked_groups)

        end_futures: dict[TopicPartition, Future] = {}
        if self._end_request:
            asked = True
            try:
                end_futures = self._admin.list_offsets(
                    self._end_request, request_timeout=self._timeout
                )
            except KafkaException as exc:
                errors.append(f"end offsets: {describe_kafka_error(exc)}")

        wait([*group_futures.values(), *end_futures.values()], timeout=self._timeout + 1.0)

        end_offsets: dict[Partition, int] = {}
        end_error: str | None = None
        for tp, future in end_futures.items():
            try:
                end = future.result(timeout=0).offset
            except Exception as exc:  # the last end read stands in; watermarks are read anyway
                end_error = end_error or f"end offsets: {describe_kafka_error(exc)}"
                continue
            if end < 0:  # no offset in the answer (OFFSET_INVALID, seen while a broker hung)
                end_error = end_error or (
                    f"end offsets: no end offset for {tp.topic}[{tp.partition}] in the answer"
                )
                continue
            end_offsets[(tp.topic, tp.partition)] = end
        if end_error:
            errors.append(end_error)
        # A partition whose end was never read: no gate on its topic can tell what waits there,
        # so none is evaluated from this poll (once read, the last end read stands in).
        read_before = self._last_ends
        failed_topics.update(
            tp.topic
            for tp in self._end_request
            if (tp.topic, tp.partition) not in end_offsets
            and (tp.topic, tp.partition) not in read_before
        )
        if end_offsets == self._ends:
            end_offsets = self._ends  # the same mapping: idle groups are still at the end
        else:
            self._forget_moved_back(end_offsets)
        self._ends = end_offsets

        # Idle groups are read after all when records arrived past them, an end is unknown or
        # went down: the offsets that count for a watermark never come from a read older than
        # the records, nor from a log the partition no longer has.
        woken = [group for group in idle if not self._at_end(group, end_offsets)]
        if woken:
            more = self._ask(woken, errors, failed_groups)
            wait(more.values(), timeout=self._timeout + 1.0)
            group_futures.update(more)
            asked_groups += woken
        answered_at = time.time()

        committed: dict[str, dict[Partition, int]] = {}
        carried: dict[str, float] = {}
        for group, future in group_futures.items():
            try:
                result = future.result(timeout=0)
            except Exception as exc:  # a failed or timed-out request: keep the last snapshot
                failed_groups.add(group)
                errors.append(f"group {group}: {describe_kafka_error(exc)}")
                self._reads.pop(group, None)  # read again at the next poll
                if timed_out(exc):
                    self._timing_out.setdefault(group, started)
                else:
                    self._timing_out.pop(group, None)
                continue
            self._timing_out.pop(group, None)
            offsets = read_offsets(result.topic_partitions, self._asked[group], self._keys[group])
            committed[group] = offsets
            if self._idle_interval > 0:
                due = started + self._idle_interval * random.uniform(0.5, 1.0)
                self._reads[group] = _Read(offsets, due, started_at, None)
            answered = True
        for group in self._requests:
            if group not in committed and group not in failed_groups:
                read = self._reads[group]  # idle, and still caught up
                committed[group] = read.offsets
                carried[group] = read.wall

        known_groups = self._list_groups(committed)
        answered = answered or bool(end_offsets)
        if asked:
            self._answered = answered

        self._admin.poll(0)  # delivers librdkafka's log lines to the Python logger
        rebuilt = self._note_group_reads(len(asked_groups), failed_groups, time.monotonic())
        if rebuilt:
            log.warning("%s", rebuilt)
            errors.append(rebuilt)
        return PollResult(
            started_at=started_at,
            finished_at=time.time(),
            partition_counts=dict(counts),
            end_offsets=end_offsets,
            committed=committed,
            failed_groups=frozenset(failed_groups),
            failed_topics=frozenset(failed_topics),
            errors=tuple(errors),
            answered=self._answered,
            monotonic=started,
            carried=carried,
            known_groups=known_groups,
            asked_at=asked_at,
            answered_at=answered_at,
        )

    def _list_groups(
        self, committed: Mapping[str, Mapping[Partition, int]]
    ) -> frozenset[str] | None:
        """The cluster's consumer groups, when a group read has no committed offset anywhere
        (a misspelt or never started dependency: a close name is suggested). Asked at most
        once per metadata interval and never waited for: the answer is taken at a later
        poll. None when there is no new answer (or the broker cannot list them)."""
        pending = self._groups_listing
        if pending is not None:
            if not pending.done():
                return None
            self._groups_listing = None
            try:
                return frozenset(group.group_id for group in pending.result(timeout=0).valid)
            except Exception:  # a suggestion is a courtesy: the alarm stands without it
                return None
        if all(committed.get(group) for group in self._requests if group in committed):
            return None
        now = time.monotonic()
        if now - self._groups_listed_at < self._metadata_interval:
            return None
        self._groups_listed_at = now
        try:
            self._groups_listing = self._admin.list_consumer_groups(request_timeout=self._timeout)
        except Exception:
            self._groups_listing = None
        return None


def read_offsets(
    answer: Sequence[TopicPartition], asked: Sequence[TopicPartition], keys: Sequence[Partition]
) -> dict[Partition, int]:
    """A group's committed offsets from its answer: the partitions with one and no error.

    ``asked``: the partitions its request asked for (sorted), ``keys`` the same as
    ``(topic, partition)``. librdkafka answers them in that order: each answered partition is
    then compared with the one asked at its place (in C: no topic name is built) and its
    offset kept under that partition's key. A poll reads 64,000 of them at 1,000 groups x 64
    partitions, and this takes about a third of the time of naming each. An answer in any
    other order is read by the names of its partitions."""
    offsets: dict[Partition, int] = {}
    if len(answer) == len(asked):
        for tp, want, key in zip(answer, asked, keys, strict=True):
            if tp != want:
                break
            offset = tp.offset
            if offset >= 0 and tp.error is None:
                offsets[key] = offset
        else:
            return offsets
        offsets = {}
    for tp in answer:
        if tp.error is None and tp.offset >= 0:
            offsets[(tp.topic, tp.partition)] = tp.offset
    return offsets


class _Read(NamedTuple):
    """A group's committed offsets as one poll read them."""

    offsets: dict[Partition, int]
    due: float
    """When (monotonic clock) it is read again even if it stays idle: at a random point of the
    second half of the idle interval after that poll started, so that the reads of groups
    found idle together spread over polls instead of coming back all at once."""
    wall: float
    """When that poll started (wall clock)."""
    ends: Mapping[Partition, int] | None
    """End offsets it is known to be at the end of (None: not known yet)."""
