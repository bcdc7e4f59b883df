"""Exactly-once and at-least-once outputs under faults, with worker processes of
:mod:`tests.faults.eos_worker` (one output per input, KEY ordering, static membership):

- ``kill -9`` at random moments while a transaction holds outputs, restarting each time;
- workers joining a group whose input is full: a dynamic member that joins and leaves, a
  static member that joins, is killed and comes back;
- the broker suspended (SIGSTOP) for longer than the transaction and session timeouts;
- the same kills in at-least-once mode, on every broker.

Exactly-once checks, with a ``read_committed`` reader of the output topic: every input's
output is there once (none missing, no duplicate), per key in input order; a
``read_uncommitted`` reader sees more records than that (the aborted copies: proof that the
kills hit open transactions). At-least-once: every input has an output, and every duplicate
is of an input the killed process had not committed. Figures are printed and kept in
tests/artifacts/exactly_once.json.

The last tests drive the engine in this process to pin down, each deterministically, what
these scenarios found: a commit that dropped the restored offset map beyond the records
fetched, a revocation that waited for workers held back by a closing transaction, and lost
partitions whose outputs stayed in the open transaction.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from demo._local import LocalBroker
from sdk import CommitMode, Hooks, Options, Ordering, Output, Record
from sdk.engine._offsets import OffsetMapError, encode_offset_map, read_offset_map
from tests.sdk.engine_support import start_engine
from tests.support import Broker, Kafka, group_at_broker, keep_figures, unique, wait_until

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
PARTITIONS = 4
KEYS_PER_PARTITION = 50
LIVENESS = 120.0
"""Seconds the group may take to commit every input after the last fault: a bound that only
a stalled consumer exceeds."""
TANSU_FENCING = "Tansu does not abort a fenced producer's open transaction"


def require_exactly_once(broker: Broker) -> None:
    """Skip the exactly-once checks on a broker that cannot keep them."""
    if broker.name == "tansu":
        pytest.skip(
            f"{TANSU_FENCING}: a killed worker's outputs stay visible to read_committed "
            "readers once its successor initialises transactions (and Tansu keeps no offset "
            "maps, so completed inputs beyond a commit are processed again)"
        )


def key_of(partition: int, offset: int) -> bytes:
    """The key of an input: every key lives in one input partition."""
    return f"k{partition + PARTITIONS * (offset % KEYS_PER_PARTITION)}".encode()


@dataclass(frozen=True)
class Copy:
    """An output record as a reader saw it."""

    source: tuple[int, int]  # the input's (partition, offset)
    key: bytes
    run: int  # the pid of the worker process that wrote it
    partition: int
    offset: int


@dataclass
class Kill:
    run: int
    committed: dict[int, int]  # the group's committed offsets once the process was dead


@dataclass
class Worker:
    instance: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def lines(self) -> list[str]:
        """Its log, line by line (nothing before it wrote any)."""
        return self.log.read_text(errors="replace").splitlines() if self.log.exists() else []

    def logged(self, text: str) -> int:
        """How many lines of its log hold ``text``."""
        return sum(text in line for line in self.lines())

    def stderr(self, lines: int = 30) -> str:
        return "\n".join(self.lines()[-lines:])


class CommitWatcher(threading.Thread):
    """Reads a group's commits over and over, and keeps every input offset a committed
    offset map has named completed (such an input must never be processed again)."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        super().__init__(daemon=True, name="commit-watcher")
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
        )
        self.tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self.named: dict[int, set[int]] = defaultdict(set)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.05):
            try:
                found = self.consumer.committed(self.tps, timeout=5)
            except KafkaException:
                continue  # (the broker suspended)
            for tp in found:
                if tp.metadata and tp.offset >= 0:
                    try:
                        base, ranges, _ = read_offset_map(tp.metadata)
                    except OffsetMapError:
                        continue
                    if base == tp.offset:
                        for start, stop in ranges:
                            self.named[tp.partition].update(range(start, stop))

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
        self.consumer.close()


