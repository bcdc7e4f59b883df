"""Failed deliveries traced back to their inputs, on the real shell with simulated clients: all
of a work item's outputs share one delivery callback, and a failed report is matched to the
records whose outputs it could be."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError

from sdk import CommitMode, Options, Output
from sdk.engine._failures import TerminalError
from sdk.engine._shards import Entry
from tests.sdk.simulated import OUTPUT_PARTITIONS
from tests.sdk.test_shell_regressions import OUT, Shell, transactional_shell

TOO_LARGE = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "the broker refused it: too large")


def _deliver(shell: Shell, fails: Any) -> None:
    """The broker answers every output waiting: those ``fails(written)`` picks fail."""
    producer = shell.engine.output_producer
    if producer is None:
        return
    while producer.pending:
        written, _ = producer.pending[0]
        producer.deliver([not fails(written)], error=TOO_LARGE)


class _At:
    """Where a record is, as ``Work.broke_transactions`` reads it from an entry."""

    def __init__(self, source: tuple[str, int, int]) -> None:
        self.tp, self.offset = source[:2], source[2]


def _report_ended(shell: Shell) -> None:
    runner = shell.engine.runner
    for worker in list(runner.workers.values()):
        if worker.ended and worker.settled:
            runner.report(worker.item, worker.end())


def test_transactional_an_output_that_never_arrives_breaks_one_untraced_transaction_then_its_attempts() -> (
    None
):
    """Offset 0's output is refused by the broker every time. While transactions commit, no
    item notes where its outputs come from, so the first abort blames no input; the
    transactions after it note them, and once offset 0 broke as many of them as it has
    attempts it fails for good without running again (``Work.broke_transactions``, which
    the workers ask before each record). Offset 1 is never blamed, and once a transaction
    commits the notes stop."""
    shell = transactional_shell(max_attempts=2, on_exhausted="skip")
    outputs = shell.engine._outputs
    committer = shell.engine._committer
    shell.cluster.produce(0, [b"a", b"b"])
    shell.turn(2)
    runner = shell.engine.runner
    first = (shell.cluster.topic, 0, 0)
    aborted_at: list[int] = []
    refusing = True
    committed = 0
    for _ in range(80):
        for item in shell.running():
            if item.id not in runner.workers and runner.start(item) is not None:
                shell.run(item)
        _deliver(
            shell, lambda w, refusing=refusing: refusing and w.topic == OUT and w.value == b"0:0"
        )
        _report_ended(shell)
        shell.turn(seconds=0.05)
        aborted_at.append(committer.aborted)
        if refusing and outputs.broke(first)[0] >= 2:
            assert committer.aborted == 3, "one untraced abort, then one per attempt"
            assert outputs.tracing
            work = shell.engine.runner.work
            assert work is not None
            assert isinstance(work.broke_transactions(_At(first)), TerminalError)
            assert work.broke_transactions(_At((shell.cluster.topic, 0, 1))) is None
            refusing, committed = False, committer.committed
        if not refusing and committer.committed > committed:
            break
    assert not refusing, f"blamed {outputs.broke(first)[0]} times in {aborted_at[-1]} aborts"
    assert outputs.broke((shell.cluster.topic, 0, 1))[0] == 0, "offset 1 was blamed"
    assert committer.committed > committed, committer.last_abort
    assert not outputs.tracing, "the notes go on after a transaction committed"


def test_one_failed_report_of_an_output_two_records_produced_fails_both() -> None:
    """At least once: two records of one item return the very same output (topic, key and
    value) and one copy is refused. The report cannot tell which record it came from: both
    run again (a copy may be written twice, none is lost), the other records of the item do
    not."""
    shell = Shell(Options(commit_mode=CommitMode.CONSUMER, max_item_records=8))
    shell.engine._sizer.record_seconds = 1e-6  # a fast handler: one item takes them all
    shell.cluster.produce(0, [b"k0", b"k1", b"k2"])
    shell.turn(2)
    assert [[e.offset for e in item.entries] for item in shell.running()] == [[0, 1, 2]]
    runs: list[int] = []

    def handle(entries: list[Entry], record: Any) -> Output:
        (entry,) = entries
        runs.append(entry.offset)
        if entry.offset in (0, 2):
            return Output(OUT, "the same", key="same", partition=0)
        return Output(OUT, f"0:{entry.offset}", partition=min(1, OUTPUT_PARTITIONS - 1))

    refused = [False]

    def fails(written: Any) -> bool:
        if written.value == b"the same" and not refused[0]:
            refused[0] = True
            return True
        return False

    runner = shell.engine.runner
    for _ in range(40):
        for item in shell.running():
            worker = runner.start(item)
            assert worker is not None
            while worker.next_entry() is not None:
                worker.step(handle)
            worker.ended = True
        _deliver(shell, fails)
        _report_ended(shell)
        shell.turn(seconds=0.05)
        if shell.committed() == 3:
            break
    assert shell.committed() == 3
    assert sorted(runs) == [0, 0, 1, 2, 2], runs
