"""The three-service scenario as real OS processes, faults to inject, and the checks.

Processes: a broker and a redis-server of the scenario's own, the gate (``gate serve``),
dependency services B and C (``actors dependency``), and one or more instances of the gated
dependent A (``actors dependent``, the engine). A producer thread in the test process writes
to the topic at a steady rate. Every process logs what it did with wall-clock times, and
:meth:`Scenario.report` checks the logs:

- the invariant, for every record A started: B and C had both sent a commit past it before;
- every produced record was started at least once;
- duplicates (records started more than once), each of which must be a record A's group had
  not committed past when it was started again (it was in flight, or finished but not yet
  committed, when its process died or lost the partition);
- per fault, recovery: from the end of the fault to A's next start, and until A had started
  every record produced before the fault ended.
"""

from __future__ import annotations

import bisect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, ConsumerGroupState, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from demo._local import LocalBroker, LocalRedis, free_port
from tests.support import describe_group, group_at_broker, keep_figures

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
PARTITIONS = 4
DEPENDENCIES = {"service-b": (0.0005, 0.0015), "service-c": (0.001, 0.004)}


@dataclass
class Fault:
    name: str
    started: float
    ended: float = 0.0
    produced_at_end: dict[int, int] = field(default_factory=dict)


class Producer_(threading.Thread):
    """Writes keyed records round-robin over the partitions at ``rate`` per second."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        super().__init__(daemon=True, name="producer")
        self.topic, self.rate = topic, rate
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.delivered: dict[int, int] = defaultdict(int)  # partition -> next offset
        self.stop_event = threading.Event()
        self.lock = threading.Lock()

    def _delivered(self, error: Any, message: Any) -> None:
        if error is None:
            with self.lock:
                p = message.partition()
                self.delivered[p] = max(self.delivered[p], message.offset() + 1)

    def run(self) -> None:
        i = 0
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            try:
                self.producer.produce(
                    self.topic,
                    key=f"k{i % 50}".encode(),
                    value=f"{i}".encode(),
                    partition=i % PARTITIONS,
                    on_delivery=self._delivered,
                )
                i += 1
            except BufferError:
                pass
            self.producer.poll(0)
            next_at += 1.0 / self.rate
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))
        self.producer.flush(60)

    def produced(self) -> dict[int, int]:
        self.producer.flush(30)
        with self.lock:
            return dict(self.delivered)

    def stop(self) -> dict[int, int]:
        self.stop_event.set()
        self.join(90)
        return self.produced()


class GateExited(RuntimeError):
    """The gate's process ended before it became ready."""


