"""Apache Kafka's exactly-once test in group mode, on the engine: three transactional copier
processes (:mod:`tests.faults.eos_worker`: ``CommitMode.TRANSACTIONAL``, KEY ordering, one
output per input, static membership) in one consumer group copy an input topic of 4,000
records to an output topic while

- each copier is bounced three times, cleanly (SIGTERM: a graceful stop) and hard (SIGKILL,
  while its transaction holds copies), one copier at every tenth of the input committed (10%
  to 90%), and started again at once with the same ``group.instance.id``;
- the broker is bounced cleanly once (SIGTERM to its process group, then started again on the
  same port and data directory), the copiers killed across it (see NOIDA_RESTART);
- a ``read_committed`` reader follows the output topic the whole time, as a downstream
  consumer does, and views of the whole committed output are read over and over: none may
  ever hold an input copied twice, or a key's copies out of input order, and what a view held
  must stay in every later one.

At the end every input has exactly one committed copy (none missing, no duplicate), per key
in input order, no transaction holds the output back, and a ``read_uncommitted`` reader sees
the aborted copies the bounces left (proof that they hit open transactions). Figures are
printed and kept in tests/artifacts/exactly_once.json. The run is driven by the exactly-once
harness of :mod:`tests.faults.test_exactly_once`; it runs on noida-db only (Tansu does not
abort a fenced producer's open transaction, and keeps nothing across a restart).

The copiers' session timeout is long (SESSION_TIMEOUT_MS): noida-db can otherwise let two
copiers commit copies of one input (NOIDA_JOIN, shown by tests/faults/test_noida_groups.py).
The last tests pin down the facts about noida-db 0.2 that shape the broker bounce and the
readers: it loses acknowledged records when killed (so its bounce is a clean stop), aborts
the transactions open at a restart without fencing their producers (so the copiers are down
across it), and hides a producer's records committed after an aborted transaction from a
fetch that starts after it (so the following reader is not asked for every copy). Each fails
once noida-db behaves as Kafka does.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from demo._local import LocalBroker
from tests.faults.test_exactly_once import (
    LIVENESS,
    PARTITIONS,
    Copy,
    Pipeline,
    Worker,
    key_of,
    out_of_order,
    record,
    require_exactly_once,
)
from tests.support import Broker, Kafka, unique, wait_until

COPIERS = ("c0", "c1", "c2")
"""The copiers' ``group.instance.id``s: one consumer group, static members."""
PER_PARTITION = 1000
"""Inputs per partition (4 partitions)."""
SLEEP = 0.5
"""The most a copier's handler sleeps per input (a random 0..SLEEP s): slow enough that the
bounces land while the copiers are busy, a tenth of the input lasting several seconds."""
BROKER_BOUNCE_AT = 55
"""The percentage of the input committed at which the broker is bounced."""
NOIDA_RESTART = (
    "noida-db aborts every transaction open when it restarts but does not fence their "
    "producers: a producer that goes on with its transaction commits only the partitions it "
    "adds after the restart, and its records in the others stay pending until its next "
    "commit there"
)
NOIDA_JOIN = (
    "noida-db drops a member whose join it held longer than the member's session timeout "
    "right after telling it its assignment, and accepts a transaction's offsets sent with an "
    "earlier generation (no KIP-447 fencing): a copier that joins while another revokes for "
    "longer than that copies partitions their next owner copies too, and both commit "
    "(tests/faults/test_noida_groups.py)"
)
SESSION_TIMEOUT_MS = 30_000
"""The copiers' ``session.timeout.ms``: far above a revoke's longest wait (its records still
running, its commit) plus a heartbeat, so that no join is held past it (NOIDA_JOIN). A
bounced copier comes back at once with its ``group.instance.id``: nothing waits for a
session to expire."""
NOIDA_ROUNDS = (
    "noida-db sometimes never ends the round of rebalancing that members joining a group "
    "together start, a fraction of a second apart (about one try in ten with a 1 s "
    "heartbeat, rarer at the default 3 s): the group prepares it for good and nobody is "
    "assigned anything (tests/faults/test_noida_groups.py)"
)
NOIDA_FETCH = (
    "noida-db hands a read_committed fetch every aborted transaction of the partition, those "
    "that ended before the offset fetched too: the client then skips the records its producer "
    "commits afterwards"
)


