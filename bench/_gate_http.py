"""The gate benchmark's HTTP parts: ``/ready`` under load next to a trivial endpoint, and
``/ready`` while the same process polls a large gate (see ``bench.gate_bench``)."""

from __future__ import annotations

import contextlib
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from bench._processes import config_file, serving
from bench._report import console, table
from bench._rounds import interleaved
from bench._topics import Writing, commit, create_topic
from demo._local import free_port


def wrk(url: str, seconds: int, connections: int) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {
        "rps": rps,
        "p99_ms": float(p99.group(1)) * scale,
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
    }


@contextmanager
def gate_server(
    bootstrap: str, gates: dict[str, tuple[str, list[str]]], **settings: Any
) -> Iterator[str]:
    """``gate serve`` (plus a trivial endpoint) in its own process for ``gates`` (name: topic,
    dependency groups), with further top-level ``settings``; yields its base URL once it
    answers."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = {
        "kafka": {"bootstrap.servers": bootstrap},
        "poll_interval_ms": 1000,
        "gates": {
            name: {"topics": [topic], "depends_on": groups}
            for name, (topic, groups) in gates.items()
        },
        # One load generator on one address: a limit it never reaches, enforced.
        "http": {"rate_limit_per_s": 1000000},
        **settings,
    }
    with (
        config_file(config) as path,
        serving(
            [sys.executable, "-m", "bench._gate_server", str(path), str(port)],
            f"{base}/watermarks/a",
            120,
        ),
    ):
        yield base


def small_gate(bootstrap: str) -> tuple[str, list[str]]:
    topic = "bench-http"
    create_topic(bootstrap, topic, 12)
    for group in ("dep-b", "dep-c"):
        commit(bootstrap, group, topic, {p: 1000 for p in range(12)})
    return topic, ["dep-b", "dep-c"]


def http_bench(bootstrap: str, seconds: int, rounds: int) -> dict:
    topic, groups = small_gate(bootstrap)
    with gate_server(bootstrap, {"a": (topic, groups)}) as base:
        urls = {
            "trivial": f"{base}/bench/trivial",
            "/ready (released)": f"{base}/ready?gate=a&topic={topic}&partition=3&offset=500",
            "/ready (held, 425)": f"{base}/ready?gate=a&topic={topic}&partition=3&offset=5000",
        }
        wrk(urls["trivial"], 2, 32)  # warm up
        results = interleaved(
            {name: lambda url=url: wrk(url, seconds, 32) for name, url in urls.items()},
            rounds,
            progress="wrk rounds",
        )
    best = {name: max(runs, key=lambda r: r["rps"]) for name, runs in results.items()}
    trivial = best["trivial"]["rps"]
    rows = []
    for name, result in best.items():
        ratio = result["rps"] / trivial
        rows.append([name, result["rps"], result["p99_ms"], round(ratio, 3)])
    table(
        f"HTTP: wrk -t1 -c32, {seconds}s x {rounds} rounds (best round), one uvicorn worker",
        ["endpoint", "requests/s", "p99 ms", "ratio to trivial"],
        rows,
    )
    return {
        "endpoints": best,
        "ratio_ready_released": best["/ready (released)"]["rps"] / trivial,
        "ratio_ready_held": best["/ready (held, 425)"]["rps"] / trivial,
        "target_ratio": 0.8,
    }


def arrivals(bootstrap: str, topic: str, partitions: int) -> Writing:
    """Records arriving on every partition of a topic, a few times a second, in a thread: the
    fleet's end offsets move at every poll, so every group is evaluated again at every poll."""
    every = [(b"x", p) for p in range(partitions)]
    return Writing(bootstrap, topic, 0.2, lambda i: every, flush=True)


