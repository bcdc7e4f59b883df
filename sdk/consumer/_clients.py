"""The consumer's clients: how they are made, opened, replaced and closed.

:class:`Clients` is the part of :class:`~sdk.ParallelConsumer` that makes the Kafka consumer,
the producers (of outputs, of dead-letter copies), the runner of handlers and the store of
offset maps (tests replace these factories to drive the shell with simulated clients), opens
them in order at the start of ``run()``, replaces a consumer fenced after its own session
expired, and closes them at the end. Its state is set up by ``ParallelConsumer.__init__``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from gate import KafkaLog
from sdk.consumer._fencing import error_text
from sdk.consumer._loop import ConsumerLoop
from sdk.consumer._maps import OffsetMaps, choose_store
from sdk.consumer._runners import (
    BREAKS_BEFORE_HOLDING,
    AsyncRunner,
    Runner,
    ThreadRunner,
    Work,
    is_coroutine_handler,
)
from sdk.consumer._transactions import TransactionalCommitter
from sdk.engine._options import CONSUMER_ONLY, OptionsError
from sdk.gating._gating import Gate
from sdk.produce._dead_letters import DeadLetters

log = logging.getLogger("sdk")

_CONNECT_WAIT = 1.0
"""Seconds the start waits for the producer of outputs to connect (see ``_open_outputs``)."""


class Clients(ConsumerLoop):
    """Making, opening and closing the clients of :class:`~sdk.ParallelConsumer`."""

    config: dict[str, Any]
    producer_config: dict[str, Any]
    topics: list[str]
    group: str
    handler: Any
    gate: Gate | None
    registry: CollectorRegistry | None
    transactional: bool
    _maps: OffsetMaps
    _collector: Any
    _owns_gate: bool
    _error: BaseException | None

    # ---- the clients (tests replace these to drive the shell with simulated ones) --------

    def _new_consumer(self, config: dict[str, Any]) -> Consumer:
        return Consumer(config)

    def _new_producer(self) -> Producer:
        config = {k: v for k, v in self.config.items() if k not in CONSUMER_ONLY}
        config.setdefault("logger", KafkaLog("sdk.kafka.dlt"))
        return Producer(config)

    def _new_output_producer(self) -> Producer:
        config = dict(self.producer_config)
        config.setdefault("logger", KafkaLog("sdk.kafka.output"))
        return Producer(config)

    def _new_runner(self, work: Work) -> Runner:
        if is_coroutine_handler(self.handler):
            return AsyncRunner(work, self.options.max_concurrency, self._inbox)
        return ThreadRunner(work, self.options.max_concurrency, self._inbox)

    def _choose_maps(self) -> OffsetMaps:
        return choose_store(
            self.options, self.config, self.group, self.topics[0], self._new_consumer
        )

    # ---- opening and closing ------------------------------------------------------------

    def _consumer_config(self) -> dict[str, Any]:
        config = dict(self.config)
        config["on_commit"] = self._committer.on_commit
        config.setdefault("logger", KafkaLog("sdk.kafka"))
        return config

    def _subscribe(self, consumer: Consumer) -> None:
        rebalancer = self._rebalancer
        consumer.subscribe(
            self.topics,
            on_assign=rebalancer.on_assign,
            on_revoke=rebalancer.on_revoke,
            on_lost=rebalancer.on_lost,
        )

    def _rejoin_fenced(self, error: KafkaError) -> bool:
        """A static member fenced (``FENCED_INSTANCE_ID``, fatal for librdkafka's consumer)
        within two session timeouts of losing its partitions: after a long outage
        librdkafka's rejoin can be fenced by the member's own previous session. A new
        consumer takes the old one's place and joins again (what was lost is processed
        again from the committed offsets, as after any loss). Fenced without such a loss,
        another process has the same ``group.instance.id``: False, the consumer stops."""
        lost_at = self._rebalancer.lost_at
        session = float(self.config.get("session.timeout.ms", 45000)) / 1000.0
        if (
            "group.instance.id" not in self.config
            or "fenced" not in error.str().lower()
            or lost_at is None
            or self._mono() - lost_at > 2 * session
        ):
            return False
        old = self._consumer
        assert old is not None
        log.warning(
            "the consumer was fenced right after its session timed out (%s): a new consumer "
            "joins the group in its place",
            error.str(),
        )
        assigned = list(self.core.partitions)
        if assigned:
            self._rebalancer.on_lost(old, [TopicPartition(t, p) for t, p in assigned])
        self._rebalancer.lost_at = None  # (fenced again without a new loss: stop)
        try:
            old.close()
        except Exception as exc:
            log.debug("closing the fenced consumer: %s", str(exc))
        self._consumer = self._new_consumer(self._consumer_config())
        self._subscribe(self._consumer)
        return True

    def _open(self) -> None:
        config = self._consumer_config()
        try:
            self._consumer = self._new_consumer(config)
        except KafkaException as exc:
            raise OptionsError(f"config: {error_text(exc)}") from None
        self._maps = self._committer.maps = self._rebalancer.maps = self._choose_maps()
        self._open_outputs()
        if isinstance(self._committer, TransactionalCommitter):
            if not self._maps.in_metadata:
                log.warning(
                    "exactly-once with offset maps kept %s: after a crash or a rebalance, "
                    "records completed beyond the committed offset are processed again and "
                    "their outputs written twice (a broker that keeps commit metadata avoids it)",
                    "nowhere" if self._maps.kind == "none" else f"in {self._maps.kind}",
                )
            self._committer.begin()  # (a TransactionError is an EngineError)
        if self.options.dead_letter_topic:
            self._dead_letters = DeadLetters(
                self.options.dead_letter_topic,
                self.core,
                self._new_producer,
                self._time,
                self._outputs if self.transactional else None,
                limit=self.options.max_attempts or BREAKS_BEFORE_HOLDING,
            )
        if self.gate is not None:
            self._owns_gate = not self.gate._started
            self.gate.start()
            self.gate.view.add_listener(self._on_watermarks)
        work = Work(self.handler, self.options)
        work.outputs = self._outputs
        self._runner = self._new_runner(work)
        if self.registry is not None:
            from sdk.consumer._metrics import EngineCollector

            self._collector = EngineCollector(self)
            self.registry.register(self._collector)
        self._subscribe(self._consumer)
        log.info(
            "consuming %s as group %s (%s ordering, concurrency %d, offset map: %s)",
            ", ".join(self.topics),
            self.group,
            self.options.ordering.value,
            self.options.max_concurrency,
            self._maps.kind,
        )

    def _open_outputs(self) -> None:
        """The producer of outputs opens with the consumer (exactly once, its transactions
        begin next), and connects at once, not at the first output: librdkafka's idempotent
        producer sends nothing until a timer (after half a second) has found a broker up to
        ask for its producer id, and outputs produced before then waited for the next one
        (a second), holding back the buffer behind them. A handler that returns no outputs
        leaves it idle (a connection, no records). An unreachable cluster delays the start
        by a second at most: the producer connects once it can, as it would have."""
        try:
            producer = self._outputs.producer
        except KafkaException as exc:
            raise OptionsError(f"producer_config: {error_text(exc)}") from None
        try:
            producer.list_topics(timeout=_CONNECT_WAIT)  # (brokers and topics: no topic made)
        except KafkaException as exc:
            log.debug("the producer of outputs is not connected yet: %s", str(exc))

    def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            immediate = self._stop is not None and not self._stop[0]
            if immediate or self._error:
                self._rebalancer.revoke_timeout = 0.0
            with contextlib.suppress(Exception):
                self._committer.commit(consumer, sync=True, wait=self._rebalancer.revoke_timeout)
            try:
                consumer.close()  # leaves the group: on_revoke commits and drops what is left
            except Exception as exc:
                log.warning("closing the consumer: %s", str(exc))
        if isinstance(self._committer, TransactionalCommitter):
            self._committer.close()
        if self._dead_letters is not None:
            self._dead_letters.close()
        if self._outputs.pause is not None:
            self._outputs.pause.open()  # (no worker waits for acknowledgements any longer)
        if self._runner is not None:
            self._runner.close(wait=1.0 if self._stop and self._stop[0] else 0.0)
            self._runner.work.failures.flush()
        self._outputs.close(timeout=5.0)
        if self._collector is not None and self.registry is not None:
            with contextlib.suppress(KeyError):
                self.registry.unregister(self._collector)
        self._maps.close()
        if self.gate is not None:
            self.gate.view.remove_listener(self._on_watermarks)
            if self._owns_gate:
                self.gate.stop()
