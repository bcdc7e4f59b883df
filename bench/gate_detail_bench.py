"""``/ready`` while another client asks a large answer back to back.

A gate of ``--groups`` dependency groups (1,000) on ``--partitions`` partitions (64), a tenth
of the groups behind, evaluated in memory from synthetic polls and served by the gate's HTTP
API in a process of its own (no broker: the state stays as built, so the gate's answers
kept per state are built once). One client asks ``/ready`` in a closed loop for
``--seconds`` (5) and counts its answers; in turn, a second client asks one of ``/healthz``
(the cheapest answer there is: what any second client costs ``/ready`` on this machine),
``/status``, ``/status/{gate}`` (every group, and ``?groups=holding``),
``/status/{gate}/history`` and ``/metrics`` back to back meanwhile, from a thread of the
first one's process (the two share its interpreter: a second client reading large answers
slows the first there too), or with ``--other-process`` from a process of its own (it then
takes a core of its own on a small machine). The baseline is ``/ready`` alone, measured in
the same run before and after the others. Target: ``/ready`` keeps
>= 0.8 of its rate alone whatever the other client asks. The machine's load average is
printed at the start and the end (other work on it moves every figure). The last column is
the server process's CPU time per ask of the other endpoint (its CPU over the run, less what
``/ready`` costs it alone per answer; ``/ready alone``: that cost), from ``/proc``: what each
answer costs the gate, which other work on the machine moves less than the rates.

With ``--gates N`` (and, say, ``--groups 10``) the server holds a fleet of N small gates
instead, each on its own ``--groups`` groups of the same topic, a tenth of them with groups
behind; the other client asks the first gate's answers, and ``/status`` and ``/metrics`` cover
the fleet. Before the rounds, each answer is asked alone five times: its size and median time
(a fleet's scrape: target <= 1 MB and <= 200 ms).

With ``--poll-ms N`` the server gets a new state (the same figures, a new version) every N
ms, as a running gate's polls bring: what is kept per state is then built again after each.

Run: ``python -m bench.gate_detail_bench [--groups N] [--partitions N] [--gates N]
[--seconds S] [--other-process] [--poll-ms N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import uvicorn

from bench._gate_evaluation import synthetic_poll
from bench._options import parser
from bench._proc import cpu_seconds_or_none
from bench._processes import serving
from bench._report import console, percentile, table, write
from demo._local import free_port
from gate import GateEvaluator, GateService
from gate.evaluate._state import GateState
from gate.serve._api import create_app
from gate.service._config import GateConfig

GATE = "a"
OTHERS = {
    "/healthz": "/healthz",
    "/status": "/status",
    "/status/{gate}": f"/status/{GATE}",
    "/status/{gate}?groups=holding": f"/status/{GATE}?groups=holding",
    "/status/{gate}/history": f"/status/{GATE}/history",
    "/metrics": "/metrics",
}


def names(groups: int, gate: int = 0) -> list[str]:
    return [f"g{i:04d}" if not gate else f"g{gate:03d}-{i:03d}" for i in range(groups)]


def gate_names(gates: int) -> list[str]:
    """The first gate is the one whose answers are asked (``GATE``)."""
    return [GATE, *(f"f{i:03d}" for i in range(1, gates))]


def serve(port: int, groups: int, partitions: int, poll_ms: int, gates: int) -> None:
    """The server process: the gates' API over states built in memory; with ``poll_ms``,
    new states (the same figures, a new version and poll time) every ``poll_ms``, as a
    running gate's polls bring, so that what is kept per state is built again."""
    dependencies = {name: names(groups, i) for i, name in enumerate(gate_names(gates))}
    config = GateConfig.model_validate(
        {
            "kafka": {"bootstrap.servers": "127.0.0.1:1"},
            "gates": {g: {"topics": ["t"], "depends_on": d} for g, d in dependencies.items()},
            "http": {"rate_limit_per_s": 1000000},
        }
    )
    service = GateService(config)
    now = time.time()
    states = []
    for i, (name, groups_of) in enumerate(dependencies.items()):
        evaluator = GateEvaluator(name, ["t"], groups_of)
        behind = 10 if gates == 1 or i % 10 == 0 else 0  # (a fleet: a tenth of its gates)
        for step in range(3):
            state = evaluator.observe(
                synthetic_poll(now + step, groups_of, partitions, 100, behind)
            )
        service.store.update(state)
        states.append(state)
    service.answered_at = time.monotonic() + 1e9  # (ready while the benchmark runs)
    app = create_app(service, manage_service=False)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )

    async def polls(states: list[GateState]) -> None:
        while True:
            await asyncio.sleep(poll_ms / 1000)
            wall, monotonic = time.time(), time.monotonic()
            for i, state in enumerate(states):
                snapshot = dataclasses.replace(
                    state.snapshot, version=state.version + poll_ms, polled_at=wall
                )
                states[i] = dataclasses.replace(state, snapshot=snapshot, monotonic=monotonic)
                service.store.update(states[i])

    async def run() -> None:
        if poll_ms:
            task = asyncio.create_task(polls(states))
        await server.serve()
        if poll_ms:
            task.cancel()

    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(run())


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


