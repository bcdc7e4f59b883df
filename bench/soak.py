"""Soak: the three-service scenario for a given duration, on real processes.

A producer writes ``--rate`` records/s to a 4-partition topic; dependency services B and C
(plain consumers at different paces) commit as they go; the gate (``gate serve``) publishes
to Redis and HTTP; service A, on the engine, is gated through both. At the end: every record
is checked against the invariant (A never started it before B and C had committed past it),
completeness and duplicates, with the longest waits, the processes' memory over time and the
errors they logged. ``--kill-every S`` also kill -9s service A every S seconds.

Run: ``python -m bench.soak --duration 600 [--rate 200] [--kill-every 0] [--broker tansu|noida]``.
"""

from __future__ import annotations

import signal
import tempfile
import time
from pathlib import Path

from rich.progress import Progress

from bench._options import add_broker, parser
from bench._proc import rss_bytes
from bench._report import console, percentile, table, write
from demo._local import BROKERS
from tests.faults.harness import Scenario


def rss_mb(pid: int) -> float | None:
    found = rss_bytes(pid)
    return None if found is None else found / 2**20


def errors_in(workdir: Path) -> dict[str, int]:
    counts = {}
    for path in sorted(workdir.glob("*.err")):
        lines = path.read_text(errors="replace").splitlines()
        counts[path.stem] = sum(
            1 for line in lines if " ERROR " in line or line.startswith("Traceback")
        )
    return counts


def main() -> None:
    options = parser(__doc__)
    options.add_argument("--duration", type=float, default=300.0, help="seconds to produce")
    options.add_argument("--rate", type=float, default=200.0, help="records per second")
    options.add_argument("--kill-every", type=float, default=0.0, help="kill -9 service A (s)")
    add_broker(options, "tansu")
    args = options.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    scenario = Scenario(workdir, rate=args.rate, broker=BROKERS[args.broker])
    samples: list[dict[str, float | None]] = []
    kills = 0
    try:
        scenario.start()
        started = time.monotonic()
        every = max(args.duration / 12, 1.0)
        next_sample = started
        next_kill = started + args.kill_every if args.kill_every else float("inf")
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("soaking", total=args.duration)
            while (elapsed := time.monotonic() - started) < args.duration:
                progress.update(task, completed=elapsed)
                if time.monotonic() >= next_sample:
                    pids = {
                        "gate": scenario.gate_process.pid if scenario.gate_process else None,
                        "service-a": scenario.dependents[0].pid if scenario.dependents else None,
                        **{name: p.pid for name, p in scenario.dependencies.items()},
                    }
                    samples.append(
                        {"t": round(elapsed)}
                        | {name: rss_mb(pid) if pid else None for name, pid in pids.items()}
                    )
                    next_sample += every
                if time.monotonic() >= next_kill:
                    fault = scenario.fault("service-a killed (-9)")
                    scenario.stop_dependent(scenario.dependents[0], signal.SIGKILL)
                    scenario.spawn_dependent()
                    scenario.end(fault)
                    kills += 1
                    next_kill += args.kill_every
                time.sleep(0.2)
            progress.update(task, completed=args.duration, description="draining")
            produced = scenario.finish(timeout=max(180.0, args.duration))
        report = scenario.report(produced)
        waits = scenario.waits()
    finally:
        scenario.close()

    since_produced = [w for w, _ in waits]
    since_released = [r for _, r in waits]
    errors = errors_in(workdir)
    summary = {
        "broker": args.broker,
        "duration_s": args.duration,
        "rate": args.rate,
        "records": report["records"],
        "checked_against_invariant": report["checked_records"],
        "violations": len(report["violations"]),
        "missing": len(report["missing"]),
        "duplicates": report["duplicates"],
        "unjustified_duplicates": len(report["unjustified_duplicates"]),
        "kills": kills,
        "longest_wait_s": round(max(since_produced), 3) if since_produced else None,
        "p99_wait_s": round(percentile(since_produced, 99), 3) if since_produced else None,
        "p99_start_after_release_ms": round(percentile(since_released, 99) * 1000, 1)
        if since_released
        else None,
        "errors_logged": errors,
    }
    table(
        f"Soak on {args.broker}: {args.duration:g} s at {args.rate:g} records/s (logs in {workdir})",
        ["measure", "value"],
        [[k, str(v)] for k, v in summary.items()],
    )
    names = [k for k in samples[0] if k != "t"] if samples else []
    table(
        "Resident memory (MB) over time",
        ["t (s)", *names],
        [[s["t"], *[f"{s[n]:.1f}" if s[n] else "–" for n in names]] for s in samples],
    )
    write(f"soak-{args.broker}", {**summary, "rss_mb": samples, "recoveries": report["recoveries"]})
    if summary["violations"] or summary["missing"] or summary["unjustified_duplicates"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