def cycle_totals(url: str) -> dict[str, float]:
    """The service's poll and evaluation durations so far, summed, and their count."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    totals = {}
    for name in ("poll_duration_seconds", "evaluation_duration_seconds"):
        for suffix in ("sum", "count"):
            found = re.search(rf"^gate_{name}_{suffix} (\S+)$", text, re.MULTILINE)
            totals[f"{name}_{suffix}"] = float(found.group(1)) if found else 0.0
    return totals


def cycle_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The cycles run between two :func:`cycle_totals`, and their poll and evaluation means."""
    cycles = after["poll_duration_seconds_count"] - before["poll_duration_seconds_count"]

    def mean_ms(name: str) -> float:
        spent = after[f"{name}_sum"] - before[f"{name}_sum"]
        return round(spent / max(cycles, 1) * 1000, 1)

    return {
        "cycles": cycles,
        "poll_mean_ms": mean_ms("poll_duration_seconds"),
        "evaluation_mean_ms": mean_ms("evaluation_duration_seconds"),
    }


def ready_under_cycles(
    bootstrap: str,
    fleet: tuple[str, list[str]],
    seconds: int,
    rounds: int,
    niceness: int | None = None,
) -> dict:
    """``/ready`` under load from a gate service that also polls and evaluates a gate of
    ``fleet``'s groups every second, against one that serves the same small gate alone: both
    run at once, measured in interleaved rounds. First while nothing moves in the fleet (its
    groups are caught up and skipped), then while records arrive on every partition of its
    topic (every group is evaluated again at every poll). ``niceness``: the servers'
    ``poller_niceness`` (None: the default)."""
    settings = {} if niceness is None else {"poller_niceness": niceness}
    small = small_gate(bootstrap)
    query = f"/ready?gate=a&topic={small[0]}&partition=3&offset=500"
    cycles = f"{len(fleet[1])}-group cycles"
    with (
        gate_server(bootstrap, {"a": small}, **settings) as alone,
        gate_server(bootstrap, {"a": small, "fleet": fleet}, **settings) as busy,
    ):
        deadline = time.monotonic() + 120
        while httpx.get(f"{busy}/watermarks/fleet", timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise SystemExit("the fleet gate had no snapshot after 120 s")
            time.sleep(0.5)
        wrk(alone + query, 2, 32)  # warm up
        results: dict[str, list[dict[str, float]]] = {}
        phases: dict[str, dict[str, float]] = {}
        for phase in ("nothing moves", "records arriving"):
            moving = arrivals(bootstrap, fleet[0], 64) if phase == "records arriving" else None
            with moving or contextlib.nullcontext():
                if moving is not None:
                    time.sleep(3)  # polls see the ends move
                before = cycle_totals(busy)
                servers = (("no cycles", alone), (f"{cycles}, {phase}", busy))
                found = interleaved(
                    {name: lambda url=url: wrk(url + query, seconds, 32) for name, url in servers},
                    rounds,
                    progress=f"wrk rounds, {phase}",
                )
                for name, runs in found.items():
                    results.setdefault(name, []).extend(runs)
                phases[phase] = cycle_means(before, cycle_totals(busy))
    table(
        f"The {cycles} meanwhile (the busy server's metrics)",
        ["phase", "cycles", "poll mean ms", "evaluation mean ms"],
        [[p, v["cycles"], v["poll_mean_ms"], v["evaluation_mean_ms"]] for p, v in phases.items()],
    )
    median = {
        name: {
            "rps": statistics.median(r["rps"] for r in runs),
            "p99_ms": statistics.median(r["p99_ms"] for r in runs),
        }
        for name, runs in results.items()
    }
    calm = median["no cycles"]["p99_ms"]
    ratios = {
        phase: round(median[f"{cycles}, {phase}"]["p99_ms"] / calm, 3)
        for phase in ("nothing moves", "records arriving")
    }
    table(
        f"/ready while the same process polls {len(fleet[1])} groups every second "
        f"(wrk -t1 -c32, {seconds}s x {rounds} rounds per phase, medians)",
        ["server", "requests/s", "p99 ms"],
        [[name, r["rps"], r["p99_ms"]] for name, r in median.items()],
    )
    for phase, ratio in ratios.items():
        console.print(f"/ready p99 with cycles ({phase}) / without: {ratio:.2f} (target <= 1.2)")
    return {
        "poller_niceness": niceness,
        "servers": median,
        "cycles": phases,
        "runs": results,
        "p99_ratio": ratios["nothing moves"],
        "p99_ratio_records_arriving": ratios["records arriving"],
    }