@dataclass(frozen=True)
class Bounce:
    """A bounce at ``percent`` of the input committed: of a copier (by instance id) or of
    the broker, ``clean`` (SIGTERM) or ``hard`` (SIGKILL)."""

    percent: int
    target: str
    kind: str


def steps() -> list[tuple[int, str]]:
    """When to bounce what: a copier at every tenth of the input committed (10% to 90%, so
    that each copier is bounced three times), the broker once in between."""
    found = [(10 * step, "copier") for step in range(1, 3 * len(COPIERS) + 1)]
    return sorted([*found, (BROKER_BOUNCE_AT, "broker")])


def kind_of(name: str, bounced: int) -> str:
    """A copier's bounces alternate hard and clean (c0 and c2 start hard, c1 clean): every
    copier gets both."""
    return "hard" if (COPIERS.index(name) + bounced) % 2 == 0 else "clean"


def assignment(worker: Worker, topic: str) -> set[int]:
    """The input partitions a copier holds, as its log tells (assigned, revoked, lost)."""
    held: set[int] = set()
    named = re.compile(rf"{re.escape(topic)}\[(\d+)\]")
    text = worker.log.read_text(errors="replace") if worker.log.exists() else ""
    for line in text.splitlines():
        partitions = {int(p) for p in named.findall(line)}
        if " INFO assigned " in line:
            held = partitions  # (eager rebalancing: the whole assignment)
        elif " INFO revoked " in line or " WARNING lost " in line:
            held -= partitions
    return held


def next_copier(pipeline: Pipeline, copiers: dict[str, Worker], bounced: Counter[str]) -> str:
    """The copier to bounce next: of those bounced fewer than three times and with input left
    on their partitions, the one with the least input left per bounce still due, so that every
    bounce lands while its copier is busy. (Four partitions over three copiers: one copier
    holds two and works until the end; the others run out of input at about three quarters.)"""
    committed = pipeline.committed()

    def left(name: str) -> int:
        held = assignment(copiers[name], pipeline.source)
        return sum(pipeline.per_partition - committed.get(p, 0) for p in held)

    due = [name for name in COPIERS if bounced[name] < 3]
    busy = [name for name in due if left(name) > 0]
    return min(busy, key=lambda name: left(name) / (3 - bounced[name])) if busy else due[0]


class Timeline:
    """What happened when, for the reports of what a reader saw."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.events: list[tuple[float, str]] = []
        self.lock = threading.Lock()

    def note(self, what: str) -> None:
        with self.lock:
            self.events.append((time.monotonic() - self.started, what))

    def last(self) -> str:
        with self.lock:
            if not self.events:
                return "before any bounce"
            at, what = self.events[-1]
            return f"{what} (at {at:.1f} s)"

    def now(self) -> float:
        return time.monotonic() - self.started


class Checker:
    """Copies in the order a reader is handed them: notes an input copied a second time, and
    a key's copy out of input order."""

    def __init__(self) -> None:
        self.first: dict[tuple[int, int], Copy] = {}
        self.last_of_key: dict[bytes, int] = {}

    def add(self, copy: Copy) -> list[str]:
        faults = []
        earlier = self.first.setdefault(copy.source, copy)
        if earlier is not copy:
            faults.append(f"input {copy.source} copied twice: {earlier}, then {copy}")
        before = self.last_of_key.get(copy.key, -1)
        if copy.source[1] <= before:
            faults.append(f"key {copy.key!r}: input {copy.source} after input offset {before}")
        self.last_of_key[copy.key] = copy.source[1]
        return faults


def copy_of(message: Message) -> Copy:
    """An output record as :class:`Copy` (its value names its input, its header its run)."""
    partition, offset = message.value().decode().split(":")
    return Copy(
        (int(partition), int(offset)),
        message.key(),
        int(dict(message.headers() or []).get("run", b"0")),
        message.partition(),
        message.offset(),
    )


