"""The parallel consumer: one Kafka consumer on one thread, handlers on many.

The consumer's thread (``sdk.consumer._loop``) is the only one that touches the confluent-kafka
``Consumer`` and the core; handlers run on a runner (``sdk.consumer._runners``) and send their
results back through an inbox. Nothing takes a lock around the Kafka client. This module holds the
public API and builds the parts; ``sdk.consumer._clients`` makes, opens and closes the clients.
"""

from __future__ import annotations

import logging
import queue
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaException
from prometheus_client import REGISTRY, CollectorRegistry

from sdk.consumer import _collector
from sdk.consumer._clients import Clients
from sdk.consumer._commits import Committer
from sdk.consumer._config import consumer_config, failure_policy, output_config
from sdk.consumer._errors import EngineError
from sdk.consumer._fencing import error_text
from sdk.consumer._holds import Holds
from sdk.consumer._maps import OffsetMaps
from sdk.consumer._rebalance import Rebalancer
from sdk.consumer._runners import Runner
from sdk.consumer._signals import stop_while_running
from sdk.consumer._transactions import TransactionalCommitter
from sdk.engine._core import WorkCore
from sdk.engine._options import CommitMode, Options
from sdk.engine._sizing import ItemSizer
from sdk.gating._gating import Gate
from sdk.produce._dead_letters import DeadLetters
from sdk.produce._deliveries import Awaiting
from sdk.produce._producer import Outputs

log = logging.getLogger("sdk")


