"""The HTTP API over evaluated states: answers, errors, auth, long-poll, SSE and metrics.

These tests feed the service's store with states computed by the real evaluator from
synthetic polls; the end-to-end tests against a broker live in test_gate_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import platform
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gate import GateEvaluator, GateService, PollResult
from gate.report._status_bodies import GateHistoryBody, GateStatus
from gate.serve import _answers
from gate.serve._api import create_app
from gate.serve._bodies import ServiceStatus
from tests.support import gate_config


def poll(at: float, b: dict[int, int], c: dict[int, int]) -> PollResult:
    return PollResult(
        started_at=at,
        finished_at=at,
        partition_counts={"payments": 3},
        end_offsets={("payments", p): 60 for p in range(3)},
        committed={
            "CG-B": {("payments", p): o for p, o in b.items()},
            "CG-C": {("payments", p): o for p, o in c.items()},
        },
    )


ARTICLE = ({0: 30, 1: 30, 2: 10}, {0: 23, 1: 52, 2: 15})


class Harness:
    def __init__(self, token: str | None = None, **extra: Any) -> None:
        http = {"host": "127.0.0.1", "port": 0}
        if token:
            http["api_token"] = token
        self.service = GateService(
            gate_config(
                "127.0.0.1:1",
                {"service-a": {"topics": ["payments"], "depends_on": ["CG-B", "CG-C"]}},
                http=http,
                **extra,
            )
        )
        self.evaluator = GateEvaluator("service-a", ["payments"], ["CG-B", "CG-C"])
        self.client = TestClient(create_app(self.service, manage_service=False))

    def publish(self, b: dict[int, int], c: dict[int, int]) -> None:
        state = self.evaluator.observe(poll(time.time(), b, c))
        self.client.portal.call(self.service.store.update, state)  # on the app's loop
        self.service.answered_at = time.monotonic()


@pytest.fixture
def api() -> Iterator[Harness]:
    harness = Harness()
    with harness.client:
        yield harness


def ready(api: Harness, partition: int, offset: int, **extra: object):
    params = {"gate": "service-a", "topic": "payments", "partition": partition, "offset": offset}
    params.update(extra)
    return api.client.get("/ready", params=params)


def test_before_the_first_poll_nothing_is_ready(api: Harness) -> None:
    response = ready(api, 0, 0)
    assert response.status_code == 425
    assert response.json()["ready"] is False
    assert "first poll" in response.json()["reason"]
    assert api.client.get("/readyz").status_code == 503
    assert api.client.get("/healthz").json() == {"ok": True, "detail": "alive"}
    assert api.client.get("/watermarks/service-a").status_code == 404


def test_ready_answers_the_article_example(api: Harness) -> None:
    api.publish(*ARTICLE)
    yes = ready(api, 0, 22)
    assert yes.status_code == 200 and yes.json()["ready"] is True and yes.json()["watermark"] == 23
    no = ready(api, 0, 23)
    assert no.status_code == 425
    assert no.json()["behind"] == [
        {"group": "CG-C", "committed": 23, "behind_by": 1, "status": "OK"}
    ]
    both = ready(api, 2, 40).json()["behind"]
    assert {(b["group"], b["behind_by"]) for b in both} == {("CG-B", 31), ("CG-C", 26)}
    assert api.client.get("/readyz").status_code == 200


def test_watermarks_document(api: Harness) -> None:
    api.publish(*ARTICLE)
    body = api.client.get("/watermarks/service-a").json()
    assert body["gate"] == "service-a"
    assert body["topics"] == {"payments": {"0": 23, "1": 30, "2": 10}}
    assert isinstance(body["version"], int) and body["age_s"] >= 0


def test_a_partition_without_commits_is_null_and_not_ready(api: Harness) -> None:
    api.publish({0: 30, 1: 30}, {0: 23, 1: 52, 2: 15})
    assert api.client.get("/watermarks/service-a").json()["topics"]["payments"]["2"] is None
    behind = ready(api, 2, 0).json()["behind"]
    assert behind == [{"group": "CG-B", "committed": None, "behind_by": None, "status": "MISSING"}]


@pytest.mark.parametrize(
    "params, status, fragment",
    [
        (
            {"gate": "nope", "topic": "payments", "partition": 0, "offset": 1},
            404,
            "unknown gate 'nope'",
        ),
        (
            {"gate": "service-a", "topic": "other", "partition": 0, "offset": 1},
            404,
            "does not gate topic",
        ),
        (
            {"gate": "service-a", "topic": "payments", "partition": 7, "offset": 1},
            404,
            "no partition 7",
        ),
        (
            {"gate": "service-a", "topic": "payments", "partition": 0, "offset": -5},
            422,
            "offset: must be >= 0, got -5",
        ),
        (
            {"gate": "service-a", "topic": "payments", "partition": -1, "offset": 1},
            422,
            "partition: must be >= 0, got -1",
        ),
        (
            {"gate": "service-a", "topic": "payments", "partition": 0, "offset": "1.5"},
            422,
            "offset: '1.5' is not an integer",
        ),
        (
            {"gate": "service-a", "topic": "payments", "partition": "x", "offset": 1},
            422,
            "partition: 'x' is not an integer",
        ),
        ({"gate": "service-a", "topic": "payments", "partition": 0}, 422, "offset: required"),
        (
            {"gate": "service-a", "topic": "payments", "partition": 0, "offset": 2**64},
            422,
            "offset: must be <= 9007199254740991",
        ),
        (
            {"gate": "service-a", "topic": "payments", "partition": 0, "offset": 1, "wait": -1},
            422,
            "wait: must be a number of seconds >= 0, got '-1'",
        ),
    ],
)
def test_bad_requests_are_json_errors(api: Harness, params, status: int, fragment: str) -> None:
    api.publish(*ARTICLE)
    response = api.client.get("/ready", params=params)
    assert response.status_code == status
    body = response.json()
    assert set(body) == {"error", "message"} and fragment in body["message"]


def test_unknown_routes_and_methods_are_json(api: Harness) -> None:
    assert api.client.get("/nope").json()["error"] == "not_found"
    response = api.client.delete("/ready")
    assert response.status_code == 405 and response.json()["error"] == "method_not_allowed"
    response = api.client.post(
        "/ready", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422 and response.json()["error"] == "invalid_request"


@pytest.mark.parametrize("path", ["/status/nope/stream", "/watermarks/nope/stream"])
def test_a_stream_of_an_unknown_gate_is_a_404_before_it_starts(api: Harness, path: str) -> None:
    api.publish(*ARTICLE)
    response = api.client.get(path)
    assert response.status_code == 404
    assert response.json() == {
        "error": "not_found",
        "message": "unknown gate 'nope' (known: service-a)",
    }


def test_batch_readiness(api: Harness) -> None:
    api.publish(*ARTICLE)
    body = api.client.post(
        "/ready",
        json={
            "gate": "service-a",
            "records": [
                {"topic": "payments", "partition": 0, "offset": 22},
                {"topic": "payments", "partition": 1, "offset": 30},
                {"topic": "payments", "partition": 9, "offset": 0},
                {"topic": "other", "partition": 0, "offset": 0},
            ],
        },
    ).json()
    assert [r["ready"] for r in body["results"]] == [True, False, False, False]
    assert body["all_ready"] is False
    assert body["results"][2]["error"] and body["results"][3]["error"]
    too_many = {
        "gate": "service-a",
        "records": [{"topic": "payments", "partition": 0, "offset": 0}] * 10_001,
    }
    assert api.client.post("/ready", json=too_many).status_code == 422
    assert api.client.post("/ready", json={"gate": "x", "records": []}).status_code == 404


def test_long_poll_returns_as_soon_as_released(api: Harness) -> None:
    api.publish(*ARTICLE)
    timer = threading.Timer(0.3, api.publish, args=({0: 30, 1: 30, 2: 10}, {0: 40, 1: 52, 2: 15}))
    timer.start()
    started = time.monotonic()
    response = ready(api, 0, 25, wait=10)
    elapsed = time.monotonic() - started
    timer.join()
    assert response.status_code == 200 and response.json()["watermark"] == 30
    assert 0.2 < elapsed < 5


def test_long_poll_times_out_with_not_ready(api: Harness) -> None:
    api.publish(*ARTICLE)
    started = time.monotonic()
    response = ready(api, 0, 25, wait=0.3)
    assert response.status_code == 425
    assert 0.25 < time.monotonic() - started < 3


def test_stream_sends_the_current_snapshot_first(api: Harness) -> None:
    api.publish(*ARTICLE)
    with api.client.stream("GET", "/watermarks/service-a/stream") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = []
        for line in response.iter_lines():
            lines.append(line)
            if line.startswith("data:"):
                break
    assert "event: snapshot" in lines
    data = json.loads(lines[-1].removeprefix("data:").strip())
    assert data["topics"]["payments"] == {"0": 23, "1": 30, "2": 10}


def test_metrics_expose_watermarks_and_dependency_state(api: Harness) -> None:
    api.publish({0: 30, 1: 30}, {0: 23, 1: 52, 2: 15})
    text = api.client.get("/metrics").text
    assert 'gate_watermark{gate="service-a",partition="0",topic="payments"} 23.0' in text
    assert 'gate_watermark{gate="service-a",partition="2",topic="payments"}' not in text
    assert 'gate_committed_offset{gate="service-a",group="CG-B",partition="2"' not in text
    assert 'gate_dependency_missing_partitions{gate="service-a",group="CG-B"} 1.0' in text
    assert 'gate_dependency_status{gate="service-a",group="CG-B",status="MISSING"} 1.0' in text
    assert (
        'gate_committed_offset{gate="service-a",group="CG-C",partition="1",topic="payments"} 52.0'
        in text
    )
    assert "gate_snapshot_age_seconds" in text


def test_a_missing_topic_is_an_alarm_in_status_and_metrics(api: Harness) -> None:
    state = api.evaluator.observe(
        PollResult(
            started_at=time.time(),
            finished_at=time.time(),
            partition_counts={},
            end_offsets={},
            committed={},
        )
    )
    api.client.portal.call(api.service.store.update, state)
    verdict = api.client.get("/status").json()["gates"]["service-a"]["verdict"]
    assert verdict["state"] == "missing" and verdict["missing"] == ["payments"]
    assert verdict["text"].startswith("missing: topic payments does not exist on the cluster")
    text = api.client.get("/metrics").text
    assert 'gate_topic_missing{gate="service-a",topic="payments"} 1.0' in text
    api.publish(*ARTICLE)
    text = api.client.get("/metrics").text
    assert 'gate_topic_missing{gate="service-a",topic="payments"} 0.0' in text


def series(text: str, name: str) -> dict[str, float]:
    """The samples of one metric in an exposition: labels text -> value."""
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) :].rsplit(" ", 1)
            found[labels] = float(value)
    return found


PER_PARTITION = ["gate_watermark", "gate_end_offset", "gate_waiting_seconds"]
PER_GROUP_AND_PARTITION = [
    "gate_committed_offset",
    "gate_dependency_lag",
    "gate_dependency_lag_seconds",
    "gate_dependency_commit_age_seconds",
    "gate_dependency_partition_status",
]


def test_a_group_s_lag_over_all_partitions_is_the_sum_of_its_partitions(api: Harness) -> None:
    api.publish(*ARTICLE)
    text = api.client.get("/metrics").text
    assert series(text, "gate_group_partition_series") == {'{gate="service-a"}': 1.0}
    for name in PER_GROUP_AND_PARTITION:
        assert series(text, name), name
    for group in ("CG-B", "CG-C"):
        parts = {k: v for k, v in series(text, "gate_dependency_lag").items() if group in k}
        assert len(parts) == 3
        overall = series(text, "gate_dependency_group_lag")[f'{{gate="service-a",group="{group}"}}']
        assert overall == sum(parts.values())
    assert series(text, "gate_dependency_group_lag") == {
        '{gate="service-a",group="CG-B"}': (60 - 30) * 2 + (60 - 10),
        '{gate="service-a",group="CG-C"}': (60 - 23) + (60 - 52) + (60 - 15),
    }
    assert set(series(text, "gate_dependency_group_lag_seconds")) == {
        '{gate="service-a",group="CG-B"}',
        '{gate="service-a",group="CG-C"}',
    }


def test_beyond_the_limit_a_gate_and_its_groups_have_series_over_all_partitions_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """3 partitions x (2 groups + the gate) are beyond a limit of 5: no series per partition,
    the gate's nor its groups' (a fleet's would be hundreds of thousands), the gate's series
    and its groups' over all partitions and their missing partitions as before."""
    harness = Harness(status={"metrics_group_partitions_max": 5})
    with harness.client, caplog.at_level(logging.WARNING, "gate.metrics"):
        harness.publish({0: 30, 1: 30}, ARTICLE[1])  # CG-B has no commit on partition 2
        text = harness.client.get("/metrics").text
        harness.client.get("/metrics")
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "gate.metrics"]
    assert warning.startswith("1 gate: partition rows beyond what is left")
    assert "service-a (the first: 9 rows, partitions x (groups + 1), 5 left)" in warning
    assert series(text, "gate_group_partition_series") == {'{gate="service-a"}': 0.0}
    for name in [*PER_GROUP_AND_PARTITION, *PER_PARTITION]:
        assert series(text, name) == {}, name
    assert series(text, "gate_partitions_unreleased") == {'{gate="service-a"}': 1.0}  # 2
    assert set(series(text, "gate_records_waiting")) == {'{gate="service-a"}'}
    assert series(text, "gate_dependency_group_lag") == {  # CG-B: no commit on 2, unknown
        '{gate="service-a",group="CG-C"}': (60 - 23) + (60 - 52) + (60 - 15),
    }
    assert series(text, "gate_dependency_missing_partitions") == {
        '{gate="service-a",group="CG-B"}': 1.0,
        '{gate="service-a",group="CG-C"}': 0.0,
    }
    assert 'gate_dependency_status{gate="service-a",group="CG-B",status="MISSING"} 1.0' in text


