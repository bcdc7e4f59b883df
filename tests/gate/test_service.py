"""The service's poll cycle over a scripted admin client: what one gate's failing reads do
to the others, to readiness, to ``/status`` and to the metrics (no broker, no waiting)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest
from confluent_kafka.admin import AdminClient
from fastapi.testclient import TestClient

from gate import GateService, StatusPolicy
from gate.serve._api import create_app
from gate.serve._bodies import ServiceStatus
from tests.gate.scripted import Clocks, ScriptedAdmin
from tests.support import gate_config, wait_until

LIMIT = 1.0
"""The readiness limit these tests configure (``readiness_max_age_ms``), in seconds."""


class Served:
    """A gate service on a scripted cluster: gate ``a`` reads payments through CG-B, gate
    ``x`` reads orders through CG-X; ``cycle`` runs one poll cycle a tenth of the limit after
    the previous one."""

    def __init__(self, clocks: Clocks, gates: dict[str, dict[str, Any]] | None = None) -> None:
        self.clocks = clocks
        self.admin = ScriptedAdmin({"payments": 2, "orders": 1})
        self.admin.ends = {("payments", 0): 10, ("payments", 1): 10, ("orders", 0): 10}
        self.admin.committed = {
            "CG-B": {("payments", 0): 4, ("payments", 1): 6},
            "CG-X": {("orders", 0): 3},
        }
        config = gate_config(
            "scripted:9092",
            gates
            or {
                "a": {"topics": ["payments"], "depends_on": ["CG-B"]},
                "x": {"topics": ["orders"], "depends_on": ["CG-X"]},
            },
            readiness_max_age_ms=int(LIMIT * 1000),
        )
        self.service = GateService(config, admin=cast(AdminClient, self.admin))
        self.service.prepare()
        self.client = TestClient(create_app(self.service, manage_service=False))

    def cycle(self, times: int = 1) -> None:
        for _ in range(times):
            self.clocks.advance(LIMIT / 10)
            self.client.portal.call(self.service.poll_once)

    def get(self, path: str, **params: object) -> Any:
        return self.client.get(path, params=params)

    def ready(self, gate: str, topic: str, offset: int) -> Any:
        return self.get("/ready", gate=gate, topic=topic, partition=0, offset=offset)

    def metric(self, name: str, **labels: str) -> float | None:
        return self.service.registry.get_sample_value(name, labels)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    gate = Served(Clocks(monkeypatch))
    with gate.client:
        yield gate


def test_a_gate_that_cannot_read_its_dependencies_leaves_the_service_ready(
    served: Served,
) -> None:
    """CG-X's offsets cannot be read (the cluster refuses them): gate x has nothing to serve,
    and says why, while the service stays ready and gate a is served fresh, long past the
    readiness limit."""
    served.admin.denied = {"CG-X"}
    served.cycle(30)  # three readiness limits
    probe = served.get("/readyz")
    assert probe.status_code == 200, probe.json()
    assert probe.json()["ok"] is True

    a = served.ready("a", "payments", 3)
    assert a.status_code == 200 and a.json()["watermark"] == 4
    x = served.ready("x", "orders", 0)
    assert x.status_code == 425
    assert "CG-X" in x.json()["reason"] and "authorization" in x.json()["reason"].lower()

    status = served.get("/status").json()
    assert ServiceStatus.model_validate(status).model_dump(mode="json") == status
    assert status["ready"] is True
    assert status["gates"]["x"] is None  # no snapshot ever
    assert [e.split(":", 1)[0] for e in status["failing"]["x"]] == ["group CG-X"]
    assert "a" not in status["failing"] and status["gates"]["a"]["errors"] == []
    assert status["gates"]["a"]["verdict"]["state"] != "unknown"
    missing = served.get("/status/x")
    assert missing.status_code == 404 and "CG-X" in missing.json()["message"]

    assert served.metric("gate_read_failing", gate="x") == 1
    assert served.metric("gate_read_failing", gate="a") == 0


def test_a_gate_whose_reads_fail_after_a_snapshot_keeps_it_and_says_why(
    served: Served,
) -> None:
    served.cycle()
    assert served.ready("x", "orders", 2).status_code == 200
    served.admin.denied = {"CG-X"}
    served.cycle(20)  # twice the readiness limit
    assert served.get("/readyz").status_code == 200
    assert served.ready("x", "orders", 2).status_code == 200  # the last snapshot holds
    x = served.get("/status/x").json()
    assert x["verdict"]["state"] == "unknown"  # older than the limit: no news
    assert [e.split(":", 1)[0] for e in x["errors"]] == ["group CG-X"]
    assert served.get("/status/a").json()["verdict"]["state"] != "unknown"
    assert served.metric("gate_read_failing", gate="x") == 1

    served.admin.denied = set()
    served.admin.committed["CG-X"][("orders", 0)] = 8
    served.cycle()
    assert served.ready("x", "orders", 7).status_code == 200
    assert served.get("/status/x").json()["errors"] == []
    assert served.get("/status").json()["failing"] == {}
    assert served.metric("gate_read_failing", gate="x") == 0


def test_a_gate_whose_topic_is_missing_leaves_the_service_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gates = {
        "a": {"topics": ["payments"], "depends_on": ["CG-B"]},
        "m": {"topics": ["no-such-topic"], "depends_on": ["CG-B"]},
    }
    served = Served(Clocks(monkeypatch), gates)
    with served.client:
        served.cycle(30)
        assert served.get("/readyz").status_code == 200
        m = served.ready("m", "no-such-topic", 0)
        assert m.status_code == 425 and "does not exist" in m.json()["reason"]
        assert served.get("/status/m").json()["missing_topics"] == ["no-such-topic"]
        assert served.ready("a", "payments", 3).status_code == 200


def test_a_gate_whose_evaluation_fails_leaves_the_others_served(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(poll: object) -> None:
        raise RuntimeError("a broken evaluation")

    monkeypatch.setattr(served.service.evaluators["x"], "observe", broken)
    served.cycle(30)
    assert served.get("/readyz").status_code == 200
    assert served.ready("a", "payments", 3).status_code == 200
    assert served.get("/status").json()["failing"]["x"] == ["internal: a broken evaluation"]
    assert served.metric("gate_read_failing", gate="x") == 1


def test_the_service_is_ready_only_while_the_cluster_answers(served: Served) -> None:
    """Before a first poll cycle, not ready; ready once the cluster answered; not ready once
    no read has been answered for longer than the limit; ready again when it answers."""
    assert served.get("/readyz").status_code == 503
    served.cycle()
    assert served.get("/readyz").status_code == 200
    served.admin.down = True
    served.cycle(5)  # half the limit: one outage of a few polls is no reason to leave
    assert served.get("/readyz").status_code == 200
    served.cycle(10)
    probe = served.get("/readyz")
    assert probe.status_code == 503 and "cluster" in probe.json()["detail"]
    assert served.get("/status/a").json()["verdict"]["state"] == "unknown"
    served.admin.down = False
    served.cycle()
    assert served.get("/readyz").status_code == 200


HOUR = 3600.0


@pytest.mark.parametrize("step", [-HOUR, HOUR], ids=["wall clock stepped back", "forward"])
def test_durations_do_not_follow_a_stepped_wall_clock(
    monkeypatch: pytest.MonkeyPatch, step: float
) -> None:
    """CG-B has records waiting and stops committing; the wall clock is stepped by an hour.
    It is STALLED (and the gate stuck) once stall_after has passed, not an hour early or
    late, and every age the gate reports is the time that passed."""
    served = Served(Clocks(monkeypatch))
    served.service.evaluators["a"].policy = StatusPolicy(stall_after=2.0)
    with served.client:
        served.cycle()
        served.clocks.step_wall(step)
        served.cycle(15)  # 1.5 s since CG-B was first seen: not yet
        a = served.get("/status/a").json()
        assert a["groups"]["CG-B"]["status"] == "OK" and a["verdict"]["state"] == "flowing"
        served.cycle(10)  # 2.5 s
        a = served.get("/status/a").json()
        assert a["groups"]["CG-B"]["status"] == "STALLED"
        assert a["verdict"]["state"] == "stuck"
        assert a["groups"]["CG-B"]["unmoved_s"] == pytest.approx(2.5)
        assert a["verdict"]["stuck_for_s"] == pytest.approx(2.5)
        assert a["age_s"] == 0.0
        age = served.metric("gate_dependency_commit_age_seconds", **CG_B_P0)
        assert age == pytest.approx(2.5)
        assert served.metric("gate_last_successful_poll_age_seconds") == 0.0


CG_B_P0 = {"gate": "a", "group": "CG-B", "topic": "payments", "partition": "0"}


def test_a_wall_clock_stepped_back_does_not_keep_a_lost_cluster_ready(served: Served) -> None:
    served.cycle()
    served.clocks.step_wall(-HOUR)
    served.admin.down = True
    served.cycle(15)  # 1.5 readiness limits without an answer
    probe = served.get("/readyz")
    assert probe.status_code == 503, probe.json()
    a = served.get("/status/a").json()
    assert a["verdict"]["state"] == "unknown" and a["age_s"] == pytest.approx(1.5)
    assert served.metric("gate_last_successful_poll_age_seconds") == pytest.approx(1.5)


def test_a_wall_clock_stepped_back_does_not_stall_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's own poll loop keeps its pace when the wall clock goes back an hour."""
    served = Served(Clocks(monkeypatch, follow_real=True))
    app = create_app(served.service)  # starts and stops the poll loop
    with TestClient(app) as client:
        wait_until(lambda: served.admin.group_reads > 0, what="a first poll")
        served.clocks.step_wall(-HOUR)
        reads = served.admin.group_reads
        wait_until(lambda: served.admin.group_reads > reads + 20, what="polls after the step")
        assert client.get("/readyz").status_code == 200
        history = client.get("/status/a/history").json()["points"]
        assert [p["t"] for p in history] == sorted(p["t"] for p in history)


