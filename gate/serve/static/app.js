// The gate's status page: summary first, then partitions, live from the status stream.
"use strict";

const ROW_LIMIT = 200;
// A gate with more dependency groups than this is a fleet: the page asks only for the groups
// holding each partition back (GET /status/{gate}?groups=holding), the partitions table has
// no column per group ("held back by" names them), and the charts are those of the groups
// holding records back, most partitions first.
const GROUP_COLUMNS = 12;
const ALARMS = ["stuck", "missing"];  // verdicts shown red
const state = {
  token: sessionStorage.getItem("gate-token") || "",
  gate: null,          // selected gate
  status: null,        // latest GET /status/{gate} body
  sort: { key: "waiting", desc: true },
  showAll: false,
  stream: null,        // AbortController of the running stream
  history: null,       // latest GET /status/{gate}/history body
  summaries: {},       // latest GET /status body's gates
  fleet: false,        // the selected gate has more than GROUP_COLUMNS groups
};

const $ = (id) => document.getElementById(id);
const fmt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") node.textContent = value;
    else if (key === "className") node.className = value;
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

class Unauthorized extends Error {}

async function api(path, init = {}) {
  const headers = { Accept: "application/json", ...(init.headers || {}) };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  const response = await fetch(path, { ...init, headers });
  if (response.status === 401) throw new Unauthorized();
  return response;
}

// ---- service header and gate tabs -------------------------------------------------------

async function refreshService() {
  let body;
  try {
    const response = await api("/status");
    body = await response.json();
  } catch (error) {
    if (error instanceof Unauthorized) return askForToken();
    if (state.gone !== "gate stopping") showGone("gate unreachable");
    return;
  }
  if (state.gone) return;  // the stream shows the gate again once it answers
  $("login").hidden = true;
  $("service").textContent = body.ready ? "ready" : "not ready";
  $("service").dataset.state = body.ready ? "ready" : "not-ready";
  $("service").title = body.detail;
  const poll = body.last_poll;
  $("poll").textContent = poll
    ? `polls every ${fmt(body.poll_interval_ms)} ms · last took ${poll.duration_ms} ms` +
      (poll.errors.length ? ` · ${poll.errors.length} error(s)` : "")
    : "first poll pending";
  $("redis").textContent = body.redis
    ? `redis ${body.redis.healthy ? "ok" : "down: " + (body.redis.error || "")}` : "";
  state.summaries = body.gates;
  renderTabs(body.gates);
  const failing = (body.failing || {})[state.gate];
  if (failing && !body.gates[state.gate]) {
    showEmpty(`Gate ${state.gate} has no snapshot yet: ${failing.join("; ")}`);
  }
}

function renderTabs(gates) {
  const names = Object.keys(gates);
  const wanted = decodeURIComponent((location.hash.match(/gate=([^&]+)/) || [])[1] || "");
  if (!state.gate || !names.includes(state.gate)) {
    selectGate(names.includes(wanted) ? wanted : names[0]);
  }
  const nav = $("gates");
  nav.replaceChildren(
    ...names.map((name) => {
      const summary = gates[name];
      const held = !summary || summary.held_partitions > 0;
      const alarm = Boolean(summary) && ALARMS.includes(summary.verdict.state);
      const button = el("button", { type: "button", "data-gate": name },
        el("span", { className: "dot", "data-held": String(held), "data-alarm": String(alarm) }), name);
      if (name === state.gate) button.setAttribute("aria-current", "true");
      button.addEventListener("click", () => selectGate(name));
      return button;
    }),
  );
}

function selectGate(name) {
  if (!name || name === state.gate) return;
  state.gate = name;
  state.status = null;
  state.history = null;
  state.showAll = false;
  const summary = state.summaries[name];
  state.fleet = Boolean(summary) && Object.keys(summary.groups).length > GROUP_COLUMNS;
  $("charts").replaceChildren();
  history.replaceState(null, "", `#gate=${encodeURIComponent(name)}`);
  for (const button of $("gates").querySelectorAll("button")) {
    button.toggleAttribute("aria-current", button.dataset.gate === name);
  }
  follow(name);
}

