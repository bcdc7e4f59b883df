"""Watermarks: the pure core shared by the gate service and the SDK.

A dependency group's committed offset on a partition is the *next* offset it will read, so
it has processed every offset below it. The watermark of a partition is the minimum committed
offset over all dependency groups, and a record is released exactly when its offset is below
the watermark. A partition where any dependency group has no committed offset has no
watermark (``None``): nothing is released there.

Nothing here performs I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Partition = tuple[str, int]
"""A (topic, partition) pair."""

Watermarks = Mapping[Partition, int | None]


def compute_watermarks(
    partitions: Iterable[Partition],
    committed: Mapping[str, Mapping[Partition, int]],
) -> dict[Partition, int | None]:
    """Return the watermark of every partition: the minimum committed offset over groups.

    ``committed`` maps each dependency group to its committed offsets; a partition missing
    from a group's mapping means that group has committed nothing there, which leaves the
    partition without a watermark. With no dependency groups at all nothing is released.
    """
    groups = list(committed.values())
    result: dict[Partition, int | None] = {}
    for tp in partitions:
        low: int | None = None
        for offsets in groups:
            offset = offsets.get(tp)
            if offset is None:
                low = None
                break
            if low is None or offset < low:
                low = offset
        result[tp] = low
    return result


def is_released(offset: int, watermark: int | None) -> bool:
    """A record is released when every dependency group has committed past it."""
    return watermark is not None and offset < watermark


class SnapshotError(ValueError):
    """A snapshot received from Redis or HTTP does not have the documented shape."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The watermarks of one gate at one poll, with a version that only ever increases.

    Clients keep the snapshot with the highest version they have seen and never apply an
    older one over it (pub/sub and HTTP may deliver out of order).
    """

    gate: str
    version: int
    polled_at: float
    """Seconds since the epoch at which the poll that produced this snapshot started."""
    watermarks: Mapping[Partition, int | None] = field(default_factory=dict)

    def watermark(self, topic: str, partition: int) -> int | None:
        return self.watermarks.get((topic, partition))

    def released(self, topic: str, partition: int, offset: int) -> bool:
        return is_released(offset, self.watermarks.get((topic, partition)))

    def age(self, now: float) -> float:
        return max(0.0, now - self.polled_at)

    def topics(self) -> dict[str, dict[int, int | None]]:
        nested: dict[str, dict[int, int | None]] = {}
        for (topic, partition), watermark in sorted(self.watermarks.items()):
            nested.setdefault(topic, {})[partition] = watermark
        return nested

    def to_json(self) -> dict[str, Any]:
        """The wire format used by HTTP, server-sent events and Redis pub/sub."""
        return {
            "gate": self.gate,
            "version": self.version,
            "polled_at": format_time(self.polled_at),
            "topics": {
                topic: {str(p): w for p, w in partitions.items()}
                for topic, partitions in self.topics().items()
            },
        }

    @classmethod
    def from_json(cls, data: Any) -> Snapshot:
        """Parse the wire format, rejecting anything malformed with :class:`SnapshotError`."""
        if not isinstance(data, dict):
            raise SnapshotError("snapshot must be a JSON object")
        gate = data.get("gate")
        if not isinstance(gate, str) or not gate:
            raise SnapshotError("snapshot 'gate' must be a non-empty string")
        version = data.get("version")
        if not _is_int(version) or version < 0:
            raise SnapshotError("snapshot 'version' must be a non-negative integer")
        polled_at = parse_time(data.get("polled_at"))
        topics = data.get("topics")
        if not isinstance(topics, dict):
            raise SnapshotError("snapshot 'topics' must be an object")
        watermarks: dict[Partition, int | None] = {}
        for topic, partitions in topics.items():
            if not isinstance(partitions, dict):
                raise SnapshotError(f"snapshot topic {topic!r} must map partitions to offsets")
            for key, watermark in partitions.items():
                watermarks[(topic, parse_partition(key))] = parse_watermark(watermark)
        return cls(gate=gate, version=version, polled_at=polled_at, watermarks=watermarks)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_partition(key: Any) -> int:
    if isinstance(key, str) and key.isdigit():
        return int(key)
    if _is_int(key) and key >= 0:
        return key
    raise SnapshotError(f"partition {key!r} is not a non-negative integer")


def parse_watermark(value: Any) -> int | None:
    if value is None:
        return None
    if _is_int(value) and value >= 0:
        return value
    raise SnapshotError(f"watermark {value!r} is neither null nor a non-negative integer")


def format_time(epoch_seconds: float) -> str:
    """ISO 8601 in UTC with milliseconds, e.g. ``2026-11-22T02:11:00.123Z``."""
    moment = datetime.fromtimestamp(epoch_seconds, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(value: Any) -> float:
    if not isinstance(value, str):
        raise SnapshotError("snapshot 'polled_at' must be an ISO 8601 string")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as exc:
        raise SnapshotError(f"snapshot 'polled_at' {value!r} is not ISO 8601") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
