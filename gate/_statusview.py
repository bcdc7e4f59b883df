"""`gate status`: the status page's summary as terminal tables (rich), from a running gate."""

from __future__ import annotations

import time
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
    "STALLED": "bold red",
    "REWOUND": "bold red",
    "MISSING": "bold red",
}


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
        details = [self.get(f"/status/{name}") for name in names if service["gates"].get(name)]
        return service, details


def waiting(part: Mapping[str, Any]) -> int | None:
    if part["end_offset"] is None:
        return None
    return max(0, part["end_offset"] - (part["watermark"] or 0))


def is_held(part: Mapping[str, Any]) -> bool:
    count = waiting(part)
    return part["watermark"] is None if count is None else count > 0


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
    for name in pending:
        parts.append(Text(f"\n{name}: first poll pending", style="yellow"))
    for detail in details:
        parts.extend(_gate(detail, limit))
    return Group(*parts)


def _gate(status: Mapping[str, Any], limit: int) -> list[RenderableType]:
    partitions = status["partitions"]
    groups = list(status["groups"])
    held = [p for p in partitions if is_held(p)]
    holds = {g: sum(1 for p in partitions if g in p["holding"]) for g in groups}
    behind = {
        g: [p["groups"][g]["lag"] for p in partitions if g in p["groups"] and p["groups"][g]["lag"]]
        for g in groups
    }
    age = max(0.0, time.time() - _epoch(status["polled_at"]))
    total_waiting = sum(waiting(p) or 0 for p in partitions)

    verdict = Text(f"\n{status['gate']}", style="bold")
    if not held:
        verdict.append(": every record is released", style="green")
    else:
        culprits = sorted((g for g in groups if holds[g]), key=lambda g: -holds[g])
        verdict.append(f": waits on {len(held)} of {len(partitions)} partitions", style="yellow")
        if culprits:
            verdict.append(" for ")
            for i, g in enumerate(culprits):
                if i:
                    verdict.append(", ")
                verdict.append(g, style="bold")
                verdict.append(f" ({status['groups'][g]}, holds {holds[g]})")
    verdict.append(
        f"\n{len(partitions):,} partitions · {len(held):,} held back · "
        f"{total_waiting:,} records waiting · snapshot {age:.1f} s old · "
        f"version {status['version']}",
        style="dim",
    )
    if status["missing_topics"]:
        verdict.append(f"\nmissing topics: {', '.join(status['missing_topics'])}", style="red")

    group_table = Table(title="dependency groups", title_justify="left", expand=False)
    for column, justify in (
        ("group", "left"),
        ("status", "left"),
        ("holds back", "right"),
        ("behind end (total)", "right"),
        ("behind end (max)", "right"),
    ):
        group_table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for g in groups:
        group_table.add_row(
            g,
            Text(status["groups"][g], style=STATUS_STYLES.get(status["groups"][g], "")),
            _num(holds[g]),
            _num(sum(behind[g])),
            _num(max(behind[g], default=0)),
        )

    ordered = sorted(partitions, key=lambda p: (-(waiting(p) or 0), p["topic"], p["partition"]))
    shown = ordered[:limit]
    part_table = Table(
        title=f"partitions ({len(shown)} of {len(partitions)}, most records waiting first)",
        title_justify="left",
    )
    for column in ("topic", "partition", "end", "watermark", "waiting", *groups, "held back by"):
        part_table.add_column(
            column, justify="left" if column in ("topic", "held back by") else "right"
        )
    for p in shown:
        cells = []
        for g in groups:
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
            _num(waiting(p)),
            *cells,
            Text(", ".join(p["holding"]), style="yellow"),
        )
    return [verdict, group_table, part_table]


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
