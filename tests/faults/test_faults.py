"""Fault injection on real OS processes: the broker, Redis, the gate, dependency services B
and C, and the gated dependent A on the engine. After every fault: no record started before
both dependencies committed past it, every record started at least once, and every duplicate
was a record A's group had not committed past. Figures go to tests/artifacts/faults.json.

The default variants are short; ``--run-slow`` runs the long ones."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo._local import BROKERS, LocalServiceError
from tests.faults.harness import Scenario, commit, committed, record
from tests.support import Broker


@pytest.fixture
def scenario(tmp_path: Path, broker: Broker) -> Iterator[Scenario]:
    if broker.name not in BROKERS:
        pytest.skip("needs local broker processes (KAFKA_BOOTSTRAP points elsewhere)")
    running = Scenario(tmp_path, broker=BROKERS[broker.name])
    try:
        running.start()
    except LocalServiceError as exc:
        running.close()
        pytest.skip(f"needs local broker and redis-server processes: {exc}")
    try:
        running.wait_for_progress(200)
        yield running
    finally:
        running.close()


def check(name: str, scenario: Scenario, report: dict) -> None:
    record(f"{name} ({scenario.broker.kind})", report)
    assert report["violations"] == [], report["violations"][:10]
    assert report["missing"] == [], report["missing"][:10]
    assert report["unjustified_duplicates"] == [], report["unjustified_duplicates"][:10]
    assert all(r["caught_up_after_s"] is not None for r in report["recoveries"])


@pytest.mark.parametrize("kills", [pytest.param(3), pytest.param(10, marks=pytest.mark.slow)])
def test_the_dependent_killed_mid_batch(scenario: Scenario, kills: int, broker: Broker) -> None:
    broker.require_eviction()
    for i in range(kills):
        time.sleep(0.5 + (i % 3) * 0.5)  # into its steady state
        victim = scenario.dependents[0]
        scenario.wait_for_a_batch(victim)  # killed mid-batch: something must run again
        fault = scenario.fault("dependent killed (-9)")
        scenario.stop_dependent(victim, signal.SIGKILL)
        scenario.spawn_dependent()
        scenario.end(fault)
        scenario.wait_for_progress(150)
    produced = scenario.finish()
    report = scenario.report(produced)
    check(f"dependent killed x{kills}", scenario, report)
    assert report["duplicates"] > 0 or kills < 3, "kills mid-batch should replay something"


@pytest.mark.parametrize("down", [pytest.param(3.0), pytest.param(15.0, marks=pytest.mark.slow)])
def test_the_gate_and_redis_killed_and_restarted(scenario: Scenario, down: float) -> None:
    fault = scenario.fault("gate killed")
    scenario.kill_gate()
    time.sleep(down)
    scenario.start_gate()
    scenario.end(fault)
    scenario.wait_for_progress(150)

    fault = scenario.fault("redis killed")
    scenario.redis.kill()
    time.sleep(down)
    scenario.redis.start()
    scenario.end(fault)
    scenario.wait_for_progress(150)

    fault = scenario.fault("gate and redis killed together")
    scenario.kill_gate()
    scenario.redis.kill()
    time.sleep(down)
    scenario.redis.start()
    scenario.start_gate()
    scenario.end(fault)
    produced = scenario.finish()
    check(f"gate and redis down {down:g}s", scenario, scenario.report(produced))


@pytest.mark.parametrize("pause", [pytest.param(6.0), pytest.param(20.0, marks=pytest.mark.slow)])
def test_the_broker_suspended(scenario: Scenario, pause: float) -> None:
    fault = scenario.fault(f"broker SIGSTOP {pause:g}s")
    scenario.broker.suspend()
    time.sleep(pause)
    scenario.broker.resume()
    scenario.end(fault)
    produced = scenario.finish()
    check(f"broker suspended {pause:g}s", scenario, scenario.report(produced))


@pytest.mark.parametrize(
    "seconds", [pytest.param(12.0), pytest.param(60.0, marks=pytest.mark.slow)]
)
def test_a_rebalance_storm(scenario: Scenario, seconds: float, broker: Broker) -> None:
    """Dependents join every 2 s and the oldest leaves, A's first process staying. Where the
    broker may never end a round of rebalancing that members left during (noida-db: see
    test_noida_groups.py), a dependent leaves only once the group has settled."""
    fault = scenario.fault("rebalance storm")

    def leave(process: subprocess.Popen[bytes]) -> None:
        if not broker.ends_every_round:
            scenario.wait_for_a_settled_group()
        scenario.stop_dependent(process, signal.SIGTERM)

    deadline = time.monotonic() + seconds
    joined = []
    while time.monotonic() < deadline:
        if len(joined) < 2:
            joined.append(scenario.spawn_dependent())
        else:
            leave(joined.pop(0))
        time.sleep(2.0)
    for process in joined:
        leave(process)
    scenario.end(fault)
    produced = scenario.finish()
    check(f"rebalance storm {seconds:g}s", scenario, scenario.report(produced))


@pytest.mark.parametrize("down", [pytest.param(2.0), pytest.param(10.0, marks=pytest.mark.slow)])
def test_the_broker_restarted_with_its_data(scenario: Scenario, down: float) -> None:
    """Stopped and started again on the same data: topics, records and every group's commits
    survive, and everyone reconnects by themselves."""
    if not scenario.broker.keeps_data:
        pytest.skip(f"{scenario.broker.kind} keeps everything in memory: a restart loses it all")
    fault = scenario.fault(f"broker restarted, down {down:g}s")
    scenario.broker.stop()
    time.sleep(down)
    scenario.broker.start()
    back = time.time()
    # The broker may forget commits it acknowledged just before it stopped (it writes them
    # behind): what it still has is the baseline for the duplicates that follow.
    survived = committed(scenario.broker.bootstrap, scenario.group, scenario.topic)
    scenario.end(fault)
    produced = scenario.finish()
    report = scenario.report(produced, forgotten=(back, survived))
    check(f"broker restarted, down {down:g}s", scenario, report)


def test_a_dependency_group_rewound(scenario: Scenario) -> None:
    scenario.wait_for_progress(300)
    fault = scenario.fault("service-c rewound by 150")
    scenario.stop_dependency("service-c")
    position = committed(scenario.broker.bootstrap, "service-c", scenario.topic)
    rewound = {p: max(0, o - 150) for p, o in position.items()}
    commit(scenario.broker.bootstrap, "service-c", scenario.topic, rewound)
    when = time.time()
    scenario.start_dependency("service-c")
    scenario.end(fault)
    produced = scenario.finish()
    report = scenario.report(produced, rewinds={"service-c": (when, rewound)})
    check("dependency rewound", scenario, report)


def test_the_harness_catches_a_violation(tmp_path: Path) -> None:
    """The checks can fail: a start with no dependency commit before it is reported."""
    scenario = Scenario(tmp_path)
    (tmp_path / "service-b.log").write_text("commit 10.0 0 5\n")
    (tmp_path / "service-c.log").write_text("commit 10.0 0 3\ncommit 20.0 0 6\n")
    pid = os.getpid()
    (tmp_path / "service-a.log").write_text(
        f"start 11.0 0 2 {pid}\nstart 12.0 0 4 {pid}\ncommit 13.0 0 3 {pid}\nstart 14.0 0 2 {pid}\n"
    )
    report = scenario.report({0: 6})
    assert report["violations"] == ["0@4 started at 12.000 before service-c committed past it"]
    assert report["missing"] == [(0, 0), (0, 1), (0, 3), (0, 5)]
    assert report["unjustified_duplicates"] == [
        "0@2 was committed before it started again at 14.000"
    ]
    assert report["duplicates"] == 1