class LiveReader(threading.Thread):
    """A ``read_committed`` reader of the output topic for the whole run, as a downstream
    consumer reads it: it notes, the moment it is handed one, a second copy of an input or a
    key's copy out of input order, with the last bounce before it. (On noida-db it is not
    handed every committed copy: see NOIDA_FETCH.)"""

    def __init__(self, bootstrap: str, topic: str, timeline: Timeline) -> None:
        super().__init__(daemon=True, name="live-reader")
        self.topic = topic
        self.timeline = timeline
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": unique("live"),
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",  # (a reset would skip copies: an error instead)
            }
        )
        self.checker = Checker()
        self.copies: list[Copy] = []
        self.faults: list[str] = []
        self.errors: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def run(self) -> None:
        self.consumer.assign(
            [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        while not self.stopping.is_set():
            for message in self.consumer.consume(500, 0.2):
                error = message.error()
                if error is not None:
                    self.errors[error.name()] += 1  # (the broker away: it reconnects)
                    continue
                copy = copy_of(message)
                with self.lock:
                    self.copies.append(copy)
                    at = f"at {self.timeline.now():.1f} s, after {self.timeline.last()}"
                    self.faults.extend(f"{fault} ({at})" for fault in self.checker.add(copy))

    def count(self) -> int:
        with self.lock:
            return len(self.copies)

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
        self.consumer.close()


class Views(threading.Thread):
    """Over and over for the whole run, everything a new ``read_committed`` reader is handed
    from the start of the output topic to its end: each view must hold no input copied twice
    and every key's copies in input order, and keep every copy the view before it held (what
    was committed stays committed, across the broker's bounce too). A view ends at each
    partition's first end, read in one fetch (later fetches would be subject to
    NOIDA_FETCH)."""

    def __init__(self, bootstrap: str, topic: str, timeline: Timeline) -> None:
        super().__init__(daemon=True, name="views")
        self.bootstrap, self.topic, self.timeline = bootstrap, topic, timeline
        self.checked = 0
        self.faults: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        before: set[tuple[int, int]] = set()
        while not self.stopping.wait(0.2):
            at = f"at {self.timeline.now():.1f} s, after {self.timeline.last()}"
            copies = self.view()
            if copies is None:
                continue  # (the broker away)
            checker = Checker()
            faults = [fault for copy in copies for fault in checker.add(copy)]
            now = {(copy.partition, copy.offset) for copy in copies}
            gone = sorted(before - now)
            if gone:
                faults.append(f"{len(gone)} copies seen committed before are gone: {gone[:5]}")
            self.faults.extend(f"view {self.checked + 1}: {fault} ({at})" for fault in faults)
            self.checked += 1
            before = now

    def view(self) -> list[Copy] | None:
        reader = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": unique("view"),
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "enable.auto.commit": False,
            }
        )
        copies: list[Copy] = []
        ended: set[int] = set()
        try:
            reader.assign(
                [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
            )
            deadline = time.monotonic() + 10
            while len(ended) < PARTITIONS:
                if time.monotonic() > deadline or self.stopping.is_set():
                    return None
                for message in reader.consume(5000, 0.2):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            ended.add(message.partition())
                    elif message.partition() not in ended:
                        copies.append(copy_of(message))
        finally:
            reader.close()
        return copies

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def clean_stop(broker: LocalBroker, timeout: float = 30.0) -> None:
    """SIGTERM to the broker's process group, and wait until it has exited by itself (a
    SIGKILL would lose what it has not written: see the last test)."""
    process = broker.process
    assert process is not None and process.poll() is None, "the broker is not running"
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout)
    assert process.returncode == 0, f"the broker exited with {process.returncode}"
    broker.process = None


def unstable(pipeline: Pipeline) -> dict[int, tuple[int, int]]:
    """Per output partition whose last stable offset is below its end: (stable, end)."""
    found = {}
    for partition in range(PARTITIONS):
        tp = TopicPartition(pipeline.target, partition)
        _, stable = pipeline.probe.get_watermark_offsets(tp, timeout=5, cached=False)
        _, end = pipeline.uncommitted_probe.get_watermark_offsets(tp, timeout=5, cached=False)
        if stable < end:
            found[partition] = (stable, end)
    return found


def open_transactions(pipeline: Pipeline) -> list[str]:
    """Per output partition held back by an open transaction: where, and which runs (by
    copier and pid) wrote the records beyond its last stable offset."""
    names = {worker.pid: worker.instance for worker in pipeline.runs}
    found = []
    for partition, (stable, end) in unstable(pipeline).items():
        runs: Counter[int] = Counter()
        pipeline.uncommitted_probe.assign([TopicPartition(pipeline.target, partition, stable)])
        try:
            seen, deadline = stable, time.monotonic() + 10
            while seen < end - 1 and time.monotonic() < deadline:
                for message in pipeline.uncommitted_probe.consume(500, 0.2):
                    if message.error() is None:
                        seen = message.offset()
                        runs[int(dict(message.headers() or []).get("run", b"0"))] += 1
        finally:
            pipeline.uncommitted_probe.unassign()
        writers = ", ".join(f"{names.get(run, '?')} {run}: {n}" for run, n in runs.items())
        found.append(f"partition {partition} stable at {stable}, ends at {end} ({writers})")
    return found


