"""The status page's layout, measured in real headless Chromium against a gate on the real
broker: chart legends and scales, chart headers that agree with the cards, tables that fit
the window, and what the page shows before its first update."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gate.serve._serve import ServedGate
from tests.browser.support import ARTIFACTS, wait_for_charts
from tests.support import Kafka

# The elements a selector finds, each read at once: its text, its box as drawn (after any
# scrolling of its boxes) and whether that box lies inside the window. Found and measured in
# one evaluation: the page redraws its tables after every poll, so an element found by one
# call may be replaced (detached, a box of zeros) before the next call measures it.
READ_BOXES = """(selector) => [...document.querySelectorAll(selector)].map((node) => {
    const box = node.getBoundingClientRect();
    return {
        text: node.innerText,
        box: box.toJSON(),
        inside: box.width > 0 && box.left >= 0
            && box.right <= document.documentElement.clientWidth,
    };
})"""


def boxes(page, selector: str) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """Every element ``selector`` finds, as drawn at one instant (see READ_BOXES)."""
    found: list[dict[str, Any]] = page.evaluate(READ_BOXES, selector)
    assert found, f"nothing on the page matches {selector!r}"
    return found


def box(page, selector: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The one element ``selector`` finds, as drawn (see READ_BOXES)."""
    found = boxes(page, selector)
    assert len(found) == 1, f"{len(found)} elements match {selector!r}"
    return found[0]


def open_page(browser, gate: ServedGate, width: int):  # type: ignore[no-untyped-def]
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(gate.url + "/")
    page.wait_for_selector("#partitions tbody tr")
    page.errors = errors
    return page


# The charts as drawn, read at once (they are redrawn after every poll).
READ_CHARTS = """() => [...document.querySelectorAll('#charts .chart')].map(chart => ({
    name: chart.dataset.chart,
    lines: [...chart.querySelectorAll('svg polyline')].map(line => ({
        series: line.closest('svg').dataset.series,
        stroke: getComputedStyle(line).stroke,
        top: chart.querySelector(
            `.plot[data-series="${line.closest('svg').dataset.series}"] .y-max`).textContent,
        bottom: chart.querySelector(
            `.plot[data-series="${line.closest('svg').dataset.series}"] .y-min`).textContent,
    })),
    legend: Object.fromEntries([...chart.querySelectorAll('.legend [data-series]')].map(item => [
        item.dataset.series,
        {text: item.textContent,
         colour: getComputedStyle(item.querySelector('.swatch')).backgroundColor},
    ])),
    ticks: [...chart.querySelectorAll('.time-axis span')].map(tick => tick.textContent),
}))"""


def test_every_chart_has_a_legend_a_scale_with_units_and_a_time_axis(browser, scenario) -> None:  # type: ignore[no-untyped-def]
    gate, _, b, c = scenario
    page = open_page(browser, gate, 1280)
    wait_for_charts(page)
    charts = page.evaluate(READ_CHARTS)
    assert [chart["name"] for chart in charts] == ["service-a: released", b, c]
    for chart in charts:
        # One legend entry per line, in the line's colour, naming what it draws.
        assert len(chart["lines"]) == len(chart["legend"]) >= 2, chart
        for line in chart["lines"]:
            entry = chart["legend"][line["series"]]
            assert entry["text"].strip(), chart
            assert entry["colour"] == line["stroke"], chart
            # A scale: the top of the plot is labelled with its value and unit, the bottom 0.
            assert re.fullmatch(r"[\d.,]+[kM]? ?(records?|/s|s|min|h)", line["top"]), chart
            assert line["bottom"] == "0", chart
        # A time axis: from some time ago to now.
        ticks = chart["ticks"]
        assert len(ticks) >= 2 and ticks[-1] == "now", chart
        assert re.fullmatch(r"−[\d.]+ (s|min|h)", ticks[0]), chart
    names = [entry["text"] for chart in charts for entry in chart["legend"].values()]
    assert names[:2] == ["released (records/s)", "records waiting (records)"], names
    assert names[2:4] == ["lag (records)", "lag (time)"], names
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#charts").screenshot(path=str(ARTIFACTS / "status-page-charts.png"))
    assert page.errors == []


READ_HEADERS = """() => {
    const chart = [...document.querySelectorAll('#charts .chart')];
    const headers = {};
    for (const c of chart) headers[c.dataset.chart] = c.querySelector('.title').textContent;
    const lags = {};
    for (const row of document.querySelectorAll('#groups tbody tr')) {
        lags[row.dataset.group] = [row.querySelector('[data-field="lag"]').textContent,
                                   row.querySelector('[data-field="lag-s"]').textContent];
    }
    return {waiting: document.getElementById('card-waiting').textContent, headers, lags};
}"""