def test_the_series_limit_is_the_whole_service_s_gates_first_in_the_configuration_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two gates of 2 groups on 3 partitions (9 partition rows each) and a limit of 12 for
    the service: the first gate in the configuration has its series per partition, the
    second not (9 of 12 used); both keep their own series and their groups' over all
    partitions (before: the limit was per gate, and a fleet of small gates had no bound)."""
    spec = {"topics": ["payments"], "depends_on": ["CG-B", "CG-C"]}
    service = GateService(
        gate_config(
            "127.0.0.1:1",
            {"service-a": spec, "service-d": spec},
            http={"host": "127.0.0.1", "port": 0},
            status={"metrics_group_partitions_max": 12},
        )
    )
    client = TestClient(create_app(service, manage_service=False))
    with client, caplog.at_level(logging.WARNING, "gate.metrics"):
        for gate in ("service-a", "service-d"):
            evaluator = GateEvaluator(gate, ["payments"], ["CG-B", "CG-C"])
            state = evaluator.observe(poll(time.time(), *ARTICLE))
            client.portal.call(service.store.update, state)
        service.answered_at = time.monotonic()
        text = client.get("/metrics").text
    assert series(text, "gate_group_partition_series") == {
        '{gate="service-a"}': 1.0,
        '{gate="service-d"}': 0.0,
    }
    committed = series(text, "gate_committed_offset")
    assert len(committed) == 6 and all('gate="service-a"' in labels for labels in committed)
    end = series(text, "gate_end_offset")
    assert len(end) == 3 and all('gate="service-a"' in labels for labels in end)
    assert set(series(text, "gate_partitions_unreleased")) == {
        '{gate="service-a"}',
        '{gate="service-d"}',
    }
    assert set(series(text, "gate_dependency_group_lag_seconds")) == {
        f'{{gate="{gate}",group="{group}"}}'
        for gate in ("service-a", "service-d")
        for group in ("CG-B", "CG-C")
    }
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "gate.metrics"]
    assert "service-d (the first: 9 rows, partitions x (groups + 1), 3 left)" in warning


def test_metrics_have_build_info_and_no_created_series(api: Harness) -> None:
    api.publish(*ARTICLE)
    api.client.get("/ready", params={"gate": "service-a", "topic": "payments"})
    text = api.client.get("/metrics").text
    assert "gate_polls_total" in text
    assert "_created" not in text
    info = [line for line in text.splitlines() if line.startswith("gate_build_info{")]
    assert len(info) == 1 and info[0].endswith(" 1.0"), info
    assert 'version="' in info[0] and f'python="{platform.python_version()}"' in info[0]


def test_status_explains_who_holds_each_partition(api: Harness) -> None:
    api.publish(*ARTICLE)
    body = api.client.get("/status/service-a").json()
    by_partition = {p["partition"]: p for p in body["partitions"]}
    assert by_partition[0]["holding"] == ["CG-C"]
    assert by_partition[2]["holding"] == ["CG-B"]
    assert by_partition[1]["groups"]["CG-C"]["lag"] == 8
    summary = api.client.get("/status").json()["gates"]["service-a"]
    groups = summary["groups"]
    assert {g: groups[g]["status"] for g in groups} == {"CG-B": "OK", "CG-C": "OK"}
    assert {g: groups[g]["holding"] for g in groups} == {"CG-B": 2, "CG-C": 1}
    assert summary["partition_count"] == 3 and "partitions" not in summary
    assert body["partition_count"] == 3 and len(body["partitions"]) == 3
    assert summary["verdict"]["state"] == "flowing"
    assert summary["verdict"]["records_waiting"] == (60 - 23) + (60 - 30) + (60 - 10)
    assert summary["verdict"]["text"].startswith("flowing: 117 records in transit")


def test_a_gate_s_detail_is_built_off_the_event_loop(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/status/{gate}`` of a large gate takes a quarter of a second to build: ``/ready``
    answers meanwhile (before: it waited for the build, which held the event loop)."""
    api.publish(*ARTICLE)
    building, finish = threading.Event(), threading.Event()
    real = _answers.partitions_json

    def slow(*args: Any, **kwargs: Any) -> bytes:
        building.set()
        finish.wait(20)
        return real(*args, **kwargs)

    monkeypatch.setattr(_answers, "partitions_json", slow)
    answers: dict[str, Any] = {}
    detail = threading.Thread(
        target=lambda: answers.setdefault("detail", api.client.get("/status/service-a"))
    )
    detail.start()
    try:
        assert building.wait(10), "the detail was never built"
        asking = threading.Thread(target=lambda: answers.setdefault("ready", ready(api, 0, 22)))
        asking.start()
        asking.join(10)
        answered_meanwhile = "ready" in answers
    finally:
        finish.set()
        detail.join(20)
    assert answered_meanwhile, "/ready waited for a gate's detail to be built"
    assert answers["ready"].status_code == 200
    assert answers["detail"].status_code == 200
    assert answers["detail"].json()["partition_count"] == 3