@dataclass
class Bounced:
    """A bounce as it happened, for the figures."""

    bounce: Bounce
    committed_percent: float
    run: int = 0  # the pid of the copier bounced (0: the broker)
    back_after_s: float = 0.0  # until the copier was assigned again / commits resumed
    extra: dict[str, Any] = field(default_factory=dict)

    def figures(self, left_open: Counter[int]) -> dict[str, Any]:
        found: dict[str, Any] = {
            "target": self.bounce.target,
            "kind": self.bounce.kind,
            "planned_at_percent": self.bounce.percent,
            "committed_percent": round(self.committed_percent, 1),
            "back_after_s": round(self.back_after_s, 2),
            **self.extra,
        }
        if self.run:
            found["copies_its_last_transaction_left_uncommitted"] = left_open[self.run]
        else:
            found["copies_the_killed_copiers_left_uncommitted"] = sum(
                left_open[run] for run in self.extra["copiers_killed"]
            )
        return found


def last_transactions_left_uncommitted(
    committed: list[Copy], everything: list[Copy]
) -> Counter[int]:
    """Per run (by pid), the copies of its last transaction if that was never committed: the
    uncommitted copies beyond the run's last committed copy in each output partition (a run's
    transactions follow one another, so its last one's copies come after the others'; an
    earlier aborted transaction counts too in a partition none of its later commits wrote to,
    which a transaction of a few hundred copies over four partitions hardly leaves)."""
    last: dict[tuple[int, int], int] = {}
    for copy in committed:
        key = (copy.run, copy.partition)
        last[key] = max(last.get(key, -1), copy.offset)
    visible = {(copy.partition, copy.offset) for copy in committed}
    return Counter(
        copy.run
        for copy in everything
        if (copy.partition, copy.offset) not in visible
        and copy.offset > last.get((copy.run, copy.partition), -1)
    )


@pytest.fixture
def pipelines() -> Iterator[list[Pipeline]]:
    """Pipelines a test builds, their workers killed and probes closed at its end."""
    made: list[Pipeline] = []
    yield made
    for pipeline in made:
        pipeline.close()


def holding(pipeline: Pipeline, worker: Worker | None = None) -> None:
    """Wait (a few seconds at most) until an open transaction (of ``worker``'s) holds copies,
    so that a kill lands in one. (Right after a commit, which is when a tenth of the input
    has just been committed, the next transaction has no copies yet: its records run.)"""
    deadline = time.monotonic() + 5  # (the figures tell which kills hit one)
    while not pipeline.open_transaction(worker) and time.monotonic() < deadline:
        time.sleep(0.005)


def start_copiers(pipeline: Pipeline, names: Sequence[str]) -> dict[str, Worker]:
    """Start copiers: together where the broker ends every round of rebalancing, as a
    deployment starts its replicas; on noida-db one after the other, each once the one before
    it is assigned (NOIDA_ROUNDS)."""
    started: dict[str, Worker] = {}
    for name in names:
        worker = started[name] = pipeline.spawn(name)
        if not pipeline.kafka.broker.ends_every_round:
            wait_for_assignment(pipeline, worker, f"{name} assigned")
    return started


def wait_for_assignment(pipeline: Pipeline, worker: Worker, what: str) -> None:
    """Until ``worker`` logs an assignment (it must not exit meanwhile)."""
    wait_until(
        lambda: worker.process.poll() is not None or worker.logged("assigned") > 0,
        timeout=LIVENESS,
        what=what,
        explain=lambda: pipeline.report([worker]),
    )
    pipeline.alive(worker)


