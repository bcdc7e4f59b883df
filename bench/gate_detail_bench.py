"""``/ready`` while another client asks a large answer back to back.

A gate of ``--groups`` dependency groups (1,000) on ``--partitions`` partitions (64), a tenth
of the groups behind, evaluated in memory from synthetic polls and served by the gate's HTTP
API in a process of its own (no broker: the state stays as built). One client asks
``/ready`` in a closed loop for ``--seconds`` (5) and counts its answers; in turn, a second
client asks one of ``/status``, ``/status/{gate}`` (every group, and ``?groups=holding``),
``/status/{gate}/history`` and ``/metrics`` back to back meanwhile. The baseline is
``/ready`` alone, measured in the same run before and after the others. Target: ``/ready``
keeps >= 0.8 of its rate whatever the other client asks.

Run: ``python -m bench.gate_detail_bench [--groups N] [--partitions N] [--seconds S]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import uvicorn

from bench._report import console, percentile, table, write
from bench.gate_bench import synthetic_poll, wait_answering
from gate import GateEvaluator, GateService
from gate._api import create_app
from gate._config import GateConfig
from gate._local import free_port

GATE = "a"
OTHERS = {
    "/status": "/status",
    "/status/{gate}": f"/status/{GATE}",
    "/status/{gate}?groups=holding": f"/status/{GATE}?groups=holding",
    "/status/{gate}/history": f"/status/{GATE}/history",
    "/metrics": "/metrics",
}


def names(groups: int) -> list[str]:
    return [f"g{i:04d}" for i in range(groups)]


def serve(port: int, groups: int, partitions: int) -> None:
    """The server process: the gate's API over a state built in memory."""
    dependencies = names(groups)
    config = GateConfig.model_validate(
        {
            "kafka": {"bootstrap.servers": "127.0.0.1:1"},
            "gates": {GATE: {"topics": ["t"], "depends_on": dependencies}},
            "http": {"rate_limit_per_s": 1000000},
        }
    )
    service = GateService(config)
    evaluator = GateEvaluator(GATE, ["t"], dependencies)
    now = time.time()
    for step in range(3):
        state = evaluator.observe(synthetic_poll(now + step, dependencies, partitions, 100, 10))
    service.store.update(state)
    service.answered_at = time.monotonic() + 1e9  # (ready while the benchmark runs)
    app = create_app(service, manage_service=False)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def ask_ready(base: str, stop: threading.Event, times: list[float]) -> None:
    params = {"gate": GATE, "topic": "t", "partition": 0, "offset": 10}
    with httpx.Client(base_url=base, timeout=30) as client:
        while not stop.is_set():
            started = time.perf_counter()
            client.get("/ready", params=params)
            times.append(time.perf_counter() - started)


def ask_back_to_back(base: str, path: str, stop: threading.Event, times: list[float]) -> None:
    with httpx.Client(base_url=base, timeout=60) as client:
        while not stop.is_set():
            started = time.perf_counter()
            answer = client.get(path)
            answer.raise_for_status()
            times.append(time.perf_counter() - started)


def measure(base: str, seconds: float, other: str | None) -> dict[str, Any]:
    stop = threading.Event()
    ready: list[float] = []
    asked: list[float] = []
    threads = [threading.Thread(target=ask_ready, args=(base, stop, ready))]
    if other is not None:
        threads.append(threading.Thread(target=ask_back_to_back, args=(base, other, stop, asked)))
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(120)
    return {
        "ready_per_s": len(ready) / seconds,
        "ready_p99_ms": round(percentile(ready, 99) * 1000, 1) if ready else None,
        "other_asks": len(asked),
        "other_ms": round(statistics.median(asked) * 1000, 1) if asked else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.groups, args.partitions)
        return
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.gate_detail_bench", "--serve", str(port),
         "--groups", str(args.groups), "--partitions", str(args.partitions)]
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_answering(f"{base}/healthz", server, 300)
        found: dict[str, Any] = {"before": measure(base, args.seconds, None)}
        for name, path in OTHERS.items():
            found[name] = measure(base, args.seconds, path)
        found["after"] = measure(base, args.seconds, None)
    finally:
        server.terminate()
        server.wait(10)
    alone = (found["before"]["ready_per_s"] + found["after"]["ready_per_s"]) / 2
    rows = []
    for name, figures in found.items():
        figures["ready_vs_alone"] = figures["ready_per_s"] / alone
        rows.append(
            [
                "/ready alone" if name in ("before", "after") else f"with {name}",
                round(figures["ready_per_s"]),
                round(figures["ready_vs_alone"], 2),
                figures["ready_p99_ms"],
                figures["other_asks"] or "",
                figures["other_ms"] or "",
            ]
        )
    table(
        f"/ready with another client asking back to back: one gate of {args.groups} groups "
        f"x {args.partitions} partitions",
        ["other client", "/ready per s", "vs alone", "/ready p99 ms", "its asks", "its ms"],
        rows,
    )
    worst = min(f["ready_vs_alone"] for n, f in found.items() if n not in ("before", "after"))
    console.print(f"/ready keeps at worst {worst:.2f} of its rate alone (target >= 0.8)")
    write("gate_detail", {"args": vars(args), "results": found, "worst": worst})


if __name__ == "__main__":
    main()
