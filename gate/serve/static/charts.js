// Charts of the status page: each a legend, one plot per series with its own scale (the
// top labelled with its value and unit, the bottom 0) and a shared time axis ending now.
// Pure drawing: series in, DOM nodes out.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

// A series: { key, label, unit, points: [{ t, v }] }; unit is "records", "/s" or "s".
const UNIT_NAMES = { records: "records", "/s": "records/s", s: "time" };

function niceCeiling(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (step * power >= value) return step * power;
  }
  return 10 * power;
}

function compact(value) {
  if (value >= 1e6) return `${+(value / 1e6).toFixed(1)}M`;
  if (value >= 1e4) return `${+(value / 1e3).toFixed(0)}k`;
  if (value >= 1e3) return `${+(value / 1e3).toFixed(1)}k`;
  return `${+value.toFixed(value < 10 ? 1 : 0)}`;
}

function duration(value) {
  if (value < 120) return `${+value.toFixed(value < 10 ? 1 : 0)} s`;
  if (value < 7200) return `${+(value / 60).toFixed(1)} min`;
  return `${+(value / 3600).toFixed(1)} h`;
}

function axisLabel(value, unit) {
  if (unit === "s") return duration(value);
  if (unit === "/s") return `${compact(value)}/s`;
  return `${compact(value)} record${value === 1 ? "" : "s"}`;
}

function plot(series, start, end) {
  const known = series.points.filter((p) => p.v !== null && p.v !== undefined);
  const top = niceCeiling(Math.max(0, ...known.map((p) => p.v)));
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("class", series.key);
  svg.dataset.series = series.key;
  svg.setAttribute("viewBox", "0 0 100 40");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${series.label}, 0 to ${axisLabel(top, series.unit)}`);
  for (const y of [1, 20, 39]) {
    const grid = document.createElementNS(SVG_NS, "line");
    grid.setAttribute("class", "grid");
    grid.setAttribute("x1", "0");
    grid.setAttribute("x2", "100");
    grid.setAttribute("y1", String(y));
    grid.setAttribute("y2", String(y));
    svg.append(grid);
  }
  if (known.length) {
    const width = Math.max(end - start, 1e-9);
    const line = document.createElementNS(SVG_NS, "polyline");
    line.setAttribute("points", known.map((p) =>
      `${(((p.t - start) / width) * 100).toFixed(2)},${(39 - (p.v / top) * 38).toFixed(2)}`).join(" "));
    svg.append(line);
  }
  const axis = document.createElement("div");
  axis.className = "y-axis";
  axis.append(
    Object.assign(document.createElement("span"), { className: "y-max", textContent: axisLabel(top, series.unit) }),
    Object.assign(document.createElement("span"), { className: "y-min", textContent: "0" }),
  );
  const node = document.createElement("div");
  node.className = "plot";
  node.dataset.series = series.key;
  node.append(axis, svg);
  return node;
}

function legend(seriesList) {
  const list = document.createElement("ul");
  list.className = "legend";
  for (const series of seriesList) {
    const item = document.createElement("li");
    item.dataset.series = series.key;
    const swatch = document.createElement("span");
    swatch.className = `swatch ${series.key}`;
    item.append(swatch, `${series.label} (${UNIT_NAMES[series.unit]})`);
    list.append(item);
  }
  return list;
}

function timeAxis(start, end) {
  const span = Math.max(0, end - start);
  const axis = document.createElement("div");
  axis.className = "time-axis";
  for (const text of [`−${duration(span)}`, `−${duration(span / 2)}`, "now"]) {
    axis.append(Object.assign(document.createElement("span"), { textContent: text }));
  }
  return axis;
}

// One chart: its title (with the current numbers, given by the caller), legend, plots and
// time axis, from `start` to `end` (seconds since the epoch).
function drawChart(name, header, seriesList, start, end) {
  const node = document.createElement("div");
  node.className = "chart";
  node.dataset.chart = name;
  const title = document.createElement("div");
  title.className = "title";
  title.append(`${name} `, header);
  node.append(title, legend(seriesList));
  for (const series of seriesList) node.append(plot(series, start, end));
  node.append(timeAxis(start, end));
  return node;
}
