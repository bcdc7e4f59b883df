"""The admin client's own process: ``python -m gate._pollproc``, driven by
:class:`~gate._isolated.IsolatedPoller` over its standard input and output.

Frames are a 4-byte big-endian length and a pickle. The first frame from the parent holds the
poller's arguments; then each ``"poll"`` is answered with a :class:`~gate._state.PollResult`
whose ``committed`` holds only the groups whose offsets differ from this process's previous
answer, and the tuple of the groups read with the same offsets as then (or with the exception
a poll raised), until ``"stop"`` or the end of the input: a fleet of idle groups costs the
parent almost nothing to read. Standard output carries nothing else: anything printed goes to
standard error.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

from gate._frames import read_frame, write_frame
from gate._watermark import Partition


def main() -> None:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not break frames
    requests = sys.stdin.buffer
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from gate._poller import OffsetPoller

    properties, topics_by_group, options = read_frame(requests)
    poller = OffsetPoller(properties, topics_by_group, **options)
    sent: dict[str, dict[Partition, int]] = {}  # each group's offsets as last sent
    while True:
        try:
            command = read_frame(requests)
        except EOFError:
            return
        if command != "poll":
            return
        try:
            poll = poller.poll()
        except Exception as exc:  # an unexpected failure: the parent raises it
            write_frame(answers, exc)
            continue
        changed = {g: o for g, o in poll.committed.items() if sent.get(g) != o}
        same = tuple(g for g in poll.committed if g not in changed)
        sent.update(changed)
        write_frame(answers, (dataclasses.replace(poll, committed=changed), same))


if __name__ == "__main__":
    main()