// ---- the live feed: server-sent events read with fetch (so the token can be sent) --------

async function follow(gate) {
  if (state.stream) state.stream.abort();
  const controller = new AbortController();
  state.stream = controller;
  let delay = 500;
  while (!controller.signal.aborted) {
    try {
      const query = state.fleet ? "?groups=holding" : "";
      const response = await api(`/status/${encodeURIComponent(gate)}/stream${query}`, {
        headers: { Accept: "text/event-stream" },
        signal: controller.signal,
      });
      if (response.status === 404) {
        showEmpty(`Gate ${gate} has no snapshot yet (first poll pending).`);
      } else if (response.ok) {
        setLive(true);
        delay = 500;
        await readEvents(response, (event, data) => {
          if (event === "stopping") showGone("gate stopping");
          if (event !== "status" || controller.signal.aborted) return;
          const status = JSON.parse(data);
          if (!state.fleet && Object.keys(status.groups).length > GROUP_COLUMNS) {
            state.fleet = true;  // learnt from the first answer: ask for the holding groups
            follow(gate);
            return;
          }
          const first = !state.status;
          render(status);
          if (first) {
            refreshHistory();
            refreshService();  // the header too, now that the gate has polled
          }
        });
        // Ended without a "stopping" event: reconnect (below) before calling it unreachable.
      }
    } catch (error) {
      if (controller.signal.aborted) return;
      if (error instanceof Unauthorized) return askForToken();
      showGone("gate unreachable");
    }
    setLive(false);
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 10000);
  }
}

async function readEvents(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      let event = "message";
      const data = [];
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(event, data.join("\n"));
    }
  }
}

function setLive(on) {
  if (state.gone) return;  // showGone has said it; the next status event shows the gate
  $("live").textContent = on ? "live" : "reconnecting…";
  $("live").dataset.state = on ? "live" : "off";
}

// ---- rendering ----------------------------------------------------------------------------

const isHeld = (part) => (part.waiting === null ? part.watermark === null : part.waiting > 0);

// A group's lag in records: unknown (never 0) while it has no commit where records are.
function lagText(group) {
  if (group.lag !== null && group.lag !== undefined) return fmt(group.lag);
  return group.status === "MISSING" ? "no commit" : "unknown";
}

function seconds(value, exact = true) {
  if (value === null || value === undefined) return "–";
  const prefix = exact ? "" : "≥ ";
  if (value < 120) return `${prefix}${value.toFixed(1)} s`;
  if (value < 7200) return `${prefix}${Math.round(value / 60)} min`;
  return `${prefix}${(value / 3600).toFixed(1)} h`;
}

function clock(iso) {
  return new Date(iso).toLocaleTimeString([], { hour12: false }) + "." + iso.slice(20, 23);
}

// The gate is stopping or cannot be reached: the page says so and nothing else (what it
// showed last would be news from a dead connection).
function showGone(text) {
  state.gone = text;
  document.body.dataset.gone = "true";  // greys the gates' dots: they are old news
  showEmpty(text);
  $("empty").dataset.state = "gone";
  $("service").textContent = text.replace("gate ", "");
  $("service").dataset.state = "not-ready";
  $("service").title = "";
  $("poll").textContent = "";
  $("redis").textContent = "";
  $("live").textContent = "offline";
  $("live").dataset.state = "off";
}

