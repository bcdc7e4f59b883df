"""Gate benchmarks, on noida-db (``--broker tansu`` for Tansu).

1. **http**: ``GET /ready`` under concurrent load (wrk) next to a trivial FastAPI endpoint
   served by the same uvicorn process in the same run: requests per second, p99 latency, and
   their ratio (target: /ready reaches at least 0.8 of the trivial endpoint's throughput).
2. **evaluation**: the evaluation alone on polls built in memory, for 50, 200 and
   ``--groups`` dependency groups x 64 partitions: cost per group-partition when nothing
   moves, when a tenth of the groups is behind, and when records arrive everywhere (targets
   at 1,000 groups: p50 <= 50 ms when nothing moves, cost per group-partition within 1.2x of
   that at 50 groups), what receiving a state from the child process costs, and what
   ``/status`` (first ask of a state, and again) and ``/status/{gate}`` (built and encoded)
   cost the serving process on it.
3. **poll**: whole poll cycles (the poller's admin calls, then the evaluation) for
   ``--groups`` groups x 64 partitions, interleaved with the bare admin calls any poller must
   make (targets: p50 within 1.2x of the bare calls; <= 100 ms at 200 groups, <= 500 ms at
   1,000); with ``--isolated``, both in the child process as ``gate serve`` runs them; with
   ``--idle-poll-interval``, how many groups each cycle still reads.
4. **ready**: ``/ready`` p99 under load from a service that also polls and evaluates a gate
   of ``--groups`` groups every second, against one serving the small gate alone, first while
   nothing moves in the fleet, then while records arrive on all its partitions (target:
   within 1.2x); ``--poller-niceness N`` sets the servers' ``poller_niceness``.

Run: ``make bench`` or ``python -m bench.gate_bench [--quick] [--groups N] [--broker noida|tansu] [--isolated]
[--idle-poll-interval SECONDS] [--poller-niceness N] [--only http|evaluation|poll|ready]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from prometheus_client import CollectorRegistry, generate_latest
from rich.progress import track

from bench._report import console, summary_ms, table, write
from gate import GateEvaluator, GateState, PollResult
from gate._config import StatusSettings
from gate._history import GateHistory, point_of
from gate._isolated import IsolatedPoller
from gate._local import LocalBroker, LocalNoida, free_port
from gate._metrics import GateMetrics
from gate._poller import OffsetPoller
from gate._report import gate_status, gate_summary


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    consumer.commit(
        offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
    )
    consumer.close()


def wrk(url: str, seconds: int, connections: int) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {
        "rps": rps,
        "p99_ms": float(p99.group(1)) * scale,
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
    }


def wait_answering(url: str, server: subprocess.Popen[Any], timeout: float) -> None:
    """Until ``url`` answers 200; exits if the benchmark's ``server`` process ended first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            raise SystemExit("the benchmark server did not come up")
        time.sleep(0.1)