def test_cycles_longer_than_the_interval_are_counted_and_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cluster slower than the poll interval: /status and a metric say so, and stop saying
    so once cycles fit the interval again."""
    served = Served(Clocks(monkeypatch, follow_real=True))
    served.service.config = served.service.config.model_copy(update={"poll_interval_ms": 20})
    served.admin.delay = 0.1
    with TestClient(create_app(served.service)) as client:
        wait_until(lambda: served.service.overruns >= 3, what="cycles overrunning")
        status = ServiceStatus.model_validate(client.get("/status").json())
        assert status.overrunning and status.overruns >= 3
        assert status.last_poll is not None and status.last_poll.duration_ms >= 100
        assert (served.metric("gate_poll_overruns_total") or 0) >= 3
        served.admin.delay = 0.0
        wait_until(lambda: not served.service.overrunning, what="cycles fitting again")
        assert client.get("/status").json()["overrunning"] is False


def test_a_failed_poll_says_last_snapshot_only_when_there_is_one(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """The cluster does not answer from the start: there is no snapshot to serve, and the
    warning does not pretend there is one."""
    served.admin.down = True
    with caplog.at_level("WARNING", "gate"):
        served.cycle()
    said = [r.getMessage() for r in caplog.records if "poll failed" in r.getMessage()]
    assert said and all("last snapshot" not in line for line in said), said
    assert all("no snapshot yet of a, x" in line for line in said), said
