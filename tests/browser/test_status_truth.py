"""The status page tells the truth: a gate over a topic that does not exist is an alarm, a
group far behind is not OK, and a gate that stops or cannot be reached says so and nothing
else (no verdict from a dead connection). Real headless Chromium, a gate on the real broker;
screenshots go to tests/artifacts/."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.browser.support import ARTIFACTS
from tests.support import Kafka, gate_config, serve_gate, unique, wait_until

sync_api = pytest.importorskip("playwright.sync_api")

RED = "rgb(185, 28, 28)"  # --bad
AMBER = "rgb(180, 83, 9)"  # --warn


def style(page, selector: str, prop: str) -> str:  # type: ignore[no-untyped-def]
    """A computed style of the element ``selector`` finds, found and read in one evaluation
    (the page redraws its tables and tabs; an element found by one call may be replaced
    before the next reads it)."""
    return page.evaluate(
        "([selector, prop]) => getComputedStyle(document.querySelector(selector))[prop]",
        [selector, prop],
    )


def colour(page, selector: str) -> str:  # type: ignore[no-untyped-def]
    return style(page, selector, "backgroundColor")


def screenshot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def test_a_gate_over_a_missing_topic_is_a_red_alarm(browser, kafka: Kafka) -> None:  # type: ignore[no-untyped-def]
    missing = unique("no-such-topic")
    config = gate_config(
        kafka.bootstrap,
        {"service-a": {"topics": [missing], "depends_on": [unique("service-b")]}},
        poll_interval_ms=100,
    )
    with serve_gate(config) as gate:
        wait_until(lambda: httpx.get(f"{gate.url}/status/service-a").status_code == 200)
        page = browser.new_page()
        page.goto(gate.url + "/")
        page.wait_for_function(
            "document.getElementById('verdict').dataset.state === 'missing'", timeout=15_000
        )
        text = page.locator("#verdict").inner_text()
        assert text.startswith(f"service-a: missing: topic {missing} does not exist"), text
        assert "every record is released" not in text
        dot = '#gates button[data-gate="service-a"] .dot'
        page.wait_for_function(
            f"document.querySelector('{dot}').dataset.alarm === 'true'", timeout=15_000
        )
        assert colour(page, dot) == RED
        assert style(page, "#verdict", "borderLeftColor") == RED
        screenshot(page, "status-page-missing-topic.png")


def test_a_group_far_behind_is_behind_not_ok(browser, kafka: Kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 30, 1: 30})
    b, c = unique("service-b"), unique("service-c")
    kafka.commit(b, topic, {0: 30, 1: 30})
    kafka.commit(c, topic, {0: 12, 1: 30})  # far behind on 0, and its lag does not grow
    config = gate_config(
        kafka.bootstrap,
        {"service-a": {"topics": [topic], "depends_on": [b, c]}},
        poll_interval_ms=100,
        status={"stall_after_ms": 600_000, "behind_after_ms": 1000},
    )
    with serve_gate(config) as gate:
        page = browser.new_page()
        page.goto(gate.url + "/")
        status = f'#groups tr[data-group="{c}"] .status'
        page.wait_for_selector(status)
        page.wait_for_function(
            f"document.querySelector('{status}').textContent === 'BEHIND'", timeout=15_000
        )
        assert style(page, status, "color") == AMBER
        assert page.locator(f'#groups tr[data-group="{b}"] .status').inner_text() == "OK"
        verdict = page.locator("#verdict").inner_text()
        assert verdict.startswith("service-a: flowing: 18 records in transit"), verdict
        assert verdict.endswith(f"held back by {c}"), verdict
        screenshot(page, "status-page-behind.png")


def test_a_stopping_gate_shows_that_and_nothing_else(browser, kafka: Kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 30})
    b = unique("service-b")
    kafka.commit(b, topic, {0: 12})
    config = gate_config(
        kafka.bootstrap,
        {"service-a": {"topics": [topic], "depends_on": [b]}},
        poll_interval_ms=100,
        status={"stall_after_ms": 1000},
    )
    gate = serve_gate(config).start()
    try:
        page = browser.new_page()
        page.goto(gate.url + "/")
        page.wait_for_function(
            "document.getElementById('verdict').dataset.state === 'stuck'", timeout=15_000
        )
        page.evaluate(
            """() => {
                window.__said = [];
                const empty = document.getElementById('empty');
                new MutationObserver(() => window.__said.push(empty.textContent))
                    .observe(empty, {childList: true, characterData: true, subtree: true});
            }"""
        )
    finally:
        gate.stop()
    page.wait_for_function(
        "document.getElementById('gate').hidden"
        " && document.getElementById('empty').textContent === 'gate unreachable'",
        timeout=15_000,
    )
    assert "gate stopping" in page.evaluate("window.__said")  # the gate said so as it stopped
    shown = page.locator("body").inner_text()
    for stale in ("stuck", "STALLED", "flowing", "released", "old"):
        assert stale not in shown, shown  # nothing derived from the dead connection
    assert page.locator("#live").get_attribute("data-state") == "off"
    assert page.locator("#live").inner_text() != "live"
    assert page.locator("#service").inner_text() == "unreachable"
    assert colour(page, '#gates button[data-gate="service-a"] .dot') == "rgb(156, 163, 175)"
    screenshot(page, "status-page-gate-stopped.png")


def test_a_dependency_that_never_committed_is_a_red_alarm_at_once(browser, kafka: Kafka) -> None:  # type: ignore[no-untyped-def]
    """A misspelt dependency (it has never committed): the first update is an alarm naming
    it and suggesting the group of the close name, its lag is no commit (never 0), and the
    ages of records older than the gate are lower bounds."""
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 20, 1: 20})
    b, c = unique("service-b"), unique("service-c")
    kafka.commit(b, topic, {0: 20, 1: 20})
    kafka.commit(c, topic, {0: 20, 1: 20})
    misspelt = c + "c"
    config = gate_config(
        kafka.bootstrap,
        {"service-a": {"topics": [topic], "depends_on": [b, misspelt]}},
        poll_interval_ms=100,
        status={"stall_after_ms": 600_000},
    )
    with serve_gate(config) as gate:
        page = browser.new_page()
        page.goto(gate.url + "/")
        page.wait_for_function(
            "document.getElementById('verdict').dataset.state === 'stuck'", timeout=15_000
        )
        page.wait_for_function(
            "document.getElementById('verdict').textContent.includes('did you mean')",
            timeout=15_000,
        )
        text = page.locator("#verdict").inner_text()
        assert f"{misspelt} has never committed on {topic}[0], {topic}[1]" in text, text
        assert f"did you mean '{c}'?" in text, text
        assert "all 40 records there wait" in text, text
        assert "flowing" not in text and "released within" not in text
        assert style(page, "#verdict", "borderLeftColor") == RED
        row = f'#groups tr[data-group="{misspelt}"]'
        assert page.locator(f"{row} .status").inner_text() == "MISSING"
        assert page.locator(f'{row} [data-field="lag"]').inner_text() == "no commit"
        oldest = page.locator('#partitions [data-field="oldest"]').first.inner_text()
        assert oldest.startswith("≥ "), oldest  # the records are older than the gate
        screenshot(page, "status-page-never-committed.png")


def stamped(kafka: Kafka, topic: str, count: int, at_ms: int) -> None:
    """``count`` records on partition 0, each with the CreateTime ``at_ms``."""
    producer = kafka.producer()
    for i in range(count):
        producer.produce(topic, value=str(i).encode(), partition=0, timestamp=at_ms)
    producer.flush(30)


def test_ages_older_than_the_gate_are_lower_bounds(browser, kafka: Kafka) -> None:  # type: ignore[no-untyped-def]
    """Records produced before the gate started whose timestamps cannot place them (a
    producer's clock an hour ahead): how long they wait is shown as at least (≥) in the
    verdict, the card and the partitions, poll after poll."""
    topic = kafka.create_topic(1)
    stamped(kafka, topic, 30, int((time.time() + 3600) * 1000))
    b = unique("service-b")
    kafka.commit(b, topic, {0: 12})
    time.sleep(2.0)
    config = gate_config(
        kafka.bootstrap,
        {"service-a": {"topics": [topic], "depends_on": [b]}},
        poll_interval_ms=100,
        status={"stall_after_ms": 600_000},
    )
    with serve_gate(config) as gate:
        page = browser.new_page()
        page.goto(gate.url + "/")
        page.wait_for_function(
            "document.getElementById('verdict').dataset.state === 'flowing'", timeout=15_000
        )
        time.sleep(1.0)  # ten polls: their timestamps were read, and not taken
        page.reload()
        page.wait_for_function(
            "document.getElementById('verdict').dataset.state === 'flowing'", timeout=15_000
        )
        text = page.locator("#verdict").inner_text()
        assert "released within ≥ " in text, text
        assert page.locator("#card-wait").inner_text().startswith("≥ ")
        oldest = page.locator('#partitions [data-field="oldest"]').first.inner_text()
        assert oldest.startswith("≥ "), oldest
        screenshot(page, "status-page-lower-bounds.png")


def test_ages_older_than_the_gate_are_exact_from_the_records_timestamps(
    browser, kafka: Kafka
) -> None:  # type: ignore[no-untyped-def]
    """Records produced ten minutes before the gate started: their own timestamps give
    their age, shown exactly (no ≥), not as the time since the gate started."""
    topic = kafka.create_topic(1)
    stamped(kafka, topic, 30, int((time.time() - 600) * 1000))
    b = unique("service-b")
    kafka.commit(b, topic, {0: 12})
    config = gate_config(
        kafka.bootstrap,
        {"service-a": {"topics": [topic], "depends_on": [b]}},
        poll_interval_ms=100,
        status={"stall_after_ms": 3_600_000},
    )
    with serve_gate(config) as gate:
        page = browser.new_page()
        page.goto(gate.url + "/")
        page.wait_for_function(
            "document.getElementById('verdict').dataset.state === 'flowing' && "
            "!document.getElementById('verdict').innerText.includes('≥')",
            timeout=15_000,
        )
        text = page.locator("#verdict").inner_text()
        assert re.search(r"released within (9|10) min", text), text
        assert not page.locator("#card-wait").inner_text().startswith("≥ ")
        oldest = page.locator('#partitions [data-field="oldest"]').first.inner_text()
        assert not oldest.startswith("≥ "), oldest
        screenshot(page, "status-page-exact-ages.png")


def test_a_stalled_holder_is_an_alarm_at_once(browser, kafka: Kafka) -> None:  # type: ignore[no-untyped-def]
    """b stops at 10; c, lower, catches up to it later, so the watermark moved recently:
    the moment b shows STALLED, the verdict is the alarm, not flowing."""
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 30})
    b, c = unique("service-b"), unique("service-c")
    kafka.commit(b, topic, {0: 10})
    kafka.commit(c, topic, {0: 5})
    config = gate_config(
        kafka.bootstrap,
        {"service-a": {"topics": [topic], "depends_on": [b, c]}},
        poll_interval_ms=100,
        status={"stall_after_ms": 4000},
    )
    with serve_gate(config) as gate:
        page = browser.new_page()
        page.goto(gate.url + "/")
        page.wait_for_selector(f'#groups tr[data-group="{b}"] .status')
        time.sleep(2.0)
        kafka.commit(c, topic, {0: 10})  # the watermark moves to b's offset now
        status = f'#groups tr[data-group="{b}"] .status'
        page.wait_for_function(
            f"document.querySelector('{status}').textContent === 'STALLED'", timeout=20_000
        )
        state = page.evaluate("document.getElementById('verdict').dataset.state")
        text = page.locator("#verdict").inner_text()
        assert state == "stuck", text
        assert f"on {b}" in text and "flowing" not in text, text
        assert style(page, "#verdict", "borderLeftColor") == RED
        screenshot(page, "status-page-stalled-holder.png")
