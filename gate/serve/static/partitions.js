// The status page's partitions table: sortable columns, a text filter, held partitions
// only, and 200 rows at a time (uses app.js's state and helpers, called after it loads).
"use strict";

// The columns of the partitions table, most telling first: which partition, how many records
// wait, and who holds them back come before the offsets, so a narrow screen shows them.
// A column per dependency group, unless the gate is a fleet (see GROUP_COLUMNS).
function groupColumns() {
  return state.status && !state.fleet ? Object.keys(state.status.groups) : [];
}

function columns() {
  const groups = groupColumns();
  return [
    { key: "topic", label: "topic", value: (p) => p.topic },
    { key: "partition", label: "partition", num: true, className: "col-partition", value: (p) => p.partition },
    { key: "waiting", label: "records waiting", num: true, value: (p) => p.waiting },
    { key: "holding", label: "held back by", value: (p) => p.holding.join(", ") },
    { key: "oldest", label: "oldest waiting", num: true, value: (p) => (p.waiting ? p.waiting_s : null) },
    { key: "end", label: "end offset", num: true, value: (p) => p.end_offset },
    { key: "watermark", label: "watermark", num: true, value: (p) => p.watermark },
    ...groups.map((g) => ({
      key: `group:${g}`, label: g, num: true, group: g, className: "col-group",
      value: (p) => (p.groups[g] ? p.groups[g].lag : null),
    })),
    ...(state.status && state.status.dependent && state.status.dependent.committed
      ? [{ key: "dependent", label: `${state.status.dependent.group} (dependent)`, num: true, className: "col-group", value: (p) => p.dependent }]
      : []),
  ];
}

// The header row is rebuilt only when the columns change (a group or the dependent comes or
// goes), not after every poll: a click on a column's name is never lost to a redraw.
function renderHead(cols) {
  const head = $("partitions").tHead.rows[0];
  const signature = JSON.stringify(cols.map((c) => [c.key, c.label]));
  if (head.dataset.signature !== signature) {
    head.dataset.signature = signature;
    head.replaceChildren(...cols.map((c) => {
      const th = el("th", { "data-key": c.key, className: [c.num ? "num" : "", c.className || ""].join(" ").trim(),
        title: c.group ? `${c.group}: committed offset (how far behind the end)` : "", text: c.label });
      th.addEventListener("click", () => {
        state.sort = { key: c.key, desc: state.sort.key === c.key ? !state.sort.desc : c.num };
        renderPartitions();
      });
      return th;
    }));
  }
  for (const th of head.cells) {
    if (th.dataset.key === state.sort.key) th.setAttribute("aria-sort", state.sort.desc ? "descending" : "ascending");
    else th.removeAttribute("aria-sort");
  }
}

function renderPartitions() {
  const status = state.status;
  if (!status) return;
  const cols = columns();
  renderHead(cols);

  const query = $("filter").value.trim().toLowerCase();
  const onlyHeld = $("only-held").checked;
  let rows = status.partitions.filter((p) => {
    if (onlyHeld && !isHeld(p)) return false;
    if (!query) return true;
    const text = `${p.topic} ${p.topic}[${p.partition}] ${p.partition} ${Object.keys(p.groups).join(" ")}`;
    return text.toLowerCase().includes(query);
  });
  const sortBy = cols.find((c) => c.key === state.sort.key) || cols[2];
  const sign = state.sort.desc ? -1 : 1;
  rows.sort((a, b) => {
    const x = sortBy.value(a), y = sortBy.value(b);
    if (x === y) return a.topic.localeCompare(b.topic) || a.partition - b.partition;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (typeof x === "string" ? x.localeCompare(y) : x - y) * sign;
  });
  const total = rows.length;
  if (!state.showAll) rows = rows.slice(0, ROW_LIMIT);
  $("shown").textContent = `${fmt(rows.length)} of ${fmt(total)} partitions`;
  $("more").hidden = rows.length >= total;

  $("partitions").tBodies[0].replaceChildren(...rows.map((p) => el("tr",
    { "data-topic": p.topic, "data-partition": p.partition, "data-held": String(isHeld(p)) },
    el("td", { className: "topic" }, p.topic, el("span", { className: "at-partition", text: `[${p.partition}]` })),
    el("td", { className: "num col-partition", text: p.partition }),
    el("td", { className: "num", "data-field": "waiting", text: fmt(p.waiting) }),
    el("td", { className: "holding", "data-field": "holding", text: p.holding.join(", ") }),
    el("td", { className: "num", "data-field": "oldest", text: p.waiting ? seconds(p.waiting_s, p.waiting_s_exact !== false) : "" }),
    el("td", { className: "num", "data-field": "end", text: fmt(p.end_offset) }),
    el("td", { className: "num", "data-field": "watermark", text: p.watermark === null ? "none" : fmt(p.watermark) }),
    ...groupColumns().map((g) => {
      const pos = p.groups[g];
      const cell = el("td", { className: "num", "data-group": g });
      if (!pos) return cell;
      cell.append(el("span", { "data-field": "committed", text: pos.committed === null ? "none" : fmt(pos.committed) }));
      if (pos.lag) cell.append(el("span", { className: "sub", text: `−${fmt(pos.lag)}` }));
      if (pos.status !== "OK") cell.append(el("span", { className: "sub status", "data-status": pos.status, text: pos.status }));
      return cell;
    }),
    ...(status.dependent && status.dependent.committed
      ? [el("td", { className: "num", "data-field": "dependent", text: fmt(p.dependent) })] : []),
  )));
}
