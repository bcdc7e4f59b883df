"""The gate: watches dependency consumer groups and publishes per-partition watermarks.

A record (topic, partition, offset) is *released* when every dependency group has committed
past it: ``offset < watermark`` where the watermark is the minimum committed offset over the
groups. The pure computation lives in :func:`compute_watermarks`; :class:`GateService` polls
Kafka's admin API and publishes :class:`Snapshot` objects over HTTP and Redis.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The public names, imported on first use: the poller's child process and the Spark source's
# executors import what they need of the gate without the HTTP service (FastAPI, Redis).
_WHERE = {
    "ConfigError": "gate._config",
    "GateConfig": "gate._config",
    "GateSpec": "gate._config",
    "load_config": "gate._config",
    "parse_config": "gate._config",
    "snapshot_from_hash": "gate._redis",
    "updates_channel": "gate._redis",
    "watermarks_key": "gate._redis",
    "make_poller": "gate._isolated",
    "GateService": "gate._service",
    "StartupError": "gate._service",
    "DependencyStatus": "gate._state",
    "GateState": "gate._state",
    "KafkaLog": "gate._kafkalog",
    "PollResult": "gate._state",
    "Verdict": "gate._state",
    "GateEvaluator": "gate._status",
    "StatusPolicy": "gate._group",
    "Partition": "gate._watermark",
    "Snapshot": "gate._watermark",
    "SnapshotError": "gate._watermark",
    "compute_watermarks": "gate._watermark",
    "is_released": "gate._watermark",
}

if TYPE_CHECKING:
    from gate._config import ConfigError, GateConfig, GateSpec, load_config, parse_config
    from gate._group import StatusPolicy
    from gate._isolated import make_poller
    from gate._kafkalog import KafkaLog
    from gate._redis import snapshot_from_hash, updates_channel, watermarks_key
    from gate._service import GateService, StartupError
    from gate._state import DependencyStatus, GateState, PollResult, Verdict
    from gate._status import GateEvaluator
    from gate._watermark import Partition, Snapshot, SnapshotError, compute_watermarks, is_released


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'gate' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


__all__ = [
    "ConfigError",
    "DependencyStatus",
    "GateConfig",
    "GateEvaluator",
    "GateService",
    "GateSpec",
    "GateState",
    "KafkaLog",
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
    "make_poller",
    "parse_config",
    "snapshot_from_hash",
    "updates_channel",
    "watermarks_key",
]
