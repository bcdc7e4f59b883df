"""Request size and rate limits of the API, and their pure token bucket."""

from __future__ import annotations

import httpx
from hypothesis import given
from hypothesis import strategies as st

from gate.serve._limits import TokenBucket
from tests.support import Kafka, gate_config, serve_gate, unique, wait_until


@given(
    rate=st.floats(1, 1000),
    burst=st.floats(1, 100),
    gaps=st.lists(st.floats(0, 2), min_size=1, max_size=200),
)
def test_a_bucket_grants_at_most_its_burst_plus_its_rate(rate, burst, gaps) -> None:  # type: ignore[no-untyped-def]
    bucket = TokenBucket(rate, burst, now=0.0)
    now, granted = 0.0, 0
    for gap in gaps:
        now += gap
        wait = bucket.take(now)
        assert wait >= 0
        if wait == 0:
            granted += 1
        else:  # refused: waiting as told is enough for the next one
            probe = TokenBucket(rate, burst, now=0.0)
            probe.tokens, probe.updated = bucket.tokens, bucket.updated
            assert probe.take(now + wait + 1e-9) == 0
    assert granted <= burst + rate * now + 1e-6


def test_requests_beyond_the_limits_are_refused_with_json(kafka: Kafka) -> None:
    topic = kafka.create_topic(1)
    group = unique("dep")
    kafka.commit(group, topic, {0: 3})
    config = gate_config(
        kafka.bootstrap,
        {"a": {"topics": [topic], "depends_on": [group]}},
        http={
            "host": "127.0.0.1",
            "port": 0,
            "max_body_bytes": 2048,
            # A token every 2 s: the burst's 30 requests meet a refusal unless they take
            # over 40 s (at 5 a second, a loaded machine's 30 took long enough to get none).
            "rate_limit_per_s": 0.5,
            "rate_limit_burst": 10,
        },
    )
    with serve_gate(config) as gate:
        wait_until(lambda: httpx.get(f"{gate.url}/readyz").status_code == 200)
        big = {
            "gate": "a",
            "records": [{"topic": topic, "partition": 0, "offset": i} for i in range(200)],
        }
        too_large = httpx.post(f"{gate.url}/ready", json=big)
        assert too_large.status_code == 413
        assert too_large.json()["error"] == "too_large"

        def chunks():  # type: ignore[no-untyped-def]
            for _ in range(10):
                yield b" " * 1000  # no Content-Length: counted as it arrives

        streamed = httpx.post(
            f"{gate.url}/ready", content=chunks(), headers={"content-type": "application/json"}
        )
        assert streamed.status_code == 413

        # Tokens refill while the requests run (slowly on a loaded machine), so the refused
        # response is taken from the burst itself rather than from one more request after it.
        responses = [httpx.get(f"{gate.url}/watermarks/a") for _ in range(30)]
        assert responses[0].status_code == 200
        limited = next(r for r in responses if r.status_code == 429)
        assert limited.json()["error"] == "rate_limited"
        assert int(limited.headers["retry-after"]) >= 1
        # Probes are never limited.
        assert {httpx.get(f"{gate.url}/healthz").status_code for _ in range(20)} == {200}