def bounce_copier(pipeline: Pipeline, copiers: dict[str, Worker], bounce: Bounce) -> Bounced:
    """Stop the copier (SIGTERM: it drains, commits and exits 0; or SIGKILL), start it again
    with the same instance id, and wait until it is assigned partitions."""
    worker = copiers[bounce.target]
    committed = pipeline.committed()
    bounced = Bounced(bounce, 100 * sum(committed.values()) / pipeline.total, run=worker.pid)
    held = sorted(assignment(worker, pipeline.source))
    bounced.extra["its_partitions"] = held
    bounced.extra["input_left_there"] = sum(pipeline.per_partition - committed[p] for p in held)
    if bounce.kind == "hard":
        holding(pipeline, worker)
        pipeline.kill(worker)
    else:
        pipeline.stop(worker)
    started = time.monotonic()
    fresh = copiers[bounce.target] = pipeline.spawn(bounce.target)
    wait_for_assignment(pipeline, fresh, f"{bounce.target} assigned again after its bounce")
    bounced.back_after_s = time.monotonic() - started
    return bounced


def bounce_broker(
    pipeline: Pipeline, broker: LocalBroker, copiers: dict[str, Worker], bounce: Bounce
) -> Bounced:
    """Kill every copier (SIGKILL: their open transactions stay open), stop the broker
    cleanly, start it again on the same port and data directory, start the copiers again and
    wait until the group commits again; the group's commits must have survived. (The
    copiers are down across the restart: noida-db aborts the transactions open when it
    restarts without fencing their producers, see NOIDA_RESTART.)"""
    bounced = Bounced(bounce, 100 * pipeline.done() / pipeline.total)
    started = time.monotonic()
    holding(pipeline)
    for worker in copiers.values():
        bounced.extra.setdefault("copiers_killed", []).append(worker.pid)
        pipeline.kill(worker)
    before = pipeline.committed()
    stopped = time.monotonic()
    clean_stop(broker)
    broker.start()
    bounced.extra["down_s"] = round(time.monotonic() - stopped, 2)
    kept = pipeline.committed()
    forgotten = {p: (before[p], kept[p]) for p in before if kept[p] < before[p]}
    assert not forgotten, f"the broker forgot commits over its clean bounce: {forgotten}"
    copiers.update(start_copiers(pipeline, COPIERS))
    pipeline.wait_for_commits(sum(kept.values()), list(copiers.values()), timeout=LIVENESS)
    bounced.back_after_s = time.monotonic() - started
    return bounced


# ---- the tests -----------------------------------------------------------------------------


