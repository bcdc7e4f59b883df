"""The status page in real headless Chromium, against a gate on the real broker."""

from __future__ import annotations

import httpx
import pytest

from tests.browser.support import ARTIFACTS, wait_for_charts
from tests.support import Kafka, gate_config, serve_gate, unique, wait_until

sync_api = pytest.importorskip("playwright.sync_api")


def cell(page, topic: str, partition: int, selector: str) -> str:  # type: ignore[no-untyped-def]
    return page.locator(
        f'#partitions tr[data-topic="{topic}"][data-partition="{partition}"] {selector}'
    ).inner_text()


def test_the_page_shows_what_the_api_says_and_follows_it_live(
    browser, scenario, kafka: Kafka
) -> None:  # type: ignore[no-untyped-def]
    gate, topic, b, c = scenario
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(gate.url + "/")
    page.wait_for_selector("#partitions tbody tr")
    page.wait_for_function("document.getElementById('live').dataset.state === 'live'")

    # The numbers match the API.
    api = httpx.get(f"{gate.url}/status/service-a").json()
    assert len(api["partitions"]) == 4
    for part in api["partitions"]:
        p = part["partition"]
        assert cell(page, topic, p, '[data-field="end"]') == f"{part['end_offset']:,}"
        assert cell(page, topic, p, '[data-field="watermark"]') == f"{part['watermark']:,}"
        for group, pos in part["groups"].items():
            shown = cell(page, topic, p, f'td[data-group="{group}"] [data-field="committed"]')
            assert shown == f"{pos['committed']:,}"
    assert page.locator("#card-partitions").inner_text() == "4"
    assert page.locator("#card-held").inner_text() == "2"
    assert page.locator("#card-waiting").inner_text() == "45"  # (50-20) + (50-35)

    # A blocked partition names the group holding it back; the groups say who holds what.
    assert cell(page, topic, 1, '[data-field="holding"]') == c
    assert cell(page, topic, 0, '[data-field="holding"]') == ""
    assert page.locator("#verdict").inner_text().startswith("service-a: flowing: 45 records")
    assert page.locator(f'#groups tr[data-group="{c}"] [data-field="holds"]').inner_text() == "2"
    assert page.locator(f'#groups tr[data-group="{b}"] [data-field="holds"]').inner_text() == "0"
    assert page.locator(f'#groups tr[data-group="{c}"] [data-field="lag"]').inner_text() == "45"
    assert "s" in page.locator(f'#groups tr[data-group="{c}"] [data-field="lag-s"]').inner_text()
    assert "version" in page.locator("#card-version").inner_text()

    # Charts of the last minutes: the release rate and each group's lag.
    wait_for_charts(page)
    titles = page.locator("#charts .chart .title").all_inner_texts()
    assert any(t.startswith(c) for t in titles) and any(t.startswith(b) for t in titles)

    # Sorted by records waiting, most first.
    first = page.locator("#partitions tbody tr").first
    assert first.get_attribute("data-partition") == "1"

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "status-page.png"), full_page=True)

    # C advances: the page follows without a reload.
    page.evaluate("window.__loaded_once = true")
    kafka.commit(c, topic, {0: 50, 1: 44, 2: 50, 3: 50})
    page.wait_for_function(
        """([topic]) => {
            const row = document.querySelector(`#partitions tr[data-topic="${topic}"][data-partition="1"]`);
            return row && row.querySelector('[data-field="watermark"]').textContent === "44";
        }""",
        arg=[topic],
        timeout=15_000,
    )
    assert page.evaluate("window.__loaded_once") is True, "the page reloaded"
    assert cell(page, topic, 3, '[data-field="holding"]') == ""
    assert page.locator("#card-held").inner_text() == "1"
    assert errors == []


