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
    "Partition": "gate.evaluate._watermark",
    "Snapshot": "gate.evaluate._watermark",
    "SnapshotError": "gate.evaluate._watermark",
    "compute_watermarks": "gate.evaluate._watermark",
    "is_released": "gate.evaluate._watermark",
    "DependencyStatus": "gate.evaluate._state",
    "GateState": "gate.evaluate._state",
    "PollResult": "gate.evaluate._state",
    "Verdict": "gate.evaluate._state",
    "StatusPolicy": "gate.evaluate._group",
    "GateEvaluator": "gate.evaluate._status",
    "KafkaLog": "gate.poll._kafkalog",
    "make_poller": "gate.poll._isolated",
    "snapshot_from_hash": "gate.publish._redis",
    "updates_channel": "gate.publish._redis",
    "watermarks_key": "gate.publish._redis",
    "ConfigError": "gate.service._config",
    "GateConfig": "gate.service._config",
    "GateSpec": "gate.service._config",
    "load_config": "gate.service._config",
    "parse_config": "gate.service._config",
    "GateService": "gate.service._service",
    "StartupError": "gate.service._service",
}

if TYPE_CHECKING:
    from gate.evaluate._group import StatusPolicy
    from gate.evaluate._state import DependencyStatus, GateState, PollResult, Verdict
    from gate.evaluate._status import GateEvaluator
    from gate.evaluate._watermark import (
        Partition,
        Snapshot,
        SnapshotError,
        compute_watermarks,
        is_released,
    )
    from gate.poll._isolated import make_poller
    from gate.poll._kafkalog import KafkaLog
    from gate.publish._redis import snapshot_from_hash, updates_channel, watermarks_key
    from gate.service._config import ConfigError, GateConfig, GateSpec, load_config, parse_config
    from gate.service._service import GateService, StartupError


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