function render(status) {
  state.gone = null;
  delete document.body.dataset.gone;
  delete $("empty").dataset.state;
  setLive(true);
  state.status = status;
  state.receivedAt = performance.now();  // ages: the server's, plus time since receipt
  $("empty").hidden = true;
  $("loading").hidden = true;
  $("gate").hidden = false;
  $("updated-line").hidden = false;
  $("updated").textContent = new Date().toLocaleTimeString();
  const parts = status.partitions;
  const groups = Object.keys(status.groups);
  const verdict = status.verdict;

  $("card-partitions").textContent = fmt(status.partition_count);
  $("card-held").textContent = fmt(status.held_partitions);
  $("card-waiting").textContent = fmt(status.records_waiting);
  if (verdict.state === "stuck") {
    $("card-wait-label").textContent = "stuck for";
    $("card-wait").textContent = seconds(verdict.stuck_for_s, verdict.stuck_for_exact !== false);
  } else {
    $("card-wait-label").textContent = "released within";
    $("card-wait").textContent = verdict.state === "flowing"
      ? seconds(verdict.released_within_s, verdict.released_within_exact !== false) : "–";
  }
  $("card-version").textContent = `polled ${clock(status.polled_at)} · version ${status.version}`;
  tickAge();

  const box = $("verdict");
  box.dataset.state = verdict.state;
  box.replaceChildren(el("strong", { text: status.gate }), `: ${verdict.text}`);
  if (verdict.state === "stuck" && verdict.stuck_since) {
    const atLeast = verdict.stuck_for_exact === false ? "at least " : "";
    box.append(el("span", { className: "since",
      text: `records have waited since ${atLeast}${clock(verdict.stuck_since)}; it waits for ${verdict.stuck_on.join(", ")}` }));
  } else if (verdict.state === "stuck") {
    box.append(el("span", { className: "since",
      text: `nothing there is released until ${verdict.stuck_on.join(", ")} ${verdict.stuck_on.length === 1 ? "commits" : "commit"}` }));
  }
  if (status.dependent && status.dependent.committed) {
    box.append(el("span", { className: "since",
      text: `${status.dependent.group} has ${fmt(status.dependent.released_unprocessed)} released records to process` +
        (verdict.bottleneck === "dependent" ? " — the dependent itself is the bottleneck" : "") }));
  }
  if (status.missing_topics.length) {
    box.append(el("div", { className: "bad", text: `Missing topics: ${status.missing_topics.join(", ")}` }));
  }

  $("groups").tBodies[0].replaceChildren(...groups.map((g) => {
    const group = status.groups[g];
    return el("tr", { "data-group": g },
      el("td", { text: g }),
      el("td", {}, el("span", { className: "status", "data-status": group.status, text: group.status })),
      el("td", { className: "num", "data-field": "holds", text: fmt(group.holding) }),
      el("td", { className: "num", "data-field": "lag", text: lagText(group) }),
      el("td", { className: "num", "data-field": "lag-s", text: seconds(group.lag_s, group.lag_s_exact) }),
      el("td", { className: "num", "data-field": "unmoved",
        text: seconds(group.unmoved_s, group.unmoved_s_exact !== false) }));
  }));

  const topics = {};
  for (const part of parts) {
    const t = (topics[part.topic] ||= { partitions: 0, held: 0, waiting: 0, by: {} });
    t.partitions += 1;
    if (isHeld(part)) t.held += 1;
    t.waiting += part.waiting || 0;
    for (const g of part.holding) t.by[g] = (t.by[g] || 0) + 1;
  }
  $("topics").tBodies[0].replaceChildren(...Object.entries(topics).map(([topic, t]) => {
    const by = Object.entries(t.by).sort((a, b) => b[1] - a[1]).map(([g, n]) => `${g} (${n})`);
    return el("tr", { "data-topic": topic },
      el("td", { className: "topic", text: topic }),
      el("td", { className: "num", "data-field": "waiting", text: fmt(t.waiting) }),
      el("td", { className: "holding", "data-field": "holding", text: by.join(", ") || "–" }),
      el("td", { className: "num", "data-field": "held", text: fmt(t.held) }),
      el("td", { className: "num", "data-field": "partitions", text: fmt(t.partitions) }));
  }));

  renderPartitions();
  renderCharts();
}

// ---- charts: the last minutes, from GET /status/{gate}/history ----------------------------
// The lines end with the snapshot the cards show, and the headers show its numbers: the
// history is fetched every few seconds, the snapshot arrives after every poll.

