"""The status page's browser fixtures, for every browser test module: one Chromium per
module, and the gate of the main scenario."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import httpx
import pytest

from gate.serve._serve import ServedGate
from tests.browser.support import CHROMIUM_FLAGS, chromium_path
from tests.support import Kafka, gate_config, serve_gate, unique, wait_until


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    executable = chromium_path()
    if executable is None:
        if os.environ.get("REQUIRE_BROWSER"):
            pytest.fail("REQUIRE_BROWSER is set but no Chromium is installed")
        pytest.skip("needs Chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        profile = tempfile.mkdtemp(prefix="chromium-")
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=executable,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def scenario(kafka: Kafka) -> Iterator[tuple[ServedGate, str, str, str]]:
    """Gate service-a on a 4-partition topic waiting for B (ahead) and C (behind on 1 and 3)."""
    topic = kafka.create_topic(4)
    kafka.produce(topic, {p: 50 for p in range(4)})
    b, c = unique("service-b"), unique("service-c")
    kafka.commit(b, topic, {0: 50, 1: 50, 2: 50, 3: 50})
    kafka.commit(c, topic, {0: 50, 1: 20, 2: 50, 3: 35})
    config = gate_config(
        kafka.bootstrap,
        {"service-a": {"topics": [topic], "depends_on": [b, c]}},
        poll_interval_ms=100,
        status={"history_step_ms": 200},
    )
    with serve_gate(config) as gate:
        wait_until(lambda: httpx.get(f"{gate.url}/status/service-a").status_code == 200)
        yield gate, topic, b, c