class Scenario:
    def __init__(
        self, workdir: Path, rate: float = 200.0, broker: type[LocalBroker] = LocalBroker
    ) -> None:
        self.workdir = workdir
        self.rate = rate
        self.broker = broker()
        self.redis = LocalRedis()
        self.topic = "payments"
        self.group = "service-a"
        self.gate_port = 0  # chosen at start
        self.gate_process: subprocess.Popen[bytes] | None = None
        self.dependencies: dict[str, subprocess.Popen[bytes]] = {}
        self.dependents: list[subprocess.Popen[bytes]] = []
        self.producer: Producer_ | None = None
        self.faults: list[Fault] = []
        self.events: list[tuple[float, str]] = []

    # ---- processes ------------------------------------------------------------------------

    def _spawn(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        with open(self.workdir / log, "ab") as errors:  # the child keeps its own handle
            return subprocess.Popen(
                [sys.executable, *args],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )

    def start(self) -> Scenario:
        self.broker.start()
        self.redis.start()
        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        for future in admin.create_topics([NewTopic(self.topic, PARTITIONS, 1)]).values():
            future.result(30)
        for attempt in range(3):
            # The port is chosen as late as possible, and chosen again if something took it
            # meanwhile (the clients' own ephemeral ports come from the same range).
            self.gate_port = free_port()
            self._write_gate_config()
            try:
                self.start_gate()
                break
            except GateExited:
                if attempt == 2:
                    raise
        for name in DEPENDENCIES:
            self.start_dependency(name)
        self.spawn_dependent()
        self.producer = Producer_(self.broker.bootstrap, self.topic, self.rate)
        self.producer.start()
        return self

    def _write_gate_config(self) -> None:
        (self.workdir / "gate.yaml").write_text(
            json.dumps(
                {
                    "kafka": {"bootstrap.servers": self.broker.bootstrap},
                    "poll_interval_ms": 100,
                    "heartbeat_ms": 1000,
                    # The scenario keeps the machine's CPU busy (a broker, three consumers and,
                    # under `make test`, other tests beside it): a poller at a lower priority
                    # than all of them would time the machine, not the fault. (Starved, it is
                    # waited for: tests/gate/test_gate_e2e.py.)
                    "poller_niceness": 0,
                    "gates": {
                        "service-a": {"topics": [self.topic], "depends_on": list(DEPENDENCIES)}
                    },
                    "redis": {"url": self.redis.url},
                    "http": {"host": "127.0.0.1", "port": self.gate_port},
                }
            )
        )

    @property
    def gate_url(self) -> str:
        return f"http://127.0.0.1:{self.gate_port}"

    def start_gate(self) -> None:
        self.gate_process = self._spawn(
            "-m", "gate.cli", "serve", "--config", str(self.workdir / "gate.yaml"), log="gate.err"
        )
        deadline = time.monotonic() + 60
        answer = "no answer"
        while time.monotonic() < deadline:
            if self.gate_process.poll() is not None:
                raise GateExited(
                    f"the gate exited with {self.gate_process.returncode}: "
                    + self._log_tail("gate.err")
                )
            try:
                probe = httpx.get(f"{self.gate_url}/readyz", timeout=1)
                if probe.status_code == 200:
                    return
                answer = probe.text
            except httpx.HTTPError as exc:
                answer = repr(exc)
            time.sleep(0.1)
        raise RuntimeError(
            f"the gate did not become ready in 60 s; /readyz: {answer}; "
            + self._log_tail("gate.err")
        )

    def _log_tail(self, log: str, lines: int = 20) -> str:
        path = self.workdir / log
        text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
        return f"{log} ends:\n" + "\n".join(text)

    def kill_gate(self) -> None:
        assert self.gate_process is not None
        self.gate_process.kill()
        self.gate_process.wait(10)

    def start_dependency(self, name: str) -> None:
        low, high = DEPENDENCIES[name]
        self.dependencies[name] = self._spawn(
            "-m", "tests.faults.actors", "dependency", self.broker.bootstrap, self.topic,
            str(PARTITIONS), name, str(self.workdir / f"{name}.log"), str(low), str(high),
            log=f"{name}.err",
        )  # fmt: skip

    def stop_dependency(self, name: str) -> None:
        process = self.dependencies.pop(name)
        process.terminate()
        process.wait(30)

    def spawn_dependent(self) -> subprocess.Popen[bytes]:
        process = self._spawn(
            "-m", "tests.faults.actors", "dependent", self.broker.bootstrap, self.topic,
            self.group, str(self.workdir / "service-a.log"), self.redis.url, self.gate_url,
            log="service-a.err",
        )  # fmt: skip
        self.dependents.append(process)
        self.events.append((time.time(), f"dependent {process.pid} started"))
        return process

    def stop_dependent(self, process: subprocess.Popen[bytes], sig: int) -> None:
        process.send_signal(sig)
        process.wait(60)
        self.dependents.remove(process)
        self.events.append((time.time(), f"dependent {process.pid} got signal {sig}"))

    # ---- faults -----------------------------------------------------------------------------

    def fault(self, name: str) -> Fault:
        fault = Fault(name, time.time())
        self.faults.append(fault)
        return fault

    def end(self, fault: Fault) -> None:
        fault.ended = time.time()
        assert self.producer is not None
        fault.produced_at_end = self.producer.produced()

    def started_records(self) -> int:
        return len({(p, o) for _, p, o, _ in self._starts()})

    def wait_for_a_batch(self, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
        """Until the dependent ``process`` logs the start of a batch. Its handler then runs
        for 2-10 ms, and a commit comes on a turn after it: killed now, it has records that
        ran without their commit (they run again: duplicates the checks must justify)."""
        deadline = time.monotonic() + timeout
        with open(self.workdir / "service-a.log") as log:
            log.seek(0, os.SEEK_END)
            pending = ""
            while True:
                pending += log.read()
                lines, _, pending = pending.rpartition("\n")
                for line in lines.splitlines():
                    x = line.split()
                    if len(x) >= 5 and x[0] == "start" and int(x[4]) == process.pid:
                        return
                if time.monotonic() > deadline:
                    raise AssertionError(f"dependent {process.pid} started no batch in {timeout}s")
                time.sleep(0.001)

    def wait_for_progress(self, records: int, timeout: float = 60) -> None:
        """Until A has started ``records`` more records than now."""
        target = self.started_records() + records
        deadline = time.monotonic() + timeout
        while self.started_records() < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"service-a made no progress to {target} in {timeout}s")
            time.sleep(0.1)

    # ---- end and checks ---------------------------------------------------------------------

    def finish(self, timeout: float = 180) -> dict[int, int]:
        """Stop producing, wait until A has started every record, stop everything."""
        assert self.producer is not None
        produced = self.producer.stop()
        expected = {(p, o) for p, n in produced.items() for o in range(n)}
        deadline = time.monotonic() + timeout
        while True:
            started = {(p, o) for _, p, o, _ in self._starts()}
            if expected <= started:
                break
            if time.monotonic() > deadline:
                missing = sorted(expected - started)
                raise AssertionError(
                    f"{len(missing)} records never started, e.g. {missing[:5]}\n"
                    + self.where_everyone_is(produced, missing)
                )
            time.sleep(0.2)
        time.sleep(0.5)  # the last commits
        return produced

    def where_everyone_is(self, produced: dict[int, int], missing: list[tuple[int, int]]) -> str:
        """Per partition: produced, missing, A's highest start, B's and C's last commits, the
        broker's offsets, the gate's watermark (what a stall report needs)."""
        lines = []
        try:
            low_high = log_offsets(self.broker.bootstrap, self.topic)
        except Exception as exc:  # the report must not hide the failure it explains
            low_high = {}
            lines.append(f"broker offsets unavailable: {exc}")
        try:
            status = httpx.get(f"{self.gate_url}/status/service-a", timeout=2).json()
            watermarks = {
                int(part["partition"]): (part["watermark"], part["holding"])
                for part in status["partitions"]
            }
        except Exception as exc:
            watermarks = {}
            lines.append(f"gate status unavailable: {exc}")
        starts: dict[int, int] = defaultdict(lambda: -1)
        for _, p, o, _ in self._starts():
            starts[p] = max(starts[p], o)
        last = {name: {p: o for _, p, o in self.dependency_commits(name)} for name in DEPENDENCIES}
        for p in sorted(produced):
            gone = [o for q, o in missing if q == p]
            lines.append(
                f"partition {p}: produced {produced[p]}, missing {len(gone)}"
                + (f" ({gone[0]}..{gone[-1]})" if gone else "")
                + f", A started up to {starts[p]}, "
                + ", ".join(f"{name} committed {last[name].get(p)}" for name in DEPENDENCIES)
                + f", broker low/high {low_high.get(p)}, gate watermark {watermarks.get(p)}"
            )
        alive = {
            "gate": self.gate_process is not None and self.gate_process.poll() is None,
            **{name: proc.poll() is None for name, proc in self.dependencies.items()},
            **{f"A {proc.pid}": proc.poll() is None for proc in self.dependents},
        }
        lines.append(f"processes alive: {alive}")
        lines.append(group_at_broker(self.broker.bootstrap, self.group))
        for name, count in (("service-a.err", 40), ("gate.err", 15)):
            path = self.workdir / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-count:]
                lines.append(f"--- last lines of {name}:\n" + "\n".join(tail))
        lines.extend(self._stacks_of_dependents())
        return "\n".join(lines)

    def wait_for_a_settled_group(self, timeout: float = 60) -> None:
        """Until the broker tells A's group is stable (no round of rebalancing under way)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if (
                    describe_group(self.broker.bootstrap, self.group).state
                    == ConsumerGroupState.STABLE
                ):
                    return
            except Exception:  # (the broker is busy: ask again)
                pass
            if time.monotonic() > deadline:
                found = group_at_broker(self.broker.bootstrap, self.group)
                raise AssertionError(f"A's group never settled in {timeout}s: {found}")
            time.sleep(0.2)

    def _stacks_of_dependents(self) -> list[str]:
        """The threads' stacks of every A still running (each writes them on SIGUSR1)."""
        alive = [proc for proc in self.dependents if proc.poll() is None]
        for proc in alive:
            proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        found = []
        for proc in alive:
            path = self.workdir / f"service-a.log.stack-{proc.pid}"
            if path.exists():
                found.append(f"--- stacks of A {proc.pid}:\n" + same_stacks_once(path.read_text()))
        return found

    def close(self) -> None:
        for process in list(self.dependents):
            process.terminate()
        for process in [*self.dependents, *self.dependencies.values()]:
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
        if self.gate_process is not None and self.gate_process.poll() is None:
            self.gate_process.terminate()
            try:
                self.gate_process.wait(10)
            except subprocess.TimeoutExpired:
                self.gate_process.kill()
        if self.producer is not None and self.producer.is_alive():
            self.producer.stop_event.set()
        self.redis.close()
        self.broker.close()

    def _lines(self, name: str) -> list[list[str]]:
        path = self.workdir / name
        if not path.exists():
            return []
        return [line.split() for line in path.read_text().splitlines() if line.strip()]

    def _starts(self) -> list[tuple[float, int, int, int]]:
        return [
            (float(x[1]), int(x[2]), int(x[3]), int(x[4]))
            for x in self._lines("service-a.log")
            if len(x) >= 5 and x[0] == "start"
        ]

    def waits(self) -> list[tuple[float, float]]:
        """Per start of A: (seconds since the record was produced, seconds since both
        dependencies had committed past it)."""
        index = {name: _CommitIndex(self.dependency_commits(name)) for name in DEPENDENCIES}
        found = []
        for x in self._lines("service-a.log"):
            if len(x) == 6 and x[0] == "start":
                started, p, o, produced = float(x[1]), int(x[2]), int(x[3]), float(x[5])
                released = max(index[name].first_past(p, o) for name in DEPENDENCIES)
                found.append((started - produced, started - released))
        return found

    def dependency_commits(self, name: str) -> list[tuple[float, int, int]]:
        return sorted(
            (float(t), int(p), int(o))
            for kind, t, p, o in self._lines(f"{name}.log")
            if kind == "commit"
        )

    def report(
        self,
        produced: dict[int, int],
        rewinds: dict[str, tuple[float, dict[int, int]]] | None = None,
        forgotten: tuple[float, dict[int, int]] | None = None,
    ) -> dict:
        """``forgotten``: (when the broker came back, A's commits it still had): records
        replayed because a restarted broker forgot commits it had acknowledged are counted
        apart, not as the engine's duplicates."""
        starts = sorted(self._starts())
        a_commits = sorted(
            (float(t), int(p), int(o))
            for kind, t, p, o, _ in (x[:5] for x in self._lines("service-a.log") if len(x) >= 5)
            if kind == "commit"
        )
        commits = {name: self.dependency_commits(name) for name in DEPENDENCIES}
        index = {name: _CommitIndex(c) for name, c in commits.items()}

        violations = []
        for t, p, o, _ in starts:
            for name in DEPENDENCIES:
                if not index[name].past(p, o, t):
                    violations.append(f"{p}@{o} started at {t:.3f} before {name} committed past it")
        # After a rewind of a dependency (plus one second for the news to spread), records
        # at or beyond its rewound position need new commits past them.
        for name, (when, position) in (rewinds or {}).items():
            for t, p, o, _ in starts:
                if t > when + 1.0 and o >= position[p] and not index[name].past(p, o, t, when):
                    violations.append(
                        f"{p}@{o} started at {t:.3f} after {name} was rewound at {when:.3f}, "
                        "before it committed past it again"
                    )

        counts = Counter((p, o) for _, p, o, _ in starts)
        expected = {(p, o) for p, n in produced.items() for o in range(n)}
        missing = sorted(expected - set(counts))
        # A record started again must not have been committed past before its second start.
        committed_index = _CommitIndex(a_commits)
        first: dict[tuple[int, int], float] = {}
        unjustified = []
        broker_forgot = 0
        for t, p, o, _ in starts:
            if (p, o) in first and committed_index.past(p, o, t):
                if forgotten is not None and _forgotten(committed_index, forgotten, t, p, o):
                    broker_forgot += 1
                else:
                    unjustified.append(f"{p}@{o} was committed before it started again at {t:.3f}")
            first.setdefault((p, o), t)

        recoveries = []
        for fault in self.faults:
            after = [t for t, _, _, _ in starts if t >= fault.ended]
            needed = [
                first[(p, o)]
                for p, n in fault.produced_at_end.items()
                for o in range(n)
                if (p, o) in first
            ]
            recoveries.append(
                {
                    "fault": fault.name,
                    "lasted_s": round(fault.ended - fault.started, 2),
                    "resumed_after_s": round(max(0.0, after[0] - fault.ended), 3)
                    if after
                    else None,
                    "caught_up_after_s": round(max(0.0, max(needed) - fault.ended), 3)
                    if needed
                    else None,
                }
            )
        return {
            "records": len(expected),
            "starts": len(starts),
            "duplicates": sum(n - 1 for n in counts.values() if n > 1),
            "checked_records": len(counts),
            "violations": violations,
            "missing": missing,
            "unjustified_duplicates": unjustified,
            "replayed_after_the_broker_forgot_commits": broker_forgot,
            "dependency_commits": {name: len(c) for name, c in commits.items()},
            "recoveries": recoveries,
        }


