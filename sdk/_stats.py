"""The consumer's published state: ``ParallelConsumer.stats()`` and what metrics read.

Built on the consumer's thread about every half second; readers on other threads only ever
see a finished snapshot (the live core belongs to the consumer's thread).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from sdk._compiled import COMPILED
from sdk._partition import TP

if TYPE_CHECKING:
    from sdk._engine import ParallelConsumer
    from sdk._gating import Gate

log = logging.getLogger("sdk")


def snapshot(consumer: ParallelConsumer, now: float, wall: float) -> dict[str, Any]:
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


def output_stats(consumer: ParallelConsumer) -> dict[str, Any]:
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


def latency(consumer: ParallelConsumer) -> tuple[list[int], float]:
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


def log_hold(gate: Gate, tp: TP, offset: int, held_for: float) -> None:
    """One line saying which dependency groups a held partition waits for."""
    why = gate.explain(tp[0], tp[1], offset)
    waiting = why.get("waiting_for")
    if waiting:
        detail = ", ".join(_behind(w) for w in waiting)
    elif why["watermark"] is None:
        detail = "a watermark (none yet: a dependency has not committed there, or no snapshot)"
    else:
        detail = f"the watermark to pass it (at {why['watermark']})"
    log.warning(
        "%s[%d]: records from offset %d held for %.0fs by gate %s: waiting for %s",
        tp[0],
        tp[1],
        offset,
        held_for,
        gate.name,
        detail,
    )


def _behind(waiting: dict[str, Any]) -> str:
    """One dependency group a held record waits for, as :meth:`Gate.explain` gives it."""
    if waiting.get("committed") is None:
        return f"{waiting['group']} (no committed offset there)"
    return (
        f"{waiting['group']} (committed {waiting['committed']}, behind by {waiting['behind_by']})"
    )