class ParallelConsumer(Clients):
    """Process records with many handlers at once, in order per partition or key.

    ``handler`` is a function or a coroutine function taking a :class:`~sdk.Record` (or a list
    of them when ``options.batch_size`` is set). It succeeds by returning; raising retries the
    record (see :class:`~sdk.Options` for attempts, delays and dead-lettering).

    ``config`` is the confluent-kafka consumer configuration; ``group.id`` is required and
    automatic commits are always off: the consumer commits only what was processed.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topics: Sequence[str],
        handler: Callable[..., Any],
        options: Options | None = None,
        *,
        gate: Gate | None = None,
        producer_config: Mapping[str, Any] | None = None,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        self.options = options = options or Options()
        self.config = consumer_config(config, topics, handler)
        self.group = str(config["group.id"])
        self.transactional = options.commit_mode == CommitMode.TRANSACTIONAL
        self.producer_config = output_config(
            self.config, producer_config or {}, self.transactional, self.group
        )
        self.topics = list(topics)
        self.handler = handler
        self.gate = gate
        self.registry = registry
        # One topic by name (librdkafka reads a name starting with "^" as a pattern): every
        # record fetched is of it.
        named = len(self.topics) == 1 and not self.topics[0].startswith("^")
        sole_topic = self.topics[0] if named else None
        self.core = WorkCore(
            options.ordering,
            null_keys=options.null_keys,
            failures=failure_policy(options),
            max_retrying=options.max_retrying,
            process_delay=options.process_delay,
            buffer_limit=options.buffer_limit,
            follow_on=0 if options.batch_size is not None else options.max_item_records,
            sole_topic=sole_topic,
        )
        self.paused_by_user = False
        # The core's clock never steps (timers, retries, stalls): a wall clock set back would
        # delay every parked retry by the step. The wall clock only converts record timestamps
        # (process delay) and dates stats. (All replaceable in tests.)
        self._time: Callable[[], float] = time.monotonic
        self._wall: Callable[[], float] = time.time
        self._mono: Callable[[], float] = time.monotonic
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._deferred: deque[tuple[Any, ...]] = deque()  # commands that came during a revoke
        self._consumer: Consumer | None = None
        self._runner: Runner | None = None
        self._dead_letters: DeadLetters | None = None
        self._maps = OffsetMaps("none", self.group)
        self._thread: threading.Thread | None = None
        self._loop_thread: threading.Thread | None = None  # the consumer's thread, once running
        self._stop: tuple[bool, float, bool] | None = None  # (drain, deadline, drain_buffered)
        self._finished = threading.Event()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._stats: dict[str, Any] = {}
        self._collector: Any = None
        self._sizer = ItemSizer(options)
        self._outputs = Outputs(self._new_output_producer, self.transactional)
        self._acknowledging: dict[int, Awaiting] = {}  # items whose outputs are on their way
        self._acknowledging_since = 0.0
        self._paused_at = 0.0
        self._committer: Committer
        if self.transactional:
            self._committer = TransactionalCommitter(
                self.core,
                self._maps,
                options.hooks.on_commit,
                self._now,
                self._outputs,
                self._settle,
                self._rewind,
                self._monotonic,
            )
        else:
            self._committer = Committer(self.core, self._maps, options.hooks.on_commit, self._now)
        self._rebalancer = Rebalancer(
            self.core,
            self._committer,
            self._maps,
            gate,
            self._await_results,
            self._now,
            self._monotonic,
            options.revoke_timeout,
        )
        self._owns_gate = False
        self._watermarks_pending = threading.Event()
        self._holds = None if gate is None else Holds(gate, self.core)
        self._fetched_at = self._commit_at = self._stats_at = self._give_back_at = -1e18
        self._progressed = False

    def _now(self) -> float:
        return self._time()

    def _rewind(self, consumer: Consumer) -> None:
        self._rebalancer.rewind(consumer)

    def _monotonic(self) -> float:
        return self._mono()

    # ---- public API ---------------------------------------------------------------------

    def run(self) -> None:
        """Consume until :meth:`stop` is called (from another thread or a signal handler).

        Run from the main thread with Python's default handling of Ctrl-C and SIGTERM, the
        first of them stops gracefully (records in flight finish and are committed) and
        ``run`` returns; a second one stops at once."""
        if self._started.is_set():
            raise RuntimeError("this consumer has already run")
        self._started.set()
        self._loop_thread = threading.current_thread()
        restore = stop_while_running(self)
        collector = _collector.raise_threshold(self.options.gc_threshold)
        try:
            self._open()
            self._loop()
        except KafkaException as exc:  # a client's fatal error, raised by one of its calls
            self._error = EngineError(f"a Kafka client failed for good: {error_text(exc)}")
            raise self._error from None
        except BaseException as exc:
            self._error = exc
            raise
        except:  # noqa: E722 (confluent-kafka can raise a KafkaError, which is no exception)
            self._error = EngineError(f"a Kafka client failed: {sys.exc_info()[1]}")
            raise self._error from None
        finally:
            self._close()
            if collector:
                _collector.restore()
            self._finished.set()
            for signum, handler in restore.items():
                signal.signal(signum, handler)

    def start(self) -> ParallelConsumer:
        """Run in a background thread; returns at once."""
        self._thread = threading.Thread(
            target=self._run_quietly, name=f"consumer-{self.group}", daemon=True
        )
        self._thread.start()
        return self

    def _run_quietly(self) -> None:
        try:
            self.run()
        except BaseException:
            log.exception("parallel consumer stopped with an error")

    def stop(
        self,
        *,
        drain: bool = True,
        timeout: float = 30.0,
        drain_buffered: bool = False,
        wait: bool = True,
    ) -> None:
        """Stop consuming.

        With ``drain`` (graceful), fetching stops, records in flight finish (and buffered ones
        too with ``drain_buffered``) until ``timeout`` seconds, what completed is committed and
        the consumer leaves its group. Without it, what completed is committed and the
        consumer closes at once. With ``wait``, returns when it has stopped. Called from a
        handler (or a hook), it returns at once: the calling record completes normally and
        is committed with the rest ("stop after this record").
        """
        self._inbox.put(("stop", drain, self._mono() + timeout, drain_buffered))
        if wait and self._started.is_set() and not self._called_from_inside():
            self._finished.wait(timeout + self.options.revoke_timeout + 30)
        if self._error is not None and not isinstance(self._error, KeyboardInterrupt):
            raise EngineError(f"the consumer failed: {self._error}") from self._error

    def _called_from_inside(self) -> bool:
        """Whether the caller is a handler, a hook or a callback of this consumer: it cannot
        wait for the stop, which waits for the records in flight (its own among them)."""
        current = threading.current_thread()
        if current is self._loop_thread:
            return True
        runner = self._runner
        return runner is not None and current in getattr(runner, "threads", ())

    def pause(self) -> None:
        """Stop starting records (a circuit breaker); in-flight records finish."""
        self._inbox.put(("pause",))

    def resume(self) -> None:
        self._inbox.put(("resume",))

    @property
    def running(self) -> bool:
        return self._started.is_set() and not self._finished.is_set()

    def stats(self) -> dict[str, Any]:
        """A recent snapshot of the consumer's state (refreshed about every half second)."""
        return dict(self._stats)

    def __enter__(self) -> ParallelConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.running:
            self.stop()
