"""Gate benchmarks.

1. ``GET /ready`` under concurrent load (wrk) next to a trivial FastAPI endpoint served by the
   same uvicorn process in the same run: requests per second, p99 latency, and their ratio
   (target: /ready reaches at least 0.8 of the trivial endpoint's throughput).
2. One poll cycle (admin calls for every group plus evaluation) for 200 dependency groups x
   64 partitions against the local broker (target: at most 100 ms).

Run: ``make bench`` or ``python -m bench.gate_bench [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rich.progress import track

from bench._report import console, summary_ms, table, write
from gate import GateEvaluator
from gate._local import LocalBroker, free_port
from gate._poller import OffsetPoller


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    consumer.commit(
        offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
    )
    consumer.close()


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


def http_bench(bootstrap: str, seconds: int, rounds: int) -> dict:
    topic = "bench-http"
    create_topic(bootstrap, topic, 12)
    for group in ("dep-b", "dep-c"):
        commit(bootstrap, group, topic, {p: 1000 for p in range(12)})
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gate.yaml"
        config.write_text(
            f"kafka: {{bootstrap.servers: '{bootstrap}'}}\npoll_interval_ms: 1000\n"
            f"gates: {{a: {{topics: [{topic}], depends_on: [dep-b, dep-c]}}}}\n"
            # One load generator on one address: a limit it never reaches, still enforced.
            "http: {rate_limit_per_s: 1000000}\n"
        )
        server = subprocess.Popen(
            [sys.executable, "-m", "bench._gate_server", str(config), str(port)]
        )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{base}/watermarks/a", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the benchmark server did not come up")
                time.sleep(0.1)
            urls = {
                "trivial": f"{base}/bench/trivial",
                "/ready (released)": f"{base}/ready?gate=a&topic={topic}&partition=3&offset=500",
                "/ready (held, 425)": f"{base}/ready?gate=a&topic={topic}&partition=3&offset=5000",
            }
            wrk(urls["trivial"], 2, 32)  # warm up
            results: dict[str, list[dict[str, float]]] = {name: [] for name in urls}
            for _ in track(range(rounds), description="wrk rounds", console=console):
                for name, url in urls.items():  # interleaved, so drift hits all alike
                    results[name].append(wrk(url, seconds, 32))
        finally:
            server.terminate()
            server.wait(10)
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


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def poll_bench(broker: LocalBroker, groups: int, partitions: int, cycles: int) -> dict:
    bootstrap = broker.bootstrap
    topic = "bench-poll"
    create_topic(bootstrap, topic, partitions)
    names = [f"dep-{i:03d}" for i in range(groups)]
    for i, group in enumerate(
        track(names, description=f"committing {groups} groups", console=console)
    ):
        commit(bootstrap, group, topic, {p: 100 + i + p for p in range(partitions)})
    poller = OffsetPoller(
        {"bootstrap.servers": bootstrap}, {g: [topic] for g in names}, request_timeout=10
    )
    evaluator = GateEvaluator("a", [topic], names)
    for _ in range(3):  # warm up (metadata, connections)
        evaluator.observe(poller.poll())
    total, admin, evaluate = [], [], []
    assert broker.process is not None
    broker_cpu, own_cpu = cpu_seconds(broker.process.pid), time.process_time()
    for _ in track(range(cycles), description="poll cycles", console=console):
        started = time.perf_counter()
        poll = poller.poll()
        polled = time.perf_counter()
        state = evaluator.observe(poll)
        done = time.perf_counter()
        assert not poll.errors, poll.errors
        assert len(state.partitions) == partitions
        total.append(done - started)
        admin.append(polled - started)
        evaluate.append(done - polled)
    stats = {
        "cycle": summary_ms(total),
        "admin_calls": summary_ms(admin),
        "evaluate": summary_ms(evaluate),
    }
    broker_ms = (cpu_seconds(broker.process.pid) - broker_cpu) / cycles * 1000
    gate_ms = (time.process_time() - own_cpu) / cycles * 1000
    table(
        f"Poll cycle: {groups} groups x {partitions} partitions, {cycles} cycles",
        ["part", "p50 ms", "p99 ms", "max ms"],
        [[name, s["p50_ms"], s["p99_ms"], s["max_ms"]] for name, s in stats.items()],
    )
    table(
        "CPU per cycle (where the time goes)",
        ["process", "CPU ms per cycle"],
        [
            ["broker (answering the offset requests)", round(broker_ms, 1)],
            ["gate (this process)", round(gate_ms, 1)],
        ],
    )
    return {
        "groups": groups,
        "partitions": partitions,
        **stats,
        "broker_cpu_ms_per_cycle": round(broker_ms, 1),
        "gate_cpu_ms_per_cycle": round(gate_ms, 1),
        "target_p99_ms": 100,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--only", choices=["http", "poll"], help="run one benchmark")
    args = parser.parse_args()
    if args.only != "poll" and shutil.which("wrk") is None:
        raise SystemExit("the HTTP benchmark needs wrk (Debian/Ubuntu: apt-get install wrk)")
    results: dict = {}
    verdict = []
    with LocalBroker() as broker:
        if args.only != "poll":
            http = results["http"] = http_bench(
                broker.bootstrap, seconds=3 if args.quick else 8, rounds=2 if args.quick else 3
            )
            verdict += [
                ("/ready released >= 0.8 x trivial", http["ratio_ready_released"] >= 0.8),
                ("/ready held >= 0.8 x trivial", http["ratio_ready_held"] >= 0.8),
            ]
        if args.only != "http":
            poll = results["poll"] = poll_bench(broker, 200, 64, cycles=20 if args.quick else 100)
            verdict.append(("poll cycle p99 <= 100 ms", poll["cycle"]["p99_ms"] <= 100))
    write("gate" if not args.only else f"gate-{args.only}", results)
    table("Targets", ["target", "met"], [[name, "yes" if ok else "NO"] for name, ok in verdict])


if __name__ == "__main__":
    main()