def ask_from_now_on(base: str, path: str, start_at: float, seconds: float) -> None:
    """The second client's process: asks ``path`` back to back from ``start_at`` (wall
    clock) for ``seconds``, then prints the time of each ask (JSON)."""
    stop = threading.Event()
    times: list[float] = []
    with httpx.Client(base_url=base, timeout=60) as client:
        client.get("/healthz")  # (connected before the start)
    time.sleep(max(0.0, start_at - time.time()))
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    ask_back_to_back(base, path, stop, times)
    print(json.dumps(times))


def in_another_process(
    base: str, path: str, start_at: float, seconds: float, times: list[float]
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.gate_detail_bench", "--ask", path, "--base", base,
         "--start-at", str(start_at), "--seconds", str(seconds)],
        capture_output=True, text=True, timeout=seconds + 300, check=True,
    )  # fmt: skip
    times.extend(json.loads(done.stdout.splitlines()[-1]))


def asked_alone(base: str, path: str, times: int = 5) -> tuple[int, float]:
    """An answer asked alone ``times`` times: its size (bytes) and median time (seconds)."""
    seconds = []
    with httpx.Client(base_url=base, timeout=120) as client:
        for _ in range(times):
            started = time.perf_counter()
            answer = client.get(path)
            seconds.append(time.perf_counter() - started)
            answer.raise_for_status()
    return len(answer.content), statistics.median(seconds)


def measure(
    base: str, seconds: float, other: str | None, same_process: bool, server: int
) -> dict[str, Any]:
    stop = threading.Event()
    ready: list[float] = []
    asked: list[float] = []
    start_at = time.time() + (1.5 if other is not None and not same_process else 0.0)
    threads = [threading.Thread(target=ask_ready, args=(base, stop, ready))]
    if other is not None and same_process:
        threads.append(threading.Thread(target=ask_back_to_back, args=(base, other, stop, asked)))
    elif other is not None:
        another = threading.Thread(
            target=in_another_process, args=(base, other, start_at, seconds, asked)
        )
        another.start()
    time.sleep(max(0.0, start_at - time.time()))
    cpu_before = cpu_seconds_or_none(server)
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(120)
    cpu_after = cpu_seconds_or_none(server)
    if other is not None and not same_process:
        another.join(seconds + 300)
    return {
        "ready_count": len(ready),
        "server_cpu_s": None
        if cpu_before is None or cpu_after is None
        else round(cpu_after - cpu_before, 3),
        "ready_per_s": len(ready) / seconds,
        "ready_p99_ms": round(percentile(ready, 99) * 1000, 1) if ready else None,
        "other_asks": len(asked),
        "other_ms": round(statistics.median(asked) * 1000, 1) if asked else None,
    }