def test_status_lists_the_groups_asked_for_on_each_partition(api: Harness) -> None:
    """A fleet's detail shows the groups holding each partition back, or those named."""
    api.publish(*ARTICLE)

    def groups_shown(path: str, **params: object) -> dict[int, list[str]]:
        response = api.client.get(path, params=params)
        assert response.status_code == 200, response.text
        return {p["partition"]: sorted(p["groups"]) for p in response.json()["partitions"]}

    both = ["CG-B", "CG-C"]
    assert groups_shown("/status/service-a") == {0: both, 1: both, 2: both}
    assert groups_shown("/status/service-a", groups="all") == {0: both, 1: both, 2: both}
    holding = {0: ["CG-C"], 1: ["CG-B"], 2: ["CG-B"]}
    assert groups_shown("/status/service-a", groups="holding") == holding
    assert groups_shown("/status/service-a", groups="none") == {0: [], 1: [], 2: []}
    named = {"groups": "none", "group": ["CG-C", "CG-C"]}
    assert groups_shown("/status/service-a", **named) == {0: ["CG-C"], 1: ["CG-C"], 2: ["CG-C"]}
    assert groups_shown("/status/service-a", groups="holding", group="CG-C") == {
        0: ["CG-C"],
        1: both,
        2: both,
    }
    full = api.client.get("/status/service-a").json()
    shown = api.client.get("/status/service-a", params={"groups": "holding"}).json()
    same = ("committed", "lag", "status", "moved_at", "unmoved_s")
    position, whole = shown["partitions"][0]["groups"]["CG-C"], full["partitions"][0]["groups"]
    assert {k: position[k] for k in same} == {k: whole["CG-C"][k] for k in same}

    with api.client.stream(
        "GET", "/status/service-a/stream", params={"groups": "holding"}
    ) as response:
        data = next(line for line in response.iter_lines() if line.startswith("data:"))
    event = json.loads(data.removeprefix("data:"))
    assert {p["partition"]: sorted(p["groups"]) for p in event["partitions"]} == holding

    for path in ("/status/service-a", "/status/service-a/stream"):
        unknown = api.client.get(path, params={"group": ["CG-C", "CG-X"]})
        assert unknown.status_code == 400
        assert unknown.json() == {
            "error": "invalid_request",
            "message": "gate 'service-a' does not depend on 'CG-X' (it depends on CG-B, CG-C)",
        }
        bad = api.client.get(path, params={"groups": "some"})
        assert bad.status_code == 422
        assert bad.json()["error"] == "invalid_request"
        assert bad.json()["message"].startswith("groups: ")


