"""The gate: watches dependency consumer groups and publishes per-partition watermarks.

A record (topic, partition, offset) is *released* when every dependency group has committed
past it: ``offset < watermark`` where the watermark is the minimum committed offset over the
groups. The pure computation lives in :func:`compute_watermarks`; :class:`GateService` polls
Kafka's admin API and publishes :class:`Snapshot` objects over HTTP and Redis.
"""

from gate._config import ConfigError, GateConfig, GateSpec, load_config, parse_config
from gate._redis import snapshot_from_hash, updates_channel, watermarks_key
from gate._service import GateService, StartupError
from gate._state import DependencyStatus, GateState, PollResult, Verdict
from gate._status import GateEvaluator, StatusPolicy
from gate._watermark import (
    Partition,
    Snapshot,
    SnapshotError,
    compute_watermarks,
    is_released,
)

__all__ = [
    "ConfigError",
    "DependencyStatus",
    "GateConfig",
    "GateEvaluator",
    "GateService",
    "GateSpec",
    "GateState",
    "Partition",
    "PollResult",
    "Snapshot",
    "SnapshotError",
    "StartupError",
    "StatusPolicy",
    "Verdict",
    "compute_watermarks",
    "is_released",
    "load_config",
    "parse_config",
    "snapshot_from_hash",
    "updates_channel",
    "watermarks_key",
]
