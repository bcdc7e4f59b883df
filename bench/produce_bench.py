"""Produce flow benchmarks: inputs consumed, one output produced per input, offsets committed.

Every workload reads small records (100 bytes) from 12 partitions with 10,000 random keys and
writes one output per input (same key and value) to a topic of its own; the engine runs
with default ``Options`` except ``commit_mode`` (KEY ordering), next to a plain
single-threaded confluent-kafka loop doing the same and Quix Streams, each run in turn in
every round:

1. At least once, no-op handler: ``ParallelConsumer`` (``CommitMode.CONSUMER``) against a
   loop that consumes a batch, produces its outputs, flushes and then commits the batch's
   offsets. Targets: rate >= 0.6 of the loop's, CPU per record <= 2x the loop's.
2. Exactly once, no-op handler: ``ParallelConsumer`` (``CommitMode.TRANSACTIONAL``) against a
   transactional loop that every 100 ms sends its offsets to the transaction, commits it and
   begins the next. Targets: rate >= 0.5 of the loop's, CPU per record <= 2x the loop's.
3. and 4. A 5 ms handler (``time.sleep(0.005)``), at least once and exactly once: the engine
   at its default concurrency against the same loops sleeping 5 ms per record, and Quix
   Streams. Target: >= 10x the loop and >= 10x Quix Streams.
5. What a transaction costs: the engine's time in ``send_offsets_to_transaction`` +
   ``commit_transaction`` per transaction (``stats()["outputs"]["transactions"]``) next to the
   plain loop's own measured commits.

Each run is timed end to end: from the consumer's start until the group's committed offsets
reach the end of every input partition and, for the transactional runs, the outputs are
visible to ``read_committed`` readers (the output partitions' last stable offset has reached
their end). Then every output is read back (``read_committed``) and counted: each input must
have an output, and the duplicates are reported. CPU per record is the CPU time of the
consumer under test over the same window (all its threads, librdkafka's included) divided by
the inputs. Rounds are interleaved (the order of the consumers turns each round); the
figures judged are the medians of the rounds, rates and CPU alike.

Quix Streams (``quixstreams==3.28.1``, the library's defaults but the processing guarantee)
runs in a virtualenv of its own, made on first use under the user's cache directory
(``--no-peer`` skips it, ``--peer-python`` picks its interpreter).

Run: ``python -m bench.produce_bench [--broker noida|tansu] [--records N] [--slow-records N]
[--rounds R] [--only consumer|transactional|slow-consumer|slow-transactional]
[--ordering key|partition|unordered] [--no-peer]``.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from typing import Any

from confluent_kafka.admin import AdminClient

from bench._options import add_broker, add_peer, local_broker, parser
from bench._produce_loops import run_plain
from bench._produce_runs import (
    KEYS,
    PARTITIONS,
    Run,
    Workload,
    produce_inputs,
    run_engine,
    sleep_5ms,
)
from bench._quix import QuixPeer
from bench._report import console, summary_ms, table, targets, write
from bench._rounds import interleaved
from sdk import CommitMode, Options, Ordering
from sdk.engine._compiled import COMPILED, PURE_REASON

WORKLOADS = {
    "consumer": Workload("at least once, no-op handler", False, None, 0.6, 2.0),
    "transactional": Workload("exactly once, no-op handler", True, None, 0.5, 2.0),
    "slow-consumer": Workload("at least once, 5 ms handler", False, sleep_5ms, 10.0),
    "slow-transactional": Workload("exactly once, 5 ms handler", True, sleep_5ms, 10.0),
}
ENGINE, QUIX = "engine", "Quix Streams"


def plain_name(workload: Workload) -> str:
    return "transactional loop" if workload.transactional else "plain loop"


def measure(
    bootstrap: str,
    admin: AdminClient,
    key: str,
    records: int,
    rounds: int,
    peer: QuixPeer,
    ordering: Ordering | None = None,
) -> dict[str, Any]:
    workload = WORKLOADS[key]
    topic, ends = produce_inputs(bootstrap, admin, records)
    mode = CommitMode.TRANSACTIONAL if workload.transactional else CommitMode.CONSUMER
    options = Options(commit_mode=mode, **({} if ordering is None else {"ordering": ordering}))
    tuned = "" if ordering is None else f" and ordering={ordering.value}"
    plain = plain_name(workload)
    variants: dict[str, Callable[[], Run | None]] = {
        plain: lambda: run_plain(bootstrap, admin, topic, ends, workload),
        ENGINE: lambda: run_engine(bootstrap, admin, topic, ends, workload, options),
    }
    if peer.python is not None:
        variants[QUIX] = lambda: peer.run(bootstrap, admin, topic, ends, workload)

    def told(run: Run | None) -> Run | None:
        if run is not None:
            console.print(
                f"[dim]  {run.seconds:.2f} s ({run.rate:,.0f} records/s, "
                f"{run.cpu_us:.2f} us CPU/record"
                + ("" if run.client_cpu_us is None else f", librdkafka {run.client_cpu_us:.2f}")
                + f"), first record at {run.first_record:.2f} s, "
                f"outputs {run.outputs}"
            )
        return run

    runs = interleaved(
        {name: lambda variant=variant: told(variant()) for name, variant in variants.items()},
        rounds,
        order="rotate",
        announce=lambda name, round_: console.print(
            f"[dim]{workload.name}: {name}, round {round_ + 1} of {rounds}"
        ),
    )
    runs = {name: found for name, found in runs.items() if found}
    rate = {name: statistics.median(r.rate for r in found) for name, found in runs.items()}
    cpu = {name: statistics.median(r.cpu_us for r in found) for name, found in runs.items()}
    client = {
        name: statistics.median(client_us)
        for name, found in runs.items()
        if None not in (client_us := [r.client_cpu_us for r in found])
    }
    rows = []
    for name, found in runs.items():
        rows.append(
            [
                name,
                records,
                len(found),
                round(statistics.median(r.seconds for r in found), 3),
                round(rate[name]),
                round(rate[name] / rate[plain], 3),
                round(cpu[name], 2),
                round(client[name], 2) if name in client else "",
                round(cpu[name] / cpu[plain], 2),
                max(r.outputs["missing"] for r in found),
                max(r.outputs["duplicates"] for r in found),
            ]
        )
    table(
        f"{workload.name}: {records:,} records, {PARTITIONS} partitions, {KEYS:,} keys, medians "
        f"of {rounds} rounds; engine ({'compiled' if COMPILED else 'pure'} core): default "
        f"options but commit_mode={mode.value}{tuned}",
        ["consumer", "inputs", "runs", "seconds", "records/s", "x loop", "CPU us/record",
         "of it librdkafka", "CPU x loop", "missing (most)", "duplicates (most)"],
        rows,
    )  # fmt: skip
    result: dict[str, Any] = {
        "workload": workload.name,
        "records": records,
        "rounds": rounds,
        "target": workload.target,
        "cpu_target": workload.cpu_target,
        "ratio": round(rate[ENGINE] / rate[plain], 3),
        "cpu_ratio": round(cpu[ENGINE] / cpu[plain], 3),
        "cpu_ratio_outside_librdkafka": round(
            (cpu[ENGINE] - client[ENGINE]) / (cpu[plain] - client[plain]), 3
        )
        if ENGINE in client and plain in client
        else None,
        "quix_ratio": round(rate[ENGINE] / rate[QUIX], 3) if QUIX in rate else None,
        "medians": {
            name: {
                "records_per_second": round(rate[name]),
                "cpu_us_per_record": round(cpu[name], 3),
                "librdkafka_cpu_us_per_record": round(client[name], 3) if name in client else None,
            }
            for name in runs
        },
        "runs": {
            name: [
                {
                    "seconds": round(r.seconds, 3),
                    "first_record_seconds": None
                    if math.isnan(r.first_record)
                    else round(r.first_record, 3),
                    "records_per_second": round(r.rate),
                    "cpu_us_per_record": round(r.cpu_us, 3),
                    "librdkafka_cpu_us_per_record": None
                    if (us := r.client_cpu_us) is None
                    else round(us, 3),
                    "outputs": r.outputs,
                    "engine_outputs_stats": r.stats or None,
                    "plain_commits": summary_ms(r.commits) if r.commits else None,
                }
                for r in found
            ]
            for name, found in runs.items()
        },
    }
    if workload.transactional:
        result["transactions"] = transaction_costs(runs[ENGINE], runs[plain])
    return result


def transaction_costs(engine_runs: list[Run], plain_runs: list[Run]) -> dict[str, Any]:
    """The time a transaction's close took (send offsets + commit), engine and plain loop,
    over every round."""
    committed = seconds = outputs = 0.0
    for run in engine_runs:
        txn = run.stats.get("transactions", {})
        committed += txn.get("committed", 0)
        seconds += txn.get("seconds", 0.0)
        outputs += txn.get("outputs_committed", 0)
    commits = [c for run in plain_runs for c in run.commits]
    plain_ms = summary_ms(commits) if commits else {}
    plain_records = sum(run.records for run in plain_runs)
    return {
        "engine": {
            "transactions": round(committed),
            "ms_per_transaction": round(seconds / committed * 1000, 3) if committed else None,
            "outputs_per_transaction": round(outputs / committed) if committed else None,
            "share_of_run": round(seconds / sum(r.seconds for r in engine_runs), 3),
        },
        "transactional loop": {
            "transactions": len(commits),
            "ms_per_transaction": plain_ms.get("mean_ms"),
            "outputs_per_transaction": round(plain_records / len(commits)) if commits else None,
            "share_of_run": round(sum(commits) / sum(r.seconds for r in plain_runs), 3),
        },
    }


def verdicts(key: str, found: dict[str, Any]) -> list[tuple[str, bool]]:
    workload = WORKLOADS[key]
    plain = plain_name(workload)
    name = workload.name
    verdict = [
        (
            f"{name}: engine >= {workload.target:g} x the {plain} (medians {found['ratio']})",
            found["ratio"] >= workload.target,
        )
    ]
    if workload.cpu_target is not None:
        verdict.append(
            (
                f"{name}: engine CPU per record <= {workload.cpu_target:g} x the {plain}'s "
                f"(medians {found['cpu_ratio']})",
                found["cpu_ratio"] <= workload.cpu_target,
            )
        )
    elif found["quix_ratio"] is not None:
        verdict.append(
            (
                f"{name}: engine >= {workload.target:g} x Quix Streams (medians "
                f"{found['quix_ratio']})",
                found["quix_ratio"] >= workload.target,
            )
        )
    complete = all(
        run["outputs"]["missing"] == 0 for runs in found["runs"].values() for run in runs
    )
    verdict.append((f"{name}: every input has an output, in every run", complete))
    return verdict


def main() -> None:
    options = parser(__doc__)
    add_broker(options, "noida")
    options.add_argument(
        "--records", type=int, default=240_000, help="inputs of the no-op workloads"
    )
    options.add_argument(
        "--slow-records", type=int, default=10_000, help="inputs of the 5 ms workloads"
    )
    options.add_argument("--rounds", type=int, default=6)
    options.add_argument("--only", choices=sorted(WORKLOADS))
    options.add_argument(
        "--ordering",
        choices=[o.value for o in Ordering],
        help="the engine's ordering (a tuned figure; default: the engine's own, key)",
    )
    add_peer(options, "Quix Streams", "the interpreter of Quix Streams' virtualenv")
    args = options.parse_args()
    results: dict[str, Any] = {
        "broker": args.broker,
        "args": vars(args),
        "core": "compiled" if COMPILED else f"pure ({PURE_REASON})",
    }
    if not COMPILED:
        console.print(f"[yellow]the engine's core is not compiled ({PURE_REASON}): pure figures")
    peer = QuixPeer(args.peer_python, enabled=not args.no_peer)
    if peer.note:
        console.print(f"[yellow]{peer.note}")
    results["peer"] = peer.note or "quixstreams 3.28.1"
    verdict: list[tuple[str, bool]] = []
    with local_broker(args.broker) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for key in WORKLOADS:
            if args.only not in (None, key):
                continue
            records = args.slow_records if key.startswith("slow") else args.records
            ordering = None if args.ordering is None else Ordering(args.ordering)
            found = measure(broker.bootstrap, admin, key, records, args.rounds, peer, ordering)
            results[key] = found
            verdict += verdicts(key, found)
        del admin  # a client left alive would keep trying to reach the stopped broker
    costs = {
        key: results[key]["transactions"]
        for key in WORKLOADS
        if "transactions" in results.get(key, {})
    }
    if costs:
        table(
            "What closing a transaction costs (send offsets + commit), every round",
            ["workload", "consumer", "transactions", "ms each", "outputs each", "share of run"],
            [
                [WORKLOADS[key].name, name, c["transactions"], c["ms_per_transaction"],
                 c["outputs_per_transaction"], c["share_of_run"]]
                for key, both in costs.items()
                for name, c in both.items()
            ],
        )  # fmt: skip
    name = "produce" if not args.only else f"produce-{args.only}"
    if args.ordering is not None:
        name += f"-{args.ordering}"
    write(f"{name}-{args.broker}", results)
    targets(verdict)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
