"""`gate status`: the status page's summary as terminal tables (rich), from a running gate."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

STATUS_STYLES = {
    "OK": "green",
    "LAGGING": "yellow",
    "BEHIND": "bold yellow",
    "STALLED": "bold red",
    "REWOUND": "bold red",
    "MISSING": "bold red",
}


FLEET_GROUPS = 12
"""A gate with more dependency groups is shown as a fleet, as on the status page: its detail
is asked for the groups holding each partition back alone (``?groups=holding``; every
group's is megabytes at 1,000 groups), and its partitions table has no column per group
("held back by" names them)."""


def _fleet(summary: Mapping[str, Any]) -> bool:
    return len(summary["groups"]) > FLEET_GROUPS


class StatusError(Exception):
    """The gate could not be asked (unreachable, refused the token, unknown gate)."""


@dataclass
class StatusClient:
    url: str
    token: str | None = None
    timeout: float = 5.0

    def get(self, path: str) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            response = httpx.get(self.url.rstrip("/") + path, headers=headers, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise StatusError(f"cannot reach the gate at {self.url}: {exc}") from exc
        if response.status_code == 401:
            raise StatusError("the gate requires an API token (--token or GATE_API_TOKEN)")
        try:
            body = response.json()
        except ValueError as exc:
            raise StatusError(f"{self.url}{path} did not answer JSON (is this a gate?)") from exc
        if response.status_code >= 400:
            raise StatusError(body.get("message", f"HTTP {response.status_code}"))
        return body

    def collect(self, gate: str | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The service's status and the detailed status of the chosen (or every) gate."""
        service = self.get("/status")
        names = list(service["gates"]) if gate is None else [gate]
        if gate is not None and gate not in service["gates"]:
            known = ", ".join(service["gates"]) or "none"
            raise StatusError(f"no gate named {gate!r} (gates: {known})")
        details = [
            self.get(f"/status/{name}" + ("?groups=holding" if _fleet(summary) else ""))
            for name in names
            if (summary := service["gates"].get(name))
        ]
        return service, details

    def view(self, gate: str | None, limit: int) -> Group:
        """The rendered status; an answer of another shape (a gate of another version) is
        a :class:`StatusError`, not a traceback."""
        try:
            service, details = self.collect(gate)
            return render(service, details, limit)
        except (KeyError, TypeError, AttributeError) as exc:
            raise StatusError(
                f"the gate at {self.url} answered in a shape this gate status does not know "
                f"(missing {exc}): is it another version of the gate?"
            ) from None


def _num(value: int | None) -> str:
    return "–" if value is None else f"{value:,}"


def render(service: Mapping[str, Any], details: list[Mapping[str, Any]], limit: int) -> Group:
    ready = Text("ready", style="bold green") if service["ready"] else Text("not ready", "bold red")
    poll = service.get("last_poll")
    line = Text.assemble(
        ready,
        f"  {service['detail']}",
        f"  · polls every {service['poll_interval_ms']:,} ms",
        f" · last took {poll['duration_ms']} ms" if poll else " · first poll pending",
    )
    redis = service.get("redis")
    if redis:
        line.append(" · redis ")
        line.append("ok" if redis["healthy"] else f"down: {redis['error']}",
                    style="green" if redis["healthy"] else "red")  # fmt: skip
    parts: list[RenderableType] = [line]
    pending = [name for name, summary in service["gates"].items() if summary is None]
    failing = service.get("failing") or {}
    for name in pending:
        why = "; ".join(failing[name]) if name in failing else "first poll pending"
        parts.append(Text(f"\n{name}: no snapshot yet ({why})", style="yellow"))
    for detail in details:
        parts.extend(_gate(detail, limit))
    return Group(*parts)


VERDICT_STYLES = {
    "released": "green",
    "flowing": "green",
    "stuck": "bold red",
    "missing": "bold red",
    "unknown": "bold yellow",
}


def _gate(status: Mapping[str, Any], limit: int) -> list[RenderableType]:
    partitions = status["partitions"]
    groups = status["groups"]
    verdict = status["verdict"]
    line = Text(f"\n{status['gate']}", style="bold")
    line.append(f": {verdict['text']}", style=VERDICT_STYLES[verdict["state"]])
    line.append(
        f"\n{status['partition_count']:,} partitions · {status['held_partitions']:,} held back · "
        f"snapshot {status['age_s']:.1f} s old · version {status['version']} "
        f"({status['polled_at']})",
        style="dim",
    )
    dependent = status.get("dependent")
    if dependent and dependent["committed"]:
        line.append(
            f"\ndependent {dependent['group']}: {dependent['released_unprocessed']:,} released "
            "records not processed yet",
            style="dim",
        )
    if status["missing_topics"]:
        line.append(f"\nmissing topics: {', '.join(status['missing_topics'])}", style="red")
    if status.get("missing_partitions"):
        missing = ", ".join(status["missing_partitions"])
        line.append(f"\nmissing partitions: {missing}", style="red")

    group_table = Table(title="dependency groups", title_justify="left", expand=False)
    for column, justify in (
        ("group", "left"),
        ("status", "left"),
        ("holds back", "right"),
        ("lag (records)", "right"),
        ("lag (time)", "right"),
        ("commit unmoved", "right"),
    ):
        group_table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for name, group in groups.items():
        group_table.add_row(
            name,
            Text(group["status"], style=STATUS_STYLES.get(group["status"], "")),
            _num(group["holding"]),
            _lag(group),
            _seconds(group["lag_s"], group["lag_s_exact"]),
            _seconds(group["unmoved_s"], group.get("unmoved_s_exact", True)),
        )

    ordered = sorted(partitions, key=lambda p: (-(p["waiting"] or 0), p["topic"], p["partition"]))
    shown = ordered[:limit]
    part_table = Table(
        title=f"partitions ({len(shown)} of {len(partitions)}, most records waiting first)",
        title_justify="left",
    )
    shown_groups = [] if _fleet(status) else list(groups)
    columns = ("topic", "partition", "end", "watermark", "waiting", "oldest", *shown_groups)
    for column in (*columns, "held back by"):
        part_table.add_column(
            column, justify="left" if column in ("topic", "held back by") else "right"
        )
    for p in shown:
        cells = []
        for g in shown_groups:
            pos = p["groups"].get(g)
            if pos is None:
                cells.append("")
                continue
            text = Text(_num(pos["committed"]) if pos["committed"] is not None else "none")
            if pos["lag"]:
                text.append(f" −{pos['lag']:,}", style="dim")
            if pos["status"] != "OK":
                text.append(f" {pos['status']}", style=STATUS_STYLES.get(pos["status"], ""))
            cells.append(text)
        part_table.add_row(
            p["topic"],
            str(p["partition"]),
            _num(p["end_offset"]),
            "none" if p["watermark"] is None else _num(p["watermark"]),
            _num(p["waiting"]),
            _seconds(p["waiting_s"], p.get("waiting_s_exact", True)) if p["waiting"] else "",
            *cells,
            Text(", ".join(p["holding"]), style="yellow"),
        )
    return [line, group_table, part_table]


def _lag(group: Mapping[str, Any]) -> str:
    """A group's lag in records; unknown (never 0) while it has no commit where records are."""
    if group["lag"] is None:
        return "no commit" if group["status"] == "MISSING" else "unknown"
    return _num(group["lag"])


def _seconds(value: float | None, exact: bool = True) -> str:
    if value is None:
        return "–"
    prefix = "" if exact else "≥ "
    if value < 120:
        return f"{prefix}{value:.1f} s"
    if value < 7200:
        return f"{prefix}{value / 60:.0f} min"
    return f"{prefix}{value / 3600:.1f} h"