async function refreshHistory() {
  const gate = state.gate;
  if (!gate || !state.status) return;
  let body;
  try {
    // A fleet's history only for the groups charted (every group's is megabytes).
    const query = state.fleet
      ? "?" + new URLSearchParams([["groups", "none"], ...charted(state.status).map(([g]) => ["group", g])])
      : "";
    const response = await api(`/status/${encodeURIComponent(gate)}/history${query}`);
    if (!response.ok) return;
    body = await response.json();
  } catch (error) {
    if (error instanceof Unauthorized) askForToken();
    return;
  }
  if (gate !== state.gate) return;
  state.history = body;
  renderCharts();
}

// The groups with a chart: every group, or a fleet's groups holding records back.
function charted(status) {
  const groups = Object.entries(status.groups);
  if (!state.fleet) return groups;
  return groups.filter(([, group]) => group.holding > 0)
    .sort((a, b) => b[1].holding - a[1].holding).slice(0, GROUP_COLUMNS);
}

function number(field, value) {
  return el("span", { "data-field": field, text: value });
}

function renderCharts() {
  const status = state.status;
  const history = state.history;
  if (!status || !history || history.gate !== status.gate) return;
  const now = Date.parse(status.polled_at) / 1000;
  const points = history.points.filter((p) => p.t <= now);
  const start = points.length ? points[0].t : now - history.step_s;
  const series = (key, label, unit, past, current) => ({
    key, label, unit,
    points: [...points.map((p) => ({ t: p.t, v: past(p) })), { t: now, v: current }],
  });
  // Released per second between consecutive points (their times, not the nominal step: polls
  // may be slower than the step, or have failed for a while).
  const rates = points.slice(1).map((p, i) => {
    const dt = p.t - points[i].t;
    return { t: p.t, v: dt > 0 ? Math.max(0, p.released - points[i].released) / dt : null };
  });
  const lastRate = rates.length ? rates[rates.length - 1].v : null;
  const gate = status.gate;
  const charts = [drawChart(`${gate}: released`,
    el("span", { className: "muted" },
      ...(lastRate === null ? [] : [number("rate", fmt(Math.round(lastRate))), "/s now · "]),
      number("waiting", fmt(status.records_waiting)), " waiting"),
    [{ key: "released", label: "released", unit: "/s", points: rates },
      series("records", "records waiting", "records", (p) => p.waiting, status.records_waiting)],
    start, now)];
  for (const [g, group] of charted(status)) {
    const past = (p) => p.groups[g] || {};
    charts.push(drawChart(g,
      el("span", { className: "muted" }, "lag ", number("lag", lagText(group)),
        group.lag === null ? " · " : " records · ",
        number("lag-s", seconds(group.lag_s, group.lag_s_exact))),
      [series("records", "lag", "records", (p) => past(p).lag, group.lag),
        series("seconds", "lag", "s", (p) => past(p).lag_s, group.lag_s)],
      start, now));
  }
  $("charts").replaceChildren(...charts);
}

function tickAge() {
  if (!state.status) return;
  // The server's age of the snapshot when it answered, plus the time since (the browser's
  // clock may be off; its elapsed time is not).
  const age = state.status.age_s + (performance.now() - state.receivedAt) / 1000;
  $("card-age").textContent = `${seconds(age)} old`;
}

function showEmpty(text) {
  $("gate").hidden = true;
  $("loading").hidden = true;
  $("empty").hidden = false;
  $("empty").textContent = text;
}

function askForToken() {
  setLive(false);
  $("service").textContent = "token required";
  $("service").dataset.state = "not-ready";
  $("login").hidden = false;
  $("loading").hidden = true;
  if (state.token) $("login-error").textContent = "That token was refused.";
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  state.token = $("token").value.trim();
  sessionStorage.setItem("gate-token", state.token);
  $("login-error").textContent = "";
  $("loading").hidden = Boolean(state.status);
  const gate = state.gate;
  state.gate = null;
  refreshService().then(() => { if (gate && !state.gate) selectGate(gate); });
});
$("filter").addEventListener("input", renderPartitions);
$("only-held").addEventListener("change", renderPartitions);
$("more").addEventListener("click", () => { state.showAll = true; renderPartitions(); });

refreshService();
setInterval(refreshService, 5000);
setInterval(tickAge, 1000);
setInterval(refreshHistory, 5000);
