"""What a parallel consumer is built from: its arguments checked, the settings of its Kafka
consumer and of its producer of outputs, and the failure policy its options give."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sdk.consumer._fencing import transactional_id
from sdk.engine._failures import FailurePolicy
from sdk.engine._options import CONSUMER_ONLY, Options, OptionsError

FETCH_DEFAULTS: dict[str, Any] = {
    # librdkafka postpones fetching for 1 s once its local queue is over threshold; the
    # engine drains that queue in bursts into its own buffer, and with the default it would
    # starve for most of each second.
    "fetch.queue.backoff.ms": 20,
    # librdkafka fetches for a partition while fewer of its records than this are queued
    # (100,000 by default), on top of the engine's own buffer. A broker that answers a fetch
    # at the log end at once (one that does not honour fetch.wait.max.ms) has it fetch
    # without pause all that time: about half a core while a backlog drains. A tenth is
    # prefetch enough: 10,000 records of one partition last 0.1 s at 100,000 a second, five
    # times the backoff above.
    "queued.min.messages": 10_000,
}
"""The consumer settings the engine sets unless they are given."""


def consumer_config(
    config: Mapping[str, Any], topics: Sequence[str], handler: Callable[..., Any]
) -> dict[str, Any]:
    """The consumer's settings (automatic commits and offset stores off: the engine commits),
    after checking the arguments it is given; :class:`OptionsError` names the one at fault."""
    if not config.get("group.id"):
        raise OptionsError("config: 'group.id' is required")
    if str(config.get("enable.auto.commit", "false")).lower() == "true":
        raise OptionsError("config: enable.auto.commit must be false (the engine commits)")
    if isinstance(topics, str) or not topics or not all(isinstance(t, str) and t for t in topics):
        raise OptionsError("topics: must be a non-empty list of topic names")
    if not callable(handler):
        raise OptionsError("handler: must be callable")
    return {
        **FETCH_DEFAULTS,
        **config,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
    }


def output_config(
    consumer: Mapping[str, Any], given: Mapping[str, Any], transactional: bool, group: str
) -> dict[str, Any]:
    """The producer's settings: the consumer's connection and security settings, then the
    engine's defaults, then ``producer_config`` (``given``)."""
    if not isinstance(given, Mapping):
        raise OptionsError("producer_config: must be a mapping of librdkafka properties")
    config = {k: v for k, v in consumer.items() if k not in CONSUMER_ONLY}
    config.pop("fetch.queue.backoff.ms", None)
    config["enable.idempotence"] = True  # per output partition: in order, no duplicates
    config.update(given)
    if transactional:
        config.setdefault("transactional.id", transactional_id(group, consumer))
        # At least once ``linger.ms`` stays librdkafka's 5 ms (at 1 ms its thread wakes for
        # fewer outputs at a time: about a microsecond of CPU more per output). Exactly once,
        # 1 ms: every close of a transaction flushes anyway. (A producer fenced while its
        # outputs lingered can make confluent-kafka's flush raise the fencing oddly: see
        # sdk.produce._producer.kafka_error.)
        config.setdefault("linger.ms", 1)
    elif config.get("transactional.id"):
        raise OptionsError(
            "producer_config: transactional.id is for commit_mode=CommitMode.TRANSACTIONAL"
        )
    # Only failed deliveries call back (exactly once they break the transaction, at least once
    # their inputs fail); the outputs that arrive are acknowledged together (see
    # sdk.produce._deliveries).
    config["delivery.report.only.error"] = True
    return config


def failure_policy(options: Options) -> FailurePolicy:
    """What happens after a handler fails, as the options say."""
    return FailurePolicy(
        max_attempts=options.max_attempts,
        retry_delay=options.retry_delay,
        on_exhausted=options.on_exhausted,
        dead_letters=options.dead_letter_topic is not None,
        decode_errors_to_dead_letters=options.on_decode_error == "dead_letter",
    )