@dataclass
class Pipeline:
    """Inputs in a topic of their own, worker processes turning them into outputs, and the
    readers and probes the checks need."""

    kafka: Kafka
    workdir: Path
    mode: str  # "transactional" or "consumer"
    per_partition: int
    sleep: float = 0.003
    settings: Sequence[str] = ()
    source: str = field(init=False)
    target: str = field(init=False)
    group: str = field(init=False)
    runs: list[Worker] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    stats: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.source = self.kafka.create_topic(PARTITIONS)
        self.target = self.kafka.create_topic(PARTITIONS)
        self.group = unique("eos")
        self.kafka.produce(
            self.source, dict.fromkeys(range(PARTITIONS), self.per_partition), key=key_of
        )
        self.probe = Consumer(
            {
                "bootstrap.servers": self.kafka.bootstrap,
                "group.id": self.group,  # (it never joins: it reads the group's commits)
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        self.uncommitted_probe = Consumer(
            {
                "bootstrap.servers": self.kafka.bootstrap,
                "group.id": unique("probe"),
                "isolation.level": "read_uncommitted",
                "enable.auto.commit": False,
            }
        )
        self.started = time.monotonic()
        self.watcher = CommitWatcher(self.kafka.bootstrap, self.group, self.source)
        self.watcher.start()

    @property
    def total(self) -> int:
        return PARTITIONS * self.per_partition

    # ---- workers -----------------------------------------------------------------------

    def spawn(self, instance: str) -> Worker:
        log = self.workdir / f"worker-{len(self.runs)}-{instance}.err"
        with log.open("ab") as errors:  # the child keeps its own handle
            process = subprocess.Popen(
                [
                    sys.executable, "-m", "tests.faults.eos_worker", self.kafka.bootstrap,
                    self.source, self.target, self.group, instance, self.mode, str(self.sleep),
                    *self.settings,
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=errors,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
        worker = Worker(instance, process, log)
        self.runs.append(worker)
        return worker

    def kill(self, worker: Worker) -> None:
        self.alive(worker)
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait(10)
        self.kills.append(Kill(worker.pid, self.committed()))

    def kill_holding_outputs(self, worker: Worker, timeout: float = 60.0) -> None:
        """SIGKILL ``worker`` while its open transaction holds outputs. Seen holding some, it
        is frozen (SIGSTOP) and looked at again (its transaction may have committed before
        it froze; on a loaded machine a look takes longer than a transaction lasts): killed
        if it still holds them, let go on (SIGCONT) to be caught again otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            wait_until(
                lambda: self.open_transaction(worker),
                timeout=30,
                interval=0.005,
                what=f"{worker.instance}'s outputs",
            )
            worker.process.send_signal(signal.SIGSTOP)
            time.sleep(0.1)  # (what it sent before it froze is answered meanwhile)
            # Seen open twice, a second apart: a commit it sent just before it froze can take
            # a loaded broker longer than one look to apply.
            if self.open_transaction(worker):
                time.sleep(1.0)
                if self.open_transaction(worker):
                    self.kill(worker)
                    return
            worker.process.send_signal(signal.SIGCONT)
        raise AssertionError(f"{worker.instance} was never caught with a transaction open")

    def stop(self, worker: Worker) -> None:
        """SIGTERM: the worker drains, commits and exits 0 (its statistics on stdout)."""
        worker.process.send_signal(signal.SIGTERM)
        stdout, _ = worker.process.communicate(timeout=60)
        assert worker.process.returncode == 0, (
            f"worker {worker.instance} exited with {worker.process.returncode}:\n" + worker.stderr()
        )
        assert "Traceback" not in worker.stderr(1000), worker.stderr()
        lines = stdout.decode().strip().splitlines()
        if lines:
            self.stats.append(json.loads(lines[-1]))

    def alive(self, worker: Worker) -> None:
        if worker.process.poll() is None:
            return
        raise AssertionError(
            f"worker {worker.instance} exited with {worker.process.returncode}:\n" + worker.stderr()
        )

    def close(self) -> None:
        self.watcher.stop()
        for worker in self.runs:
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait(10)
        self.probe.close()
        self.uncommitted_probe.close()

    # ---- probes ------------------------------------------------------------------------

    def committed(self) -> dict[int, int]:
        found = self.probe.committed(
            [TopicPartition(self.source, p) for p in range(PARTITIONS)], timeout=10
        )
        return {tp.partition: max(tp.offset, 0) for tp in found}

    def done(self) -> int:
        return sum(self.committed().values())

    def wait_for_commits(self, beyond: int, workers: Sequence[Worker], timeout: float) -> int:
        """Until the group has committed more than ``beyond`` inputs (the workers alive)."""

        def advanced() -> int:
            for worker in workers:
                self.alive(worker)
            done = self.done()
            return done if done > beyond else 0

        return wait_until(
            advanced,
            timeout=timeout,
            interval=0.05,
            what="commits",
            explain=lambda: self.report(workers),
        )

    def report(self, workers: Sequence[Worker]) -> str:
        """What a stall shows: the commits, the group as the broker describes it, and the
        last lines of each worker's log (the engine's assignments, revokes and errors)."""
        lines = [f"committed {self.committed()} of {self.per_partition} per partition"]
        lines.append(group_at_broker(self.kafka.bootstrap, self.group))
        for worker in workers:
            state = (
                "alive" if worker.process.poll() is None else f"exit {worker.process.returncode}"
            )
            lines.append(f"--- {worker.instance} (pid {worker.pid}, {state}):\n{worker.stderr(15)}")
        return "\n".join(lines)

    def open_transaction(self, worker: Worker | None = None) -> bool:
        """Whether an open transaction (of ``worker``'s, if given) holds records in the
        output topic: past its last stable offset somewhere."""
        for partition in range(PARTITIONS):
            tp = TopicPartition(self.target, partition)
            _, stable = self.probe.get_watermark_offsets(tp, timeout=5, cached=False)
            _, end = self.uncommitted_probe.get_watermark_offsets(tp, timeout=5, cached=False)
            if end > stable and (worker is None or self.wrote(worker, tp, stable, end)):
                return True
        return False

    def wrote(self, worker: Worker, tp: TopicPartition, start: int, end: int) -> bool:
        """Whether one of the records from ``start`` to ``end`` is the worker's."""
        self.uncommitted_probe.assign([TopicPartition(tp.topic, tp.partition, start)])
        try:
            seen = start
            deadline = time.monotonic() + 10
            while seen < end and time.monotonic() < deadline:
                for message in self.uncommitted_probe.consume(500, 0.2):
                    if message.error() is not None:
                        continue
                    seen = message.offset() + 1
                    if dict(message.headers() or []).get("run") == str(worker.pid).encode():
                        return True
        finally:
            self.uncommitted_probe.unassign()
        return False

    def finish(self, workers: Sequence[Worker]) -> float:
        """Wait until the group has committed every input, then stop the workers; returns
        the seconds it took."""
        started = time.monotonic()
        goal = dict.fromkeys(range(PARTITIONS), self.per_partition)

        def complete() -> bool:
            for worker in workers:
                self.alive(worker)
            return self.committed() == goal

        try:
            wait_until(complete, timeout=LIVENESS, interval=0.1, what="every input committed")
        except AssertionError as exc:
            logs = "\n".join(f"--- {w.instance} ({w.pid}):\n{w.stderr()}" for w in workers)
            raise AssertionError(f"{exc}; committed {self.committed()}\n{logs}") from None
        seconds = time.monotonic() - started
        for worker in workers:
            self.stop(worker)
        return seconds

    # ---- readers -----------------------------------------------------------------------

    def read(self, isolation: str) -> list[Copy]:
        """Every output record a reader with ``isolation`` is handed, in log order."""
        return read_outputs(self.kafka, self.target, PARTITIONS, isolation)

    # ---- checks ------------------------------------------------------------------------

    def inputs(self) -> set[tuple[int, int]]:
        return {(p, o) for p in range(PARTITIONS) for o in range(self.per_partition)}

    def check_copies(self, copies: list[Copy]) -> Counter[tuple[int, int]]:
        """Every input has an output, of the right key, and nothing else is there."""
        counts = Counter(copy.source for copy in copies)
        missing = sorted(self.inputs() - set(counts))
        assert not missing, f"{len(missing)} inputs have no output, e.g. {missing[:10]}"
        strange = sorted(set(counts) - self.inputs())
        assert not strange, f"outputs of inputs that do not exist: {strange[:10]}"
        wrong = [copy for copy in copies if copy.key != key_of(*copy.source)]
        assert not wrong, f"outputs with another key than their input's: {wrong[:5]}"
        return counts

    def lost_partitions(self) -> dict[int, set[int]]:
        """The partitions each run (by pid) reported its assignment of lost."""
        found: dict[int, set[int]] = defaultdict(set)
        for worker in self.runs:
            for line in worker.lines():
                if " WARNING lost " in line:
                    found[worker.pid].update(
                        int(p) for p in re.findall(rf"{re.escape(self.source)}\[(\d+)\]", line)
                    )
        return found

    def why(self, duplicates: list[tuple[int, int]]) -> str:
        """Clues to a duplicate's cause: a committed offset map had named its input completed,
        or a run that wrote it reported its partition lost."""
        named = self.watcher.named
        lost = self.lost_partitions()
        dropped = sum(1 for partition, offset in duplicates if offset in named[partition])
        stranded = sum(
            1 for partition, _ in duplicates if any(partition in p for p in lost.values())
        )
        return (
            f"{dropped} named completed by a committed offset map, {stranded} of partitions a run "
            "reported lost"
        )

    def check_exactly_once(self) -> dict[str, Any]:
        committed = self.read("read_committed")
        counts = self.check_copies(committed)
        duplicates = sorted(source for source, n in counts.items() if n > 1)
        assert not duplicates, (
            f"{len(duplicates)} inputs have more than one committed output ({self.why(duplicates)}), "
            f"e.g. {[(s, [c for c in committed if c.source == s]) for s in duplicates[:3]]}"
        )
        disorder = out_of_order(committed)
        assert not disorder, f"outputs of a key out of input order: {disorder[:5]}"
        everything = self.read("read_uncommitted")
        aborted = len(everything) - len(committed)
        assert aborted > 0, (
            f"a read_uncommitted reader saw no more than the {len(committed)} committed "
            "outputs: no kill hit a transaction with outputs in it"
        )
        return {"outputs": len(committed), "aborted_copies_seen": aborted}

    def check_at_least_once(self) -> dict[str, Any]:
        copies = self.read("read_committed")
        counts = self.check_copies(copies)
        order = {worker.pid: i for i, worker in enumerate(self.runs)}
        killed = {kill.run: kill.committed for kill in self.kills}
        lost = self.lost_partitions()
        by_source: dict[tuple[int, int], list[int]] = defaultdict(list)
        for copy in copies:
            if counts[copy.source] > 1:
                by_source[copy.source].append(copy.run)
        unjustified = []
        for (partition, offset), runs in sorted(by_source.items()):
            runs.sort(key=order.__getitem__)
            for earlier, later in itertools.pairwise(runs):
                # Written twice by one run: it lost the partition in between (at least once
                # promises no more after a lost session).
                if earlier == later and partition in lost[earlier]:
                    continue
                # A copy written again by a later run: the earlier run was killed before it
                # committed past the input.
                commit = killed.get(earlier)
                if earlier == later or commit is None or offset < commit.get(partition, 0):
                    unjustified.append(((partition, offset), runs))
                    break
        assert not unjustified, (
            f"{len(unjustified)} inputs written again though their run had committed past "
            f"them (or was not killed), e.g. {unjustified[:5]}; kills: {self.kills}"
        )
        return {
            "outputs": len(copies),
            "duplicates": sum(n - 1 for n in counts.values()),
            "inputs_duplicated": len(by_source),
            "partitions_lost": sum(len(partitions) for partitions in lost.values()),
        }

    def figures(self, **extra: Any) -> dict[str, Any]:
        transactions = [s.get("transactions", {}) for s in self.stats]
        figures = {
            "broker": self.kafka.broker.name,
            "mode": self.mode,
            "inputs": self.total,
            "runs": len(self.runs),
            "kills": len(self.kills),
            "seconds": round(time.monotonic() - self.started, 1),
            **extra,
        }
        if any(transactions):
            figures["aborted_by_graceful_runs"] = sum(t.get("aborted", 0) for t in transactions)
        return figures


def read_outputs(kafka: Kafka, topic: str, partitions: int, isolation: str) -> list[Copy]:
    """Every output record (``<partition>:<offset>`` of its input) a reader with
    ``isolation`` is handed, in log order."""
    reader = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": unique("reader"),
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    copies: list[Copy] = []
    ended: set[int] = set()
    try:
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + 60
        while len(ended) < partitions:
            assert time.monotonic() < deadline, f"{isolation}: no end of {topic}"
            for message in reader.consume(5000, 0.5):
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error.str()
                    ended.add(message.partition())
                    continue
                partition, offset = message.value().decode().split(":")
                headers = dict(message.headers() or [])
                copies.append(
                    Copy(
                        (int(partition), int(offset)),
                        message.key(),
                        int(headers.get("run", b"0")),
                        message.partition(),
                        message.offset(),
                    )
                )
    finally:
        reader.close()
    return copies


def out_of_order(copies: list[Copy]) -> list[tuple[bytes, int, int]]:
    """Per key, outputs (in log order) whose input came before the previous output's."""
    last: dict[bytes, int] = {}
    found = []
    for copy in sorted(copies, key=lambda c: (c.partition, c.offset)):
        _, offset = copy.source
        before = last.get(copy.key, -1)
        if offset <= before:
            found.append((copy.key, before, offset))
        last[copy.key] = offset
    return found


def record(name: str, figures: dict[str, Any]) -> None:
    """Keep a test's figures (tests/artifacts/exactly_once.json) and print them."""
    keep_figures(ARTIFACTS / "exactly_once.json", f"{name} ({figures['broker']})", figures)
    print(f"\n{name}: {json.dumps(figures)}")


@pytest.fixture
def pipelines(tmp_path: Path) -> Iterator[list[Pipeline]]:
    """Pipelines a test builds, their workers killed and probes closed at its end."""
    made: list[Pipeline] = []
    yield made
    for pipeline in made:
        pipeline.close()


def kill_repeatedly(pipeline: Pipeline, kills: int, chance: random.Random) -> Worker:
    """Start a worker (static member ``w1``), and ``kills`` times: let it commit, wait a
    random moment, SIGKILL it (in transactional mode, while its transaction holds outputs)
    and start another with the same instance id. Returns the last one, still running."""
    worker = pipeline.spawn("w1")
    for _ in range(kills):
        pipeline.wait_for_commits(pipeline.done(), [worker], timeout=60)
        time.sleep(chance.uniform(0.0, 0.3))
        if pipeline.mode == "transactional":
            wait_until(pipeline.open_transaction, timeout=30, interval=0.005, what="outputs")
        assert pipeline.done() < pipeline.total, "every input was done before the kill"
        pipeline.kill(worker)
        worker = pipeline.spawn("w1")
    return worker


# ---- the tests -----------------------------------------------------------------------------


def test_kill_9_at_random_moments_exactly_once(
    kafka: Kafka, tmp_path: Path, pipelines: list[Pipeline]
) -> None:
    require_exactly_once(kafka.broker)
    seed = random.randrange(2**32)
    pipeline = Pipeline(kafka, tmp_path, "transactional", per_partition=5000)
    pipelines.append(pipeline)
    last = kill_repeatedly(pipeline, kills=4, chance=random.Random(seed))
    seconds = pipeline.finish([last])
    figures = pipeline.check_exactly_once()
    record(
        "kill -9, exactly once",
        pipeline.figures(seed=seed, finished_after_last_kill_s=round(seconds, 1), **figures),
    )


def test_kill_9_at_random_moments_at_least_once(
    kafka: Kafka, tmp_path: Path, pipelines: list[Pipeline]
) -> None:
    seed = random.randrange(2**32)
    # Without transactions a worker runs faster: more input, so that input remains at the
    # fourth kill even when the restarts are slow (a loaded machine).
    pipeline = Pipeline(kafka, tmp_path, "consumer", per_partition=8000)
    pipelines.append(pipeline)
    last = kill_repeatedly(pipeline, kills=4, chance=random.Random(seed))
    seconds = pipeline.finish([last])
    figures = pipeline.check_at_least_once()
    record(
        "kill -9, at least once",
        pipeline.figures(seed=seed, finished_after_last_kill_s=round(seconds, 1), **figures),
    )


def test_rebalances_while_the_input_is_full_exactly_once(
    kafka: Kafka, tmp_path: Path, pipelines: list[Pipeline]
) -> None:
    """Workers join a group whose input is full (confluentinc/parallel-consumer#541: a
    transactional consumer stuck while rebalancing): a dynamic member joins and leaves
    gracefully, then a static member joins, is killed while its transaction holds outputs
    and comes back. Exactly once throughout, and after every change commits resume within
    the liveness bound. (A static member that leaves is not replaced before its session
    times out, which noida never does: the member that leaves for good is a dynamic one.)"""
    require_exactly_once(kafka.broker)
    pipeline = Pipeline(kafka, tmp_path, "transactional", per_partition=6000, sleep=0.01)
    pipelines.append(pipeline)
    first = pipeline.spawn("a")
    pipeline.wait_for_commits(0, [first], timeout=LIVENESS)
    resumed: dict[str, float] = {}

    def changed(name: str, workers: list[Worker], assigned: list[tuple[Worker, int]]) -> None:
        """After a change: the workers named get partitions, then commits resume (before
        the input is used up)."""
        started = time.monotonic()
        for worker, before in assigned:
            wait_until(
                lambda w=worker, n=before: w.logged("assigned") > n,
                timeout=LIVENESS,
                what=f"{worker.instance} assigned after {name}",
            )
        pipeline.wait_for_commits(pipeline.done(), workers, timeout=LIVENESS)
        resumed[name] = round(time.monotonic() - started, 2)
        assert pipeline.done() < pipeline.total, f"every input was done by {name}: produce more"

    joining = pipeline.spawn("-")
    changed("dynamic member joined", [first, joining], [(first, 1), (joining, 0)])
    count = first.logged("assigned")
    pipeline.stop(joining)
    changed("dynamic member left", [first], [(first, count)])
    static = pipeline.spawn("c")
    changed("static member joined", [first, static], [(first, count + 1), (static, 0)])
    pipeline.kill_holding_outputs(static)
    static = pipeline.spawn("c")
    changed("static member killed and back", [first, static], [(static, 0)])
    seconds = pipeline.finish([first, static])
    figures = pipeline.check_exactly_once()
    runs_by_partition: dict[int, set[int]] = defaultdict(set)
    for copy in pipeline.read("read_committed"):
        runs_by_partition[copy.source[0]].add(copy.run)
    assert any(len(runs) > 1 for runs in runs_by_partition.values()), (
        "no input partition moved between the workers"
    )
    record(
        "rebalances, exactly once",
        pipeline.figures(
            commits_resumed_after_s=resumed,
            finished_after_last_change_s=round(seconds, 1),
            **figures,
        ),
    )


def test_broker_suspended_longer_than_the_timeouts_exactly_once(
    local_broker: LocalBroker, broker: Broker, tmp_path: Path, pipelines: list[Pipeline]
) -> None:
    """SIGSTOP the broker, while a transaction holds outputs, for longer than the
    transaction timeout (5 s) and the session timeout (6 s); after SIGCONT the worker goes
    on and every input's output is committed once."""
    require_exactly_once(broker)
    kafka = Kafka(local_broker.bootstrap, broker)
    pipeline = Pipeline(
        kafka,
        tmp_path,
        "transactional",
        per_partition=4000,
        sleep=0.006,
        settings=["producer.transaction.timeout.ms=5000"],
    )
    pipelines.append(pipeline)
    worker = pipeline.spawn("w1")
    pipeline.wait_for_commits(0, [worker], timeout=LIVENESS)
    wait_until(pipeline.open_transaction, timeout=30, interval=0.005, what="outputs")
    local_broker.suspend()
    try:
        time.sleep(9.0)
    finally:
        local_broker.resume()
    seconds = pipeline.finish([worker])
    figures = pipeline.check_exactly_once()
    record(
        "broker suspended 9 s, exactly once",
        pipeline.figures(finished_after_resume_s=round(seconds, 1), **figures),
    )


# ---- the engine's part, in one process ----------------------------------------------------


def test_a_commit_keeps_the_restored_offset_map_beyond_the_records_fetched(
    kafka: Kafka,
) -> None:
    """A group's committed offset map says every odd offset was completed (and, exactly
    once, that their outputs were committed). A new owner whose buffer holds a hundred
    records at a time commits while it has fetched only a few hundred offsets beyond the committed one: its
    commit must still name every odd offset beyond the committed one, or a crash or a
    rebalance after it has them processed, and their outputs committed, a second time."""
    if not kafka.broker.keeps_metadata:
        pytest.skip(f"{kafka.broker.name} keeps no commit metadata: no offset maps")
    source, target = kafka.create_topic(1), kafka.create_topic(1)
    records = 4000
    kafka.produce(source, {0: records}, key=lambda p, i: b"k")
    group = unique("restored")
    completed = range(1, records, 2)
    metadata = encode_offset_map(0, completed)
    assert metadata
    committer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        committer.commit(
            offsets=[TopicPartition(source, 0, 0, metadata=metadata)], asynchronous=False
        )
    finally:
        committer.close()

    def handle(record: Record) -> Output:
        time.sleep(0.01)  # (4,000 records would take 20 s: it stops long before)
        return Output(target, value=str(record.offset), key=record.key)

    engine = start_engine(
        kafka.bootstrap,
        source,
        handle,
        Options(
            ordering=Ordering.PARTITION,
            max_buffered=100,
            commit_interval=0.1,
            commit_mode=CommitMode.TRANSACTIONAL,
        ),
        group=group,
    )
    try:
        wait_until(lambda: kafka.committed(group, source, 1).get(0, 0) > 0, what="a commit")
    finally:
        engine.stop()
    found = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        (tp,) = found.committed([TopicPartition(source, 0)], timeout=10)
    finally:
        found.close()
    assert 0 < tp.offset < records - 1, f"the test stopped too late: committed {tp.offset}"
    kept: set[int] = set()
    if tp.metadata:  # (no metadata: no record beyond the committed offset is named)
        base, ranges, truncated = read_offset_map(tp.metadata)
        assert base == tp.offset and not truncated
        kept = {offset for start, stop in ranges for offset in range(start, stop)}
    dropped = sorted(set(completed) - kept - set(range(tp.offset + 1)))
    assert not dropped, (
        f"the commit at offset {tp.offset} dropped {len(dropped)} records the restored map "
        f"said were completed, from offset {dropped[0]} (its map ends at "
        f"{max(kept, default=tp.offset)})"
    )


def test_a_rebalance_while_a_transaction_closes_waits_only_for_running_records(
    kafka: Kafka, caplog: pytest.LogCaptureFixture
) -> None:
    """A record runs long, so the transaction's close waits for it; meanwhile a worker takes
    an item of another partition and waits for the next transaction. A second consumer joins:
    once the long record is done, the revocation has nothing left to wait for (the waiting
    item's partition is revoked, so its records do not start), and must not wait until
    ``revoke_timeout`` and give its records up as still in flight
    (confluentinc/parallel-consumer#541: a transactional consumer stuck while rebalancing)."""
    source, target = kafka.create_topic(2), kafka.create_topic(2)
    group = unique("closing")
    started, release = threading.Event(), threading.Event()

    def handle(record: Record) -> Output:
        if record.partition == 0:
            started.set()
            release.wait(60)
        return Output(target, value=f"{record.partition}:{record.offset}", key=record.key)

    options = Options(
        ordering=Ordering.PARTITION,
        max_concurrency=4,
        commit_interval=0.1,
        revoke_timeout=5.0,
        commit_mode=CommitMode.TRANSACTIONAL,
    )
    kafka.produce(source, {0: 1}, key=lambda p, i: b"slow")
    # (Two consumers of one process: their own client.id gives each its own transactional.id.)
    first = start_engine(
        kafka.bootstrap, source, handle, options, group=group, **{"client.id": "first"}
    )
    second = None
    try:
        wait_until(started.is_set, timeout=30, what="the long record")
        wait_until(lambda: first._committer.pending, what="the transaction's close waiting")
        kafka.produce(source, {1: 1}, key=lambda p, i: b"quick")
        tp1 = (source, 1)
        wait_until(
            lambda: tp1 in first.core.in_flight_partitions(),
            timeout=30,
            what="an item of partition 1 handed to a worker",
        )
        with caplog.at_level(logging.WARNING, logger="sdk"):
            second = start_engine(
                kafka.bootstrap, source, handle, options, group=group, **{"client.id": "second"}
            )
            wait_until(
                lambda: all(part.revoked for part in list(first.core.partitions.values())),
                timeout=60,
                what="the first consumer revoking its partitions",
            )
            release.set()
            wait_until(
                lambda: kafka.committed(group, source, 2) == {0: 1, 1: 1},
                timeout=60,
                what="both records committed",
            )
    finally:
        release.set()
        if second is not None:
            second.stop()
        first.stop()
    stranded = [r.getMessage() for r in caplog.records if "still in flight" in r.getMessage()]
    assert not stranded, stranded


def test_an_assignment_lost_mid_transaction_commits_none_of_its_outputs(
    kafka: Kafka, caplog: pytest.LogCaptureFixture
) -> None:
    """The consumer's thread is held (an ``on_commit`` hook that takes longer than
    ``max.poll.interval.ms``) while workers produce outputs into the open transaction:
    librdkafka leaves the group and reports the assignment lost. Those outputs belong to
    inputs whose offsets can no longer be committed: they must never become visible, so each
    input's output is committed once when the consumer is assigned the partitions again."""
    require_exactly_once(kafka.broker)
    source, target = kafka.create_topic(2), kafka.create_topic(2)
    records = 1500
    kafka.produce(source, dict.fromkeys(range(2), records), key=lambda p, i: f"k{i % 40}".encode())
    group = unique("lost")
    held = threading.Event()

    def committed(offsets: dict[tuple[str, int], int]) -> None:
        if not held.is_set():
            held.set()
            time.sleep(8.0)  # longer than max.poll.interval.ms: the group lets it go

    def handle(record: Record) -> Output:
        time.sleep(0.004)
        return Output(target, value=f"{record.partition}:{record.offset}", key=record.key)

    with caplog.at_level(logging.WARNING, logger="sdk"):
        engine = start_engine(
            kafka.bootstrap,
            source,
            handle,
            Options(
                ordering=Ordering.KEY,
                max_concurrency=8,
                commit_interval=0.1,
                commit_mode=CommitMode.TRANSACTIONAL,
                hooks=Hooks(on_commit=committed),
            ),
            group=group,
            **{"max.poll.interval.ms": 6000, "client.id": "held"},
        )
        try:
            wait_until(
                lambda: kafka.committed(group, source, 2) == dict.fromkeys(range(2), records),
                timeout=120,
                what="every input committed",
            )
        finally:
            engine.stop()
    assert any(r.getMessage().startswith("lost ") for r in caplog.records), (
        "the assignment was not lost: the scenario did not happen"
    )
    counts = Counter(copy.source for copy in read_outputs(kafka, target, 2, "read_committed"))
    twice = sorted(source for source, n in counts.items() if n > 1)
    assert set(counts) == {(p, o) for p in range(2) for o in range(records)}
    assert not twice, f"{len(twice)} inputs have two committed outputs, e.g. {twice[:10]}"