def main() -> None:
    options = parser(__doc__)
    options.add_argument("--groups", type=int, default=1000)
    options.add_argument("--partitions", type=int, default=64)
    options.add_argument(
        "--gates", type=int, default=1, help="a fleet of this many gates of --groups groups each"
    )
    options.add_argument("--seconds", type=float, default=5.0)
    options.add_argument(
        "--other-process",
        action="store_true",
        help="ask the other endpoint from a process of its own (default: a thread of the "
        "/ready client's process)",
    )
    options.add_argument(
        "--poll-ms",
        type=int,
        default=0,
        help="a new state every this many ms, as polls bring (default 0: one state)",
    )
    options.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    options.add_argument("--ask", help=argparse.SUPPRESS)
    options.add_argument("--base", help=argparse.SUPPRESS)
    options.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = options.parse_args()
    if args.serve:
        serve(args.serve, args.groups, args.partitions, args.poll_ms, args.gates)
        return
    if args.ask:
        ask_from_now_on(args.base, args.ask, args.start_at, args.seconds)
        return
    load_before = os.getloadavg()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "bench.gate_detail_bench", "--serve", str(port),
               "--groups", str(args.groups), "--partitions", str(args.partitions),
               "--poll-ms", str(args.poll_ms), "--gates", str(args.gates)]  # fmt: skip
    with serving(command, f"{base}/healthz", 300) as server:
        sizes = {name: asked_alone(base, path) for name, path in OTHERS.items()}
        same = not args.other_process
        found: dict[str, Any] = {"before": measure(base, args.seconds, None, same, server.pid)}
        for name, path in OTHERS.items():
            found[name] = measure(base, args.seconds, path, same, server.pid)
        found["after"] = measure(base, args.seconds, None, same, server.pid)
    alone = (found["before"]["ready_per_s"] + found["after"]["ready_per_s"]) / 2
    ready_cpu = None  # the server's CPU per /ready, alone
    if found["before"]["server_cpu_s"] is not None:
        ready_cpu = sum(found[n]["server_cpu_s"] for n in ("before", "after")) / sum(
            found[n]["ready_count"] for n in ("before", "after")
        )
    rows = []
    for name, figures in found.items():
        figures["ready_vs_alone"] = figures["ready_per_s"] / alone
        figures["server_cpu_ms_per_ask"] = None  # the server's CPU per ask of the other one
        if ready_cpu is not None and figures["other_asks"]:
            left = figures["server_cpu_s"] - ready_cpu * figures["ready_count"]
            figures["server_cpu_ms_per_ask"] = round(left / figures["other_asks"] * 1000, 2)
        alone_row = name in ("before", "after")
        if not alone_row:
            figures["bytes_alone"], seconds_alone = sizes[name]
            figures["ms_alone"] = round(seconds_alone * 1000, 1)
        rows.append(
            [
                "/ready alone" if alone_row else f"with {name}",
                round(figures["ready_per_s"]),
                round(figures["ready_vs_alone"], 2),
                figures["ready_p99_ms"],
                figures["other_asks"] or "",
                figures["other_ms"] or "",
                round(ready_cpu * 1000, 2)
                if alone_row and ready_cpu is not None
                else figures["server_cpu_ms_per_ask"] or "",
                "" if alone_row else figures["bytes_alone"],
                "" if alone_row else figures["ms_alone"],
            ]
        )
    load_after = os.getloadavg()
    where = "a process of its own" if args.other_process else "a thread of its process"
    states = f"a new state every {args.poll_ms} ms" if args.poll_ms else "one state"
    shape = (
        f"one gate of {args.groups} groups"
        if args.gates == 1
        else f"{args.gates} gates of {args.groups} groups"
    )
    table(
        f"/ready with another client ({where}) asking back to back: {shape} x "
        f"{args.partitions} partitions, {states}",
        [
            "other client",
            "/ready per s",
            "vs alone",
            "/ready p99 ms",
            "its asks",
            "its ms",
            "server CPU ms per ask",
            "its bytes",
            "its ms alone",
        ],
        rows,
    )
    gate_answers = [n for n in OTHERS if n != "/healthz"]
    worst = min(found[n]["ready_vs_alone"] for n in gate_answers)
    console.print(
        f"/ready keeps at worst {worst:.2f} of its rate alone with a gate's answer asked back "
        f"to back (target >= 0.8); {found['/healthz']['ready_vs_alone']:.2f} with /healthz"
    )
    scrape_bytes, scrape_ms = found["/metrics"]["bytes_alone"], found["/metrics"]["ms_alone"]
    console.print(
        f"a scrape alone: {scrape_bytes / 1e6:.2f} MB in {scrape_ms:.0f} ms "
        "(target for a fleet: <= 1 MB and <= 200 ms)"
    )
    console.print(
        "load average (1, 5, 15 min): "
        f"{', '.join(f'{x:.2f}' for x in load_before)} at the start, "
        f"{', '.join(f'{x:.2f}' for x in load_after)} at the end, on {os.cpu_count()} cores"
    )
    write(
        "gate_detail",
        {
            "args": vars(args),
            "results": found,
            "worst": worst,
            "load": {"start": load_before, "end": load_after},
        },
    )


if __name__ == "__main__":
    main()