@contextmanager
def gate_server(
    bootstrap: str, gates: dict[str, tuple[str, list[str]]], **settings: Any
) -> Iterator[str]:
    """``gate serve`` (plus a trivial endpoint) in its own process for ``gates`` (name: topic,
    dependency groups), with further top-level ``settings``; yields its base URL once it
    answers."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gate.yaml"
        config.write_text(
            json.dumps(
                {
                    "kafka": {"bootstrap.servers": bootstrap},
                    "poll_interval_ms": 1000,
                    "gates": {
                        name: {"topics": [topic], "depends_on": groups}
                        for name, (topic, groups) in gates.items()
                    },
                    # One load generator on one address: a limit it never reaches, enforced.
                    "http": {"rate_limit_per_s": 1000000},
                    **settings,
                }
            )
        )
        server = subprocess.Popen(
            [sys.executable, "-m", "bench._gate_server", str(config), str(port)]
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_answering(f"{base}/watermarks/a", server, 120)
            yield base
        finally:
            server.terminate()
            server.wait(10)


def small_gate(bootstrap: str) -> tuple[str, list[str]]:
    topic = "bench-http"
    create_topic(bootstrap, topic, 12)
    for group in ("dep-b", "dep-c"):
        commit(bootstrap, group, topic, {p: 1000 for p in range(12)})
    return topic, ["dep-b", "dep-c"]


def http_bench(bootstrap: str, seconds: int, rounds: int) -> dict:
    topic, groups = small_gate(bootstrap)
    with gate_server(bootstrap, {"a": (topic, groups)}) as base:
        urls = {
            "trivial": f"{base}/bench/trivial",
            "/ready (released)": f"{base}/ready?gate=a&topic={topic}&partition=3&offset=500",
            "/ready (held, 425)": f"{base}/ready?gate=a&topic={topic}&partition=3&offset=5000",
        }
        wrk(urls["trivial"], 2, 32)  # warm up
        results: dict[str, list[dict[str, float]]] = {name: [] for name in urls}
        for _ in track(range(rounds), description="wrk rounds", console=console):
            for name, url in urls.items():  # interleaved, so drift hits all alike
                results[name].append(wrk(url, seconds, 32))
    best = {name: max(runs, key=lambda r: r["rps"]) for name, runs in results.items()}
    trivial = best["trivial"]["rps"]
    rows = []
    for name, result in best.items():
        ratio = result["rps"] / trivial
        rows.append([name, result["rps"], result["p99_ms"], round(ratio, 3)])
    table(
        f"HTTP: wrk -t1 -c32, {seconds}s x {rounds} rounds (best round), one uvicorn worker",
        ["endpoint", "requests/s", "p99 ms", "ratio to trivial"],
        rows,
    )
    return {
        "endpoints": best,
        "ratio_ready_released": best["/ready (released)"]["rps"] / trivial,
        "ratio_ready_held": best["/ready (held, 425)"]["rps"] / trivial,
        "target_ratio": 0.8,
    }


class Arrivals:
    """Records arriving on every partition of a topic, a few times a second, in a thread: the
    fleet's end offsets move at every poll, so every group is evaluated again at every poll."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic, self.partitions = topic, partitions
        self.running = threading.Event()
        self.thread = threading.Thread(target=self._produce, daemon=True)

    def _produce(self) -> None:
        while self.running.is_set():
            for p in range(self.partitions):
                self.producer.produce(self.topic, b"x", partition=p)
            self.producer.flush(5)
            time.sleep(0.2)

    def __enter__(self) -> Arrivals:
        self.running.set()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.running.clear()
        self.thread.join(10)