def _forgotten(
    index: _CommitIndex, forgotten: tuple[float, dict[int, int]], t: float, p: int, o: int
) -> bool:
    """Started again after the broker came back, at or beyond the commit it still had, and
    not passed by any commit acknowledged since."""
    back, survived = forgotten
    return t >= back and o >= survived.get(p, 0) and not index.past(p, o, t, since=back)


class _CommitIndex:
    """Per partition, commits by time with a running maximum: was offset o passed by t?"""

    def __init__(self, commits: list[tuple[float, int, int]]) -> None:
        self.times: dict[int, list[float]] = defaultdict(list)
        self.offsets: dict[int, list[int]] = defaultdict(list)
        self.running: dict[int, list[int]] = defaultdict(list)
        for t, p, o in sorted(commits):
            self.times[p].append(t)
            self.offsets[p].append(o)
            previous = self.running[p][-1] if self.running[p] else -1
            self.running[p].append(max(previous, o))

    def first_past(self, partition: int, offset: int) -> float:
        """When a commit past ``offset`` was first sent (infinity: never)."""
        running = self.running.get(partition, [])
        i = bisect.bisect_right(running, offset)  # running maxima are sorted
        return self.times[partition][i] if i < len(running) else float("inf")

    def past(self, partition: int, offset: int, before: float, since: float | None = None) -> bool:
        times = self.times.get(partition, [])
        end = bisect.bisect_right(times, before)
        if since is None:
            return end > 0 and self.running[partition][end - 1] > offset
        begin = bisect.bisect_left(times, since)
        return any(o > offset for o in self.offsets[partition][begin:end])


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], 10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}


def same_stacks_once(dump: str) -> str:
    """A thread dump with the threads of one stack (idle workers) shown once, counted."""
    counts: Counter[str] = Counter()
    for block in dump.strip().split("\n\n"):
        header, _, frames = block.partition("\n")
        counts["current thread\n" + frames if header.startswith("Current") else frames] += 1
    return "\n".join(f"{n} thread(s):\n{frames}" for frames, n in counts.items())


def log_offsets(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """Per partition, the broker's log start and end offsets."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "stall-report"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def record(name: str, report: dict) -> None:
    """Keep the scenario's figures (tests/artifacts/faults.json) and print them."""
    summary = {k: v for k, v in report.items() if k not in ("violations", "missing")}
    summary["violations"] = len(report["violations"])
    summary["missing"] = len(report["missing"])
    summary["unjustified_duplicates"] = len(report["unjustified_duplicates"])
    keep_figures(ARTIFACTS / "faults.json", name, summary)
    print(f"\n{name}: {json.dumps(summary)}")