def test_chart_headers_show_the_numbers_of_the_cards(browser, scenario, kafka: Kafka) -> None:  # type: ignore[no-untyped-def]
    """The headers of the charts and the cards come from the same snapshot: read together,
    right after each change, they agree."""
    gate, topic, b, c = scenario
    page = open_page(browser, gate, 1280)
    wait_for_charts(page)
    for committed in (25, 30, 38, 44, 50):
        kafka.commit(c, topic, {1: committed})
        waiting = f"{(50 - committed) + 15:,}"
        page.wait_for_function(
            f"document.getElementById('card-waiting').textContent === {waiting!r}",
            timeout=15_000,
        )
        seen = page.evaluate(READ_HEADERS)
        assert seen["waiting"] == waiting
        released = seen["headers"]["service-a: released"]
        assert re.search(r"([\d,]+) waiting", released).group(1) == waiting, released
        for group in (b, c):
            header = seen["headers"][group]
            lag, lag_s = seen["lags"][group]
            assert f"lag {lag} records · {lag_s}" in header, (header, lag, lag_s)
    assert page.errors == []


def test_every_table_fits_a_1280_px_window(browser, scenario, kafka: Kafka) -> None:  # type: ignore[no-untyped-def]
    gate, topic, _, _ = scenario
    kafka.commit("service-a", topic, {p: 40 for p in range(4)})  # the dependent's column too
    page = open_page(browser, gate, 1280)
    page.wait_for_selector('#partitions td[data-field="dependent"]')
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    for table in ("groups", "topics", "partitions"):
        right = page.locator(f"#{table}").evaluate("t => t.getBoundingClientRect().right")
        assert right <= 1280, f"the {table} table ends at {right} px"
        cut = page.locator(f"#{table}").evaluate(
            "t => t.parentElement.scrollWidth > t.parentElement.clientWidth"
        )
        assert not cut, f"the {table} table scrolls sideways at 1280 px"
        for head in boxes(page, f"#{table} th"):
            assert head["inside"], f"{table}: column {head['text']!r} is cut: {head['box']}"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "status-page-1280.png"), full_page=True)
    assert page.errors == []


def test_held_back_by_stays_in_view_on_a_420_px_phone(browser, scenario) -> None:  # type: ignore[no-untyped-def]
    gate, topic, _, c = scenario
    page = open_page(browser, gate, 420)
    wait_for_charts(page)
    assert page.evaluate("document.documentElement.scrollWidth") <= 420
    head = box(page, '#partitions th[data-key="holding"]')
    assert head["inside"], head
    for partition in (1, 3):  # the partitions C holds back: its name is in view
        holding = box(page, f'#partitions tr[data-partition="{partition}"] [data-field="holding"]')
        assert holding["text"] == c and holding["inside"], holding
    # Which partition a row is stays in view too.
    first = box(page, '#partitions tr[data-partition="1"] td:first-child')
    assert first["inside"] and "[1]" in first["text"].replace(" ", ""), first
    # The topics table's "mostly held by" too.
    mostly = box(page, f'#topics tr[data-topic="{topic}"] [data-field="holding"]')
    assert mostly["text"] == f"{c} (2)" and mostly["inside"], mostly
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "status-page-420.png"), full_page=True)
    assert page.errors == []


@pytest.mark.parametrize("width", [1280, 420])
def test_before_the_first_update_the_page_says_it_is_connecting(browser, scenario, width) -> None:  # type: ignore[no-untyped-def]
    """The gate's stream held back: the page says it is connecting, not a blank page that
    was "updated never"; the first update replaces it."""
    gate = scenario[0]
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": 700})
    held: list[object] = []
    page.route("**/status/*/stream*", lambda route: held.append(route))
    page.goto(gate.url + "/")
    page.wait_for_function("document.querySelector('#gates button') !== null")
    for _ in range(200):  # until the page has asked for the stream (held here)
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the page did not ask for the stream"
    loading = page.locator("#loading")
    assert loading.is_visible()
    assert loading.inner_text() == "connecting to the gate…"
    assert "never" not in page.locator("body").inner_text()
    assert page.locator("#gate").is_hidden()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"status-page-connecting-{width}.png"), full_page=True)
    for route in held:
        route.continue_()  # type: ignore[attr-defined]
    page.unroute("**/status/*/stream*")
    page.wait_for_selector("#partitions tbody tr")
    assert loading.is_hidden()
    assert "updated" in page.locator("footer").inner_text()