def cycle_totals(url: str) -> dict[str, float]:
    """The service's poll and evaluation durations so far, summed, and their count."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    totals = {}
    for name in ("poll_duration_seconds", "evaluation_duration_seconds"):
        for suffix in ("sum", "count"):
            found = re.search(rf"^gate_{name}_{suffix} (\S+)$", text, re.MULTILINE)
            totals[f"{name}_{suffix}"] = float(found.group(1)) if found else 0.0
    return totals


def ready_under_cycles(
    bootstrap: str,
    fleet: tuple[str, list[str]],
    seconds: int,
    rounds: int,
    niceness: int | None = None,
) -> dict:
    """``/ready`` under load from a gate service that also polls and evaluates a gate of
    ``fleet``'s groups every second, against one that serves the same small gate alone: both
    run at once, measured in interleaved rounds. First while nothing moves in the fleet (its
    groups are caught up and skipped), then while records arrive on every partition of its
    topic (every group is evaluated again at every poll). ``niceness``: the servers'
    ``poller_niceness`` (None: the default)."""
    settings = {} if niceness is None else {"poller_niceness": niceness}
    small = small_gate(bootstrap)
    query = f"/ready?gate=a&topic={small[0]}&partition=3&offset=500"
    cycles = f"{len(fleet[1])}-group cycles"
    with (
        gate_server(bootstrap, {"a": small}, **settings) as alone,
        gate_server(bootstrap, {"a": small, "fleet": fleet}, **settings) as busy,
    ):
        deadline = time.monotonic() + 120
        while httpx.get(f"{busy}/watermarks/fleet", timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise SystemExit("the fleet gate had no snapshot after 120 s")
            time.sleep(0.5)
        wrk(alone + query, 2, 32)  # warm up
        results: dict[str, list[dict[str, float]]] = {}
        phases: dict[str, dict[str, float]] = {}
        for phase in ("nothing moves", "records arriving"):
            arrivals = Arrivals(bootstrap, fleet[0], 64) if phase == "records arriving" else None
            with arrivals or contextlib.nullcontext():
                if arrivals is not None:
                    time.sleep(3)  # polls see the ends move
                before = cycle_totals(busy)
                for _ in track(range(rounds), description=f"wrk rounds, {phase}", console=console):
                    for name, url in (("no cycles", alone), (f"{cycles}, {phase}", busy)):
                        results.setdefault(name, []).append(wrk(url + query, seconds, 32))
                after = cycle_totals(busy)
            cycles_run = (
                after["poll_duration_seconds_count"] - before["poll_duration_seconds_count"]
            )
            phases[phase] = {
                "cycles": cycles_run,
                "poll_mean_ms": round(
                    (after["poll_duration_seconds_sum"] - before["poll_duration_seconds_sum"])
                    / max(cycles_run, 1)
                    * 1000,
                    1,
                ),
                "evaluation_mean_ms": round(
                    (
                        after["evaluation_duration_seconds_sum"]
                        - before["evaluation_duration_seconds_sum"]
                    )
                    / max(cycles_run, 1)
                    * 1000,
                    1,
                ),
            }
    table(
        f"The {cycles} meanwhile (the busy server's metrics)",
        ["phase", "cycles", "poll mean ms", "evaluation mean ms"],
        [[p, v["cycles"], v["poll_mean_ms"], v["evaluation_mean_ms"]] for p, v in phases.items()],
    )
    median = {
        name: {
            "rps": statistics.median(r["rps"] for r in runs),
            "p99_ms": statistics.median(r["p99_ms"] for r in runs),
        }
        for name, runs in results.items()
    }
    calm = median["no cycles"]["p99_ms"]
    ratios = {
        phase: round(median[f"{cycles}, {phase}"]["p99_ms"] / calm, 3)
        for phase in ("nothing moves", "records arriving")
    }
    table(
        f"/ready while the same process polls {len(fleet[1])} groups every second "
        f"(wrk -t1 -c32, {seconds}s x {rounds} rounds per phase, medians)",
        ["server", "requests/s", "p99 ms"],
        [[name, r["rps"], r["p99_ms"]] for name, r in median.items()],
    )
    for phase, ratio in ratios.items():
        console.print(f"/ready p99 with cycles ({phase}) / without: {ratio:.2f} (target <= 1.2)")
    return {
        "poller_niceness": niceness,
        "servers": median,
        "cycles": phases,
        "runs": results,
        "p99_ratio": ratios["nothing moves"],
        "p99_ratio_records_arriving": ratios["records arriving"],
    }


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_names(groups: int) -> list[str]:
    return [f"dep-{i:04d}" for i in range(groups)]


def commit_groups(bootstrap: str, topic: str, groups: int, partitions: int) -> list[str]:
    names = group_names(groups)
    with ThreadPoolExecutor(8) as pool:
        done = [
            pool.submit(commit, bootstrap, g, topic, {p: 100 + i + p for p in range(partitions)})
            for i, g in enumerate(names)
        ]
        for future in track(done, description=f"committing {groups} groups", console=console):
            future.result()
    return names


class BareCalls:
    """The admin calls any poller must make, and nothing else: one offset request per group,
    all issued at once, plus the end offsets; answers awaited, not read."""

    def __init__(self, bootstrap: str, topic: str, names: list[str], partitions: int) -> None:
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        wanted = [TopicPartition(topic, p) for p in range(partitions)]
        self.requests = [[ConsumerGroupTopicPartitions(g, wanted)] for g in names]
        self.ends = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}

    def __call__(self) -> None:
        futures = [
            f
            for request in self.requests
            for f in self.admin.list_consumer_group_offsets(request, request_timeout=10).values()
        ]
        futures += self.admin.list_offsets(self.ends, request_timeout=10).values()
        wait(futures, timeout=11)
        for future in futures:
            future.result(0)


def poll_bench(
    broker: LocalBroker,
    name: str,
    groups: int,
    partitions: int,
    cycles: int,
    isolated: bool = False,
    idle_interval: float = 0.0,
) -> dict:
    """Whole poll cycles (the poller's admin calls, then the evaluation) interleaved with the
    bare admin calls, on a topic nobody writes to (as most of a fleet's groups: caught up)."""
    bootstrap = broker.bootstrap
    topic = f"bench-poll-{groups}"
    create_topic(bootstrap, topic, partitions)
    names = commit_groups(bootstrap, topic, groups, partitions)
    # ``gate serve`` runs the admin client in a child process (IsolatedPoller); the SDK's
    # embedded source with callables in its configuration runs it in-process (OffsetPoller).
    poller = (IsolatedPoller if isolated else OffsetPoller)(
        {"bootstrap.servers": bootstrap},
        {g: [topic] for g in names},
        request_timeout=10,
        idle_interval=idle_interval,
    )
    bare = BareCalls(bootstrap, topic, names, partitions)
    evaluator = GateEvaluator("a", [topic], names)
    child = poller if isinstance(poller, IsolatedPoller) else None
    if child is not None:
        child.evaluate({"a": evaluator})  # as ``gate serve`` does: evaluated in the child

    def evaluated_state(poll: PollResult) -> tuple[GateState, float]:
        """The poll's state, and the seconds the child spent evaluating it (0: here)."""
        if child is None:
            return evaluator.observe(poll), 0.0
        state = child.evaluated["a"]
        assert isinstance(state, GateState), state
        return state, child.evaluation

    for _ in range(3):  # warm up (metadata, connections)
        evaluated_state(poller.poll())
        bare()
    total, admin, evaluate, baseline, evaluated, read = [], [], [], [], [], []
    assert broker.process is not None
    broker_cpu = cpu_seconds(broker.process.pid)
    poll_cpu = evaluate_cpu = 0.0
    for _ in track(range(cycles), description="poll cycles", console=console):
        started = time.perf_counter()
        bare()
        baseline.append(time.perf_counter() - started)
        cpu = time.process_time()
        started = time.perf_counter()
        poll = poller.poll()
        polled, polled_cpu = time.perf_counter(), time.process_time()
        state, in_child = evaluated_state(poll)
        done = time.perf_counter()
        poll_cpu += polled_cpu - cpu
        evaluate_cpu += time.process_time() - polled_cpu
        assert not poll.errors, poll.errors
        assert len(state.partitions) == partitions
        total.append(done - started)
        admin.append(polled - started - in_child)
        evaluate.append(done - polled + in_child)
        evaluated.append(state.evaluated)
        read.append(len(poll.committed) - len(poll.carried))
    if isinstance(poller, IsolatedPoller):
        poller.close()
    stats = {
        "cycle": summary_ms(total),
        "admin_calls": summary_ms(admin),
        "evaluate": summary_ms(evaluate),
        "bare_admin_calls": summary_ms(baseline),
    }
    broker_ms = (cpu_seconds(broker.process.pid) - broker_cpu) / cycles / 2 * 1000
    table(
        f"Poll cycle on {name}{' (admin client and evaluation in a child process)' if isolated else ''}: "
        f"{groups} groups x {partitions} partitions, {cycles} "
        "cycles, interleaved with the bare admin calls",
        ["part", "p50 ms", "p99 ms", "max ms"],
        [[name, s["p50_ms"], s["p99_ms"], s["max_ms"]] for name, s in stats.items()],
    )
    ratio = stats["cycle"]["p50_ms"] / stats["bare_admin_calls"]["p50_ms"]
    cpu = {
        "broker_cpu_ms_per_cycle": round(broker_ms, 1),
        "gate_poll_cpu_ms_per_cycle": round(poll_cpu / cycles * 1000, 1),
        "gate_evaluate_cpu_ms_per_cycle": round(evaluate_cpu / cycles * 1000, 1),
    }
    table(
        "CPU per cycle (where the time goes)",
        ["process", "CPU ms per cycle"],
        [
            [
                "broker (answering the offset requests, mean of both)",
                cpu["broker_cpu_ms_per_cycle"],
            ],
            ["gate: poll (incl. librdkafka threads)", cpu["gate_poll_cpu_ms_per_cycle"]],
            ["gate: evaluation", cpu["gate_evaluate_cpu_ms_per_cycle"]],
        ],
    )
    console.print(
        f"whole cycle / bare admin calls (p50): {ratio:.2f}; groups evaluated again per "
        f"cycle (median): {statistics.median(evaluated):.0f} of {groups}; groups read per "
        f"cycle (mean): {statistics.mean(read):.1f}"
        + (f" (idle groups read every {idle_interval:g} s)" if idle_interval else "")
    )
    return {
        "broker": name,
        "groups": groups,
        "partitions": partitions,
        **stats,
        **cpu,
        "cycle_vs_bare": round(ratio, 3),
        "groups_evaluated_median": statistics.median(evaluated),
        "groups_read_mean": statistics.mean(read),
        "idle_interval_s": idle_interval,
    }


def synthetic_poll(
    at: float, names: list[str], partitions: int, end: int, behind: int
) -> PollResult:
    """Every group at the end of every partition but every ``behind``-th, 50 records short."""
    return PollResult(
        started_at=at,
        finished_at=at,
        partition_counts={"t": partitions},
        end_offsets={("t", p): end for p in range(partitions)},
        committed={
            g: {
                ("t", p): end - (50 if behind and i % behind == 0 else 0) for p in range(partitions)
            }
            for i, g in enumerate(names)
        },
        monotonic=at,
    )


EVALUATION_SCENARIOS = {
    # name: (records arriving per cycle, every how many groups one is behind; 0: none)
    "caught up, nothing moves": (0, 0),
    "a tenth of the groups behind": (0, 10),
    "records arrive on every partition": (10, 0),
}


DEFAULT_SERIES_LIMIT = StatusSettings().metrics_group_partitions_max


def scrape_seconds(state: GateState, limit: int) -> tuple[float, int]:
    """What a Prometheus scrape of one gate in ``state`` costs (seconds, bytes), with its
    series per group and partition limited to ``limit`` group-partitions."""
    status = types.SimpleNamespace(metrics_group_partitions_max=limit)
    topics = sorted({topic for topic, _ in state.partitions})
    service = types.SimpleNamespace(
        store=types.SimpleNamespace(gates=[state.gate], latest=lambda _: state),
        config=types.SimpleNamespace(
            status=status, gates={state.gate: types.SimpleNamespace(topics=topics)}
        ),
        failing={},
        answered_at=time.monotonic(),
        redis=None,
    )
    registry = CollectorRegistry()
    GateMetrics(registry).watch(service)  # type: ignore[arg-type]
    started = time.perf_counter()
    size = len(generate_latest(registry))
    return time.perf_counter() - started, size


def evaluation_bench(sizes: list[int], partitions: int, cycles: int) -> dict:
    """The evaluation alone, on polls built in memory: its cost per group-partition by fleet
    size when nothing moves (caught-up groups are not evaluated again), when a tenth of the
    groups is behind (those are, at every poll: their status can change with time alone), and
    when records arrive on every partition at every poll (every group is evaluated again)."""
    results: dict[str, dict[str, Any]] = {}
    rows = []
    for scenario, (arriving, behind) in EVALUATION_SCENARIOS.items():
        by_size: dict[str, Any] = {}
        for groups in sizes:
            names = group_names(groups)
            evaluator = GateEvaluator("a", ["t"], names)
            polls = [
                synthetic_poll(1000.0 + step, names, partitions, 100 + step * arriving, behind)
                for step in range(cycles + 3)
            ]
            times: list[float] = []
            states: deque[GateState] = deque(maxlen=5)
            for i, poll in enumerate(polls):
                started = time.perf_counter()
                states.append(evaluator.observe(poll))
                if i >= 3:  # the first polls evaluate everything
                    times.append(time.perf_counter() - started)
            # What the serving process spends receiving a state from the child process.
            crossing, sizes_sent = [], []
            for state in states:
                sent = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
                started = time.perf_counter()
                pickle.loads(sent)
                crossing.append(time.perf_counter() - started)
                sizes_sent.append(len(sent))
            # What /status and /status/{gate} cost the serving process on such a state.
            shown = pickle.loads(pickle.dumps(states[-1], protocol=pickle.HIGHEST_PROTOCOL))
            now = shown.snapshot.polled_at + 1.0
            started = time.perf_counter()
            gate_summary(shown, now)
            summary_first = time.perf_counter() - started
            started = time.perf_counter()
            gate_summary(shown, now + 1.0)
            summary_again = time.perf_counter() - started
            started = time.perf_counter()
            detail = json.dumps(gate_status(shown, now + 2.0))
            detail_seconds = time.perf_counter() - started
            started = time.perf_counter()  # as the status page of a fleet asks for it
            holding = json.dumps(gate_status(shown, now + 3.0, groups="holding"))
            holding_seconds = time.perf_counter() - started
            # /status/{gate}/history: 15 minutes of 5 s points, every group's or 12 of them.
            history = GateHistory(5.0, 900.0)
            history.points.extend(point_of(shown, step * 5.0) for step in range(180))
            started = time.perf_counter()
            history_bytes = len(json.dumps(history.to_json()))
            history_seconds = time.perf_counter() - started
            started = time.perf_counter()
            json.dumps(history.to_json(list(shown.groups)[:12]))
            charted_seconds = time.perf_counter() - started
            scrape = scrape_seconds(shown, DEFAULT_SERIES_LIMIT)
            scrape_all = scrape_seconds(shown, groups * partitions)
            del states, shown, history
            p50 = statistics.median(times)
            per = p50 / (groups * partitions) * 1e6
            received = statistics.median(crossing)
            by_size[str(groups)] = {
                "p50_ms": round(p50 * 1000, 3),
                "us_per_group_partition": per,
                "received_p50_ms": round(received * 1000, 3),
                "state_bytes": statistics.median(sizes_sent),
                "status_summary_first_ms": round(summary_first * 1000, 3),
                "status_summary_again_ms": round(summary_again * 1000, 3),
                "status_detail_ms": round(detail_seconds * 1000, 3),
                "status_detail_bytes": len(detail),
                "status_detail_holding_ms": round(holding_seconds * 1000, 3),
                "status_detail_holding_bytes": len(holding),
                "history_ms": round(history_seconds * 1000, 3),
                "history_bytes": history_bytes,
                "history_12_groups_ms": round(charted_seconds * 1000, 3),
                "scrape_default_ms": round(scrape[0] * 1000, 3),
                "scrape_default_bytes": scrape[1],
                "scrape_every_series_ms": round(scrape_all[0] * 1000, 3),
                "scrape_every_series_bytes": scrape_all[1],
            }
            rows.append(
                [
                    scenario,
                    groups,
                    p50 * 1000,
                    per,
                    received * 1000,
                    summary_first * 1000,
                    summary_again * 1000,
                    detail_seconds * 1000,
                    holding_seconds * 1000,
                    history_seconds * 1000,
                    charted_seconds * 1000,
                    scrape[0] * 1000,
                    scrape_all[0] * 1000,
                ]
            )
        small, large = by_size[str(sizes[0])], by_size[str(sizes[-1])]
        by_size["linearity"] = round(
            large["us_per_group_partition"] / small["us_per_group_partition"], 3
        )
        results[scenario] = by_size
    table(
        f"Evaluation alone ({partitions} partitions, median of {cycles} polls built in memory)",
        [
            "scenario",
            "groups",
            "p50 ms",
            "µs per group-partition",
            "state received p50 ms",
            "/status first ask ms",
            "/status again ms",
            "/status/{gate} ms",
            "?groups=holding ms",
            "history ms",
            "history, 12 groups ms",
            "scrape ms",
            "scrape, every series ms",
        ],
        rows,
    )
    table(
        f"Linearity: cost per group-partition at {sizes[-1]} groups / at {sizes[0]} (target <= 1.2)",
        ["scenario", "ratio"],
        [[name, r["linearity"]] for name, r in results.items()],
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument(
        "--only", choices=["http", "poll", "evaluation", "ready"], help="run one benchmark"
    )
    parser.add_argument("--groups", type=int, default=200, help="dependency groups (200)")
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="poll: the admin client and the evaluation in a child process, as gate serve runs "
        "them (their CPU is then not counted as the gate's)",
    )
    parser.add_argument("--broker", choices=["noida", "tansu"], default="noida")
    parser.add_argument(
        "--idle-poll-interval",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="poll: read idle, caught-up groups this often (idle_poll_interval_ms; default 0: "
        "every poll reads every group)",
    )
    parser.add_argument(
        "--poller-niceness",
        type=int,
        default=None,
        metavar="N",
        help="ready: the servers' poller_niceness (default: the gate's default)",
    )
    args = parser.parse_args()
    wanted = {args.only} if args.only else {"http", "poll", "evaluation", "ready"}
    if wanted & {"http", "ready"} and shutil.which("wrk") is None:
        raise SystemExit("the HTTP benchmarks need wrk (Debian/Ubuntu: apt-get install wrk)")
    results: dict = {"broker": args.broker, "groups": args.groups}
    verdict = []
    seconds, rounds = (3, 2) if args.quick else (8, 3)
    if "evaluation" in wanted:
        sizes = sorted({50, 200, args.groups})
        evaluation = results["evaluation"] = evaluation_bench(sizes, 64, 10 if args.quick else 30)
        quiet = evaluation["caught up, nothing moves"]
        verdict += [
            (
                f"evaluation p50 <= 50 ms at {args.groups} groups (nothing moves)",
                quiet[str(args.groups)]["p50_ms"] <= 50,
            ),
            ("evaluation linear (nothing moves): ratio <= 1.2", quiet["linearity"] <= 1.2),
        ]
    broker_class = LocalNoida if args.broker == "noida" else LocalBroker
    if wanted - {"evaluation"}:
        with broker_class() as broker:
            if "http" in wanted:
                http = results["http"] = http_bench(broker.bootstrap, seconds, rounds)
                verdict += [
                    ("/ready released >= 0.8 x trivial", http["ratio_ready_released"] >= 0.8),
                    ("/ready held >= 0.8 x trivial", http["ratio_ready_held"] >= 0.8),
                ]
            if "poll" in wanted:
                poll = results["poll"] = poll_bench(
                    broker,
                    args.broker,
                    args.groups,
                    64,
                    cycles=20 if args.quick else 100,
                    isolated=args.isolated,
                    idle_interval=args.idle_poll_interval,
                )
                verdict.append(
                    (
                        "whole cycle within 1.2x of the bare admin calls",
                        poll["cycle_vs_bare"] <= 1.2,
                    )
                )
                budget = 100 if args.groups <= 200 else 500
                verdict.append(
                    (f"whole cycle p50 <= {budget} ms", poll["cycle"]["p50_ms"] <= budget)
                )
            if "ready" in wanted:
                topic = f"bench-poll-{args.groups}"
                if "poll" not in wanted:
                    create_topic(broker.bootstrap, topic, 64)
                    commit_groups(broker.bootstrap, topic, args.groups, 64)
                ready = results["ready"] = ready_under_cycles(
                    broker.bootstrap,
                    (topic, group_names(args.groups)),
                    seconds,
                    rounds,
                    args.poller_niceness,
                )
                verdict += [
                    ("/ready p99 with cycles <= 1.2x without", ready["p99_ratio"] <= 1.2),
                    (
                        "/ready p99 with cycles, records arriving, <= 1.2x without",
                        ready["p99_ratio_records_arriving"] <= 1.2,
                    ),
                ]
    name = "gate" if not args.only else f"gate-{args.only}"
    if args.groups != 200 or args.broker != "noida":
        name += f"-{args.broker}-{args.groups}"
    if args.isolated:
        name += "-isolated"
    if args.idle_poll_interval:
        name += f"-idle{args.idle_poll_interval:g}"
    if args.poller_niceness is not None:
        name += f"-nice{args.poller_niceness}"
    write(name, results)
    table("Targets", ["target", "met"], [[name, "yes" if ok else "NO"] for name, ok in verdict])


if __name__ == "__main__":
    main()
