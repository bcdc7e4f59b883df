"""The offset poller in a child process of its own (``python -m gate.poll._pollproc``), so that
librdkafka aborting the admin client's process ends only the child; and :func:`make_poller`,
which picks it whenever the configuration can cross to a child process.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import logging
import os
import pickle
import select
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka.admin import AdminClient

from gate.evaluate._state import GateState, PollResult, RecordAt
from gate.evaluate._watermark import Partition
from gate.poll._frames import read_frame, write_frame
from gate.poll._kafkalog import KafkaLog
from gate.poll._poller import OffsetPoller
from gate.poll._record_times import RECORD_TIMES_TIMEOUT

if TYPE_CHECKING:
    from gate.evaluate._status import GateEvaluator

log = logging.getLogger("gate.poller")


class IsolatedPoller:
    """An :class:`OffsetPoller` in a child process of its own.

    librdkafka's admin client can abort the whole process when a coordinator connection drops
    in the middle of ``ListConsumerGroupOffsets`` (an assertion in
    ``rd_kafka_enq_once_del_source_return``; librdkafka issues 3663 and 4605), which a broker
    restart triggers. Here such an abort ends only the child: the poll is reported failed
    (the last snapshot stays in force) and a new child takes over for the next poll.
    The child is ``python -m gate.poll._pollproc``: it never imports the caller's main module. The
    configuration must be picklable (no callables); :func:`make_poller` falls back to an
    in-process poller otherwise.

    ``niceness`` lowers the child's CPU priority below this process's: when CPU is short, the
    process serving HTTP goes first.

    A child that is still running but has not answered a poll within ``answer_wait`` seconds
    (by default twice the request timeout and 10 s: a new child also starts its interpreter) is
    slow, not gone: on a machine short of CPU a child at a lower priority may need a minute. That
    poll is reported failed ("not answered yet", the last snapshot stays) and the next poll
    waits for the same answer rather than asking again, so a starved child is never replaced by
    one that must start from nothing. A child that lets ``patience`` waits in a row pass
    without answering is taken for hung and replaced.

    After :meth:`evaluate`, the child evaluates the gates too, and each poll leaves their
    states in :attr:`evaluated`: the process that serves HTTP then spends no time on them.
    The child then also reads the timestamps of the records its gates want after each poll
    (see :func:`gate.poll._record_times.seed_record_times`); otherwise :meth:`record_times`
    reads them there.
    """

    def __init__(
        self,
        properties: Mapping[str, Any],
        topics_by_group: Mapping[str, Sequence[str]],
        *,
        request_timeout: float = 5.0,
        metadata_interval: float = 10.0,
        idle_interval: float = 0.0,
        niceness: int = 0,
        answer_wait: float | None = None,
        patience: int = 3,
    ) -> None:
        # Invalid properties fail here, in the caller, with librdkafka's own message.
        AdminClient(dict(properties), logger=KafkaLog("gate.kafka"))
        self._args = (
            dict(properties),
            {g: list(ts) for g, ts in topics_by_group.items()},
            {
                "request_timeout": request_timeout,
                "metadata_interval": metadata_interval,
                "idle_interval": idle_interval,
            },
        )
        self._groups = frozenset(topics_by_group)
        self._topics = list(dict.fromkeys(t for ts in topics_by_group.values() for t in ts))
        self._wait = 2 * request_timeout + 10.0 if answer_wait is None else answer_wait
        self._patience = max(1, patience)
        self._niceness = niceness
        self._asked: tuple[float, float] | None = None
        """When (wall, monotonic) the child was asked the poll it has not answered yet."""
        self._unanswered = 0
        """The waits in a row that poll has outlasted."""
        self._process: Any = None
        self._closing = False
        self.restarts = 0
        self._evaluators: Mapping[str, GateEvaluator] = {}
        self._versions: dict[str, int] = {}
        self.evaluated: dict[str, GateState | str] = {}
        """Per gate the last poll could refresh, the state the child evaluated, or the
        message of the exception its evaluation raised."""
        self.evaluation = 0.0
        """Seconds the child spent evaluating the last poll."""

    def evaluate(self, evaluators: Mapping[str, GateEvaluator]) -> None:
        """Evaluate these gates in the child from now on (before the first poll). Each
        poll sends the child their ``policy`` and ``version_floor`` as they are then; their
        other settings are taken once. A new child (after an abort) starts their history
        afresh, as a restart of the service does, and their versions continue."""
        self._evaluators = evaluators

    @property
    def evaluates(self) -> bool:
        return bool(self._evaluators)

    @property
    def topics(self) -> list[str]:
        return list(self._topics)

    def _start(self) -> None:
        self._received: dict[str, dict[Partition, int]] = {}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "gate.poll._pollproc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            preexec_fn=functools.partial(_die_with_parent, self._niceness),
        )
        assert self._process.stdin is not None
        gates = [
            (e.gate, list(e.topics), list(e.groups), e.dependent, e.incremental)
            for e in self._evaluators.values()
        ]
        write_frame(self._process.stdin, (*self._args, gates))

    def poll(self) -> PollResult:
        started_at, started = time.time(), time.monotonic()
        if self._process is None and not self._closing:
            self._start()
        process = self._process
        if process is None:
            return self._crashed(started_at, started, EOFError("closed"))
        assert process.stdin is not None and process.stdout is not None
        try:
            if self._asked is None:
                # The child's poll starts now: its clocks are its own, these count (read
                # together, so the offset between the wall and monotonic clocks stays steady
                # from poll to poll: the evaluation re-evaluates everything when it moves).
                started_at, started = time.time(), time.monotonic()
                settings = {
                    name: (e.policy, max(e.version_floor, self._versions.get(name, 0)))
                    for name, e in self._evaluators.items()
                }
                write_frame(process.stdin, ("poll", settings))
                self._asked = (started_at, started)
            else:  # the poll asked before is still unanswered: its answer comes first
                started_at, started = self._asked
            ready, _, _ = select.select([process.stdout], [], [], self._wait)
            if not ready and process.poll() is None:
                return self._late(started_at, started)
            result = read_frame(process.stdout)
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            return self._crashed(started_at, started, exc)
        if self._unanswered:
            log.info(
                "the admin client's process answered the poll asked %.0f s ago",
                time.monotonic() - started,
            )
        self._asked, self._unanswered = None, 0
        if isinstance(result, BaseException):
            self.evaluated, self.evaluation = {}, 0.0
            raise result
        result, same, self.evaluated, self.evaluation = result
        for name, state in self.evaluated.items():
            if isinstance(state, GateState):
                self._versions[name] = state.version
        # The child sends the groups whose offsets changed since its last answer; the others
        # are the very mappings received before (one child's answers: a new child sends all).
        received = self._received
        received.update(result.committed)
        committed = {g: received[g] for g in same}
        committed.update(result.committed)
        result = dataclasses.replace(result, committed=committed)
        finished_at = started_at + max(0.0, result.finished_at - result.started_at)
        return dataclasses.replace(
            result, started_at=started_at, finished_at=finished_at, monotonic=started
        )

    def record_times(self, records: Collection[RecordAt]) -> dict[RecordAt, float | None]:
        """The timestamps of ``records``, read in the child (see
        :meth:`gate.poll._poller.RecordReader.read`); nothing while no child runs. A child that
        ends meanwhile is replaced at the next poll."""
        process = self._process
        if not records or process is None or self._asked is not None:
            return {}  # (a poll's answer is still to come: it must be read first)
        assert process.stdin is not None and process.stdout is not None
        try:
            write_frame(process.stdin, ("times", list(records)))
            wait = RECORD_TIMES_TIMEOUT + 5.0
            ready, _, _ = select.select([process.stdout], [], [], wait)
            if not ready and process.poll() is None:
                log.error(
                    "the admin client's process has not answered a read of record timestamps "
                    "in %.0f s although it is still running; a new one starts at the next poll",
                    wait,
                )
                self.restarts += 1
                self._shut()  # (its late answer would be read as the next poll's)
                return {}
            times = read_frame(process.stdout)
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            self._crashed(time.time(), time.monotonic(), exc)
            return {}
        return times if isinstance(times, dict) else {}

    def _crashed(self, started_at: float, started: float, exc: BaseException) -> PollResult:
        process = self._process
        code = process.poll() if process is not None else None
        reason = f"exit code {code}" if code is not None else type(exc).__name__
        if self._closing:
            reason = "closed"
        else:
            log.error(
                "the admin client's process ended (%s: librdkafka aborts when a coordinator "
                "connection drops mid-request); starting a new one, the last snapshot stays",
                reason,
            )
            self.restarts += 1
        self._shut()
        return self._failed(started_at, started, f"its process ended ({reason}); restarted")

    def _late(self, started_at: float, started: float) -> PollResult:
        """The child runs but has not answered the poll asked at ``started``: wait for it
        at the next poll, or replace it once it has let ``patience`` waits pass."""
        self._unanswered += 1
        waited = time.monotonic() - started
        if self._unanswered >= self._patience:
            log.error(
                "the admin client's process has not answered a poll in %.0f s although it is "
                "still running (hung); starting a new one, the last snapshot stays",
                waited,
            )
            self.restarts += 1
            self._shut()
            return self._failed(
                started_at, started, f"its process gave no answer in {waited:.0f} s; replaced"
            )
        if self._unanswered == 1:
            priority = f", at niceness {self._niceness}" if self._niceness else ""
            log.warning(
                "the admin client's process has not answered a poll in %.0f s; it is still "
                "running (a slow cluster, or a machine short of CPU%s): the next poll waits for "
                "its answer, the last snapshot stays",
                waited,
                priority,
            )
        return self._failed(started_at, started, "its process has not answered yet; waiting")

    def _failed(self, started_at: float, started: float, error: str) -> PollResult:
        self.evaluated, self.evaluation = {}, 0.0
        return PollResult(
            started_at=started_at,
            finished_at=time.time(),
            partition_counts={},
            end_offsets={},
            committed={},
            failed_groups=self._groups,
            failed_topics=frozenset(self._topics),
            errors=(f"admin client: {error}",),
            answered=False,
            monotonic=started,
        )

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def close(self) -> None:
        """Stop the child for good (a poll in progress ends as a failed poll, quietly)."""
        self._closing = True
        self._shut()

    def _shut(self) -> None:
        process, self._process = self._process, None
        self._asked, self._unanswered = None, 0
        if process is None:
            return
        with contextlib.suppress(Exception):
            assert process.stdin is not None
            write_frame(process.stdin, "stop")
            process.stdin.close()
        try:
            process.wait(2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(2)
        if process.stdout is not None:
            process.stdout.close()


def _die_with_parent(niceness: int = 0) -> None:
    """In the child: get SIGKILL when the parent dies, so no poller outlives its owner; ignore
    Ctrl-C and SIGTERM sent to the whole process group (a terminal's Ctrl-C, a service
    manager's stop): the parent stops the child itself, after the poll in progress. Lower its
    CPU priority by ``niceness``."""
    if niceness:
        with contextlib.suppress(OSError):
            os.nice(niceness)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def make_poller(
    properties: Mapping[str, Any],
    topics_by_group: Mapping[str, Sequence[str]],
    *,
    request_timeout: float = 5.0,
    metadata_interval: float = 10.0,
    idle_interval: float = 0.0,
    niceness: int = 0,
) -> OffsetPoller | IsolatedPoller:
    """An isolated poller when the configuration can cross to a child process, else one in
    this process (a configuration with callables, such as ``oauth_cb``); ``niceness`` lowers
    the child's CPU priority (see :class:`IsolatedPoller`)."""
    options = {
        "request_timeout": request_timeout,
        "metadata_interval": metadata_interval,
        "idle_interval": idle_interval,
    }
    if any(callable(v) for v in properties.values()):
        return OffsetPoller(properties, topics_by_group, **options)
    return IsolatedPoller(properties, topics_by_group, niceness=niceness, **options)