def test_a_stuck_gate_is_an_alarm_naming_the_group(browser, kafka: Kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(2)
    kafka.produce(topic, {0: 30, 1: 30})
    b, c = unique("service-b"), unique("service-c")
    kafka.commit(b, topic, {0: 30, 1: 30})
    kafka.commit(c, topic, {0: 12, 1: 30})
    config = gate_config(
        kafka.bootstrap,
        {"service-a": {"topics": [topic], "depends_on": [b, c]}},
        poll_interval_ms=100,
        status={"stall_after_ms": 1000, "history_step_ms": 200},
    )
    with serve_gate(config) as gate:
        page = browser.new_page()
        page.goto(gate.url + "/")
        page.wait_for_function(
            "document.getElementById('verdict').dataset.state === 'stuck'", timeout=15_000
        )
        text = page.locator("#verdict").inner_text()
        assert text.startswith("service-a: stuck since") and f"on {c}" in text
        assert "18 records waiting" in text
        assert page.locator("#card-wait-label").inner_text() == "stuck for"
        status = page.locator(f'#groups tr[data-group="{c}"] .status').inner_text()
        assert status == "STALLED"
        wait_for_charts(page)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "status-page-stuck.png"), full_page=True)


def test_the_verdict_turns_unknown_while_kafka_is_unreachable(browser, local_broker) -> None:  # type: ignore[no-untyped-def]
    """The page already open when Kafka stops answering: once the snapshot is older than the
    readiness limit, the verdict says it does not know (and what the last poll said), and
    it turns back when polls succeed again."""
    kafka = Kafka(local_broker.bootstrap)
    topic = kafka.create_topic(1)
    kafka.produce(topic, {0: 20})
    b = unique("service-b")
    kafka.commit(b, topic, {0: 5})
    config = gate_config(
        local_broker.bootstrap,
        {"service-a": {"topics": [topic], "depends_on": [b]}},
        poll_interval_ms=100,
        request_timeout_ms=300,
        readiness_max_age_ms=1000,
    )
    with serve_gate(config) as gate:
        page = browser.new_page()
        page.goto(gate.url + "/")
        page.wait_for_function(
            "document.getElementById('verdict').dataset.state === 'flowing'", timeout=15_000
        )
        local_broker.suspend()
        try:
            page.wait_for_function(
                "document.getElementById('verdict').dataset.state === 'unknown'", timeout=15_000
            )
            text = page.locator("#verdict").inner_text()
            assert text.startswith("service-a: unknown: no poll has succeeded for"), text
            assert "said: flowing: 15 records in transit" in text
        finally:
            local_broker.resume()
        page.wait_for_function(
            "document.getElementById('verdict').dataset.state === 'flowing'", timeout=30_000
        )


def test_the_page_fits_a_phone(browser, scenario) -> None:  # type: ignore[no-untyped-def]
    gate = scenario[0]
    page = browser.new_page()
    page.set_viewport_size({"width": 420, "height": 900})
    page.goto(gate.url + "/")
    page.wait_for_selector("#partitions tbody tr")
    wait_for_charts(page)
    # No sideways scroll of the page; wide tables scroll inside their own box.
    assert page.evaluate("document.documentElement.scrollWidth") <= 420
    wide = page.evaluate(
        "[...document.querySelectorAll('.scroll')].some(b => b.scrollWidth > b.clientWidth)"
    )
    assert wide, "the partitions table should be wider than a phone (and scroll on its own)"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "status-page-narrow.png"), full_page=True)