def test_three_copiers_in_a_group_bounced_with_the_broker_copy_exactly_once(
    local_broker: LocalBroker, broker: Broker, tmp_path: Path, pipelines: list[Pipeline]
) -> None:
    """The module's scenario: three copiers bounced three times each and the broker once,
    exactly once throughout."""
    require_exactly_once(broker)
    if not local_broker.keeps_data:
        pytest.skip(f"{local_broker.kind} keeps nothing across a restart: no broker bounce")
    kafka = Kafka(local_broker.bootstrap, broker)
    pipeline = Pipeline(
        kafka,
        tmp_path,
        "transactional",
        per_partition=PER_PARTITION,
        sleep=SLEEP,
        settings=[f"session.timeout.ms={SESSION_TIMEOUT_MS}"],
    )
    pipelines.append(pipeline)
    timeline = Timeline()
    reader = LiveReader(kafka.bootstrap, pipeline.target, timeline)
    views = Views(kafka.bootstrap, pipeline.target, timeline)
    reader.start()
    views.start()
    try:
        copiers = start_copiers(pipeline, COPIERS)
        history: list[Bounced] = []
        bounced: Counter[str] = Counter()
        for percent, what in steps():
            wait_for_progress(pipeline, pipeline.total * percent // 100, copiers, local_broker)
            assert pipeline.done() < pipeline.total, (
                f"every input was committed before the bounce at {percent}%: the copiers are "
                "too fast for this test"
            )
            if what == "broker":
                bounce = Bounce(percent, "broker", "clean")
            else:
                name = next_copier(pipeline, copiers, bounced)
                bounce = Bounce(percent, name, kind_of(name, bounced[name]))
                bounced[name] += 1
            timeline.note(f"{bounce.kind} bounce of {bounce.target} at {percent}%")
            if what == "broker":
                history.append(bounce_broker(pipeline, local_broker, copiers, bounce))
            else:
                history.append(bounce_copier(pipeline, copiers, bounce))
        timeline.note("the last bounce done")
        seconds = pipeline.finish(list(copiers.values()))
        timeline.note("every copier stopped")
        # No transaction may still hold the output back.
        hanging: list[str] = []
        if not poll(lambda: not unstable(pipeline), timeout=30):
            hanging = open_transactions(pipeline)
        committed = pipeline.read("read_committed")
        everything = pipeline.read("read_uncommitted")
        poll(lambda: reader.count() >= len(committed), timeout=5)  # (it may lack some)
        checked = views.checked
        poll(lambda: views.checked >= checked + 2, timeout=30)  # (views of the whole output)
    finally:
        reader.stop()
        views.stop()

    counts = Counter(copy.source for copy in committed)
    duplicates = sorted(source for source, n in counts.items() if n > 1)
    missing = sorted(pipeline.inputs() - set(counts))
    strange = sorted(set(counts) - pipeline.inputs())
    wrong_keys = [copy for copy in committed if copy.key != key_of(*copy.source)]
    disorder = out_of_order(committed)
    left_open = last_transactions_left_uncommitted(committed, everything)
    final = {(copy.partition, copy.offset) for copy in committed}
    live = {(copy.partition, copy.offset) for copy in reader.copies}
    hard = [b for b in history if b.bounce.target != "broker" and b.bounce.kind == "hard"]
    figures = pipeline.figures(
        copiers=len(COPIERS),
        bounces_clean=sum(
            b.bounce.target != "broker" and b.bounce.kind == "clean" for b in history
        ),
        bounces_hard=len(hard),
        bounces_per_copier={
            name: dict(Counter(b.bounce.kind for b in history if b.bounce.target == name))
            for name in COPIERS
        },
        hard_bounces_that_hit_open_transactions=sum(left_open[b.run] > 0 for b in hard),
        broker_bounces=sum(b.bounce.target == "broker" for b in history),
        aborted_copies_seen=len(everything) - len(committed),
        outputs=len(committed),
        duplicates=len(duplicates),
        missing=len(missing),
        out_of_order=len(disorder),
        faults_seen_live=len(reader.faults) + len(views.faults),
        committed_views_checked=views.checked,
        live_reader_copies=len(live),
        live_reader_not_handed=len(final - live),  # NOIDA_FETCH
        transactions_left_open=hanging,
        finished_after_last_bounce_s=round(seconds, 1),
        bounces=[b.figures(left_open) for b in history],
    )
    record("3 copiers in a group bounced with the broker, exactly once", figures)

    assert not hanging, (
        "transactions still hold the output back after every copier stopped: "
        + "; ".join(hanging)
        + "\nruns: "
        + ", ".join(f"{w.instance} {w.pid}" for w in pipeline.runs)
    )
    seen_live = reader.faults + views.faults
    assert not seen_live, (
        f"read_committed readers were handed {len(seen_live)} faults during the run:\n"
        + "\n".join(seen_live[:10])
    )
    assert not missing, f"{len(missing)} inputs have no committed copy, e.g. {missing[:10]}"
    assert not duplicates, (
        f"{len(duplicates)} inputs have more than one committed copy "
        f"({pipeline.why(duplicates)}), e.g. "
        f"{[(s, [c for c in committed if c.source == s]) for s in duplicates[:3]]}"
    )
    assert not strange, f"copies of inputs that do not exist: {strange[:10]}"
    assert not wrong_keys, f"copies with another key than their input's: {wrong_keys[:5]}"
    assert not disorder, f"copies of a key out of input order: {disorder[:5]}"
    assert live <= final, f"the live reader was handed copies never committed: {live - final}"
    assert views.checked >= 10, f"only {views.checked} views of the output were checked"
    assert figures["aborted_copies_seen"] > 0, (
        "a read_uncommitted reader saw no more than the committed copies: no bounce hit a "
        "transaction with copies in it"
    )


def wait_for_progress(
    pipeline: Pipeline, goal: int, copiers: dict[str, Worker], broker: LocalBroker
) -> None:
    """Until the group has committed ``goal`` inputs (the copiers alive); on a timeout, what
    the copiers and the broker logged."""
    try:
        pipeline.wait_for_commits(goal - 1, list(copiers.values()), timeout=LIVENESS)
    except AssertionError as exc:
        logs = "\n".join(f"--- {w.instance} ({w.pid}):\n{w.stderr(15)}" for w in copiers.values())
        tail = broker.log_path.read_text(errors="replace").splitlines()[-15:]
        raise AssertionError(
            f"{exc}: committed {pipeline.committed()}, the goal {goal}\n{logs}\n"
            "--- the broker:\n" + "\n".join(tail)
        ) from None


def poll(condition: Callable[[], bool], timeout: float) -> bool:
    """Whether ``condition`` came true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


RECORDS = 20_000


def produce_acknowledged(bootstrap: str, topic: str) -> int:
    """Produce RECORDS records with ``acks=all``; returns how many were acknowledged."""
    acknowledged = 0

    def delivered(error: Any, _: Any) -> None:
        nonlocal acknowledged
        acknowledged += error is None

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(RECORDS):
        while True:
            try:
                producer.produce(topic, value=b"%d" % i, partition=0, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(30) == 0
    return acknowledged


def produce_until_killed(broker: LocalBroker, topic: str) -> set[bytes]:
    """Produce with ``acks=all`` without pause, and SIGKILL the broker as soon as RECORDS
    records were acknowledged (acknowledgements still arriving); returns the values
    acknowledged."""
    acknowledged: set[bytes] = set()

    def delivered(error: Any, message: Any) -> None:
        if error is None:
            acknowledged.add(message.value())

    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5})
    i = 0
    deadline = time.monotonic() + 120
    while len(acknowledged) < RECORDS:
        assert time.monotonic() < deadline, f"{len(acknowledged)} of {RECORDS} acknowledged"
        try:
            producer.produce(topic, value=b"%d" % i, partition=0, on_delivery=delivered)
            i += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    broker.kill()
    producer.purge()  # (what was not acknowledged is dropped, not retried after the restart)
    producer.flush(10)
    return acknowledged


def records_kept(kafka: Kafka, topic: str) -> set[bytes]:
    """The distinct values the topic holds (none: it is gone)."""
    if topic not in kafka.admin.list_topics(timeout=10).topics:
        return set()
    reader = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": unique("kept"),
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    values: set[bytes] = set()
    try:
        low, high = reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        if high <= low:
            return values
        reader.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, f"no end of {topic}"
            for message in reader.consume(5000, 0.5):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return values
                    continue
                values.add(message.value())
    finally:
        reader.close()


def test_noida_loses_acknowledged_records_when_killed_and_keeps_them_when_stopped(
    local_broker: LocalBroker, broker: Broker
) -> None:
    """A quirk of noida-db 0.2, on which the broker bounce above relies: it acknowledges
    records (``acks=all``) before it writes them to its data directory, which it does when it
    stops and otherwise within about half a second (records acknowledged a quarter of a
    second before a SIGKILL were lost, half a second before kept). Records acknowledged
    survive a clean stop (SIGTERM to its process group); killed (SIGKILL) while
    acknowledgements arrive, it loses the latest ones. This fails once noida-db keeps every
    record it acknowledged: then a hard broker bounce can join the clean one in the test
    above."""
    if broker.name != "noida":
        pytest.skip(f"a fact about noida-db ({broker.name} is not)")
    kafka = Kafka(local_broker.bootstrap, broker)

    stopped = kafka.create_topic(1)
    assert produce_acknowledged(kafka.bootstrap, stopped) == RECORDS
    clean_stop(local_broker)
    local_broker.start()
    kept = records_kept(kafka, stopped)
    assert len(kept) == RECORDS, (
        f"noida-db lost acknowledged records over a clean stop: {len(kept)} of {RECORDS} kept"
    )

    killed = kafka.create_topic(1)
    acknowledged = produce_until_killed(local_broker, killed)
    local_broker.start()
    lost = acknowledged - records_kept(kafka, killed)
    assert lost, (
        f"noida-db kept all {len(acknowledged)} acknowledged records over a SIGKILL: the "
        "quirk this test documents has changed (the broker bounce in the group-mode test "
        "above may now be hard too)"
    )


def test_noida_aborts_the_transactions_open_at_a_restart_without_fencing_them(
    local_broker: LocalBroker, broker: Broker
) -> None:
    """A quirk of noida-db 0.2 that keeps the copiers of the group-mode test down while the
    broker restarts (NOIDA_RESTART). A producer's transaction holds a record in partition 0
    when the broker restarts cleanly: the restart aborts it, but the producer is not fenced
    (Kafka keeps the transaction, or bumps the producer's epoch so that it cannot go on). The
    producer goes on, writes to partitions 0 and 1 and commits without an error: partition
    1's record becomes visible, partition 0's stays pending (holding back read_committed
    readers) until the producer's next commit there. This fails once noida-db keeps the
    transaction or fences the producer: then the copiers can stay up across the bounce."""
    if broker.name != "noida":
        pytest.skip(f"a fact about noida-db ({broker.name} is not)")
    kafka = Kafka(local_broker.bootstrap, broker)
    topic = kafka.create_topic(2)
    producer = kafka.producer(**{"transactional.id": unique("restart")})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"before", partition=0)
    assert producer.flush(30) == 0
    clean_stop(local_broker)
    local_broker.start()
    assert stable_and_end(kafka, topic, 0) == (2, 2), (
        "the restart did not abort the open transaction"
    )

    producer.produce(topic, value=b"after-0", partition=0)
    producer.produce(topic, value=b"after-1", partition=1)
    assert producer.flush(30) == 0
    try:
        producer.commit_transaction(30)
    except KafkaException as exc:
        pytest.fail(
            f"noida-db fenced the producer whose transaction its restart aborted ({exc}): the "
            "quirk this test documents is gone; the copiers may stay up across the broker "
            "bounce in the group-mode test"
        )
    seen = {p: [m.value() for m in read_committed(kafka, topic, p)] for p in (0, 1)}
    held = stable_and_end(kafka, topic, 0)
    assert seen == {0: [], 1: [b"after-1"]} and held == (2, 3), (
        f"noida-db committed a transaction it had aborted at its restart otherwise than "
        f"documented: read_committed sees {seen}, partition 0's stable offset and end are "
        f"{held}: check whether the quirk is gone"
    )
    producer.begin_transaction()
    producer.produce(topic, value=b"next", partition=0)
    producer.commit_transaction(30)
    assert [m.value() for m in read_committed(kafka, topic, 0)] == [b"after-0", b"next"], (
        "the pending record was not committed with the producer's next transaction there"
    )


def stable_and_end(kafka: Kafka, topic: str, partition: int) -> tuple[int, int]:
    """A partition's last stable offset and its end."""
    found = []
    for isolation in ("read_committed", "read_uncommitted"):
        reader = Consumer(
            {
                "bootstrap.servers": kafka.bootstrap,
                "group.id": unique("offsets"),
                "isolation.level": isolation,
            }
        )
        try:
            tp = TopicPartition(topic, partition)
            found.append(reader.get_watermark_offsets(tp, timeout=10, cached=False)[1])
        finally:
            reader.close()
    return found[0], found[1]


def read_committed(kafka: Kafka, topic: str, partition: int, start: int = 0) -> list[Message]:
    """Every record a read_committed reader is handed from ``start`` in a partition, up to
    its end."""
    reader = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": unique("committed"),
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    found = []
    try:
        reader.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for message in reader.consume(100, 0.5):
                error = message.error()
                if error is None:
                    found.append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    return found
        raise AssertionError(f"no end of {topic}[{partition}] in 30 s")
    finally:
        reader.close()


def test_noida_hides_what_a_producer_commits_after_an_abort_from_a_later_fetch(
    local_broker: LocalBroker, broker: Broker
) -> None:
    """A quirk of noida-db 0.2 that keeps the group-mode test from asking its live reader for
    every committed copy (NOIDA_FETCH). A producer aborts a transaction (offset 0, its marker
    at 1), then commits one (offset 2, its marker at 3). A read_committed reader from offset 0
    or 1 is handed the committed record; one from offset 2, its own offset, is not: noida-db
    names the aborted transaction in the fetch's answer though it ended before offset 2, and
    the client skips the producer's records until an abort marker that never comes (Kafka
    names only the aborted transactions that overlap the range fetched). So a reader that
    fetches again after a producer's abort, or starts after it (a consumer group resuming from
    its commit), is never handed that producer's later records. This fails once noida-db
    answers as Kafka does: then the live reader can be asked for every committed copy."""
    if broker.name != "noida":
        pytest.skip(f"a fact about noida-db ({broker.name} is not)")
    kafka = Kafka(local_broker.bootstrap, broker)
    topic = kafka.create_topic(1)
    producer = kafka.producer(**{"transactional.id": unique("aborts")})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted", partition=0)
    assert producer.flush(30) == 0
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed", partition=0)
    producer.commit_transaction(30)
    handed = {
        start: [(m.offset(), m.value()) for m in read_committed(kafka, topic, 0, start)]
        for start in (0, 1, 2)
    }
    assert handed[0] == handed[1] == [(2, b"committed")], handed
    assert handed[2] == [], (
        f"noida-db handed a reader from offset 2 {handed[2]}: the quirk this test documents is "
        "gone; the group-mode test's live reader can be asked for every committed copy"
    )
