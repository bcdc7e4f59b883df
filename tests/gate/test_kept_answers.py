"""The large answers kept per gate state: ``/status``, ``/status/{gate}`` (per choice of
groups), ``/status/{gate}/history`` and ``/metrics`` are built once per state (per poll
cycle), and a kept answer stays true: what depends on the moment of the ask (the snapshot's
age, the verdict turning unknown, the history's ``now``, the service's own figures) is made
at each ask, and the first ask after a poll sees the new state. Builds are counted on the
functions that make them, so the tests hold whatever the speed of the machine."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from gate import GateEvaluator, GateService, PollResult
from gate.evaluate._history import GateHistory
from gate.evaluate._state import GroupPositions
from gate.report import _report
from gate.serve._api import create_app
from gate.service._series import exposition
from tests.gate.scripted import Clocks
from tests.gate.test_service import LIMIT, Served
from tests.support import gate_config


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    gate = Served(Clocks(monkeypatch))
    with gate.client:
        yield gate


def counted(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> Callable[[], int]:
    """Count the calls of ``owner.name`` from now on; returns how many so far."""
    calls = [0]
    real = getattr(owner, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return lambda: calls[0]


def test_a_gate_s_detail_is_built_once_per_state_and_stays_true(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked again and again within one state, gate a's detail is built once per choice of
    groups (its partitions' positions read once); its age is the one at each ask, its
    verdict turns unknown past the readiness limit without a build, and the first ask after
    a poll sees the new state."""
    served.cycle(3)
    read = counted(monkeypatch, GroupPositions, "tuples")  # a partition's positions read
    first = served.get("/status/a").json()
    built = read()
    assert built > 0
    assert served.get("/status/a").json() == first
    assert read() == built, "asked twice within one state: built once"

    served.clocks.advance(LIMIT / 2)  # no poll: the same state, older
    later = served.get("/status/a").json()
    assert read() == built
    assert later["version"] == first["version"] and later["polled_at"] == first["polled_at"]
    assert later["age_s"] == pytest.approx(first["age_s"] + LIMIT / 2)
    assert later["verdict"]["state"] == first["verdict"]["state"] == "flowing"
    # ages but age_s are those of the state (as of its poll), however late the ask
    assert later["groups"]["CG-B"]["unmoved_s"] == first["groups"]["CG-B"]["unmoved_s"]
    assert later["partitions"] == first["partitions"]

    holding = served.get("/status/a", groups="holding").json()
    built_holding = read()
    assert built_holding > built, "another choice of groups: built once more"
    assert served.get("/status/a", groups="holding").json() == holding
    assert read() == built_holding

    served.clocks.advance(LIMIT)  # past the readiness limit, still no poll
    stale = served.get("/status/a").json()
    assert stale["verdict"]["state"] == "unknown", "an old state presented as current"
    assert "no poll has succeeded for 1.5 s" in stale["verdict"]["text"]
    assert stale["age_s"] == pytest.approx(first["age_s"] + 1.5)
    assert read() == built_holding

    served.admin.committed["CG-B"][("payments", 0)] = 8
    served.cycle()
    new = served.get("/status/a").json()
    assert new["version"] > first["version"] and new["age_s"] == 0.0
    assert new["verdict"]["state"] == "flowing"
    assert [p["watermark"] for p in new["partitions"]] == [8, 6]
    assert read() > built_holding


