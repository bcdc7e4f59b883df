"""The admin client's own process: ``python -m gate.poll._pollproc``, driven by
:class:`~gate.poll._isolated.IsolatedPoller` over its standard input and output.

Frames are a 4-byte big-endian length and a pickle. The first frame from the parent holds the
poller's arguments and the gates to evaluate here (each as ``(gate, topics, groups,
dependent, incremental)``; none: the parent evaluates). Then each ``("poll", settings)``,
``settings`` holding each gate's :class:`~gate.evaluate._group.StatusPolicy` and version
floor, is answered with a tuple of:

- a :class:`~gate.evaluate._state.PollResult` whose ``committed`` holds only the groups whose
  offsets differ from this process's previous answer (a fleet of idle groups costs the parent
  almost nothing to read);
- the groups read with the same offsets as then;
- per gate the poll could refresh, its :class:`~gate.evaluate._state.GateState`, or the
  message of the exception its evaluation raised (the positions cross as one blob per
  partition, decoded only when read: see :class:`~gate.evaluate._state.GroupPositions`);
- the seconds the evaluation took;

or with the exception a poll raised, until ``"stop"`` or the end of the input. The evaluation
runs here, not in the process that serves HTTP: at 1,000 groups a poll where records arrived
everywhere takes a quarter of a second of an interpreter. After answering a poll, this process
reads the timestamps of the records its gates want (see
:func:`gate.poll._record_times.seed_record_times`): nothing when they want none.
``("times", records)`` is answered with the timestamps of those records (see
:meth:`gate.poll._record_times.RecordReader.read`). Standard output carries nothing else: anything
printed goes to standard error.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING

from gate.evaluate._watermark import Partition
from gate.poll._frames import read_frame, write_frame

if TYPE_CHECKING:
    from gate.evaluate._group import StatusPolicy
    from gate.evaluate._state import GateState, PollResult
    from gate.evaluate._status import GateEvaluator
    from gate.poll._poller import OffsetPoller

log = logging.getLogger("gate")

COLLECT_EVERY = 100
"""Polls between two full collections over everything this process keeps (see :func:`serve`)."""


def main() -> None:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not break frames
    requests = sys.stdin.buffer
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from gate.evaluate._status import GateEvaluator
    from gate.poll._poller import OffsetPoller

    properties, topics_by_group, options, gates = read_frame(requests)
    poller = OffsetPoller(properties, topics_by_group, **options)
    evaluators = {
        gate: GateEvaluator(gate, topics, groups, dependent=dependent, incremental=incremental)
        for gate, topics, groups, dependent, incremental in gates
    }
    try:
        serve(requests, answers, poller, evaluators)
    finally:
        poller.close()


def serve(
    requests: IO[bytes],
    answers: IO[bytes],
    poller: OffsetPoller,
    evaluators: Mapping[str, GateEvaluator],
) -> None:
    """Answer the parent's commands until ``"stop"`` or the end of the input."""
    from gate.poll._record_times import seed_record_times

    failures: dict[str, str] = {}
    seeding_failed: str | None = None
    sent: dict[str, dict[Partition, int]] = {}  # each group's offsets as last sent
    answered = 0
    while True:
        try:
            command = read_frame(requests)
        except EOFError:
            return
        if isinstance(command, tuple) and command[0] == "times":
            write_frame(answers, poller.record_times(command[1]))
            continue
        if not isinstance(command, tuple) or command[0] != "poll":
            return
        try:
            poll = poller.poll()
        except Exception as exc:  # an unexpected failure: the parent raises it
            write_frame(answers, exc)
            continue
        evaluating = time.perf_counter()
        states = evaluate(evaluators, command[1], poll, failures)
        evaluation = time.perf_counter() - evaluating
        changed = {g: o for g, o in poll.committed.items() if sent.get(g) != o}
        same = tuple(g for g in poll.committed if g not in changed)
        sent.update(changed)
        write_frame(
            answers, (dataclasses.replace(poll, committed=changed), same, states, evaluation)
        )
        try:
            seed_record_times(evaluators.values(), poller.record_times)
        except Exception as exc:  # ages stay as they are: no reason to stop answering polls
            if not seeding_failed:
                log.exception("unexpected error while reading record timestamps")
            seeding_failed = str(exc) or type(exc).__name__
        else:
            seeding_failed = None
        # What the poller and the evaluators keep from poll to poll (about 230,000 objects
        # the collector tracks at 1,000 groups on 64 partitions) is left out of its
        # collections: they found no garbage there, and ran over all of it at most polls
        # (a third of the poll's time). Every COLLECT_EVERY polls everything is collected
        # once, so that no cyclic garbage frozen with the rest is kept for long.
        answered += 1
        if answered % COLLECT_EVERY == 0:
            gc.unfreeze()
            gc.collect()
        gc.freeze()


def evaluate(
    evaluators: Mapping[str, GateEvaluator],
    settings: Mapping[str, tuple[StatusPolicy, int]],
    poll: PollResult,
    failures: dict[str, str],
) -> dict[str, GateState | str]:
    """Each gate ``poll`` can refresh, evaluated with the parent's ``settings`` (policy,
    version floor): its state, or the message of what its evaluation raised (logged here with
    its traceback, once while it stays the same)."""
    states: dict[str, GateState | str] = {}
    for gate, evaluator in evaluators.items():
        if not poll.refreshes(evaluator.topics, evaluator.groups):
            continue
        evaluator.policy, evaluator.version_floor = settings[gate]
        try:
            states[gate] = evaluator.observe(poll)
        except Exception as exc:  # one gate's failure stays that gate's
            states[gate] = message = str(exc) or type(exc).__name__
            if failures.get(gate) != message:
                log.exception("gate %s: unexpected error while evaluating a poll", gate)
            failures[gate] = message
        else:
            failures.pop(gate, None)
    return states


if __name__ == "__main__":
    main()