def test_openapi_documents_the_endpoints(api: Harness) -> None:
    paths = api.client.get("/openapi.json").json()["paths"]
    for path in [
        "/ready",
        "/watermarks/{gate}",
        "/watermarks/{gate}/stream",
        "/healthz",
        "/readyz",
        "/metrics",
    ]:
        assert path in paths
    assert "425" in paths["/ready"]["get"]["responses"]


def test_api_token_protects_everything_but_probes() -> None:
    harness = Harness(token="s3cret")
    with harness.client as client:
        harness.publish(*ARTICLE)
        assert client.get("/watermarks/service-a").status_code == 401
        assert client.get("/metrics").status_code == 401
        assert (
            client.get(
                "/watermarks/service-a", headers={"Authorization": "Bearer nope"}
            ).status_code
            == 401
        )
        ok = client.get("/watermarks/service-a", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200


def test_history_keeps_the_last_minutes_for_charts(api: Harness) -> None:
    api.publish(*ARTICLE)
    body = api.client.get("/status/service-a/history").json()
    assert body["gate"] == "service-a" and body["step_s"] > 0 and body["now"] > 0
    (point,) = body["points"]
    assert point["released"] == 23 + 30 + 10
    assert point["waiting"] == 117
    assert point["groups"]["CG-B"]["lag"] == 30 + 30 + 50
    assert api.client.get("/status/nope/history").status_code == 404


def test_history_gives_the_groups_asked_for(api: Harness) -> None:
    """A fleet's charts ask only for the groups they draw: every group's history is
    megabytes at 1,000 groups."""
    api.publish({0: 60, 1: 60, 2: 60}, ARTICLE[1])  # only CG-C holds partitions back

    def groups_in(**params: object) -> list[list[str]]:
        response = api.client.get("/status/service-a/history", params=params)
        assert response.status_code == 200, response.text
        return [sorted(point["groups"]) for point in response.json()["points"]]

    assert groups_in() == [["CG-B", "CG-C"]]
    assert groups_in(groups="holding") == [["CG-C"]]
    assert groups_in(groups="none") == [[]]
    assert groups_in(groups="none", group="CG-B") == [["CG-B"]]
    assert groups_in(groups="holding", group=["CG-B"]) == [["CG-B", "CG-C"]]
    whole = api.client.get("/status/service-a/history").json()["points"][0]
    shown = api.client.get("/status/service-a/history", params={"groups": "holding"}).json()
    assert shown["points"][0] == {**whole, "groups": {"CG-C": whole["groups"]["CG-C"]}}
    unknown = api.client.get("/status/service-a/history", params={"group": "CG-X"})
    assert unknown.status_code == 400 and "does not depend on 'CG-X'" in unknown.json()["message"]


def test_ready_beyond_the_end_of_the_partition_says_so(api: Harness) -> None:
    api.publish({0: 60}, {0: 60})
    response = ready(api, 0, 75)
    assert response.status_code == 425
    assert "beyond the end of payments[0] (60)" in response.json()["reason"]
    assert "waiting for dependency groups" in ready(api, 1, 5).json()["reason"]


def test_the_api_docs_are_served_without_any_other_host(api: Harness) -> None:
    page = api.client.get("/docs")
    assert page.status_code == 200
    assert "https://" not in page.text and "http://" not in page.text
    for asset in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        assert api.client.get(asset).status_code == 200, asset
    assert api.client.get("/redoc").status_code == 200


@pytest.mark.parametrize("reachable", [True, False], ids=["redis up", "redis down"])
def test_readyz_reports_whether_the_configured_redis_answers(
    reachable: bool, redis_url: str
) -> None:
    service = GateService(
        gate_config(
            "127.0.0.1:1",
            {"a": {"topics": ["t"], "depends_on": ["b"]}},
            redis_url=redis_url if reachable else "redis://127.0.0.1:1/0",
        )
    )
    asyncio.run(service._continue_redis_versions())  # what start() does first
    service.answered_at = time.monotonic()
    client = TestClient(create_app(service, manage_service=False))
    with client:
        body = client.get("/readyz").json()
    assert body["ok"] is True  # Redis down never makes the gate unready: HTTP still serves
    assert body["redis"] is reachable
    assert ("redis unreachable" in body["detail"]) is not reachable


def test_status_answers_match_their_documented_schemas(api: Harness) -> None:
    """Every field the status endpoints send is in their response models, and nothing is
    missing (the handlers build JSON directly, so the models must be kept true by hand)."""
    for b, c in (ARTICLE, ({0: 60, 1: 60, 2: 60}, {0: 60, 1: 60, 2: 60})):
        api.publish(b, c)
        for path, model in (
            ("/status", ServiceStatus),
            ("/status/service-a", GateStatus),
            ("/status/service-a/history", GateHistoryBody),
        ):
            body = api.client.get(path).json()
            assert model.model_validate(body).model_dump(mode="json") == body, path


def test_failing_to_read_only_the_dependent_s_group_is_no_poll_error() -> None:
    service = GateService(gate_config("127.0.0.1:1", {"a": {"topics": ["t"], "depends_on": ["b"]}}))
    failed = PollResult(
        started_at=1.0,
        finished_at=1.1,
        partition_counts={"t": 1},
        end_offsets={("t", 0): 10},
        committed={"b": {("t", 0): 5}},
        failed_groups=frozenset({"a", "b"}),
        errors=("group a: not authorized", "group b: coordinator not available"),
    )
    kept = service._set_dependent_errors_apart(failed)
    assert kept.errors == ("group b: coordinator not available",)
    assert service._set_dependent_errors_apart(PollResult(1.0, 1.1, {}, {}, {})).errors == ()