def test_sorting_filtering_and_many_partitions(browser, kafka: Kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(300)
    group = unique("dep")
    kafka.commit(group, topic, {p: 0 for p in range(300)})
    config = gate_config(kafka.bootstrap, {"big": {"topics": [topic], "depends_on": [group]}})
    with serve_gate(config) as gate:
        wait_until(lambda: httpx.get(f"{gate.url}/status/big").status_code == 200)
        page = browser.new_page()
        page.goto(gate.url + "/#gate=big")
        page.wait_for_selector("#partitions tbody tr")
        assert page.locator("#partitions tbody tr").count() == 200  # summary first, then a page
        assert page.locator("#shown").inner_text() == "200 of 300 partitions"
        page.click("#more")
        assert page.locator("#partitions tbody tr").count() == 300
        page.click('#partitions th[data-key="partition"]')
        page.click('#partitions th[data-key="partition"]')  # descending, then ascending
        assert page.locator("#partitions tbody tr").first.get_attribute("data-partition") == "0"
        page.fill("#filter", f"{topic}[299]")
        assert page.locator("#partitions tbody tr").count() == 1


def test_a_fleet_s_page_asks_only_for_the_groups_holding_partitions_back(
    browser, kafka: Kafka
) -> None:  # type: ignore[no-untyped-def]
    """More dependency groups than the page has columns for (12): its stream asks for the
    groups holding each partition back, the table has no column per group, and the charts
    are those of the groups holding records back."""
    topic = kafka.create_topic(3)
    kafka.produce(topic, {0: 20, 1: 20, 2: 20})
    groups = [unique(f"fleet{i:02}") for i in range(13)]
    for group in groups[2:]:
        kafka.commit(group, topic, {0: 20, 1: 20, 2: 20})
    slow, slower = groups[0], groups[1]
    kafka.commit(slow, topic, {0: 15, 1: 20, 2: 20})
    kafka.commit(slower, topic, {0: 20, 1: 5, 2: 8})
    config = gate_config(
        kafka.bootstrap,
        {"fleet": {"topics": [topic], "depends_on": groups}},
        poll_interval_ms=100,
        status={"history_step_ms": 200},
    )
    with serve_gate(config) as gate:
        streams: list[str] = []
        page = browser.new_page()
        histories: list[str] = []
        page.on("request", lambda r: streams.append(r.url) if "/stream" in r.url else None)
        page.on("request", lambda r: histories.append(r.url) if "/history" in r.url else None)
        page.goto(gate.url + "/#gate=fleet")
        page.wait_for_selector("#partitions tbody tr")
        page.wait_for_function("document.getElementById('live').dataset.state === 'live'")
        assert streams[-1].endswith("/status/fleet/stream?groups=holding")
        assert page.locator("#partitions td[data-group]").count() == 0
        assert page.locator("#partitions th.col-group").count() == 0
        assert cell(page, topic, 0, '[data-field="holding"]') == slow
        assert cell(page, topic, 1, '[data-field="holding"]') == slower
        assert cell(page, topic, 2, '[data-field="holding"]') == slower
        assert page.locator("#groups tbody tr").count() == 13  # the groups table has them all
        page.wait_for_function(
            "document.querySelectorAll('#charts .chart svg polyline').length >= 3", timeout=30_000
        )
        titles = page.locator("#charts .chart .title").all_inner_texts()
        charted = [g for g in groups if any(t.startswith(g) for t in titles)]
        assert charted == [slow, slower]
        # Their history alone: every group's is megabytes at 1,000 groups.
        asked = f"/status/fleet/history?groups=none&group={slower}&group={slow}"
        assert histories and histories[-1].endswith(asked)


def test_the_page_asks_for_the_token_when_the_api_needs_one(browser, kafka: Kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(1)
    group = unique("dep")
    kafka.commit(group, topic, {0: 0})
    config = gate_config(
        kafka.bootstrap,
        {"a": {"topics": [topic], "depends_on": [group]}},
        http={"host": "127.0.0.1", "port": 0, "api_token": "page-token"},
    )
    with serve_gate(config) as gate:
        page = browser.new_page()
        page.goto(gate.url + "/")
        page.wait_for_selector("#login:not([hidden])")
        page.fill("#token", "wrong")
        page.click("#login button")
        page.wait_for_function("document.getElementById('login-error').textContent !== ''")
        page.fill("#token", "page-token")
        page.click("#login button")
        page.wait_for_selector("#partitions tbody tr")
        assert page.locator("#login").is_hidden()
