"""The gate benchmark's whole poll cycles, interleaved with the bare admin calls any poller
must make (see ``bench.gate_bench``)."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor, wait

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from rich.progress import track

from bench._proc import cpu_seconds
from bench._report import console, summary_ms, table
from bench._topics import commit, create_topic
from demo._local import LocalBroker
from gate import GateEvaluator, GateState, PollResult
from gate.poll._isolated import IsolatedPoller
from gate.poll._poller import OffsetPoller


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


def fleet_topic(bootstrap: str, groups: int, partitions: int) -> tuple[str, list[str]]:
    """The topic of the large gate, its groups committed on every partition."""
    topic = f"bench-poll-{groups}"
    create_topic(bootstrap, topic, partitions)
    return topic, commit_groups(bootstrap, topic, groups, partitions)


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
    topic, names = fleet_topic(bootstrap, groups, partitions)
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