def test_asks_that_arrive_together_share_one_build(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clients ask the detail while it is being built: the second waits for the first's
    build and is answered with it (before: each built its own, one after the other)."""
    served.cycle()
    building, finish = threading.Event(), threading.Event()
    real = GroupPositions.tuples
    calls = [0]

    def slow(self: GroupPositions) -> Any:
        calls[0] += 1
        building.set()
        finish.wait(20)
        return real(self)

    monkeypatch.setattr(GroupPositions, "tuples", slow)
    answers: list[Any] = []
    asking = [
        threading.Thread(target=lambda: answers.append(served.get("/status/a"))) for _ in range(2)
    ]
    asking[0].start()
    try:
        assert building.wait(10), "the detail was never built"
        asking[1].start()
        time.sleep(0.2)  # (the second ask reaches the build under way)
    finally:
        finish.set()
        for thread in asking:
            thread.join(20)
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json() == answers[1].json()
    # gate a's 2 partitions: read once for its summary and once for its detail, for both
    assert calls[0] == 2 + 2


def test_the_service_status_keeps_each_gate_s_summary_per_state(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/status`` sums each gate up once per state (gates a and x: two summaries per poll,
    however many asks); the service's own figures and each snapshot's age are of the ask."""
    served.cycle()
    summaries = counted(monkeypatch, _report, "verdict_json")  # once per summary built
    first = served.get("/status").json()
    served.clocks.advance(LIMIT / 4)
    later = served.get("/status").json()
    assert summaries() == 2, "two gates, asked twice within one state: each built once"
    assert first["detail"] == "the cluster answered 0.0s ago"
    assert later["detail"] == "the cluster answered 0.2s ago"
    assert later["gates"]["a"]["age_s"] == pytest.approx(LIMIT / 4)
    assert {k: v for k, v in later["gates"]["a"].items() if k != "age_s"} == {
        k: v for k, v in first["gates"]["a"].items() if k != "age_s"
    }
    served.admin.committed["CG-X"][("orders", 0)] = 9
    served.cycle()
    new = served.get("/status").json()
    assert new["gates"]["x"]["version"] > first["gates"]["x"]["version"]
    assert new["gates"]["x"]["records_waiting"] == 1 and first["gates"]["x"]["records_waiting"] == 7
    assert summaries() == 4


def test_a_gate_s_history_is_built_once_per_state(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    served.cycle()
    built = counted(monkeypatch, GateHistory, "to_json")
    first = served.get("/status/a/history").json()
    served.clocks.advance(LIMIT / 2)
    later = served.get("/status/a/history").json()
    assert built() == 1, "asked twice within one state: built once"
    assert later["now"] == pytest.approx(first["now"] + LIMIT / 2), "now: the ask's clock"
    assert later["points"] == first["points"]
    assert first["points"][-1]["waiting"] == (10 - 4) + (10 - 6)
    served.admin.committed["CG-B"][("payments", 1)] = 10
    served.cycle()
    new = served.get("/status/a/history").json()
    assert new["points"][-1]["waiting"] == 10 - 4
    assert built() == 2


def test_a_scrape_builds_the_gates_series_once_per_poll_cycle(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scrapes within one poll cycle format the gates' series once; the snapshots' ages
    and the time since the cluster answered are of each scrape; a scrape after a poll sees
    the new states."""
    served.cycle()
    added: list[str] = []
    real = GaugeMetricFamily.add_metric

    def add_metric(self: GaugeMetricFamily, *args: Any, **kwargs: Any) -> None:
        added.append(self.name)
        real(self, *args, **kwargs)

    monkeypatch.setattr(GaugeMetricFamily, "add_metric", add_metric)
    first = served.get("/metrics").text
    served.clocks.advance(LIMIT / 2)
    later = served.get("/metrics").text
    assert added.count("gate_watermark") == 3, "a: 2 partitions, x: 1, built once"
    assert later.count("# TYPE gate_watermark gauge") == 1
    assert 'gate_snapshot_age_seconds{gate="a"} 0.0' in first
    assert 'gate_snapshot_age_seconds{gate="a"} 0.5' in later
    assert "gate_last_successful_poll_age_seconds 0.5" in later
    assert 'gate_watermark{gate="a",partition="0",topic="payments"} 4.0' in later
    served.admin.committed["CG-B"][("payments", 0)] = 7
    served.cycle()
    new = served.get("/metrics").text
    assert 'gate_watermark{gate="a",partition="0",topic="payments"} 7.0' in new
    assert 'gate_snapshot_age_seconds{gate="a"} 0.0' in new
    assert added.count("gate_watermark") == 6


def test_gates_beyond_the_series_limit_are_said_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Eight gates of 2 groups x 3 partitions (9 partition rows each) and a limit of 12:
    seven are left out, in one warning naming how many and the first few (before: one line
    per gate)."""
    spec = {"topics": ["payments"], "depends_on": ["CG-B", "CG-C"]}
    names = [f"service-{i}" for i in range(8)]
    service = GateService(
        gate_config(
            "127.0.0.1:1",
            dict.fromkeys(names, spec),
            status={"metrics_group_partitions_max": 12},
        )
    )
    client = TestClient(create_app(service, manage_service=False))
    with client, caplog.at_level(logging.INFO, "gate.metrics"):
        for name in names:
            evaluator = GateEvaluator(name, ["payments"], ["CG-B", "CG-C"])
            state = evaluator.observe(
                PollResult(
                    started_at=time.time(),
                    finished_at=time.time(),
                    partition_counts={"payments": 3},
                    end_offsets={("payments", p): 60 for p in range(3)},
                    committed={"CG-B": {("payments", 0): 30}, "CG-C": {("payments", 0): 20}},
                )
            )
            client.portal.call(service.store.update, state)
        client.get("/metrics")
        client.get("/metrics")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "gate.metrics"]
    assert line.startswith("7 gates: partition rows beyond what is left")
    assert "service-1, service-2, service-3, service-4, service-5 and 2 more" in line
    assert "(the first: 9 rows, partitions x (groups + 1), 3 left)" in line


class _Registry:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


_LABEL_VALUES = st.text(alphabet=st.sampled_from('ab-_.\\"\n é€'), max_size=8)
_VALUES = st.one_of(st.integers(-(10**12), 10**12), st.floats(allow_nan=True))


@given(
    st.lists(
        st.tuples(
            st.lists(
                st.sampled_from(["gate", "group", "topic", "partition", "status"]), unique=True
            ),
            st.lists(st.tuples(st.lists(_LABEL_VALUES, min_size=5, max_size=5), _VALUES)),
            st.text(alphabet=st.sampled_from('a \\\n"x'), max_size=12),
        ),
        max_size=4,
    )
)
def test_the_gates_series_are_formatted_as_the_client_library_formats_them(
    families: list[tuple[list[str], list[tuple[list[str], float]], str]],
) -> None:
    """The kept series are formatted by the gate itself (a fifth of the client library's
    cost per series): byte for byte what ``generate_latest`` writes, for any label values
    (quotes, backslashes, newlines, non-ASCII), any documentation and any value (NaN, the
    infinities, large integers)."""
    built = []
    for i, (labels, samples, doc) in enumerate(families):
        family = GaugeMetricFamily(f"gate_family_{i}", doc, labels=labels)
        for values, value in samples:
            family.add_metric(values[: len(labels)], value)
        built.append(family)
    assert exposition(built) == generate_latest(_Registry(built))  # type: ignore[arg-type]
