"""The consumer's published state: ``ParallelConsumer.stats()`` and what metrics read.

Built on the consumer's thread about every half second; readers on other threads only ever
see a finished snapshot (the live core belongs to the consumer's thread).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Protocol

from sdk.engine._compiled import COMPILED

if TYPE_CHECKING:
    from sdk.consumer._commits import Committer
    from sdk.consumer._holds import Holds
    from sdk.consumer._maps import OffsetMaps
    from sdk.consumer._runners import Runner
    from sdk.engine._core import WorkCore
    from sdk.engine._options import Options
    from sdk.gating._gating import Gate
    from sdk.produce._producer import Outputs

log = logging.getLogger("sdk")


class Published(Protocol):
    """What a snapshot reads of the consumer (:class:`~sdk.ParallelConsumer`, on its own
    thread): the state below it, never the consumer's API."""

    options: Options
    core: WorkCore
    paused_by_user: bool
    gate: Gate | None
    _maps: OffsetMaps
    _holds: Holds | None
    _outputs: Outputs
    _committer: Committer
    _runner: Runner | None


def snapshot(consumer: Published, now: float, wall: float) -> dict[str, Any]:
    """``now``: the core's clock; ``wall``: the wall clock (the snapshot's date)."""
    core = consumer.core
    partitions = {}
    for tp in core.partitions:
        view = core.partition_view(tp, now)
        if view is not None:
            partitions[tp] = view
    return {
        "at": wall,
        "in_flight": core.in_flight(),
        "held": core.held(),
        "retrying": len(core.retrying),
        "stuck": len(core.stuck),
        "paused_partitions": core.paused_partitions(),
        "pauses": sum(c.pauses for c in core.counts.values()),
        "paused_with_work_s": sum(c.paused_with_work_s for c in core.counts.values()),
        "paused": consumer.paused_by_user,
        "offset_map_store": consumer._maps.kind,
        "core": "compiled" if COMPILED else "pure",
        "partitions": partitions,
        "counts": {tp: dataclasses.asdict(c) for tp, c in core.counts.items()},
        "latency": latency(consumer),
        "holds": ([], 0.0)
        if consumer._holds is None
        else (list(consumer._holds.latency.counts), consumer._holds.latency.total),
        "gate": None if consumer.gate is None else gate_stats(consumer.gate),
        "outputs": output_stats(consumer),
    }


def output_stats(consumer: Published) -> dict[str, Any]:
    """Outputs produced and failed; in transactional mode, the transactions too."""
    outputs = consumer._outputs
    found: dict[str, Any] = {
        "mode": consumer.options.commit_mode.value,
        "produced": outputs.produced,
        "failures": outputs.failures,
    }
    committer = consumer._committer
    if hasattr(committer, "aborted"):
        found["transactions"] = {
            "committed": committer.committed,
            "aborted": committer.aborted,
            "seconds": committer.seconds,
            "last_seconds": committer.last_seconds,
            "last_outputs": committer.last_outputs,
            "outputs_committed": committer.outputs_committed,
            "last_abort": committer.last_abort,
            "open_outputs": outputs.in_transaction,
        }
    return found


def latency(consumer: Published) -> tuple[list[int], float]:
    runner = consumer._runner
    if runner is None:
        return [], 0.0
    counts: list[int] = []
    total = 0.0
    for observed in list(runner.latencies):
        if not counts:
            counts = list(observed.counts)
        else:
            counts = [a + b for a, b in zip(counts, observed.counts, strict=True)]
        total += observed.total
    return counts, total


def gate_stats(gate: Gate) -> dict[str, Any]:
    current = gate.snapshot
    return {
        "name": gate.name,
        "version": None if current is None else current.version,
        "age": gate.view.age(),
        "stale": gate.stale,
        "sources": {
            s.state.name: {"up": s.state.up, "rejected": dict(s.state.rejected)}
            for s in gate.sources
        },
    }
