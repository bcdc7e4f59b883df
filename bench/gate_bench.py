"""Gate benchmarks, on noida-db (``--broker tansu`` for Tansu).

1. **http**: ``GET /ready`` under concurrent load (wrk) next to a trivial FastAPI endpoint
   served by the same uvicorn process in the same run: requests per second, p99 latency, and
   their ratio (target: /ready reaches at least 0.8 of the trivial endpoint's throughput).
2. **evaluation**: the evaluation alone on polls built in memory, for 50, 200 and
   ``--groups`` dependency groups x 64 partitions: cost per group-partition when nothing
   moves, when a tenth of the groups is behind, and when records arrive everywhere (targets
   at 1,000 groups: p50 <= 50 ms when nothing moves, cost per group-partition within 1.2x of
   that at 50 groups), what receiving a state from the child process costs, and what
   ``/status`` (first ask of a state, and again) and ``/status/{gate}`` (built and encoded)
   cost the serving process on it.
3. **poll**: whole poll cycles (the poller's admin calls, then the evaluation) for
   ``--groups`` groups x 64 partitions, interleaved with the bare admin calls any poller must
   make (targets: p50 within 1.2x of the bare calls; <= 100 ms at 200 groups, <= 500 ms at
   1,000); with ``--isolated``, both in the child process as ``gate serve`` runs them; with
   ``--idle-poll-interval``, how many groups each cycle still reads.
4. **ready**: ``/ready`` p99 under load from a service that also polls and evaluates a gate
   of ``--groups`` groups every second, against one serving the small gate alone, first while
   nothing moves in the fleet, then while records arrive on all its partitions (target:
   within 1.2x); ``--poller-niceness N`` sets the servers' ``poller_niceness``.

Run: ``make bench`` or ``python -m bench.gate_bench [--quick] [--groups N] [--broker noida|tansu] [--isolated]
[--idle-poll-interval SECONDS] [--poller-niceness N] [--only http|evaluation|poll|ready]``.
"""

from __future__ import annotations

import shutil

from bench._gate_evaluation import evaluation_bench
from bench._gate_http import http_bench, ready_under_cycles
from bench._gate_poll import fleet_topic, group_names, poll_bench
from bench._options import add_broker, local_broker, parser
from bench._report import targets, write


def main() -> None:
    options = parser(__doc__)
    options.add_argument("--quick", action="store_true", help="shorter runs")
    options.add_argument(
        "--only", choices=["http", "poll", "evaluation", "ready"], help="run one benchmark"
    )
    options.add_argument("--groups", type=int, default=200, help="dependency groups (200)")
    options.add_argument(
        "--isolated",
        action="store_true",
        help="poll: the admin client and the evaluation in a child process, as gate serve runs "
        "them (their CPU is then not counted as the gate's)",
    )
    add_broker(options, "noida")
    options.add_argument(
        "--idle-poll-interval",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="poll: read idle, caught-up groups this often (idle_poll_interval_ms; default 0: "
        "every poll reads every group)",
    )
    options.add_argument(
        "--poller-niceness",
        type=int,
        default=None,
        metavar="N",
        help="ready: the servers' poller_niceness (default: the gate's default)",
    )
    args = options.parse_args()
    wanted = {args.only} if args.only else {"http", "poll", "evaluation", "ready"}
    if wanted & {"http", "ready"} and shutil.which("wrk") is None:
        raise SystemExit("the HTTP benchmarks need wrk (Debian/Ubuntu: apt-get install wrk)")
    results: dict = {"broker": args.broker, "groups": args.groups}
    verdict = []
    seconds, rounds = (3, 2) if args.quick else (8, 3)
    if "evaluation" in wanted:
        sizes = sorted({50, 200, args.groups})
        evaluation = results["evaluation"] = evaluation_bench(sizes, 64, 10 if args.quick else 30)
        quiet = evaluation["caught up, nothing moves"]
        verdict += [
            (
                f"evaluation p50 <= 50 ms at {args.groups} groups (nothing moves)",
                quiet[str(args.groups)]["p50_ms"] <= 50,
            ),
            ("evaluation linear (nothing moves): ratio <= 1.2", quiet["linearity"] <= 1.2),
        ]
    if wanted - {"evaluation"}:
        with local_broker(args.broker) as broker:
            if "http" in wanted:
                http = results["http"] = http_bench(broker.bootstrap, seconds, rounds)
                verdict += [
                    ("/ready released >= 0.8 x trivial", http["ratio_ready_released"] >= 0.8),
                    ("/ready held >= 0.8 x trivial", http["ratio_ready_held"] >= 0.8),
                ]
            if "poll" in wanted:
                poll = results["poll"] = poll_bench(
                    broker,
                    args.broker,
                    args.groups,
                    64,
                    cycles=20 if args.quick else 100,
                    isolated=args.isolated,
                    idle_interval=args.idle_poll_interval,
                )
                verdict.append(
                    (
                        "whole cycle within 1.2x of the bare admin calls",
                        poll["cycle_vs_bare"] <= 1.2,
                    )
                )
                budget = 100 if args.groups <= 200 else 500
                verdict.append(
                    (f"whole cycle p50 <= {budget} ms", poll["cycle"]["p50_ms"] <= budget)
                )
            if "ready" in wanted:
                fleet = (
                    fleet_topic(broker.bootstrap, args.groups, 64)
                    if "poll" not in wanted  # (else made by the poll cycles)
                    else (f"bench-poll-{args.groups}", group_names(args.groups))
                )
                ready = results["ready"] = ready_under_cycles(
                    broker.bootstrap,
                    fleet,
                    seconds,
                    rounds,
                    args.poller_niceness,
                )
                verdict += [
                    ("/ready p99 with cycles <= 1.2x without", ready["p99_ratio"] <= 1.2),
                    (
                        "/ready p99 with cycles, records arriving, <= 1.2x without",
                        ready["p99_ratio_records_arriving"] <= 1.2,
                    ),
                ]
    name = "gate" if not args.only else f"gate-{args.only}"
    if args.groups != 200 or args.broker != "noida":
        name += f"-{args.broker}-{args.groups}"
    if args.isolated:
        name += "-isolated"
    if args.idle_poll_interval:
        name += f"-idle{args.idle_poll_interval:g}"
    if args.poller_niceness is not None:
        name += f"-nice{args.poller_niceness}"
    write(name, results)
    targets(verdict)


if __name__ == "__main__":
    main()
