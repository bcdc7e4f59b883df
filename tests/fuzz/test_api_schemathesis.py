"""Schemathesis against the gate's OpenAPI document, on a gate polling the real broker: no
5xx, and every response conforms to the documented schema and status codes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.errors import Unsatisfiable

from tests.support import Kafka, gate_config, serve_gate, unique, wait_until

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402

TOKEN = "fuzz-token"
UNREADABLE = "Invalid HTTP request received."
"""uvicorn's answer (400, plain text) to a request its HTTP parser cannot read, such as one
whose query string is longer than it takes; the app never sees it."""


@pytest.fixture(scope="module")
def gate_api(kafka: Kafka) -> Iterator[object]:
    topic = kafka.create_topic(2)
    group = unique("dep")
    kafka.commit(group, topic, {0: 5, 1: 9})
    config = gate_config(
        kafka.bootstrap,
        {"service-a": {"topics": [topic], "depends_on": [group]}},
        http={"host": "127.0.0.1", "port": 0, "api_token": TOKEN, "max_wait_s": 0.2},
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with serve_gate(config) as gate:
        wait_until(
            lambda: (
                httpx.get(f"{gate.url}/watermarks/service-a", headers=headers).status_code == 200
            )
        )
        schema = schemathesis.openapi.from_url(f"{gate.url}/openapi.json")
        schema.config.update(headers=headers)
        yield schema


def test_the_api_never_fails_and_matches_its_schema(gate_api) -> None:  # type: ignore[no-untyped-def]
    from hypothesis import given

    fuzzed: dict[str, int] = {}

    def run(label: str, strategy) -> None:  # type: ignore[no-untyped-def]
        @given(case=strategy)
        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        def fuzz(case) -> None:  # type: ignore[no-untyped-def]
            fuzzed[label] += 1
            response = case.call()
            if response.status_code == 400 and response.text == UNREADABLE:
                # uvicorn's HTTP parser refused the request before the app saw it: its
                # request line and headers together exceed the parser's 80 KB
                assert len(response.request.url or "") > 8_000, response.request.url
                return
            case.validate_response(response)

        fuzz()

    for result in gate_api.get_all_operations():
        operation = result.ok()
        if operation.path.endswith("/stream"):  # endless by design: covered by their own tests
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            label = f"{operation.method.upper()} {operation.path} ({mode.value})"
            fuzzed[label] = 0
            try:
                run(label, operation.as_strategy(generation_mode=mode))
            except Unsatisfiable:  # nothing to get wrong: an operation without parameters
                assert mode is GenerationMode.NEGATIVE
                del fuzzed[label]

    assert len(fuzzed) >= 8, fuzzed
    assert all(count > 0 for count in fuzzed.values()), fuzzed
    print(f"\nfuzzed {sum(fuzzed.values())} cases: {fuzzed}")
