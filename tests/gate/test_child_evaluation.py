"""The gates evaluated in the admin client's process: the same states as evaluating here,
positions that cross as blobs and are decoded when read, versions that continue across a new
child, and one gate's failing evaluation that stays that gate's."""

from __future__ import annotations

import os
import pickle
import signal
import time

import httpx
from hypothesis import given
from hypothesis import strategies as st

from gate import GateEvaluator, GateState, StatusPolicy
from gate.evaluate._state import GroupPositions
from gate.poll._isolated import IsolatedPoller
from tests.support import Kafka, gate_config, serve_gate, unique, wait_until

offsets = st.none() | st.integers(min_value=0, max_value=2**62)
seconds = st.none() | st.floats(allow_nan=False)
positions = st.dictionaries(
    st.text(max_size=20),
    st.tuples(offsets, offsets, st.integers(0, 5), seconds, seconds, st.booleans()),
    max_size=30,
)


@given(positions)
def test_positions_cross_a_pickle_as_they_were(kept: dict) -> None:
    sent = GroupPositions(kept)
    blob = pickle.dumps(sent)
    received, again = pickle.loads(blob), pickle.loads(blob)
    # Received positions not yet read cross again as the same blob, still undecoded.
    assert pickle.dumps(again) == blob
    assert again.built_from(None)  # type: ignore[arg-type]
    assert dict(received) == dict(sent) and len(received) == len(kept)
    assert sorted(received) == sorted(kept) and all(g in received for g in kept)


def judged(state: GateState) -> dict:
    """What a state says, without the times each process read on its own clocks."""
    return {
        "watermarks": state.snapshot.watermarks,
        "groups": dict(state.groups),
        "verdict": state.verdict.state,
        "partitions": {
            tp: (
                part.end_offset,
                part.watermark,
                part.holding,
                {g: (p.committed, p.lag, p.status) for g, p in part.groups.items()},
            )
            for tp, part in state.partitions.items()
        },
    }


def test_the_child_evaluates_the_gates_as_this_process_would(kafka: Kafka) -> None:
    topic, idle = kafka.create_topic(2), kafka.create_topic(1)
    groups = [unique("CG") for _ in range(3)]
    kafka.produce(topic, {0: 10, 1: 6})
    for n, group in enumerate(groups):
        kafka.commit(group, topic, {0: 2 + n, 1: 6})
        kafka.commit(group, idle, {0: 0})
    specs = {"a": ([topic], groups), "b": ([topic], groups[:1]), "c": ([idle], groups)}
    poller = IsolatedPoller(
        {"bootstrap.servers": kafka.bootstrap}, {g: [topic, idle] for g in groups}
    )
    remote = {name: GateEvaluator(name, *spec) for name, spec in specs.items()}
    poller.evaluate(remote)
    here = {name: GateEvaluator(name, *spec) for name, spec in specs.items()}
    try:
        states: list[dict[str, GateState | str]] = []
        for step in range(8):
            if step == 4:
                kafka.commit(groups[0], topic, {0: 9, 1: 6})
                kafka.produce(topic, {1: 2})
            poll = poller.poll()
            assert not poll.errors
            states.append(dict(poller.evaluated))
            for name, evaluator in here.items():
                child = poller.evaluated[name]
                assert isinstance(child, GateState)
                assert judged(child) == judged(evaluator.observe(poll)), (step, name)
        assert poller.evaluation > 0
        a = [s["a"] for s in states]
        assert all(isinstance(s, GateState) for s in a)
        # Caught up and idle: evaluated again only when a group's offsets moved (the
        # child's clocks are read together too).
        evaluated = [s["c"].evaluated for s in states]  # type: ignore[union-attr]
        assert evaluated == [3, 0, 0, 0, 1, 0, 0, 0]
        assert a[-1].snapshot.watermarks == {(topic, 0): 3, (topic, 1): 6}
        assert a[-1].partitions[(topic, 0)].holding == (groups[1],)

        # The version floor reaches the child at each poll (Redis's version, at start)...
        remote["a"].version_floor = far = 10**15
        assert not poller.poll().errors
        last = poller.evaluated["a"].version  # type: ignore[union-attr]
        assert last > far
        remote["a"].version_floor = 0
        # ... and a new child goes on from the last version, not from the clock.
        os.kill(poller.pid or 0, signal.SIGABRT)  # what librdkafka's assertion does
        time.sleep(0.5)
        failed = poller.poll()
        assert failed.failed_groups and poller.evaluated == {}
        assert not poller.poll().errors
        state = poller.evaluated["a"]
        assert isinstance(state, GateState) and state.version > last and poller.restarts == 1
        assert state.snapshot.watermarks == a[-1].snapshot.watermarks
    finally:
        poller.close()


def test_a_gate_whose_evaluation_fails_in_the_child_leaves_the_others_served(
    kafka: Kafka,
) -> None:
    """Each poll hands the child the gates' policies as they are: one that breaks gate x's
    evaluation fails x alone, with the error in its status; restored, x is served again."""
    topic = kafka.create_topic(1)
    group = unique("CG-B")
    kafka.produce(topic, {0: 10})
    kafka.commit(group, topic, {0: 5})
    gates = {name: {"topics": [topic], "depends_on": [group]} for name in ("a", "x")}
    with serve_gate(gate_config(kafka.bootstrap, gates)) as served:
        url, service = served.url, served.service
        assert isinstance(service.poller, IsolatedPoller) and service.poller.evaluates
        wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 200, what="ready")
        # The child yields the CPU to this process (poller_niceness, 10 by default).
        child = os.getpriority(os.PRIO_PROCESS, service.poller.pid or 0)
        assert child == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
        service.evaluators["x"].policy = None  # type: ignore[assignment]
        wait_until(lambda: "x" in httpx.get(f"{url}/status").json()["failing"], what="x failing")
        status = httpx.get(f"{url}/status").json()
        assert status["failing"]["x"][0].startswith("internal: ")
        assert "rewind_policy" in status["failing"]["x"][0]
        assert set(status["failing"]) == {"x"} and status["ready"] is True
        ready = {"gate": "a", "topic": topic, "partition": 0, "offset": 4}
        assert httpx.get(f"{url}/ready", params=ready).status_code == 200
        service.evaluators["x"].policy = StatusPolicy()
        wait_until(lambda: httpx.get(f"{url}/status").json()["failing"] == {}, what="x back")
        body = httpx.get(f"{url}/status/x").json()
        assert body["partitions"][0]["groups"][group]["committed"] == 5
